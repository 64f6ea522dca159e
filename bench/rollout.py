"""GRPO rollout throughput: the paged engine against transformers `generate(num_return_sequences=G)`.

Workload (issue 3): SmolLM2-135M-Instruct, 16 chat prompts of different lengths, G=8 samples each,
max_tokens=128, temperature 1.0, stop at EOS. Useful tokens are generated tokens up to and including
EOS; padding and tokens after EOS do not count. Also prints peak KV memory (paged vs a contiguous
prompt + max_tokens reservation per sample), blocks saved by group sharing, and the share of the CPU's
matmul roofline the engine reaches, and the run's matmul floor (bench/matmul_floor.py). Ends with one JSON
line.

    python bench/rollout.py                       # the full workload (a few minutes on 2 cores)
    python bench/rollout.py --num-prompts 4 --max-tokens 32 --profile
    python bench/rollout.py --random-weights      # no SmolLM2 file (e.g. the GPU machine): see below
    python bench/rollout.py --lora --num-prompts 4 --group-size 8 --max-tokens 25 --prompt-tokens 220
                                                  # the training job's rollout shape, with its LoRA adapter
    python bench/rollout.py --busy-neighbour      # also: the engine quiet vs beside a CPU-bound process
    python bench/rollout.py --dtype bfloat16 --bf16-gemm mkl   # bf16 (auto picks it on a CPU with native
                                                  # bf16), multiplied by MKL instead of torch's F.linear
    PAGEDRL_ADAPTIVE_THREADS=0 python bench/rollout.py --busy-neighbour   # the same, threads fixed

--lora wraps the model in a rank-16 peft adapter on all 7 projections with random non-zero B (peft starts B at
zero); every run then samples with it, and the same engine also runs the workload without it (lora=None
requests), each to exactly max_tokens from an empty prefix cache, best of --repeats. Each LoRA run starts
with a weight sync (`set_lora_version`, the job's in-place sync), so its time includes re-merging the adapter
into the packed weights. The LoRA share of engine time is 1 - t_base / t_lora, from wall time and from
process CPU time (robust to a busy machine at --threads 1).

--dtype is model.dtype (auto: bf16 on CUDA and on a CPU with avx512_bf16 or amx_bf16, fp32 elsewhere); the
engine and transformers run in it. --bf16-gemm picks the product of the engine's bf16 CPU projections
(pagedrl_kernels/cpu_gemm.py).

With --random-weights the model is a seeded random SmolLM2-shaped Llama and the prompts are random token ids
of the chat prompts' lengths; no EOS exists, so both sides generate exactly max_tokens per sample (the same
decode work as the real workload at its longest). On CUDA everything runs on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
from json_line import emit
from matmul_floor import matmul_floor_s, step_shapes
from neighbour import busy_neighbour
from rollout_workload import (
    add_workload_arguments,
    chat_prompts,
    pad_prompts,
    random_model_and_prompts,
    run_engine,
)

from pagedrl_kernels.cpu_gemm import set_bf16_gemm
from rl.job.model_loading import load_model
from rl.sync.adapter import add_lora, lora_tensors
from rollout_engine import LLMEngine, SamplingParams


def with_lora(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model wrapped in peft LoRA (rank 16, all 7 projections) with random non-zero B."""
    peft_model = add_lora(model, rank=16, alpha=32.0, target_modules="all")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in lora_tensors(peft_model).items():
            if name.endswith("lora_B"):
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.02)
    return peft_model.eval()


def lora_share(engine: LLMEngine, prompts, args) -> dict[str, float]:
    """Best-of-repeats wall and CPU seconds of the workload with the adapter and without; the LoRA share."""
    best = {lora: [float("inf"), float("inf")] for lora in ("policy", None)}
    for _ in range(args.repeats):
        for lora, times in best.items():
            params = SamplingParams(
                n=args.group_size, max_tokens=args.max_tokens, seed=args.seed, stop_token_ids=[], lora=lora
            )
            engine.reset_prefix_cache()
            wall, cpu = time.perf_counter(), time.process_time()
            if lora is not None:  # a weight sync, as every training step makes: the merged packs are rebuilt
                engine.set_lora_version(engine.lora.version + 1)
            engine.generate(prompts, params)
            times[0] = min(times[0], time.perf_counter() - wall)
            times[1] = min(times[1], time.process_time() - cpu)
    (lora_s, lora_cpu_s), (base_s, base_cpu_s) = best["policy"], best[None]
    return {
        "lora_engine_s": lora_s,
        "base_engine_s": base_s,
        "lora_share": 1 - base_s / lora_s,
        "lora_engine_cpu_s": lora_cpu_s,
        "base_engine_cpu_s": base_cpu_s,
        "lora_share_cpu": 1 - base_cpu_s / lora_cpu_s,
    }


def under_load(engine: LLMEngine, prompts, args, stop_token_ids) -> dict[str, float]:
    """The workload quiet, then beside a busy neighbour process, each from an empty prefix cache."""
    rates = {}
    for arm in ("quiet", "loaded"):
        engine.reset_prefix_cache()
        with busy_neighbour() if arm == "loaded" else contextlib.nullcontext():
            seconds, tokens = run_engine(
                engine, prompts, args.group_size, args.max_tokens, args.seed, stop_token_ids
            )
        rates[f"{arm}_engine_tokens_per_s"] = tokens / seconds
    rates["slowdown_under_load"] = rates["quiet_engine_tokens_per_s"] / rates["loaded_engine_tokens_per_s"]
    rates["adaptive_threads"] = os.environ.get("PAGEDRL_ADAPTIVE_THREADS", "1") != "0"
    return rates


def useful_length(row: list[int], eos: int | None) -> int:
    return row.index(eos) + 1 if eos is not None and eos in row else len(row)


def run_hf(model, eos: int | None, prompts, group_size: int, max_tokens: int, seed: int):
    """transformers generate; with eos None (random weights) every sample runs to max_tokens."""
    pad = 0 if eos is None else eos
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_return_sequences=group_size,
        max_new_tokens=max_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    _sync(model.device)
    seconds = time.perf_counter() - start
    return seconds, sum(useful_length(row, eos) for row in out[:, width:].tolist())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(m: int, k: int, n: int, like: torch.Tensor, repeats: int = 10) -> float:
    """Best-of-`repeats` GEMM throughput on `like`'s device and dtype (the best run is the least disturbed
    by other processes)."""
    a = torch.randn(m, k, device=like.device, dtype=like.dtype)
    b = torch.randn(n, k, device=like.device, dtype=like.dtype)
    torch.nn.functional.linear(a, b)
    best = float("inf")
    for _ in range(repeats):
        _sync(a.device)
        start = time.perf_counter()
        torch.nn.functional.linear(a, b)
        _sync(a.device)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def engine_matmul_flops(model, num_computed_tokens: int, num_logits_rows: int) -> int:
    """2 x weights multiplied: every computed token goes through the decoder projections, and each
    sampled token's row through the LM head."""
    decoder = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
    return 2 * (decoder * num_computed_tokens + model.lm_head.weight.numel() * num_logits_rows)


def decode_step_gflops(engine: LLMEngine, model, prompts, group_size: int) -> tuple[float, int]:
    """Matmul GFLOP/s of the engine's whole decode step (attention, norms and sampling included) at the
    full batch of len(prompts) x group_size sequences; returns (GFLOP/s, batch)."""
    params = SamplingParams(n=group_size, max_tokens=24, seed=0, stop_token_ids=[])
    for prompt in prompts:
        engine.add_request(prompt, params)
    for _ in range(4):  # prefill and fork, then a few decodes
        engine.step()
    batch = len(engine.scheduler.running)
    num_steps = 12
    start = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    seconds = (time.perf_counter() - start) / num_steps
    while engine.has_unfinished():
        engine.step()
    return engine_matmul_flops(model, batch, batch) / seconds / 1e9, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--kv-budget-gib", type=float, default=4.0, help="memory_budget_bytes for the engine")
    parser.add_argument("--profile", action="store_true", help="print the engine's top ops (torch.profiler)")
    parser.add_argument("--random-weights", action="store_true", help="random SmolLM2-shaped model, no files")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="pad prompts with random tokens to this")
    parser.add_argument("--lora", action="store_true", help="rank-16 LoRA adapter; time its share")
    parser.add_argument(
        "--busy-neighbour", action="store_true", help="time the engine again beside a CPU-bound process"
    )
    parser.add_argument("--repeats", type=int, default=3, help="best-of runs of each --lora arm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_bf16_gemm(args.bf16_gemm)
    if args.random_weights:
        model, prompts = random_model_and_prompts(args.num_prompts, args.seed, args.dtype)
        tokenizer, eos, stop = None, None, []
    else:
        model, tokenizer = load_model("smollm2_135m", dtype=args.dtype)
        prompts, eos, stop = chat_prompts(tokenizer, args.num_prompts), tokenizer.eos_token_id, None
    if args.prompt_tokens:
        prompts = pad_prompts(prompts, args.prompt_tokens, model.config.vocab_size, args.seed)
    # peft injects its layers into `model` in place: generate and the FLOP counts below see the adapter too
    served = with_lora(model, args.seed) if args.lora else model
    engine = LLMEngine(served, tokenizer, memory_budget_bytes=int(args.kv_budget_gib * 2**30))
    load = os.getloadavg()[0]

    run_engine(engine, prompts[:2], 2, 4, args.seed, stop)  # warm-up
    run_hf(model, eos, prompts[:2], 2, 4, args.seed)
    warm = engine.stats()
    with step_shapes(engine) as shapes:
        engine_s, engine_tokens = run_engine(
            engine, prompts, args.group_size, args.max_tokens, args.seed, stop
        )
    stats = engine.stats()
    floor_s = matmul_floor_s(engine, shapes) if model.lm_head.weight.is_cpu else None
    hf_s, hf_tokens = run_hf(model, eos, prompts, args.group_size, args.max_tokens, args.seed)

    step_gflops, batch = decode_step_gflops(engine, model, prompts, args.group_size)
    computed = stats["num_prefill_tokens"] - warm["num_prefill_tokens"] + engine_tokens
    engine_gflops = engine_matmul_flops(model, computed, engine_tokens) / engine_s / 1e9
    weight = model.lm_head.weight
    peak_gflops = matmul_gflops(2048, 2048, 2048, weight)
    shape_gflops = matmul_gflops(batch, model.config.hidden_size, model.config.intermediate_size, weight)
    per_block = stats["kv_bytes_per_block"]
    per_token = per_block // engine.block_manager.block_size
    paged_peak = stats["num_blocks_peak"] * per_block
    contiguous = sum(len(p) + args.max_tokens for p in prompts) * args.group_size * per_token
    figures = {
        "engine_tokens_per_s": engine_tokens / engine_s,
        "hf_tokens_per_s": hf_tokens / hf_s,
        "speedup": (engine_tokens / engine_s) / (hf_tokens / hf_s),
        "engine_useful_tokens": engine_tokens,
        "hf_useful_tokens": hf_tokens,
        "engine_s": engine_s,
        "hf_s": hf_s,
        "matmul_floor_s": floor_s,
        "matmul_floor_tokens_per_s": None if floor_s is None else engine_tokens / floor_s,
        "kv_peak_paged_mib": paged_peak / 2**20,
        "kv_contiguous_mib": contiguous / 2**20,
        "blocks_saved_by_sharing": stats["num_blocks_saved_by_sharing"] - warm["num_blocks_saved_by_sharing"],
        "preemptions": stats["num_preemptions"],
        "engine_matmul_gflops": engine_gflops,
        "roofline_gflops_2048": peak_gflops,
        "roofline_gflops_decode_shape": shape_gflops,
        "roofline_share": engine_gflops / peak_gflops,
        "decode_step_batch": batch,
        "decode_step_gflops": step_gflops,
        "decode_step_roofline_share": step_gflops / peak_gflops,
        "threads": args.threads,
        "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0],
        "device": str(weight.device),
        "dtype": str(weight.dtype).removeprefix("torch."),
        "bf16_gemm": args.bf16_gemm,
        "weights": "random" if args.random_weights else "smollm2_135m",
        "lora": args.lora,
        "prompt_tokens": args.prompt_tokens,
    }
    print(f"{'':24}{'engine':>12}{'transformers':>14}")
    print(f"{'useful tokens':24}{engine_tokens:>12}{hf_tokens:>14}")
    print(f"{'seconds':24}{engine_s:>12.1f}{hf_s:>14.1f}")
    print(
        f"{'useful tokens / s':24}{figures['engine_tokens_per_s']:>12.1f}{figures['hf_tokens_per_s']:>14.1f}"
    )
    print(f"speedup: {figures['speedup']:.2f}x")
    if floor_s is not None:
        print(
            f"matmul floor: the run's products alone take {floor_s:.1f} s = "
            f"{figures['matmul_floor_tokens_per_s']:.1f} useful tok/s; the engine runs at "
            f"{floor_s / engine_s:.0%} of that rate"
        )
    print(
        f"peak KV: paged {figures['kv_peak_paged_mib']:.1f} MiB vs contiguous "
        f"{figures['kv_contiguous_mib']:.1f} MiB"
    )
    print(f"blocks saved by group sharing: {figures['blocks_saved_by_sharing']}")
    print(
        f"matmul: engine {engine_gflops:.1f} GFLOP/s, roofline {peak_gflops:.1f} GFLOP/s (2048^3), "
        f"{shape_gflops:.1f} GFLOP/s at [{batch}x{model.config.hidden_size}]x[{model.config.hidden_size}x"
        f"{model.config.intermediate_size}] -> {figures['roofline_share']:.0%} of roofline over the run"
    )
    print(
        f"decode step at batch {batch}: {step_gflops:.1f} GFLOP/s of matmul work -> "
        f"{figures['decode_step_roofline_share']:.0%} of roofline"
    )
    end_load = figures["load_avg_1min_end"]
    print(
        f"{figures['dtype']} (bf16 product: {args.bf16_gemm}), threads {args.threads}, load average "
        f"{load:.2f} at start, {end_load:.2f} at end"
    )
    if args.lora:
        figures.update(lora_share(engine, prompts, args))
        print(
            f"LoRA share of engine time: {figures['lora_share']:.1%} wall "
            f"({figures['base_engine_s']:.2f} s base, {figures['lora_engine_s']:.2f} s LoRA), "
            f"{figures['lora_share_cpu']:.1%} CPU time ({figures['base_engine_cpu_s']:.2f} s, "
            f"{figures['lora_engine_cpu_s']:.2f} s); best of {args.repeats}, to max_tokens"
        )
    if args.busy_neighbour:
        figures.update(under_load(engine, prompts, args, stop))
        print(
            f"beside a busy process: {figures['loaded_engine_tokens_per_s']:.1f} vs "
            f"{figures['quiet_engine_tokens_per_s']:.1f} tok/s quiet = "
            f"{figures['slowdown_under_load']:.2f}x slower (adaptive threads: {figures['adaptive_threads']})"
        )
    if args.profile:
        profile_engine(engine, prompts, args, stop)
    emit("rollout", figures)


def profile_engine(engine: LLMEngine, prompts, args, stop_token_ids) -> None:
    from torch.profiler import profile

    with profile() as prof:
        run_engine(engine, prompts, args.group_size, min(args.max_tokens, 16), args.seed, stop_token_ids)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
