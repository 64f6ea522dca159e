"""Paged attention, decode and prefill: the PyTorch reference, the Triton kernel and (decode, on CPU) the C
kernel against transformers' eager attention run on each sequence's dense K/V, with the cache pages scattered
in random order and every unused cache position poisoned with NaN."""

from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from pagedrl_kernels import use_backend
from pagedrl_kernels.paged_attention import (
    paged_attention_decode,
    paged_attention_decode_cpu,
    paged_attention_decode_triton,
    paged_attention_prefill,
)
from pagedrl_kernels.paged_decode_cpu import cpu_decode_supported

NUM_KV_HEADS = 2
SHAPES = [(bs, dim, group) for bs in (16, 32) for dim in (64, 128) for group in (1, 3, 4)]


def build_cache(lens, block_size, head_dim, gen, dtype=torch.float32, device="cpu"):
    """Scatter random per-sequence K/V into a NaN-filled paged cache; block 0 is never used and
    the tables pad with 0."""
    blocks_per_seq = [-(-n // block_size) for n in lens]
    num_blocks = 2 + sum(blocks_per_seq)
    shape = (num_blocks, block_size, NUM_KV_HEADS, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks - 1, generator=gen) + 1
    tables = torch.zeros(len(lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    keys, values, used = [], [], 0
    for seq, (n, num) in enumerate(zip(lens, blocks_per_seq, strict=True)):
        ids = order[used : used + num]
        used += num
        tables[seq, :num] = ids.int()
        slots = (ids[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        keys.append(torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype))
        values.append(torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype))
        k_cache.view(-1, NUM_KV_HEADS, head_dim)[slots] = keys[-1]
        v_cache.view(-1, NUM_KV_HEADS, head_dim)[slots] = values[-1]
    lens_t = torch.tensor(lens, dtype=torch.int32)
    to = lambda t: t.to(device)
    return to(k_cache), to(v_cache), to(tables), to(lens_t), keys, values


def hf_attention(q, key, value, group, scale):
    """transformers' eager attention of queries q [n, heads, dim] sitting at the last n positions of
    key/value [L, kv, dim]."""
    n, length = q.shape[0], key.shape[0]
    query_pos = torch.arange(length - n, length)
    future = torch.arange(length)[None, :] > query_pos[:, None]
    mask = torch.zeros(n, length).masked_fill(future, float("-inf"))[None, None]
    module = SimpleNamespace(num_key_value_groups=group, training=False)
    as_bhsd = lambda t: t.float().transpose(0, 1)[None]
    out, _ = eager_attention_forward(module, as_bhsd(q), as_bhsd(key), as_bhsd(value), mask, scale)
    return out[0]  # [n, heads, dim]


def decode_expected(q, keys, values, group, scale):
    return torch.cat([hf_attention(q[s : s + 1], keys[s], values[s], group, scale) for s in range(len(keys))])


def check_backend(backend, k_cache, num_heads, request) -> None:
    """ "auto" on CPU tensors is the C kernel: it must have been built, or the test would check the reference
    twice."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    if backend == "auto":
        assert cpu_decode_supported(k_cache, num_heads), "the C decode kernel did not build (see the warning)"


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
@pytest.mark.parametrize(("block_size", "head_dim", "group"), SHAPES)
def test_decode_matches_hf_attention(backend, block_size, head_dim, group, gen, poison_allocations, request):
    lens = [1, block_size, 2 * block_size + 5, 197]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(lens, block_size, head_dim, gen)
    q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, generator=gen)
    check_backend(backend, k_cache, q.shape[1], request)
    scale = head_dim**-0.5
    with use_backend(backend):
        out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, scale)
    torch.testing.assert_close(out, decode_expected(q, keys, values, group, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_decode_split_kv_merge(num_splits, gen, interpreter, poison_allocations):
    """Splitting the context across programs and merging by log-sum-exp changes nothing."""
    lens = [1, 64, 65, 250]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(lens, 16, 64, gen)
    q = torch.randn(len(lens), NUM_KV_HEADS * 3, 64, generator=gen)
    out = paged_attention_decode_triton(
        q, k_cache, v_cache, tables, context_lens, 0.125, num_splits=num_splits
    )
    torch.testing.assert_close(out, decode_expected(q, keys, values, 3, 0.125), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_decode_empty_context_gives_zeros(backend, gen, poison_allocations, request):
    k_cache, v_cache, tables, _, keys, values = build_cache([5, 20], 16, 64, gen)
    context_lens = torch.tensor([0, 20], dtype=torch.int32)
    q = torch.randn(2, NUM_KV_HEADS, 64, generator=gen)
    check_backend(backend, k_cache, q.shape[1], request)
    with use_backend(backend):
        out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(
        out[1:], hf_attention(q[1:], keys[1], values[1], 1, 0.125), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("block_size", "head_dim", "group"),
    [(8, 16, 1), (48, 48, 7), (16, 80, 2), (16, 176, 3), (32, 256, 1), (16, 64, 64)],
)
def test_c_decode_kernel_shapes(block_size, head_dim, group, gen, poison_allocations):
    """The C kernel's other paths: blocks smaller and larger than its 16-token tile (48 splits into three),
    head sizes compiled as constants and one that is not (176), and a group of 64 query heads per KV head."""
    lens = [1, 15, 16, 17, block_size * 3 + 1, 130]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(lens, block_size, head_dim, gen)
    q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, generator=gen)
    assert cpu_decode_supported(k_cache, q.shape[1])
    out = paged_attention_decode_cpu(q, k_cache, v_cache, tables, context_lens, 0.3)
    torch.testing.assert_close(out, decode_expected(q, keys, values, group, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("block_size", "head_dim", "group"), [(16, 64, 3), (8, 16, 1), (48, 48, 7), (16, 176, 3)]
)
def test_c_decode_kernel_over_a_bf16_cache(block_size, head_dim, group, gen, poison_allocations):
    """A bf16 cache, read in place and widened to fp32: the C kernel ("auto") and the reference ("torch") both
    give HF's fp32 attention over the cached bf16 values, rounded once to bf16 (one rounding is at most 2^-9
    of the value, so 4e-3 relative); a misread value would be off by the values' own size."""
    lens = [1, 15, 17, block_size * 3 + 1, 130]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(
        lens, block_size, head_dim, gen, torch.bfloat16
    )
    q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, generator=gen).bfloat16()
    assert cpu_decode_supported(k_cache, q.shape[1])
    expected = decode_expected(q, keys, values, group, 0.3)
    for backend in ("auto", "torch"):
        with use_backend(backend):
            out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.3)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), expected, atol=1e-3, rtol=4e-3)


def build_forked_cache(prefix_lens, samples, block_size, head_dim, gen):
    """Sequences forked from prompts, as the engine lays them out: samples[i] lists, for each sample of prompt
    i, how many of the prompt's full blocks it shares and how many tokens of its own follow the prompt. The
    rest of the prompt is copied into the sample's own blocks (copy on write), so every sample reads the same
    prompt K/V. Blocks lie in random order in a NaN-filled cache; returns what build_cache returns."""
    nan = torch.full((block_size, NUM_KV_HEADS, head_dim), float("nan"))
    k_blocks, v_blocks, tables, keys, values = [nan], [nan], [], [], []

    def new_block(k, v):
        k_blocks.append(torch.cat((k, nan[len(k) :])))
        v_blocks.append(torch.cat((v, nan[len(v) :])))
        return len(k_blocks) - 1

    chunk = lambda t, start: t[start:][:block_size]  # the block of tokens from start
    for prefix_len, members in zip(prefix_lens, samples, strict=True):
        prefix_k = torch.randn(prefix_len, NUM_KV_HEADS, head_dim, generator=gen)
        prefix_v = torch.randn(prefix_len, NUM_KV_HEADS, head_dim, generator=gen)
        full = prefix_len // block_size
        prompt_blocks = [
            new_block(chunk(prefix_k, b * block_size), chunk(prefix_v, b * block_size)) for b in range(full)
        ]
        for num_shared, own in members:
            k = torch.cat((prefix_k, torch.randn(own, NUM_KV_HEADS, head_dim, generator=gen)))
            v = torch.cat((prefix_v, torch.randn(own, NUM_KV_HEADS, head_dim, generator=gen)))
            ids = prompt_blocks[:num_shared]
            starts = range(num_shared * block_size, len(k), block_size)
            ids += [new_block(chunk(k, start), chunk(v, start)) for start in starts]
            tables.append(ids)
            keys.append(k)
            values.append(v)
    shuffled = torch.randperm(len(k_blocks) - 1, generator=gen) + 1
    order = torch.cat((torch.zeros(1, dtype=torch.long), shuffled))  # block 0 stays unused
    place = torch.empty_like(order)
    place[order] = torch.arange(len(order))
    k_cache, v_cache = torch.stack(k_blocks)[order], torch.stack(v_blocks)[order]
    width = max(len(ids) for ids in tables) + 1
    padded = [[int(place[i]) for i in ids] + [0] * (width - len(ids)) for ids in tables]
    lens = torch.tensor([len(k) for k in keys], dtype=torch.int32)
    return k_cache, v_cache, torch.tensor(padded, dtype=torch.int32), lens, keys, values


@pytest.mark.parametrize("group", [1, 3, 64])
def test_c_decode_kernel_over_forked_groups(group, gen, poison_allocations):
    """GRPO groups as the engine lays them out: samples that share all of their prompt's full blocks or fewer
    (one sample copied a block), prompts shorter than a block, groups of 30 samples, and a sample that is not
    its group's neighbour."""
    prefix_lens = [40, 16, 70, 5, 33]
    samples = [
        [(2, 3), (2, 1), (1, 9), (2, 0), (2, 20)],
        [(1, 4)] * 3,
        [(4, 2)] * 30,
        [(0, 6), (0, 2)],
        [(2, 1)],
    ]
    k_cache, v_cache, tables, lens, keys, values = build_forked_cache(prefix_lens, samples, 16, 64, gen)
    order = [*range(1, len(keys)), 0]  # the first prompt's first sample runs last, apart from the others
    tables, lens = tables[order], lens[order]
    keys, values = [keys[i] for i in order], [values[i] for i in order]
    q = torch.randn(len(keys), NUM_KV_HEADS * group, 64, generator=gen)
    out = paged_attention_decode_cpu(q, k_cache, v_cache, tables, lens, 0.2)
    torch.testing.assert_close(out, decode_expected(q, keys, values, group, 0.2), atol=1e-5, rtol=1e-5)


def test_c_decode_kernel_refuses_what_it_was_not_built_for(gen):
    """A head size that is not a multiple of 16 stays on the PyTorch reference under "auto", and the C
    launcher called directly says why it cannot take it."""
    k_cache, v_cache, tables, context_lens, keys, values = build_cache([3, 40], 16, 72, gen)
    q = torch.randn(2, NUM_KV_HEADS, 72, generator=gen)
    assert not cpu_decode_supported(k_cache, q.shape[1])
    out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.2)
    torch.testing.assert_close(out, decode_expected(q, keys, values, 1, 0.2), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="head_dim a multiple of 16"):
        paged_attention_decode_cpu(q, k_cache, v_cache, tables, context_lens, 0.2)


def prefill_case(block_size, head_dim, group, gen, device="cpu", dtype=torch.float32):
    """Four chunks: a first prefill of one token, a first prefill, an extension of a cached prefix, and a long
    extension spanning several query tiles."""
    chunks = [(0, 1), (0, block_size + 3), (21, 5), (block_size * 2 + 7, 70)]  # (cached prefix, chunk length)
    lens = [prefix + n for prefix, n in chunks]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(
        lens, block_size, head_dim, gen, dtype, device
    )
    q_lens = torch.tensor([n for _, n in chunks])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).int()
    q = torch.randn(int(cu_seqlens[-1]), NUM_KV_HEADS * group, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    expected = torch.cat(
        [
            hf_attention(q[cu_seqlens[s] : cu_seqlens[s + 1]], keys[s], values[s], group, scale)
            for s in range(4)
        ]
    )
    args = (
        q.to(device),
        k_cache,
        v_cache,
        tables,
        cu_seqlens.to(device),
        context_lens,
        scale,
        max(q_lens.tolist()),
    )
    return args, expected


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("block_size", "head_dim", "group"), SHAPES)
def test_prefill_matches_hf_attention(backend, block_size, head_dim, group, gen, poison_allocations, request):
    if backend == "triton":
        request.getfixturevalue("interpreter")
    args, expected = prefill_case(block_size, head_dim, group, gen)
    with use_backend(backend):
        out = paged_attention_prefill(*args)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp16_accumulates_in_fp32(backend, gen, poison_allocations, request):
    """fp16 caches and queries (the interpreter has no bf16 dot; bf16 runs in the -m gpu tests)."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    lens = [3, 40, 150]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(lens, 16, 64, gen, torch.float16)
    q = torch.randn(len(lens), NUM_KV_HEADS * 3, 64, generator=gen).half()
    args, prefill_expected = prefill_case(32, 128, 4, gen, dtype=torch.float16)
    with use_backend(backend):
        decoded = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.125)
        prefilled = paged_attention_prefill(*args)
    assert decoded.dtype == prefilled.dtype == torch.float16
    expected = decode_expected(q, keys, values, 3, 0.125)
    torch.testing.assert_close(decoded.float(), expected, atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(prefilled.float(), prefill_expected, atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_table_entries_past_the_context_are_never_read(backend, gen, poison_allocations, request):
    """Table entries past each sequence's last block may hold ids outside the cache; padding a batch to its
    longest context must not follow them."""
    if backend == "triton":
        request.getfixturevalue("interpreter")
    args, prefill_expected = prefill_case(16, 64, 3, gen)
    lens = [3, 16, 40, 150]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(lens, 16, 64, gen)
    for tbl, seq_lens in ((tables, lens), (args[3], args[5].tolist())):
        for seq, n in enumerate(seq_lens):
            tbl[seq, -(-n // 16) :] = 10**6
    q = torch.randn(len(lens), NUM_KV_HEADS * 3, 64, generator=gen)
    with use_backend(backend):
        decoded = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.125)
        prefilled = paged_attention_prefill(*args)
    expected = decode_expected(q, keys, values, 3, 0.125)
    torch.testing.assert_close(decoded, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefilled, prefill_expected, atol=1e-5, rtol=1e-5)


def test_bad_shapes_name_the_problem(gen):
    k_cache, v_cache, tables, context_lens, _, _ = build_cache([3], 16, 64, gen)
    q = torch.randn(1, 3, 64, generator=gen)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.125)
    with pytest.raises(ValueError, match="context_lens"):
        paged_attention_decode(q[:, :2], k_cache, v_cache, tables, context_lens[:0], 0.125)


@pytest.mark.gpu
@pytest.mark.parametrize(("block_size", "head_dim", "group"), SHAPES)
def test_gpu_bf16_triton_matches_reference(block_size, head_dim, group, gen):
    cuda = torch.device("cuda")
    lens = [1, 2 * block_size + 5, 1000, 4100]
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(
        lens, block_size, head_dim, gen, torch.bfloat16, cuda
    )
    q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, generator=gen).to(cuda, torch.bfloat16)
    out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, head_dim**-0.5)
    expected = decode_expected(q.cpu(), keys, values, group, head_dim**-0.5).to(cuda)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)

    args, expected = prefill_case(block_size, head_dim, group, gen, cuda, torch.bfloat16)
    out = paged_attention_prefill(*args)
    torch.testing.assert_close(out.float(), expected.to(cuda), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_decode_replays_in_a_cuda_graph(gen):
    """The decode launcher is graph-safe: no host sync, no shape that depends on the context lengths, so a
    captured step replays correctly with new lengths and queries written into its buffers (a padding row
    with context length 0 gives zeros)."""
    cuda = torch.device("cuda")
    k_cache, v_cache, tables, context_lens, keys, values = build_cache(
        [5, 300, 40], 16, 128, gen, torch.bfloat16, cuda
    )
    q = torch.randn(3, NUM_KV_HEADS * 2, 128, generator=gen).to(cuda, torch.bfloat16)
    paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.1)  # compiles before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.1)
    new_lens = [4, 290, 0]
    context_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    q.copy_(torch.randn(q.shape, generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, paged_attention_decode(q, k_cache, v_cache, tables, context_lens, 0.1))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    expected = torch.cat(
        [hf_attention(q[s : s + 1].cpu(), keys[s][:n], values[s][:n], 2, 0.1) for s, n in [(0, 4), (1, 290)]]
    )
    torch.testing.assert_close(out[:2].float(), expected.to(cuda), atol=2e-2, rtol=2e-2)
