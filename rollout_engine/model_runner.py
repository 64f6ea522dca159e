"""Turns a scheduled batch into tensors, runs the paged model and owns the KV pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from rollout_engine.block_manager import CopyPair
from rollout_engine.cuda_graphs import DecodeGraphs
from rollout_engine.kv_pool import (
    allocate_kv_pool,
    commit_blocks,
    commits_on_write,
    release_blocks,
    resident_blocks,
    resident_bytes,
)
from rollout_engine.lora import LoraTokens
from rollout_engine.models import AttentionMetadata, PagedDecoder, StepInputs
from rollout_engine.scheduler import ScheduledSeq


def _block_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max((len(table) for table in tables), default=0)
    padded = [table + [0] * (width - len(table)) for table in tables]
    return torch.tensor(padded, dtype=torch.int32, device=device).view(len(tables), width)


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


class ModelRunner:
    """Holds the KV pool ([num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], one tensor; see
    kv_pool.py)."""

    def __init__(
        self, model: PagedDecoder, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.kv_pool = allocate_kv_pool(
            model.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim, dtype, device
        )
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_pool]
        self.graphs: DecodeGraphs | None = None
        self.kv_bytes_resident_peak = 0  # the most kv_bytes_resident measured, and measured before a release
        self._commits_on_write = commits_on_write(device)
        self._committed: set[int] = set()  # blocks whose pages were committed since they were last released

    @property
    def kv_bytes_total(self) -> int:
        """Bytes reserved for the pool."""
        return self.kv_pool.numel() * self.kv_pool.element_size()

    def kv_bytes_resident(self) -> int:
        """Bytes of the pool held in memory now (on the CPU, the pages written since they were last
        released)."""
        return self._held(resident_bytes(self.kv_pool))

    def _held(self, resident: int) -> int:
        """`resident` bytes measured: the peak goes up to it."""
        self.kv_bytes_resident_peak = max(self.kv_bytes_resident_peak, resident)
        return resident

    def release_blocks(self, is_free: Callable[[int], bool]) -> None:
        """Give the memory of the free blocks back to the system (a CPU pool; see kv_pool.py). Only the free
        blocks on resident pages are released: the cost follows what was touched, not the pool's size (a
        tiny model's pool has a million blocks). The pool only grows between releases, so measuring it here
        and after each generate call records its peak."""
        resident, blocks = resident_blocks(self.kv_pool)  # one read of the page map for both
        self._held(resident)
        free = [block_id for block_id in blocks if is_free(block_id)]
        release_blocks(self.kv_pool, free)
        self._committed.difference_update(free)

    def _commit(self, block_ids: Iterable[int]) -> None:
        """Commit the memory of the blocks a step is about to write, where the pool commits on write: in a few
        system calls rather than a page fault per page."""
        if not self._commits_on_write:
            return
        new = set(block_ids) - self._committed
        if new:
            commit_blocks(self.kv_pool, new)
            self._committed |= new

    def copy_blocks(self, copies: list[CopyPair]) -> None:
        """Copy-on-write: KV rows of each src block go to its dst block, in every layer."""
        if not copies:
            return
        src, dst = zip(*copies, strict=True)
        self._commit(dst)
        src_ids = torch.tensor(src, device=self.device)
        self.kv_pool[:, :, torch.tensor(dst, device=self.device)] = self.kv_pool[:, :, src_ids]

    def prepare(self, scheduled: list[ScheduledSeq], rows_per_item: list[int]) -> StepInputs:
        """Pack chunks (prefill chunks before decodes, as `order_for_step` arranges them) into tensors.

        rows_per_item[i] is how many logits rows item i needs: 0 for a chunk that does not reach the end
        of its sequence, n for the prompt of an n-sample group (one row per sample), else 1.
        """
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        prefill_tables, cu_seqlens, prefill_lens, decode_tables, decode_lens = [], [0], [], [], []
        max_query_len = 0
        lora_counts: list[tuple[bool, int]] = []
        for item, num_rows in zip(scheduled, rows_per_item, strict=True):
            seq, start, count = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            end = start + count
            lora_counts.append((seq.params.lora is not None, count))
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[pos // bs] * bs + pos % bs for pos in range(start, end))
            logits_indices.extend([len(input_ids) - 1] * num_rows)
            if count > 1:
                prefill_tables.append(table)
                cu_seqlens.append(cu_seqlens[-1] + count)
                prefill_lens.append(end)
                max_query_len = max(max_query_len, count)
            else:
                decode_tables.append(table)
                decode_lens.append(end)
        self._commit(slot // bs for slot in slots)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            num_prefill_tokens=cu_seqlens[-1],
            prefill_block_tables=_block_tables(prefill_tables, device),
            prefill_cu_seqlens_q=_int32(cu_seqlens, device),
            prefill_context_lens=_int32(prefill_lens, device),
            prefill_max_query_len=max_query_len,
            decode_block_tables=_block_tables(decode_tables, device),
            decode_context_lens=_int32(decode_lens, device),
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            meta=meta,
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=device),
            lora=self._lora_tokens(lora_counts),
        )

    def _lora_tokens(self, counts: list[tuple[bool, int]]) -> LoraTokens:
        """(uses the adapter, number of tokens) per scheduled item -> the step's per-token adapter mask."""
        users = sum(uses for uses, _ in counts)
        if self.model.adapter is None or users == 0:
            return LoraTokens(enabled=False, mask=None)
        if users == len(counts):
            return LoraTokens(enabled=True, mask=None)
        flags = [float(uses) for uses, count in counts for _ in range(count)]
        mask = torch.tensor(flags, dtype=self.kv_pool.dtype, device=self.device)[:, None]
        return LoraTokens(enabled=True, mask=mask)

    def capture_graphs(self, max_num_seqs: int, max_blocks_per_seq: int) -> None:
        """Capture CUDA graphs for decode-only steps of up to max_num_seqs sequences (CUDA only)."""
        graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, max_blocks_per_seq)
        graphs.capture()
        self.graphs = graphs

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [num_rows, vocab] (fp32): a graph replay for a decode-only step that fits a captured size,
        else the eager forward."""
        if self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs)
        return self.model(
            inputs.input_ids,
            inputs.positions,
            inputs.meta,
            self.kv_caches,
            inputs.logits_indices,
            inputs.lora,
        )


def order_for_step(scheduled: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """Prefill chunks (more than one token) first, then single-token decodes by context length, as the
    attention expects."""
    prefills = [item for item in scheduled if item.num_new_tokens > 1]
    decodes = [item for item in scheduled if item.num_new_tokens == 1]
    return prefills + sorted(decodes, key=lambda item: item.seq.num_computed_tokens)
