"""On CUDA (Triton kernels): greedy equals transformers, the engine stays under its memory fraction, and in
bf16 (what model.dtype=auto picks on CUDA) its greedy tokens and logprobs agree with transformers' to bf16's
rounding."""

import pytest
import torch

from rl.job.model_loading import resolve_dtype
from rollout_engine import LLMEngine, SamplingParams
from tests.helpers.rollout_tiny_models import hf_greedy, make_tiny_model, random_prompts

pytestmark = pytest.mark.gpu

# bf16 keeps 8 significant bits: a logit near 8 rounds by up to 0.03, in the engine's kernels and in
# transformers' differently, and a log_softmax adds the error of its normaliser. A greedy token may then be
# either side of a near tie, and a logprob may differ by a few such roundings.
BF16_TIE = 0.1
BF16_LOGPROB_ATOL = 0.1


def test_greedy_equals_hf_on_cuda_and_memory_stays_under_the_fraction():
    model = make_tiny_model("qwen3").cuda()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fraction = 0.02
    engine = LLMEngine(model, None, block_size=16, memory_fraction=fraction, max_model_len=256)
    prompts = random_prompts([3, 40, 17, 9])
    results = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=16, stop_token_ids=[]))
    torch.cuda.synchronize()
    engine_peak = torch.cuda.max_memory_allocated() - baseline
    assert engine_peak <= fraction * torch.cuda.get_device_properties(0).total_memory
    assert engine.stats()["kv_bytes_total"] > weights  # the pool was sized from the fraction, not a default
    for prompt, group in zip(prompts, results, strict=True):
        assert group.samples[0].token_ids == group.samples[1].token_ids == hf_greedy(model, prompt, 16)


def test_bf16_greedy_tokens_are_transformers_argmax_up_to_a_near_tie_and_logprobs_agree():
    model = make_tiny_model("qwen3").to("cuda", resolve_dtype("auto", torch.device("cuda")).dtype)
    assert next(model.parameters()).dtype == torch.bfloat16
    engine = LLMEngine(model, None, block_size=16, memory_fraction=0.02, max_model_len=256)
    assert engine.runner.kv_pool.dtype == torch.bfloat16
    prompts = random_prompts([3, 40, 17, 9])
    results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[]))
    for prompt, group in zip(prompts, results, strict=True):
        tokens = group.samples[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens], device="cuda")).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()
        chosen = logprobs.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
        assert (logprobs.max(dim=-1).values - chosen).max() <= BF16_TIE
        torch.testing.assert_close(
            torch.tensor(group.samples[0].logprobs), chosen, atol=BF16_LOGPROB_ATOL, rtol=0
        )
