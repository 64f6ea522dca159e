"""packed_stacked_linear against F.linear: one weight's MKL-packed product on fp32 CPU tensors for any row
count it takes, a pack rebuilt when its weight is written in place or its data replaced and freed with its
weight, and None (the caller's F.linear) for everything the pack does not cover (few rows, fp16 and fp64,
inference tensors, autograd, the torch backend, bad shapes); a stack of weights against F.linear of each
part's weight, plus its low-rank update W + L R, side by side: one pack of the stack, rebuilt when any part's
weight or update changes and freed with any of them."""

import gc

import pytest
import torch
import torch.nn.functional as F

from pagedrl_kernels import cpu_gemm, use_backend
from pagedrl_kernels.cpu_gemm import (
    HAS_MKL_PACKING,
    MIN_PACKED_ROWS,
    PackPart,
    WeightUpdate,
    packed_stacked_linear,
    packed_weight_bytes,
)

requires_mkl = pytest.mark.skipif(
    not HAS_MKL_PACKING,
    reason="this torch has no MKL (torch._C.has_mkl is false): fp32 products are left to F.linear",
)


def frozen_weight(out_features: int, in_features: int, gen: torch.Generator) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(out_features, in_features, generator=gen), requires_grad=False)


@requires_mkl
@pytest.mark.parametrize("num_rows", [1, 7, 64, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_packed_product_equals_f_linear_and_fewer_rows_are_declined(num_rows, with_bias, gen):
    weight = frozen_weight(96, 72, gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(num_rows, 72, generator=gen)
    before = packed_weight_bytes()
    y = packed_stacked_linear(x, [PackPart(weight, bias)])
    if num_rows < MIN_PACKED_ROWS:
        assert y is None and packed_weight_bytes() == before
    else:
        torch.testing.assert_close(y, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        assert packed_weight_bytes() - before == weight.nbytes


@requires_mkl
@pytest.mark.parametrize("num_rows", [MIN_PACKED_ROWS, 64, 130])
def test_a_packed_product_is_bit_for_bit_torchs_own_mkl_packed_linear(num_rows, gen):
    """The same MKL calls as torch.ops.mkl's reorder and linear (Inductor's fp32 CPU linear), into our own
    buffers: the same bits."""
    weight = frozen_weight(200, 72, gen)
    bias = torch.randn(200, generator=gen)
    x = torch.randn(num_rows, 72, generator=gen)
    theirs = torch.ops.mkl._mkl_reorder_linear_weight(weight, 64)
    for b in (None, bias):
        expected = torch.ops.mkl._mkl_linear(x, theirs, weight, b, num_rows)
        assert torch.equal(packed_stacked_linear(x, [PackPart(weight, b)]), expected)


@requires_mkl
def test_a_rebuilt_pack_reuses_its_buffer(gen):
    weight = frozen_weight(48, 32, gen)
    factors = Factors(48, 32, 4, gen)
    x = torch.randn(16, 32, generator=gen)
    packed_stacked_linear(x, [PackPart(weight)])
    packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    buffers = {key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weight)}
    with torch.no_grad():
        weight.mul_(0.5)
    factors.version += 1
    torch.testing.assert_close(
        packed_stacked_linear(x, [PackPart(weight)]), F.linear(x, weight), atol=1e-5, rtol=1e-5
    )
    merged = packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    torch.testing.assert_close(
        merged, F.linear(x, weight + factors.left @ factors.right), atol=1e-4, rtol=1e-5
    )
    after = {key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weight)}
    assert len(buffers) == 2 and after == buffers


@requires_mkl
def test_one_pack_serves_every_row_count_and_strided_inputs(gen):
    weight = frozen_weight(40, 33, gen)
    before = packed_weight_bytes()
    for num_rows in (200, 5, 64, 13, MIN_PACKED_ROWS, 129):
        x = torch.randn(num_rows, 66, generator=gen)[:, ::2]  # not contiguous
        y = packed_stacked_linear(x, [PackPart(weight)])
        torch.testing.assert_close(y, F.linear(x, weight), atol=1e-5, rtol=1e-5)
    assert packed_weight_bytes() - before == weight.nbytes


@requires_mkl
def test_an_in_place_update_is_seen_by_the_next_call(gen):
    weight = frozen_weight(48, 32, gen)
    x = torch.randn(16, 32, generator=gen)
    parts = [PackPart(weight)]
    packed_stacked_linear(x, parts)
    with torch.no_grad():
        weight.add_(1)
    torch.testing.assert_close(packed_stacked_linear(x, parts), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        weight.mul_(-2)
        y = packed_stacked_linear(x, parts)
        torch.testing.assert_close(y, F.linear(x, weight), atol=1e-5, rtol=1e-5)


@requires_mkl
def test_replaced_weight_data_is_seen_by_the_next_call(gen):
    layer = torch.nn.Linear(32, 48)
    x = torch.randn(16, 32, generator=gen)
    parts = [PackPart(layer.weight, layer.bias)]
    with torch.no_grad():
        packed_stacked_linear(x, parts)
        layer.weight.data = torch.randn(48, 32, generator=gen)
        expected = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(packed_stacked_linear(x, parts), expected, atol=1e-5, rtol=1e-5)
        layer.weight.data = torch.randn(48, 16, generator=gen)  # another shape: the pack needs another buffer
        x = torch.randn(16, 16, generator=gen)
        expected = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(packed_stacked_linear(x, parts), expected, atol=1e-5, rtol=1e-5)


@requires_mkl
def test_a_pack_made_in_inference_mode_serves_no_grad_calls_and_other_thread_counts(gen):
    weight = frozen_weight(64, 48, gen)
    x = torch.randn(9, 48, generator=gen)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(2)
            packed_stacked_linear(x, [PackPart(weight)])
        torch.set_num_threads(1)
        with torch.no_grad():
            y = packed_stacked_linear(x, [PackPart(weight)])
            torch.testing.assert_close(y, F.linear(x, weight), atol=1e-5, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)


@requires_mkl
def test_a_freed_weight_frees_its_pack(gen):
    before = packed_weight_bytes()
    weight = frozen_weight(64, 48, gen)
    packed_stacked_linear(torch.randn(8, 48, generator=gen), [PackPart(weight)])
    assert packed_weight_bytes() - before == weight.nbytes
    del weight
    gc.collect()
    assert packed_weight_bytes() == before


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_other_dtypes_are_declined(dtype, gen):  # bf16 has packs of its own: test_cpu_gemm_bf16.py
    weight = frozen_weight(48, 32, gen).to(dtype)
    x = torch.randn(16, 32, generator=gen).to(dtype)
    before = packed_weight_bytes()
    assert packed_stacked_linear(x, [PackPart(weight)]) is None
    assert packed_weight_bytes() == before


def test_autograd_and_the_torch_backend_are_declined(gen):
    weight = torch.nn.Parameter(torch.randn(48, 32, generator=gen))
    x = torch.randn(16, 32, generator=gen)
    before = packed_weight_bytes()
    assert packed_stacked_linear(x, [PackPart(weight)]) is None  # the weight needs a gradient
    x_grad = x.clone().requires_grad_()
    assert packed_stacked_linear(x_grad, [PackPart(weight.detach())]) is None  # x needs one
    with torch.no_grad(), use_backend("torch"):
        assert packed_stacked_linear(x, [PackPart(weight)]) is None
    assert packed_weight_bytes() == before


def test_a_weight_made_under_inference_mode_is_not_packed(gen):
    with torch.inference_mode():
        weight = torch.randn(48, 32, generator=gen)  # no version counter: its writes could not be seen
        x = torch.randn(16, 32, generator=gen)
        before = packed_weight_bytes()
        assert packed_stacked_linear(x, [PackPart(weight)]) is None
        assert packed_weight_bytes() == before


def test_mismatched_shapes_are_declined_for_f_linear_to_name(gen):
    weight = frozen_weight(48, 32, gen)
    with torch.no_grad():
        assert packed_stacked_linear(torch.randn(16, 31, generator=gen), [PackPart(weight)]) is None
        bad_bias = PackPart(weight, torch.randn(47, generator=gen))
        assert packed_stacked_linear(torch.randn(16, 32, generator=gen), [bad_bias]) is None


class Factors:
    """The owner of a low-rank update: writes left [out, r] and right [r, in] and bumps its version."""

    def __init__(self, out_features: int, in_features: int, rank: int, gen: torch.Generator) -> None:
        self.left = torch.randn(out_features, rank, generator=gen)
        self.right = torch.randn(rank, in_features, generator=gen)
        self.version = 0

    def update(self) -> WeightUpdate:
        return WeightUpdate(self.left, self.right, self, self.version)


def merged(weight: torch.Tensor, factors: "Factors | None") -> torch.Tensor:
    return weight if factors is None else weight + factors.left @ factors.right


@requires_mkl
@pytest.mark.parametrize("num_rows", [MIN_PACKED_ROWS, 64, 200])
def test_packed_stacked_linear_multiplies_by_the_merged_weight(num_rows, gen):
    weight = frozen_weight(96, 72, gen)
    bias = torch.randn(96, generator=gen)
    factors = Factors(96, 72, 8, gen)
    x = torch.randn(num_rows, 72, generator=gen)
    before = packed_weight_bytes()
    y = packed_stacked_linear(x, [PackPart(weight, bias, factors.update())])
    torch.testing.assert_close(y, F.linear(x, merged(weight, factors), bias), atol=1e-4, rtol=1e-5)
    assert packed_weight_bytes() - before == weight.nbytes
    # the base weight's own pack is another pack, beside the merged one
    base = packed_stacked_linear(x, [PackPart(weight, bias)])
    torch.testing.assert_close(base, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    assert packed_weight_bytes() - before == 2 * weight.nbytes


def stacked_parts(gen: torch.Generator) -> tuple[list[torch.nn.Parameter], list, list["Factors | None"]]:
    """Three weights of one input (q/k/v-like: 40, 16 and 16 outputs), a bias on the second only, and an
    update on the first and last."""
    weights = [frozen_weight(n, 24, gen) for n in (40, 16, 16)]
    biases = [None, torch.randn(16, generator=gen), None]
    factors = [Factors(40, 24, 4, gen), None, Factors(16, 24, 4, gen)]
    return weights, biases, factors


def expected_stack(x, weights, biases, factors) -> torch.Tensor:
    return torch.cat(
        [F.linear(x, merged(w, f), b) for w, b, f in zip(weights, biases, factors, strict=True)], dim=-1
    )


def stack(weights, biases, factors) -> list[PackPart]:
    return [
        PackPart(w, b, None if f is None else f.update())
        for w, b, f in zip(weights, biases, factors, strict=True)
    ]


@requires_mkl
@pytest.mark.parametrize("num_rows", [MIN_PACKED_ROWS, 64, 130])
def test_packed_stacked_linear_puts_each_parts_product_side_by_side_from_one_pack(num_rows, gen):
    weights, biases, factors = stacked_parts(gen)
    x = torch.randn(num_rows, 48, generator=gen)[:, ::2]  # strided rows
    before = packed_weight_bytes()
    y = packed_stacked_linear(x, stack(weights, biases, factors))
    assert y.shape == (num_rows, 72)
    torch.testing.assert_close(y, expected_stack(x, weights, biases, factors), atol=1e-4, rtol=1e-5)
    assert packed_weight_bytes() - before == sum(w.nbytes for w in weights)  # one pack for the three
    plain = packed_stacked_linear(x, [PackPart(w, b) for w, b in zip(weights, biases, strict=True)])
    torch.testing.assert_close(plain, expected_stack(x, weights, biases, [None] * 3), atol=1e-5, rtol=1e-5)


@requires_mkl
def test_a_change_to_any_part_rebuilds_the_stacked_pack_in_its_buffer(gen):
    weights, biases, factors = stacked_parts(gen)
    x = torch.randn(16, 24, generator=gen)
    packed_stacked_linear(x, stack(weights, biases, factors))
    before = packed_weight_bytes()
    buffers = {
        key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weights[0])
    }
    with torch.no_grad():
        weights[1].mul_(-2)  # in place, on a part with no update
    y = packed_stacked_linear(x, stack(weights, biases, factors))
    torch.testing.assert_close(y, expected_stack(x, weights, biases, factors), atol=1e-4, rtol=1e-5)
    factors[2].right.add_(1)  # the last part's update moves to a new version
    factors[2].version += 1
    y = packed_stacked_linear(x, stack(weights, biases, factors))
    torch.testing.assert_close(y, expected_stack(x, weights, biases, factors), atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        weights[2].data = torch.randn(16, 24, generator=gen)  # new data, same shape
    y = packed_stacked_linear(x, stack(weights, biases, factors))
    torch.testing.assert_close(y, expected_stack(x, weights, biases, factors), atol=1e-4, rtol=1e-5)
    after = {key: pack.packed.data_ptr() for key, pack in cpu_gemm._packs.items() if key[0] == id(weights[0])}
    assert after == buffers and packed_weight_bytes() == before


@requires_mkl
def test_freeing_any_part_of_a_stack_frees_its_pack(gen):
    weights, biases, factors = stacked_parts(gen)
    before = packed_weight_bytes()
    packed_stacked_linear(torch.randn(8, 24, generator=gen), stack(weights, biases, factors))
    assert packed_weight_bytes() - before == sum(w.nbytes for w in weights)
    del factors[2]  # the last update's owner goes
    gc.collect()
    assert packed_weight_bytes() == before


@requires_mkl
def test_a_new_update_version_rebuilds_the_merged_pack_in_place_of_the_old(gen):
    weight = frozen_weight(48, 32, gen)
    factors = Factors(48, 32, 4, gen)
    x = torch.randn(16, 32, generator=gen)
    packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    before = packed_weight_bytes()
    factors.left.mul_(-3)
    factors.version += 1
    y = packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    torch.testing.assert_close(y, F.linear(x, merged(weight, factors)), atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        weight.add_(1)  # the base weight changing also rebuilds it
    y = packed_stacked_linear(x, [PackPart(weight, None, factors.update())])
    torch.testing.assert_close(y, F.linear(x, merged(weight, factors)), atol=1e-4, rtol=1e-5)
    assert packed_weight_bytes() == before  # the stale packs were dropped


@requires_mkl
def test_a_freed_update_owner_frees_its_merged_pack(gen):
    weight = frozen_weight(48, 32, gen)
    factors = Factors(48, 32, 4, gen)
    before = packed_weight_bytes()
    packed_stacked_linear(torch.randn(8, 32, generator=gen), [PackPart(weight, None, factors.update())])
    assert packed_weight_bytes() - before == weight.nbytes
    del factors
    gc.collect()
    assert packed_weight_bytes() == before


def test_a_stack_is_declined_where_one_part_would_be(gen):
    weight = frozen_weight(48, 32, gen)
    other = frozen_weight(16, 31, gen)
    parts = [PackPart(weight, None, Factors(48, 32, 4, gen).update())]
    before = packed_weight_bytes()
    with torch.no_grad():
        assert packed_stacked_linear(torch.randn(MIN_PACKED_ROWS - 1, 32), parts) is None
        assert packed_stacked_linear(torch.randn(8, 32).double(), parts) is None
        assert (
            packed_stacked_linear(torch.randn(8, 32), [*parts, PackPart(other)]) is None
        )  # other in_features
        assert packed_stacked_linear(torch.randn(8, 32), [*parts, PackPart(weight.double())]) is None
        with use_backend("torch"):
            assert packed_stacked_linear(torch.randn(8, 32), parts) is None
    assert packed_weight_bytes() == before
