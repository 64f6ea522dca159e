"""Token sampling: temperature, top-k, top-p, per-sample seeds, and the logprob of each sampled token.

Logprob convention (the trainer's importance-sampling correction relies on it): the logprob of a
sampled token is log_softmax(logits / T)[token] under the temperature-scaled but UNFILTERED
distribution, i.e. before top-k / top-p truncation. For greedy decoding (T = 0) it is taken at T = 1,
log_softmax(logits)[token]. `top_logprobs` gives the most likely tokens of a row under that same
distribution, for callers that want the alternatives beside each sampled token.

Sampling draws one uniform number per token from the sample's own `random.Random` (seeded with
seed + sample index) and inverts the CDF of the filtered distribution, so a sample's tokens depend
only on its logits and its seed, never on which other sequences share the batch.

When no row truncates (top_k = -1, top_p = 1) and the logits are fp32 on CPU, the C kernel of
pagedrl_kernels/sampling.py inverts the same CDF from the same uniforms in two passes over each row; the
PyTorch code here is the reference, and runs everything else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from pagedrl_kernels.sampling import cpu_sampling_supported, sample_rows_cpu

_CDF_BLOCK = 1024


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling settings, one row per token to sample."""

    temperatures: list[float]
    top_ks: list[int]
    top_ps: list[float]
    rngs: list[random.Random]


def _filter_top_k_top_p(scaled: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf. scaled [rows, vocab]."""
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)
    k = torch.tensor([vocab if top_k < 0 else top_k for top_k in top_ks], device=scaled.device)
    drop = ranks[None, :] >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    p = torch.tensor(top_ps, device=scaled.device, dtype=probs.dtype)
    # Drop a token once the mass strictly before it already reaches top_p; the top token always stays.
    drop |= (probs.cumsum(dim=-1) - probs) >= p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token whose CDF interval holds u x total mass, per row. probs [rows, vocab], uniforms [rows] in [0, 1).

    Two levels (blocks of _CDF_BLOCK tokens, then tokens inside the chosen block) because a cumsum over
    the whole vocabulary is a slow sequential scan on CPU.
    """
    rows, vocab = probs.shape
    pad = -vocab % _CDF_BLOCK
    padded = torch.nn.functional.pad(probs, (0, pad)) if pad else probs  # pad copies, even by nothing
    blocks = padded.view(rows, -1, _CDF_BLOCK)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # [rows, num_blocks]
    target = uniforms[:, None] * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)  # [rows, 1]
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner_cdf = blocks.gather(1, block[:, :, None].expand(rows, 1, _CDF_BLOCK)).squeeze(1).cumsum(dim=-1)
    # Rounding between the two levels must not push the target past the block's last token with mass.
    inner_target = torch.minimum((target - before).clamp(min=0.0), inner_cdf[:, -1:] * (1.0 - 2.0**-20))
    inner = torch.searchsorted(inner_cdf, inner_target, right=True)
    return (block * _CDF_BLOCK + inner).squeeze(1)


def _uniforms(greedy_rows: list[bool], rngs: list[random.Random]) -> list[float]:
    """One uniform per row from its own generator, in row order; greedy rows draw none."""
    return [0.0 if g else rng.random() for g, rng in zip(greedy_rows, rngs, strict=True)]


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [rows, vocab] (fp32); returns (token ids [rows], logprobs [rows])."""
    device = logits.device
    greedy_rows = [temperature == 0 for temperature in batch.temperatures]
    truncates = any(k > 0 for k in batch.top_ks) or any(p < 1.0 for p in batch.top_ps)
    if not truncates and cpu_sampling_supported(logits):
        return sample_rows_cpu(logits, batch.temperatures, _uniforms(greedy_rows, batch.rngs))
    scales = [1.0 if g else t for g, t in zip(greedy_rows, batch.temperatures, strict=True)]
    scaled = (
        logits if all(s == 1.0 for s in scales) else logits / torch.tensor(scales, device=device)[:, None]
    )
    probs = scaled.softmax(dim=-1)  # [rows, vocab], unfiltered
    if all(greedy_rows):
        tokens = logits.argmax(dim=-1)
    else:
        filtered = probs
        if truncates:
            filtered = _filter_top_k_top_p(scaled, batch.top_ks, batch.top_ps).softmax(dim=-1)
        uniforms = torch.tensor(_uniforms(greedy_rows, batch.rngs), device=device, dtype=probs.dtype)
        tokens = _inverse_cdf(filtered, uniforms)
        if any(greedy_rows):
            tokens = torch.where(torch.tensor(greedy_rows, device=device), logits.argmax(dim=-1), tokens)
    # A sampled (or argmax) token has a probability far above fp32's underflow, so its log is exact enough.
    logprobs = probs.gather(1, tokens[:, None]).squeeze(1).log()
    return tokens, logprobs


def top_logprobs(
    logits: torch.Tensor, temperatures: list[float], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each row of logits [rows, vocab] under log_softmax(logits / T) (T = 1 for
    greedy rows), the distribution `sample` takes its logprobs from; returns (logprobs [rows, k], token ids
    [rows, k]), most likely first."""
    scales = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=logits.device)
    return torch.log_softmax(logits.float() / scales[:, None], dim=-1).topk(k, dim=-1)
