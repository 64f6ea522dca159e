"""bucket_plan: tensors laid end to end in bytes and cut into fixed-size buckets, worked by hand."""

import pytest
import torch

from rl.sync.transport import TensorSpec, bucket_plan

SPECS = {"a": TensorSpec((3,), torch.float32), "b": TensorSpec((2,), torch.bfloat16)}  # 12 and 4 bytes


def test_buckets_cut_through_tensors():
    plan = bucket_plan(SPECS, bucket_bytes=5)
    # (name, byte offset in the tensor, byte offset in the bucket, bytes)
    assert plan == [
        (5, [("a", 0, 0, 5)]),
        (5, [("a", 5, 0, 5)]),
        (5, [("a", 10, 0, 2), ("b", 0, 2, 3)]),
        (1, [("b", 3, 0, 1)]),
    ]


@pytest.mark.parametrize("bucket_bytes", [16, 1 << 20])
def test_one_bucket_when_everything_fits(bucket_bytes):
    assert bucket_plan(SPECS, bucket_bytes) == [(16, [("a", 0, 0, 12), ("b", 0, 12, 4)])]


def test_a_bucket_ends_exactly_at_a_tensor_boundary():
    assert bucket_plan(SPECS, bucket_bytes=12) == [(12, [("a", 0, 0, 12)]), (4, [("b", 0, 0, 4)])]
