"""`rollout.placement=process`: the engine lives in a rollout-worker process, which this module owns.

The trainer starts the worker (`DistributedSync`) and talks to it over a pipe; the worker builds its receiver
(`worker_main`: for the job, `EngineWorker`, an engine over its own copy of the model with the trainer's LoRA
layout), then serves LoRA syncs, which arrive as torch.distributed broadcasts (rl.sync.transport), and
requests. `RemoteEngine` gives the trainer the same engine interface as a colocated `LLMEngine`: generate,
stats, update_lora, reset_prefix_cache.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp

from rl.job.model_loading import load_model
from rl.sync.adapter import add_lora
from rl.sync.transport import Broadcast, NamedTensors, choose_backend, device_id, open_store
from rollout_engine import GroupResult, LLMEngine, SamplingParams
from rollout_engine.sync_contract import LoraReceiver, SyncStats, check_update, tensor_specs


class WorkerReceiver(LoraReceiver, Protocol):
    def handle(self, request: Any) -> Any: ...


def _resolve_factory(factory: str | Callable[..., WorkerReceiver]) -> Callable[..., WorkerReceiver]:
    if callable(factory):
        return factory
    module_name, _, attr = factory.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def worker_main(conn, factory, factory_args, port: int, timeout_s: float, bucket_bytes: int) -> None:
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
        staging = device if backend == "nccl" else torch.device("cpu")
        store = open_store(port, timeout_s)
        broadcast = Broadcast(store, 1, backend, tensor_specs(buffers), bucket_bytes, staging, timeout_s)
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
                broadcast.receive(buffers)
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
        store = open_store(0, timeout_s)
        self._conn, child_conn = mp.get_context("spawn").Pipe()
        self._process = mp.get_context("spawn").Process(
            target=worker_main,
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
            staging_device = trainer_device if self.backend == "nccl" else "cpu"
            self._broadcast = Broadcast(
                store, 0, self.backend, self._specs, bucket_bytes, staging_device, timeout_s
            )
        except BaseException:
            self.close()
            raise

    def push(self, named: NamedTensors, version: int) -> SyncStats:
        """Validate, broadcast the tensors in buckets and wait until the worker acknowledges ``version``."""
        start = time.perf_counter()
        check_update(named, self._specs, version, self._version)
        self._ensure_alive()
        self._conn.send(("sync", version))
        try:
            with torch.no_grad():
                self._broadcast.send(named)
        except RuntimeError as error:
            self.close()
            raise RuntimeError(
                f"LoRA broadcast of v{version} to the rollout worker failed: {error}"
            ) from error
        self._await("ack", self._timeout_s)
        self._version = version
        ms = (time.perf_counter() - start) * 1e3
        total = sum(spec.nbytes for spec in self._specs.values())
        return SyncStats(version, ms, total, len(self._specs), len(self._broadcast.plan))

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


class EngineWorker:
    """The worker-side receiver: an engine over a freshly loaded model with the trainer's LoRA layout."""

    def __init__(
        self,
        model_kwargs: Mapping[str, Any],
        lora_kwargs: Mapping[str, Any],
        engine_kwargs: Mapping[str, Any],
    ) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        model, tokenizer = load_model(**model_kwargs)
        self.engine = LLMEngine(add_lora(model, **lora_kwargs), tokenizer, **engine_kwargs)

    def lora_buffers(self) -> Mapping[str, torch.Tensor]:
        return self.engine.lora_buffers()

    def set_lora_version(self, version: int) -> None:
        self.engine.set_lora_version(version)

    def handle(self, request: tuple) -> Any:
        kind, *args = request
        if kind == "generate":
            return self.engine.generate(*args)
        if kind == "stats":
            return self.engine.stats()
        if kind == "reset_prefix_cache":
            return self.engine.reset_prefix_cache()
        raise ValueError(
            f"unknown rollout-worker request {kind!r}; expected 'generate', 'stats' or 'reset_prefix_cache'"
        )


def build_worker(model_kwargs, lora_kwargs, engine_kwargs) -> EngineWorker:
    """Picklable factory run inside the worker process."""
    return EngineWorker(model_kwargs, lora_kwargs, engine_kwargs)


class RemoteEngine:
    """The trainer-side stand-in for an engine in the rollout worker."""

    def __init__(self, sync: DistributedSync) -> None:
        self.sync = sync

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        on_finished: Callable[[int], None] | None = None,
    ) -> list[GroupResult]:
        """The worker's results; ``on_finished(i)`` hears of every prompt once the whole call is back (the
        pipe returns results only at the end of a call)."""
        results = self.sync.call(("generate", prompt_token_ids, params))
        if on_finished is not None:
            for i in range(len(results)):
                on_finished(i)
        return results

    def stats(self) -> dict[str, int | list[int]]:
        return self.sync.call(("stats",))

    def update_lora(self, named: NamedTensors, version: int) -> SyncStats:
        """Broadcast new LoRA weights to the worker's engine, which adopts `version` once they are in."""
        return self.sync.push(named, version)

    def reset_prefix_cache(self) -> None:
        """Forget every block the worker's engine has cached."""
        self.sync.call(("reset_prefix_cache",))
