"""Configs composed for a run on the tiny model, and a tiny checkpoint whose adapter holds random values,
with peft's reference of it."""

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from peft import PeftModel

from rl.config.schema import register_configs
from rl.job.checkpoint import ADAPTER, save_checkpoint
from rl.job.model_loading import load_model
from rl.sync.adapter import add_lora

REPO = Path(__file__).resolve().parents[2]
SMALL_SQL = "env.tasks.scale=0.05"
TINY = [
    "model=tiny_llama",
    "model.dtype=float32",  # on every CPU (auto is bf16 where the CPU multiplies it natively)
    "prompts_per_step=2",
    "algo.group_size=4",
    "rollout.max_tokens=10",
    "rollout.max_completion_tokens=24",
    "rollout.memory_budget_bytes=1000000000",
    "env.eval_tasks=4",
    "eval_every=2",
    "checkpoint_every=1",
    "logger.wandb.mode=disabled",
    "logger.progress=false",
    "logger.samples_every=1",
    "trainer.lr=1e-3",
    "trainer.micro_batch_size=4",
    "sft.steps=0",  # the tiny runs test GRPO over the plain task stream; the warm start and the
    "curriculum.enabled=false",  # curriculum have their own tests below
]


def compose_cfg(run_dir, *overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*TINY, *overrides, f"run_dir={run_dir}"])


def adapted_checkpoint(run_dir):
    """A tiny_llama checkpoint in run_dir whose LoRA B (peft starts it at zero) holds random values, so the
    adapter changes every adapted weight. The LoRA settings are the defaults the composed config holds."""
    model, _ = load_model("tiny_llama", dtype="float32", device="cpu")
    model = add_lora(model)  # r=16, alpha=32, all seven projections
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    return save_checkpoint(run_dir, 7, model, optimizer)


def peft_reference(checkpoint):
    """The base model with the checkpoint's adapter, as peft runs it (unmerged)."""
    base, _ = load_model("tiny_llama", dtype="float32", device="cpu")
    return PeftModel.from_pretrained(base, checkpoint / ADAPTER).eval()
