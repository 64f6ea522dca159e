"""KV pool sizing from the memory fraction, worked by hand."""

import pytest
import torch

from rollout_engine.memory import kv_bytes_per_block, num_kv_blocks, total_memory_bytes


def test_bytes_per_block_of_smollm2_shape():
    # 2 (K and V) x 30 layers x 16 tokens x 3 KV heads x 64 dims x 4 bytes
    assert kv_bytes_per_block(30, 16, 3, 64, torch.float32) == 737280
    assert kv_bytes_per_block(30, 16, 3, 64, torch.bfloat16) == 368640


def test_blocks_fill_the_budget_left_after_activations():
    assert num_kv_blocks(1000 * 100 + 5000 + 99, 5000, 100, max_model_len=64, block_size=4) == 1000
    assert total_memory_bytes(torch.device("cpu"), 12345) == 12345


def test_budget_below_one_max_model_len_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="max_model_len=64 tokens needs 16 blocks"):
        num_kv_blocks(15 * 100 + 5000, 5000, 100, max_model_len=64, block_size=4)
