"""LoRA shrink/expand against a hand-written float64 formula (x A^T B^T * scale * mask), each kernel against
its reference, refused inputs, and the engine with the Triton path forced against the reference path. The
grouped shrink_expand (one shrink over the stacked A of projections sharing an input) gets the same checks,
per projection, on every backend."""

import gc

import pytest
import torch

import pagedrl_kernels.lora
from pagedrl_kernels import use_backend
from pagedrl_kernels.cpu_gemm import HAS_MKL_PACKING, PackPart, packed_stacked_linear, packed_weight_bytes
from pagedrl_kernels.lora import StackedLora, lora_expand, lora_shrink, lora_shrink_expand
from rollout_engine import SamplingParams
from tests.helpers.rollout_tiny_models import make_engine, peft_model, random_prompts

SCALE = 0.75


def lora_inputs(num_tokens, in_features, out_features, rank, gen, dtype=torch.float32):
    """x, A, B scaled like a trained adapter, so h and the delta are O(1)."""
    x = torch.randn(num_tokens, in_features, generator=gen)
    a = torch.randn(rank, in_features, generator=gen) / in_features**0.5
    b = torch.randn(out_features, rank, generator=gen) / rank**0.5
    return x.to(dtype), a.to(dtype), b.to(dtype)


def mixed_mask(num_tokens, gen):
    """A random 0/1 mask [num_tokens, 1] whose first token is off and whose last (if not the first) is on."""
    mask = torch.randint(0, 2, (num_tokens, 1), generator=gen).float()
    mask[-1] = 1.0
    mask[0] = 0.0
    return mask


def formula(x, a, b, scale, mask):
    """The delta by hand, in float64."""
    delta = x.double() @ a.double().T @ b.double().T * scale
    return delta if mask is None else delta * mask.double()


def stacked_inputs(num_tokens, in_features, out_features, rank, gen, dtype=torch.float32):
    """x and, per projection, its own random A [r, in] and B [out, r]: a projection that read another's rows
    of the stacked A (or another's B) would be off by O(1)."""
    x = torch.randn(num_tokens, in_features, generator=gen).to(dtype)
    a_list = [
        (torch.randn(rank, in_features, generator=gen) / in_features**0.5).to(dtype) for _ in out_features
    ]
    b_list = [(torch.randn(out, rank, generator=gen) / rank**0.5).to(dtype) for out in out_features]
    return x, a_list, b_list


def run_backend(backend, request):
    if backend == "triton":
        request.getfixturevalue("interpreter")
    return use_backend(backend)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("num_tokens", [1, 7, 33])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 96), (96, 576), (576, 64)])
@pytest.mark.parametrize("rank", [8, 12, 16])
@pytest.mark.parametrize("masked", [False, True])
def test_shrink_then_expand_equals_formula(
    backend, num_tokens, in_features, out_features, rank, masked, gen, poison_allocations, request
):
    x, a, b = lora_inputs(num_tokens, in_features, out_features, rank, gen)
    mask = mixed_mask(num_tokens, gen) if masked else None
    y_before = torch.randn(num_tokens, out_features, generator=gen)
    y = y_before.clone()
    with run_backend(backend, request):
        h = lora_shrink(x, a, SCALE)
        out = lora_expand(h, b, y, mask)
    assert out.data_ptr() == y.data_ptr()  # added in place, not into a new tensor
    torch.testing.assert_close(h.double(), x.double() @ a.double().T * SCALE, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        y.double(), y_before.double() + formula(x, a, b, SCALE, mask), atol=1e-5, rtol=1e-5
    )
    if masked:  # tokens without the adapter keep the base output bit for bit
        off = mask[:, 0] == 0
        assert torch.equal(y[off], y_before[off])


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
@pytest.mark.parametrize("num_tokens", [1, 7, 33])
@pytest.mark.parametrize(
    ("in_features", "out_features"), [(64, (96,)), (96, (64, 24, 24)), (576, (200, 200))]
)
@pytest.mark.parametrize("rank", [8, 12])
@pytest.mark.parametrize("masked", [False, True])
def test_shrink_expand_gives_each_projection_its_own_delta(
    backend, num_tokens, in_features, out_features, rank, masked, gen, poison_allocations, request
):
    x, a_list, b_list = stacked_inputs(num_tokens, in_features, out_features, rank, gen)
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    mask = mixed_mask(num_tokens, gen) if masked else None
    ys_before = [torch.randn(num_tokens, out, generator=gen) for out in out_features]
    ys = [y.clone() for y in ys_before]
    with run_backend(backend, request):
        lora_shrink_expand(x, weights, ys, mask)
    for y, y_before, a, b in zip(ys, ys_before, a_list, b_list, strict=True):
        want = y_before.double() + formula(x, a, b, SCALE, mask)
        torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
        if masked:  # tokens without the adapter keep the base output bit for bit
            off = mask[:, 0] == 0
            assert torch.equal(y[off], y_before[off])


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
@pytest.mark.parametrize("masked", [False, True])
def test_a_bf16_output_takes_the_fp32_adapters_delta_with_one_rounding(backend, masked, gen, request):
    """A bf16 model's adapter stays fp32 (peft's default), so x comes in fp32 and each bf16 y gets
    y + delta rounded once: one bf16 step (2^-7 of the value) from the float64 formula at most."""
    x, a_list, b_list = stacked_inputs(9, 64, (48, 32), 8, gen)
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    mask = mixed_mask(9, gen).bfloat16() if masked else None
    ys_before = [torch.randn(9, out, generator=gen).bfloat16() for out in (48, 32)]
    ys = [y.clone() for y in ys_before]
    with run_backend(backend, request):
        lora_shrink_expand(x, weights, ys, mask)
    for y, y_before, a, b in zip(ys, ys_before, a_list, b_list, strict=True):
        assert y.dtype == torch.bfloat16
        want = y_before.double() + formula(x, a, b, SCALE, mask)
        torch.testing.assert_close(y.double(), want, atol=1e-3, rtol=2**-7)
        if masked:
            off = mask[:, 0] == 0
            assert torch.equal(y[off], y_before[off])


def test_auto_runs_cpu_tensors_on_the_transposed_copies(gen, monkeypatch):
    """On the CPU, "auto" multiplies a_t and b_t (scale folded in), not the reference or Triton."""
    monkeypatch.setattr(pagedrl_kernels.lora, "lora_shrink_expand_torch", None)  # calling either would raise
    monkeypatch.setattr(pagedrl_kernels.lora, "lora_shrink_expand_triton", None)
    x, a_list, b_list = stacked_inputs(5, 64, (48, 32), 8, gen)
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    assert torch.equal(weights.a_t, weights.a.T) and torch.equal(weights.b_t[1], b_list[1].T * SCALE)
    ys = [torch.zeros(5, 48), torch.zeros(5, 32)]
    lora_shrink_expand(x, weights, ys)
    for y, a, b in zip(ys, a_list, b_list, strict=True):
        torch.testing.assert_close(y.double(), formula(x, a, b, SCALE, None), atol=1e-5, rtol=1e-5)


def test_refresh_rederives_the_cpu_copies_after_weights_are_written_in_place(gen):
    x, a_list, b_list = stacked_inputs(6, 64, (32, 16), 4, gen)
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    _, new_a, new_b = stacked_inputs(6, 64, (32, 16), 4, gen)
    weights.a.copy_(torch.cat(new_a))  # as a weight sync writes the buffers
    for b, fresh in zip(weights.b, new_b, strict=True):
        b.copy_(fresh)
    weights.refresh()
    ys = [torch.zeros(6, 32), torch.zeros(6, 16)]
    lora_shrink_expand(x, weights, ys)
    for y, a, b in zip(ys, new_a, new_b, strict=True):
        torch.testing.assert_close(y.double(), formula(x, a, b, SCALE, None), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not HAS_MKL_PACKING, reason="this torch has no MKL: no merged packs")
def test_freed_weights_free_their_merged_packs_at_once(gen):
    """No reference cycle keeps the packs of W + scale B A alive until the garbage collector runs."""
    base = torch.randn(24, 16, generator=gen)
    weights = StackedLora(torch.randn(4, 16, generator=gen), (torch.randn(24, 4, generator=gen),), 0.5)
    before = packed_weight_bytes()
    x = torch.randn(8, 16, generator=gen)
    merged = packed_stacked_linear(x, [PackPart(base, None, weights.updates[0])])
    torch.testing.assert_close(merged, x @ (base + 0.5 * weights.b[0] @ weights.a).T, atol=1e-5, rtol=1e-5)
    assert packed_weight_bytes() - before == base.nbytes
    gc.disable()
    try:
        del weights
        assert packed_weight_bytes() == before
    finally:
        gc.enable()


def test_stacked_lora_refuses_mismatched_weights(gen):
    a, b = torch.randn(8, 64, generator=gen), torch.randn(32, 4, generator=gen)
    with pytest.raises(ValueError, match="of one rank r"):
        StackedLora(a, (b, torch.randn(16, 8, generator=gen)), SCALE)
    with pytest.raises(ValueError, match="stacking num A"):
        StackedLora(a[:6], (b, b), SCALE)
    with pytest.raises(ValueError, match="one dtype"):
        StackedLora(a, (b, b.double()), SCALE)


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
def test_bad_shrink_expand_inputs_are_refused_and_every_y_is_left_intact(backend, gen, request):
    if backend == "triton":
        request.getfixturevalue("triton_installed")
    x, a_list, b_list = stacked_inputs(4, 64, (32, 16), 8, gen)
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    ys = [torch.randn(4, 32, generator=gen), torch.randn(4, 16, generator=gen)]
    ys_before = [y.clone() for y in ys]
    bad_calls = {
        "x \\[num_tokens, 64\\]": lambda: lora_shrink_expand(x[:, :48], weights, ys),
        "one y \\[num_tokens, out\\]": lambda: lora_shrink_expand(x, weights, ys[:1]),
        "got x \\(4, 64\\) and y \\[\\(4, 32\\), \\(3, 16\\)\\]": lambda: lora_shrink_expand(
            x, weights, [ys[0], ys[1][:3]]
        ),
        "contiguous rows": lambda: lora_shrink_expand(x, weights, [ys[0], ys[1].T.contiguous().T]),
        "adapter's dtype": lambda: lora_shrink_expand(x.double(), weights, ys),
        "mask must be \\[num_tokens, 1\\]": lambda: lora_shrink_expand(x, weights, ys, torch.ones(4)),
    }
    with use_backend(backend):
        for message, call in bad_calls.items():
            with pytest.raises(ValueError, match=message):
                call()
    for y, y_before in zip(ys, ys_before, strict=True):
        assert torch.equal(y, y_before)


@pytest.mark.parametrize(("num_tokens", "in_features", "rank"), [(1, 576, 16), (33, 96, 12), (7, 64, 80)])
def test_shrink_kernel_matches_reference(num_tokens, in_features, rank, gen, interpreter, poison_allocations):
    # rank 80 spans two rank tiles of the kernel
    x, a, _ = lora_inputs(num_tokens, in_features, 1, rank, gen)
    got = pagedrl_kernels.lora.lora_shrink_triton(x, a, SCALE)
    torch.testing.assert_close(got, pagedrl_kernels.lora.lora_shrink_torch(x, a, SCALE), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("num_tokens", "in_features", "num_splits"), [(1, 576, 2), (7, 576, 4), (33, 1000, 5)]
)
def test_shrink_split_over_input_features_equals_formula(
    num_tokens, in_features, num_splits, gen, interpreter, poison_allocations
):
    # 576 features are 9 tiles of 64: 2 splits of 5 + 4 tiles, 4 splits of 3 + 3 + 3 (the fourth is dropped)
    x, a, _ = lora_inputs(num_tokens, in_features, 1, 12, gen)
    got = pagedrl_kernels.lora.lora_shrink_triton(x, a, SCALE, num_splits=num_splits)
    torch.testing.assert_close(got.double(), x.double() @ a.double().T * SCALE, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("num_tokens", "out_features", "rank"), [(1, 576, 8), (33, 96, 12), (7, 200, 80)])
@pytest.mark.parametrize("masked", [False, True])
def test_expand_kernel_matches_reference(num_tokens, out_features, rank, masked, gen, interpreter):
    h = torch.randn(num_tokens, rank, generator=gen)
    b = torch.randn(out_features, rank, generator=gen) / rank**0.5
    mask = mixed_mask(num_tokens, gen) if masked else None
    y = torch.randn(num_tokens, out_features, generator=gen)
    want = pagedrl_kernels.lora.lora_expand_torch(h, b, y.clone(), mask)
    torch.testing.assert_close(
        pagedrl_kernels.lora.lora_expand_triton(h, b, y, mask), want, atol=1e-5, rtol=1e-5
    )


def test_strided_input_rows_and_empty_batch(gen, interpreter, poison_allocations):
    wide = torch.randn(7, 100, generator=gen)
    x = wide[:, 3:99]  # rows 100 apart
    _, a, b = lora_inputs(7, 96, 64, 12, gen)
    y_before = torch.randn(7, 64, generator=gen)
    with use_backend("triton"):
        y = lora_expand(lora_shrink(x, a, SCALE), b, y_before.clone())
        empty = lora_expand(lora_shrink(x[:0], a, SCALE), b, torch.zeros(0, 64))
    torch.testing.assert_close(
        y.double(), y_before.double() + formula(x, a, b, SCALE, None), atol=1e-5, rtol=1e-5
    )
    assert empty.shape == (0, 64)


def test_fp16_accumulates_in_fp32(gen, interpreter):
    # Summing 4096 products in fp16 drifts by ~4e-2 here; fp32 accumulation leaves only the output rounding.
    x, a, b = lora_inputs(5, 4096, 64, 16, gen, dtype=torch.float16)
    y_before = torch.randn(5, 64, generator=gen).half()
    with use_backend("triton"):
        h = lora_shrink(x, a, SCALE)
        y = lora_expand(h, b, y_before.clone())
    torch.testing.assert_close(h.double(), x.double() @ a.double().T * SCALE, atol=2e-3, rtol=2e-3)
    want = y_before.double() + h.double() @ b.double().T
    torch.testing.assert_close(y.double(), want, atol=4e-3, rtol=2e-3)


def test_auto_dispatches_cpu_tensors_to_the_reference(gen, monkeypatch):
    monkeypatch.setattr(pagedrl_kernels.lora, "lora_shrink_triton", None)  # calling it would raise
    monkeypatch.setattr(pagedrl_kernels.lora, "lora_expand_triton", None)
    x, a, b = lora_inputs(3, 64, 64, 8, gen)
    y = lora_expand(lora_shrink(x, a, SCALE), b, torch.zeros(3, 64))
    torch.testing.assert_close(y.double(), formula(x, a, b, SCALE, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bad_inputs_are_refused_and_y_is_left_intact(backend, gen, request):
    if backend == "triton":
        request.getfixturevalue("triton_installed")
    x, a, b = lora_inputs(4, 64, 32, 8, gen)
    h, y = torch.randn(4, 8, generator=gen), torch.randn(4, 32, generator=gen)
    y_before = y.clone()
    bad_calls = {
        "A \\[r, in\\]": lambda: lora_shrink(x, a[:, :48], SCALE),
        "one dtype": lambda: lora_shrink(x, a.double(), SCALE),
        "B \\[out, r\\]": lambda: lora_expand(h, b[:, :4], y),
        "y \\[num_tokens, out\\]": lambda: lora_expand(h, b, y[:3]),
        "mask must be \\[num_tokens, 1\\]": lambda: lora_expand(h, b, y, torch.ones(4)),
        "rows must be contiguous": lambda: lora_expand(h, b[:4], y[:, :4].T.contiguous().T),
    }
    with use_backend(backend):
        for message, call in bad_calls.items():
            with pytest.raises(ValueError, match=message):
                call()
    assert torch.equal(y, y_before)


def test_engine_greedy_tokens_with_triton_lora_equal_the_reference_path(interpreter, monkeypatch):
    """Tiny Llama with a random (non-zero B) adapter; one base-model request makes the step mix masks."""
    launches = []
    expand = pagedrl_kernels.lora.lora_expand_triton
    monkeypatch.setattr(
        pagedrl_kernels.lora, "lora_expand_triton", lambda *args: launches.append(1) or expand(*args)
    )
    model = peft_model("llama", "all")
    prompts = random_prompts([5, 9, 3], seed=3)
    params = [
        SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[], lora=lora)
        for lora in ("policy", None, "policy")
    ]
    results = {}
    for backend in ("torch", "triton"):
        with use_backend(backend):
            results[backend] = [g.samples[0] for g in make_engine(model).generate(prompts, params)]
    assert launches  # the LoRA delta really went through the Triton kernel
    for ref, got in zip(results["torch"], results["triton"], strict=True):
        assert got.token_ids == ref.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)
    with use_backend("torch"):
        base = make_engine(model).generate(prompts, SamplingParams(temperature=0, max_tokens=5, lora=None))
    assert base[0].samples[0].token_ids != results["torch"][0].token_ids  # the adapter changes the output


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("num_tokens", "in_features", "out_features", "rank"),
    [(1, 576, 1536, 16), (77, 2048, 6144, 64), (256, 6144, 2048, 12)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_bf16_triton_matches_formula_and_reference(
    num_tokens, in_features, out_features, rank, masked, gen
):
    x, a, b = (
        t.to("cuda") for t in lora_inputs(num_tokens, in_features, out_features, rank, gen, torch.bfloat16)
    )
    mask = mixed_mask(num_tokens, gen).to("cuda", torch.bfloat16) if masked else None
    y_before = torch.randn(num_tokens, out_features, generator=gen).to("cuda", torch.bfloat16)
    y = lora_expand(lora_shrink(x, a, SCALE), b, y_before.clone(), mask)
    with use_backend("torch"):
        want = lora_expand(lora_shrink(x, a, SCALE), b, y_before.clone(), mask)
    exact = y_before.double() + formula(x, a, b, SCALE, mask)
    torch.testing.assert_close(y.double(), exact, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(y, want, atol=3e-2, rtol=2e-2)
    if masked:
        off = mask[:, 0] == 0
        assert torch.equal(y[off], y_before[off])


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 77])
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_bf16_grouped_shrink_expand_matches_formula_and_reference(num_tokens, masked, gen):
    """Qwen3-1.7B's q/k/v: one split shrink over the stacked A [3 * 16, 2048], an expand per projection."""
    x, a_list, b_list = stacked_inputs(num_tokens, 2048, (2048, 1024, 1024), 16, gen, torch.bfloat16)
    x, a_list, b_list = x.cuda(), [a.cuda() for a in a_list], [b.cuda() for b in b_list]
    weights = StackedLora(torch.cat(a_list), tuple(b_list), SCALE)
    assert weights.a_t is None  # no transposed copies on the GPU
    mask = mixed_mask(num_tokens, gen).to("cuda", torch.bfloat16) if masked else None
    ys_before = [
        torch.randn(num_tokens, b.shape[0], generator=gen).to("cuda", torch.bfloat16) for b in b_list
    ]
    ys = [y.clone() for y in ys_before]
    lora_shrink_expand(x, weights, ys, mask)
    with use_backend("torch"):
        wants = [y.clone() for y in ys_before]
        lora_shrink_expand(x, weights, wants, mask)
    for y, want, y_before, a, b in zip(ys, wants, ys_before, a_list, b_list, strict=True):
        exact = y_before.double() + formula(x, a, b, SCALE, mask)
        torch.testing.assert_close(y.double(), exact, atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(y, want, atol=3e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_shrink_expand_replay_in_a_cuda_graph(gen):
    """Decode runs from CUDA graphs: a captured shrink (2048 features, split 4 ways on an H200) and expand,
    replayed on new inputs written into the static buffers, equal the eager calls bit for bit."""
    x, a, b = (t.to("cuda") for t in lora_inputs(8, 2048, 1024, 16, gen, torch.bfloat16))
    mask = mixed_mask(8, gen).to("cuda", torch.bfloat16)
    y = torch.zeros(8, 1024, device="cuda", dtype=torch.bfloat16)
    lora_expand(lora_shrink(x, a, SCALE), b, y, mask)  # compiles the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lora_expand(lora_shrink(x, a, SCALE), b, y, mask)
    x.copy_(torch.randn(8, 2048, generator=gen).to("cuda", torch.bfloat16))
    y_before = torch.randn(8, 1024, generator=gen).to("cuda", torch.bfloat16)
    y.copy_(y_before)
    graph.replay()
    eager = lora_expand(lora_shrink(x, a, SCALE), b, y_before.clone(), mask)
    torch.testing.assert_close(y, eager, atol=0, rtol=0)
