"""The KV pool takes memory as blocks are written: a CPU pool reserves address space, commits a page on
first write (or, for the blocks a step is about to write, just before it), reads zero where nothing was
written, and engine.stats() reports what it holds."""

import gc
import mmap
import os
import sys

import pytest
import torch

from rollout_engine import SamplingParams, model_runner
from rollout_engine.kv_pool import (
    allocate_kv_pool,
    commit_blocks,
    commits_on_write,
    release_blocks,
    resident_bytes,
)
from tests.helpers.proc_status import proc_status_bytes
from tests.helpers.rollout_tiny_models import hf_greedy, make_engine, make_tiny_model, random_prompts

CPU = torch.device("cpu")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="resident pages are counted with mincore")


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split(".")
    return sys.platform == "linux" and (int(release[0]), int(release[1].split("-")[0])) >= (major, minor)


populates = pytest.mark.skipif(
    not _kernel_at_least(5, 14), reason="MADV_POPULATE_WRITE needs Linux 5.14; writes commit the pages there"
)


def pages_under(tensor: torch.Tensor) -> set[int]:
    """Page numbers of the bytes a contiguous tensor spans, from its address alone."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return set(range(start // mmap.PAGESIZE, -(-end // mmap.PAGESIZE)))


@linux_only
def test_a_gib_pool_costs_no_memory_until_written():
    before = proc_status_bytes("VmRSS")
    # the SmolLM2 shape: 30 layers, 3 KV heads of 64 dims, 16-token blocks; 1456 blocks = 1.0 GiB
    pool = allocate_kv_pool(30, 1456, 16, 3, 64, torch.float32, CPU)
    assert pool.shape == (30, 2, 1456, 16, 3, 64) and pool.numel() * 4 == 1456 * 737280
    assert proc_status_bytes("VmRSS") - before < 16 * 2**20
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


@linux_only
def test_released_blocks_give_back_the_pages_wholly_inside_them_and_read_zero():
    # 512-byte blocks, 8 to a page: blocks 0-9 free a page only where all 8 of its blocks are released
    pool = allocate_kv_pool(2, 64, 4, 2, 16, torch.float32, CPU)
    pool.fill_(1.0)
    released = [*range(10), 17, 30, 31, *range(40, 56)]
    release_blocks(pool, released)
    dropped = set()
    for slab in pool.flatten(0, 1):  # [num_blocks, ...] of one layer's K or V
        whole = set().union(*(pages_under(slab[b]) for b in released))
        shared = set().union(*(pages_under(slab[b]) for b in range(64) if b not in released))
        dropped |= whole - shared
    assert len(dropped) == 4 * 3  # per slab: the pages of blocks 0-7, 40-47 and 48-55
    assert resident_bytes(pool) == pool.numel() * 4 - len(dropped) * mmap.PAGESIZE
    kept = [b for b in range(64) if b not in released]
    assert torch.all(pool[:, :, kept] == 1.0)  # blocks in use keep every value
    assert pool[:, :, [0, 7, 40, 55]].abs().max().item() == 0.0
    assert torch.all(pool[:, :, [8, 9, 17, 30, 31]] == 1.0)  # their pages hold blocks in use too


@linux_only
def test_releasing_every_block_frees_the_pages_across_slab_boundaries_too():
    pool = allocate_kv_pool(2, 12, 4, 2, 16, torch.float32, CPU)  # 6 KiB slabs: pages straddle them
    pool.fill_(1.0)
    release_blocks(pool, iter(range(12)))
    assert resident_bytes(pool) == 0 and pool.abs().max().item() == 0.0


@populates
def test_committed_blocks_are_resident_before_any_write_and_read_zero():
    pool = allocate_kv_pool(2, 64, 4, 2, 16, torch.float32, CPU)  # 512-byte blocks, 8 to a page
    blocks = [3, 40, 41]
    commit_blocks(pool, blocks)
    expected = set().union(*(pages_under(slab[b]) for slab in pool.flatten(0, 1) for b in blocks))
    assert len(expected) == 4 * 2  # per slab: block 3's page, and the page blocks 40 and 41 share
    assert resident_bytes(pool) == len(expected) * mmap.PAGESIZE
    assert pool[:, :, blocks].abs().max().item() == 0.0
    release_blocks(pool, range(64))
    assert resident_bytes(pool) == 0


@populates
def test_each_step_finds_the_blocks_it_writes_committed(monkeypatch):
    # 32-token blocks: one layer's K (or V) of a block is one page
    engine = make_engine(make_tiny_model("llama"), block_size=32, memory_budget_bytes=2**30)
    pool, run = engine.runner.kv_pool, engine.runner.run
    written: list[set[int]] = []

    def checking_run(inputs):
        blocks = set((inputs.meta.slot_mapping // 32).tolist())
        for slab in pool.flatten(0, 1):
            assert all(resident_bytes(slab[b]) == slab[b].numel() * 4 for b in blocks)
        written.append(blocks)
        return run(inputs)

    monkeypatch.setattr(engine.runner, "run", checking_run)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=40, seed=0)
    engine.generate(random_prompts([40, 70], seed=0), params)
    engine.reset_prefix_cache()  # released blocks are committed again when next written
    engine.generate(random_prompts([40, 70], seed=1), params)
    assert len(written) >= 80 and len(set().union(*written)) > 6


def test_a_pool_reads_zero_where_never_written_and_outlives_its_name():
    pool = allocate_kv_pool(2, 8, 4, 2, 16, torch.float32, CPU)
    layer_v = pool[1, 1]
    pool[0, 0, 5].fill_(2.0)
    del pool
    gc.collect()
    layer_v[7].fill_(3.0)  # the view keeps the mapping alive
    assert torch.count_nonzero(layer_v).item() == 4 * 2 * 16 and layer_v[:7].abs().max().item() == 0.0


@linux_only
def test_engine_holds_the_blocks_it_handed_out_and_gives_them_back_at_a_reset(monkeypatch):
    # 32-token blocks: one layer's K (or V) of a block is 32 x 2 heads x 16 dims x 4 bytes, one page
    engine = make_engine(make_tiny_model("llama"), block_size=32, memory_budget_bytes=2**30)
    handed_out: list[set[int]] = []  # the blocks each generate call took
    take = engine.block_manager._take_free_block

    def recording_take() -> int:
        block_id = take()
        handed_out[-1].add(block_id)
        return block_id

    monkeypatch.setattr(engine.block_manager, "_take_free_block", recording_take)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=30, seed=0)

    def generate(num_prompts: int, seed: int) -> int:
        handed_out.append(set())
        engine.generate(random_prompts([40] * num_prompts, seed=seed), params)
        return engine.stats()["kv_bytes_resident"]

    stats = engine.stats()
    per_block, reserved = stats["kv_bytes_per_block"], stats["kv_bytes_total"]
    assert stats["kv_bytes_resident"] == 0 and per_block == 2 * 2 * 4096
    small = generate(2, seed=0)
    assert small == len(handed_out[0]) * per_block > 0
    large = generate(6, seed=1)  # the first call's blocks stay cached, so these are new ones
    assert large == len(handed_out[0] | handed_out[1]) * per_block
    assert small < large < reserved / 100
    # after a weight update the old blocks' memory goes back, and the same load reuses the same blocks
    engine.reset_prefix_cache()
    assert engine.stats()["kv_bytes_resident"] == 0 and engine.stats()["kv_bytes_resident_peak"] == large
    again = generate(6, seed=2)
    assert handed_out[2] <= handed_out[0] | handed_out[1] and len(handed_out[2]) == len(handed_out[1])
    assert again == len(handed_out[2]) * per_block
    pool = engine.runner.kv_pool
    in_use = torch.zeros(pool.shape[2], dtype=torch.bool)
    in_use[sorted(handed_out[2])] = True
    assert pool[:, :, ~in_use].abs().max().item() == 0.0  # never written, or released
    assert all(pool[:, :, block_id].abs().max().item() > 0 for block_id in handed_out[2])


@linux_only
def test_a_reset_releases_the_blocks_written_and_free_not_the_whole_pool(monkeypatch):
    """A tiny model's pool has a million blocks; a reset after each weight update must cost what the steps
    wrote, so it hands the system only the free blocks written since their last release."""
    engine = make_engine(make_tiny_model("llama"), block_size=32, memory_budget_bytes=2**30)
    released: list[list[int]] = []

    def recording_release(pool, block_ids):
        released.append(list(block_ids))
        release_blocks(pool, block_ids)

    monkeypatch.setattr(model_runner, "release_blocks", recording_release)
    sampled = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=0)
    engine.generate(random_prompts([40] * 3, seed=5), sampled)  # its blocks stay cached, free at the reset
    prompt = random_prompts([64], seed=4)[0]
    running = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=40))
    for _ in range(3):
        engine.step()
    (seq,) = engine.scheduler.running
    in_use = set(seq.block_table)
    written = set(engine.runner._committed)
    engine.reset_prefix_cache()
    assert engine.block_manager.num_blocks > 1000 * len(written)  # the rest was never written
    # the written blocks not in use, and their free neighbours that may share a page with them
    assert in_use <= written and written - in_use <= set(released[-1])
    assert not set(released[-1]) & in_use and len(released[-1]) <= 3 * len(written)
    assert engine.stats()["kv_bytes_resident"] == len(in_use) * engine.stats()["kv_bytes_per_block"]
    engine.abort_request(running)


@linux_only
def test_a_reset_while_a_request_runs_keeps_its_kv_and_releases_the_rest():
    model = make_tiny_model("llama")
    engine = make_engine(model, memory_budget_bytes=2**30)  # 4-token blocks of 512 bytes, 8 to a page
    short, running = random_prompts([100, 20], seed=3)
    engine.add_request(short, SamplingParams(temperature=0.0, max_tokens=1))
    running_id = engine.add_request(running, SamplingParams(temperature=0.0, max_tokens=40))
    results = {}
    while engine.has_unfinished():
        for group in engine.step().finished:
            results[group.request_id] = group
        if len(results) == 1 and engine.stats()["num_blocks_used"] > 0 and "released" not in results:
            before = engine.stats()["kv_bytes_resident"]
            engine.reset_prefix_cache()  # the short request's cached blocks are released mid-run
            assert engine.stats()["kv_bytes_resident"] < before
            results["released"] = True
    assert "released" in results and engine.stats()["kv_bytes_resident_peak"] >= before
    assert results[running_id].samples[0].token_ids == hf_greedy(model, running, 40)


def test_a_pool_off_the_cpu_is_one_allocation_counted_whole_that_release_and_commit_leave_alone():
    """The branch a CUDA pool takes, on the meta device (shapes and no data), which needs no GPU."""
    meta = torch.device("meta")
    assert not commits_on_write(meta)
    pool = allocate_kv_pool(2, 8, 4, 2, 16, torch.bfloat16, meta)
    assert pool.device == meta and pool.shape == (2, 2, 8, 4, 2, 16)
    assert resident_bytes(pool) == pool.numel() * 2
    release_blocks(pool, range(8))  # would madvise the pool's addresses on the CPU: meta has none
    commit_blocks(pool, range(8))
    assert resident_bytes(pool) == pool.numel() * 2


@pytest.mark.gpu
def test_a_cuda_pool_is_allocated_zeroed_and_counted_whole():
    pool = allocate_kv_pool(2, 8, 4, 2, 16, torch.bfloat16, torch.device("cuda"))
    assert pool.is_cuda and pool.abs().max().item() == 0.0
    assert resident_bytes(pool) == pool.numel() * 2
