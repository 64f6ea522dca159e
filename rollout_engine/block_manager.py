"""The KV block pool: free list, reference counts, copy-on-write and the prefix cache (no torch).

Blocks hold `block_size` token slots of the preallocated KV pool. A block is free (on the free list),
used (ref count > 0), or cached-but-unreferenced (ref count 0, still reachable through the prefix
cache, evicted least-recently-freed first when the free list runs dry). A full block is keyed by a
chained hash of (previous block's hash, policy version, its tokens); bumping the policy version in
`reset_prefix_cache` makes every older block unreachable, so KV of an old policy is never reused.

The free list is a stack: the most recently freed block goes out first, and a never-used block only when no
freed one is left. A CPU KV pool commits a block's memory when it is first written (kv_pool.py), so the
blocks in memory stay the most ever held at once (by sequences and the prefix cache together).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from rollout_engine.sequence import Sequence

CopyPair = tuple[int, int]  # (src_block, dst_block) of a copy-on-write


def ceil_div(num: int, divisor: int) -> int:
    """num / divisor rounded up, in integers: e.g. the blocks that hold num tokens."""
    return -(-num // divisor)


class BlockManager:
    """Allocates KV blocks to sequences; O(1) allocate and free."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._num_shared = 0  # blocks whose count is above 1, kept as counts change (pools hold millions)
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free_block_ids = list(range(num_blocks - 1, -1, -1))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.cached_block_by_hash: dict[int, int] = {}
        self.policy_version = 0
        self.prefix_cache_hits = 0
        self.num_blocks_peak = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def num_shared_blocks(self) -> int:
        """Blocks held by more than one sequence."""
        return self._num_shared

    def num_blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    # prefix cache

    def _hash_block(self, prev_hash: int, tokens: list[int]) -> int:
        return hash((prev_hash, self.policy_version, tuple(tokens)))

    @staticmethod
    def _root_hash(seq: Sequence) -> int:
        # KV differs with and without the LoRA adapter: the chain of a base-model request starts elsewhere.
        return hash(("lora", seq.params.lora))

    def block_hashes(self, seq: Sequence, known: list[int], stop: int) -> Iterator[int]:
        """The chained hashes of seq's full blocks len(known) .. stop - 1; `known` holds those before them."""
        bs = self.block_size
        prev = known[-1] if known else self._root_hash(seq)
        for index in range(len(known), stop):
            prev = self._hash_block(prev, seq.token_ids[index * bs : (index + 1) * bs])
            yield prev

    def num_cacheable_blocks(self, seq: Sequence) -> int:
        """seq's full blocks before its last token (which always stays to compute, to sample from)."""
        return (seq.num_tokens - 1) // self.block_size

    def lookup_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached (block ids, hashes) of seq's leading full blocks; at least one token stays uncomputed."""
        block_ids: list[int] = []
        hashes: list[int] = []
        for block_hash in self.block_hashes(seq, [], self.num_cacheable_blocks(seq)):
            block_id = self.cached_block_by_hash.get(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
            hashes.append(block_hash)
        return block_ids, hashes

    def mark_computed(self, seq: Sequence) -> None:
        """Register seq's newly completed full blocks in the prefix cache."""
        start = len(seq.block_hashes)
        new = list(self.block_hashes(seq, seq.block_hashes, seq.num_computed_tokens // self.block_size))
        seq.block_hashes.extend(new)
        if seq.kv_policy_version != self.policy_version:
            return
        for index, block_hash in enumerate(new, start):
            if block_hash not in self.cached_block_by_hash:
                block_id = seq.block_table[index]
                self.cached_block_by_hash[block_hash] = block_id
                self.block_hash[block_id] = block_hash

    def reset_prefix_cache(self) -> None:
        """Make every cached block unreachable (call after each weight update)."""
        self.policy_version += 1
        self.cached_block_by_hash.clear()
        self.block_hash = [None] * self.num_blocks
        self.free_block_ids.extend(self.evictable)
        self.evictable.clear()

    # allocation

    def _take_free_block(self) -> int:
        if self.free_block_ids:
            block_id = self.free_block_ids.pop()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            del self.cached_block_by_hash[self.block_hash[block_id]]
            self.block_hash[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _ref_cached_block(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            del self.evictable[block_id]
        self._add_ref(block_id)

    def _add_ref(self, block_id: int) -> None:
        count = self.ref_counts[block_id] + 1
        self.ref_counts[block_id] = count
        self._num_shared += count == 2

    def _release_block(self, block_id: int) -> None:
        count = self.ref_counts[block_id]
        if count <= 0:
            raise RuntimeError(f"block {block_id} released while free (double free)")
        self.ref_counts[block_id] = count - 1
        self._num_shared -= count == 2
        if count > 1:
            return
        if self.block_hash[block_id] is not None:
            self.evictable[block_id] = None
        else:
            self.free_block_ids.append(block_id)

    def _track_peak(self) -> None:
        self.num_blocks_peak = max(self.num_blocks_peak, self.num_used_blocks)

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_reserved_blocks: int = 0) -> bool:
        """Whether a waiting seq can get its cached prefix plus blocks for num_new_tokens more tokens."""
        hit_ids, _ = self.lookup_prefix(seq)
        num_fresh = self.num_blocks_for(len(hit_ids) * self.block_size + num_new_tokens) - len(hit_ids)
        num_revived = sum(1 for block_id in hit_ids if self.ref_counts[block_id] == 0)
        return num_fresh + num_revived + num_reserved_blocks <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give a waiting seq its cached prefix blocks and fresh blocks; sets num_computed_tokens."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        hit_ids, hashes = self.lookup_prefix(seq)
        for block_id in hit_ids:
            self._ref_cached_block(block_id)
        self.prefix_cache_hits += len(hit_ids)
        seq.block_table = list(hit_ids)
        seq.block_hashes = hashes
        seq.num_computed_tokens = len(hit_ids) * self.block_size
        seq.kv_policy_version = self.policy_version
        total = self.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        seq.block_table.extend(self._take_free_block() for _ in range(total - len(hit_ids)))
        self._track_peak()

    def _needs_copy(self, seq: Sequence) -> bool:
        index = seq.num_computed_tokens // self.block_size
        return index < len(seq.block_table) and self.ref_counts[seq.block_table[index]] > 1

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether a running seq can get slots for num_new_tokens more tokens."""
        num_fresh = self.num_blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return max(num_fresh, 0) + int(self._needs_copy(seq)) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> list[CopyPair]:
        """Give a running seq slots for num_new_tokens more tokens; returns copy-on-write pairs."""
        copies: list[CopyPair] = []
        if self._needs_copy(seq):
            index = seq.num_computed_tokens // self.block_size
            src = seq.block_table[index]
            dst = self._take_free_block()
            self._release_block(src)
            seq.block_table[index] = dst
            copies.append((src, dst))
        total = self.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        seq.block_table.extend(self._take_free_block() for _ in range(total - len(seq.block_table)))
        self._track_peak()
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share every block of parent (reference counts go up; no KV is copied)."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.kv_policy_version = parent.kv_policy_version
        for block_id in child.block_table:
            self._add_ref(block_id)

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first so shared prefixes stay cached longest."""
        for block_id in reversed(seq.block_table):
            self._release_block(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
