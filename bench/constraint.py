"""What the schema constraint costs the engine: the same GRPO groups sampled with and without it.

The SQL envs attach a constraint to every episode (`envs.sql.schema_constraint.SchemaNames`), and the engine
asks it about each constrained row's likeliest tokens and samples among those it accepts
(`rollout_engine.constraints`). Both arms sample the same prompts with the same seeds at the rollout.*
settings (n = algo.group_size), alternating, each after a prefix-cache reset so both pay the same prefill; the
constrained arm's time in the constraint (its candidates and their checks) is measured on its own. A vetoed
token changes the sample, so the arms' completions differ and the comparison is per token generated.

    python bench/constraint.py                                  # the default job's held-out tasks
    python bench/constraint.py +experiment=spider_sft env.tasks.root=/data/spider --prompts 16
    python bench/constraint.py --repeats 3 rollout.temperature=0.0

Positional arguments are Hydra overrides of the job (conf/train.yaml). Prints one line per run, the arms'
tokens/s and their ratio, and the share of the constrained arm's time spent in the constraint, and ends with
one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from job_parts import job_parts
from json_line import emit
from machine import cpu_description

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rollout_engine.step_sampling as step_sampling  # noqa: E402
from envs.base import start_episodes  # noqa: E402
from rl.job.sampling import sampling_params  # noqa: E402
from rl.rollout.prompts import prompt_token_ids  # noqa: E402


class Timed:
    """Functions with the seconds spent in them added up."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job")
    parser.add_argument("--prompts", type=int, default=8, help="held-out tasks sampled, a group each")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, alternating")
    args = parser.parse_args()
    cfg, parts = job_parts(args.overrides)
    tasks = [parts.test_tasks[i] for i in range(min(args.prompts, len(parts.test_tasks)))]
    episodes = start_episodes(parts.env, tasks)
    constraints = [getattr(episode, "constraint", None) for episode in episodes]
    if not any(constraints):
        sys.exit("bench/constraint.py: these episodes carry no constraint; use an SQL env (constrain_names)")
    prefix = parts.env.response_prefix
    prompts = [prompt_token_ids(parts.tokenizer, e.messages, prefix) for e in episodes]
    params = sampling_params(cfg, parts.env, step=0)
    arms = {
        "free": [params] * len(prompts),
        "constrained": [dataclasses.replace(params, constraint=c) for c in constraints],
    }
    timed = Timed()  # the constraint's share: its candidates' softmax and top-k, and its checks
    step_sampling.candidates = timed.wrap(step_sampling.candidates)
    step_sampling.constrain = timed.wrap(step_sampling.constrain)
    engine = parts.engine
    totals = {arm: {"seconds": 0.0, "tokens": 0, "constraint_seconds": 0.0} for arm in arms}
    before = engine.stats()
    for repeat in range(args.repeats + 1):  # the first round warms up and is left out
        for arm, arm_params in arms.items():
            engine.reset_prefix_cache()
            timed.seconds = 0.0
            start = time.perf_counter()
            results = engine.generate(prompts, arm_params)
            took = time.perf_counter() - start
            tokens = sum(len(s.token_ids) for r in results for s in r.samples)
            print(
                f"round {repeat} {arm}: {tokens} tokens in {took:.2f} s ({tokens / took:.0f} tok/s)"
                + (f", {timed.seconds:.2f} s in the constraint" if arm == "constrained" else ""),
                flush=True,
            )
            if repeat > 0:
                totals[arm]["seconds"] += took
                totals[arm]["tokens"] += tokens
                totals[arm]["constraint_seconds"] += timed.seconds
    after = engine.stats()
    rate = {arm: t["tokens"] / t["seconds"] for arm, t in totals.items()}
    share = totals["constrained"]["constraint_seconds"] / totals["constrained"]["seconds"]
    checks = after["constraint_checks"] - before["constraint_checks"]
    vetoes = after["constraint_vetoes"] - before["constraint_vetoes"]
    print(
        f"free {rate['free']:.0f} tok/s, constrained {rate['constrained']:.0f} tok/s: "
        f"{rate['free'] / rate['constrained']:.2f}x; the constraint takes {share:.0%} of the constrained "
        f"arm's time; {checks} checks and {vetoes} vetoes over {args.repeats + 1} constrained runs"
    )
    emit(
        "constraint",
        {
            "bench": "constraint",
            "device": str(engine.runner.device),
            **cpu_description(),
            "prompts": len(prompts),
            "group_size": params.n,
            "temperature": params.temperature,
            "max_tokens": params.max_tokens,
            "free_tok_s": rate["free"],
            "constrained_tok_s": rate["constrained"],
            "slowdown": rate["free"] / rate["constrained"],
            "constraint_share": share,
            "checks": checks,
            "vetoes": vetoes,
        },
    )


if __name__ == "__main__":
    main()
