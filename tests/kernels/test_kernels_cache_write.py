"""reshape_and_cache against a token-by-token write into a NaN-poisoned cache."""

import pytest
import torch

from pagedrl_kernels import use_backend
from pagedrl_kernels.reshape_and_cache import reshape_and_cache


def make_case(block_size, num_kv_heads, head_dim, gen, dtype=torch.float32):
    num_blocks, num_tokens = 6, 23
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    # key and value are strided views of one fused projection output, as the model produces them.
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, generator=gen).to(dtype)
    key, value = kv[:, 0], kv[:, 1]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:5]] = -1  # padding tokens
    return key, value, k_cache, v_cache, slots


def expected_cache(cache, new, slots):
    out = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[token]
    return out


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(1, 64), (3, 128)])
def test_writes_each_token_to_its_slot(kernel_backend, block_size, num_kv_heads, head_dim, gen):
    key, value, k_cache, v_cache, slots = make_case(block_size, num_kv_heads, head_dim, gen)
    want_k, want_v = expected_cache(k_cache, key, slots), expected_cache(v_cache, value, slots)
    with use_backend(kernel_backend):
        reshape_and_cache(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, want_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, want_v, atol=0, rtol=0, equal_nan=True)


def test_rejects_a_slot_past_the_cache(gen):
    key, value, k_cache, v_cache, slots = make_case(16, 2, 64, gen)
    slots[7] = k_cache.shape[0] * k_cache.shape[1]
    before = k_cache.clone()
    with pytest.raises((ValueError, IndexError, RuntimeError), match="past the cache|out of|index"):
        reshape_and_cache(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, before, atol=0, rtol=0, equal_nan=True)  # nothing written


def test_rejects_mismatched_cache(gen):
    key, value, k_cache, v_cache, slots = make_case(16, 2, 64, gen)
    with pytest.raises(ValueError, match="matching the cache"):
        reshape_and_cache(key[:, :1], value[:, :1], k_cache, v_cache, slots)


@pytest.mark.gpu
def test_gpu_bf16_writes_each_token_to_its_slot(gen):
    key, value, k_cache, v_cache, slots = make_case(16, 3, 128, gen, torch.bfloat16)
    want_k = expected_cache(k_cache, key, slots)
    k_cache, v_cache = k_cache.cuda(), v_cache.cuda()
    reshape_and_cache(key.cuda(), value.cuda(), k_cache, v_cache, slots.cuda())
    torch.testing.assert_close(k_cache.cpu(), want_k, atol=0, rtol=0, equal_nan=True)
