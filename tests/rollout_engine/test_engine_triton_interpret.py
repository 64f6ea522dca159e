"""The whole engine through the Triton kernels, on CPU tensors under the Triton interpreter: the kernels the
GPU runs, driven by the engine as the GPU drives them, against transformers.

`pagedrl_kernels.use_backend("triton")` sends every dispatcher to its Triton launcher and turns the CPU-only
paths off (the MKL-packed projections, the C kernels, the merged LoRA pack, the C sampler), so what is left is
the CUDA path: F.linear, the Triton kernels and the torch sampler. The tests' root conftest sets
TRITON_INTERPRET=1 before triton is imported; the `interpreter` fixture skips, naming the fix, where that
could not happen. Each test also counts the launches, so a dispatcher that quietly fell back to a reference
fails it.

Logprobs against transformers' log_softmax, largest differences measured over this module: 1.2e-5 in fp32
(with the LoRA adapter; 3.0e-6 without), LOGPROB_ATOL 1e-4; 4.1e-3 in fp16 (against transformers in fp16),
FP16_LOGPROB_ATOL 2e-2. bf16, what the GPU runs, cannot be interpreted (triton 3.9's interpreter keeps bf16
as uint16 and its tl.dot multiplies those raw bits, so attention comes out as garbage): fp16 stands in for it
here, and bench/gpu_check.sh's gpu_tests run bf16 on the device. Shapes are tiny because the interpreter runs
each program of every launch in numpy, one after another.
"""

import contextlib
from collections import Counter

import pytest
import torch

import pagedrl_kernels.activation
import pagedrl_kernels.lora
import pagedrl_kernels.paged_attention
import pagedrl_kernels.reshape_and_cache
import pagedrl_kernels.rms_norm
import pagedrl_kernels.rotary_embedding
import rollout_engine.sampler
from pagedrl_kernels import use_backend
from rollout_engine import SamplingParams
from rollout_engine.memory import activation_bytes, kv_bytes_per_block
from tests.helpers.cuda_graph_cases import install_eager_replays
from tests.helpers.rollout_tiny_models import (
    hf_greedy,
    hf_logprobs,
    make_engine,
    make_tiny_model,
    peft_model,
    random_prompts,
)

LOGPROB_ATOL = 1e-4
FP16_LOGPROB_ATOL = 2e-2

# Every dispatch target of the engine's kernels, by module: what the "triton" backend must launch, and the
# reference and C paths it must not.
DISPATCH_TARGETS = {
    pagedrl_kernels.rms_norm: ("rms_norm_triton", "rms_norm_cpu", "rms_norm_torch"),
    pagedrl_kernels.activation: ("silu_and_mul_triton", "silu_and_mul_cpu", "silu_and_mul_torch"),
    pagedrl_kernels.rotary_embedding: (
        "rotary_embedding_triton",
        "rotary_embedding_cpu",
        "rotary_embedding_torch",
    ),
    pagedrl_kernels.reshape_and_cache: (
        "reshape_and_cache_triton",
        "reshape_and_cache_cpu",
        "reshape_and_cache_torch",
    ),
    pagedrl_kernels.paged_attention: (
        "paged_attention_prefill_triton",
        "paged_attention_prefill_torch",
        "paged_attention_decode_triton",
        "paged_attention_decode_cpu",
        "paged_attention_decode_torch",
    ),
    pagedrl_kernels.lora: ("lora_shrink_expand_triton", "lora_shrink_expand_cpu", "lora_shrink_expand_torch"),
    rollout_engine.sampler: ("sample_rows_cpu",),
}
BASE_LAUNCHERS = {
    "rms_norm_triton",
    "silu_and_mul_triton",
    "rotary_embedding_triton",
    "reshape_and_cache_triton",
    "paged_attention_prefill_triton",
    "paged_attention_decode_triton",
}
LORA_LAUNCHERS = BASE_LAUNCHERS | {"lora_shrink_expand_triton"}


@pytest.fixture
def launches(interpreter, monkeypatch) -> Counter:
    """The Triton backend in force for the test, and a count of the calls into each dispatch target."""
    counts = Counter()
    for module, names in DISPATCH_TARGETS.items():
        for name in names:
            target = getattr(module, name)

            def counted(*args, _target=target, _name=name, **kwargs):
                counts[_name] += 1
                return _target(*args, **kwargs)

            monkeypatch.setattr(module, name, counted)
    with use_backend("triton"):
        yield counts


def greedy(max_tokens: int, **fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=[], **fields)


def check_logprobs(model, prompt, sample, temperature: float = 0.0, atol: float = LOGPROB_ATOL) -> None:
    expected = hf_logprobs(model, prompt, sample.token_ids, temperature)
    torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_and_logprobs_equal_transformers(family, launches):
    model = make_tiny_model(family)
    prompts = random_prompts([3, 13])
    engine = make_engine(model)
    for prompt, group in zip(prompts, engine.generate(prompts, greedy(6)), strict=True):
        (sample,) = group.samples
        assert sample.token_ids == hf_greedy(model, prompt, 6)
        check_logprobs(model, prompt, sample)
    assert set(launches) == BASE_LAUNCHERS
    assert engine.stats()["num_blocks_used"] == 0


def test_half_precision_tokens_equal_transformers_in_half_precision(launches):
    model = make_tiny_model("qwen3").half()
    prompts = random_prompts([3, 13])
    engine = make_engine(model)
    assert engine.runner.kv_pool.dtype == torch.float16
    for prompt, group in zip(prompts, engine.generate(prompts, greedy(6)), strict=True):
        (sample,) = group.samples
        assert sample.token_ids == hf_greedy(model, prompt, 6)
        check_logprobs(model, prompt, sample, atol=FP16_LOGPROB_ATOL)
    assert set(launches) == BASE_LAUNCHERS


def test_a_grpo_group_shares_its_prompt_blocks_and_copies_the_last_on_write(launches):
    model = make_tiny_model("llama", seed=1)
    prompt = random_prompts([10], seed=2)[0]  # 2 full blocks of 4 tokens and a partial one
    engine = make_engine(model)
    copies = []
    copy_blocks = engine.runner.copy_blocks
    engine.runner.copy_blocks = lambda pairs: copies.extend(pairs) or copy_blocks(pairs)
    (group,) = engine.generate([prompt], greedy(4, n=3))
    expected = hf_greedy(model, prompt, 4)
    for sample in group.samples:
        assert sample.token_ids == expected
        check_logprobs(model, prompt, sample)
    assert len(copies) == 2  # the 2 forked samples each copy the partial prompt block before writing it
    assert engine.stats()["num_blocks_saved_by_sharing"] == 2 * 2
    sampled = SamplingParams(n=3, temperature=1.0, max_tokens=4, seed=5, stop_token_ids=[])
    (group,) = engine.generate([prompt], sampled)
    assert len({tuple(sample.token_ids) for sample in group.samples}) > 1
    for sample in group.samples:
        check_logprobs(model, prompt, sample, temperature=1.0)
    assert set(launches) == BASE_LAUNCHERS


def test_chunked_prefill_runs_beside_decodes(launches):
    model = make_tiny_model("qwen3", seed=3)
    prompts = random_prompts([4, 22], seed=4)
    engine = make_engine(model, max_num_seqs=8, max_num_batched_tokens=8)
    steps = []
    prepare = engine.runner.prepare

    def recorded(items, rows):
        inputs = prepare(items, rows)
        steps.append((inputs.meta.num_prefill_tokens, inputs.meta.decode_context_lens.numel()))
        return inputs

    engine.runner.prepare = recorded
    for prompt, group in zip(prompts, engine.generate(prompts, greedy(5)), strict=True):
        assert group.samples[0].token_ids == hf_greedy(model, prompt, 5)
        check_logprobs(model, prompt, group.samples[0])
    # the 22-token prompt prefills in chunks of 4, 7 and 7 while the 4-token one decodes beside them
    assert steps[:4] == [(8, 0), (7, 1), (7, 1), (4, 1)]
    assert set(launches) == BASE_LAUNCHERS


def test_preemption_under_a_small_kv_pool_keeps_the_greedy_tokens(launches):
    model = make_tiny_model("qwen2", seed=5)
    prompts = random_prompts([9, 11], seed=6)
    # 7 blocks of 4 tokens: one max_model_len=28 sequence fits, not the 4 samples of 15-17 tokens (13 blocks)
    per_block = kv_bytes_per_block(2, 4, 2, 16, torch.float32)
    budget = activation_bytes(64, 16, 64, 128, 256, torch.float32) + 7 * per_block
    engine = make_engine(model, memory_budget_bytes=budget, memory_fraction=1.0, max_model_len=28)
    assert engine.stats()["num_blocks_total"] == 7
    results = engine.generate(prompts, greedy(6, n=2))
    assert engine.stats()["num_preemptions"] > 0
    for prompt, group in zip(prompts, results, strict=True):
        expected = hf_greedy(model, prompt, 6)
        for sample in group.samples:
            assert sample.token_ids == expected
            check_logprobs(model, prompt, sample)
    assert set(launches) == BASE_LAUNCHERS
    assert engine.stats()["num_blocks_used"] == 0


def check_adapter_on_and_off(model, prompts, params, results) -> None:
    """Requests with the adapter equal peft's greedy output; those without it, the base model's."""
    for prompt, p, group in zip(prompts, params, results, strict=True):
        (sample,) = group.samples
        with model.disable_adapter() if p.lora is None else contextlib.nullcontext():
            assert sample.token_ids == hf_greedy(model, prompt, p.max_tokens)
            check_logprobs(model, prompt, sample)
    with model.disable_adapter():  # the adapter changes the output, so the test tells on and off apart
        assert hf_greedy(model, prompts[0], params[0].max_tokens) != results[0].samples[0].token_ids


def test_the_lora_adapter_on_and_off_in_one_batch(launches):
    model = peft_model("llama", "all")
    prompts = random_prompts([5, 12], seed=7)
    params = [greedy(5, lora="policy"), greedy(5, lora=None)]
    check_adapter_on_and_off(model, prompts, params, make_engine(model).generate(prompts, params))
    assert set(launches) == LORA_LAUNCHERS


def test_decode_steps_through_the_graph_path_pad_to_their_bucket(launches):
    """The graphs' bookkeeping in the engine's loop, with a stand-in replay of what a graph captures (the
    static forward over the padded buffers, through the Triton kernels): 3 sequences pad to the size-4 graph,
    2 use size 2 and the last one size 1, and the padding rows (slot -1, context 0) touch no real KV."""
    model = peft_model("qwen3", "all", seed=8)
    prompts = random_prompts([6, 3, 9], seed=9)
    params = [greedy(4, lora="policy"), greedy(3, lora=None), greedy(2, lora="policy")]
    engine = make_engine(model, max_num_seqs=4, max_model_len=32)
    graphs = install_eager_replays(engine.runner, max_num_seqs=4, max_blocks_per_seq=8)
    results = engine.generate(prompts, params)
    check_adapter_on_and_off(model, prompts, params, results)
    assert {size: graph.num_replays for size, graph in graphs.graphs.items()} == {1: 1, 2: 1, 4: 1}
    assert engine.stats()["cuda_graph_replays"] == 3 and engine.stats()["cuda_graph_sizes"] == [1, 2, 4]
    assert set(launches) == LORA_LAUNCHERS
