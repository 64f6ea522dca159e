"""Pushing LoRA tensors from the trainer into an engine's buffers: in-process, or over torch.distributed.

Trainer side: ``sync.push(named_tensors, version) -> SyncStats``. Engine side: a receiver that owns its
buffers (``lora_buffers()``) and learns the new version (``set_lora_version``). Every push is validated
against the receiver's buffers before any byte is written, so a bad update leaves the old weights serving.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rollout_engine.sync_contract import TensorSpec, check_update, copy_update, tensor_specs

NamedTensors = Mapping[str, torch.Tensor]


@dataclass(slots=True)
class SyncStats:
    version: int
    ms: float
    bytes: int
    num_tensors: int
    num_buckets: int

    def metrics(self) -> dict[str, float]:
        """The values to log: ``sync/ms`` and ``sync/bytes``."""
        return {"sync/ms": self.ms, "sync/bytes": float(self.bytes)}


class LoraReceiver(Protocol):
    def lora_buffers(self) -> NamedTensors: ...

    def set_lora_version(self, version: int) -> None: ...


class WorkerReceiver(LoraReceiver, Protocol):
    def handle(self, request: Any) -> Any: ...


class InProcessSync:
    """Device-to-device copy from the trainer's tensors into a receiver in the same process."""

    def __init__(self, receiver: LoraReceiver):
        self._receiver = receiver
        self._version = -1

    def push(self, named: NamedTensors, version: int) -> SyncStats:
        """Validate, then copy every tensor into the receiver's buffers and hand it the new version."""
        start = time.perf_counter()
        buffers = self._receiver.lora_buffers()
        nbytes = copy_update(buffers, named, version, self._version)
        self._receiver.set_lora_version(version)
        self._version = version
        ms = (time.perf_counter() - start) * 1e3
        return SyncStats(version, ms, nbytes, len(buffers), 0)


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


def _store(port: int, timeout_s: float) -> dist.TCPStore:
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


def _resolve_factory(factory: str | Callable[..., WorkerReceiver]) -> Callable[..., WorkerReceiver]:
    if callable(factory):
        return factory
    module_name, _, attr = factory.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def _worker_main(conn, factory, factory_args, port: int, timeout_s: float, bucket_bytes: int) -> None:
    """Rollout-worker loop: build the receiver, then serve sync and call requests until told to close."""
    try:
        receiver = _resolve_factory(factory)(*factory_args)
        buffers = receiver.lora_buffers()
        if not buffers or not all(t.is_contiguous() for t in buffers.values()):
            raise ValueError("The receiver must hold at least one LoRA buffer, all contiguous tensors.")
        device = next(iter(buffers.values())).device
        conn.send(("ready", tensor_specs(buffers), device_id(device)))
        backend = conn.recv()
        if backend == "nccl":
            torch.cuda.set_device(device)
        group = _connect(_store(port, timeout_s), 1, backend, timeout_s)
        plan = bucket_plan(tensor_specs(buffers), bucket_bytes)
        staging_device = device if backend == "nccl" else torch.device("cpu")
        staging = [torch.empty(plan[0][0], dtype=torch.uint8, device=staging_device) for _ in range(2)]
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:
            return
        if kind == "close":
            return
        try:
            if kind == "sync":
                _receive_buckets(group, plan, buffers, staging)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                receiver.set_lora_version(payload)
                conn.send(("ack", payload))
            else:
                conn.send(("result", receiver.handle(payload)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
            if kind == "sync":
                return


class DistributedSync:
    """Trainer side of a rollout worker in another process: LoRA broadcasts in buckets, requests over a pipe.

    The worker builds its receiver with ``receiver_factory(*factory_args)`` (a picklable callable or a dotted
    path ``"package.module:function"``). NCCL carries the buckets when the worker's buffers are on a GPU and
    this process's current GPU is another one; gloo otherwise (`choose_backend`), through host memory.
    """

    def __init__(
        self,
        receiver_factory: str | Callable[..., WorkerReceiver],
        factory_args: tuple = (),
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 120.0,
        startup_timeout_s: float = 600.0,
    ):
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes}.")
        self._timeout_s = timeout_s
        self._version = -1
        store = _store(0, timeout_s)
        self._conn, child_conn = mp.get_context("spawn").Pipe()
        self._process = mp.get_context("spawn").Process(
            target=_worker_main,
            args=(child_conn, receiver_factory, factory_args, store.port, timeout_s, bucket_bytes),
            daemon=True,
        )
        self._process.start()
        child_conn.close()
        try:
            _, self._specs, worker_device = self._await("ready", startup_timeout_s)
            trainer_device = (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            )
            self.backend = choose_backend(worker_device, device_id(trainer_device))
            self._conn.send(self.backend)
            self._group = _connect(store, 0, self.backend, timeout_s)
        except BaseException:
            self.close()
            raise
        self._plan = bucket_plan(self._specs, bucket_bytes)
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        self._staging = [torch.empty(self._plan[0][0], dtype=torch.uint8, device=device) for _ in range(2)]

    def push(self, named: NamedTensors, version: int) -> SyncStats:
        """Validate, broadcast the tensors in buckets and wait until the worker acknowledges ``version``."""
        start = time.perf_counter()
        check_update(named, self._specs, version, self._version)
        self._ensure_alive()
        self._conn.send(("sync", version))
        try:
            with torch.no_grad():
                _send_buckets(self._group, self._plan, named, self._staging)
        except RuntimeError as error:
            self.close()
            raise RuntimeError(
                f"LoRA broadcast of v{version} to the rollout worker failed: {error}"
            ) from error
        self._await("ack", self._timeout_s)
        self._version = version
        ms = (time.perf_counter() - start) * 1e3
        total = sum(spec.nbytes for spec in self._specs.values())
        return SyncStats(version, ms, total, len(self._specs), len(self._plan))

    def call(self, request: Any) -> Any:
        """Send a request (e.g. prompts) to the worker's receiver and return its answer."""
        self._ensure_alive()
        self._conn.send(("call", request))
        return self._await("result", None)[1]

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the worker: ask it to exit within ``grace_s``, then terminate, then kill."""
        if self._process.is_alive() and grace_s > 0:
            try:
                self._conn.send(("close", None))
            except OSError:
                pass
            self._process.join(grace_s)
        for stop in (self._process.terminate, self._process.kill):
            if self._process.is_alive():
                stop()
                self._process.join(5)
        self._conn.close()

    def __enter__(self) -> DistributedSync:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _ensure_alive(self) -> None:
        if self._conn.closed or not self._process.is_alive():
            raise RuntimeError(
                f"The rollout worker is not running (exit code {self._process.exitcode}): create a new sync."
            )

    def _await(self, kind: str, timeout_s: float | None) -> tuple:
        """The worker's next message, of type ``kind``; raises if the worker fails, dies or is late."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._conn.poll(0.05):
            if not self._process.is_alive():
                raise self._died(kind)
            if deadline is not None and time.monotonic() > deadline:
                self.close(grace_s=0)
                raise TimeoutError(f"The rollout worker sent no {kind!r} in {timeout_s} s; it was stopped.")
        try:
            message = self._conn.recv()
        except EOFError:
            self._process.join(5)
            raise self._died(kind) from None
        if message[0] == "error":
            raise RuntimeError(f"The rollout worker failed:\n{message[1]}")
        return message

    def _died(self, kind: str) -> RuntimeError:
        code = self._process.exitcode
        return RuntimeError(f"The rollout worker died (exit code {code}) before sending {kind!r}.")
