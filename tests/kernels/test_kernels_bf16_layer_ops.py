"""The bf16 builds of the C layer ops (pagedrl_kernels/cpu/layer_ops.c) against the PyTorch references in
bf16: the same fp32 arithmetic, rounded to bf16 where the reference rounds. The sums and copies come out bit
for bit; a value computed through exp, sqrt or a sum of products may round to the neighbouring bf16 (2^-7 of
the value at most) where the two fp32 results differ in their last bits. Outputs start as NaN, so unwritten
ones show."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedrl_kernels import use_backend
from pagedrl_kernels.activation import silu_and_mul
from pagedrl_kernels.cpu_library import load_library
from pagedrl_kernels.reshape_and_cache import reshape_and_cache
from pagedrl_kernels.rms_norm import rms_norm
from pagedrl_kernels.rotary_embedding import rotary_embedding


@pytest.fixture(autouse=True)
def built():
    assert load_library("layer_ops") is not None, "the C kernels did not build (see the warning)"


def both(fn):
    """fn run by the C kernel ("auto") and by the reference ("torch")."""
    with use_backend("auto"):
        ours = fn()
    with use_backend("torch"):
        reference = fn()
    return ours, reference


def mostly_identical(ours: torch.Tensor, reference: torch.Tensor, bf16_steps: int = 1) -> None:
    """Within `bf16_steps` steps of a bf16 value (2^-7 of it each) everywhere, and mostly bit for bit."""
    assert ours.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), reference.float(), atol=1e-6, rtol=bf16_steps * 2**-7)
    # the same rounding points, not just close values: measured, all bit for bit but 1 silu value in 30,000
    assert (ours == reference).float().mean() > 0.98


@pytest.mark.parametrize(("num_tokens", "hidden"), [(1, 64), (7, 576), (300, 200)])
def test_rms_norm_rounds_where_transformers_does(num_tokens, hidden, gen, poison_allocations):
    x = (torch.randn(num_tokens, hidden, generator=gen) * 3).bfloat16()
    residual = torch.randn(num_tokens, hidden, generator=gen).bfloat16()
    weight = (torch.rand(hidden, generator=gen) + 0.5).bfloat16()
    (plain, (fused, summed)), (want_plain, (want_fused, want_summed)) = both(
        lambda: (rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6, residual))
    )
    assert torch.equal(summed, want_summed) and torch.equal(summed, x + residual)
    # a normalised value rounded to the neighbouring bf16 moves its product with the weight (up to 1.5) by up
    # to 1.5 steps, which the product's own rounding can make 2
    mostly_identical(plain, want_plain, bf16_steps=2)
    mostly_identical(fused, want_fused, bf16_steps=2)
    hf = LlamaRMSNorm(hidden, eps=1e-6).bfloat16()
    hf.weight.data.copy_(weight)
    mostly_identical(fused, hf(x + residual), bf16_steps=2)


@pytest.mark.parametrize(("num_tokens", "size"), [(1, 100), (5, 1536), (40, 1000)])
def test_silu_and_mul_rounds_once(num_tokens, size, gen, poison_allocations):
    gate = (torch.randn(num_tokens, size, generator=gen) * 4).bfloat16()
    gate[0, :4] = torch.tensor([-100.0, -30.0, 30.0, 100.0])  # sigmoid's saturated ends
    up = torch.randn(num_tokens, size, generator=gen).bfloat16()
    ours, reference = both(lambda: silu_and_mul(gate, up))
    mostly_identical(ours, reference)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_rotates_in_place_with_fp32_cos_and_sin(head_dim, gen):
    positions = torch.randint(0, 300, (11,), generator=gen)
    angles = torch.arange(300)[:, None] * torch.rand(head_dim // 2, generator=gen)[None]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)  # fp32, as the engine keeps it
    q = torch.randn(11, 6, head_dim, generator=gen).bfloat16()
    k = torch.randn(11, 2, head_dim, generator=gen).bfloat16()
    ours, reference = both(lambda: rotary_embedding(positions, q.clone(), k.clone(), cache))
    for got, want in zip(ours, reference, strict=True):
        mostly_identical(got, want)


def test_cache_write_copies_bf16_rows_bit_for_bit(gen):
    shape = (6, 16, 3, 64)
    kv = torch.randn(
        23, 2, 3, 64, generator=gen
    ).bfloat16()  # strided views of one projection, as the model's
    slots = torch.randperm(6 * 16, generator=gen)[:23]
    slots[:4] = -1  # padding tokens

    def write():
        caches = [torch.full(shape, float("nan"), dtype=torch.bfloat16) for _ in range(2)]
        reshape_and_cache(kv[:, 0], kv[:, 1], *caches, slots)
        return caches

    ours, reference = both(write)
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(ours[0].view(-1, 3, 64)[slots[4:]], kv[4:, 0])
