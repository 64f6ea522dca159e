"""The KV pool takes memory as blocks are written: a CPU pool reserves address space, commits a page on
first write, reads zero where nothing was written, and engine.stats() reports what it holds."""

import gc
import mmap
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from rollout_tiny_models import make_engine, make_tiny_model, random_prompts  # noqa: E402

from rollout_engine import SamplingParams  # noqa: E402
from rollout_engine.kv_pool import allocate_kv_pool, resident_bytes  # noqa: E402

CPU = torch.device("cpu")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="resident pages are counted with mincore")


def vm_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line in /proc/self/status")


def pages_under(tensor: torch.Tensor) -> set[int]:
    """Page numbers of the bytes a contiguous tensor spans, from its address alone."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return set(range(start // mmap.PAGESIZE, -(-end // mmap.PAGESIZE)))


@linux_only
def test_a_gib_pool_costs_no_memory_until_written():
    before = vm_rss_bytes()
    # the SmolLM2 shape: 30 layers, 3 KV heads of 64 dims, 16-token blocks; 1456 blocks = 1.0 GiB
    pool = allocate_kv_pool(30, 1456, 16, 3, 64, torch.float32, CPU)
    assert pool.shape == (30, 2, 1456, 16, 3, 64) and pool.numel() * 4 == 1456 * 737280
    assert vm_rss_bytes() - before < 16 * 2**20
    assert resident_bytes(pool) == 0


@linux_only
def test_resident_bytes_are_the_pages_written():
    # one block of one layer's K is 4 tokens x 2 heads x 16 dims x 4 bytes = 512 bytes: 8 to a page
    pool = allocate_kv_pool(2, 64, 4, 2, 16, torch.float32, CPU)
    written = [pool[0, 0, 3], pool[1, 1, 40], pool[1, 1, 41], pool[1, 0, 63]]
    for block in written:
        block.fill_(1.5)
    expected = set().union(*map(pages_under, written))
    assert len(expected) == 3  # blocks 40 and 41 of layer 1's V share a page
    assert resident_bytes(pool) == len(expected) * mmap.PAGESIZE


def test_a_pool_reads_zero_where_never_written_and_outlives_its_name():
    pool = allocate_kv_pool(2, 8, 4, 2, 16, torch.float32, CPU)
    layer_v = pool[1, 1]
    pool[0, 0, 5].fill_(2.0)
    del pool
    gc.collect()
    layer_v[7].fill_(3.0)  # the view keeps the mapping alive
    assert torch.count_nonzero(layer_v).item() == 4 * 2 * 16 and layer_v[:7].abs().max().item() == 0.0


@linux_only
def test_engine_holds_the_blocks_it_handed_out_and_reuses_them_after_a_reset(monkeypatch):
    # 32-token blocks: one layer's K (or V) of a block is 32 x 2 heads x 16 dims x 4 bytes, one page
    engine = make_engine(make_tiny_model("llama"), block_size=32, memory_budget_bytes=2**30)
    handed_out: set[int] = set()
    take = engine.block_manager._take_free_block

    def recording_take() -> int:
        block_id = take()
        handed_out.add(block_id)
        return block_id

    monkeypatch.setattr(engine.block_manager, "_take_free_block", recording_take)
    stats = engine.stats()
    per_block, reserved = stats["kv_bytes_per_block"], stats["kv_bytes_total"]
    assert stats["kv_bytes_resident"] == 0 and per_block == 2 * 2 * 4096
    params = SamplingParams(n=4, temperature=1.0, max_tokens=30, seed=0)
    resident = []
    for num_prompts, seed in [(2, 0), (6, 1)]:
        engine.generate(random_prompts([40] * num_prompts, seed=seed), params)
        resident.append(engine.stats()["kv_bytes_resident"])
        assert resident[-1] == len(handed_out) * per_block
    assert 0 < resident[0] < resident[1] < reserved / 100
    # after a weight update the cached blocks go back to the free list, and the same load reuses them
    engine.reset_prefix_cache()
    engine.generate(random_prompts([40] * 6, seed=2), params)
    assert engine.stats()["kv_bytes_resident"] == resident[1]
    pool = engine.runner.kv_pool
    untouched = torch.ones(pool.shape[2], dtype=torch.bool)
    untouched[sorted(handed_out)] = False
    assert pool[:, :, untouched].abs().max().item() == 0.0
    assert all(pool[:, :, block_id].abs().max().item() > 0 for block_id in handed_out)


@pytest.mark.gpu
def test_a_cuda_pool_is_allocated_zeroed_and_counted_whole():
    pool = allocate_kv_pool(2, 8, 4, 2, 16, torch.bfloat16, torch.device("cuda"))
    assert pool.is_cuda and pool.abs().max().item() == 0.0
    assert resident_bytes(pool) == pool.numel() * 2
