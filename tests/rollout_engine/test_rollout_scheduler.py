"""Scheduler: token budget, chunked prefill mixed with decodes, admission by free blocks, FIFO without
starvation, preemption of the newest sequence."""

import random

import pytest

from rollout_engine.block_manager import BlockManager
from rollout_engine.sampling_params import SamplingParams
from rollout_engine.scheduler import Scheduler
from rollout_engine.sequence import Sequence, SequenceStatus

_ids = iter(range(10**9))


def seq_of(tokens: list[int], n: int = 1, seq_id: int | None = None) -> Sequence:
    seq_id = next(_ids) if seq_id is None else seq_id
    rngs = [random.Random(i) for i in range(n)]
    return Sequence(seq_id, seq_id, list(tokens), len(tokens), SamplingParams(n=n), rngs)


def make_seq(num_tokens, n=1) -> Sequence:
    """A prompt of num_tokens tokens that starts unlike the other sequences' (no shared prefix)."""
    seq_id = next(_ids)
    return seq_of([(seq_id * 7 + i) % 50 for i in range(num_tokens)], n, seq_id)


def run_step(scheduler: Scheduler) -> list[tuple[int, int]]:
    """Schedule, then play the model: advance computed tokens and append a token to sampling sequences."""
    out = scheduler.schedule()
    for item in out.scheduled:
        samples = item.samples_next_token
        item.seq.num_computed_tokens += item.num_new_tokens
        scheduler.block_manager.mark_computed(item.seq)
        if samples:
            item.seq.token_ids.append(1)
    return [(item.seq.seq_id, item.num_new_tokens) for item in out.scheduled]


def test_long_prompt_is_chunked_and_mixed_with_decodes():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=8)
    a = make_seq(3)
    sched.add(a)
    assert run_step(sched) == [(a.seq_id, 3)]
    b = make_seq(20)
    sched.add(b)
    # a decodes one token per step; b's prompt fills the rest of the 8-token budget, chunk by chunk.
    assert run_step(sched) == [(a.seq_id, 1), (b.seq_id, 7)]
    assert run_step(sched) == [(a.seq_id, 1), (b.seq_id, 7)]
    assert run_step(sched) == [(a.seq_id, 1), (b.seq_id, 6)]
    assert b.num_tokens == 21  # sampled once its whole prompt was computed
    assert run_step(sched) == [(a.seq_id, 1), (b.seq_id, 1)]


def test_admission_waits_for_free_blocks_in_fifo_order():
    bm = BlockManager(6, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    big, blocked, small = make_seq(20), make_seq(12), make_seq(2)  # 5, 3 and 1 blocks
    for seq in (big, blocked, small):
        sched.add(seq)
    assert run_step(sched) == [(big.seq_id, 20)]
    # `small` would fit but must not overtake `blocked` at the head of the queue.
    assert run_step(sched) == [(big.seq_id, 1)]
    assert list(sched.waiting) == [blocked, small]
    sched.finish(big)
    assert bm.num_used_blocks == 0
    assert run_step(sched) == [(blocked.seq_id, 12), (small.seq_id, 2)]


def test_newest_sequence_is_preempted_and_requeued_first():
    bm = BlockManager(5, 2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16)
    old, new = make_seq(3), make_seq(4)
    sched.add(old)
    sched.add(new)
    assert run_step(sched) == [(old.seq_id, 3), (new.seq_id, 4)]  # 2 + 2 blocks
    assert run_step(sched) == [(old.seq_id, 1), (new.seq_id, 1)]  # new takes the last block
    assert bm.num_free_blocks == 0
    # old needs a third block: the newest sequence gives up its blocks instead of an out-of-memory.
    assert run_step(sched) == [(old.seq_id, 1)]
    assert sched.num_preemptions == 1
    assert new.status == SequenceStatus.WAITING and new.block_table == [] and new.num_computed_tokens == 0
    assert list(sched.waiting) == [new]
    assert new.num_tokens == 6  # keeps its sampled tokens: recomputed as a longer prompt, not restarted
    sched.finish(old)
    # Its two full blocks were cached when computed, so only the last two tokens are recomputed.
    assert run_step(sched) == [(new.seq_id, 2)]
    assert bm.prefix_cache_hits == 2


def test_a_lone_sequence_preempts_itself_only_when_nothing_else_is_left():
    bm = BlockManager(3, 2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16)
    seq = make_seq(5)
    sched.add(seq)
    run_step(sched)
    assert run_step(sched) == [(seq.seq_id, 1)]  # position 5 still fits block 3
    assert run_step(sched) == []  # position 6 needs a fourth block that does not exist
    assert sched.num_preemptions == 1 and list(sched.waiting) == [seq]


def test_group_samples_count_against_max_num_seqs():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=64)
    group, other = make_seq(5, n=8), make_seq(5)
    sched.add(group)
    sched.add(other)
    assert run_step(sched) == [(group.seq_id, 5)]
    assert list(sched.waiting) == [other]


def test_budget_below_max_num_seqs_is_rejected():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(BlockManager(8, 4), max_num_seqs=16, max_num_batched_tokens=8)


def test_a_prompt_waits_for_the_blocks_another_prompt_is_computing():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    shared = [5, 6, 7, 8, 9, 10, 11, 12]  # two full blocks
    a, b = seq_of(shared + [1, 2, 3]), seq_of(shared + [4, 4, 4, 4, 2])
    c = seq_of([30, 31, 32, 33, 34])  # nothing in common
    for seq in (a, b, c):
        sched.add(seq)
    # b's first block is a's: b waits, and c goes ahead of it
    assert run_step(sched) == [(a.seq_id, 11), (c.seq_id, 5)]
    assert list(sched.waiting) == [b]
    # then b takes a's two blocks from the cache and computes only its own five tokens
    assert run_step(sched) == [(a.seq_id, 1), (c.seq_id, 1), (b.seq_id, 5)]
    assert b.block_table[:2] == a.block_table[:2] and bm.prefix_cache_hits == 2


def test_prompts_of_an_old_policy_are_not_waited_for():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=3)
    leader, follower = seq_of(list(range(1, 9))), seq_of(list(range(1, 5)) + [50, 51, 52, 53, 54])
    sched.add(leader)
    assert run_step(sched) == [(leader.seq_id, 3)]  # no block complete yet
    bm.reset_prefix_cache()  # the leader's blocks will never be cached under the new policy
    sched.max_num_batched_tokens = 8
    sched.add(follower)
    # the leader finishes its prompt; the follower computes its first block itself instead of waiting
    assert run_step(sched) == [(leader.seq_id, 5), (follower.seq_id, 3)]
    assert bm.prefix_cache_hits == 0
