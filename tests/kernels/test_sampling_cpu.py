"""The C sampling kernel (pagedrl_kernels/sampling.py) against float64 CDFs computed here with torch: each
token lies in the CDF interval holding its uniform and has nonzero probability, its logprob is log_softmax's,
greedy rows take torch.argmax, and uniforms next to 1 stay inside the vocabulary; against the PyTorch path
of sample on a full-size batch; and the dispatch of sample between the two."""

import random

import pytest
import torch

from pagedrl_kernels import use_backend
from pagedrl_kernels.cpu_library import load_library
from pagedrl_kernels.sampling import cpu_sampling_supported, sample_rows_cpu
from rollout_engine import sampler
from rollout_engine.sampler import SamplingBatch, sample

TEMPERATURES = [1.0, 0.0, 0.7, 1.5, 0.3]


@pytest.fixture(autouse=True)
def built() -> None:
    """Without the library, sample would run the reference and these tests would compare it with itself."""
    assert load_library("sampling") is not None, "the C sampling kernel did not build (see the warning)"


def varied_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of every kind the kernel meets: ordinary, flat, peaked, with -inf entries, with tied maxima."""
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[1::5] *= 0.01  # nearly flat
    peaks = torch.randint(vocab, (rows,), generator=gen)
    peaked = torch.arange(2, rows, 5)
    logits[peaked, peaks[peaked]] += 25.0
    masked = (torch.rand(rows, vocab, generator=gen) < 0.4).scatter_(1, peaks[:, None], False)  # one stays
    logits[3::5] = logits[3::5].masked_fill(masked[3::5], float("-inf"))
    logits[4::5] = logits[4::5].round()  # many ties at the maximum
    return logits


def float64_cdf(logits: torch.Tensor, temperatures: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax, cumulative softmax) of logits / T in float64, T = 1 for greedy rows."""
    scales = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32).double()
    probs = (logits.double() / scales[:, None]).softmax(dim=-1)
    return probs, probs.cumsum(dim=-1)


def within_interval(
    cdf: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor, tol: float
) -> torch.Tensor:
    """Per row, whether cdf[token - 1] <= u <= cdf[token] up to tol (cdf[-1] = 0)."""
    below = cdf.gather(1, (tokens - 1).clamp(min=0)[:, None]).squeeze(1).masked_fill(tokens == 0, 0.0)
    above = cdf.gather(1, tokens[:, None]).squeeze(1)
    return (below - tol <= uniforms) & (uniforms <= above + tol)


def check_samples(logits, temperatures, uniforms, tokens, logprobs) -> None:
    """Tokens against float64 CDF intervals, logprobs against float64 log_softmax, greedy rows at argmax."""
    probs, cdf = float64_cdf(logits, temperatures)
    assert tokens.dtype == torch.int64 and ((tokens >= 0) & (tokens < logits.shape[1])).all()
    assert (probs.gather(1, tokens[:, None]) > 0).all(), "a zero-probability token was sampled"
    greedy = torch.tensor([t == 0 for t in temperatures])
    sampled = ~greedy
    u = torch.tensor(uniforms, dtype=torch.float64)
    ok = within_interval(cdf[sampled], tokens[sampled], u[sampled], 1e-5)
    assert ok.all(), f"rows {sampled.nonzero().squeeze(1)[~ok].tolist()} sampled outside their CDF interval"
    assert tokens[greedy].tolist() == logits[greedy].argmax(dim=-1).tolist()
    want = probs.log().gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("vocab", [1, 50, 1000, 4097, 49152])
def test_tokens_lie_in_their_cdf_interval_and_logprobs_match(vocab, gen, poison_allocations):
    rows = 40
    logits = varied_logits(rows, vocab, gen)
    temperatures = [TEMPERATURES[r % len(TEMPERATURES)] for r in range(rows)]
    uniforms = torch.rand(rows, generator=gen).tolist()  # fp32 values, as the kernel reads them
    tokens, logprobs = sample_rows_cpu(logits, temperatures, uniforms)
    check_samples(logits, temperatures, uniforms, tokens, logprobs)


def test_strided_rows(gen):
    logits = torch.randn(12, 3000, generator=gen)[:, 500:2600]  # rows 3000 apart, 2100 columns
    temperatures, uniforms = [1.0] * 12, torch.rand(12, generator=gen).tolist()
    tokens, logprobs = sample_rows_cpu(logits, temperatures, uniforms)
    check_samples(logits, temperatures, uniforms, tokens, logprobs)


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-24, 1.0])
def test_extreme_uniforms_stay_on_tokens_with_mass(u, gen):
    vocab = 4097
    logits = torch.randn(6, vocab, generator=gen)
    logits[0, :-1] = float("-inf")  # all the mass on the last token, alone in the last block
    logits[1, :-1] = float("-inf")
    logits[1, 1000] = 0.0  # ... and on one token inside the first block too
    logits[2, -100:] = float("-inf")  # the row's tail is massless
    logits[3, 1024:] = float("-inf")  # whole blocks at the end are massless
    logits[4, :7] = float("-inf")  # the first tokens are massless
    logits[5] *= 30  # nearly all the mass on a few tokens
    temperatures, uniforms = [1.0] * 6, [u] * 6
    tokens, logprobs = sample_rows_cpu(logits, temperatures, uniforms)
    check_samples(logits, temperatures, uniforms, tokens, logprobs)
    assert tokens[0].item() == vocab - 1
    assert tokens[1].item() == (1000 if u == 0.0 else vocab - 1)
    if u == 0.0:
        assert tokens[4].item() == 7
    else:
        assert tokens[2].item() == logits[2].isfinite().nonzero().max().item()
        assert tokens[3].item() == logits[3].isfinite().nonzero().max().item()


def test_greedy_takes_the_first_of_tied_maxima():
    logits = torch.zeros(2, 2000)
    logits[0, [700, 19, 3, 1999]] = 5.0  # 3 and 19 fall in the same vector lane
    logits[1, [1056, 1040, 1999]] = 5.0
    tokens, _ = sample_rows_cpu(logits, [0.0, 0.0], [0.0, 0.0])
    assert tokens.tolist() == [3, 1040] == logits.argmax(dim=-1).tolist()


def test_matches_the_torch_path_on_a_full_batch(gen):
    rows, vocab = 256, 49152
    logits = torch.randn(rows, vocab, generator=gen) * 4
    temperatures = [[1.0, 0.7, 0.0, 1.0][r % 4] for r in range(rows)]
    seed = int(torch.randint(2**30, (1,), generator=gen))

    def draw() -> SamplingBatch:
        rngs = [random.Random(seed + r) for r in range(rows)]
        return SamplingBatch(temperatures, [-1] * rows, [1.0] * rows, rngs)

    tokens, logprobs = sample(logits, draw())
    with use_backend("torch"):
        want_tokens, want_logprobs = sample(logits, draw())
    uniforms = torch.tensor(
        [0.0 if t == 0 else rng.random() for t, rng in zip(temperatures, draw().rngs, strict=True)]
    ).double()  # fp32, as both paths read them
    differ = tokens != want_tokens
    assert not differ[torch.tensor(temperatures) == 0].any()
    if differ.any():  # only a uniform on the boundary between the two tokens, within rounding, may split them
        _, cdf = float64_cdf(logits[differ], [t for t, d in zip(temperatures, differ, strict=True) if d])
        for candidate in (tokens[differ], want_tokens[differ]):
            assert within_interval(cdf, candidate, uniforms[differ], 1e-6).all()
    same = ~differ
    # The reference's logprob is the log of its fp32 softmax, itself up to about 1e-5 off float64's.
    torch.testing.assert_close(logprobs[same], want_logprobs[same], atol=3e-5, rtol=0)


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """Rows passed to each call of the C kernel by sample."""
    calls, launch = [], sampler.sample_rows_cpu

    def spy(logits, temperatures, uniforms):
        calls.append(logits.shape[0])
        return launch(logits, temperatures, uniforms)

    monkeypatch.setattr(sampler, "sample_rows_cpu", spy)
    return calls


def test_untruncated_rows_take_the_kernel(kernel_calls, gen):
    logits = torch.randn(4, 300, generator=gen)
    rngs = [random.Random(r) for r in range(4)]
    tokens, _ = sample(logits, SamplingBatch([1.0, 0.0, 0.5, 2.0], [-1] * 4, [1.0] * 4, rngs))
    assert kernel_calls == [4]
    assert tokens[1].item() == logits[1].argmax().item()


@pytest.mark.parametrize(("top_k", "top_p"), [(1, 1.0), (-1, 1e-6)])
def test_a_truncating_row_sends_the_batch_to_the_torch_path(kernel_calls, top_k, top_p, gen):
    logits = torch.randn(3, 300, generator=gen) * 3
    rngs = [random.Random(r) for r in range(3)]
    tokens, _ = sample(logits, SamplingBatch([1.0] * 3, [-1, top_k, -1], [1.0, top_p, 1.0], rngs))
    assert kernel_calls == []
    assert tokens[1].item() == logits[1].argmax().item()  # one candidate left: the most likely token


def test_the_kernel_applies_to_fp32_cpu_rows_with_contiguous_columns_under_auto(kernel_calls, gen):
    logits = torch.randn(8, 64, generator=gen)
    assert cpu_sampling_supported(logits) and cpu_sampling_supported(logits[::2, 3:50])
    assert not cpu_sampling_supported(logits.t())
    assert not cpu_sampling_supported(logits.double()) and not cpu_sampling_supported(logits.bfloat16())
    with use_backend("torch"):
        assert not cpu_sampling_supported(logits)
        sample(logits, SamplingBatch([1.0] * 8, [-1] * 8, [1.0] * 8, [random.Random(0)] * 8))
    assert kernel_calls == []
