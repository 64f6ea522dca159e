"""Token sampling on CPU in C (pagedrl_kernels/cpu/sampling.c) for rows without top-k or top-p: the token
whose CDF interval under softmax(logits / T) holds each row's uniform, and its logprob, in two passes over
each row and no [rows, vocab] intermediate. It is tested against float64 CDFs and against the PyTorch path of
rollout_engine.sampler.sample, which stays the reference."""

from __future__ import annotations

import torch

from pagedrl_kernels.cpu_library import I32, I64, PTR, CpuKernel

# The largest vocabulary pagedrl_kernels/cpu/sampling.c was compiled for: CDF_BLOCK * MAX_BLOCKS tokens.
MAX_VOCAB = 1024 * 1024

_sample_rows = CpuKernel("sampling", "sample_rows_f32", PTR, I64, I32, I32, PTR, PTR, PTR, PTR)


def cpu_sampling_supported(logits: torch.Tensor) -> bool:
    """Whether the C kernel samples these logits [rows, vocab]: fp32 CPU rows with contiguous columns and a
    vocabulary within its compiled limit (see CpuKernel.available)."""
    return (
        logits.dim() == 2
        and logits.stride(1) == 1
        and 1 <= logits.shape[1] <= MAX_VOCAB
        and _sample_rows.available(logits)
    )


def sample_rows_cpu(
    logits: torch.Tensor, temperatures: list[float], uniforms: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of logits [rows, vocab], the token whose CDF interval under softmax(logits / T) holds u, and
    log_softmax(logits / T) at it; T = 0 is greedy: the argmax, with the logprob at T = 1. Returns (token ids
    [rows] int64, logprobs [rows] fp32). Temperatures and uniforms (in [0, 1]) are one per row, as fp32."""
    rows, vocab = logits.shape
    temperatures_f32 = torch.tensor(temperatures, dtype=torch.float32)
    uniforms_f32 = torch.tensor(uniforms, dtype=torch.float32)
    if temperatures_f32.shape != (rows,) or uniforms_f32.shape != (rows,):
        raise ValueError(
            f"sample_rows_cpu needs one temperature and one uniform per row of its {rows} rows; got "
            f"{len(temperatures)} and {len(uniforms)}"
        )
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    status = _sample_rows(
        logits.data_ptr(),
        logits.stride(0),
        rows,
        vocab,
        temperatures_f32.data_ptr(),
        uniforms_f32.data_ptr(),
        tokens.data_ptr(),
        logprobs.data_ptr(),
    )
    if status != 0:
        raise ValueError(
            f"the C sampling kernel takes a vocabulary of 1 to {MAX_VOCAB} tokens and temperatures >= 0; got "
            f"{vocab} and {temperatures}"
        )
    return tokens, logprobs
