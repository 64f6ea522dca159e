"""Pushing LoRA tensors from the trainer into an engine's buffers: in-process, or broadcast over
torch.distributed to an engine in another process (whose process rl.job.rollout_worker owns).

Trainer side: ``sync.push(named_tensors, version) -> SyncStats``. Engine side: a receiver that owns its
buffers (``lora_buffers()``) and learns the new version (``set_lora_version``). Every push is validated
against the receiver's buffers before any byte is written, so a bad update leaves the old weights serving.
The broadcast lays the tensors' bytes end to end, cuts them into buckets (`bucket_plan`) and sends them over
a two-rank process group of its own (`Broadcast`): NCCL between two GPUs, gloo otherwise (`choose_backend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from rollout_engine.sync_contract import LoraReceiver, SyncStats, TensorSpec, load_update

NamedTensors = Mapping[str, torch.Tensor]


class InProcessSync:
    """Device-to-device copy from the trainer's tensors into a receiver in the same process."""

    def __init__(self, receiver: LoraReceiver):
        self._receiver = receiver
        self._version = -1

    def push(self, named: NamedTensors, version: int) -> SyncStats:
        """Validate, then copy every tensor into the receiver's buffers and hand it the new version."""
        stats = load_update(self._receiver, named, version, self._version)
        self._version = version
        return stats


class _Segment(NamedTuple):
    name: str
    tensor_start: int  # byte offset inside the tensor
    bucket_start: int  # byte offset inside the bucket
    nbytes: int


def bucket_plan(specs: Mapping[str, TensorSpec], bucket_bytes: int) -> list[tuple[int, list[_Segment]]]:
    """Lay the tensors' bytes end to end and cut them into buckets: ``[(bucket size, segments)]``."""
    buckets: list[tuple[int, list[_Segment]]] = []
    segments: list[_Segment] = []
    fill = 0
    for name, spec in specs.items():
        size, offset = spec.nbytes, 0
        while offset < size:
            take = min(size - offset, bucket_bytes - fill)
            segments.append(_Segment(name, offset, fill, take))
            offset, fill = offset + take, fill + take
            if fill == bucket_bytes:
                buckets.append((fill, segments))
                segments, fill = [], 0
    if segments:
        buckets.append((fill, segments))
    return buckets


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    # On CPU a numpy memcpy: torch's copy would wait on the OpenMP pool, which stalls on busy machines.
    if dst.is_cpu and src.is_cpu:
        dst.numpy()[:] = src.numpy()
    else:
        dst.copy_(src)


def open_store(port: int, timeout_s: float) -> dist.TCPStore:
    """Rendezvous on localhost; port 0 makes the trainer's store pick a free port."""
    return dist.TCPStore(
        "127.0.0.1", port, 2, port == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def device_id(device: torch.device | str) -> str:
    """Which physical device holds tensors on `device`: "cpu", or "cuda:" and the GPU's UUID, which names the
    same GPU in every process whatever CUDA_VISIBLE_DEVICES each was given."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return f"cuda:{torch.cuda.get_device_properties(device).uuid}"


def choose_backend(worker_device_id: str, trainer_device_id: str) -> str:
    """NCCL between two different GPUs; gloo otherwise: when either side is on the CPU, and when both
    processes share one GPU, which NCCL refuses ("Duplicate GPU detected"): gloo then carries the buckets
    through host memory."""
    on_gpus = worker_device_id.startswith("cuda:") and trainer_device_id.startswith("cuda:")
    return "nccl" if on_gpus and worker_device_id != trainer_device_id else "gloo"


def _connect(store: dist.Store, rank: int, backend: str, timeout_s: float) -> dist.ProcessGroup:
    """A two-rank process group of its own, so that it neither needs nor disturbs the default group."""
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout)


def _broadcast(group: dist.ProcessGroup, bucket: torch.Tensor) -> dist.Work:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([bucket], options)


def _send_buckets(group, plan, named: NamedTensors, staging: list[torch.Tensor]) -> None:
    """Pack bucket i while bucket i - 1 is on the wire."""
    views = {name: _byte_view(tensor) for name, tensor in named.items()}
    works: list[dist.Work | None] = [None, None]
    for i, (size, segments) in enumerate(plan):
        slot = i % 2
        if works[slot] is not None:
            works[slot].wait()
        bucket = staging[slot][:size]
        for seg in segments:
            _copy_bytes(
                bucket[seg.bucket_start : seg.bucket_start + seg.nbytes],
                views[seg.name][seg.tensor_start : seg.tensor_start + seg.nbytes],
            )
        works[slot] = _broadcast(group, bucket)
    for work in works:
        if work is not None:
            work.wait()


def _receive_buckets(group, plan, buffers: NamedTensors, staging: list[torch.Tensor]) -> None:
    """Receive bucket i while bucket i - 1 is written into the buffers."""
    views = {name: _byte_view(tensor) for name, tensor in buffers.items()}
    pending = None
    for i, (size, segments) in enumerate(plan + [(0, [])]):
        arriving = (
            (_broadcast(group, staging[i % 2][:size]), staging[i % 2][:size], segments) if size else None
        )
        if pending is not None:
            work, bucket, done_segments = pending
            work.wait()
            for seg in done_segments:
                _copy_bytes(
                    views[seg.name][seg.tensor_start : seg.tensor_start + seg.nbytes],
                    bucket[seg.bucket_start : seg.bucket_start + seg.nbytes],
                )
        pending = arriving


class Broadcast:
    """One end of the bucketed LoRA broadcast between the trainer (rank 0, which sends) and a rollout worker
    (rank 1, which receives): their process group, the bucket plan of the receiver's buffers (`specs`), and
    two staging buckets on `staging_device`, so that one is packed or unpacked while the other is on the
    wire."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        backend: str,
        specs: Mapping[str, TensorSpec],
        bucket_bytes: int,
        staging_device: torch.device | str,
        timeout_s: float,
    ) -> None:
        self._group = _connect(store, rank, backend, timeout_s)
        self.plan = bucket_plan(specs, bucket_bytes)
        self._staging = [
            torch.empty(self.plan[0][0], dtype=torch.uint8, device=staging_device) for _ in range(2)
        ]

    def send(self, named: NamedTensors) -> None:
        """The trainer's end: `named`'s bytes, bucket by bucket."""
        _send_buckets(self._group, self.plan, named, self._staging)

    def receive(self, buffers: NamedTensors) -> None:
        """The worker's end: the buckets, written into `buffers`."""
        _receive_buckets(self._group, self.plan, buffers, self._staging)
