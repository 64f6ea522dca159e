"""Grouped LoRA against peft: projections that read one input (q/k/v, gate/up) share one shrink over their
stacked A when their rank and scale agree, and fall back to groups of their own when not.

Every adapter here has random non-zero A and B per projection, so a projection served another's rows of the
stacked A, or another's B or scale, would be off by O(1) against peft's own forward."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rl.sync.adapter import PROJECTIONS, lora_tensors
from rollout_engine import SamplingParams
from rollout_engine.lora import LoraAdapter, LoraTokens
from rollout_engine.models.linear import base_linear, linears
from tests.helpers.rollout_tiny_models import (
    hf_greedy,
    hf_logprobs,
    make_engine,
    make_tiny_model,
    random_prompts,
    randomize_lora,
)

# (rank_pattern, alpha_pattern) over rank 4, alpha 8; and the groups expected for (q, k, v) and (gate, up)
PATTERNS = {
    "one rank and scale": ({}, {}, [(0, 1, 2)], [(0, 1)]),
    "k of another rank": ({"k_proj": 2}, {}, [(0, 2), (1,)], [(0, 1)]),
    "up of another scale": ({}, {"up_proj": 16.0}, [(0, 1, 2)], [(0,), (1,)]),
}


def patterned_peft_model(family: str, rank_pattern: dict, alpha_pattern: dict, seed: int = 0):
    config = LoraConfig(
        r=4,
        lora_alpha=8.0,
        target_modules=list(PROJECTIONS),
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(make_tiny_model(family, seed=seed), config)
    randomize_lora(model, seed=seed + 100)
    return model.eval()


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_projections_equal_peft_forward(pattern, masked):
    rank_pattern, alpha_pattern, qkv_groups, gate_up_groups = PATTERNS[pattern]
    model = patterned_peft_model("llama", rank_pattern, alpha_pattern)
    adapter = LoraAdapter(model)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, model.config.hidden_size, generator=gen)
    mask = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0], [1.0], [0.0], [1.0]]) if masked else None
    for layer in model.get_base_model().model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for modules, expected in (
            ((attn.q_proj, attn.k_proj, attn.v_proj), qkv_groups),
            ((mlp.gate_proj, mlp.up_proj), gate_up_groups),
        ):
            groups = adapter.groups_for(modules)
            assert [g.positions for g in groups] == expected
            with torch.inference_mode():
                got = linears(x, [base_linear(m) for m in modules], groups, LoraTokens(True, mask))
            with torch.no_grad():
                for module, y in zip(modules, got, strict=True):
                    want = module(x)  # peft: base + scale * B(A(x))
                    if masked:
                        want = torch.where(mask.bool(), want, module.get_base_layer()(x))
                    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)


def test_sync_names_are_row_views_of_one_stacked_a():
    """q/k/v's lora_A buffers are consecutive rows of one tensor, still contiguous, still named for sync."""
    engine = make_engine(patterned_peft_model("llama", {}, {}))
    buffers = engine.lora_buffers()
    names = [f"model.layers.0.self_attn.{p}.lora_A" for p in ("q_proj", "k_proj", "v_proj")]
    views = [buffers[name] for name in names]
    assert all(v.is_contiguous() and v.shape == (4, 64) for v in views)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1
    row_bytes = 4 * 64 * views[0].element_size()
    assert [v.data_ptr() - views[0].data_ptr() for v in views] == [0, row_bytes, 2 * row_bytes]


@pytest.mark.parametrize("pattern", ["k of another rank", "up of another scale"])
def test_engine_with_fallback_groups_matches_peft_in_a_mixed_batch_and_after_an_update(pattern):
    rank_pattern, alpha_pattern, _, _ = PATTERNS[pattern]
    model = patterned_peft_model("qwen3", rank_pattern, alpha_pattern)
    engine = make_engine(model)
    prompts = random_prompts([6, 11, 8], seed=4)
    params = [
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[], lora=lora)
        for lora in ("policy", None, "policy")
    ]

    def check():
        for prompt, p, group in zip(prompts, params, engine.generate(prompts, params), strict=True):
            sample = group.samples[0]
            if p.lora is None:
                with model.disable_adapter():
                    assert sample.token_ids == hf_greedy(model, prompt, 8)
                continue
            assert sample.token_ids == hf_greedy(model, prompt, 8)
            expected = hf_logprobs(model, prompt, sample.token_ids, temperature=1.0)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)

    check()
    randomize_lora(model, seed=31)  # new weights reach the stacked A and the CPU copies through update_lora
    engine.update_lora(lora_tensors(model), version=1)
    check()
