"""The run's parts, built from the config: the policy (the model with its LoRA adapter), the engine that
samples it (colocated, or in a rollout-worker process; either one a `RolloutEngine`), the environment, and the
task splits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from datasets import Dataset
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from envs import BaseEnv, make_env
from envs.tasks import call_task_source, task_splits
from rl.eval.eval_sets import EvalSet, held_out_tasks, transfer_set
from rl.job import distributed as dp
from rl.job.checkpoint import load_checkpoint
from rl.job.model_loading import load_model
from rl.job.rollout_worker import DistributedSync, RemoteEngine, build_worker
from rl.settings import ConfigError
from rl.sync.adapter import add_lora, lora_tensors
from rollout_engine import GroupResult, LLMEngine, SamplingParams
from rollout_engine.sync_contract import SyncStats

# The adapter versions a run pushes into its engine, each above the last: the model's as built (0), a
# checkpoint's (1: checkpoint=...), after warm-start step s 1 + s (pushed at its evaluation points and its
# end), and after GRPO step n 1 + sft.steps + n.
CHECKPOINT_VERSION = 1


def warm_start_version(step: int) -> int:
    """The adapter version after warm-start step `step`."""
    return CHECKPOINT_VERSION + step


def grpo_version(step: int, sft_steps: int) -> int:
    """The adapter version after GRPO step `step` of a run with `sft_steps` warm-start steps (0: what GRPO
    starts from)."""
    return warm_start_version(sft_steps) + step


class RolloutEngine(Protocol):
    """What the job asks of an engine, colocated (`LLMEngine`) or in a rollout worker (`RemoteEngine`)."""

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        params: SamplingParams,
        *,
        on_finished: Callable[[int], None] | None = None,
    ) -> list[GroupResult]:
        """One GroupResult of params.n samples per prompt; ``on_finished(i)`` hears of prompt i's end."""

    def stats(self) -> dict[str, int | list[int]]:
        """Block, cache and memory counters (LLMEngine.stats)."""

    def update_lora(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> SyncStats:
        """Load new LoRA weights, all checked before any is written, and adopt `version` (above the last)."""

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (the KV of prompts no later step shares)."""


@dataclass
class Parts:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    engine: RolloutEngine
    env: BaseEnv
    train_tasks: Dataset
    test_tasks: Dataset
    train_model: torch.nn.Module  # what train_step runs: the model, wrapped in DDP under torchrun
    dist: dp.DistInfo = dp.SINGLE_PROCESS
    transfer: EvalSet | None = None  # transfer=...: a second held-out set, from another task source


def build_engine(
    model, tokenizer, cfg: DictConfig, model_kwargs: dict, lora_kwargs: dict, dist: dp.DistInfo
) -> RolloutEngine:
    """The engine over the model's adapter as it starts (version 0): colocated, or in a rollout worker."""
    r = cfg.rollout
    engine_kwargs = dict(
        block_size=r.block_size,
        memory_fraction=r.memory_fraction,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        memory_budget_bytes=dp.engine_memory_budget(
            r.memory_budget_bytes, dist.device, dist.local_world_size
        ),
        max_model_len=r.max_model_len,
        enforce_eager=r.enforce_eager,
    )
    if dist.is_distributed and r.placement.value != "inprocess":
        raise ConfigError(
            "under torchrun each rank colocates its engine with its trainer: drop rollout.placement=process "
            "(use rollout.placement=inprocess)"
        )
    if r.placement.value == "inprocess":
        try:
            engine = LLMEngine(model, tokenizer, **engine_kwargs)
        except ValueError as err:  # the engine refuses its arguments, which are the rollout.* settings
            raise ConfigError(
                f"the rollout engine cannot start with these rollout.* settings: {err}"
            ) from err
        return engine  # built from the model, it holds the adapter as it starts
    sync = DistributedSync(
        build_worker,
        factory_args=(model_kwargs, lora_kwargs, engine_kwargs),
        bucket_bytes=r.sync_bucket_mb << 20,
    )
    engine = RemoteEngine(sync)
    engine.update_lora(lora_tensors(model), version=0)  # the worker's own adapter starts elsewhere
    return engine


def model_settings(cfg: DictConfig, dist: dp.DistInfo) -> tuple[dict, dict]:
    """The arguments of `load_model` and of `add_lora`."""
    model_kwargs = dict(
        name=cfg.model.name.value,
        path=cfg.model.path,
        dtype=cfg.model.dtype.value,
        device=dist.device if dist.is_distributed else cfg.model.device,
        seed=cfg.model.seed,
    )
    lora_kwargs = dict(
        rank=cfg.lora.rank,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        use_rslora=cfg.lora.use_rslora,
    )
    return model_kwargs, lora_kwargs


def build_policy(cfg: DictConfig, dist: dp.DistInfo, *, adapter: bool = True):
    """The model with its LoRA adapter, its tokenizer, and the engine that samples it. adapter=False: the
    base model alone, whose engine (in this process) runs no LoRA in its forward."""
    model_kwargs, lora_kwargs = model_settings(cfg, dist)
    model, tokenizer = load_model(**model_kwargs)
    if adapter:
        model = add_lora(model, **lora_kwargs)
    engine = build_engine(model, tokenizer, cfg, model_kwargs, lora_kwargs, dist)
    return model, tokenizer, engine


def load_policy_checkpoint(cfg: DictConfig, model, engine: RolloutEngine) -> int:
    """cfg.checkpoint's adapter (its weights alone) into the model and the engine; returns its step."""
    step = load_checkpoint(cfg.checkpoint, model, restore_rng=False).step
    engine.update_lora(lora_tensors(model), version=CHECKPOINT_VERSION)
    return step


def build_parts(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> Parts:
    """Every part of a run: the policy and its engine, DDP's wrapper under torchrun, the env, its training
    tasks, the held-out set and the transfer set (when transfer=... names one)."""
    model, tokenizer, engine = build_policy(cfg, dist)
    train_model = dp.wrap_model(model, dist)
    env = make_env(cfg.env.name, **cfg.env.args)
    tasks = task_splits(call_task_source(cfg.env.tasks), env, cfg.env.tasks.get("_target_"), cfg.seed)
    test_tasks = held_out_tasks(tasks["test"], cfg.env.eval_tasks, cfg.env.eval_seed)
    t, transfer = cfg.transfer, None
    if t.tasks:  # transfer=...: a second held-out set, from another task source
        source = t.tasks.get("_target_")
        transfer = transfer_set(call_task_source(t.tasks), env, source, t.eval_tasks, t.eval_seed, t.labels)
    return Parts(model, tokenizer, engine, env, tasks["train"], test_tasks, train_model, dist, transfer)
