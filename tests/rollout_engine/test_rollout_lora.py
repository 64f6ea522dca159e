"""LoRA inside the engine against peft: greedy tokens, logprobs, hot updates, mixed batches, bad updates."""

import pytest
import torch

import rollout_engine.models.linear as linear_module
from pagedrl_kernels.cpu_gemm import HAS_MKL_PACKING, MIN_PACKED_ROWS
from rl.sync.adapter import lora_tensors
from rl.sync.transport import InProcessSync
from rollout_engine import SamplingParams
from tests.helpers.rollout_tiny_models import (
    hf_greedy,
    hf_logprobs,
    make_engine,
    peft_model,
    random_prompts,
    randomize_lora,
)

GREEDY = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("targets", ["all", ["q_proj", "v_proj", "down_proj"]])
def test_engine_with_lora_matches_peft(family, targets):
    model = peft_model(family, targets)
    prompts = random_prompts([4, 13, 9], seed=2)
    engine = make_engine(model)
    for prompt, group in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        (sample,) = group.samples
        assert sample.token_ids == hf_greedy(model, prompt, 10)
        expected = hf_logprobs(model, prompt, sample.token_ids, temperature=1.0)
        assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
    # the adapter really changes the output: the base model greedy differs for at least one prompt
    with model.disable_adapter():
        assert any(
            hf_greedy(model, p, 10) != g.samples[0].token_ids
            for p, g in zip(prompts, engine.generate(prompts, GREEDY), strict=True)
        )


def test_sync_makes_the_engine_follow_new_weights_and_drops_stale_prefix_cache():
    model = peft_model("llama", "all")
    engine = make_engine(model)
    sync = InProcessSync(engine)
    sync.push(lora_tensors(model), version=1)
    prompt = random_prompts([14], seed=5)[0]  # 3 full blocks of 4 tokens are cached after the first call
    before = engine.generate([prompt], GREEDY)[0].samples[0].token_ids
    randomize_lora(model, seed=999)
    hits = engine.stats()["prefix_cache_hits"]
    stats = sync.push(lora_tensors(model), version=2)
    after = engine.generate([prompt], GREEDY)[0].samples[0].token_ids
    assert engine.stats()["prefix_cache_hits"] == hits  # KV computed under version 1 was not reused
    assert after == hf_greedy(model, prompt, 10) != before
    assert stats.bytes == sum(t.numel() * t.element_size() for t in lora_tensors(model).values())
    again = engine.generate([prompt], GREEDY)[0].samples[0].token_ids
    assert again == after and engine.stats()["prefix_cache_hits"] > hits  # same version: the cache serves


@pytest.mark.skipif(not HAS_MKL_PACKING, reason="this torch has no MKL: no packed, merged weights")
def test_steps_of_policy_tokens_run_merged_weights_that_follow_each_sync(monkeypatch):
    model = peft_model("llama", "all")
    engine = make_engine(model)
    sync = InProcessSync(engine)
    prompts = random_prompts([5, 12, 9, 7, 14, 6], seed=3)  # 6 sequences: every step has 6 tokens or more
    with_delta = []  # token counts of the steps that added the delta to the base products
    add_lora_delta = linear_module.add_lora_delta

    def spy(ys, x, group, mask):
        with_delta.append(x.shape[0])
        add_lora_delta(ys, x, group, mask)

    monkeypatch.setattr(linear_module, "add_lora_delta", spy)
    for version in (1, 2):
        sync.push(lora_tensors(model), version=version)
        for prompt, group in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
            (sample,) = group.samples
            assert sample.token_ids == hf_greedy(model, prompt, 10)
            expected = hf_logprobs(model, prompt, sample.token_ids, temperature=1.0)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)
        randomize_lora(model, seed=700)
    assert with_delta == []
    # a single sequence's decode is not packed: it adds the delta to the base product
    prompt = prompts[0]
    assert engine.generate([prompt], GREEDY)[0].samples[0].token_ids == hf_greedy(model, prompt, 10)
    assert with_delta and max(with_delta) < MIN_PACKED_ROWS


def test_mixed_batch_serves_base_and_policy_requests_together():
    model = peft_model("qwen3", "all")
    prompts = random_prompts([6, 11, 8, 15], seed=9)
    params = [
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[], lora=lora)
        for lora in ("policy", None, None, "policy")
    ]
    results = make_engine(model).generate(prompts, params)
    for prompt, p, group in zip(prompts, params, results, strict=True):
        if p.lora is None:
            with model.disable_adapter():
                expected = hf_greedy(model, prompt, 8)
        else:
            expected = hf_greedy(model, prompt, 8)
        assert group.samples[0].token_ids == expected


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (
            lambda named: {
                ("model.typo" + k[5:] if i == 0 else k): v for i, (k, v) in enumerate(named.items())
            },
            "does not hold",
        ),
        (lambda named: {k: (v[:, :1] if k.endswith("lora_A") else v) for k, v in named.items()}, "has shape"),
        (lambda named: {k: v.double() for k, v in named.items()}, "is torch.float64"),
    ],
)
def test_bad_update_is_rejected_and_old_weights_still_serve(corrupt, message):
    model = peft_model("llama", "all")
    engine = make_engine(model)
    prompt = random_prompts([7], seed=1)[0]
    engine.update_lora(lora_tensors(model), version=1)
    before = engine.generate([prompt], GREEDY)[0].samples[0].token_ids
    fresh = {k: torch.randn_like(v) for k, v in lora_tensors(model).items()}
    with pytest.raises(ValueError, match=message):
        engine.update_lora(corrupt(fresh), version=2)
    assert engine.generate([prompt], GREEDY)[0].samples[0].token_ids == before
    with pytest.raises(ValueError, match="above the last pushed version 1"):
        engine.update_lora(lora_tensors(model), version=1)


def test_unknown_adapter_name_is_a_clear_error():
    engine = make_engine(peft_model("llama", "all"))
    with pytest.raises(ValueError, match="lora must be 'policy' or None"):
        engine.generate([[1, 2, 3]], SamplingParams(lora="other"))
    assert engine.generate([[1, 2, 3]], GREEDY)[0].samples  # the engine still works
