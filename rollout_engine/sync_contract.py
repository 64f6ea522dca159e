"""The weight-sync contract between the trainer (rl.sync) and the engine: how LoRA tensors are named, which
peft layers carry them, how an update is checked against the receiver's buffers and loaded in, and what a
load reports (SyncStats).

A tensor's name is the HF module path of the base Linear plus `.lora_A` ([r, in_features]) or `.lora_B`
([out_features, r]), e.g. `model.layers.0.self_attn.q_proj.lora_A`. An update is validated in full before any
byte is written, so a bad one leaves the old weights serving. Both sides import this module; it holds no
engine state (the engine's buffers live in rollout_engine/lora.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import nn


@dataclass(slots=True)
class SyncStats:
    """What one push of LoRA weights into an engine did: its version, time, bytes, tensors and buckets (0
    when it copied in-process)."""

    version: int
    ms: float
    bytes: int
    num_tensors: int
    num_buckets: int

    def metrics(self) -> dict[str, float]:
        """The values to log: ``sync/ms`` and ``sync/bytes``."""
        return {"sync/ms": self.ms, "sync/bytes": float(self.bytes)}


class LoraReceiver(Protocol):
    """The engine side of a sync: it owns the LoRA buffers and adopts the version written into them."""

    def lora_buffers(self) -> Mapping[str, torch.Tensor]: ...

    def set_lora_version(self, version: int) -> None: ...


class TensorSpec(NamedTuple):
    """Shape and dtype of one named LoRA tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA layer (duck-typed, so the engine imports no peft): per-adapter lora_A/lora_B/scaling."""
    return all(hasattr(module, name) for name in ("lora_A", "lora_B", "scaling", "get_base_layer"))


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(HF module path, peft LoRA layer) of every adapted Linear; empty for a model without an adapter."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [(name, module) for name, module in base.named_modules() if is_lora_layer(module)]


def active_adapter(model: nn.Module) -> str:
    """The name of the peft model's one active adapter; ValueError when it has none or several."""
    adapter = getattr(model, "active_adapter", None)
    if not isinstance(adapter, str):
        raise ValueError(f"the engine serves exactly one active LoRA adapter, found {adapter!r}")
    return adapter


def tensor_specs(named: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """Shape and dtype of each named tensor, in order."""
    return {name: TensorSpec(tuple(t.shape), t.dtype) for name, t in named.items()}


def check_update(
    named: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec], version: int, last: int
) -> None:
    """Raise a ValueError naming the first problem if `named` cannot replace the buffers of `specs`."""
    if not isinstance(version, int) or version <= last:
        raise ValueError(f"LoRA version {version!r} must be an int above the last pushed version {last}.")
    unknown = [name for name in named if name not in specs]
    if unknown:
        raise ValueError(
            f"LoRA update v{version} names {len(unknown)} tensor(s) the receiver does not hold, "
            f"e.g. {unknown[0]!r}. Names are the base Linear's module path plus .lora_A/.lora_B "
            "(rl.sync.adapter.lora_tensors); build the receiver with the same target_modules."
        )
    missing = [name for name in specs if name not in named]
    if missing:
        raise ValueError(
            f"LoRA update v{version} lacks {len(missing)} tensor(s) the receiver holds, e.g. {missing[0]!r}: "
            "push every tensor of rl.sync.adapter.lora_tensors(model)."
        )
    for name, spec in specs.items():
        tensor = named[name]
        if tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"LoRA tensor {name!r} has shape {tuple(tensor.shape)} but the receiver's buffer is "
                f"{spec.shape}: the rank or model differs between trainer and receiver."
            )
        if tensor.dtype != spec.dtype:
            raise ValueError(
                f"LoRA tensor {name!r} is {tensor.dtype} but the receiver's buffer is {spec.dtype}: "
                "cast the adapter or build the receiver in the same dtype."
            )


def copy_update(
    buffers: Mapping[str, torch.Tensor], named: Mapping[str, torch.Tensor], version: int, last: int
) -> int:
    """Validate everything, then copy `named` into `buffers` in place; returns the bytes copied."""
    check_update(named, tensor_specs(buffers), version, last)
    names = list(buffers)
    with torch.no_grad():
        torch._foreach_copy_([buffers[n] for n in names], [named[n] for n in names])
    for device in {t.device for t in buffers.values() if t.device.type == "cuda"}:
        torch.cuda.synchronize(device)
    return sum(spec.nbytes for spec in tensor_specs(buffers).values())


def load_update(
    receiver: LoraReceiver, named: Mapping[str, torch.Tensor], version: int, last: int
) -> SyncStats:
    """Validate `named` against the receiver's buffers (`version` must exceed `last`), copy it in and hand the
    receiver the new version: an in-process push, timed."""
    start = time.perf_counter()
    buffers = receiver.lora_buffers()
    nbytes = copy_update(buffers, named, version, last)
    receiver.set_lora_version(version)
    return SyncStats(version, (time.perf_counter() - start) * 1e3, nbytes, len(buffers), 0)
