"""Supervised warm start: train the LoRA adapter on an env's demonstrations before GRPO.

An env that can say what an ideal first reply to a task is (``env.demonstration(task)``, e.g. the gold SQL in
its fence) gives a supervised stage in the same job, on the same adapter. Small models often score so
rarely that every GRPO group has zero reward variance; a short warm start on the training split gives GRPO a
policy that already succeeds sometimes, and RL does the rest.

The step reuses the trainer's micro-batching: on a demonstration with advantage 1 and the ratio at 1 (no old
logprobs), the clipped policy loss has exactly the gradient of the per-sequence mean negative log-likelihood.
Rows that share a prompt prefix (tasks on one database schema) are batched together, so the trainer runs
that prefix once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rl.algo.trainer import NLL, accumulate_gradients, mean_sequence_nll, model_device, optimizer_step
from rl.job.demos import Demonstration, DemoSampler, demo_batch


def sft_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    demos: Sequence[Demonstration],
    pad_token_id: int,
    micro_batch_size: int = 8,
    max_grad_norm: float | None = 1.0,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, float]:
    """One optimizer step on the per-sequence mean NLL of ``demos`` (then one of ``scheduler``, when given);
    returns its metrics."""
    batch = demo_batch(demos, pad_token_id)
    logprobs = torch.zeros(batch.input_ids.shape, device=model_device(model))
    stats = accumulate_gradients(
        model, batch, NLL, micro_batch_size=micro_batch_size, record_logprobs=logprobs
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stepped, grad_norm, lr = optimizer_step(optimizer, scheduler, params, max_grad_norm, stats.loss)
    return {
        "sft/nll": mean_sequence_nll(batch, logprobs),
        "sft/grad_norm": grad_norm,
        "sft/lr": lr,
        "sft/num_tokens": int(batch.loss_mask.sum().item()),
        "sft/skipped": float(not stepped),
    }


def warm_start(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: DemoSampler,
    num_steps: int,
    pad_token_id: int,
    micro_batch_size: int,
    max_grad_norm: float | None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> list[dict[str, float]]:
    """``num_steps`` supervised steps; ``on_step(step, metrics)`` sees each (1-based) as it ends."""
    history = []
    for step in range(1, num_steps + 1):
        metrics = sft_step(
            model, optimizer, sampler.next_batch(), pad_token_id, micro_batch_size, max_grad_norm, scheduler
        )
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    return history
