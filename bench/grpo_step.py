"""GRPO step time: the default job's steps against TRL's GRPOTrainer (the seed's "Benchmark A" form).

Both arms run num_steps (3) GRPO steps of the default job: its tasks, prompts, model, LoRA (r=16 on all
seven projections), AdamW and learning rate, 8 prompts x G=8 at T=0.8, 64 tokens, the SQL env's reward;
without the warm start and the evaluation, so only GRPO steps are timed. Ours runs first, in this process:
train.py's own loop, whose logs give the step times and (in samples.jsonl) the tasks its curriculum drew.
TRL then trains on the same tasks in the same order, in a subprocess (bench/peers/trl_grpo.py) with
transformers' generate (use_vllm=False), never at the same time as ours. Prints the average generation
time and total step time per step, as Benchmark A does, and ends with one JSON line.

    bash scripts/setup_bench_peers.sh                # once: installs trl (the `bench` extra)
    python bench/grpo_step.py                        # the default job's first 3 GRPO steps, both arms
    python bench/grpo_step.py num_steps=1 prompts_per_step=2 algo.group_size=2 rollout.max_tokens=8

Positional arguments are Hydra overrides of the job (conf/train.yaml), applied to both arms. Generation
time is the sampling alone (ours: time/generate, which leaves out the env; TRL: its `generate` calls);
reward time is the env's grading; step time is the wall time of the whole step (ours also hot-syncs the
LoRA weights into the engine, which TRL without vLLM need not do). By default TRL's completions end at the
tokens that contain the env's stop strings (ours stop at the strings); --trl-stop eos leaves TRL at EOS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from json_line import emit
from omegaconf import OmegaConf
from peer_process import run_peer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import train  # noqa: E402
from rl.report.logger import METRICS_FILE, SAMPLES_FILE  # noqa: E402
from rl.rollout.prompts import prompt_token_ids  # noqa: E402

WORKER = ROOT / "bench" / "peers" / "trl_grpo.py"
# Only GRPO steps: no warm start, no evaluation, no checkpoints, no W&B.
BENCH_OVERRIDES = [
    "num_steps=3",
    "sft.steps=0",
    "eval_every=0",
    "checkpoint_every=0",
    "env.eval_tasks=1",
    "logger.wandb.mode=disabled",
    "logger.progress=false",
    "logger.samples_every=1",  # samples.jsonl names each step's prompts, hence its tasks
]


def grpo_steps_config(overrides: list[str], run_dir: str):
    """The job under `overrides` with only its GRPO steps (BENCH_OVERRIDES), run in `run_dir`."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[*BENCH_OVERRIDES, *overrides, f"run_dir={run_dir}"])


def job_config(overrides: list[str], run_dir: str):
    cfg = grpo_steps_config(overrides, run_dir)
    a = cfg.algo
    if a.estimator.value != "grpo" or a.gspo or a.dynamic_sampling or a.is_mode.value != "none":
        sys.exit(
            "TRL's arm plays GRPO only: keep algo.estimator=grpo, gspo, dynamic_sampling and is_mode off"
        )
    if cfg.prompts_per_step * a.group_size % cfg.trainer.micro_batch_size:
        sys.exit("TRL needs prompts_per_step x algo.group_size to be a multiple of trainer.micro_batch_size")
    return cfg


def run_ours(cfg) -> tuple[list[dict[str, float]], list[list[dict]]]:
    """The default job's loop (train.train) on cfg; per GRPO step its wall time (between the logged records
    of consecutive steps) and phase times, and the task rows of the step's prompts, in order."""
    torch.manual_seed(cfg.seed)
    result = train.train(cfg)
    records = grpo_records(Path(cfg.run_dir, METRICS_FILE))
    steps = [
        {
            "step": records[step]["time"] - records[step - 1]["time"],
            "generate": records[step]["time/generate"],
            "env": records[step]["time/env"],
            "completion_mean_length": records[step]["completions/mean_length"],
            "reward": records[step]["reward"],
        }
        for step in range(1, cfg.num_steps + 1)
    ]
    return steps, drawn_tasks(result.parts, Path(cfg.run_dir, SAMPLES_FILE), cfg.algo.group_size)


def grpo_records(path: Path) -> dict[int, dict]:
    """The first GRPO record of each step in a metrics.jsonl (the final evaluation logs its step again)."""
    records: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "stage" not in record:
            records.setdefault(record["step"], record)
    return records


def drawn_tasks(parts, samples_path: Path, group_size: int) -> list[list[dict]]:
    """Each step's task rows, found by their prompts in samples.jsonl (G rows per prompt, groups in order)."""
    prefix = parts.env.response_prefix
    by_prompt = {
        parts.tokenizer.decode(
            prompt_token_ids(parts.tokenizer, parts.env.start(task).messages, prefix)
        ): task
        for task in parts.train_tasks
    }
    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    steps: dict[int, list[dict]] = {}
    for row in rows[::group_size]:
        steps.setdefault(row["step"], []).append(by_prompt[row["prompt"]])
    return list(steps.values())


def trl_job(cfg) -> dict:
    """The settings TRL's arm needs, read from the config tree (the TRL side never sees cfg)."""
    r, a, t, m = cfg.rollout, cfg.algo, cfg.trainer, cfg.model
    return {
        "model": {"name": m.name.value, "path": m.path, "dtype": m.dtype.value, "device": m.device},
        "env_name": cfg.env.name,
        "env_args": OmegaConf.to_container(cfg.env.args, resolve=True),
        "step_timeout_s": cfg.env.step_timeout_s,
        "lora": OmegaConf.to_container(cfg.lora, resolve=True),
        "seed": cfg.seed,
        "num_steps": cfg.num_steps,
        "prompts_per_step": cfg.prompts_per_step,
        "group_size": a.group_size,
        "micro_batch_size": t.micro_batch_size,
        "max_tokens": r.max_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "lr": t.lr,
        "lr_schedule": t.lr_schedule.value,
        "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "beta": a.beta,
        "eps_low": a.eps_low,
        "eps_high": a.eps_high,
        "num_iterations": a.num_iterations,
        "loss_type": a.loss_type.value,
        "scale": a.scale.value,
        "mask_truncated_completions": a.mask_truncated_completions,
    }


def mean(steps: list[dict], key: str) -> float:
    return statistics.fmean(step[key] for step in steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job, e.g. num_steps=1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trl-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--trl-stop", choices=["fence", "eos"], default="fence")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = job_config(args.overrides, run_dir)
        ours, draws = run_ours(cfg)
    gc.collect()  # our engine's KV pool goes before TRL's process starts
    request = {"job": trl_job(cfg), "steps": draws, "threads": args.threads, "stop": args.trl_stop}
    peer = run_peer("TRL's arm", args.trl_python, WORKER, request)
    theirs = peer["steps"]

    print(
        f"{cfg.num_steps} GRPO steps, {cfg.prompts_per_step} prompts x G={cfg.algo.group_size}, "
        f"{cfg.rollout.max_tokens} tokens, T={cfg.rollout.temperature}, {args.threads} threads"
    )
    print(f"{'per step (mean)':22}{'generate s':>12}{'reward s':>10}{'step s':>10}{'completion':>12}")
    for name, steps in (("pagedrl", ours), (f"TRL {peer['version']}", theirs)):
        row = [mean(steps, k) for k in ("generate", "env", "step", "completion_mean_length")]
        print(f"{name:22}{row[0]:>12.2f}{row[1]:>10.2f}{row[2]:>10.2f}{row[3]:>12.1f}")
    figures = {
        "pagedrl_generate_s": mean(ours, "generate"),
        "pagedrl_step_s": mean(ours, "step"),
        "trl_generate_s": mean(theirs, "generate"),
        "trl_step_s": mean(theirs, "step"),
    }
    figures |= {
        "generate_speedup": figures["trl_generate_s"] / figures["pagedrl_generate_s"],
        "step_speedup": figures["trl_step_s"] / figures["pagedrl_step_s"],
        "pagedrl_steps": ours,
        "trl_steps": theirs,
        "trl_version": peer["version"],
        "trl_stop": args.trl_stop,
        "num_steps": cfg.num_steps,
        "prompts_per_step": cfg.prompts_per_step,
        "group_size": cfg.algo.group_size,
        "max_tokens": cfg.rollout.max_tokens,
        "threads": args.threads,
        "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0],
    }
    print(f"speedup: generation {figures['generate_speedup']:.2f}x, step {figures['step_speedup']:.2f}x")
    emit("grpo_step", figures)


if __name__ == "__main__":
    main()
