"""Atomic checkpoints and resume: LoRA adapter (peft format), optimizer, LR scheduler, RNG states, step, data
position and the resolved config.

Layout under ``RUN_DIR/checkpoints``::

    step_<N>/adapter/           adapter_config.json, adapter_model.safetensors (``PeftModel.from_pretrained``)
    step_<N>/trainer_state.pt   optimizer, scheduler and RNG states; the KL reference's adapter weights
                                under algo.kl_reference=start
    step_<N>/state.json         step and data position
    step_<N>/config.yaml        the resolved config
    latest                      the name of the newest checkpoint, replaced atomically

A save writes into a hidden temporary directory, fsyncs it and renames it into place (rl/job/atomic_files.py),
so a crash or a kill at any point leaves every earlier checkpoint complete. Leftovers of killed saves are
removed by the next save or ``find_latest``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from rl.job.atomic_files import fsync_tree, move_into_place, owner, remove_partial_saves, replace_file
from rl.report.logger import METRICS_FILE, SAMPLES_FILE
from rl.settings import ConfigError

CHECKPOINTS = "checkpoints"
LATEST = "latest"
ADAPTER = "adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
TRAINER_STATE = "trainer_state.pt"
STATE = "state.json"
CONFIG = "config.yaml"
REQUIRED = (f"{ADAPTER}/{ADAPTER_WEIGHTS}", f"{ADAPTER}/{ADAPTER_CONFIG}", TRAINER_STATE, STATE, CONFIG)
LORA_FIELDS = ("r", "lora_alpha", "use_rslora")
STEP_DIR = re.compile(r"step_(\d+)")


class RunDirError(OSError):
    """The run directory, or a checkpoint in it, cannot be written; the message says why and what to do."""


@dataclass(slots=True)
class ResumeState:
    """What a loaded checkpoint tells the loop: where it was and how it was configured."""

    step: int
    data_position: dict[str, Any]
    config_yaml: str
    path: Path
    reference: dict[str, torch.Tensor] | None = None  # the KL reference's LoRA tensors, when it kept one


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """The directory a checkpoint of ``step`` is saved to."""
    return Path(run_dir) / CHECKPOINTS / f"step_{step}"


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    data_position: Mapping[str, Any] | None = None,
    config_yaml: str = "",
    keep_last: int | None = None,
    reference: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Atomically save ``step`` to ``RUN_DIR/checkpoints/step_<step>`` and point ``latest`` at it.

    ``data_position`` is a small JSON-serialisable dict (for example epoch, index and sampler seed) handed
    back by ``load_checkpoint``, and so is ``reference`` (the LoRA tensors a KL is taken against). With
    ``keep_last=K`` only the K newest checkpoints are kept.
    """
    if not isinstance(model, PeftModel):
        raise TypeError(
            f"save_checkpoint needs a peft PeftModel (see rl.sync.adapter.add_lora), "
            f"got {type(model).__name__}."
        )
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}.")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be a positive number of checkpoints or None, got {keep_last}.")
    state_json = _state_json(step, data_position)
    trainer_state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(),
        "reference": None if reference is None else {name: t.cpu() for name, t in reference.items()},
    }
    final = checkpoint_dir(run_dir, step)
    try:
        return _save(final, model, trainer_state, state_json, config_yaml, keep_last)
    except OSError as err:
        raise RunDirError(
            f"could not save the checkpoint of step {step} in {final.parent}: {type(err).__name__}: "
            f"{err}. The checkpoints saved before it are intact; free disk space or fix the directory, then "
            "continue with resume=true"
        ) from err


def check_run_dir(run_dir: str | os.PathLike, resume: bool = False) -> None:
    """Refuse, before any work starts, a run directory that cannot hold the logs and checkpoints, or, for a
    new run (not `resume`), one that holds an earlier run's checkpoints, which the new run would replace, or
    its logs, which the new run's steps would mix with."""
    path = Path(run_dir)
    checkpoints = path / CHECKPOINTS
    try:
        path.mkdir(parents=True, exist_ok=True)
        for directory in (path, checkpoints):
            if directory.is_dir():
                probe = directory / f".write-test.{owner()}"
                probe.write_bytes(b"")
                probe.unlink()
    except OSError as err:
        raise RunDirError(
            f"run_dir={run_dir} cannot be written ({type(err).__name__}: {err}); pass run_dir=<a writable "
            "directory>"
        ) from None
    if checkpoints.exists() and not checkpoints.is_dir():
        raise RunDirError(
            f"{checkpoints} is a file, but checkpoints are saved in a directory of that name: move the file "
            "away or pass another run_dir"
        )
    if resume:
        return
    earlier = _complete_steps(checkpoints)
    if earlier:
        raise RunDirError(
            f"run_dir={run_dir} holds an earlier run's checkpoints (the last: {earlier[-1].name}), which a "
            "new run would replace, and whose logs it would add to: pass resume=true to continue that run, "
            "or another run_dir for a new one"
        )
    logs = [
        name
        for name in (METRICS_FILE, SAMPLES_FILE)
        if (path / name).is_file() and (path / name).stat().st_size
    ]
    if logs:
        raise RunDirError(
            f"run_dir={run_dir} holds an earlier run's logs ({', '.join(logs)}) and no checkpoint of it; a "
            "new run would add its steps to them: pass another run_dir, or move those files away to reuse "
            "this one"
        )


def _save(
    final: Path,
    model: PeftModel,
    trainer_state: dict[str, Any],
    state_json: str,
    config_yaml: str,
    keep_last: int | None,
) -> Path:
    """Write the checkpoint into a temporary directory, then rename it to ``final`` (see the module doc)."""
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    remove_partial_saves(root)
    tmp = root / f".tmp-{final.name}.{owner()}"
    tmp.mkdir()
    model.save_pretrained(tmp / ADAPTER)
    try:
        torch.save(trainer_state, tmp / TRAINER_STATE)
    except RuntimeError as err:  # torch reports a failed write (a full disk) as a RuntimeError
        raise OSError(f"torch.save could not write {tmp / TRAINER_STATE}: {err}") from err
    (tmp / CONFIG).write_text(config_yaml)
    (tmp / STATE).write_text(state_json)
    fsync_tree(tmp)
    move_into_place(tmp, final)
    replace_file(root / LATEST, final.name)
    if keep_last is not None:
        _prune(root, keep_last, final)
    return final


def find_latest(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run (the ``latest`` pointer, else the highest step), or None."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    remove_partial_saves(root)
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if STEP_DIR.fullmatch(named.name) and _is_complete(named):
            return named
    complete = _complete_steps(root)
    return complete[-1] if complete else None


def load_checkpoint(
    path: str | os.PathLike,
    model: PeftModel,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    restore_rng: bool = True,
) -> ResumeState:
    """Restore a checkpoint directory into live objects, in place, and return its step and data position.

    The adapter weights are copied into ``model``'s existing LoRA parameters (their identity is kept, so an
    optimizer or an engine holding them stays valid). Pass ``optimizer=None, scheduler=None,
    restore_rng=False`` to load only the adapter, for evaluation.
    """
    path = Path(path)
    _check_loadable(path)
    state = json.loads((path / STATE).read_text())
    adapter_weights = _read_adapter(path / ADAPTER, model)
    trainer_state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    if scheduler is not None and trainer_state["scheduler"] is None:
        raise ValueError(f"Checkpoint {path} holds no LR scheduler state: build the run without a scheduler.")
    if optimizer is not None:  # torch checks the parameter groups before it changes anything
        optimizer.load_state_dict(trainer_state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(trainer_state["scheduler"])
    set_peft_model_state_dict(model, adapter_weights, adapter_name=model.active_adapter)
    if restore_rng:
        _set_rng_state(trainer_state["rng"])
    return ResumeState(
        step=state["step"],
        data_position=state["data_position"],
        config_yaml=(path / CONFIG).read_text(),
        path=path,
        reference=trainer_state.get("reference"),
    )


def _state_json(step: int, data_position: Mapping[str, Any] | None) -> str:
    try:
        return json.dumps({"step": step, "data_position": dict(data_position or {})}, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The data position {data_position!r} must be a small dict of JSON values (ints, floats, "
            f"strings, lists): {error}."
        ) from error


def _rng_state() -> dict[str, Any]:
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (algorithm, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(rng: dict[str, Any]) -> None:
    random.setstate(rng["python"])
    algorithm, keys, pos, has_gauss, cached_gaussian = rng["numpy"]
    np.random.set_state((algorithm, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"][: torch.cuda.device_count()])


def _read_adapter(adapter_dir: Path, model: PeftModel) -> dict[str, torch.Tensor]:
    """The saved adapter weights, checked against the model's LoRA layers name by name and shape by shape."""
    if not isinstance(model, PeftModel):
        raise TypeError(
            f"load_checkpoint needs a peft PeftModel (see rl.sync.adapter.add_lora), "
            f"got {type(model).__name__}."
        )
    saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    live = model.peft_config[model.active_adapter].to_dict()
    mismatched = [key for key in LORA_FIELDS if saved.get(key) != live.get(key)]
    if set(saved.get("target_modules") or ()) != set(live.get("target_modules") or ()):
        mismatched.append("target_modules")
    if mismatched:
        details = ", ".join(
            f"{key}: saved {saved.get(key)!r} vs model {live.get(key)!r}" for key in mismatched
        )
        raise ConfigError(
            f"The adapter in {adapter_dir} does not fit the model ({details}): build the LoRA with the "
            "settings the checkpoint was trained with (its config.yaml)."
        )
    weights = load_file(adapter_dir / ADAPTER_WEIGHTS)
    expected = get_peft_model_state_dict(model, adapter_name=model.active_adapter)
    wrong = sorted(
        set(weights) ^ set(expected)
        | {k for k in weights.keys() & expected.keys() if weights[k].shape != expected[k].shape}
    )
    if wrong:
        raise ConfigError(
            f"The adapter in {adapter_dir} does not match the model's LoRA layers (for example {wrong[:3]}): "
            "load it into the base architecture it was trained on."
        )
    return weights


def check_checkpoint(path: str | os.PathLike) -> None:
    """Refuse, before a model loads, a path that is not a complete checkpoint directory (FileNotFoundError,
    or ConfigError for a run directory), with what to pass instead."""
    _check_loadable(Path(path))


def _check_loadable(path: Path) -> None:
    if not path.is_dir():
        raise FileNotFoundError(
            f"checkpoint {path} does not exist: pass a {CHECKPOINTS}/step_<N> directory of a run "
            "(written by rl.job.checkpoint.save_checkpoint)"
        )
    if (path / CHECKPOINTS).is_dir() and not (path / STATE).exists():
        raise ConfigError(
            f"{path} is a run directory, not a checkpoint: pass rl.job.checkpoint.find_latest({str(path)!r}) "
            f"or one of its {CHECKPOINTS}/step_<N> directories."
        )
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint (missing {', '.join(missing)}): pass a "
            f"{CHECKPOINTS}/step_<N> directory written by rl.job.checkpoint.save_checkpoint."
        )


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED)


def _complete_steps(root: Path) -> list[Path]:
    """The complete checkpoint directories under `root` in ascending step order; none when it is missing."""
    return [path for path in _step_dirs(root) if _is_complete(path)] if root.is_dir() else []


def _step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories in ascending step order."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return [path for _, path in sorted(found)]


def _prune(root: Path, keep_last: int, keep: Path) -> None:
    """Delete the oldest checkpoints so that ``keep_last`` remain, never the one just saved."""
    others = [path for path in _step_dirs(root) if path != keep]
    for path in others[: max(0, len(others) + 1 - keep_last)]:
        shutil.rmtree(path)
