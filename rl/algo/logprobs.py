"""Per-token logprobs (and entropy) of a causal LM, aligned as described in `rl.algo.batch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.cpu_threads import adapt_cpu_threads
from rl.algo.lora_fused import fused_lora


def unwrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel wrapper (the peft model), or the model itself."""
    return getattr(model, "module", model)


@dataclass(slots=True)
class TokenLogprobs:
    logprobs: torch.Tensor  # [B, T], 0 at position 0
    entropy: torch.Tensor | None  # [B, T] detached, 0 at position 0


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    first_target: int = 1,
) -> TokenLogprobs:
    """logprobs[:, t] = log softmax(logits[:, t-1] / temperature)[input_ids[:, t]] for [B, T] inputs.

    Use the sampling temperature so the logprobs match the engine's. Position ids count only attended
    tokens, so rows with padding on either side get the positions they had when generated. Only targets
    t >= first_target are computed (earlier ones hold 0): the LM head and the softmax over the vocabulary
    then skip the prompt, which is most of a text-to-SQL row.

    When every row starts with the same tokens (the G samples of one GRPO prompt), that shared prefix runs
    once and its KV cache is repeated over the rows: the same logprobs and, through the cache, the same
    gradients, for a fraction of the compute. Plain LoRA projections run fused (`rl.algo.lora_fused`).
    """
    if temperature <= 0.0:
        raise ValueError(f"temperature must be > 0 to define logprobs, got {temperature}")
    if input_ids.device.type == "cpu":
        adapt_cpu_threads()  # the backward that follows runs with the same threads
    attention_mask = attention_mask.long()
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    num_targets = input_ids.size(1) - first_target
    shared = shared_prefix_length(input_ids, attention_mask, limit=first_target - 1)
    with fused_lora(model):
        past = _prefix_cache(model, input_ids[:1, :shared], input_ids.size(0)) if shared else None
        out = model(
            input_ids=input_ids[:, shared:],
            attention_mask=attention_mask,
            position_ids=position_ids[:, shared:],
            cache=past,
            use_cache=past is not None,
            logits_to_keep=num_targets + 1,
        )
    logits = out.logits[:, :-1].float() / temperature  # [B, num_targets, V]
    log_norm = logits.logsumexp(dim=-1)  # [B, num_targets]
    picked = logits.gather(-1, input_ids[:, first_target:, None]).squeeze(-1) - log_norm
    first = picked.new_zeros(picked.size(0), first_target)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            expected_logit = (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
            entropy = torch.cat([first, log_norm - expected_logit], dim=1)
    return TokenLogprobs(logprobs=torch.cat([first, picked], dim=1), entropy=entropy)


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """How many leading columns (at most `limit`) hold the same, attended token in every row; 0 for a
    single row, which has nothing to share."""
    if input_ids.size(0) < 2 or limit < 1:
        return 0
    head = input_ids[:, :limit]
    same = (head == head[:1]).all(dim=0) & attention_mask[:, :limit].bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum().item())


def _prefix_cache(model: torch.nn.Module, prefix_ids: torch.Tensor, num_rows: int):
    """The KV cache of `prefix_ids` [1, P], repeated to `num_rows` rows (differentiable).

    Runs the inner module of a DistributedDataParallel wrapper: DDP's forward must run once per backward,
    and its gradient hooks fire for the prefix's contribution all the same.
    """
    inner = unwrap_ddp(model)
    positions = torch.arange(prefix_ids.size(1), device=prefix_ids.device)[None]
    out = inner(input_ids=prefix_ids, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.cache
    cache.batch_repeat_interleave(num_rows)
    return cache
