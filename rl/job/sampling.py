"""How the job samples: a GRPO group's SamplingParams at the rollout.* settings, seeded by the run's seed, the
step, the dynamic-sampling round and the rank, for the GRPO step and the sampled evaluations alike."""

from __future__ import annotations

from omegaconf import DictConfig

from rl.seeding import derive_seed
from rollout_engine import SamplingParams


def sampling_params(cfg: DictConfig, env, step: int, round_: int = 0, rank: int = 0) -> SamplingParams:
    """A GRPO group's sampling: n=G at the rollout.* settings, seeded by the step, the round and the rank."""
    r = cfg.rollout
    return SamplingParams(
        n=cfg.algo.group_size,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        seed=derive_seed(cfg.seed, step * 7919 + round_ + rank * 1_000_000_007),
        stop=list(env.stop) or None,
    )
