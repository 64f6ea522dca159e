"""mode=export: a checkpoint's LoRA adapter merged into its base model, saved as a plain Hugging Face model.

Each adapted projection's weight becomes W + scale * B A (peft's `merge_and_unload`; scale = alpha / r, or
alpha / sqrt(r) with rsLoRA), so the directory (safetensors weights, config.json, generation_config.json, the
tokenizer and its chat template) loads with `AutoModelForCausalLM.from_pretrained` or vLLM, without peft. The
weights keep the model's dtype: fp32 on a CPU; in bf16 the update is added in fp32 and the sum rounded once to
bf16. The directory is written under a temporary name beside it and renamed into place, and is never written
over: an `export.dir` that holds anything is refused before the model loads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rl.job.atomic_files import fsync_dir, fsync_tree, owner, remove_partial_saves
from rl.job.checkpoint import check_checkpoint, load_checkpoint
from rl.job.model_loading import load_model
from rl.settings import ConfigError
from rl.sync.adapter import add_lora


def export_checkpoint(
    checkpoint: str | None,
    export_dir: str | None,
    model_kwargs: dict,
    lora_kwargs: dict,
    world_size: int = 1,
) -> Path:
    """Load the base model (`load_model(**model_kwargs)`) with its LoRA (`add_lora(**lora_kwargs)`), load the
    checkpoint's adapter into it (refused when it does not fit those settings), merge, and save the result
    to `export_dir`; every refusal that needs no model comes before the model loads."""
    out = check_export(checkpoint, export_dir)
    if world_size > 1:
        raise ConfigError("mode=export runs in one process: start it with python train.py, not torchrun")
    model, tokenizer = load_model(**model_kwargs)
    model = add_lora(model, **lora_kwargs)
    step = load_checkpoint(checkpoint, model, restore_rng=False).step
    merged = merge_adapter(model)
    save_merged(merged, tokenizer, out)
    print(f"exported {checkpoint} (step {step}), merged into its base model ({merged.dtype}), to {out}")
    return out


def check_export(checkpoint: str | None, export_dir: str | None) -> Path:
    """Refuse, before the model loads, an export without a checkpoint or a directory, a checkpoint that is
    not one, or a directory that holds anything; returns the directory to export to."""
    if not checkpoint:
        raise ConfigError(
            "mode=export needs checkpoint=RUN_DIR/checkpoints/step_<N>: the adapter to merge into the base "
            "model"
        )
    if not export_dir:
        raise ConfigError("mode=export needs export.dir=<a new directory>: where the merged model is saved")
    check_checkpoint(checkpoint)
    out = Path(export_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export.dir={export_dir} is a file: pass export.dir=<a new directory>")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(
            f"export.dir={export_dir} exists and is not empty, and an export never writes over files: pass "
            "export.dir=<a new directory>, or move that one's contents away"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.parent / f".write-test.{owner()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"export.dir={export_dir} cannot be written ({type(err).__name__}: {err}); pass export.dir=<a "
            "directory in a writable place>"
        ) from None
    return out


def merge_adapter(model: PeftModel) -> PreTrainedModel:
    """The base model with the active LoRA adapter merged into its weights (W + scale * B A), peft's
    wrappers removed; `model` is changed in place. A weight the merge leaves non-finite is refused."""
    # not safe_merge: it rounds B A to the weights' dtype before adding, so a bf16 weight was rounded twice
    merged = model.merge_and_unload()
    broken = [name for name, weight in merged.named_parameters() if not torch.isfinite(weight).all()]
    if broken:
        raise ConfigError(
            f"merging the checkpoint's adapter leaves non-finite values in {len(broken)} weights (for "
            f"example {broken[0]}): the checkpoint is broken; export an earlier one"
        )
    return merged


def save_merged(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, export_dir: Path) -> Path:
    """Save the merged model and its tokenizer into `export_dir` (absent or empty), atomically."""
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_partial_saves(export_dir.parent, name=export_dir.name)
    tmp = export_dir.with_name(f".tmp-{export_dir.name}.{owner()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)
        os.rename(tmp, export_dir)  # onto an empty directory, never onto one that holds files
    except OSError as err:
        raise ConfigError(
            f"could not write the export to {export_dir} ({type(err).__name__}: {err}); nothing was left "
            "there: free disk space or pass another export.dir"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(export_dir.parent)
    return export_dir
