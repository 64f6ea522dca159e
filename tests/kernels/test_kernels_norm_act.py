"""rms_norm (plain and fused with the residual add) and silu_and_mul against transformers' own modules."""

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedrl_kernels import use_backend
from pagedrl_kernels.activation import silu_and_mul
from pagedrl_kernels.rms_norm import rms_norm


def hf_norm(hidden, weight, eps):
    module = LlamaRMSNorm(hidden.shape[-1], eps=eps).to(weight.dtype)
    module.weight.data.copy_(weight)
    return module(hidden)


@pytest.mark.parametrize(("num_tokens", "hidden"), [(1, 64), (7, 576), (300, 200)])
def test_rms_norm_matches_hf(kernel_backend, num_tokens, hidden, gen, poison_allocations):
    x = torch.randn(num_tokens, hidden, generator=gen) * 3
    residual = torch.randn(num_tokens, hidden, generator=gen)
    weight = torch.rand(hidden, generator=gen) + 0.5
    with use_backend(kernel_backend):
        plain = rms_norm(x, weight, 1e-6)
        fused, summed = rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(plain, hf_norm(x, weight, 1e-6), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(summed, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(fused, hf_norm(x + residual, weight, 1e-6), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("num_tokens", "size"), [(1, 100), (5, 1536), (40, 1000)])
def test_silu_and_mul_matches_hf_mlp(kernel_backend, num_tokens, size, gen, poison_allocations):
    gate = torch.randn(num_tokens, size, generator=gen) * 4
    gate[0, :4] = torch.tensor([-100.0, -30.0, 30.0, 100.0])  # sigmoid's saturated ends
    up = torch.randn(num_tokens, size, generator=gen)
    with use_backend(kernel_backend):
        out = silu_and_mul(gate, up)
    torch.testing.assert_close(out, ACT2FN["silu"](gate) * up, atol=1e-5, rtol=1e-5)


def test_rms_norm_rejects_wrong_weight(gen):
    with pytest.raises(ValueError, match="weight \\[hidden\\]"):
        rms_norm(torch.randn(2, 8, generator=gen), torch.ones(9), 1e-6)


@pytest.mark.gpu
def test_gpu_bf16_norm_and_activation_match_reference(gen):
    x, residual, gate, up = (torch.randn(9, 576, generator=gen).to("cuda", torch.bfloat16) for _ in range(4))
    weight = (torch.rand(576, generator=gen) + 0.5).to("cuda", torch.bfloat16)
    fused, summed = rms_norm(x, weight, 1e-6, residual)
    with use_backend("torch"):
        want_fused, want_summed = rms_norm(x, weight, 1e-6, residual)
        want_act = silu_and_mul(gate, up)
    torch.testing.assert_close(summed, want_summed, atol=0, rtol=0)
    torch.testing.assert_close(fused, want_fused, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(silu_and_mul(gate, up), want_act, atol=2e-2, rtol=2e-2)
