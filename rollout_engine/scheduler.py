"""Continuous batching with a token budget, chunked prefill and preemption by recompute (no torch)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollout_engine.block_manager import BlockManager, CopyPair
from rollout_engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples_next_token(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so the next token gets sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work: token chunks in running order and the KV block copies to do first."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[CopyPair] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)


class Scheduler:
    """Picks each step's token chunks.

    Running sequences go first, oldest first, each taking min(uncomputed tokens, budget left): decodes
    take one token, prompts are chunked. When a running sequence cannot get a block, the newest running
    sequence is preempted (blocks freed, requeued at the front of the waiting queue to be recomputed).
    Waiting sequences are admitted in FIFO order while blocks, the budget and max_num_seqs allow. A waiting
    sequence whose next uncached block is one a running prompt is about to compute (the same tokens after
    the same prefix: prompts of one system prompt or schema) waits for it instead of computing it again,
    and takes it from the prefix cache once computed, a step or a few later; the sequences behind it go
    ahead meanwhile.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}) "
                "so that every running sequence can decode in one step; raise it or lower max_num_seqs"
            )
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def num_running_samples(self) -> int:
        return sum(seq.num_samples_at_next_token for seq in self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if out.num_preempted == 0:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_append(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.num_preempted += 1
                if victim is seq:
                    return budget
            out.copies.extend(self.block_manager.append(seq, num_new))
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            index += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if not self.waiting:
            return
        bm = self.block_manager
        num_samples = self.num_running_samples()
        in_flight = self._blocks_in_flight()
        deferred: list[Sequence] = []
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if num_samples + seq.num_samples_at_next_token > self.max_num_seqs:
                break
            hit_ids, hashes = bm.lookup_prefix(seq)
            if next(bm.block_hashes(seq, hashes, bm.num_cacheable_blocks(seq)), None) in in_flight:
                deferred.append(self.waiting.popleft())
                continue
            num_new = min(seq.num_tokens - len(hit_ids) * bm.block_size, budget)
            # Keep one free block per running sequence so admission does not force an immediate preemption.
            if not bm.can_allocate(seq, num_new, num_reserved_blocks=len(self.running)):
                break
            self.waiting.popleft()
            bm.allocate(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            num_samples += seq.num_samples_at_next_token
            budget -= num_new
            in_flight.update(bm.block_hashes(seq, hashes, bm.num_cacheable_blocks(seq)))
        self.waiting.extendleft(reversed(deferred))

    def _blocks_in_flight(self) -> set[int]:
        """Hashes of the full blocks that running prompts have yet to compute and will then cache."""
        bm = self.block_manager
        return {
            block_hash
            for seq in self.running
            if seq.num_uncomputed_tokens > 1 and seq.kv_policy_version == bm.policy_version
            for block_hash in bm.block_hashes(seq, seq.block_hashes, bm.num_cacheable_blocks(seq))
        }

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Remove a finished sequence and free its blocks at once."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, request_id: int) -> None:
        """Drop every sequence of a request, running or waiting, freeing the blocks of the running ones."""
        for seq in [seq for seq in self.running if seq.request_id == request_id]:
            self.finish(seq)
        self.waiting = deque(seq for seq in self.waiting if seq.request_id != request_id)

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Run children right after parent, sharing all of parent's blocks."""
        index = self.running.index(parent)
        for child in children:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
        self.running[index + 1 : index + 1] = children
