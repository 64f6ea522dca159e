"""The value ranges of the config tree, checked once before any work starts.

The schemas in ``rl.config.schema`` fix each key's type at composition; ``check_config`` adds what a type
cannot say (``prompts_per_step`` >= 1, ``top_p`` in (0, 1], a finite temperature ...): the rules each group
owns (its ``RULES``), the keys that do not go together, and a device this machine lacks, so a bad value costs
seconds, not a model load or a first training step. Every bad key is named in one ConfigError, with the range
it accepts.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from envs import plugin_env_config
from rl.algo.optim import lacks_decay
from rl.config.schema import TrainConfig
from rl.job.model_loading import resolve_device
from rl.settings import ConfigError


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is outside its range (each group's RULES: `TrainConfig.problems`), per
    key left at ``???``, and per pair of keys that do not go together."""
    problems = TrainConfig.problems(cfg)
    problems += [  # a value an option leaves to the user (a data root: env=spider, transfer=spider_heldout)
        f"{key}=???: this setting has no default; set it on the command line ({key}=...)"
        for key in _missing_keys(OmegaConf.to_container(cfg, resolve=False))
    ]
    problems += _transfer_problems(cfg.transfer)
    problems += _schedule_problems(cfg)
    if cfg.algo.group_size > cfg.rollout.max_num_seqs:
        problems.append(
            f"algo.group_size={cfg.algo.group_size!r}: use at most rollout.max_num_seqs="
            f"{cfg.rollout.max_num_seqs} (the engine runs the samples of a group together), or raise that"
        )
    if cfg.mode.value == "serve" and cfg.rollout.placement.value != "inprocess":
        problems.append(
            f"rollout.placement={cfg.rollout.placement.value}: mode=serve steps the engine from the server's "
            "own thread, so the engine must live in its process; use rollout.placement=inprocess"
        )
    if cfg.eval.samples > cfg.rollout.max_num_seqs:
        problems.append(
            f"eval.samples={cfg.eval.samples!r}: use at most rollout.max_num_seqs={cfg.rollout.max_num_seqs} "
            "(a task's samples are one request, run together), or raise that"
        )
    if cfg.curriculum.group_by and not cfg.curriculum.enabled:
        problems.append(
            f"curriculum.group_by={cfg.curriculum.group_by}: it shapes the curriculum's draws, which "
            "curriculum.enabled=false turns off; set curriculum.enabled=true, or curriculum.group_by=null"
        )
    if cfg.curriculum.screen_tasks and not cfg.curriculum.enabled:
        problems.append(
            f"curriculum.screen_tasks={cfg.curriculum.screen_tasks}: the screen's outcomes are the "
            "curriculum's first records, which curriculum.enabled=false turns off; set "
            "curriculum.enabled=true, or curriculum.screen_tasks=0"
        )
    return problems


def _missing_keys(tree: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose value is ``???`` (read unresolved: run_dir is Hydra's until the run starts)."""
    if isinstance(tree, dict):
        return [k for key, value in tree.items() for k in _missing_keys(value, f"{prefix}{key}.")]
    return [prefix[:-1]] if tree == "???" else []


def _transfer_problems(transfer: DictConfig) -> list[str]:
    """A transfer set's task source needs a `_target_`."""
    if not transfer.tasks or "_target_" in transfer.tasks:
        return []
    return [
        "transfer.tasks has no _target_: choose a transfer set (transfer=spider_heldout) or set "
        "transfer.tasks._target_ to a function returning a DatasetDict(train, test)"
    ]


def _schedule_problems(cfg: DictConfig) -> list[str]:
    """A cosine schedule decays over the steps after its warmup, so it needs some."""
    problems = []
    for group, steps, steps_key in (
        ("trainer", cfg.num_steps * cfg.algo.num_iterations, "num_steps x algo.num_iterations"),
        ("sft", cfg.sft.steps, "sft.steps"),
    ):
        warmup = cfg[group].warmup_steps
        if lacks_decay(cfg[group].lr_schedule.value, warmup, steps):
            problems.append(
                f"{group}.warmup_steps={warmup}: a cosine schedule decays after its warmup, but {steps_key} "
                f"gives {steps} steps in all; use fewer warmup steps or {group}.lr_schedule=constant"
            )
    return problems


def check_plugin_choice(env: DictConfig) -> None:
    """Refuse ``env=plugin env.name=NAME`` without a task source when the plugin NAME ships its own config
    (its task source, eval settings and recipe): ``env=NAME`` is how it runs."""
    if OmegaConf.is_missing(env, "name") or not OmegaConf.is_missing(env.tasks, "_target_"):
        return
    config = plugin_env_config(env.name)
    if config is not None:
        raise ConfigError(
            f"the env plugin {env.name!r} ships its own config ({config}: its task source and recipe); "
            f"run it with `python train.py env={env.name}` instead of env=plugin env.name={env.name}"
        )


def check_config(cfg: DictConfig) -> None:
    """Refuse a config that picks a plugin past its own config, or has any value out of range (ConfigError),
    or a model.device this machine lacks (ModelLoadError)."""
    check_plugin_choice(cfg.env)
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("config values out of range:\n  " + "\n  ".join(problems))
    resolve_device(cfg.model.device)
