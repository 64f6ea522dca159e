"""The engine where triton is not installed (pyproject installs it on Linux x86_64 only, so not on a Mac or
an ARM laptop). This module, run as a script, hides triton before anything imports it, then builds the engine
and generates on CPU: its greedy tokens must equal transformers', and its sampled ones this process's, which
has triton."""

import json
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.modules["triton"] = None  # `import triton` now raises ModuleNotFoundError, as where it is absent

import pagedrl_kernels.backend
from rollout_engine import SamplingParams
from tests.helpers.rollout_tiny_models import hf_greedy, make_engine, make_tiny_model, random_prompts

GREEDY_TOKENS = 8


def rollout() -> dict:
    """Greedy and seeded sampled completions of a tiny Llama, and whether this process has triton."""
    engine = make_engine(make_tiny_model("llama"))
    prompts = random_prompts([5, 12])
    greedy = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, stop_token_ids=[])
    sampled = SamplingParams(
        n=3, temperature=0.8, top_k=40, top_p=0.9, max_tokens=6, seed=3, stop_token_ids=[]
    )
    return {
        "has_triton": pagedrl_kernels.backend.HAS_TRITON,
        "prompts": prompts,
        "greedy": [group.samples[0].token_ids for group in engine.generate(prompts, greedy)],
        "sampled": [[s.token_ids for s in group.samples] for group in engine.generate(prompts, sampled)],
    }


def test_engine_imports_and_generates_on_cpu_without_triton():
    script = subprocess.run(
        [sys.executable, "-m", __name__],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert script.returncode == 0, script.stderr[-3000:]
    without = json.loads(script.stdout.strip().splitlines()[-1])
    assert without["has_triton"] is False
    model = make_tiny_model("llama")
    for prompt, tokens in zip(without["prompts"], without["greedy"], strict=True):
        assert tokens == hf_greedy(model, prompt, GREEDY_TOKENS)
    with_triton = rollout()
    assert with_triton["has_triton"] and with_triton["sampled"] == without["sampled"]


if __name__ == "__main__":
    print(json.dumps(rollout()))
