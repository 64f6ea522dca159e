"""Per-step metrics the loop logs besides the optimisation step's own, and the phase timer."""

from __future__ import annotations

import contextlib
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rl.algo.advantages import filter_zero_std_groups, reward_stats
from rl.rollout.play import Trajectory

PHASES = ("sft", "generate", "env", "train", "sync", "eval")
# How one step's metric combines over data-parallel ranks (by name, or by a prefix ending in "/"); the rest
# are averaged. Throughput and counts add up over the job; the slowest rank sets the step time and each
# rank's peak memory is its own device's, so those take the largest.
RANK_REDUCERS = {
    "rollout/tokens_per_s": sum,
    "rollout/blocks_shared": sum,
    "rollout/preemptions": sum,
    "rollout/prefix_cache_hits": sum,
    "rollout/constraint_vetoes": sum,
    "rollout/constraint_unmet": sum,
    "informative_groups": sum,
    "env/errors": sum,
    "env/timeouts": sum,
    "guidance/demonstrations": sum,
    "num_tokens": sum,
    "num_skipped_steps": max,
    "num_rows_skipped": sum,
    "completions/min_length": min,
    "completions/max_length": max,
    "time/": max,
    "memory/": max,
}


class StepTimer:
    """Wall time per phase: the current step's (summed over its calls) and the run's totals."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._last: dict[str, float] = {}

    def begin_step(self) -> None:
        self._last = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def last(self, phase: str) -> float:
        return self._last.get(phase, 0.0)

    def add(self, phase: str, seconds: float) -> None:
        """Account `seconds` to `phase` (negative to move time measured inside another phase out of it)."""
        self._last[phase] = self._last.get(phase, 0.0) + seconds
        self.totals[phase] += seconds

    def metrics(self) -> dict[str, float]:
        return {f"time/{phase}": seconds for phase, seconds in self._last.items()}


def reward_metrics(trajectories: Sequence[Sequence[Trajectory]], rewards: torch.Tensor) -> dict[str, float]:
    """reward, rewards/<component>, reward_std, frac_reward_zero_std and env failure counts: env/errors
    (episodes a plugin failed: it raised, hung or gave a bad reward) and env/timeouts (those that hung).
    guidance/demonstrations counts the groups' demonstrations (algo.guidance), which the rewards include."""
    stats = reward_stats(rewards)
    flat = [t for group in trajectories for t in group]
    out = {
        "reward": stats.reward_mean,
        "reward_std": stats.reward_std,
        "frac_reward_zero_std": stats.frac_reward_zero_std,
        # groups whose rewards differ: the ones with a policy gradient
        "informative_groups": float(filter_zero_std_groups(rewards).sum()),
        "env/errors": float(sum(t.error is not None for t in flat)),
        "env/timeouts": float(sum(t.timed_out for t in flat)),
        "env/mean_turns": sum(t.num_turns for t in flat) / len(flat),
        "guidance/demonstrations": float(sum(t.demonstration for t in flat)),
    }
    for name in sorted({name for t in flat for name in t.rewards}):
        out[f"rewards/{name}"] = sum(t.rewards.get(name, 0.0) for t in flat) / len(flat)
    return out


def combine_rank_metrics(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from every data-parallel rank as one (see RANK_REDUCERS).

    A reward component that no episode of a rank reported counts as 0 there, as in `reward_metrics`; any
    other metric a rank lacks combines over the ranks that have it.
    """
    names = dict.fromkeys(name for metrics in per_rank for name in metrics)
    out = {}
    for name in names:
        if name.startswith("rewards/"):
            values = [metrics.get(name, 0.0) for metrics in per_rank]
        else:
            values = [metrics[name] for metrics in per_rank if name in metrics]
        prefix = name[: name.find("/") + 1]
        out[name] = (RANK_REDUCERS.get(name) or RANK_REDUCERS.get(prefix) or statistics.fmean)(values)
    return out


def engine_metrics(engine: Any, before: dict[str, int], generate_s: float) -> dict[str, float]:
    """Rollout throughput and KV-cache figures over one generation phase."""
    now = engine.stats()
    generated = now["num_generated_tokens"] - before["num_generated_tokens"]
    return {
        "rollout/tokens_per_s": generated / max(generate_s, 1e-9),
        "rollout/kv_utilization": now["num_blocks_peak"] / now["num_blocks_total"],
        "rollout/blocks_shared": float(
            now["num_blocks_saved_by_sharing"] - before["num_blocks_saved_by_sharing"]
        ),
        "rollout/preemptions": float(now["num_preemptions"] - before["num_preemptions"]),
        "rollout/prefix_cache_hits": float(now["prefix_cache_hits"] - before["prefix_cache_hits"]),
        # tokens the constraint refused, and samples it let go unconstrained (rollout_engine.constraints)
        "rollout/constraint_vetoes": float(now["constraint_vetoes"] - before["constraint_vetoes"]),
        "rollout/constraint_unmet": float(now["constraint_unmet"] - before["constraint_unmet"]),
        # the mean -log pi(support) of the constrained samples: the gap to the policy that their logprobs,
        # and the trainer, renormalise away
        "rollout/constraint_nats": (now["constraint_support_nats"] - before["constraint_support_nats"])
        / max(now["constraint_supported"] - before["constraint_supported"], 1),
    }


def memory_metrics(engine: Any) -> dict[str, float]:
    """The process's peak resident memory since it started (trainer, engine and all), on a GPU the CUDA
    allocator's peak too, and the engine's KV pool: the most it held (resident pages on the CPU) and what it
    reserved."""
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    stats = engine.stats()
    metrics = {
        "memory/peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30,
        "memory/kv_held_peak_gb": stats["kv_bytes_resident_peak"] / 2**30,
        "memory/kv_reserved_gb": stats["kv_bytes_total"] / 2**30,
    }
    if torch.cuda.is_available():
        metrics["memory/cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return metrics
