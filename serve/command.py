"""mode=serve from the config: what it refuses before the model loads, the policy it serves (the model with
a checkpoint's adapter, or the base model), and the OpenAI-compatible server over its engine until Ctrl-C."""

from __future__ import annotations

from omegaconf import DictConfig

from rl.job import distributed as dp
from rl.job.checkpoint import check_checkpoint
from rl.job.config_checks import check_config
from rl.job.parts import build_policy, load_policy_checkpoint
from rl.settings import ConfigError
from serve.app import build_app, listen, run_server


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
    model, tokenizer, engine = build_policy(cfg, dist)
    if cfg.checkpoint:
        load_policy_checkpoint(cfg, model, engine)
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
