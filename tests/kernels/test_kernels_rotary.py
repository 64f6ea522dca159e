"""rotary_embedding against transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedrl_kernels import use_backend
from pagedrl_kernels.rotary_embedding import rotary_embedding

MAX_POSITIONS = 300


def hf_rope(head_dim):
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=MAX_POSITIONS,
    )
    return LlamaRotaryEmbedding(config)


def make_case(head_dim, gen, dtype=torch.float32):
    """Random q, k at random positions, the cos/sin cache of HF's rotary module, and HF's rotation of q and k
    with that module's cos and sin at those positions. The rows are taken from the one call that made the
    cache: the module's cos at a position can differ by 1e-4 between calls (measured on an AVX-512 Xeon, in
    about one fresh process in six), which is torch's cos, not the rotation under test."""
    rope = hf_rope(head_dim)
    all_positions = torch.arange(MAX_POSITIONS)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), all_positions)  # [1, max_positions, head_dim]
    cos_sin_cache = torch.cat([cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]], dim=-1)
    positions = torch.randint(0, MAX_POSITIONS, (11,), generator=gen)
    q = torch.randn(11, 6, head_dim, generator=gen).to(dtype)
    k = torch.randn(11, 2, head_dim, generator=gen).to(dtype)
    cos, sin = cos[:, positions].to(dtype), sin[:, positions].to(dtype)
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return positions, q, k, cos_sin_cache, want_q[0].transpose(0, 1), want_k[0].transpose(0, 1)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_matches_hf(kernel_backend, head_dim, gen):
    positions, q, k, cache, want_q, want_k = make_case(head_dim, gen)
    with use_backend(kernel_backend):
        out_q, out_k = rotary_embedding(positions, q, k, cache)
    torch.testing.assert_close(out_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k, want_k, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", [-1, MAX_POSITIONS])
def test_rotary_rejects_a_position_past_the_cache(position, gen):
    positions, q, k, cache, _, _ = make_case(64, gen)
    positions[3] = position
    q_before = q.clone()
    with pytest.raises((ValueError, IndexError), match="positions must lie in|out of bounds"):
        rotary_embedding(positions, q, k, cache)
    assert torch.equal(q, q_before)  # nothing rotated


def test_rotary_rejects_mismatched_cache(gen):
    positions, q, k, cache, _, _ = make_case(64, gen)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rotary_embedding(positions, q, k, cache[:, :32])


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_bf16_rotary_matches_hf(head_dim, gen):
    positions, q, k, cache, want_q, want_k = make_case(head_dim, gen, torch.bfloat16)
    out_q, out_k = rotary_embedding(positions.cuda(), q.cuda(), k.cuda(), cache.cuda())
    torch.testing.assert_close(out_q.cpu(), want_q, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out_k.cpu(), want_k, atol=3e-2, rtol=3e-2)
