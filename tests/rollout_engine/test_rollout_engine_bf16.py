"""The engine in bf16 against transformers in bf16, on tiny random Llama / Qwen2 / Qwen3 models with a peft
LoRA adapter (fp32, as peft keeps a bf16 model's adapter): sampled-token logprobs and greedy tokens, with the
adapter and without, through either bf16 product (pagedrl_kernels/cpu_gemm.py). bf16 rounds every projection
and the logits themselves (one bf16 step of a logit near 20 is 0.125), so the two agree to what bf16 allows,
not bit for bit: the bounds below sit above the values measured on these models and far below what a lost
adapter gives (the fp32 engine keeps its 1e-4 parity in test_rollout_engine_vs_hf.py and
test_rollout_lora.py)."""

import contextlib
import dataclasses

import pytest
import torch

from pagedrl_kernels.cpu_gemm import set_bf16_gemm
from rl.sync.adapter import add_lora
from rollout_engine import SamplingParams
from tests.helpers.rollout_tiny_models import hf_logprobs, make_engine, make_tiny_model, random_prompts

# Measured (4 prompts x 4 samples x 16 tokens at T=1), mean / max |engine - transformers| logprob: adapter
# on 0.030 / 0.176 (llama), 0.032 / 0.244 (qwen2), 0.024 / 0.096 (qwen3); adapter off 0.024 / 0.118,
# 0.026 / 0.130, 0.018 / 0.086; MKL's product on llama the same. transformers' own bf16 logprobs lie as far
# from its fp32 ones (mean 0.018-0.030, max 0.08-0.23). Sampling without the adapter, scored with it: mean
# 0.54-0.70.
MAX_MEAN_DIFF, MAX_DIFF = 0.05, 0.4
# Measured greedy agreement with transformers' argmax on the engine's own prefix: 77-79 of 80 tokens; where
# they differ, transformers' logit of the engine's token lies 0.0-0.19 below its best (1.5 bf16 steps).
MIN_GREEDY_AGREEMENT, MAX_GREEDY_GAP = 0.9, 0.25
PROMPTS = random_prompts([5, 13, 21, 8], seed=4)
SAMPLED = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=7, stop_token_ids=[])
GREEDY = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[])


def bf16_peft_model(family: str) -> torch.nn.Module:
    """The tiny model in bf16 with an fp32 LoRA adapter on every projection, B drawn so that it matters."""
    model = add_lora(make_tiny_model(family).to(torch.bfloat16), rank=8, alpha=16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    return model.eval()


def logprob_differences(engine, model, params: SamplingParams) -> torch.Tensor:
    diffs = []
    for prompt, group in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        for sample in group.samples:
            expected = hf_logprobs(model, prompt, sample.token_ids, params.temperature)
            diffs.append((torch.tensor(sample.logprobs) - expected).abs())
    return torch.cat(diffs)


def greedy_gaps(engine, model, prompts) -> torch.Tensor:
    """For each greedy token of the engine, how far transformers' logit of it lies below transformers' best
    logit on the same prefix (0 where they agree)."""
    gaps = []
    for prompt, group in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        tokens = group.samples[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
        gaps.append(logits.max(-1).values - logits.gather(1, torch.tensor(tokens)[:, None])[:, 0])
    return torch.cat(gaps)


@contextlib.contextmanager
def bf16_gemm(name: str):
    previous = set_bf16_gemm(name)
    try:
        yield
    finally:
        set_bf16_gemm(previous)


# the default product on each family, MKL's on one
FAMILY_AND_PRODUCT = [("llama", "torch"), ("qwen2", "torch"), ("qwen3", "torch"), ("llama", "mkl")]


@pytest.mark.parametrize(("family", "gemm"), FAMILY_AND_PRODUCT)
def test_bf16_engine_matches_transformers_in_bf16(family, gemm):
    model = bf16_peft_model(family)
    with bf16_gemm(gemm):
        engine = make_engine(model)
        assert engine.runner.kv_pool.dtype == torch.bfloat16
        with_adapter = logprob_differences(engine, model, SAMPLED)
        with model.disable_adapter():
            without = logprob_differences(engine, model, dataclasses.replace(SAMPLED, lora=None))
        lost_adapter = logprob_differences(engine, model, dataclasses.replace(SAMPLED, lora=None))
        # greedy in batches (the merged weights) and one prompt alone (under 4 rows: base product + delta)
        gaps = torch.cat([greedy_gaps(engine, model, PROMPTS), greedy_gaps(engine, model, PROMPTS[:1])])
    for diffs in (with_adapter, without):
        assert diffs.mean() <= MAX_MEAN_DIFF and diffs.max() <= MAX_DIFF, (diffs.mean(), diffs.max())
    assert lost_adapter.mean() > 5 * MAX_MEAN_DIFF  # what the bounds would see if the adapter went missing
    assert (gaps == 0).float().mean() >= MIN_GREEDY_AGREEMENT and gaps.max() <= MAX_GREEDY_GAP, gaps
