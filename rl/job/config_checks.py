"""The value ranges of the config tree, checked once before any work starts.

The schemas in ``rl.job.config`` fix each key's type at composition; ``check_config`` adds what a type cannot
say (``prompts_per_step`` >= 1, ``top_p`` in (0, 1], a finite temperature ...) and refuses a device this
machine lacks, so a bad value costs seconds, not a model load or a first training step. Every bad key is
named in one ConfigError, with the range it accepts.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from envs import plugin_env_config
from rl.algo.losses import LOSS_RULES, combination_problems
from rl.job.model_loading import resolve_device
from rl.settings import ConfigError, Rule, at_least, fraction, number, optional, positive, rule_problems
from rl.sync.adapter import PROJECTIONS, TARGET_SHORTHANDS, resolve_target_modules


def _lora_targets(value: str) -> bool:
    try:
        resolve_target_modules(value)
    except ConfigError:
        return False
    return True


RULES: tuple[Rule, ...] = (
    (
        "num_steps",
        at_least(0),
        "use an integer >= 0 (0: the stages before GRPO alone, as an SFT-only control)",
    ),
    ("prompts_per_step", at_least(1), "use an integer >= 1"),
    ("eval_every", at_least(0), "use an integer >= 0 (0: evaluate only before and after training)"),
    ("checkpoint_every", at_least(0), "use an integer >= 0 (0: no checkpoints)"),
    ("keep_checkpoints", at_least(1), "use an integer >= 1"),
    ("rollout.memory_fraction", fraction, "use a fraction in (0, 1]"),
    (
        "rollout.memory_budget_bytes",
        optional(at_least(1)),
        "use a number of bytes >= 1, or null (system RAM)",
    ),
    ("rollout.block_size", at_least(1), "use an integer >= 1 (tokens per KV block)"),
    ("rollout.max_num_seqs", at_least(1), "use an integer >= 1"),
    ("rollout.max_num_batched_tokens", at_least(1), "use an integer >= 1"),
    ("rollout.max_model_len", optional(at_least(1)), "use an integer >= 1, or null (the model's own)"),
    ("rollout.temperature", positive, "use a finite number > 0 (GRPO samples a group of different answers)"),
    ("rollout.top_p", fraction, "use a fraction in (0, 1] (1 disables it)"),
    ("rollout.top_k", lambda v: v == -1 or at_least(1)(v), "use -1 (disabled) or an integer >= 1"),
    ("rollout.max_tokens", at_least(1), "use an integer >= 1 (tokens per turn)"),
    ("rollout.max_completion_tokens", at_least(1), "use an integer >= 1 (tokens per episode)"),
    ("rollout.sync_bucket_mb", at_least(1), "use an integer >= 1"),
    ("algo.group_size", at_least(2), "use an integer >= 2 (GRPO compares the samples of a group)"),
    ("env.eval_tasks", at_least(1), "use an integer >= 1"),
    ("env.step_timeout_s", positive, "use a finite number of seconds > 0"),
    ("transfer.eval_tasks", at_least(1), "use an integer >= 1"),
    (
        "lora.target_modules",
        _lora_targets,
        f"use one of {sorted(TARGET_SHORTHANDS)} or comma-separated names from {list(PROJECTIONS)}",
    ),
    ("lora.rank", at_least(1), "use an integer >= 1"),
    ("lora.alpha", positive, "use a finite number > 0"),
    ("lora.dropout", lambda v: number(v) and 0 <= v < 1, "use a number in [0, 1)"),
    ("trainer.lr", positive, "use a finite number > 0"),
    ("trainer.weight_decay", at_least(0), "use a finite number >= 0"),
    ("trainer.warmup_steps", at_least(0), "use an integer >= 0"),
    ("trainer.max_grad_norm", positive, "use a finite number > 0"),
    ("trainer.micro_batch_size", at_least(1), "use an integer >= 1"),
    ("sft.steps", at_least(0), "use an integer >= 0 (0: no warm start)"),
    ("sft.batch_size", at_least(1), "use an integer >= 1"),
    ("sft.lr", positive, "use a finite number > 0"),
    ("curriculum.prior_strength", at_least(0), "use a finite number >= 0"),
    ("curriculum.min_attempts", at_least(1), "use an integer >= 1"),
    ("logger.samples_every", at_least(1), "use an integer >= 1"),
    ("eval.samples", at_least(0), "use an integer >= 0 (0: greedy accuracy alone; K: pass@k from K samples)"),
    (
        "serve.port",
        lambda v: at_least(0)(v) and v <= 65535,
        "use a port in [0, 65535] (0: any free port)",
    ),
)


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is outside its range (RULES, and `rl.algo.losses.LOSS_RULES` for algo)."""
    problems = rule_problems(RULES, cfg) + rule_problems(LOSS_RULES, cfg.algo, prefix="algo.")
    problems += combination_problems(cfg.algo, prefix="algo.")
    problems += [  # a value an option leaves to the user (a data root: env=spider, transfer=spider)
        f"{key}=???: this setting has no default; set it on the command line ({key}=...)"
        for key in _missing_keys(OmegaConf.to_container(cfg, resolve=False))
    ]
    problems += _transfer_problems(cfg.transfer)
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
        "transfer.tasks has no _target_: choose a transfer set (transfer=spider) or set "
        "transfer.tasks._target_ to a function returning a DatasetDict(train, test)"
    ]


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
