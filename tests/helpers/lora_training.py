"""The tiny seeded Llama (vocab 100) with a LoRA adapter, its optimizer and scheduler, and one seeded
training step.

Shared by the checkpoint tests and the child process that is killed in the middle of a save.
"""

import random

import numpy as np
import torch
from peft import LoraConfig, get_peft_model

from tests.helpers.tiny_models import tiny_llama

VOCAB = 100
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])


def tiny_lora_model(base_seed: int = 0, lora_seed: int = 1, device: str = "cpu"):
    """LoRA on q_proj/v_proj over tiny_llama(VOCAB, base_seed); the LoRA initialisation follows lora_seed."""
    base = tiny_llama(VOCAB, base_seed)
    torch.manual_seed(lora_seed)
    model = get_peft_model(base, LoraConfig(**LORA)).to(device)
    model.train()  # LoRA dropout draws from the torch RNG, so a resumed run must restore it
    return model


def optimizer_and_scheduler(model):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    return optimizer, scheduler


def train_step(model, optimizer, scheduler) -> torch.Tensor:
    """One optimisation step on a batch drawn from all three RNGs (python, numpy, torch); returns the loss."""
    length = random.randint(6, 12)
    batch_size = int(np.random.randint(2, 5))
    device = next(model.parameters()).device  # on CUDA the batch and the dropout draw from the CUDA RNG
    input_ids = torch.randint(0, VOCAB, (batch_size, length), device=device)  # [batch, length]
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.detach()


def lora_state(model) -> dict[str, torch.Tensor]:
    """Copies of the trainable LoRA weights by parameter name."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
