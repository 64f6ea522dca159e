"""pagedrl: GRPO post-training with a colocated paged rollout engine.

    python train.py [group=option ...] [key=value ...]      (Hydra; see conf/train.yaml)
    torchrun --nproc-per-node N train.py [overrides ...]     (data parallel: one rank per GPU, gloo on CPU)

Under torchrun each rank colocates its own trainer and engine on its own device (cuda:LOCAL_RANK). Every
rank walks the same task stream; prompts_per_step is per rank (like TRL's per-device batch), so a step
trains on prompts_per_step x N groups. LoRA gradients are all-reduced (DDP), each rank hot-syncs the
identical weights into its own engine, the held-out set is sharded over the ranks, and rank 0 alone logs
(metrics combined over the ranks) and checkpoints. On CPU the ranks of a node split the engine's RAM budget.

Reads top to bottom: build the parts from the config, evaluate, then each step sample GRPO groups with the
engine, play them against the environment, turn rewards into advantages, take an optimisation step on the LoRA
weights, hot-sync them into the engine, log, checkpoint and evaluate.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import dataclass, replace
from functools import partial

import hydra
import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from envs import BaseEnv, EnvError, make_env, start_episodes, step_episodes
from envs.tasks import call_task_source, task_splits
from rl.algo.advantages import compute_advantages, filter_zero_std_groups
from rl.algo.optim import build_lr_scheduler, build_optimizer
from rl.algo.trainer import train_step
from rl.job import distributed as dp
from rl.job.checkpoint import (
    RunDirError,
    check_checkpoint,
    check_run_dir,
    find_latest,
    load_checkpoint,
    save_checkpoint,
)
from rl.job.config import register_configs
from rl.job.config_checks import check_config
from rl.job.curriculum import Curriculum
from rl.job.data import TaskStream
from rl.job.eval_sets import HELD_OUT, EvalSet, held_out_tasks, score_eval_set, score_samples, transfer_set
from rl.job.evaluate import EvalResult, play_eval, succeeded
from rl.job.export import export_checkpoint
from rl.job.logger import ProgressBars, RunLogger, SampleRow
from rl.job.loop_metrics import (
    StepTimer,
    combine_rank_metrics,
    engine_metrics,
    memory_metrics,
    reward_metrics,
)
from rl.job.model_loading import ModelLoadError, load_model
from rl.job.pass_at_k import PassAtK, play_samples
from rl.job.play import group_rewards, play_groups, to_rollout_batch
from rl.job.remote_engine import RemoteEngine, build_worker
from rl.job.sft import DemoSampler, demonstrations, warm_start
from rl.job.summary import EvalPoint, run_summary, summary_text, write_summary
from rl.settings import ConfigError
from rl.sync.adapter import add_lora, lora_tensors
from rl.sync.transport import DistributedSync, InProcessSync
from rollout_engine import LLMEngine, SamplingParams
from serve import build_app, listen, run_server

register_configs()
# what the user can fix: printed as one line; any other exception is a bug and keeps its traceback
USER_ERRORS = (ConfigError, ModelLoadError, EnvError, FileNotFoundError, RunDirError)
# DAPO dynamic sampling: rounds of fresh prompts that may replace the groups whose rewards are all equal
DYNAMIC_SAMPLING_ROUNDS = 4


@dataclass
class Parts:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    engine: LLMEngine | RemoteEngine
    sync: InProcessSync | DistributedSync
    env: BaseEnv
    train_tasks: Dataset
    test_tasks: Dataset
    train_model: torch.nn.Module  # what train_step runs: the model, wrapped in DDP under torchrun
    dist: dp.DistInfo = dp.SINGLE_PROCESS
    transfer: EvalSet | None = None  # transfer=...: a second held-out set, from another task source


def build_engine(model, tokenizer, cfg: DictConfig, model_kwargs: dict, lora_kwargs: dict, dist: dp.DistInfo):
    """The engine and the transport that hot-syncs LoRA weights into it (colocated, or in a worker)."""
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
        return engine, InProcessSync(engine)
    sync = DistributedSync(
        build_worker,
        factory_args=(model_kwargs, lora_kwargs, engine_kwargs),
        bucket_bytes=r.sync_bucket_mb << 20,
    )
    return RemoteEngine(sync), sync


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


def build_policy(cfg: DictConfig, dist: dp.DistInfo):
    """The model with its LoRA adapter, its tokenizer, and the engine with the transport that syncs the
    adapter into it (the adapter as it starts: version 0)."""
    model_kwargs, lora_kwargs = model_settings(cfg, dist)
    model, tokenizer = load_model(**model_kwargs)
    model = add_lora(model, **lora_kwargs)
    engine, sync = build_engine(model, tokenizer, cfg, model_kwargs, lora_kwargs, dist)
    sync.push(lora_tensors(model), version=0)
    return model, tokenizer, engine, sync


def load_policy_checkpoint(cfg: DictConfig, model, sync) -> int:
    """cfg.checkpoint's adapter into the model and through the sync into the engine; returns its step."""
    step = load_checkpoint(cfg.checkpoint, model, restore_rng=False).step
    sync.push(lora_tensors(model), version=1)
    return step


def build_parts(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> Parts:
    model, tokenizer, engine, sync = build_policy(cfg, dist)
    train_model = dp.wrap_model(model, dist)
    env = make_env(cfg.env.name, **cfg.env.args)
    tasks = task_splits(call_task_source(cfg.env.tasks), env, cfg.env.tasks.get("_target_"), cfg.seed)
    test_tasks = held_out_tasks(tasks["test"], cfg.env.eval_tasks, cfg.env.eval_seed)
    t, transfer = cfg.transfer, None
    if t.tasks:  # transfer=...: a second held-out set, from another task source
        source = t.tasks.get("_target_")
        transfer = transfer_set(call_task_source(t.tasks), env, source, t.eval_tasks, t.eval_seed, t.labels)
    return Parts(model, tokenizer, engine, sync, env, tasks["train"], test_tasks, train_model, dist, transfer)


def sampling_params(cfg: DictConfig, env, step: int, round_: int = 0, rank: int = 0) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        n=cfg.algo.group_size,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        seed=cfg.seed * 1_000_003 + step * 7919 + round_ + rank * 1_000_000_007,
        stop=list(env.stop) or None,
    )


def set_player(parts: Parts, cfg: DictConfig, play_fn, labels, **params):
    """`play_fn` (play_eval, play_samples) bound to everything but the tasks of a rank's shard of a set."""
    return partial(
        play_fn,
        parts.engine,
        parts.tokenizer,
        parts.env,
        step_fn=partial(step_episodes, timeout_s=cfg.env.step_timeout_s),
        start_fn=start_episodes,
        max_completion_tokens=cfg.rollout.max_completion_tokens,
        labels=labels,
        **params,
    )


def with_progress(play, bars: ProgressBars, desc: str):
    """`play` (a shard's tasks -> their records) drawing a bar that counts the shard's tasks as they end."""

    def played(tasks):
        with bars.bar(desc, len(tasks), "task") as bar:
            return play(tasks, on_done=bar.update)

    return played


def eval_desc(eval_set: EvalSet, stage: str, step: int, what: str = "eval") -> str:
    """What a progress bar of an evaluation says: the set, and the model it scores."""
    model = {
        "base": "base model",
        "sft": f"after {step} warm-start steps",
        "grpo": f"GRPO step {step}",
        "checkpoint": f"checkpoint step {step}",
    }[stage]
    return f"{eval_set.name.replace('_', '-')} {what}, {model}"


def run_eval(
    parts: Parts, cfg: DictConfig, eval_set: EvalSet, stage: str, step: int, bars: ProgressBars
) -> EvalResult:
    """Score `eval_set` greedily, sharded over the ranks; its outcomes go to RUN_DIR/evals/."""
    greedy = SamplingParams(
        n=1,
        temperature=0.0,
        max_tokens=cfg.rollout.max_tokens,
        stop=list(parts.env.stop) or None,
    )
    play = set_player(parts, cfg, play_eval, eval_set.labels, greedy_params=greedy)
    play = with_progress(play, bars, eval_desc(eval_set, stage, step))
    return score_eval_set(play, eval_set, parts.dist, cfg.run_dir, stage, step)


def run_pass_at_k(
    parts: Parts, cfg: DictConfig, eval_set: EvalSet, stage: str, step: int, bars: ProgressBars
) -> PassAtK:
    """pass@k of `eval_set` from eval.samples samples per task, drawn as GRPO groups are (one request with
    n=K per task, at the rollout's sampling settings); the per-task counts go to RUN_DIR/evals/."""
    params = replace(sampling_params(cfg, parts.env, step, rank=parts.dist.rank), n=cfg.eval.samples)
    play = set_player(parts, cfg, play_samples, eval_set.labels, params=params)
    play = with_progress(play, bars, eval_desc(eval_set, stage, step, f"pass@{cfg.eval.samples}"))
    return score_samples(play, eval_set, cfg.eval.samples, parts.dist, cfg.run_dir, stage, step)


def eval_point(
    parts: Parts, cfg: DictConfig, stage: str, step: int, bars: ProgressBars, transfer: bool = False
) -> EvalPoint:
    """The held-out set's evaluation, and with `transfer` the transfer set's too (when there is one)."""
    held_out = EvalSet(HELD_OUT, parts.test_tasks, cfg.env.eval_labels)
    on_transfer = transfer and parts.transfer is not None
    return EvalPoint(
        stage,
        step,
        run_eval(parts, cfg, held_out, stage, step, bars),
        run_eval(parts, cfg, parts.transfer, stage, step, bars) if on_transfer else None,
    )


def collect_groups(parts: Parts, cfg: DictConfig, stream, step: int, timer: StepTimer):
    """Play prompts_per_step GRPO groups. With DAPO dynamic sampling, groups whose rewards are all equal carry
    no advantage signal: they are dropped and fresh prompts replace them (up to DYNAMIC_SAMPLING_ROUNDS
    rounds; when none is kept, the last round's groups are used). A curriculum hears every played group's
    successes (from all ranks)."""

    def timed_env_step(episodes, actions):
        with timer("env"):
            return step_episodes(episodes, actions, timeout_s=cfg.env.step_timeout_s)

    kept = []
    for round_ in range(DYNAMIC_SAMPLING_ROUNDS if cfg.algo.dynamic_sampling else 1):
        tasks = dp.next_shard(stream, cfg.prompts_per_step - len(kept), parts.dist)
        groups = [start_episodes(parts.env, [task] * cfg.algo.group_size) for task in tasks]
        played = play_groups(
            parts.engine,
            parts.tokenizer,
            groups,
            sampling_params(cfg, parts.env, step, round_, parts.dist.rank),
            timed_env_step,
            cfg.rollout.max_completion_tokens,
            response_prefix=parts.env.response_prefix,
        )
        if isinstance(stream, Curriculum):
            outcomes = [
                (task, sum(succeeded(parts.env, t) for t in g), len(g))
                for task, g in zip(tasks, played, strict=True)
            ]
            stream.record([o for rank in dp.gather_objects(outcomes, parts.dist) for o in rank])
        if cfg.algo.dynamic_sampling and played:
            keep = filter_zero_std_groups(group_rewards(played)).tolist()
            kept += [group for group, differs in zip(played, keep, strict=True) if differs]
        else:
            kept += played
        if dp.all_ranks(len(kept) == cfg.prompts_per_step, parts.dist):
            break
    return kept or played


@dataclass
class RunResult:
    parts: Parts
    evals: list[EvalPoint]
    history: list[dict[str, float]]
    summary: dict


def supervised_warm_start(
    parts: Parts, cfg: DictConfig, logger: RunLogger | None, bars: ProgressBars
) -> None:
    """sft.steps supervised steps on the env's demonstrations of training tasks, on the same LoRA adapter
    (its own AdamW); then the adapter is synced into the engine. Under torchrun each rank draws its own
    batches and DDP averages their gradients."""
    demos = demonstrations(parts.env, parts.train_tasks, parts.tokenizer, cfg.env.shared_prompt_key)
    sampler = DemoSampler(demos, cfg.sft.batch_size, seed=cfg.seed + 1_000_003 * parts.dist.rank)
    optimizer = build_optimizer(parts.model, cfg.sft.lr, weight_decay=cfg.trainer.weight_decay)
    with bars.bar(f"warm start on {len(demos)} demonstrations", cfg.sft.steps, "step") as bar:

        def on_step(step: int, metrics: dict[str, float]) -> None:
            bar.set_postfix(nll=f"{metrics['sft/nll']:.3f}", refresh=False)
            bar.update()
            if logger is not None:
                logger.log_stage("sft", step, metrics)

        warm_start(
            parts.train_model,
            optimizer,
            sampler,
            cfg.sft.steps,
            parts.tokenizer.pad_token_id,
            cfg.trainer.micro_batch_size,
            cfg.trainer.max_grad_norm,
            on_step,
        )
    dp.check_replicas(lora_tensors(parts.model), parts.dist)
    parts.sync.push(lora_tensors(parts.model), version=1)


def task_stream(parts: Parts, cfg: DictConfig) -> TaskStream | Curriculum:
    """The order training tasks come in: seeded epochs, or the adaptive curriculum."""
    c = cfg.curriculum
    if not c.enabled:
        return TaskStream(parts.train_tasks, seed=cfg.seed)
    return Curriculum(parts.train_tasks, cfg.seed, c.pool_by, c.prior_strength, c.min_attempts)


def policy_update(parts: Parts, cfg: DictConfig, optimizer, scheduler):
    """train_step bound to everything but the batch: the model, its optimizer and LR schedule, the algo.*
    settings of the update (a LossConfig, checked once here), micro-batches and the sampling settings."""
    return partial(
        train_step,
        parts.train_model,
        optimizer,
        scheduler,
        loss=OmegaConf.to_object(cfg.algo),
        micro_batch_size=cfg.trainer.micro_batch_size,
        max_grad_norm=cfg.trainer.max_grad_norm,
        temperature=cfg.rollout.temperature,
        max_completion_length=cfg.rollout.max_completion_tokens,
    )


def train_step_metrics(parts: Parts, cfg: DictConfig, update, stream, step: int, timer: StepTimer):
    """One GRPO step; `update` is the run's `policy_update`."""
    timer.begin_step()
    engine_before = parts.engine.stats()
    with timer("generate"):
        groups = collect_groups(parts, cfg, stream, step, timer)  # 1. sample and play the groups
    timer.add("generate", -timer.last("env"))
    with timer("train"):
        rewards = group_rewards(groups)  # 2. rewards -> group-relative advantages
        advantages = compute_advantages(rewards, cfg.algo.estimator.value, cfg.algo.scale.value)
        batch = to_rollout_batch(groups, advantages, parts.tokenizer.pad_token_id)  # 3. the batch
        stats = update(batch)  # 4. the clipped policy-gradient step on the LoRA weights
    with timer("sync"):  # 5. the new adapter into the engine
        dp.check_replicas(lora_tensors(parts.model), parts.dist)
        sync_stats = parts.sync.push(lora_tensors(parts.model), version=step + 1)
    metrics = {  # 6. what the step did
        **reward_metrics(groups, rewards),
        **stats.as_dict(),
        **sync_stats.metrics(),
        **engine_metrics(parts.engine, engine_before, timer.last("generate")),
        **timer.metrics(),
        **memory_metrics(parts.engine),
        **(stream.metrics() if isinstance(stream, Curriculum) else {}),
    }
    return metrics, groups


def resume(cfg: DictConfig, parts: Parts, optimizer, scheduler, stream) -> int:
    """With resume=true, load rank 0's latest checkpoint on every rank; returns the step it ended (or 0)."""
    latest = dp.broadcast_object(
        find_latest(cfg.run_dir) if cfg.resume and parts.dist.is_main else None, parts.dist
    )
    if latest is None:
        if cfg.resume and parts.dist.is_main:
            print(f"resume=true, but {cfg.run_dir} holds no complete checkpoint: training starts at step 0")
        return 0
    state = load_checkpoint(latest, parts.model, optimizer, scheduler)
    stream.restore(state.data_position)
    parts.sync.push(lora_tensors(parts.model), version=state.step + 1)
    if parts.dist.is_main:
        print(f"resumed from {latest} at step {state.step}")
    return state.step


def open_logger(cfg: DictConfig, start_step: int) -> RunLogger:
    """The JSONL / W&B / progress-bar logger (rank 0's alone under torchrun)."""
    return RunLogger(
        cfg.run_dir,
        project=cfg.logger.wandb.project,
        run_name=cfg.logger.wandb.run_name,
        wandb_mode=cfg.logger.wandb.mode.value,
        config=OmegaConf.to_container(cfg, resolve=True),
        total_steps=cfg.num_steps,
        start_step=start_step,
        sample_every=cfg.logger.samples_every,
        progress=cfg.logger.progress,
        resume=cfg.resume,
    )


def log_step(logger: RunLogger, step: int, metrics: dict[str, float], trajectories, tokenizer) -> None:
    """The step's metrics, and every samples_every steps a table of this rank's samples."""
    logger.log(step, metrics)
    if logger.wants_samples(step):
        flat = [t for group in trajectories for t in group]
        rows = [SampleRow(tokenizer.decode(t.prompt_ids), t.text, t.reward) for t in flat]
        logger.log_samples(step, rows)


def stages_before_grpo(
    parts: Parts, cfg: DictConfig, logger: RunLogger | None, bars: ProgressBars, timer: StepTimer
):
    """A fresh run scores the base model, then (sft.steps > 0) runs the warm start and scores it again;
    step 0 of the log holds what GRPO starts from."""
    with timer("eval"):
        evals = [eval_point(parts, cfg, "base", 0, bars, transfer=True)]
    if cfg.sft.steps > 0:
        if logger is not None:
            logger.log_stage("base", 0, evals[-1].metrics())
        with timer("sft"):
            supervised_warm_start(parts, cfg, logger, bars)
        with timer("eval"):
            evals.append(eval_point(parts, cfg, "sft", cfg.sft.steps, bars, transfer=True))
    if logger is not None:
        logger.log(0, evals[-1].metrics())
    return evals


def train(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> RunResult:
    started = time.monotonic()
    check_config(cfg)
    cfg.run_dir = dp.broadcast_object(cfg.run_dir, dist)  # Hydra may stamp each rank's directory differently
    if dist.is_main:
        check_run_dir(cfg.run_dir, cfg.resume)  # before the model loads: the logs and checkpoints go there
    parts = build_parts(cfg, dist)
    optimizer = build_optimizer(parts.model, cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
    scheduler = build_lr_scheduler(
        optimizer,
        cfg.trainer.lr_schedule.value,
        warmup_steps=cfg.trainer.warmup_steps,
        num_training_steps=cfg.num_steps * cfg.algo.num_iterations,
    )
    update = policy_update(parts, cfg, optimizer, scheduler)
    stream = task_stream(parts, cfg)
    start_step = resume(cfg, parts, optimizer, scheduler, stream)
    logger = open_logger(cfg, start_step) if dist.is_main else None  # rank 0 alone logs and checkpoints
    bars = logger.bars if logger is not None else ProgressBars(enabled=False)
    timer, history = StepTimer(), []
    evals = stages_before_grpo(parts, cfg, logger, bars, timer) if start_step == 0 else []
    if logger is not None:
        logger.start_grpo()
    for step in range(start_step + 1, cfg.num_steps + 1):
        local, trajectories = train_step_metrics(parts, cfg, update, stream, step, timer)
        metrics = combine_rank_metrics(dp.gather_objects(local, dist))
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.num_steps:
            with timer("eval"):
                evals.append(eval_point(parts, cfg, "grpo", step, bars))  # the transfer set: not here
            metrics.update(evals[-1].metrics())
        history.append(metrics)
        if logger is None:
            continue
        log_step(logger, step, metrics, trajectories, parts.tokenizer)
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.num_steps):
            save_checkpoint(
                cfg.run_dir,
                step,
                parts.model,
                optimizer,
                scheduler,
                data_position=stream.position(),
                config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                keep_last=cfg.keep_checkpoints,
            )
    if logger is not None:
        logger.end_grpo()
    final_eval = cfg.num_steps > 0 or not evals  # num_steps=0: the warm start's evaluation is the last
    if final_eval:
        with timer("eval"):
            evals.append(eval_point(parts, cfg, "grpo", cfg.num_steps, bars, transfer=True))
    words = parts.env.score_words
    summary = run_summary(evals, cfg.seed, time.monotonic() - started, cfg.sft.steps, words)
    if logger is not None:
        if final_eval:
            logger.log(cfg.num_steps, evals[-1].metrics())
        logger.log_summary(summary)
        logger.close()
        write_summary(cfg.run_dir, summary)
        print(summary_text(summary, history, timer))
    return RunResult(parts, evals, history, summary)


def eval_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    check_config(cfg)
    parts = build_parts(cfg, dist)
    stage, step = "base", 0
    if cfg.checkpoint:
        stage, step = "checkpoint", load_policy_checkpoint(cfg, parts.model, parts.sync)
    bars = ProgressBars(enabled=cfg.logger.progress and dist.is_main)
    # outcomes: RUN_DIR/evals/<set>_<stage>_<step>
    point = eval_point(parts, cfg, stage, step, bars, transfer=True)
    success = parts.env.score_words.success
    if dist.is_main:
        print(f"held-out greedy {success} ({cfg.checkpoint or 'base model'}):")
        print(point.result.table())
        if point.transfer is not None:
            print(f"transfer set greedy {success} ({cfg.checkpoint or 'base model'}):")
            print(point.transfer.table())
    held_out = EvalSet(HELD_OUT, parts.test_tasks, cfg.env.eval_labels)
    for eval_set, greedy in [(held_out, point.result), (parts.transfer, point.transfer)]:
        if cfg.eval.samples and greedy is not None:  # counts: RUN_DIR/evals/<set>_passk_<stage>_<step>
            passk = run_pass_at_k(parts, cfg, eval_set, stage, step, bars)
            if dist.is_main:
                print(
                    f"{eval_set.name} pass@k from {cfg.eval.samples} samples per task at rollout.temperature="
                    f"{cfg.rollout.temperature} ({cfg.checkpoint or 'base model'}):\n{passk.table(greedy)}"
                )


def export_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=export: the checkpoint's adapter merged into the base model, as a plain Hugging Face model."""
    check_config(cfg)
    export_checkpoint(cfg.checkpoint, cfg.export.dir, *model_settings(cfg, dist), dist.world_size)


def check_serving(cfg: DictConfig, dist: dp.DistInfo) -> None:
    """What mode=serve refuses before its model loads: bad values, torchrun, a checkpoint that is not one."""
    check_config(cfg)
    if dist.world_size > 1:
        raise ConfigError("mode=serve runs in one process: start it with python train.py, not torchrun")
    if cfg.checkpoint:
        check_checkpoint(cfg.checkpoint)


def serving_engine(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS):
    """mode=serve's engine, tokenizer and model name: the model with cfg.checkpoint's adapter (the base model
    without one)."""
    model, tokenizer, engine, sync = build_policy(cfg, dist)
    if cfg.checkpoint:
        load_policy_checkpoint(cfg, model, sync)
    name = cfg.serve.model_name or cfg.model.path or cfg.model.name.value
    return engine, tokenizer, name


def serve_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=serve: the OpenAI-compatible server over the engine, until Ctrl-C; the port is taken before the
    model loads, so a busy one fails at once."""
    check_serving(cfg, dist)
    s = cfg.serve
    try:
        sock = listen(s.host, s.port)
    except OSError as err:
        raise ConfigError(f"cannot listen on serve.host={s.host} serve.port={s.port}: {err}") from err
    engine, tokenizer, name = serving_engine(cfg, dist)
    host, port = sock.getsockname()[:2]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    print(f"serving {name} ({cfg.checkpoint or 'base model'}) at http://{address}/v1", flush=True)
    run_server(build_app(engine, tokenizer, name), sock)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    torch.manual_seed(cfg.seed)
    try:
        with dp.distributed(cfg.model.device) as dist:
            modes = {"train": train, "eval": eval_only, "export": export_only, "serve": serve_only}
            modes[cfg.mode.value](cfg, dist)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err}")
    except KeyboardInterrupt:
        sys.exit("interrupted (Ctrl-C)")
    finally:
        gc.collect()  # under `-m` (multirun) the next job's engine must not meet this one's KV pool


if __name__ == "__main__":
    main()
