"""CUDA-graph decode, the parts that need no CUDA: the size ladder, the bucket of a batch, the padding of a
step into the static buffers, and the padded static forward (what a graph captures) against the eager step."""

import random

import pytest
import torch

from rl.sync.adapter import add_lora
from rollout_engine import SamplingParams
from rollout_engine.cuda_graphs import (
    DecodeGraphs,
    bucket_size,
    capture_sizes,
    fill_decode_buffers,
    is_decode_only,
    new_decode_buffers,
)
from rollout_engine.lora import LoraTokens
from rollout_engine.memory import num_kv_blocks
from rollout_engine.models import AttentionMetadata, StepInputs
from rollout_engine.scheduler import ScheduledSeq
from rollout_engine.sequence import Sequence
from tests.helpers.cuda_graph_cases import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    eager_logits,
    make_runner,
    prefilled_decode_step,
)
from tests.helpers.rollout_tiny_models import make_engine, make_tiny_model, random_prompts

MAX_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE


def test_ladder_is_powers_of_two_to_8_then_steps_of_8_ending_at_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    with pytest.raises(ValueError, match="max_num_seqs must be at least 1"):
        capture_sizes(0)


def test_a_batch_pads_up_to_the_smallest_size_that_holds_it():
    sizes = [1, 2, 4, 8, 16, 20]
    assert [bucket_size(n, sizes) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 20)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        16,
        20,
        20,
    ]
    assert bucket_size(21, sizes) is None  # larger than the largest graph: eager
    assert bucket_size(0, sizes) is None


def hand_step(lora: LoraTokens, n: int = 3, width: int = 2) -> StepInputs:
    """A decode step of n sequences with recognisable values: tokens 10.., positions 20.., slots 30..,
    tables 1.. row-major, context lengths 21.."""
    meta = AttentionMetadata(
        slot_mapping=torch.arange(30, 30 + n),
        num_prefill_tokens=0,
        prefill_block_tables=torch.zeros(0, 0, dtype=torch.int32),
        prefill_cu_seqlens_q=torch.zeros(1, dtype=torch.int32),
        prefill_context_lens=torch.zeros(0, dtype=torch.int32),
        prefill_max_query_len=0,
        decode_block_tables=torch.arange(1, 1 + n * width, dtype=torch.int32).view(n, width),
        decode_context_lens=torch.arange(21, 21 + n, dtype=torch.int32),
    )
    return StepInputs(torch.arange(10, 10 + n), torch.arange(20, 20 + n), meta, torch.arange(n), lora)


def poisoned_buffers(max_size: int = 8, lora: bool = True):
    """Buffers left by an earlier, larger step: every row looks like a real row writing slot 0."""
    buffers = new_decode_buffers(max_size, 4, torch.float32 if lora else None, torch.device("cpu"))
    for tensor in (buffers.input_ids, buffers.positions, buffers.block_tables, buffers.context_lens):
        tensor.fill_(7)
    buffers.slot_mapping.fill_(0)
    if lora:
        buffers.lora_mask.fill_(0.5)
    return buffers


def test_padding_rows_write_no_kv_and_attend_to_nothing_real_rows_are_copied():
    buffers = poisoned_buffers()
    step = hand_step(LoraTokens(enabled=True, mask=torch.tensor([[1.0], [0.0], [1.0]])))
    fill_decode_buffers(buffers, step, 4)
    assert buffers.input_ids[:4].tolist() == [10, 11, 12, 0]
    assert buffers.positions[:4].tolist() == [20, 21, 22, 0]
    assert buffers.slot_mapping[:4].tolist() == [30, 31, 32, -1]  # -1: reshape_and_cache skips the row
    assert buffers.context_lens[:4].tolist() == [21, 22, 23, 0]  # 0: decode attention gives zeros
    assert buffers.block_tables[:3, :2].tolist() == [[1, 2], [3, 4], [5, 6]]
    assert buffers.block_tables[:3, 2:].eq(7).all()  # past a row's context: never read, left as it was
    assert buffers.lora_mask[:4, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert buffers.logits_indices.tolist() == list(range(8))
    # rows past the graph's size are not read by it and are not touched
    assert buffers.input_ids[4:].eq(7).all() and buffers.slot_mapping[4:].eq(0).all()


@pytest.mark.parametrize(
    ("lora", "expected"),
    [
        (LoraTokens(enabled=True, mask=None), [1.0, 1.0, 0.0]),
        (LoraTokens(enabled=False, mask=None), [0.0] * 3),
    ],
)
def test_the_lora_mask_buffer_says_which_real_rows_use_the_adapter(lora, expected):
    buffers = poisoned_buffers()
    fill_decode_buffers(buffers, hand_step(lora, n=2), 2 + 1)
    assert buffers.lora_mask[:3, 0].tolist() == expected


def test_without_an_adapter_there_is_no_mask_buffer():
    buffers = poisoned_buffers(lora=False)
    fill_decode_buffers(buffers, hand_step(LoraTokens(enabled=False, mask=None)), 4)
    assert buffers.lora_mask is None and buffers.slot_mapping[:4].tolist() == [30, 31, 32, -1]


def check_padded_forward_equals_eager(model, lengths, size, uses_lora=None):
    runner = make_runner(model)
    inputs, slots = prefilled_decode_step(runner, lengths, uses_lora)
    expected = eager_logits(runner, inputs)  # writes the new tokens' K/V
    kv_before = runner.kv_pool.clone()
    graphs = DecodeGraphs(runner.model, runner.kv_caches, max_num_seqs=8, max_blocks_per_seq=MAX_BLOCKS)
    buffers = graphs.buffers
    for tensor in (buffers.input_ids, buffers.positions, buffers.block_tables, buffers.slot_mapping):
        tensor.fill_(0)  # stale rows that would write and read block 0, which sequence 0 owns
    buffers.context_lens.fill_(3)
    fill_decode_buffers(buffers, inputs, size)
    logits = graphs.forward(size).index_select(0, inputs.logits_indices)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    # only the real rows' own slots were written (with the same K/V as the eager step, up to rounding)
    flat_before = kv_before.flatten(2, 3)  # [layers, 2, slots, kv_heads, head_dim]
    flat_after = runner.kv_pool.flatten(2, 3)
    others = torch.ones(flat_before.shape[2], dtype=torch.bool)
    others[slots] = False
    assert torch.equal(flat_after[:, :, others], flat_before[:, :, others])
    torch.testing.assert_close(flat_after[:, :, slots], flat_before[:, :, slots], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize(("lengths", "size"), [([3, 9, 17], 4), ([2, 5, 6, 11], 4), ([4, 7, 9, 12, 30], 8)])
def test_padded_static_forward_equals_the_eager_step(family, lengths, size):
    check_padded_forward_equals_eager(make_tiny_model(family), lengths, size)


@pytest.mark.parametrize("uses_lora", [[True, False, True], [False, False, False], [True, True, True]])
def test_padded_static_forward_with_lora_equals_the_eager_step(uses_lora):
    model = add_lora(make_tiny_model("llama"), rank=4, alpha=8.0, target_modules="all").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)  # peft starts B at zero: make the adapter change the output
    check_padded_forward_equals_eager(model, [3, 9, 17], 4, uses_lora)


def test_a_group_decode_step_repeats_its_row_in_the_selected_logits():
    runner = make_runner(make_tiny_model("llama"))
    inputs, _ = prefilled_decode_step(runner, [3, 9])
    inputs.logits_indices = torch.tensor([0, 1, 1, 1])  # sequence 1 samples three completions
    expected = eager_logits(runner, inputs)
    graphs = DecodeGraphs(runner.model, runner.kv_caches, max_num_seqs=8, max_blocks_per_seq=MAX_BLOCKS)
    fill_decode_buffers(graphs.buffers, inputs, 2)
    logits = graphs.forward(2).index_select(0, inputs.logits_indices)
    assert logits.shape == (4, runner.model.embed_tokens.weight.shape[0])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_only_decode_only_steps_are_graph_steps():
    runner = make_runner(make_tiny_model("llama"))
    decode, _ = prefilled_decode_step(runner, [3, 9])
    assert is_decode_only(decode)
    prompt = Sequence(8, 8, [1, 2, 3], 3, SamplingParams(), [random.Random(0)])
    running = Sequence(9, 9, [4, 5], 1, SamplingParams(), [random.Random(0)])
    prompt.block_table, running.block_table, running.num_computed_tokens = [90], [91], 1
    assert not is_decode_only(runner.prepare([ScheduledSeq(prompt, 3)], [1]))
    assert not is_decode_only(runner.prepare([ScheduledSeq(prompt, 3), ScheduledSeq(running, 1)], [1, 1]))
    assert is_decode_only(runner.prepare([ScheduledSeq(running, 1)], [1]))


def test_capture_refuses_a_cpu_pool_clearly():
    runner = make_runner(make_tiny_model("llama"))
    graphs = DecodeGraphs(runner.model, runner.kv_caches, max_num_seqs=4, max_blocks_per_seq=MAX_BLOCKS)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        graphs.capture()


def test_the_engine_on_cpu_runs_eagerly_and_reports_no_graphs():
    engine = make_engine(make_tiny_model("llama"))  # enforce_eager defaults to False: CPU ignores graphs
    assert engine.runner.graphs is None
    engine.generate(random_prompts([5, 9]), SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[]))
    stats = engine.stats()
    assert stats["cuda_graph_sizes"] == [] and stats["cuda_graph_bytes"] == 0
    assert stats["cuda_graph_bytes_reserved"] == 0 and stats["cuda_graph_replays"] == 0


def test_graph_memory_comes_out_of_the_kv_budget():
    # 1000 blocks of 100 bytes fit after 5000 bytes of activations and 3000 of graphs (99 bytes left over)
    assert num_kv_blocks(1000 * 100 + 5000 + 3000 + 99, 5000, 100, 64, 4, graph_bytes=3000) == 1000
    assert num_kv_blocks(1000 * 100 + 5000 + 3000 + 99, 5000, 100, 64, 4) == 1030
    with pytest.raises(ValueError, match=r"MiB of CUDA graphs.*enforce_eager=True"):
        num_kv_blocks(5000 + 3000 + 15 * 100, 5000, 100, 64, 4, graph_bytes=3000)
