"""KV pool sizing from the memory fraction, worked by hand, and the start-up line that reports it."""

import logging

import pytest
import torch

from pagedrl_kernels import use_backend
from pagedrl_kernels.cpu_gemm import HAS_MKL_PACKING
from rollout_engine.memory import kv_bytes_per_block, num_kv_blocks, total_memory_bytes
from tests.helpers.rollout_tiny_models import LLAMA_PACKED_BYTES, make_engine, make_tiny_model


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
    with pytest.raises(ValueError, match="and 1.0 MiB of packed weights, but one sequence"):
        num_kv_blocks(1000 * 100 + 5000, 5000, 100, 64, 4, packed_bytes=2**20)


def test_blocks_fill_the_budget_left_after_activations_graphs_and_packed_weights():
    assert num_kv_blocks(1000 * 100 + 5000 + 3000 + 700 + 99, 5000, 100, 64, 4, 3000, 700) == 1000


@pytest.mark.skipif(
    not HAS_MKL_PACKING, reason="this torch has no MKL: the CPU projections are plain F.linear, never packed"
)
def test_the_cpu_engines_budget_holds_its_packed_weights(caplog):
    model = make_tiny_model("llama")
    packed = LLAMA_PACKED_BYTES  # each weight packed once
    with caplog.at_level(logging.INFO, logger="rollout_engine"):
        engine = make_engine(model, block_size=4, memory_budget_bytes=2**26)
    assert engine.stats()["packed_weight_bytes_reserved"] == packed
    (line,) = [record.getMessage() for record in caplog.records if record.name == "rollout_engine.engine"]
    assert "less one step's activations and 0.3 MiB of packed weights" in line
    with use_backend("torch"):  # no packs: their bytes go to the KV pool, 2048 bytes a block
        plain = make_engine(model, block_size=4, memory_budget_bytes=2**26)
    assert plain.stats()["packed_weight_bytes_reserved"] == 0
    assert plain.stats()["num_blocks_total"] - engine.stats()["num_blocks_total"] == packed // 2048


def test_the_engine_logs_the_kv_pool_it_reserved_and_the_budget_it_came_from(caplog):
    with caplog.at_level(logging.INFO, logger="rollout_engine"):
        engine = make_engine(make_tiny_model("llama"), block_size=4, memory_budget_bytes=2**26)
    (line,) = [record.getMessage() for record in caplog.records if record.name == "rollout_engine.engine"]
    # 2 (K and V) x 2 layers x 4 tokens x 2 KV heads x 16 dims x 4 bytes = 2048 bytes a block
    num_blocks = engine.stats()["num_blocks_total"]
    assert f"KV pool: reserved {num_blocks} blocks x 4 tokens = {num_blocks * 2048} bytes" in line
    assert "taken page by page as blocks are written" in line  # on the CPU
    assert "from memory_fraction=0.35 x 64.0 MiB of memory_budget_bytes = 22.4 MiB" in line
    assert "pass a smaller memory_fraction or memory_budget_bytes" in line
