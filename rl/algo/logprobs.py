"""Per-token logprobs (and entropy) of a causal LM, aligned as described in `rl.algo.batch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from host.cpu_threads import adapt_cpu_threads
from rl.algo.attention import PACKED_ROWS, SDPA_GQA
from rl.algo.lora_fused import fused_lora

# attention implementations that apply a 4D additive attention mask as given
CUSTOM_MASK_ATTENTION = ("eager", "sdpa", SDPA_GQA)
# the KV cache's forward argument and output field: transformers 5.24 renamed past_key_values to cache
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


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
    support_ids: torch.Tensor | None = None,
) -> TokenLogprobs:
    """logprobs[:, t] = log softmax(logits[:, t-1] / temperature)[input_ids[:, t]] for [B, T] inputs.

    Where `support_ids` [B, T, W] (-1 padded, `rl.algo.batch`) lists the tokens a constrained position was
    sampled among, the softmax is over them alone: the distribution the engine sampled that token from
    (`rollout_engine.constraints`), and the entropy is that distribution's.

    Use the sampling temperature so the logprobs match the engine's. Position ids count only attended
    tokens, so rows with padding on either side get the positions they had when generated. Only targets
    t >= first_target are computed (earlier ones hold 0): the LM head and the softmax over the vocabulary
    then skip the prompt, which is most of a text-to-SQL row.

    When right-padded rows start with the same tokens (the G samples of one GRPO prompt), that shared prefix
    runs once, and the rest of the rows run packed after it without their padding: the same logprobs and,
    through the prefix's KV cache, the same gradients, for a fraction of the compute; targets on padding
    then hold 0. Plain LoRA projections run fused (`rl.algo.lora_fused`).
    """
    if temperature <= 0.0:
        raise ValueError(f"temperature must be > 0 to define logprobs, got {temperature}")
    if input_ids.device.type == "cpu":
        adapt_cpu_threads()  # the backward that follows runs with the same threads
    attention_mask = attention_mask.long()
    shared = shared_prefix_length(input_ids, attention_mask, limit=first_target - 1)
    with fused_lora(model):
        if shared and _takes_custom_masks(model) and _right_padded(attention_mask):
            rows, cols, logits = _packed_group_logits(model, input_ids, attention_mask, shared, first_target)
        else:
            rows, cols, logits = _padded_logits(model, input_ids, attention_mask, first_target)
    support = None if support_ids is None or not support_ids.size(-1) else support_ids[rows, cols]
    picked, entropy_values = TargetLogprobs.apply(logits, input_ids[rows, cols], temperature, support)
    logprobs = picked.new_zeros(input_ids.shape).index_put((rows, cols), picked)
    entropy = None
    if with_entropy:
        entropy = torch.zeros_like(logprobs).index_put_((rows, cols), entropy_values)
    return TokenLogprobs(logprobs=logprobs, entropy=entropy)


class TargetLogprobs(torch.autograd.Function):
    """(log softmax(logits / T)[target], entropy of softmax(logits / T)) per row of logits [K, V], the softmax
    taken over a row's `support` tokens alone ([K, W], -1 padded) where it lists any.

    One pass keeps the softmax for the backward, whose gradient (onehot - softmax) * g / T is written
    once: autograd's chain of divide, logsumexp and gather would sweep the [K, V] logits about twice as
    often. Outside a row's support its softmax is 0, so those logits get no gradient. The entropy is detached.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, support=None):
        scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # bf16 -> fp32
        log_norm = scaled.logsumexp(dim=-1)
        probs = (scaled - log_norm[:, None]).exp_()
        entropy = log_norm - (probs * scaled).sum(dim=-1)
        if support is not None and (support >= 0).any():
            _restrict(scaled, support, log_norm, probs, entropy)
        picked = scaled.gather(-1, targets[:, None])[:, 0] - log_norm
        ctx.save_for_backward(probs, targets)
        ctx.temperature, ctx.dtype = temperature, logits.dtype
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx, grad_picked: torch.Tensor, _grad_entropy: torch.Tensor):
        probs, targets = ctx.saved_tensors
        scale = grad_picked / ctx.temperature
        grad = probs * -scale[:, None]
        grad[torch.arange(len(targets), device=grad.device), targets] += scale
        return grad.to(ctx.dtype), None, None, None


def _restrict(
    scaled: torch.Tensor,
    support: torch.Tensor,
    log_norm: torch.Tensor,
    probs: torch.Tensor,
    entropy: torch.Tensor,
) -> None:
    """Overwrite, in the rows of `scaled` [K, V] whose `support` [K, W] lists tokens, the log-normaliser,
    softmax and entropy with those of the softmax over the listed tokens alone."""
    rows = (support >= 0).any(dim=1).nonzero()[:, 0]
    ids = support[rows]
    listed = ids >= 0
    values = scaled[rows[:, None], ids.clamp(min=0)].masked_fill(~listed, float("-inf"))  # [P, W]
    norm = values.logsumexp(dim=-1)
    restricted = (values - norm[:, None]).exp()  # 0 on padding
    log_norm[rows] = norm
    entropy[rows] = norm - (restricted * values.masked_fill(~listed, 0.0)).sum(dim=-1)
    probs.index_fill_(0, rows, 0.0)
    probs[rows[:, None].expand_as(ids)[listed], ids[listed]] = restricted[listed]


def _right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row attends to a run of leading columns and nothing after it."""
    lengths = attention_mask.sum(dim=1, keepdim=True)
    columns = torch.arange(attention_mask.size(1), device=attention_mask.device)
    return bool((attention_mask.bool() == (columns < lengths)).all().item())


def _takes_custom_masks(model: torch.nn.Module) -> bool:
    """The model's attention applies a 4D additive mask as given (flash-attention and flex do not)."""
    return unwrap_ddp(model).config._attn_implementation in CUSTOM_MASK_ATTENTION


def _padded_logits(model, input_ids, attention_mask, first_target: int):
    """Logits of every row at columns first_target-1 .. T-2 (padding included), as (rows, target columns,
    logits [num_targets, V]), from one forward of the padded batch."""
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    num_targets = input_ids.size(1) - first_target
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=num_targets + 1,
    )
    batch = input_ids.size(0)
    rows = torch.arange(batch, device=input_ids.device).repeat_interleave(num_targets)
    cols = torch.arange(first_target, input_ids.size(1), device=input_ids.device).repeat(batch)
    return rows, cols, out.logits[:, :-1].reshape(batch * num_targets, -1)


def _packed_group_logits(model, input_ids, attention_mask, shared: int, first_target: int):
    """Logits of the attended targets of right-padded rows that share their first `shared` tokens.

    The prefix runs once, into a KV cache of one row; then the rows' remaining tokens run as one packed
    row after it, without padding: a mask lets each row's tokens see the prefix and the earlier tokens of
    their own row, and each keeps the positions it had in its row. Gradients reach the prefix's
    computation through the cache. `rl.algo.attention` reads the rows' lengths instead of the mask and
    attends each row to exactly those keys.
    """
    lengths = attention_mask.sum(dim=1)
    device = input_ids.device
    suffix = torch.arange(input_ids.size(1), device=device) >= shared
    keep = attention_mask.bool() & suffix  # [B, T]: the packed tokens, row by row
    rows, cols = keep.nonzero(as_tuple=True)
    packed_ids = input_ids[rows, cols][None]  # [1, N]
    same_row = rows[:, None] == rows[None, :]
    causal = torch.ones(len(rows), len(rows), dtype=torch.bool, device=device).tril()
    sees = torch.cat([same_row.new_ones(len(rows), shared), same_row & causal], dim=1)  # [N, shared + N]
    # additive, as eager attention adds it to the scores; SDPA takes it alike
    dtype = unwrap_ddp(model).get_input_embeddings().weight.dtype
    mask = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill_(~sees, torch.finfo(dtype).min)
    # logits at packed token j predict the token after it in its row, when that is a target
    predicts = (cols + 1 < lengths[rows]) & (cols + 1 >= first_target)
    cache = _prefix_cache(unwrap_ddp(model), input_ids[:1, :shared])
    out = model(
        input_ids=packed_ids,
        attention_mask=mask[None, None],
        position_ids=cols[None],
        use_cache=True,
        logits_to_keep=predicts.nonzero()[:, 0],
        **{CACHE: cache, PACKED_ROWS: (shared, (lengths - shared).tolist())},
    )
    return rows[predicts], cols[predicts] + 1, out.logits[0]


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """How many leading columns (at most `limit`) hold the same, attended token in every row; 0 for a
    single row, which has nothing to share."""
    if input_ids.size(0) < 2 or limit < 1:
        return 0
    head = input_ids[:, :limit]
    same = (head == head[:1]).all(dim=0) & attention_mask[:, :limit].bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum().item())


def _prefix_cache(inner: torch.nn.Module, prefix_ids: torch.Tensor):
    """The KV cache of `prefix_ids` [1, P] (differentiable).

    Runs the inner module of a DistributedDataParallel wrapper: DDP's forward must run once per backward,
    and its gradient hooks fire for the prefix's contribution all the same.
    """
    positions = torch.arange(prefix_ids.size(1), device=prefix_ids.device)[None]
    out = inner(input_ids=prefix_ids, position_ids=positions, use_cache=True, logits_to_keep=1)
    return getattr(out, CACHE)
