"""Per-token logprobs (and entropy) of a causal LM, aligned as described in `rl.batch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """
    if temperature <= 0.0:
        raise ValueError(f"temperature must be > 0 to define logprobs, got {temperature}")
    attention_mask = attention_mask.long()
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    num_targets = input_ids.size(1) - first_target
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
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
