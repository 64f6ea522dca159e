"""Decode steps for the CUDA-graph tests: a runner with prefilled sequences, and their next decode step; and
stand-in replays that let a CPU runner take the graph path."""

import random

import torch

from rollout_engine.cuda_graphs import DecodeGraphs
from rollout_engine.lora import LoraAdapter
from rollout_engine.model_runner import ModelRunner, order_for_step
from rollout_engine.models import StepInputs, build_paged_model
from rollout_engine.sampling_params import SamplingParams
from rollout_engine.scheduler import ScheduledSeq
from rollout_engine.sequence import Sequence
from rollout_engine.sync_contract import lora_layers

BLOCK_SIZE = 4
MAX_MODEL_LEN = 64


def make_runner(model, num_blocks: int = 96) -> ModelRunner:
    """A runner over `model`'s own weights (with its LoRA adapter when it has one), on the model's device."""
    adapter = LoraAdapter(model) if lora_layers(model) else None
    paged = build_paged_model(model, MAX_MODEL_LEN, adapter)
    weight = paged.embed_tokens.weight
    return ModelRunner(paged, num_blocks, BLOCK_SIZE, weight.dtype, weight.device)


def prefilled_decode_step(
    runner: ModelRunner, lengths: list[int], uses_lora: list[bool] | None = None, seed: int = 0
) -> tuple[StepInputs, list[int]]:
    """Prefill one sequence per length (eagerly, in one step), append a random token to each, and return
    the decode step of those new tokens and the KV slots it writes. Sequence i holds the blocks
    [8 i, 8 i + 8), so lengths stay below 8 * BLOCK_SIZE and the pool keeps unused blocks after them."""
    if lengths != sorted(lengths) or min(lengths) < 2 or max(lengths) >= 8 * BLOCK_SIZE:
        raise ValueError("lengths must ascend (the decode order) and lie in [2, 8 * BLOCK_SIZE)")
    gen = torch.Generator().manual_seed(seed)
    vocab = runner.model.embed_tokens.weight.shape[0]
    uses_lora = uses_lora or [True] * len(lengths)
    seqs = []
    for i, (length, lora) in enumerate(zip(lengths, uses_lora, strict=True)):
        tokens = torch.randint(0, vocab, (length,), generator=gen).tolist()
        params = SamplingParams(lora="policy" if lora else None)
        seq = Sequence(i, i, tokens, length, params, [random.Random(0)])
        seq.block_table = list(range(8 * i, 8 * i + 8))
        seqs.append(seq)
    prefill = order_for_step([ScheduledSeq(seq, len(seq.token_ids)) for seq in seqs])
    runner.run(runner.prepare(prefill, [1] * len(prefill)))
    slots = []
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
        slots.append(seq.block_table[seq.num_tokens // BLOCK_SIZE] * BLOCK_SIZE + seq.num_tokens % BLOCK_SIZE)
        seq.token_ids.append(int(torch.randint(0, vocab, (1,), generator=gen)))
    decode = [ScheduledSeq(seq, 1) for seq in seqs]  # ascending lengths: the order_for_step order
    return runner.prepare(decode, [1] * len(decode)), slots


def eager_logits(runner: ModelRunner, inputs: StepInputs) -> torch.Tensor:
    """The paged model's own forward of a step, bypassing any graph."""
    return runner.model(
        inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches, inputs.logits_indices, inputs.lora
    )


class EagerReplay:
    """A captured graph's stand-in on the CPU: `replay` runs the forward the graph would have captured, over
    the static buffers as they are now, into the shared logits buffer. It counts its replays."""

    def __init__(self, graphs: DecodeGraphs, size: int) -> None:
        self.graphs, self.size, self.num_replays = graphs, size, 0

    def replay(self) -> None:
        self.graphs.logits[: self.size].copy_(self.graphs.forward(self.size))
        self.num_replays += 1


def install_eager_replays(runner: ModelRunner, max_num_seqs: int, max_blocks_per_seq: int) -> DecodeGraphs:
    """Give a CPU runner decode graphs whose every size replays through an EagerReplay, so its decode-only
    steps go through DecodeGraphs.run: bucketing, padding the static buffers, selecting the real rows."""
    graphs = DecodeGraphs(runner.model, runner.kv_caches, max_num_seqs, max_blocks_per_seq)
    graphs.graphs = {size: EagerReplay(graphs, size) for size in graphs.sizes}
    runner.graphs = graphs
    return graphs
