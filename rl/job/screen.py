"""The curriculum's screen before GRPO's first step (curriculum.screen_tasks > 0): a seeded draw of training
tasks, each sampled curriculum.screen_samples times by the policy GRPO starts from; the outcomes become the
tasks' first records and their pools' rates, and the tasks every sample solved or none did are dropped
(`rl.tasks.curriculum.Curriculum.screen`). A step's groups then go to tasks whose samples differ, the only
ones with a policy gradient. It costs screen_tasks x screen_samples samples, played as many at a time as a
GRPO step plays."""

from __future__ import annotations

from dataclasses import replace

import torch
from omegaconf import DictConfig

from envs import start_episodes, step_episodes
from rl.job import distributed as dp
from rl.job.parts import Parts
from rl.job.sampling import sampling_params
from rl.report.metrics import StepTimer
from rl.rollout.play import group_outcomes, play_groups
from rl.seeding import derive_seed
from rl.tasks.curriculum import Curriculum

SCREEN_DRAW = 999_983  # the seed index of the screen's draw of tasks (below rl.seeding.SEED_STRIDE)


def screen_tasks(parts: Parts, cfg: DictConfig, curriculum: Curriculum, timer: StepTimer) -> dict[str, float]:
    """Sample the screen's tasks (this rank plays every world_size-th), record every rank's outcomes in the
    curriculum, drop the settled tasks, and return what it found: curriculum/screen_* counts and seconds
    (the timer's "screen" phase)."""
    with timer("screen"):
        solved, hopeless, screened = _screen(parts, cfg, curriculum)
    return {
        "curriculum/screen_tasks": float(screened),
        "curriculum/screen_solved": float(solved),
        "curriculum/screen_hopeless": float(hopeless),
        "curriculum/screen_kept": float(screened - solved - hopeless),
        "curriculum/screen_seconds": timer.last("screen"),
    }


def _screen(parts: Parts, cfg: DictConfig, curriculum: Curriculum) -> tuple[int, int, int]:
    """(solved, hopeless, screened) tasks of the screen, its outcomes recorded in the curriculum."""
    c, env = cfg.curriculum, parts.env
    generator = torch.Generator().manual_seed(derive_seed(cfg.seed, SCREEN_DRAW))
    order = torch.randperm(len(parts.train_tasks), generator=generator)[: c.screen_tasks].tolist()
    mine = dp.shard([parts.train_tasks[i] for i in order], parts.dist)
    per_call = max(1, cfg.prompts_per_step * cfg.algo.group_size // c.screen_samples)
    outcomes = []
    for round_, start in enumerate(range(0, len(mine), per_call)):
        tasks = mine[start : start + per_call]
        played = play_groups(
            parts.engine,
            parts.tokenizer,
            [start_episodes(env, [task] * c.screen_samples) for task in tasks],
            replace(sampling_params(cfg, env, 0, round_, parts.dist.rank), n=c.screen_samples),
            lambda episodes, actions: step_episodes(episodes, actions, timeout_s=cfg.env.step_timeout_s),
            cfg.rollout.max_completion_tokens,
            response_prefix=env.response_prefix,
        )
        outcomes += group_outcomes(env, tasks, played)
    everyone = [outcome for rank in dp.gather_objects(outcomes, parts.dist) for outcome in rank]
    return (*curriculum.screen(everyone), len(everyone))
