"""CUDA graphs for decode-only steps: one graph per batch size of a ladder, replayed over static buffers.

At engine start every ladder size is warmed up and captured, largest first, into one shared memory pool. A
decode-only step of n sequences is padded up to the smallest captured size >= n: its tensors are copied into
the first n rows of the static buffers, the rows after them become padding, the graph replays, and the real
rows are selected from the graph's logits. Mixed prefill + decode steps, and steps larger than the largest
size, run eagerly.

A padding row is token 0 at position 0 with slot -1 (reshape_and_cache skips it, so it writes no K/V) and
context length 0 (paged decode attention gives it zeros), so it never reads or corrupts a real block. The
decode attention inside a graph sees block tables [size, max_blocks_per_seq]: the Triton launcher derives its
grid from that fixed width, never from the step's context lengths, so the captured launch fits every step.

What a graph reads is fixed at capture: the static buffers, the KV pool, the model's parameter tensors and
the LoRA buffers. Weights updated in place (`update_lora`, `param.copy_`) are seen by the next replay; a
parameter replaced by a new tensor is not. With a LoRA adapter, the graphs always apply it through a static
per-token 0/1 mask, so one capture serves steps with, without, and mixing the adapter.
"""

from __future__ import annotations

import bisect
import functools
import gc
from dataclasses import dataclass

import torch

from pagedrl_kernels.backend import get_backend
from rollout_engine.kv_pool import allocate_kv_pool
from rollout_engine.lora import LoraTokens
from rollout_engine.models import AttentionMetadata, PagedDecoder, StepInputs


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes to capture, up to max_num_seqs: 1, 2, 4, 8, then steps of 8, and max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1 to capture decode graphs, got {max_num_seqs}")
    ladder = [1, 2, 4, *range(8, max_num_seqs + 1, 8)]
    return sorted({size for size in ladder if size <= max_num_seqs} | {max_num_seqs})


def bucket_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds num_seqs decode rows, or None when none does (run eagerly)."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if num_seqs >= 1 and index < len(sizes) else None


@functools.cache
def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of every warm-up and capture on a device: libraries keep per-stream workspaces
    (cuBLAS), which one shared stream makes once instead of once per capture ladder."""
    return torch.cuda.Stream(device)


@dataclass(slots=True)
class DecodeBuffers:
    """The static inputs every decode graph reads; a graph of size s reads their first s rows."""

    input_ids: torch.Tensor  # [max_size] int64
    positions: torch.Tensor  # [max_size] int64
    slot_mapping: torch.Tensor  # [max_size] int64
    block_tables: torch.Tensor  # [max_size, max_blocks_per_seq] int32
    context_lens: torch.Tensor  # [max_size] int32
    logits_indices: torch.Tensor  # [max_size] int64, arange: every row's logits
    no_prefill_cu_seqlens: torch.Tensor  # [1] int32 zero: the empty prefill part of a decode-only step
    lora_mask: torch.Tensor | None  # [max_size, 1] in the model dtype; None without an adapter

    @property
    def nbytes(self) -> int:
        tensors = [getattr(self, name) for name in self.__slots__]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def new_decode_buffers(
    max_size: int, max_blocks_per_seq: int, lora_dtype: torch.dtype | None, device: torch.device
) -> DecodeBuffers:
    """Buffers whose every row is padding (slot -1, context length 0), so a warm-up run writes no K/V."""

    def longs(value: int) -> torch.Tensor:
        return torch.full((max_size,), value, dtype=torch.int64, device=device)

    return DecodeBuffers(
        input_ids=longs(0),
        positions=longs(0),
        slot_mapping=longs(-1),
        block_tables=torch.zeros(max_size, max_blocks_per_seq, dtype=torch.int32, device=device),
        context_lens=torch.zeros(max_size, dtype=torch.int32, device=device),
        logits_indices=torch.arange(max_size, dtype=torch.int64, device=device),
        no_prefill_cu_seqlens=torch.zeros(1, dtype=torch.int32, device=device),
        lora_mask=None if lora_dtype is None else torch.zeros(max_size, 1, dtype=lora_dtype, device=device),
    )


def is_decode_only(inputs: StepInputs) -> bool:
    """Whether every token of the step is the single new token of its own sequence."""
    num_tokens = inputs.input_ids.shape[0]
    return inputs.meta.num_prefill_tokens == 0 and inputs.meta.decode_context_lens.shape[0] == num_tokens > 0


def fill_decode_buffers(buffers: DecodeBuffers, inputs: StepInputs, size: int) -> None:
    """Copy a decode-only step of n <= size rows into rows [0, n) and make rows [n, size) padding.

    Block-table columns past the step's own width keep stale entries: attention reads only the columns
    that cover a row's context length."""
    n, width = inputs.meta.decode_block_tables.shape
    buffers.input_ids[:n].copy_(inputs.input_ids)
    buffers.positions[:n].copy_(inputs.positions)
    buffers.slot_mapping[:n].copy_(inputs.meta.slot_mapping)
    buffers.block_tables[:n, :width].copy_(inputs.meta.decode_block_tables)
    buffers.context_lens[:n].copy_(inputs.meta.decode_context_lens)
    buffers.input_ids[n:size].fill_(0)
    buffers.positions[n:size].fill_(0)
    buffers.slot_mapping[n:size].fill_(-1)
    buffers.context_lens[n:size].fill_(0)
    if buffers.lora_mask is not None:
        mask = buffers.lora_mask
        if not inputs.lora.enabled:
            mask[:n].fill_(0.0)
        elif inputs.lora.mask is None:
            mask[:n].fill_(1.0)
        else:
            mask[:n].copy_(inputs.lora.mask)
        mask[n:size].fill_(0.0)


class DecodeGraphs:
    """The captured decode graphs of one KV pool, their static buffers and outputs."""

    def __init__(
        self,
        model: PagedDecoder,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks_per_seq: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        device = kv_caches[0][0].device
        lora_dtype = kv_caches[0][0].dtype if model.adapter is not None else None
        self.buffers = new_decode_buffers(self.sizes[-1], max_blocks_per_seq, lora_dtype, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # One logits buffer for all sizes (a graph of size s writes its first s rows), so the graphs' outputs
        # do not each hold [s, vocab] of the pool.
        vocab_size = model.lm_head.weight.shape[0]
        self.logits = torch.zeros(self.sizes[-1], vocab_size, dtype=torch.float32, device=device)
        self.nbytes = 0
        self.num_replays = 0

    def forward(self, size: int) -> torch.Tensor:
        """The model over the first `size` rows of the static buffers (what a graph captures): logits
        [size, vocab] fp32."""
        b = self.buffers
        meta = AttentionMetadata(
            slot_mapping=b.slot_mapping[:size],
            num_prefill_tokens=0,
            prefill_block_tables=b.block_tables[:0],
            prefill_cu_seqlens_q=b.no_prefill_cu_seqlens,
            prefill_context_lens=b.context_lens[:0],
            prefill_max_query_len=0,
            decode_block_tables=b.block_tables[:size],
            decode_context_lens=b.context_lens[:size],
        )
        lora = LoraTokens(
            enabled=b.lora_mask is not None, mask=None if b.lora_mask is None else b.lora_mask[:size]
        )
        return self.model(
            b.input_ids[:size], b.positions[:size], meta, self.kv_caches, b.logits_indices[:size], lora
        )

    def capture(self) -> None:
        """Warm up and capture every size, largest first, into one memory pool; measures the device memory
        the graphs take (pool, graph objects and static buffers) into `nbytes`."""
        device = self.buffers.input_ids.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the KV pool is on {device}")
        if get_backend() == "torch":
            raise ValueError(
                "CUDA graphs capture the Triton kernels, but the kernel backend is forced to 'torch' (whose "
                "reference attention reads context lengths on the host); build the engine with "
                "enforce_eager=True, or set_backend('auto')"
            )
        torch.cuda.synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()  # memory cached before now must not offset what the graphs take
        free_before = torch.cuda.mem_get_info(device)[0]
        pool = torch.cuda.graph_pool_handle()
        stream = _capture_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        for size in reversed(self.sizes):
            with torch.cuda.stream(stream):
                self.forward(size)  # compiles this size's Triton kernels outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.logits[:size].copy_(self.forward(size))
            self.graphs[size] = graph
        torch.cuda.synchronize(device)
        static_bytes = self.buffers.nbytes + self.logits.numel() * self.logits.element_size()
        self.nbytes = max(free_before - torch.cuda.mem_get_info(device)[0], 0) + static_bytes

    def can_run(self, inputs: StepInputs) -> bool:
        """Whether a captured graph serves this step: decode-only and no larger than the largest size."""
        return (
            bool(self.graphs)
            and is_decode_only(inputs)
            and bucket_size(inputs.input_ids.shape[0], self.sizes) is not None
        )

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [num_rows, vocab] (fp32) of a step that `can_run`: pad it to its size and replay."""
        size = bucket_size(inputs.input_ids.shape[0], self.sizes)
        with torch.inference_mode():
            fill_decode_buffers(self.buffers, inputs, size)
            self.graphs[size].replay()
            self.num_replays += 1
            # In a decode-only step token i is row i: logits_indices repeats a row for a group's samples.
            return self.logits.index_select(0, inputs.logits_indices)


def measure_graph_bytes(
    model: PagedDecoder, block_size: int, max_num_seqs: int, max_blocks_per_seq: int
) -> int:
    """Device memory the decode graphs will take, measured by capturing the whole ladder over a throwaway KV
    pool of one max-length sequence and releasing it: the graphs' memory does not depend on the pool's
    size, and the real pool must be sized (leaving this room) before the real graphs can point into it."""
    weight = model.embed_tokens.weight
    kv_pool = allocate_kv_pool(
        model.num_layers,
        max_blocks_per_seq,
        block_size,
        model.num_kv_heads,
        model.head_dim,
        weight.dtype,
        weight.device,
    )
    graphs = DecodeGraphs(
        model, [(layer[0], layer[1]) for layer in kv_pool], max_num_seqs, max_blocks_per_seq
    )
    graphs.capture()
    nbytes = graphs.nbytes
    del graphs, kv_pool
    gc.collect()
    torch.cuda.empty_cache()
    return nbytes
