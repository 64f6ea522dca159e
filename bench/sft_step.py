"""Warm-start step time by micro-batch size: the same batches of demonstrations, one step each, at the
trainer's micro-batch size and at the whole batch.

A warm-start batch holds the questions of one database (env.shared_prompt_key), so its rows start with the
same schema; the rows of one micro-batch run that shared prompt once (rl.algo.logprobs), and a batch split
in k micro-batches runs it k times. Both arms take the same batches on the same weights (a negligible
learning rate keeps them), so their NLLs must agree; the first batch warms up and is left out of the sums.

    python bench/sft_step.py                                   # the default job's tasks and warm start
    python bench/sft_step.py env=spider env.tasks.root=/data/spider --batches 6
    python bench/sft_step.py --split 8 --whole 16               # rows per micro-batch of each arm

Positional arguments are Hydra overrides of the job (conf/train.yaml). Prints one line per batch and arm, the
summed times and their ratio, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from job_parts import job_parts
from json_line import emit
from machine import cpu_description

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rl.algo.optim import build_optimizer  # noqa: E402
from rl.job.demos import DemoSampler, demonstrations  # noqa: E402
from rl.job.warm_start import sft_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job")
    parser.add_argument("--batches", type=int, default=6, help="batches timed (the first one warms up)")
    parser.add_argument(
        "--split", type=int, default=None, help="rows per micro-batch (trainer.micro_batch_size)"
    )
    parser.add_argument(
        "--whole", type=int, default=None, help="rows per micro-batch of the other arm (sft.batch_size)"
    )
    args = parser.parse_args()
    cfg, parts = job_parts(args.overrides)
    arms = {"split": args.split or cfg.trainer.micro_batch_size, "whole": args.whole or cfg.sft.batch_size}
    demos = demonstrations(parts.env, parts.train_tasks, parts.tokenizer, cfg.env.shared_prompt_key)
    sampler = DemoSampler(demos, cfg.sft.batch_size, seed=cfg.seed)
    batches = [sampler.next_batch() for _ in range(args.batches)]
    optimizer = build_optimizer(parts.model, 1e-12, weight_decay=0.0)
    seconds = dict.fromkeys(arms, 0.0)
    for i, batch in enumerate(batches):
        tokens = sum(len(d.prompt_ids) + len(d.completion_ids) for d in batch)
        for arm, micro in arms.items():
            start = time.perf_counter()
            metrics = sft_step(
                parts.train_model,
                optimizer,
                batch,
                parts.tokenizer.pad_token_id,
                micro,
                cfg.trainer.max_grad_norm,
            )
            took = time.perf_counter() - start
            seconds[arm] += took if i > 0 else 0.0
            print(
                f"batch {i} ({len(batch)} rows, {tokens} tokens), {micro} rows a micro-batch: {took:.2f} s, "
                f"nll {metrics['sft/nll']:.4f}",
                flush=True,
            )
    ratio = seconds["split"] / seconds["whole"]
    print(
        f"batches 1-{args.batches - 1}: {seconds['split']:.1f} s at {arms['split']} rows a micro-batch, "
        f"{seconds['whole']:.1f} s at {arms['whole']}: {ratio:.2f}x"
    )
    emit(
        "sft_step",
        {
            "bench": "sft_step",
            **cpu_description(),
            "dtype": str(next(parts.model.parameters()).dtype),
            "micro_batch_sizes": arms,
            "seconds": {arm: round(s, 2) for arm, s in seconds.items()},
            "ratio_split_over_whole": round(ratio, 3),
        },
    )


if __name__ == "__main__":
    main()
