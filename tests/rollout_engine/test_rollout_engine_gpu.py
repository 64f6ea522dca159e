"""On CUDA (Triton kernels): greedy equals transformers, and the engine stays under its memory fraction."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from rollout_tiny_models import hf_greedy, make_tiny_model, random_prompts  # noqa: E402

from rollout_engine import LLMEngine, SamplingParams  # noqa: E402

pytestmark = pytest.mark.gpu


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
