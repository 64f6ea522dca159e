"""mode=export: a checkpoint's LoRA adapter merged into its base model, saved as a plain Hugging Face model.

Each adapted projection's weight becomes W + scale * B A (peft's `merge_and_unload`; scale = alpha / r, or
alpha / sqrt(r) with rsLoRA), so the directory (safetensors weights, config.json, generation_config.json, the
tokenizer and its chat template) loads with `AutoModelForCausalLM.from_pretrained` or vLLM, without peft.
The merge runs in fp32 whatever `model.dtype` says (the base loads in fp32 for it): a LoRA update is small
beside its weight, and a bf16 sum rounds much of it away. `export.dtype` is the dtype saved: float32 (the
default) keeps the update whole; bfloat16, float16 or model (the dtype `model.dtype` loads in) round the fp32
sum once, with a warning that says how far the rounding moves the logits of a short probe. The directory is
written under a temporary name beside it and renamed into place, and is never written over: an
`export.dir` that holds anything is refused before the model loads.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rl.job.atomic_files import fsync_dir, fsync_tree, owner, remove_partial_saves
from rl.job.checkpoint import check_checkpoint, load_checkpoint
from rl.job.model_loading import DTYPES, dtype_name, load_model, resolve_device, resolve_dtype
from rl.settings import ConfigError, choice, choices
from rl.sync.adapter import add_lora

EXPORT_DTYPES = (*DTYPES, "model")  # model: the dtype model.dtype loads the model in
ExportDType = choices("ExportDType", EXPORT_DTYPES)
# what a lower-precision export's rounding is measured on: a short prompt of the kind the project trains on
PROBE_TEXT = "Table users(id, name, created_at): how many users joined in 2023? SELECT COUNT(*) FROM users"


def export_checkpoint(
    checkpoint: str | None,
    export_dir: str | None,
    model_kwargs: dict,
    lora_kwargs: dict,
    world_size: int = 1,
    dtype: str = "float32",
) -> Path:
    """Load the base model in fp32 (`load_model(**model_kwargs)`, its dtype aside) with its LoRA
    (`add_lora(**lora_kwargs)`), load the checkpoint's adapter into it (refused when it does not fit those
    settings), merge, round to `dtype` (an `EXPORT_DTYPES` name: the export.dtype key) with a warning that
    says how far that moves the logits, and save the result to `export_dir`; every refusal that needs no
    model comes before the model loads."""
    out = check_export(checkpoint, export_dir)
    setting = choice(ExportDType, dtype, "export.dtype").value
    if world_size > 1:
        raise ConfigError("mode=export runs in one process: start it with python train.py, not torchrun")
    target = export_dtype(setting, model_kwargs["dtype"], model_kwargs["device"])
    model, tokenizer = load_model(**{**model_kwargs, "dtype": "float32"})
    model = add_lora(model, **lora_kwargs)
    step = load_checkpoint(checkpoint, model, restore_rng=False).step
    if target == torch.float32:
        merged = merge_adapter(model)
    else:
        merged = merge_rounded(model, tokenizer, target, setting)
    save_merged(merged, tokenizer, out)
    print(
        f"exported {checkpoint} (step {step}), merged into its base model in float32, as "
        f"{dtype_name(target)} weights (export.dtype={setting}), to {out}"
    )
    return out


def export_dtype(setting: str, model_dtype: str, device: str) -> torch.dtype:
    """The dtype export.dtype=`setting` saves: the one it names, or for `model` the one `model.dtype`
    (`model_dtype`, auto resolved on `device`) loads the model in."""
    if setting == "model":
        return resolve_dtype(model_dtype, resolve_device(device)).dtype
    return DTYPES[setting]


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
    broken = non_finite_weights(merged)
    if broken:
        raise ConfigError(
            f"merging the checkpoint's adapter leaves non-finite values in {len(broken)} weights (for "
            f"example {broken[0]}): the checkpoint is broken; export an earlier one"
        )
    return merged


def merge_rounded(
    model: PeftModel, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, setting: str
) -> PreTrainedModel:
    """`merge_adapter(model)` (an fp32 model) cast to `dtype`, with a warning when that moves the logits of
    PROBE_TEXT, saying by how much beside how far the adapter moves them from the base model's; `model` is
    changed in place. A weight outside `dtype`'s range is refused (export.dtype=`setting`)."""
    probe = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids.to(model.device)  # [1, num_tokens]
    with model.disable_adapter():
        base_logits = probe_logits(model, probe)
    merged = merge_adapter(model)
    exact = probe_logits(merged, probe)
    merged = merged.to(dtype)
    broken = non_finite_weights(merged)
    if broken:
        raise ConfigError(
            f"export.dtype={setting}: {len(broken)} merged weights (for example {broken[0]}) overflow "
            f"{dtype_name(dtype)}; use export.dtype=float32 (or bfloat16, whose range is fp32's)"
        )
    rounding = (probe_logits(merged, probe) - exact).abs().max().item()
    if rounding > 0:
        update = (exact - base_logits).abs().max().item()
        warnings.warn(
            f"export.dtype={setting} rounds the merged weights to {dtype_name(dtype)}, and with them the "
            f"adapter's update: on a {probe.shape[1]}-token probe the logits move by up to {rounding:.3g} "
            f"from the float32 merge's (the adapter moves them by up to {update:.3g} from the base "
            "model's); export.dtype=float32 keeps the update whole",
            RuntimeWarning,
            stacklevel=3,
        )
    return merged


def non_finite_weights(model: PreTrainedModel) -> list[str]:
    """The names of the parameters that hold a NaN or an infinity."""
    return [name for name, weight in model.named_parameters() if not torch.isfinite(weight).all()]


@torch.no_grad()
def probe_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The fp32 logits of `ids` [1, num_tokens] -> [1, num_tokens, vocab]."""
    return model(ids).logits.float()


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
