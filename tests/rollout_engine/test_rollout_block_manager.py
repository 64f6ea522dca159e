"""Block manager: reference counts, copy-on-write, prefix cache, LRU eviction, and invariants under
random operation sequences (hypothesis)."""

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollout_engine.block_manager import BlockManager
from rollout_engine.sampling_params import SamplingParams
from rollout_engine.sequence import Sequence

_ids = iter(range(10**9))


def make_seq(tokens, n=1) -> Sequence:
    return Sequence(
        next(_ids), 0, list(tokens), len(tokens), SamplingParams(n=n), [random.Random(i) for i in range(n)]
    )


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Allocate and 'compute' all but the last token, as a finished prefill leaves a sequence."""
    bm.allocate(seq, seq.num_tokens - len(bm.lookup_prefix(seq)[0]) * bm.block_size)
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq)


def test_group_shares_prompt_blocks_and_copies_partial_block_on_write():
    bm = BlockManager(num_blocks=20, block_size=4)
    parent = make_seq(range(10), n=3)  # blocks: [0..3] [4..7] [8, 9 | partial]
    prefill(bm, parent)
    assert bm.num_used_blocks == 3
    children = [make_seq(parent.token_ids) for _ in range(2)]
    for child in children:
        bm.fork(parent, child)
    group = [parent, *children]
    assert all(seq.block_table == parent.block_table for seq in group)
    assert [bm.ref_counts[b] for b in parent.block_table] == [3, 3, 3]
    assert bm.num_used_blocks == 3 and bm.num_shared_blocks() == 3
    # Each sample writes its first token at position 10, inside the shared partial block.
    partial = parent.block_table[2]
    copies = []
    for seq in group:
        seq.token_ids.append(100 + seq.seq_id)
        seq.num_computed_tokens = 10
        copies += bm.append(seq, 1)
    # The first two writers copy the partial block; the last one owns the original alone.
    assert [src for src, _ in copies] == [partial, partial]
    assert group[2].block_table[2] == partial and bm.ref_counts[partial] == 1
    assert len({seq.block_table[2] for seq in group}) == 3
    assert all(seq.block_table[:2] == parent.block_table[:2] for seq in group)
    assert bm.num_used_blocks == 2 + 3  # prompt_blocks + G x completion blocks
    for seq in group:
        bm.free(seq)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 20


def test_prefix_cache_hits_full_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = make_seq(range(12))
    prefill(bm, first)
    first_table = list(first.block_table)
    bm.free(first)  # its 3 full blocks stay cached (evictable), not free-listed
    assert len(bm.evictable) == 3 and bm.num_free_blocks == 10
    same = make_seq(range(12))
    hit_ids, _ = bm.lookup_prefix(same)
    assert len(hit_ids) == 2  # the last full block is recomputed so the last token yields logits
    longer = make_seq([*range(8), 50, 51, 52, 53, 54])
    bm.allocate(longer, 5)
    assert longer.num_computed_tokens == 8 and bm.prefix_cache_hits == 2
    assert longer.block_table[:2] == first_table[:2]
    assert bm.ref_counts[first_table[0]] == 1 and len(bm.evictable) == 1


def test_lru_eviction_and_policy_reset():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq([1, 2, 3]), make_seq([7, 8, 9])
    prefill(bm, a)
    prefill(bm, b)
    a_block, b_block = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)  # a's full block is released first, so it is the least recently used
    assert list(bm.evictable) == [a_block, b_block]
    c = make_seq([20, 21, 22, 23, 24])
    bm.allocate(c, 5)  # needs 3 blocks: 2 plain free ones + evicts a's block
    assert a_block in c.block_table
    assert len(bm.lookup_prefix(make_seq([1, 2, 3]))[0]) == 0
    assert len(bm.lookup_prefix(make_seq([7, 8, 9]))[0]) == 1
    bm.reset_prefix_cache()
    assert len(bm.lookup_prefix(make_seq([7, 8, 9]))[0]) == 0
    assert bm.num_free_blocks == 1 and not bm.evictable


def test_blocks_computed_under_an_old_policy_are_never_registered():
    bm = BlockManager(num_blocks=8, block_size=2)
    seq = make_seq([1, 2, 3, 4, 5])
    bm.allocate(seq, 5)
    bm.reset_prefix_cache()  # weights changed while seq was running
    seq.num_computed_tokens = 5
    bm.mark_computed(seq)
    assert not bm.cached_block_by_hash
    bm.free(seq)
    assert bm.num_free_blocks == 8 and not bm.evictable


def test_a_freed_block_is_handed_out_again_before_a_never_used_one():
    # A CPU KV pool commits memory for a block when it is first written, so reusing the most recently freed
    # block keeps the written blocks at the most ever held at once.
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b, c = make_seq([1, 2, 3]), make_seq([4, 5, 6]), make_seq([7, 8, 9])
    for seq in (a, b, c):
        bm.allocate(seq, 3)
    assert [a.block_table, b.block_table, c.block_table] == [[0], [1], [2]]
    bm.free(a)
    bm.free(c)
    d, e, f = make_seq([10]), make_seq([11]), make_seq([12])
    for seq in (d, e, f):
        bm.allocate(seq, 1)
    assert [d.block_table, e.block_table, f.block_table] == [[2], [0], [3]]


def test_double_free_is_an_error():
    bm = BlockManager(num_blocks=4, block_size=2)
    seq = make_seq([1, 2, 3])
    bm.allocate(seq, 3)
    table = list(seq.block_table)
    bm.free(seq)
    with pytest.raises(RuntimeError, match="double free"):
        bm._release_block(table[0])


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free / reset sequences keep the pool consistent."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=24, block_size=4)
        self.live: list[Sequence] = []
        self.ever_held: set[int] = set()
        self.most_held = 0  # the most blocks held at once, by sequences or the prefix cache

    @rule(length=st.integers(1, 30), vocab=st.integers(1, 3))
    def add(self, length, vocab):
        seq = make_seq([i % vocab for i in range(length)])
        num_new = length - len(self.bm.lookup_prefix(seq)[0]) * self.bm.block_size
        if self.bm.can_allocate(seq, num_new):
            self.bm.allocate(seq, num_new)
            seq.num_computed_tokens += num_new
            self.bm.mark_computed(seq)
            self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), count=st.integers(1, 6), token=st.integers(0, 2))
    def append(self, data, count, token):
        seq = data.draw(st.sampled_from(self.live))
        seq.token_ids.extend([token] * count)
        start = seq.num_computed_tokens
        if self.bm.can_append(seq, count):
            for src, dst in self.bm.append(seq, count):
                assert src != dst and self.bm.ref_counts[dst] == 1
            seq.num_computed_tokens = start + count
            self.bm.mark_computed(seq)
        else:
            del seq.token_ids[-count:]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live))
        child = make_seq(parent.token_ids)
        self.bm.fork(parent, child)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)

    @rule()
    def reset(self):
        self.bm.reset_prefix_cache()

    @invariant()
    def ref_counts_match_block_tables(self):
        expected = [0] * self.bm.num_blocks
        for seq in self.live:
            for block_id in seq.block_table:
                expected[block_id] += 1
        assert self.bm.ref_counts == expected
        assert self.bm.num_shared_blocks() == sum(count > 1 for count in expected)

    @invariant()
    def free_plus_used_is_total(self):
        free = set(self.bm.free_block_ids)
        assert len(free) == len(self.bm.free_block_ids)  # no block listed twice
        assert not free & set(self.bm.evictable)
        unreferenced = {b for b in range(self.bm.num_blocks) if self.bm.ref_counts[b] == 0}
        assert free | set(self.bm.evictable) == unreferenced
        assert self.bm.num_free_blocks + sum(c > 0 for c in self.bm.ref_counts) == self.bm.num_blocks

    @invariant()
    def blocks_ever_handed_out_are_the_first_most_held(self):
        self.ever_held.update(block_id for seq in self.live for block_id in seq.block_table)
        self.most_held = max(self.most_held, self.bm.num_used_blocks + len(self.bm.evictable))
        assert self.ever_held == set(range(self.most_held))

    @invariant()
    def cache_points_at_blocks_with_that_hash(self):
        for block_hash, block_id in self.bm.cached_block_by_hash.items():
            assert self.bm.block_hash[block_id] == block_hash
        for block_id in self.bm.evictable:
            assert self.bm.block_hash[block_id] is not None


BlockManagerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_block_manager_invariants = BlockManagerMachine.TestCase
