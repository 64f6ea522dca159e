"""Where a GRPO step's time goes: its phases, the trainer's matmul floor, and the overhead floor.

Runs the default job's GRPO steps twice in this process, each through train.py's own loop (no warm start, no
evaluation, as bench/grpo_step.py runs them):
- **the job**, on its model: per step, the phases the job logs (time/generate, env, train, sync) and the rest
  of the step's wall time; the tokens the engine generated a second of generate; and the **trainer's matmul
  floor**: every forward the trainer's model ran in the step (its tokens, its LM-head rows, with or without
  gradients), replayed as the base weights' products alone (x W^T forward, and dY W for the input's gradient
  where the forward kept one), with no attention, norms, softmax, LoRA or optimizer. The train phase can near
  it, never beat it;
- **the overhead floor**: the same steps with `model=tiny_llama` (a few narrow layers on the same
  tokenizer), whose compute is nil, so what is left is Python, tokenization, the constraint, the env and the
  sync. It bounds a step on a GPU, and it can be measured on any CPU. The tiny model's samples are noise, so
  its completions run to the token limit: its generation does at least the job's work in tokens.

    python bench/step_parts.py                         # the default job's first 3 GRPO steps, both arms
    python bench/step_parts.py num_steps=5 trainer.micro_batch_size=16

Positional arguments are Hydra overrides of the job (conf/train.yaml), applied to both arms. Step 1 warms up
(first calls, allocator) and is left out of the means when there are more. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from grpo_step import grpo_records, grpo_steps_config
from json_line import emit
from machine import cpu_description

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import train  # noqa: E402
from rl.report.logger import METRICS_FILE  # noqa: E402

PHASES = ("generate", "env", "train", "sync")
TINY = "model=tiny_llama"


@dataclass(slots=True)
class Forward:
    """One forward of a model: when it began (time.time(), as metrics.jsonl's records), the tokens its
    embedding took, the rows its LM head took, and whether it kept an autograd graph (a backward follows)."""

    time: float
    tokens: int
    head_rows: int
    grad: bool


class ForwardLog:
    """Every forward of every model whose embedding and LM head this process runs, by module: a global hook,
    since train.py builds its models inside its loop. `of(model)` picks one model's, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int, str, int, bool]] = []  # (time, module id, kind, rows, grad)
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._seen)

    def _seen(self, module, args, output) -> None:
        if isinstance(module, torch.nn.Embedding):
            kind, rows = "embed", args[0].numel()
        elif isinstance(module, torch.nn.Linear) and module.out_features > 10_000:  # a vocabulary's LM head
            kind, rows = "head", args[0].shape[:-1].numel()
        else:
            return
        self.calls.append((time.time(), id(module), kind, rows, torch.is_grad_enabled()))

    def close(self) -> None:
        self._handle.remove()

    def of(self, model: torch.nn.Module, since: int = 0) -> list[Forward]:
        embed, head = id(model.get_input_embeddings()), id(model.get_output_embeddings())
        forwards: list[Forward] = []
        for when, module, kind, rows, grad in self.calls[since:]:
            if module == embed and kind == "embed":
                forwards.append(Forward(when, rows, 0, grad))
            elif module == head and kind == "head" and forwards:
                forwards[-1].head_rows += rows
        return forwards


def base_weights(model: torch.nn.Module) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The decoder's frozen linear weights (LoRA's own left out) and the LM head's."""
    head = model.get_output_embeddings()
    weights = [
        module.weight
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and "lora_" not in name and module is not head
    ]
    return weights, head.weight


def matmul_floor_s(model: torch.nn.Module, forwards: list[Forward]) -> float:
    """Seconds the base products of `forwards` take alone: x W^T for each, and dY W where it kept a graph."""
    weights, head = base_weights(model)
    dtype = head.dtype
    most = max(max(f.tokens, f.head_rows) for f in forwards)
    widths = {w.shape[1] for w in weights} | {w.shape[0] for w in weights} | {head.shape[1], head.shape[0]}
    inputs = {width: torch.randn(most, width, dtype=dtype) for width in widths}
    with torch.no_grad():
        start = time.perf_counter()
        for f in forwards:
            for w in weights:
                inputs[w.shape[1]][: f.tokens] @ w.detach().T
                if f.grad:
                    inputs[w.shape[0]][: f.tokens] @ w.detach()
            if f.head_rows:
                inputs[head.shape[1]][: f.head_rows] @ head.detach().T
                if f.grad:
                    inputs[head.shape[0]][: f.head_rows] @ head.detach()
        return time.perf_counter() - start


def run_arm(overrides: list[str], log: ForwardLog) -> dict:
    """The job's GRPO steps under `overrides`: per step its wall time, phases, generation rate, the
    trainer's forwards and their matmul floor."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = grpo_steps_config(overrides, run_dir)
        torch.manual_seed(cfg.seed)
        since = len(log.calls)
        result = train.train(cfg)
        records = grpo_records(Path(cfg.run_dir, METRICS_FILE))
    model = result.parts.model
    forwards = log.of(model, since)
    steps = []
    for step in range(1, cfg.num_steps + 1):
        record = records[step]
        phases = {phase: record.get(f"time/{phase}", 0.0) for phase in PHASES}
        began, wall = records[step - 1]["time"], record["time"] - records[step - 1]["time"]
        ran = [f for f in forwards if began <= f.time < record["time"]]
        steps.append(
            {
                "step_s": wall,
                **{f"{phase}_s": seconds for phase, seconds in phases.items()},
                "other_s": wall - sum(phases.values()),
                "rollout_tokens_per_s": record["rollout/tokens_per_s"],
                "completion_mean_length": record["completions/mean_length"],
                "peak_gb": record.get("memory/peak_rss_gb"),
                "trainer_forwards": len(ran),
                "trained_tokens": sum(f.tokens for f in ran if f.grad),
                "matmul_floor_s": matmul_floor_s(model, ran) if ran else 0.0,
            }
        )
    return {"cfg": cfg, "steps": steps, "model": model}


def means(steps: list[dict]) -> dict[str, float]:
    timed = steps[1:] if len(steps) > 1 else steps
    return {key: statistics.fmean(s[key] for s in timed) for key in timed[0] if timed[0][key] is not None}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job, e.g. num_steps=5")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    log = ForwardLog()
    job = run_arm(args.overrides, log)
    tiny = run_arm([*args.overrides, TINY], log)
    log.close()
    cfg = job["cfg"]
    num_steps = cfg.num_steps
    rows = {"job": means(job["steps"]), "overhead floor (tiny_llama)": means(tiny["steps"])}
    print(
        f"{num_steps} GRPO steps, {cfg.prompts_per_step} prompts x G={cfg.algo.group_size}, "
        f"{cfg.rollout.max_tokens} tokens, micro-batch {cfg.trainer.micro_batch_size}, "
        f"{args.threads} threads; {cpu_description()['cpu_model']}; "
        f"means over steps {'2-' if num_steps > 1 else ''}{num_steps}"
    )
    header = f"{'per step (s)':30}" + "".join(f"{k:>10}" for k in ("step", *PHASES, "other", "tok/s"))
    print(header)
    for name, row in rows.items():
        values = [row[f"{k}_s"] for k in ("step", *PHASES, "other")] + [row["rollout_tokens_per_s"]]
        print(f"{name:30}" + "".join(f"{v:>10.2f}" for v in values))
    train_s, floor_s = rows["job"]["train_s"], rows["job"]["matmul_floor_s"]
    print(
        f"trainer matmul floor: {floor_s:.2f} s a step ({rows['job']['trainer_forwards']:.1f} forwards, "
        f"{rows['job']['trained_tokens']:.0f} tokens with gradients); train phase {train_s:.2f} s = "
        f"{train_s / floor_s:.1f}x its floor"
    )
    emit(
        "step_parts",
        {
            "bench": "step_parts",
            **cpu_description(),
            "dtype": str(next(job["model"].parameters()).dtype),
            "num_steps": num_steps,
            "prompts_per_step": cfg.prompts_per_step,
            "group_size": cfg.algo.group_size,
            "max_tokens": cfg.rollout.max_tokens,
            "micro_batch_size": cfg.trainer.micro_batch_size,
            "threads": args.threads,
            "job": rows["job"],
            "overhead_floor": rows["overhead floor (tiny_llama)"],
            "trainer_matmul_floor_s": floor_s,
            "train_over_floor": train_s / floor_s,
            "job_steps": job["steps"],
            "overhead_steps": tiny["steps"],
        },
    )


if __name__ == "__main__":
    main()
