"""CPU projections through a pack made once per weight: fp32 weights packed for MKL's sgemm instead of on
every call, bf16 weights as one stacked bf16 copy (below).

`F.linear` on the CPU calls MKL's cblas_sgemm, which copies the weight matrix into its blocked layout on every
call; at decode batch sizes that copy is a large part of the call. `packed_stacked_linear` keeps one packed
copy per weight (or per stack of weights, below), made by MKL's cblas_sgemm_pack for 64 rows, and multiplies
with cblas_sgemm_compute: the calls `torch.ops.mkl._mkl_reorder_linear_weight` and `_mkl_linear` make (what
Inductor's freezing uses for fp32 CPU linear), with the same results bit for bit, from the MKL that torch's
CPU library carries (the engine's generation ran 10-16% faster through these calls than through torch's two
ops, in an interleaved A/B of bench/rollout.py's workload; see bench/RESULTS.md). One pack serves every row
count: MKL's results from it equal F.linear's at other counts too (the tests check this on each machine
they run on).

A pack is rebuilt when its weight changes: an in-place update bumps the tensor's `_version`, and
`param.data = new` changes its `data_ptr()`; a write through `param.data` (which shares the storage but not
the version counter) is not seen, as it is not by autograd either. It is rebuilt in place, into the buffer it
already has, so a weight updated every step costs no allocation. Packs are held by a weak reference to their
weight, so a freed parameter frees its pack. MKL asks for more room for a pack than its weight's size (2.7 GB
for SmolLM2-135M's 540 MB of projections; 8.8-13.3 MB for each of its 0.4-3.4 MB projection matrices), but
writes only about the weight's size of it, so the process's resident memory grows by that (measured).
Allocating and freeing such buffers on every weight update would not do: the first free of a buffer that glibc
had mapped on its own raises glibc's threshold for mapping allocations to that size, and from then on
buffers and activations share its heap, where the untouched room of each buffer lands on pages that were
touched before (the default job's peak grew by 0.55 GB over 12 steps that way).

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

bf16 weights (model.dtype=bfloat16, or auto on a CPU with native bf16) take the same route with another pack:
a contiguous bf16 copy of the stack (each part plus its update, summed in fp32 and rounded once), multiplied
with fp32 accumulation and one rounding of the output to bf16, as F.linear does. The product is switchable,
to be measured on a CPU that multiplies bf16 natively: "torch" (the default) is F.linear on the copy, which
torch hands to oneDNN on AVX-512 CPUs; "mkl" is MKL's cblas_gemm_bf16bf16f32, the one bf16 GEMM the MKL
in torch's CPU library exports (without the pack calls of the fp32 one, so MKL copies the weight into its
layout on every call). `set_bf16_gemm(name)`, or PAGEDRL_BF16_GEMM=torch|mkl before the import. Measured on
a 2-core AVX2 AMD EPYC (no native bf16, where torch's bf16 matmul is its own generic code, not oneDNN's),
SmolLM2-135M's engine at 48 sequences, 1 thread, CPU time: fp32 10.3 s, bf16 "mkl" 11.5 s, bf16 "torch"
43.5 s. Where the CPU has avx512_bf16 or amx_bf16 the two are still to be measured.

Everything else is declined (None), for the caller's F.linear: fewer than MIN_PACKED_ROWS rows, CUDA tensors,
other dtypes (fp16, fp64), weights made under inference_mode, fp32 on torch without MKL's packing calls,
autograd, mismatched shapes (F.linear names them), and the "torch" kernel backend.

`packed_stacked_linear` multiplies x by several weights of one input at once (q/k/v, gate/up), stacked by
rows into one pack, each part optionally plus a low-rank update W + L R (a LoRA adapter merged into its base
projection): one product of the stack where adding the adapter's own two products cost 15-30% of a decode
step, and 3-9% faster than one product per weight at 64-128 rows (SmolLM2-135M's q/k/v and gate/up, 30
layers' distinct weights, 2 threads). The merged sum is packed in place of the base weights, so it holds the
same memory; a stack's pack is rebuilt when any part's weight changes, as above, or when an update's owner
says its factors changed (a new `version`), and freed when any part's weight or owner is.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pagedrl_kernels.backend import get_backend


def _mkl_calls() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, ctypes._CFuncPtr] | None:
    """cblas_sgemm_pack_get_size, cblas_sgemm_pack and cblas_sgemm_compute of the MKL in torch's CPU
    library, or None where it has none (torch without MKL)."""
    if not torch._C.has_mkl:
        return None
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get_size, pack, compute = (
            library.cblas_sgemm_pack_get_size,
            library.cblas_sgemm_pack,
            library.cblas_sgemm_compute,
        )
    except (OSError, AttributeError):
        return None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    get_size.restype, get_size.argtypes = ctypes.c_size_t, [i] * 4
    pack.restype, pack.argtypes = None, [i] * 6 + [f, p, i, p]
    compute.restype, compute.argtypes = None, [i] * 6 + [p, i, p, i, f, p, i]
    return get_size, pack, compute


def _mkl_bf16_gemm() -> ctypes._CFuncPtr | None:
    """cblas_gemm_bf16bf16f32 of the MKL in torch's CPU library (bf16 A and B, fp32 C), or None."""
    if not torch._C.has_mkl:
        return None
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        gemm = library.cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    gemm.restype, gemm.argtypes = None, [i] * 6 + [f, p, i, p, i, f, p, i]
    return gemm


_MKL = _mkl_calls()
HAS_MKL_PACKING = _MKL is not None
_MKL_BF16_GEMM = _mkl_bf16_gemm()
BF16_GEMMS = ("torch", "mkl")


def _checked_bf16_gemm(name: str, source: str) -> str:
    if name not in BF16_GEMMS:
        raise ValueError(
            f"{source}={name!r} is not a bf16 CPU product; choose one of {', '.join(BF16_GEMMS)}"
        )
    if name == "mkl" and _MKL_BF16_GEMM is None:
        raise ValueError(
            f"{source}=mkl, but this torch's CPU library has no MKL cblas_gemm_bf16bf16f32; use torch"
        )
    return name


_bf16_gemm = _checked_bf16_gemm(os.environ.get("PAGEDRL_BF16_GEMM", "torch"), "PAGEDRL_BF16_GEMM")


def set_bf16_gemm(name: str) -> str:
    """Multiply bf16 packs with "torch" (F.linear: oneDNN where torch uses it) or "mkl"
    (cblas_gemm_bf16bf16f32); returns the product this replaces."""
    global _bf16_gemm
    previous, _bf16_gemm = _bf16_gemm, _checked_bf16_gemm(name, "bf16_gemm")
    return previous


_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162  # MKL's CBLAS constants
MIN_PACKED_ROWS = 4
_PACK_ROWS_HINT = 64  # the row count MKL is told to expect; any count uses the same pack


class WeightUpdate(NamedTuple):
    """A low-rank term added to a weight before it is packed: weight + left @ right, for left [out, r] and
    right [r, in]. `owner` identifies the factors and lives as long as they do; whoever writes them bumps
    `version` each time. The pack is held by a weak reference to the owner, so a freed owner frees its
    pack."""

    left: torch.Tensor
    right: torch.Tensor
    owner: object
    version: int


class PackPart(NamedTuple):
    """One weight [out, in] of a stacked product, with its bias and the low-rank update added to it (None:
    none)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    update: WeightUpdate | None = None


class _Pack(NamedTuple):
    refs: tuple[weakref.ref, ...]  # each part's weight, then its update's owner if any
    stamps: tuple[tuple[int, int, int], ...]  # each part's weight version and data_ptr, and update version
    packed: torch.Tensor  # fp32: the buffer MKL packed into (uint8); bf16: the stacked weights [out, in]
    num_bytes: int  # what the pack holds in memory: its weights' size


# each part's (id(weight), id(update owner) or 0), flattened -> the pack of their stack; a plain dict, because
# the per-call lookup is on the decode path
_packs: dict[tuple[int, ...], _Pack] = {}


def _forget(key: tuple[int, ...]) -> None:
    _packs.pop(key, None)


def _stamps(parts: Sequence[PackPart]) -> tuple[tuple[int, int, int], ...]:
    """What a pack was made from: each part's weight version and data_ptr, and its update's version."""
    return tuple((w._version, w.data_ptr(), 0 if u is None else u.version) for w, _, u in parts)


def _packs_dtype(dtype: torch.dtype) -> bool:
    """Whether weights of this dtype multiply through a pack: under the "auto" kernel backend, fp32 where
    MKL's packing calls are there, and bf16."""
    if get_backend() != "auto":
        return False
    return (dtype == torch.float32 and HAS_MKL_PACKING) or dtype == torch.bfloat16


def _packable(weight: torch.Tensor) -> bool:
    """A contiguous CPU matrix of a dtype that packs, whose writes can be seen (an inference tensor has no
    version counter)."""
    cpu_matrix = weight.is_cpu and _packs_dtype(weight.dtype) and weight.dim() == 2
    return cpu_matrix and weight.is_contiguous() and not weight.is_inference()


def _pack_of(parts: Sequence[PackPart]) -> torch.Tensor | None:
    """The pack of the parts' weights (each plus its update) stacked by rows, rebuilt in place when a weight
    was written in place or its data replaced, or an update's version moved; None where a weight cannot be
    packed (not a contiguous CPU matrix of a dtype that packs, or not of the first one's dtype) or its writes
    cannot be seen (an inference tensor)."""
    owners, key = [], []
    for weight, _, update in parts:
        owners.append(weight)
        key += (id(weight), 0 if update is None else id(update.owner))
        if update is not None:
            owners.append(update.owner)
    key = tuple(key)
    pack = _packs.get(key)
    same_owners = pack is not None and all(
        ref() is owner for ref, owner in zip(pack.refs, owners, strict=True)
    )
    if same_owners and pack.stamps == _stamps(parts):  # the decode path: a pack that is still current
        return pack.packed
    weights = [part.weight for part in parts]
    if not all(map(_packable, weights)) or len({w.dtype for w in weights}) > 1:
        _packs.pop(key, None)  # a stale pack of these weights' old data
        return None
    stamps = _stamps(parts)  # only now: an inference tensor, declined above, has no version to read
    out_features, in_features = sum(w.shape[0] for w in weights), weights[0].shape[1]
    dtype = weights[0].dtype
    if dtype == torch.float32:  # MKL's packed layout, in bytes
        shape, buffer_dtype = (_MKL[0](_B_MATRIX, _PACK_ROWS_HINT, out_features, in_features),), torch.uint8
    else:
        shape, buffer_dtype = (out_features, in_features), dtype
    if same_owners and pack.packed.shape == shape:  # new values, same shapes: the buffer takes the new pack
        buffer, refs = pack.packed, pack.refs
    else:
        _packs.pop(key, None)
        # a normal tensor: a bf16 pack is refilled by torch's copy_, which an inference tensor refuses outside
        # inference_mode
        with torch.inference_mode(False):
            buffer = torch.empty(shape, dtype=buffer_dtype)
        refs = tuple(weakref.ref(owner, lambda _: _forget(key)) for owner in owners)
    with torch.no_grad():
        if buffer.dtype == torch.uint8:
            _pack_fp32(parts, buffer, out_features, in_features)
        else:
            stacked_rows = buffer.split([w.shape[0] for w in weights])
            for (weight, _, update), rows in zip(parts, stacked_rows, strict=True):
                # an update is added in fp32 and the sum rounded once to the weights' dtype
                if update is None:
                    rows.copy_(weight)
                else:
                    rows.copy_(torch.addmm(weight.float(), update.left.float(), update.right.float()))
    _packs[key] = _Pack(refs, stamps, buffer, sum(w.nbytes for w in weights))
    return buffer


def _pack_fp32(parts: Sequence[PackPart], buffer: torch.Tensor, out_features: int, in_features: int) -> None:
    """MKL's pack of the fp32 parts' weights (each plus its update) stacked by rows, into `buffer`."""
    sources = [w if u is None else torch.addmm(w, u.left, u.right) for w, _, u in parts]
    source = sources[0] if len(sources) == 1 else torch.cat(sources)
    _MKL[1](
        _ROW_MAJOR,
        _B_MATRIX,
        _TRANS,
        _PACK_ROWS_HINT,
        out_features,
        in_features,
        1.0,
        source.data_ptr(),
        in_features,
        buffer.data_ptr(),
    )


def _takes_packed(x: torch.Tensor, parts: Sequence[PackPart]) -> bool:
    """Whether x and the parts fit the packed product: at least MIN_PACKED_ROWS rows of CPU tensors of the
    weights' shapes (F.linear names a mismatch) and of one dtype that packs, no autograd, and the "auto"
    backend."""
    num_rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if num_rows < MIN_PACKED_ROWS or not (x.is_cpu and _packs_dtype(x.dtype)):
        return False
    grad = torch.is_grad_enabled()
    if grad and x.requires_grad:
        return False
    for weight, bias, _ in parts:
        if x.shape[-1] != weight.shape[-1] or weight.dtype != x.dtype or (grad and weight.requires_grad):
            return False
        if bias is None:
            continue
        bias_fits = bias.is_cpu and bias.dtype == x.dtype and bias.shape == weight.shape[:1]
        if not bias_fits or (grad and bias.requires_grad):
            return False
    return True


def _stacked_bias(parts: Sequence[PackPart]) -> torch.Tensor | None:
    if all(part.bias is None for part in parts):
        return None
    if len(parts) == 1:
        return parts[0].bias
    return torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in parts])


def packed_stacked_linear(x: torch.Tensor, parts: Sequence[PackPart]) -> torch.Tensor | None:
    """x [..., in] times the parts' weights (each plus its update) stacked by rows, plus their biases:
    [..., sum of the parts' out], the parts' outputs side by side, through one pack of the stack; None on
    inputs it declines (see the top of this file: the caller then multiplies by each part itself)."""
    if not _takes_packed(x, parts):
        return None
    packed = _pack_of(parts)
    if packed is None:
        return None
    out_features, in_features = sum(part.weight.shape[0] for part in parts), x.shape[-1]
    rows = x.reshape(-1, in_features)
    if rows.stride(1) != 1 or rows.stride(0) < in_features:
        rows = rows.contiguous()
    bias = _stacked_bias(parts)
    if packed.dtype == torch.bfloat16 and _bf16_gemm == "torch":
        return F.linear(rows, packed, bias).view(*x.shape[:-1], out_features)
    y = _mkl_product(rows, packed, bias, out_features, in_features)
    return y.view(*x.shape[:-1], out_features).to(x.dtype)


def _mkl_product(
    rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int, in_features: int
) -> torch.Tensor:
    """rows [num_rows, in] times a pack, plus bias, by MKL into fp32 [num_rows, out]: cblas_sgemm_compute for
    an fp32 pack, cblas_gemm_bf16bf16f32 for a bf16 one."""
    num_rows = rows.shape[0]
    y = torch.empty(num_rows, out_features, dtype=torch.float32)
    if bias is not None:
        y.copy_(bias.expand(num_rows, out_features))
    beta = 1.0 if bias is not None else 0.0
    m, n, k, a, lda = num_rows, out_features, in_features, rows.data_ptr(), rows.stride(0)
    if packed.dtype == torch.uint8:
        _MKL[2](_ROW_MAJOR, _NO_TRANS, _PACKED, m, n, k, a, lda, packed.data_ptr(), k, beta, y.data_ptr(), n)
    else:
        _MKL_BF16_GEMM(
            _ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a, lda, packed.data_ptr(), k, beta, y.data_ptr(), n
        )
    return y


def pack_bytes(weights: Sequence[torch.Tensor]) -> int:
    """What the packs of these weights will hold in memory once multiplied at MIN_PACKED_ROWS rows or more
    (their size, once each): 0 for weights that stay with F.linear."""
    return sum(w.nbytes for w in weights if _packable(w))


def packed_weight_bytes() -> int:
    """Bytes held in packs in this process."""
    return sum(pack.num_bytes for pack in _packs.values())
