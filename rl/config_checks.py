"""The value ranges of the config tree, checked once before any work starts.

The schemas in ``rl.config`` fix each key's type at composition; ``check_config`` adds what a type cannot
say (``prompts_per_step`` >= 1, ``top_p`` in (0, 1], a finite temperature ...) and refuses a device this
machine lacks, so a bad value costs seconds, not a model load or a first training step. Every bad key is
named in one ValueError, with the range it accepts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl.models import resolve_device

Rule = tuple[str, Callable[[Any], bool], str]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: _number(v) and low <= v < math.inf


def _positive(v: Any) -> bool:
    return _number(v) and 0 < v < math.inf


def _fraction(v: Any) -> bool:  # in (0, 1]
    return _number(v) and 0 < v <= 1


def _optional(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or rule(v)


RULES: tuple[Rule, ...] = (
    ("num_steps", _at_least(1), "an integer >= 1"),
    ("prompts_per_step", _at_least(1), "an integer >= 1"),
    ("eval_every", _at_least(0), "an integer >= 0 (0: evaluate only before and after training)"),
    ("checkpoint_every", _at_least(0), "an integer >= 0 (0: no checkpoints)"),
    ("keep_checkpoints", _at_least(1), "an integer >= 1"),
    ("rollout.memory_fraction", _fraction, "a fraction in (0, 1]"),
    ("rollout.memory_budget_bytes", _optional(_at_least(1)), "a number of bytes >= 1, or null (system RAM)"),
    ("rollout.block_size", _at_least(1), "an integer >= 1 (tokens per KV block)"),
    ("rollout.max_num_seqs", _at_least(1), "an integer >= 1"),
    ("rollout.max_num_batched_tokens", _at_least(1), "an integer >= 1"),
    ("rollout.max_model_len", _optional(_at_least(1)), "an integer >= 1, or null (the model's own)"),
    ("rollout.temperature", _positive, "a finite number > 0 (GRPO samples a group of different answers)"),
    ("rollout.top_p", _fraction, "a fraction in (0, 1] (1 disables it)"),
    ("rollout.top_k", lambda v: v == -1 or _at_least(1)(v), "-1 (disabled) or an integer >= 1"),
    ("rollout.max_tokens", _at_least(1), "an integer >= 1 (tokens per turn)"),
    ("rollout.max_completion_tokens", _at_least(1), "an integer >= 1 (tokens per episode)"),
    ("rollout.sync_bucket_mb", _at_least(1), "an integer >= 1"),
    ("algo.group_size", _at_least(2), "an integer >= 2 (GRPO compares the samples of a group)"),
    ("algo.eps_low", lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("algo.eps_high", _at_least(0), "a finite number >= 0"),
    ("algo.dual_clip_c", _optional(lambda v: _number(v) and 1 < v < math.inf), "a number > 1, or null"),
    ("algo.beta", _at_least(0), "a finite number >= 0"),
    ("algo.num_iterations", _at_least(1), "an integer >= 1"),
    ("algo.is_cap", _positive, "a finite number > 0"),
    ("env.eval_tasks", _at_least(1), "an integer >= 1"),
    ("env.step_timeout_s", _positive, "a finite number of seconds > 0"),
    ("lora.rank", _at_least(1), "an integer >= 1"),
    ("lora.alpha", _positive, "a finite number > 0"),
    ("lora.dropout", lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("trainer.lr", _positive, "a finite number > 0"),
    ("trainer.weight_decay", _at_least(0), "a finite number >= 0"),
    ("trainer.warmup_steps", _at_least(0), "an integer >= 0"),
    ("trainer.max_grad_norm", _positive, "a finite number > 0"),
    ("trainer.micro_batch_size", _at_least(1), "an integer >= 1"),
    ("sft.steps", _at_least(0), "an integer >= 0 (0: no warm start)"),
    ("sft.batch_size", _at_least(1), "an integer >= 1"),
    ("sft.lr", _positive, "a finite number > 0"),
    ("curriculum.prior_strength", _at_least(0), "a finite number >= 0"),
    ("curriculum.min_attempts", _at_least(1), "an integer >= 1"),
    ("logger.samples_every", _at_least(1), "an integer >= 1"),
)


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is outside its range (see RULES)."""
    problems = []
    for key, ok, accepted in RULES:
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            problems.append(f"{key}={value!r}: use {accepted}")
    return problems


def check_config(cfg: DictConfig) -> None:
    """Refuse a config with any value out of range, or a model.device this machine lacks (ModelLoadError)."""
    problems = config_problems(cfg)
    if problems:
        raise ValueError("config values out of range:\n  " + "\n  ".join(problems))
    resolve_device(cfg.model.device)
