"""The engine against transformers on tiny random Llama / Qwen2 / Qwen3 models (fp32): greedy tokens,
sampled-token logprobs, shared weights, peft wrapping, seeds, and bad input."""

import gc
import re

import pytest
import torch
from transformers import GPT2Config

import rollout_engine.step_sampling as step_sampling
from pagedrl_kernels import cpu_gemm
from pagedrl_kernels.cpu_gemm import HAS_MKL_PACKING
from rollout_engine import LLMEngine, SamplingParams
from rollout_engine.sampling_params import MIN_TEMPERATURE
from tests.helpers.rollout_tiny_models import (
    hf_greedy,
    hf_logprobs,
    make_engine,
    make_tiny_model,
    random_prompts,
)
from tests.helpers.tiny_models import tiny_config, tiny_model

FAMILIES = ["llama", "qwen2", "qwen3"]
LENGTHS = [3, 11, 17, 6, 30]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return make_tiny_model(request.param)


@pytest.fixture(scope="module")
def llama():
    return make_tiny_model("llama", seed=1)


def test_greedy_equals_hf_generate_on_mixed_length_batch(family_model):
    prompts = random_prompts(LENGTHS)
    engine = make_engine(family_model)
    results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[]))
    for prompt, group in zip(prompts, results, strict=True):
        (sample,) = group.samples
        assert sample.token_ids == hf_greedy(family_model, prompt, 12)
        assert sample.finish_reason == "length"
    assert engine.stats()["num_blocks_used"] == 0


def test_stop_token_ends_a_completion_like_hf_eos(llama):
    prompt = random_prompts([9], seed=3)[0]
    free_run = hf_greedy(llama, prompt, 10)
    stop = free_run[4]
    expected = hf_greedy(llama, prompt, 10, eos_token_id=stop)
    (group,) = make_engine(llama).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop])
    )
    assert group.samples[0].token_ids == expected == free_run[: free_run.index(stop) + 1]
    assert group.samples[0].finish_reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_sampled_logprobs_equal_hf_log_softmax(family_model, temperature):
    prompts = random_prompts([5, 13], seed=4)
    params = SamplingParams(
        n=3, temperature=temperature, top_k=20, top_p=0.9, max_tokens=8, seed=7, stop_token_ids=[]
    )
    for prompt, group in zip(prompts, make_engine(family_model).generate(prompts, params), strict=True):
        for sample in group.samples:
            expected = hf_logprobs(family_model, prompt, sample.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


def test_engine_reads_the_hf_weights_in_place(llama):
    prompt = random_prompts([8], seed=5)[0]
    engine = make_engine(llama)
    greedy = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[])
    before = engine.generate([prompt], greedy)[0].samples[0].token_ids
    weight = llama.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(-3.0)
        engine.reset_prefix_cache()
        after = engine.generate([prompt], greedy)[0].samples[0].token_ids
        assert after == hf_greedy(llama, prompt, 8)
        assert after != before
    finally:
        with torch.no_grad():
            weight.copy_(saved)


@pytest.fixture
def collector_held_off():
    """Collects earlier tests' dead models first, then holds the garbage collector off: the process-wide
    packed bytes then move only by this test's packs, not by those of a same-sized model freed mid-test."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.skipif(
    not HAS_MKL_PACKING, reason="this torch has no MKL: the CPU projections are plain F.linear"
)
@pytest.mark.usefixtures("collector_held_off")
def test_engine_packs_each_cpu_weight_once_in_one_stack_per_input():
    model = make_tiny_model("llama", seed=2)
    projections = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    engine = make_engine(model)
    before = engine.stats()["packed_weight_bytes"]
    packs_before = set(cpu_gemm._packs)
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    prompts = random_prompts([6, 9, 5, 7], seed=9)
    first = [group.samples[0].token_ids for group in engine.generate(prompts, greedy)]
    packed = engine.stats()["packed_weight_bytes"] - before
    assert packed == sum(weight.nbytes for weight in projections.values())
    assert engine.stats()["packed_weight_bytes_reserved"] == packed  # the KV budget left room for them
    # per layer one pack of q/k/v, one of gate/up, one each of o and down; one of the LM head
    new_packs = [key for key in cpu_gemm._packs if key not in packs_before]
    stack_sizes = sorted(len(key) // 2 for key in new_packs)
    num_layers = model.config.num_hidden_layers
    assert stack_sizes == [1] * (2 * num_layers + 1) + [2] * num_layers + [3] * num_layers
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for stack in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
            assert tuple(i for m in stack for i in (id(m.weight), 0)) in cpu_gemm._packs
    again = [group.samples[0].token_ids for group in engine.generate(prompts, greedy)]
    assert again == first and engine.stats()["packed_weight_bytes"] - before == packed  # the same packs


def test_peft_wrapped_model_uses_the_base_weights(llama):
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(
        make_tiny_model("llama", seed=1),
        peft.LoraConfig(
            r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        ),
    )
    prompts = random_prompts([7, 12], seed=6)
    results = make_engine(wrapped).generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[])
    )
    for prompt, group in zip(prompts, results, strict=True):
        assert group.samples[0].token_ids == hf_greedy(llama, prompt, 8)


def test_same_seed_same_samples_regardless_of_batch(llama):
    prompts = random_prompts([6, 15, 9], seed=8)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=10, seed=123, stop_token_ids=[])
    alone = make_engine(llama).generate([prompts[1]], params)[0]
    batched = make_engine(llama, max_num_batched_tokens=16).generate(prompts, params)[1]
    assert [s.token_ids for s in alone.samples] == [s.token_ids for s in batched.samples]
    other_seed = make_engine(llama).generate(
        [prompts[1]], SamplingParams(**{**_fields(params), "seed": 124})
    )[0]
    assert [s.token_ids for s in other_seed.samples] != [s.token_ids for s in alone.samples]
    assert len({tuple(s.token_ids) for s in alone.samples}) > 1  # the 4 samples of a group differ


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in SamplingParams.__slots__}


def _changed_after_construction(**changes) -> SamplingParams:
    """SamplingParams made valid and then edited, which the engine must check again when it is handed them."""
    params = SamplingParams(temperature=0, max_tokens=4)
    for name, value in changes.items():
        setattr(params, name, value)
    return params


@pytest.mark.parametrize(
    "prompts, params, match",
    [
        ([[]], SamplingParams(), "empty prompt"),
        ([list(range(128))], SamplingParams(), "max_model_len"),
        ([[1, 2, 999]], SamplingParams(), "vocabulary"),
        ([1, 2, 3], SamplingParams(), "list of prompts"),
        ([[1, 2]], SamplingParams(stop=["x"]), "tokenizer"),
        ([[1, 2]], SamplingParams(n=17), "max_num_seqs"),
        ([[True, 2]], SamplingParams(), "list of token ids .*holding True"),
        ([torch.tensor([1, 2])], SamplingParams(), r"got a Tensor.*\.tolist\(\)"),
        (torch.tensor([[1, 2]]), SamplingParams(), r"list of prompts.*got a Tensor.*\.tolist\(\)"),
        ("a prompt", SamplingParams(), "list of prompts.*got a str.*tokenize text first"),
        ([[1, 2]], {"temperature": 0}, "must be a SamplingParams"),
        ([[1, 2]], _changed_after_construction(temperature=float("nan")), "temperature"),
        ([[1, 2]], _changed_after_construction(max_tokens=2.5), "max_tokens"),
    ],
)
def test_bad_input_is_rejected_and_the_engine_keeps_working(llama, prompts, params, match):
    engine = make_engine(llama)
    # A bad prompt comes after a good one, which must not be left queued.
    batch = (
        [[5, 6, 7], *prompts] if isinstance(prompts, list) and not isinstance(prompts[0], int) else prompts
    )
    with pytest.raises(ValueError, match=match):
        engine.generate(batch, params)
    assert not engine.has_unfinished() and engine.stats()["num_blocks_used"] == 0
    (group,) = engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[]))
    assert group.samples[0].token_ids == hf_greedy(llama, [5, 6, 7], 4)


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 0),
        ("n", True),  # a bool is not a count, though Python calls it an int
        ("n", 2.0),
        ("temperature", -1.0),
        ("temperature", float("nan")),  # used to crash the sampler with an IndexError
        ("temperature", float("inf")),
        ("temperature", 1e-40),  # logits / T overflow to inf, and the softmax to NaN
        ("temperature", "hot"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("top_p", "0.9"),
        ("top_k", 0),
        ("top_k", -2),
        ("top_k", 2.0),
        ("max_tokens", 0),
        ("max_tokens", 2.5),  # used to be accepted, and made 3 tokens
        ("max_tokens", True),
        ("seed", "abc"),
        ("seed", 1.5),
        ("stop_token_ids", 5),
        ("stop_token_ids", [2, "3"]),
        ("stop", "</sql>"),
        ("stop", [""]),  # the empty string is in every text: it used to end every completion at one token
        ("stop", ["</sql>", 3]),
        ("lora", "other"),
        ("top_logprobs", -1),
        ("top_logprobs", 21),
        ("top_logprobs", True),
    ],
)
def test_bad_sampling_params_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be .*got {re.escape(repr(value))}"):
        SamplingParams(**{field: value})


def test_sampling_params_at_the_edges_of_their_ranges_are_accepted():
    SamplingParams(n=1, temperature=0, top_p=1, top_k=-1, max_tokens=1, seed=-3, stop_token_ids=[], stop=None)
    SamplingParams(temperature=MIN_TEMPERATURE, top_p=1e-9, top_k=1, seed=0, stop_token_ids=(2,), stop=("x",))
    SamplingParams(temperature=2, lora=None)


@pytest.mark.parametrize("error", [RuntimeError("a kernel failed"), KeyboardInterrupt()])
def test_a_step_that_raises_leaves_the_engine_serving(llama, monkeypatch, error):
    engine = make_engine(llama)
    real_sample, calls = step_sampling.sample, []

    def sample_failing_on_the_third_step(logits, batch):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return real_sample(logits, batch)

    monkeypatch.setattr(step_sampling, "sample", sample_failing_on_the_third_step)
    prompts = random_prompts([5, 9, 20], seed=9)
    with pytest.raises(type(error)):
        engine.generate(prompts, SamplingParams(n=3, max_tokens=6, seed=0, stop_token_ids=[]))
    assert not engine.has_unfinished() and engine.stats()["num_blocks_used"] == 0
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    for prompt, group in zip(prompts, engine.generate(prompts, greedy), strict=True):
        assert group.samples[0].token_ids == hf_greedy(llama, prompt, 6)


def test_a_failed_step_aborts_only_the_requests_it_was_running(llama, monkeypatch):
    engine = make_engine(llama, max_num_seqs=1)  # one sequence runs at a time: the second request waits
    greedy = SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[])
    first, second = random_prompts([6, 10], seed=10)
    engine.add_request(first, greedy)
    waiting_id = engine.add_request(second, greedy)

    def failing_sample(logits, batch):
        raise RuntimeError("a kernel failed")

    with monkeypatch.context() as patch:
        patch.setattr(step_sampling, "sample", failing_sample)
        with pytest.raises(RuntimeError, match="a kernel failed"):
            engine.step()
    finished = []
    while engine.has_unfinished():
        finished.extend(engine.step().finished)
    assert [group.request_id for group in finished] == [waiting_id]
    assert finished[0].samples[0].token_ids == hf_greedy(llama, second, 5)
    assert engine.stats()["num_blocks_used"] == 0


def test_unsupported_architecture_is_rejected():
    gpt2 = tiny_model(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64), seed=None)
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        LLMEngine(gpt2, None, memory_budget_bytes=2**26)


def test_sliding_window_attention_is_rejected():
    config = tiny_config(
        "qwen2",
        vocab_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=16,
    )
    with pytest.raises(ValueError, match="use_sliding_window=True is not supported"):
        LLMEngine(tiny_model(config, seed=None), None, memory_budget_bytes=2**26)


def test_budget_too_small_for_one_sequence_fails_at_start_up(llama):
    with pytest.raises(ValueError, match="raise memory_fraction or memory_budget_bytes"):
        make_engine(llama, memory_budget_bytes=2**16)


def test_abort_request_frees_a_running_group_and_the_other_requests_finish(llama):
    engine = make_engine(llama)
    first, second = random_prompts([9, 5], seed=11)
    aborted = engine.add_request(first, SamplingParams(n=3, max_tokens=8, seed=0, stop_token_ids=[]))
    kept = engine.add_request(second, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[]))
    engine.step()  # both prompts prefill; the first forks into 3 samples sharing its blocks
    engine.step()
    engine.abort_request(aborted)
    finished = []
    while engine.has_unfinished():
        finished.extend(engine.step().finished)
    assert [group.request_id for group in finished] == [kept]
    assert finished[0].samples[0].token_ids == hf_greedy(llama, second, 8)
    assert engine.stats()["num_blocks_used"] == 0
