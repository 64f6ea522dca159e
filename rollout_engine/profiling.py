"""Measuring, on CUDA, the activations of one max-size step, so the KV pool leaves room for them."""

from __future__ import annotations

import random

import torch

from rollout_engine.block_manager import ceil_div
from rollout_engine.model_runner import ModelRunner
from rollout_engine.models import PagedDecoder
from rollout_engine.sampler import SamplingBatch, sample
from rollout_engine.sampling_params import SamplingParams
from rollout_engine.scheduler import ScheduledSeq
from rollout_engine.sequence import Sequence


def profile_activation_bytes(
    model: PagedDecoder,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    """Peak CUDA memory of a dummy step beyond its own small KV pool: max_num_batched_tokens prompt
    tokens (sequences of at most max_model_len - 1 tokens) with max_num_seqs logits rows, then sampling."""
    seq_len = min(max_num_batched_tokens, max_model_len - 1)
    lengths = [seq_len] * (max_num_batched_tokens // seq_len)
    if max_num_batched_tokens % seq_len:
        lengths.append(max_num_batched_tokens % seq_len)
    num_blocks = [ceil_div(length, block_size) for length in lengths]
    runner = ModelRunner(model, sum(num_blocks), block_size, dtype, device)
    items, first_block = [], 0
    for index, (length, count) in enumerate(zip(lengths, num_blocks, strict=True)):
        seq = Sequence(index, index, [0] * length, length, SamplingParams(), [random.Random(0)])
        seq.block_table = list(range(first_block, first_block + count))
        first_block += count
        items.append(ScheduledSeq(seq, length))
    rows = [0] * (len(items) - 1) + [max_num_seqs]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    logits = runner.run(runner.prepare(items, rows))
    rngs = [random.Random(0)] * max_num_seqs
    sample(logits, SamplingBatch([1.0] * max_num_seqs, [-1] * max_num_seqs, [1.0] * max_num_seqs, rngs))
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start
