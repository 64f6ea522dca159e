"""AdamW over the trainable parameters, and learning-rate schedules (constant or warmup + cosine)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from rl.settings import ConfigError, Rule, at_least, check_args, number, positive

SCHEDULES = ("constant", "cosine")
# the optimiser's trainer.* keys (rl.config.schema.TrainerConfig; lr also sft.lr), as these functions
# take them
LR_RULE: Rule = ("lr", positive, "use a finite number > 0")
WEIGHT_DECAY_RULE: Rule = ("weight_decay", at_least(0), "use a finite number >= 0")
WARMUP_STEPS_RULE: Rule = ("warmup_steps", at_least(0), "use an integer >= 0")
MIN_LR_RATIO_RULE: Rule = ("min_lr_ratio", lambda v: number(v) and 0 <= v <= 1, "use a number in [0, 1]")


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over the parameters with requires_grad (the LoRA weights of a peft model)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            "the model has no trainable parameters; wrap it with peft.get_peft_model(model, LoraConfig(...)) "
            "or unfreeze the parameters to train"
        )
    check_args((LR_RULE, WEIGHT_DECAY_RULE), lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def lr_factor(
    step: int, schedule: str, warmup_steps: int, num_training_steps: int | None, min_lr_ratio: float
) -> float:
    """Multiplier of the base LR before optimizer step `step` (0-based).

    Linear warmup step / warmup_steps (0 at step 0, as in transformers), then 1 (constant) or a cosine from
    1 down to min_lr_ratio at num_training_steps, held there afterwards.
    """
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, num_training_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lacks_decay(schedule: str, warmup_steps: int, num_training_steps: int | None) -> bool:
    """A cosine schedule with steps to take but none after its warmup (None: the length is unknown). With no
    steps at all (an SFT-only control's GRPO stage) there is nothing to schedule."""
    return schedule == "cosine" and (num_training_steps is None or 0 < num_training_steps <= warmup_steps)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: str = "constant",
    warmup_steps: int = 0,
    num_training_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """A LambdaLR following `lr_factor`; step it once per optimizer step."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown LR schedule {schedule!r}; choose one of {SCHEDULES}")
    check_args((WARMUP_STEPS_RULE, MIN_LR_RATIO_RULE), warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
    if lacks_decay(schedule, warmup_steps, num_training_steps):
        raise ConfigError(
            f"the cosine schedule needs num_training_steps > warmup_steps ({warmup_steps}), "
            f"got {num_training_steps}; pass the total number of optimizer steps"
        )
    return LambdaLR(
        optimizer, lambda step: lr_factor(step, schedule, warmup_steps, num_training_steps, min_lr_ratio)
    )
