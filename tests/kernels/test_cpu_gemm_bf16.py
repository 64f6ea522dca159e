"""bf16 projections through the packs of pagedrl_kernels/cpu_gemm.py: one bf16 copy of a stack of weights
(each plus its low-rank update, added in fp32 and rounded once), multiplied by F.linear ("torch") or by MKL's
cblas_gemm_bf16bf16f32 ("mkl"), against the fp32 product of the same bf16 values rounded once to bf16."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from pagedrl_kernels import cpu_gemm, use_backend
from pagedrl_kernels.cpu_gemm import (
    BF16_GEMMS,
    MIN_PACKED_ROWS,
    PackPart,
    WeightUpdate,
    packed_stacked_linear,
    packed_weight_bytes,
    set_bf16_gemm,
)

# The fp32 sums of the reference and of the kernels add the same exact bf16 products in other orders, so
# their one rounding to bf16 may land one bf16 step (2^-7 of the value at most) apart.
ONE_ROUNDING = dict(atol=1e-3, rtol=2**-7)


@pytest.fixture(params=BF16_GEMMS)
def bf16_gemm(request):
    previous = set_bf16_gemm(request.param)
    yield request.param
    set_bf16_gemm(previous)


def bf16_weight(out_features: int, in_features: int, gen: torch.Generator) -> torch.nn.Parameter:
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    return torch.nn.Parameter(weight, requires_grad=False)


class Factors:
    """A fp32 low-rank update, as a bf16 model's peft adapter keeps it: left [out, r], right [r, in]."""

    def __init__(self, out_features: int, in_features: int, rank: int, gen: torch.Generator) -> None:
        self.left = torch.randn(out_features, rank, generator=gen) * 0.1
        self.right = torch.randn(rank, in_features, generator=gen)
        self.version = 0

    def update(self) -> WeightUpdate:
        return WeightUpdate(self.left, self.right, self, self.version)


def reference(x, weight, bias=None, factors=None) -> torch.Tensor:
    """In fp32: the weight plus its update rounded once to bf16, times x, plus the bias; rounded to bf16."""
    w = weight.float()
    if factors is not None:
        w = (w + factors.left @ factors.right).bfloat16().float()
    return F.linear(x.float(), w, None if bias is None else bias.float()).bfloat16()


@pytest.mark.parametrize("num_rows", [MIN_PACKED_ROWS, 64, 130])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_bf16_product_is_the_fp32_product_rounded_once(bf16_gemm, num_rows, with_bias, gen):
    weight = bf16_weight(96, 72, gen)
    bias = torch.randn(96, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(num_rows, 144, generator=gen).bfloat16()[:, ::2]  # strided rows
    before = packed_weight_bytes()
    y = packed_stacked_linear(x, [PackPart(weight, bias)])
    assert y.dtype == torch.bfloat16 and y.shape == (num_rows, 96)
    torch.testing.assert_close(y.float(), reference(x, weight, bias).float(), **ONE_ROUNDING)
    assert packed_weight_bytes() - before == weight.nbytes  # one bf16 copy: 96 x 72 x 2 bytes
    if bf16_gemm == "torch":  # F.linear of a copy of the same values
        assert torch.equal(y, F.linear(x, weight, bias))


def test_a_stack_merges_each_update_in_fp32_and_puts_the_products_side_by_side(bf16_gemm, gen):
    weights = [bf16_weight(n, 24, gen) for n in (40, 16, 16)]
    biases = [None, torch.randn(16, generator=gen).bfloat16(), None]
    factors = [Factors(40, 24, 4, gen), None, Factors(16, 24, 4, gen)]
    triples = list(zip(weights, biases, factors, strict=True))
    parts = [PackPart(w, b, None if f is None else f.update()) for w, b, f in triples]
    x = torch.randn(32, 24, generator=gen).bfloat16()
    before = packed_weight_bytes()
    y = packed_stacked_linear(x, parts)
    expected = torch.cat([reference(x, w, b, f) for w, b, f in triples], dim=-1)
    torch.testing.assert_close(y.float(), expected.float(), **ONE_ROUNDING)
    assert packed_weight_bytes() - before == sum(w.nbytes for w in weights)
    unmerged = torch.cat([reference(x, w, b) for w, b, _ in triples], dim=-1)
    assert (y.float() - unmerged.float()).abs().max() > 0.1  # so the updates were there to be lost


def test_a_changed_weight_or_update_is_merged_again_into_the_same_buffer(bf16_gemm, gen):
    weight, factors = bf16_weight(48, 32, gen), Factors(48, 32, 4, gen)
    x = torch.randn(16, 32, generator=gen).bfloat16()
    packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    buffers = {key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weight)}
    factors.left.mul_(-3)
    factors.version += 1
    y = packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    torch.testing.assert_close(y.float(), reference(x, weight, None, factors).float(), **ONE_ROUNDING)
    with torch.no_grad():
        weight.add_(1)
    y = packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    torch.testing.assert_close(y.float(), reference(x, weight, None, factors).float(), **ONE_ROUNDING)
    after = {key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weight)}
    assert after == buffers


def test_a_pack_made_in_inference_mode_is_rebuilt_outside_it(gen):
    weight = bf16_weight(48, 32, gen)
    x = torch.randn(8, 32, generator=gen).bfloat16()
    with torch.inference_mode():
        packed_stacked_linear(x, [PackPart(weight)])
    with torch.no_grad():
        weight.add_(1)
        assert torch.equal(packed_stacked_linear(x, [PackPart(weight)]), F.linear(x, weight))


def test_what_a_bf16_pack_does_not_take_is_declined(gen):
    weight, other = bf16_weight(48, 32, gen), bf16_weight(16, 32, gen)
    before = packed_weight_bytes()
    with torch.no_grad():
        few = torch.randn(MIN_PACKED_ROWS - 1, 32, generator=gen).bfloat16()
        assert packed_stacked_linear(few, [PackPart(weight)]) is None
        x = torch.randn(8, 32, generator=gen).bfloat16()
        assert packed_stacked_linear(x.float(), [PackPart(weight)]) is None  # x in another dtype
        assert packed_stacked_linear(x, [PackPart(weight), PackPart(other.float())]) is None  # mixed stack
        with use_backend("torch"):
            assert packed_stacked_linear(x, [PackPart(weight)]) is None
    assert packed_weight_bytes() == before


def test_the_bf16_product_is_chosen_by_name_or_environment():
    with pytest.raises(
        ValueError, match="bf16_gemm='onednn' is not a bf16 CPU product; choose one of torch, mkl"
    ):
        set_bf16_gemm("onednn")
    env = dict(os.environ, PAGEDRL_BF16_GEMM="mkl")
    code = "from pagedrl_kernels.cpu_gemm import set_bf16_gemm; print(set_bf16_gemm('torch'))"
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "mkl"
    env["PAGEDRL_BF16_GEMM"] = "blas"
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert ran.returncode != 0 and "PAGEDRL_BF16_GEMM='blas' is not a bf16 CPU product" in ran.stderr
