"""One optimisation step over a rollout batch: old and reference logprobs, micro-batches, clipped update."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping

import torch
from peft import PeftModel
from torch.nn.parallel import DistributedDataParallel

from host.system import libc
from rl.algo.aggregation import aggregation
from rl.algo.batch import RolloutBatch
from rl.algo.importance import ISCorrection, importance_weights
from rl.algo.logprobs import token_logprobs, unwrap_ddp
from rl.algo.losses import LossConfig, LossStats, compute_policy_loss
from rl.algo.micro_batches import micro_batch_slices
from rl.algo.step_stats import CompletionStats, StepStats, combine_loss_stats, mean_loss_stats
from rl.settings import Rule, at_least, check_args, optional, positive
from rl.sync.adapter import adapter_weights

# the trainer.* keys of a step's micro-batches and clipping (rl.config.schema.TrainerConfig), as train_step
# takes them
MICRO_BATCH_SIZE_RULE: Rule = ("micro_batch_size", at_least(1), "use an integer >= 1")
# the per-sequence mean (grpo aggregation) of the policy loss at ratio 1: on rows of advantage w, the gradient
# of w x the mean per-token negative log-likelihood of each sequence (a demonstration's, for supervised steps)
NLL = LossConfig(loss_type="grpo")
MAX_GRAD_NORM_RULE: Rule = (
    "max_grad_norm",
    optional(positive),
    "use a finite number > 0, or None (null) for no clipping",
)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def first_loss_position(batch: RolloutBatch) -> int:
    """The earliest column any row's loss covers (at least 1); logprobs before it are never used."""
    rows = batch.loss_mask.any(dim=1)
    if not rows.any():
        return 1
    return max(1, int(batch.loss_mask[rows].float().argmax(dim=1).min().item()))


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, micro_batch_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """Logprobs [B, T] of the batch's tokens under the model as it is now, computed in micro-batches
    (`micro_batch_slices`), without gradients (old and reference logprobs are constants of the loss)."""
    out = torch.zeros(batch.input_ids.shape, device=model_device(model))
    inner = unwrap_ddp(model)
    for rows in micro_batch_slices(batch, micro_batch_size):
        mb = batch.rows(rows.start, rows.stop, model_device(model))
        width = mb.input_ids.size(1)
        out[rows, :width] = token_logprobs(
            inner,
            mb.input_ids,
            mb.attention_mask,
            temperature,
            first_target=first_loss_position(mb),
            support_ids=mb.support_ids,
        ).logprobs
    return out


def reference_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    micro_batch_size: int,
    temperature: float = 1.0,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logprobs [B, T] under the KL reference: the same peft model with its adapter disabled (the base model),
    or, given `weights` (LoRA tensors named as `lora_tensors` names them), with those in its adapter."""
    peft_model = unwrap_ddp(model)
    if not isinstance(peft_model, PeftModel):
        raise ValueError(
            "beta > 0 takes the reference from the model's LoRA adapter (disabled, or holding the start's "
            "weights), but the model is not a peft model; wrap it with peft.get_peft_model or set beta=0"
        )
    reference = peft_model.disable_adapter() if weights is None else adapter_weights(peft_model, weights)
    with reference:
        return batch_logprobs(peft_model, batch, micro_batch_size, temperature)


def _per_rank_counts(model: torch.nn.Module, batch: RolloutBatch, device: torch.device) -> torch.Tensor:
    """[num_sequences, num_tokens] of the batch; under DDP, their mean over the ranks.

    DDP averages gradients over ranks, so normalising each rank by the mean count gives the exact
    global-batch loss even when ranks hold different numbers of tokens.
    """
    counts = torch.stack([torch.tensor(batch.num_sequences), batch.loss_mask.sum().cpu()]).float().to(device)
    if isinstance(model, DistributedDataParallel):
        torch.distributed.all_reduce(counts, group=model.process_group)
        counts /= torch.distributed.get_world_size(model.process_group)
    return counts


def accumulate_gradients(
    model: torch.nn.Module,
    batch: RolloutBatch,
    loss: LossConfig,
    *,
    micro_batch_size: int,
    max_completion_length: int | None = None,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    temperature: float = 1.0,
    record_logprobs: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> LossStats:
    """Backward the whole-batch loss in micro-batches; returns its stats. Does not step or zero grads.

    record_logprobs [B, T], when given, receives the current logprobs (detached). counts: the
    [num_sequences, num_tokens] the loss is normalised by (`_per_rank_counts`), when `batch` holds only the
    rows of a larger batch that train (`rows_that_train`); by default those of `batch`.

    The micro-batches are `micro_batch_slices`, following the rows' shared prompts where the loss type's rows
    add up. Each micro-batch's `compute_policy_loss` is weighed by the loss type's aggregation
    (`rl.algo.aggregation`). Without old_logprobs the ratio is 1 (the current logprobs, detached). [B, T]
    inputs follow `rl.algo.batch`. Under DDP, gradients sync once, on the last micro-batch; stats stay per
    rank.
    """
    aggregated = aggregation(loss.loss_type, max_completion_length)
    device = model_device(model)
    num_tokens = batch.loss_mask.sum().to(device)
    if counts is None:
        counts = _per_rank_counts(model, batch, device)
    slices = micro_batch_slices(batch, micro_batch_size, follow_prompts=aggregated.rows_add_up)
    parts = []
    for i, rows in enumerate(slices):
        mb = batch.rows(rows.start, rows.stop, device)
        width = mb.input_ids.size(1)
        last = i == len(slices) - 1
        no_sync = getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            out = token_logprobs(
                model,
                mb.input_ids,
                mb.attention_mask,
                temperature,
                with_entropy=True,
                first_target=first_loss_position(mb),
                support_ids=mb.support_ids,
            )
            old = out.logprobs.detach() if old_logprobs is None else old_logprobs[rows, :width]
            if record_logprobs is not None:
                record_logprobs[rows, :width] = out.logprobs.detach()
            mb_loss, stats = compute_policy_loss(
                out.logprobs,
                old,
                mb.advantages,
                mb.loss_mask,
                loss,
                max_completion_length=max_completion_length,
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows, :width],
                is_weights=None if is_weights is None else is_weights[rows, :width],
                entropy=out.entropy,
            )
            weight = aggregated.weight(mb.loss_mask, counts, len(slices))
            (mb_loss * weight).backward()
        parts.append((stats, weight))
    return combine_loss_stats(parts, num_tokens)


def mean_sequence_nll(batch: RolloutBatch, logprobs: torch.Tensor) -> float:
    """The mean over `batch`'s rows of each row's mean negative logprob [B, T] on its loss tokens."""
    mask = batch.loss_mask.to(logprobs.device)
    per_sequence = (logprobs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return -per_sequence.mean().item()


def rows_that_train(batch: RolloutBatch, loss: LossConfig, max_completion_length: int | None) -> torch.Tensor:
    """Indices of the rows whose loss term can be nonzero, in order; never empty.

    A row with no loss tokens adds nothing to the loss, and without the KL term (beta 0) neither does a row
    whose advantage is 0: its clipped surrogate is 0 at every ratio. Where the loss type sums per-row terms
    (`Aggregation.rows_add_up`), such rows are left out of the forward and backward, and the loss and its
    gradient stay the same; the batch's counts still normalise it. In GRPO every row of a group whose
    rewards are all equal has advantage 0. The shortest row stays when none would: every pass then runs
    one backward (which DDP's gradient sync needs), and the optimizer steps on zero gradients as it would
    on the whole batch's.
    """
    if not aggregation(loss.loss_type, max_completion_length).rows_add_up:
        return torch.arange(batch.num_sequences)
    trains = batch.loss_mask.any(dim=1)
    if loss.beta == 0.0:
        trains &= batch.advantages != 0
    if not trains.any():
        return batch.attention_mask.sum(dim=1).argmin()[None]
    return trains.nonzero()[:, 0]


def optimizer_step(optimizer, scheduler, params, max_grad_norm: float | None, loss: torch.Tensor):
    """Clip and step unless the loss or the gradient is non-finite; returns (stepped, grad_norm, lr)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    stepped = bool((torch.isfinite(loss) & torch.isfinite(grad_norm)).item())
    if stepped:
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    release_freed_heap()
    return stepped, grad_norm.item(), lr


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    return getattr(libc(), "malloc_trim", None)


def release_freed_heap() -> None:
    """Give the C heap's free pages back to the system. glibc keeps the freed activations of the micro-batches
    (tensors of a few MiB, below its mmap threshold) in its heap: about 1.6 GB after a step of the default
    job, under every rollout and evaluation until the next step reuses it."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _mismatch(batch: RolloutBatch, logprobs: torch.Tensor, cap: float) -> ISCorrection:
    """Sampler/trainer logprob mismatch statistics (the weights are not applied)."""
    device = logprobs.device
    return importance_weights(
        logprobs, batch.sampling_logprobs.to(device), batch.loss_mask.to(device), cap=cap
    )


def _is_correction(batch: RolloutBatch, old: torch.Tensor | None, loss: LossConfig) -> ISCorrection | None:
    if loss.is_mode == "none":
        return None
    sampling, mask = batch.sampling_logprobs.to(old.device), batch.loss_mask.to(old.device)
    return importance_weights(old, sampling, mask, loss.is_mode, cap=loss.is_cap)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    batch: RolloutBatch,
    loss: LossConfig,
    *,
    micro_batch_size: int,
    max_grad_norm: float | None,
    temperature: float,
    max_completion_length: int | None = None,
    anchor: RolloutBatch | None = None,
    reference: Mapping[str, torch.Tensor] | None = None,
) -> StepStats:
    """loss.num_iterations (mu) optimizer steps over `batch`, each accumulating gradients over micro-batches.

    Old logprobs are recomputed once (only when mu > 1 or loss.is_mode is set; otherwise the ratio is 1), and
    the reference once when loss.beta > 0: the base model, or with loss.kl_reference "start" the adapter
    weights `reference` (the LoRA tensors the GRPO stage began with, named as `lora_tensors` names them).
    A step whose loss or gradient is non-finite is skipped: no optimizer or scheduler step, gradients
    cleared, counted in num_skipped_steps. Rows whose gradient is
    exactly zero are not run (`rows_that_train`, counted in num_rows_skipped); the loss statistics and the
    sampler/trainer mismatch are then over the rows that ran. temperature: the sampling temperature;
    max_completion_length: the generation length limit (loss_type dr_grpo divides by it). anchor: rows
    (demonstrations) whose NLL, times each row's advantage, joins every pass's loss, as InstructGPT's PPO-ptx
    mixes in its pretraining loss: the policy keeps what supervision taught while the reward moves it.
    """
    check_args(
        (MICRO_BATCH_SIZE_RULE, MAX_GRAD_NORM_RULE),
        micro_batch_size=micro_batch_size,
        max_grad_norm=max_grad_norm,
    )
    if loss.mask_truncated_completions:
        batch = dataclasses.replace(batch, loss_mask=batch.loss_mask & ~batch.truncated[:, None])
    counts = _per_rank_counts(model, batch, model_device(model))
    num_tokens = int(batch.loss_mask.sum().item())
    completions = CompletionStats.from_lengths(batch.completion_lengths, batch.truncated)
    trained = rows_that_train(batch, loss, max_completion_length)
    num_rows, batch = batch.num_sequences, batch.select(trained)
    old = None
    if loss.num_iterations > 1 or loss.is_mode != "none":
        old = batch_logprobs(model, batch, micro_batch_size, temperature)
    ref = None
    if loss.beta > 0.0:
        if loss.kl_reference.value == "start" and reference is None:
            raise ValueError("kl_reference='start' needs the start's adapter weights: pass reference=")
        weights = reference if loss.kl_reference.value == "start" else None
        ref = reference_logprobs(model, batch, micro_batch_size, temperature, weights)
    correction = _is_correction(batch, old, loss)
    is_weights = None if correction is None else correction.weights
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.zero_grad(set_to_none=True)
    start = [p.detach().clone() for p in params]  # for the update's norm (LoRA: a few MB)
    losses, grad_norms, skipped, lr = [], [], 0, 0.0
    split_norms: list[tuple[float, float]] = []  # with an anchor: (policy-gradient, anchor) gradient norms
    # Without a correction the sampler/trainer mismatch is still reported, from the first pass's logprobs.
    seen = torch.zeros(batch.input_ids.shape, device=model_device(model)) if correction is None else None
    anchor_nll: list[float] = []
    if anchor is not None:
        anchor_logprobs = torch.zeros(anchor.input_ids.shape, device=model_device(model))
    for iteration in range(loss.num_iterations):
        stats = accumulate_gradients(
            model, batch, loss, micro_batch_size=micro_batch_size,
            max_completion_length=max_completion_length, old_logprobs=old, ref_logprobs=ref,
            is_weights=is_weights, temperature=temperature, record_logprobs=seen if iteration == 0 else None,
            counts=counts,
        )  # fmt: skip
        total = stats.loss
        if anchor is not None:
            policy_grads = _grads(params)
            anchored = accumulate_gradients(
                model, anchor, NLL, micro_batch_size=micro_batch_size, record_logprobs=anchor_logprobs
            )
            anchor_grads = [g - p for g, p in zip(_grads(params), policy_grads, strict=True)]
            split_norms.append((_norm(policy_grads), _norm(anchor_grads)))
            total = total + anchored.loss
            anchor_nll.append(mean_sequence_nll(anchor, anchor_logprobs))
        stepped, grad_norm, lr = optimizer_step(optimizer, scheduler, params, max_grad_norm, total)
        skipped += not stepped
        losses.append(stats)
        grad_norms.append(grad_norm)
    return StepStats(
        loss=mean_loss_stats(losses),
        grad_norm=sum(grad_norms) / loss.num_iterations,
        lr=lr,
        num_tokens=num_tokens,
        num_optimizer_steps=loss.num_iterations - skipped,
        num_skipped_steps=skipped,
        num_rows_skipped=num_rows - batch.num_sequences,
        completions=completions,
        sampling=(correction or _mismatch(batch, seen, loss.is_cap)).as_dict(),
        anchor_nll=sum(anchor_nll) / len(anchor_nll) if anchor_nll else None,
        update_norm=_norm([p.detach() - s for p, s in zip(params, start, strict=True)]),
        split_grad_norms=_mean_pair(split_norms),
    )


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each parameter's gradient so far (zeros where it has none)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]


def _mean_pair(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The mean of each member of the pairs; None for no pairs."""
    return (sum(a for a, _ in pairs) / len(pairs), sum(b for _, b in pairs) / len(pairs)) if pairs else None


def _norm(tensors: list[torch.Tensor]) -> float:
    """The L2 norm of tensors taken together."""
    return math.sqrt(sum(t.float().pow(2).sum().item() for t in tensors))
