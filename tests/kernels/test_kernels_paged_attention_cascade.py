"""CPU cascade decode attention: groups of sequences sharing their first cache blocks (a GRPO group's prompt)
attend to the shared prefix together and to their own suffixes apart. Checked against transformers' eager
attention on each sequence's dense K/V, with every unused cache position poisoned with NaN."""

from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from kernels.paged_attention_cascade import cascade_plan, paged_attention_decode_cascade

BLOCK_SIZE = 16
NUM_KV_HEADS = 2
HEAD_DIM = 64


class PagedGroups:
    """A NaN-filled paged cache holding groups of sequences: each group's prompt blocks are written once and
    shared by every member's table, each member continues in blocks of its own."""

    def __init__(self, gen: torch.Generator, num_blocks: int = 128) -> None:
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.full(shape, float("nan"))
        self.v_cache = torch.full(shape, float("nan"))
        self.free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays unused
        self.gen = gen
        self.tables: list[list[int]] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def _write(self, blocks: list[int], keys: torch.Tensor, values: torch.Tensor, first: int) -> None:
        for position in range(first, keys.shape[0]):
            block, offset = blocks[position // BLOCK_SIZE], position % BLOCK_SIZE
            self.k_cache[block, offset] = keys[position]
            self.v_cache[block, offset] = values[position]

    def add_group(
        self,
        prompt_blocks: list[int],
        prompt_len: int,
        member_lens: list[int],
        known: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Members share `prompt_blocks` (the full blocks of a prompt_len-token prompt) and the prompt's K/V,
        whose first positions are `known` (K, V) when given; returns the prompt's K/V."""
        size = (prompt_len, NUM_KV_HEADS, HEAD_DIM)
        prompt_k, prompt_v = torch.randn(size, generator=self.gen), torch.randn(size, generator=self.gen)
        if known is not None:
            prompt_k[: known[0].shape[0]], prompt_v[: known[1].shape[0]] = known
        shared_len = len(prompt_blocks) * BLOCK_SIZE
        self._write(prompt_blocks, prompt_k[:shared_len], prompt_v[:shared_len], 0)
        for length in member_lens:
            own = [self.free.pop() for _ in range(-(-length // BLOCK_SIZE) - len(prompt_blocks))]
            blocks = prompt_blocks + own
            extra = length - prompt_len
            keys = torch.cat((prompt_k, torch.randn(extra, NUM_KV_HEADS, HEAD_DIM, generator=self.gen)))
            values = torch.cat((prompt_v, torch.randn(extra, NUM_KV_HEADS, HEAD_DIM, generator=self.gen)))
            self._write(blocks, keys, values, shared_len)
            self.tables.append(blocks)
            self.keys.append(keys)
            self.values.append(values)
        return prompt_k, prompt_v

    def new_prompt_blocks(self, prompt_len: int) -> list[int]:
        return [self.free.pop() for _ in range(prompt_len // BLOCK_SIZE)]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables (entries past a sequence's blocks point outside the cache) and context lengths."""
        width = max(len(table) for table in self.tables)
        tables = torch.tensor([t + [10**6] * (width - len(t)) for t in self.tables], dtype=torch.int32)
        return tables, torch.tensor([k.shape[0] for k in self.keys], dtype=torch.int32)


def hf_decode(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """transformers' eager attention of one query token q [heads, dim] over key/value [L, kv, dim]."""
    module = SimpleNamespace(num_key_value_groups=q.shape[0] // NUM_KV_HEADS, training=False)
    as_bhsd = lambda t: t.transpose(0, 1)[None]  # noqa: E731
    out, _ = eager_attention_forward(module, q[None, :, None], as_bhsd(key), as_bhsd(value), None, scale)
    return out[0, 0]  # [heads, dim]


def grpo_batch(gen: torch.Generator) -> PagedGroups:
    """Groups of 1, 2, 5 and 8 samples; prompts shorter than a block, ending exactly on a block boundary (the
    last prompt block must stay in each member's suffix), and two requests sharing only a first
    (system prompt) block through the prefix cache."""
    cache = PagedGroups(gen)
    for prompt_len, member_lens in [
        (40, [41]),
        (7, [9, 30]),
        (32, [32, 33, 47, 70, 90]),
        (53, [54, 54, 60, 61, 64, 65, 100, 120]),
    ]:
        cache.add_group(cache.new_prompt_blocks(prompt_len), prompt_len, member_lens)
    system, known = cache.new_prompt_blocks(BLOCK_SIZE), None
    for rest_len in (20, 35):
        prompt_len = BLOCK_SIZE + rest_len
        blocks = system + cache.new_prompt_blocks(rest_len)
        prompt_k, prompt_v = cache.add_group(blocks, prompt_len, [prompt_len + 3, prompt_len + 18], known)
        known = prompt_k[:BLOCK_SIZE], prompt_v[:BLOCK_SIZE]
    return cache


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_cascade_matches_hf_attention(num_splits, gen):
    cache = grpo_batch(gen)
    tables, context_lens = cache.tensors()
    order = context_lens.argsort()  # the engine passes decodes sorted by context length
    tables, context_lens = tables[order], context_lens[order]
    num_seqs = tables.shape[0]
    q = torch.randn(num_seqs, NUM_KV_HEADS * 3, HEAD_DIM, generator=gen)
    bounds = [num_seqs * i // num_splits for i in range(num_splits + 1)]
    plan = cascade_plan(tables, context_lens, bounds, BLOCK_SIZE, NUM_KV_HEADS)
    out = paged_attention_decode_cascade(q, cache.k_cache, cache.v_cache, plan, 0.125)
    expected = torch.stack(
        [hf_decode(q[row], cache.keys[seq], cache.values[seq], 0.125) for row, seq in enumerate(order)]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # Every sequence but the lone sample and the two whose 7-token prompt fills no block shares a prefix.
    assert plan.prefixes is not None and plan.prefixes.members.numel() == num_seqs - 3


def test_plan_shares_only_full_blocks_before_each_members_last_token():
    """Rows 0, 1 and 3 start with block 1, row 2 does not. Rows 0 and 1 also share block 2, but row 3 has
    20 tokens: its last token sits in its second block, so the group shares one block (16 tokens)."""
    tables = torch.tensor([[1, 2, 3], [1, 2, 4], [5, 6, 0], [1, 7, 0]], dtype=torch.int32)
    plan = cascade_plan(tables, torch.tensor([40, 40, 20, 20]), [0, 4], BLOCK_SIZE, NUM_KV_HEADS)
    assert plan.prefixes.members.tolist() == [0, 1, 3]
    assert plan.prefixes.gather.max_len == 16
    assert plan.suffixes[0].max_len == 24  # rows 0 and 1 keep 40 - 16 tokens of their own; row 2 all 20


@pytest.mark.parametrize(("lens", "shared"), [([40, 33], 32), ([40, 32], 16), ([16, 40], None)])
def test_plan_prefix_length_by_hand(lens, shared):
    """Two samples with tables [1, 2, 3] and [1, 2, 4]: a member whose context ends on a block boundary keeps
    that last block in its suffix, and one with a single block shares nothing."""
    tables = torch.tensor([[1, 2, 3], [1, 2, 4]], dtype=torch.int32)
    plan = cascade_plan(tables, torch.tensor(lens), [0, 2], BLOCK_SIZE, NUM_KV_HEADS)
    if shared is None:
        assert plan.prefixes is None
    else:
        assert plan.prefixes.gather.max_len == shared
        assert plan.suffixes[0].max_len == max(lens) - shared


def test_empty_context_gives_zeros_next_to_a_group(gen):
    cache = grpo_batch(gen)
    tables, context_lens = cache.tensors()
    context_lens[0] = 0
    q = torch.randn(tables.shape[0], NUM_KV_HEADS, HEAD_DIM, generator=gen)
    plan = cascade_plan(tables, context_lens, [0, 1, tables.shape[0]], BLOCK_SIZE, NUM_KV_HEADS)
    out = paged_attention_decode_cascade(q, cache.k_cache, cache.v_cache, plan, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    expected = hf_decode(q[5], cache.keys[5], cache.values[5], 0.125)
    torch.testing.assert_close(out[5], expected, atol=1e-5, rtol=1e-5)
