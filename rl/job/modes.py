"""The modes that run no training: mode=eval scores the base model or a checkpoint, mode=export merges a
checkpoint's adapter into a plain Hugging Face model, and mode=serve runs the OpenAI-compatible server
(serve/) over the engine of the model with a checkpoint's adapter, or of the base model alone (no LoRA),
until Ctrl-C. The server stack (fastapi, uvicorn) is imported by mode=serve alone, so the other modes run
without it."""

from __future__ import annotations

from omegaconf import DictConfig

from rl.config.checks import check_config
from rl.job import distributed as dp
from rl.job.checkpoint import check_checkpoint
from rl.job.export import export_checkpoint
from rl.job.parts import build_parts, build_policy, load_policy_checkpoint, model_settings
from rl.job.stages import eval_point, held_out_set, run_pass_at_k
from rl.report.logger import ProgressBars
from rl.settings import ConfigError
from rollout_engine import LLMEngine


def eval_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=eval: the held-out (and transfer) sets scored greedily, then with eval.samples their pass@k."""
    check_config(cfg)
    parts = build_parts(cfg, dist)
    stage, step = "base", 0
    if cfg.checkpoint:
        stage, step = "checkpoint", load_policy_checkpoint(cfg, parts.model, parts.engine)
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
    if not cfg.eval.samples:
        return
    sampled = [(held_out_set(parts, cfg), point.result, point.passk)]  # counts: RUN_DIR/evals/<set>_passk_*
    if point.transfer is not None:
        sampled.append(
            (parts.transfer, point.transfer, run_pass_at_k(parts, cfg, parts.transfer, stage, step, bars))
        )
    for eval_set, greedy, passk in sampled:
        if dist.is_main:
            print(
                f"{eval_set.name} pass@k from {cfg.eval.samples} samples per task at rollout.temperature="
                f"{cfg.rollout.temperature} ({cfg.checkpoint or 'base model'}):\n{passk.table(greedy)}"
            )


def export_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=export: the checkpoint's adapter merged into the base model, as a plain Hugging Face model."""
    check_config(cfg)
    model_kwargs, lora_kwargs = model_settings(cfg, dist)
    export_checkpoint(
        cfg.checkpoint, cfg.export.dir, model_kwargs, lora_kwargs, dist.world_size, cfg.export.dtype.value
    )


def check_serving(cfg: DictConfig, dist: dp.DistInfo) -> None:
    """What mode=serve refuses before its model loads: bad values, torchrun, a checkpoint that is not one."""
    check_config(cfg)
    if dist.world_size > 1:
        raise ConfigError("mode=serve runs in one process: start it with python train.py, not torchrun")
    if cfg.checkpoint:
        check_checkpoint(cfg.checkpoint)


def serving_engine(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> LLMEngine:
    """mode=serve's engine (its tokenizer is `engine.tokenizer`): the model with cfg.checkpoint's adapter, or
    without one the base model alone, with no LoRA in the engine's forward."""
    model, _, engine = build_policy(cfg, dist, adapter=bool(cfg.checkpoint))
    if cfg.checkpoint:
        load_policy_checkpoint(cfg, model, engine)
    return engine


def serving_name(cfg: DictConfig) -> str:
    """The one model name mode=serve answers to."""
    return cfg.serve.model_name or cfg.model.path or cfg.model.name.value


def serve_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=serve: the OpenAI-compatible server over the engine, until Ctrl-C; the port is taken before the
    model loads, so a busy one fails at once. The engine is built on the thread that steps it
    (`serve.engine_loop`)."""
    from serve.app import build_app, listen, run_server
    from serve.engine_loop import EngineLoop

    check_serving(cfg, dist)
    s = cfg.serve
    try:
        sock = listen(s.host, s.port)
    except OSError as err:
        raise ConfigError(f"cannot listen on serve.host={s.host} serve.port={s.port}: {err}") from err
    loop = EngineLoop(lambda: serving_engine(cfg, dist))
    engine = loop.start()
    name = serving_name(cfg)
    host, port = sock.getsockname()[:2]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    print(f"serving {name} ({cfg.checkpoint or 'base model'}) at http://{address}/v1", flush=True)
    run_server(build_app(loop, engine.tokenizer, name), sock)
