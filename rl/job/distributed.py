"""Data parallelism under torchrun: one process per device, each with its own trainer and engine.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE. Every rank walks the same task stream and
keeps its own slice of each global batch, DistributedDataParallel all-reduces the LoRA gradients, and every
rank pushes its (identical) LoRA weights into its own engine. Without those variables, or with one process,
everything here is a no-op and the run is single-process.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rl.settings import ConfigError
from rollout_engine.memory import total_memory_bytes

T = TypeVar("T")
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
DEFAULT_TIMEOUT_S = 1800.0  # a collective waits this long for a rank that died or hangs, then raises


@dataclass(frozen=True, slots=True)
class DistInfo:
    """This process's place in the job; `device` is where its model and engine live."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: str = "auto"

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = DistInfo()


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"environment variable {name}={value!r} is not an integer; launch data-parallel runs with "
            "`torchrun --nproc-per-node N train.py ...`, which sets RANK, WORLD_SIZE and LOCAL_RANK"
        ) from None


def rank_device(device: str, local_rank: int) -> str:
    """The device of local rank `local_rank`: its own GPU (`cuda:LOCAL_RANK`) for auto/cuda, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device != "cuda":
        raise ConfigError(
            f"model.device={device} pins one device, but under torchrun each rank takes cuda:LOCAL_RANK; "
            "set model.device=auto (or cuda, or cpu)"
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; lower --nproc-per-node"
        )
    return f"cuda:{local_rank}"


def init_distributed(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Join the torchrun job (NCCL on GPUs, gloo on CPU) or, outside torchrun, describe a single process.

    device is the configured model device; each rank gets its own (`cuda:LOCAL_RANK`, or the CPU).
    """
    if any(name not in os.environ for name in ENV_VARS) or _env_int("WORLD_SIZE") == 1:
        return DistInfo(device=device)
    world_size, rank, local_rank = _env_int("WORLD_SIZE"), _env_int("RANK"), _env_int("LOCAL_RANK")
    local_world_size = _env_int("LOCAL_WORLD_SIZE", default=world_size)
    rank_dev = rank_device(device, local_rank)
    timeout = timedelta(seconds=timeout_s)
    if rank_dev.startswith("cuda"):
        torch.cuda.set_device(rank_dev)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(rank_dev))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return DistInfo(rank, world_size, local_rank, local_world_size, rank_dev)


def close_distributed(info: DistInfo) -> None:
    """Leave the process group (safe to call twice).

    DistributedDataParallel wrappers no longer referenced are collected first, while the group is still
    registered: a wrapper freed after it would destroy the gloo group from its Reducer without releasing the
    GIL, and the group's destructor then waits forever for a gloo thread that needs the GIL (seen as a hang
    at exit about one run in six).
    """
    if info.is_distributed and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[DistInfo]:
    """`init_distributed` for the duration of a `with` block; the group is destroyed on the way out."""
    info = init_distributed(device, timeout_s)
    try:
        yield info
    finally:
        close_distributed(info)


def engine_memory_budget(memory_budget_bytes: int | None, device: str, local_world_size: int) -> int | None:
    """The memory the engine's fraction applies to: the configured budget; on CPU, the RAM shared by the
    node's ranks split between them; None (the whole device) on a GPU, which each rank has to itself."""
    if memory_budget_bytes is not None or local_world_size == 1 or device != "cpu":
        return memory_budget_bytes
    return total_memory_bytes(torch.device("cpu"), None) // local_world_size


def wrap_model(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DistributedDataParallel over the trainable (LoRA) parameters; the model itself when single-process.

    DDP starts by broadcasting rank 0's weights in place, so an engine sharing them stays valid.
    """
    if not info.is_distributed:
        return model
    device_ids = [torch.device(info.device).index] if info.device.startswith("cuda") else None
    # buffers (rotary tables) never change, so they need no broadcast before each forward
    return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)


def shard(items: Sequence[T], info: DistInfo) -> Sequence[T]:
    """This rank's share of `items`: every world_size-th item, starting at its rank."""
    return items[info.rank :: info.world_size]


def next_shard(stream: Any, num_local: int, info: DistInfo) -> list:
    """This rank's `num_local` tasks from the stream's next global batch.

    Every rank draws the same global batch (the largest request of any rank, times world_size), so the
    stream's position stays identical on all ranks and a checkpoint from rank 0 resumes them all.
    """
    num = max_over_ranks(num_local, info)
    return list(shard(stream.next_batch(num * info.world_size), info))[:num_local]


def max_over_ranks(value: int, info: DistInfo) -> int:
    """The largest `value` over the ranks."""
    if not info.is_distributed:
        return value
    tensor = torch.tensor([value], device=info.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_ranks(flag: bool, info: DistInfo) -> bool:
    """Whether `flag` holds on every rank."""
    return -max_over_ranks(-int(flag), info) == 1


def gather_objects(obj: T, info: DistInfo) -> list[T]:
    """`obj` from every rank, in rank order (picklable values: metric dicts, eval results)."""
    if not info.is_distributed:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: T, info: DistInfo) -> T:
    """Rank 0's `obj` on every rank."""
    if not info.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_shards(local: Sequence[T], info: DistInfo) -> list[T]:
    """The whole list from each rank's `shard` of it, in the list's own order (every rank gets it)."""
    return unshard(gather_objects(list(local), info))


def unshard(shards: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of `shard`: rank r's i-th item was item i * world_size + r."""
    whole: list[Any] = [None] * sum(map(len, shards))
    for rank, items in enumerate(shards):
        whole[rank :: len(shards)] = items
    return whole


def check_replicas(named: Mapping[str, torch.Tensor], info: DistInfo) -> None:
    """Raise if the tensors differ between ranks (a cheap fingerprint: sum and sum of squares of each)."""
    if not info.is_distributed:
        return
    tensors = [t.detach().double() for t in named.values()]
    local = torch.stack([torch.stack([t.sum(), t.square().sum()]) for t in tensors])  # [num_tensors, 2]
    high, low = local.clone(), local.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    differs = (high != low).any(dim=1).tolist()
    diverged = [name for name, differ in zip(named, differs, strict=True) if differ]
    if diverged:
        raise RuntimeError(
            f"the data-parallel replicas diverged in {len(diverged)} tensor(s), first {diverged[0]}: the "
            "ranks must start from the same weights and take identical optimizer steps (same seed and "
            "config on every rank)"
        )
