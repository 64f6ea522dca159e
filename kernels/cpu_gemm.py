"""fp32 CPU projections with the weight packed once for MKL's sgemm instead of on every call.

`F.linear` on the CPU calls MKL's cblas_sgemm, which copies the weight matrix into its blocked layout on
every call; at decode batch sizes that copy is a large part of the call. `packed_linear` keeps one
packed copy per weight (`torch.ops.mkl._mkl_reorder_linear_weight`, what Inductor's freezing uses for fp32
CPU linear) and multiplies with cblas_sgemm_compute (`torch.ops.mkl._mkl_linear`). One pack, made for 64
rows, serves every row count: MKL's results from it equal F.linear's at other counts too (the tests check
this on each machine they run on).

A pack is rebuilt when its weight changes: an in-place update bumps the tensor's `_version`, and
`param.data = new` changes its `data_ptr()`; a write through `param.data` (which shares the storage but not
the version counter) is not seen, as it is not by autograd either. Packs are held by a weak reference to
their weight, so a freed parameter frees its pack. MKL reserves more address space for a pack than its
weight's size (2.7 GB for SmolLM2-135M's 540 MB of projections), but the process's resident memory grows by
the weights' size only (measured).

Measured on a 2-core Intel Xeon reporting AVX512 (torch.backends.cpu.get_cpu_capability(); torch 2.13),
fp32, SmolLM2-135M's shapes (576x576, 192x576, 1536x576, 576x1536 and the 49152x576 LM head), packed /
F.linear speed with 2 threads (1 thread): 0.87-1.38 (0.87-1.27) at 1 row, 0.55-1.04 at 2-3 rows (where
F.linear has a fast path), 1.3-3.1 (1.0-1.9) at 4 rows, 1.5-2.3 (1.1-2.6) at 8, 1.2-2.8 at 16, 1.2-1.5 at
64, 1.04-1.14 at 128, 1.0-1.1 at 256, and 0.88-1.03 at 512-1024 (the 192x576 k/v projections lose most,
0.88-0.92, a small share of a prefill chunk). So F.linear keeps fewer than MIN_PACKED_ROWS rows at every
shape, single-sequence decode included: the LM head measured no better than the others at 1-3 rows
(0.87-1.04). With the weights streaming from memory, as in a decode step (all 211 of the model's matrices
in turn), a step's projections ran 1.04 (1 row), 1.34 (4), 1.43 (8), 1.27 (16), 1.41 (64) and 1.09 (128)
times faster packed; the engine's generation, 1.37x at 16 sequences, 1.2x at 64, unchanged at 1 and 128.
Other CPUs (AVX2 AMD EPYC) run MKL's own code for them, with the same results; the threshold was not
measured there.

Everything else is exactly F.linear: CUDA tensors, other dtypes, weights made under inference_mode,
torch without MKL, autograd, and the "torch" kernel backend.

`packed_sum_linear` multiplies by a weight plus a low-rank update, W + L R (a LoRA adapter merged into its
base projection), through one pack of the sum: a product the size of the base's alone, where adding the
adapter's own two products costs 15-30% of a decode step. The sum is packed in place of the base weight, so
it holds the same memory; the pack is rebuilt when the weight changes, as above, or when the update's owner
says its factors changed (a new `version`).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels.backend import get_backend

HAS_MKL_PACKING = torch._C.has_mkl and all(
    hasattr(torch.ops.mkl, op) for op in ("_mkl_reorder_linear_weight", "_mkl_linear")
)
MIN_PACKED_ROWS = 4
_PACK_ROWS_HINT = 64  # the row count MKL is told to expect; any count uses the same pack


class WeightUpdate(NamedTuple):
    """A low-rank term added to a weight before it is packed: weight + left @ right, for left [out, r] and
    right [r, in]. `owner` is the object that writes the factors and bumps `version` each time; its pack is
    held by a weak reference to it, so a freed owner frees its packs."""

    left: torch.Tensor
    right: torch.Tensor
    owner: object
    version: int


class _Pack(NamedTuple):
    refs: tuple[weakref.ref, ...]  # the weight, then the update's owner if any
    version: int
    data_ptr: int
    update_version: int
    packed: torch.Tensor
    num_bytes: int  # what the pack holds in memory: its weight's size


# (id(weight), id(update owner) or 0) -> its pack; a plain dict, because the per-call lookup is on the decode
# path
_packs: dict[tuple[int, int], _Pack] = {}


def _forget(key: tuple[int, int]) -> None:
    _packs.pop(key, None)


def _pack_of(weight: torch.Tensor, update: WeightUpdate | None) -> torch.Tensor | None:
    """The pack of the weight (plus the update), rebuilt when the weight was written in place or its data
    replaced, or the update's version moved; None for a weight MKL cannot pack (not a contiguous fp32 CPU
    matrix) or whose writes cannot be seen (an inference tensor)."""
    owners = (weight,) if update is None else (weight, update.owner)
    key = (id(weight), id(update.owner) if update is not None else 0)
    update_version = update.version if update is not None else 0
    pack = _packs.get(key)
    if (
        pack is not None
        and pack.version == weight._version
        and pack.data_ptr == weight.data_ptr()
        and pack.update_version == update_version
        and all(ref() is owner for ref, owner in zip(pack.refs, owners, strict=True))
    ):
        return pack.packed
    packable = (
        weight.is_cpu and weight.dtype == torch.float32 and weight.dim() == 2 and weight.is_contiguous()
    )
    if not packable or weight.is_inference():  # an inference tensor has no version counter to watch
        _packs.pop(key, None)  # a stale pack of this weight's old data
        return None
    _packs.pop(key, None)  # the stale pack is freed before its successor is made
    with torch.no_grad():
        source = weight if update is None else torch.addmm(weight, update.left, update.right)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(source, _PACK_ROWS_HINT)
    refs = tuple(weakref.ref(owner, lambda _: _forget(key)) for owner in owners)
    _packs[key] = _Pack(refs, weight._version, weight.data_ptr(), update_version, packed, weight.nbytes)
    return packed


def _takes_packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x and bias fit the packed product: at least MIN_PACKED_ROWS rows of fp32 CPU tensors of the
    weight's shapes (F.linear names a mismatch), no autograd, and the "auto" backend."""
    num_rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if num_rows < MIN_PACKED_ROWS or not HAS_MKL_PACKING or get_backend() != "auto":
        return False
    if not (x.is_cpu and x.dtype == torch.float32) or x.shape[-1] != weight.shape[-1]:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    if bias is None:
        return True
    bias_fits = bias.is_cpu and bias.dtype == torch.float32 and bias.shape == weight.shape[:1]
    return bias_fits and not (torch.is_grad_enabled() and bias.requires_grad)


def _packed_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, update: WeightUpdate | None
) -> torch.Tensor | None:
    if not _takes_packed(x, weight, bias):
        return None
    packed = _pack_of(weight, update)
    if packed is None:
        return None
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.numel() // x.shape[-1])


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through the weight's cached MKL pack on fp32 CPU tensors from
    MIN_PACKED_ROWS rows up."""
    y = _packed_product(x, weight, bias, None)
    return F.linear(x, weight, bias) if y is None else y


def packed_sum_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, update: WeightUpdate
) -> torch.Tensor | None:
    """F.linear(x, weight + update.left @ update.right, bias) through a cached pack of the sum, on the inputs
    that packed_linear packs; None on every other input (the caller then adds the update's product itself)."""
    return _packed_product(x, weight, bias, update)


def packed_weight_bytes() -> int:
    """Bytes held in packs in this process."""
    return sum(pack.num_bytes for pack in _packs.values())
