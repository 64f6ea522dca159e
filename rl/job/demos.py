"""Demonstrations: an env's ideal first replies to its training tasks as trainer rows, and the seeded sampler
of their batches that the warm start (`rl.job.warm_start`), the GRPO anchor (`sft.anchor_coef`) and guidance
(`rl.job.guidance`) draw from. A demonstration's prompt ends with the env's response prefix, as in
rollouts."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch

from envs.base import BaseEnv, plugin_name
from rl.algo.batch import RolloutBatch, collate_rollouts
from rl.rollout.prompts import prompt_token_ids
from rl.seeding import derive_seed
from rl.settings import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rl.job.parts import Parts


@dataclass(slots=True)
class Demonstration:
    prompt_ids: list[int]  # the chat prompt, ending with the env's response prefix
    completion_ids: list[int]  # the rest of the ideal reply
    group: str  # rows of one group share their prompt prefix


def demonstration_ids(text: str | None, response_prefix: str, tokenizer: Any) -> list[int] | None:
    """The tokens of a demonstration after the env's response prefix (which ends the prompt), or None when
    the demonstration is missing, does not start with the prefix, or adds nothing after it."""
    if not text or not text.startswith(response_prefix) or len(text) == len(response_prefix):
        return None
    return tokenizer.encode(text[len(response_prefix) :], add_special_tokens=False)


def demonstrations(
    env: BaseEnv, tasks: Sequence[Mapping[str, Any]], tokenizer: Any, group_by: str | None = None
) -> list[Demonstration]:
    """One demonstration per task that has one; the env's response prefix ends the prompt, as in rollouts."""
    offered = [(task, env.demonstration(task)) for task in tasks]
    if all(text is None for _, text in offered):
        raise ConfigError(
            f"sft.steps > 0 needs demonstrations, but the env {plugin_name(env)} gives none: it has no "
            "demonstration(task) method of its own, or it returned None for every training task; add one to "
            "the env or set sft.steps=0"
        )
    prefix = env.response_prefix
    demos = []
    for task, text in offered:
        completion = demonstration_ids(text, prefix, tokenizer)
        if completion is None:
            continue
        prompt = prompt_token_ids(tokenizer, env.start(task).messages, prefix)
        group = str(task.get(group_by, "")) if group_by else ""
        demos.append(Demonstration(prompt, completion, group))
    if not demos:
        raise ConfigError(
            "the env gave no usable demonstration for any training task (each must start with the env's "
            "response_prefix and add text after it); set sft.steps=0 to skip the warm start"
        )
    return demos


class DemoSampler:
    """Seeded batches of demonstrations in epochs, each batch from one group.

    Each epoch shuffles every group's demonstrations, cuts each group into batches of about `batch_size`
    (round(n / batch_size) batches of near-equal size, at least one), and shuffles those batches, so every
    demonstration comes once an epoch. A batch depends only on the seed and its draw number, so a resumed run
    draws the same. Under data parallelism every rank takes the same seed and its own share of each epoch's
    batches (`rank`, `world_size`): draw d of rank r is the epoch order's batch d * world_size + r.
    """

    def __init__(
        self,
        demos: Sequence[Demonstration],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        groups: dict[str, list[Demonstration]] = defaultdict(list)
        for demo in demos:
            groups[demo.group].append(demo)
        self.groups = [groups[name] for name in sorted(groups)]
        self.cuts = [max(1, round(len(group) / batch_size)) for group in self.groups]
        self.batches_per_epoch = sum(self.cuts)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.draws = 0
        self._epoch: tuple[int, list[list[Demonstration]]] | None = None

    @property
    def num_demos(self) -> int:
        return sum(map(len, self.groups))

    def next_batch(self) -> list[Demonstration]:
        batch = self.batch_at(self.draws)
        self.draws += 1
        return batch

    def batch_at(self, draw: int) -> list[Demonstration]:
        """This rank's batch number `draw` (from 0)."""
        epoch, index = divmod(draw * self.world_size + self.rank, self.batches_per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._epoch_batches(epoch))
        return self._epoch[1][index]

    def _epoch_batches(self, epoch: int) -> list[list[Demonstration]]:
        rng = random.Random(derive_seed(self.seed, epoch))
        batches = []
        for group, cuts in zip(self.groups, self.cuts, strict=True):
            order = rng.sample(group, len(group))
            bounds = [len(order) * i // cuts for i in range(cuts + 1)]
            batches += [order[start:stop] for start, stop in pairwise(bounds)]
        rng.shuffle(batches)
        return batches


def demo_sampler(parts: Parts, cfg: DictConfig) -> DemoSampler:
    """The job's sampler of demonstrations of its training tasks (the warm start's and the anchor's)."""
    demos = demonstrations(parts.env, parts.train_tasks, parts.tokenizer, cfg.env.shared_prompt_key)
    return DemoSampler(
        demos, cfg.sft.batch_size, seed=cfg.seed, rank=parts.dist.rank, world_size=parts.dist.world_size
    )


def demo_batch(demos: Sequence[Demonstration], pad_token_id: int, weight: float = 1.0) -> RolloutBatch:
    """The demonstrations as trainer rows of advantage `weight` (under `NLL`: weight x their NLL)."""
    return collate_rollouts(
        prompt_ids=[d.prompt_ids for d in demos],
        completion_ids=[d.completion_ids for d in demos],
        completion_logprobs=[[0.0] * len(d.completion_ids) for d in demos],
        advantages=torch.full((len(demos),), float(weight)),
        truncated=[False] * len(demos),
        pad_token_id=pad_token_id,
    )
