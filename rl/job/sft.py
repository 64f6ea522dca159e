"""Supervised warm start: train the LoRA adapter on an env's demonstrations before GRPO.

An env that can say what an ideal first reply to a task is (``env.demonstration(task)``, e.g. the gold SQL in
its fence) gives a supervised stage in the same job, on the same adapter. Small models often score so
rarely that every GRPO group has zero reward variance; a short warm start on the training split gives GRPO a
policy that already succeeds sometimes, and RL does the rest.

The step reuses the trainer's micro-batching: on a demonstration with advantage 1 and the ratio at 1 (no old
logprobs), the clipped policy loss has exactly the gradient of the per-sequence mean negative log-likelihood.
Rows that share a prompt prefix (tasks on one database schema) are batched together, so the trainer runs
that prefix once per batch.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envs.base import Env, plugin_name, with_defaults
from rl.algo.batch import RolloutBatch, collate_rollouts
from rl.algo.trainer import NLL, accumulate_gradients, mean_sequence_nll, model_device, optimizer_step
from rl.job.play import prompt_token_ids
from rl.settings import ConfigError


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
    env: Env, tasks: Sequence[Mapping[str, Any]], tokenizer: Any, group_by: str | None = None
) -> list[Demonstration]:
    """One demonstration per task that has one; the env's response prefix ends the prompt, as in rollouts."""
    env = with_defaults(env)
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
    """Seeded batches of demonstrations, each drawn from one group (a group is picked by its size)."""

    def __init__(self, demos: Sequence[Demonstration], batch_size: int, seed: int = 0) -> None:
        self.groups: dict[str, list[Demonstration]] = defaultdict(list)
        for demo in demos:
            self.groups[demo.group].append(demo)
        self.batch_size = batch_size
        self.seed = seed
        self._rng = random.Random(seed)

    def next_batch(self) -> list[Demonstration]:
        return self._draw(self._rng)

    def batch_at(self, draw: int) -> list[Demonstration]:
        """A batch that depends on the seed and `draw` alone, so a resumed run draws the same."""
        return self._draw(random.Random(self.seed * 1_000_003 + draw))

    def _draw(self, rng: random.Random) -> list[Demonstration]:
        names = sorted(self.groups)
        name = rng.choices(names, weights=[len(self.groups[n]) for n in names])[0]
        pool = self.groups[name]
        return rng.sample(pool, min(self.batch_size, len(pool)))


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


def sft_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    demos: Sequence[Demonstration],
    pad_token_id: int,
    micro_batch_size: int = 8,
    max_grad_norm: float | None = 1.0,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, float]:
    """One optimizer step on the per-sequence mean NLL of ``demos`` (then one of ``scheduler``, when given);
    returns its metrics."""
    batch = demo_batch(demos, pad_token_id)
    logprobs = torch.zeros(batch.input_ids.shape, device=model_device(model))
    stats = accumulate_gradients(
        model, batch, NLL, micro_batch_size=micro_batch_size, record_logprobs=logprobs
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stepped, grad_norm, lr = optimizer_step(optimizer, scheduler, params, max_grad_norm, stats.loss)
    return {
        "sft/nll": mean_sequence_nll(batch, logprobs),
        "sft/grad_norm": grad_norm,
        "sft/lr": lr,
        "sft/num_tokens": int(batch.loss_mask.sum().item()),
        "sft/skipped": float(not stepped),
    }


def warm_start(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: DemoSampler,
    num_steps: int,
    pad_token_id: int,
    micro_batch_size: int,
    max_grad_norm: float | None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> list[dict[str, float]]:
    """``num_steps`` supervised steps; ``on_step(step, metrics)`` sees each (1-based) as it ends."""
    history = []
    for step in range(1, num_steps + 1):
        metrics = sft_step(
            model, optimizer, sampler.next_batch(), pad_token_id, micro_batch_size, max_grad_norm, scheduler
        )
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    return history
