"""memory_metrics: the process's peak RSS, on a GPU the CUDA allocator's peak too, and the engine's KV pool,
resident at most and reserved."""

import sys
from types import SimpleNamespace

import pytest
import torch

from rl.report.metrics import memory_metrics
from tests.helpers.proc_status import proc_status_bytes

GIB = 2**30
ENGINE = SimpleNamespace(stats=lambda: {"kv_bytes_resident_peak": 3 * GIB // 4, "kv_bytes_total": 2 * GIB})


def test_the_engine_reports_its_pool_held_at_most_and_reserved():
    metrics = memory_metrics(ENGINE)
    assert metrics["memory/kv_held_peak_gb"] == 0.75 and metrics["memory/kv_reserved_gb"] == 2.0


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_the_peak_rss_is_the_kernels_high_water_mark_and_counts_a_live_block():
    block = torch.ones(GIB // 4, dtype=torch.float32)  # 1 GiB, every page written
    resident = proc_status_bytes("VmRSS") / GIB
    peak = memory_metrics(ENGINE)["memory/peak_rss_gb"]
    del block
    assert resident >= 1.0 and peak >= resident - 0.01  # the kernel batches its page counts by thread
    assert peak == pytest.approx(proc_status_bytes("VmHWM") / GIB, abs=0.01)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run also has the CUDA allocator's peak")
def test_without_a_gpu_there_is_no_cuda_peak():
    assert "memory/cuda_peak_gb" not in memory_metrics(ENGINE)


@pytest.mark.gpu
def test_on_a_gpu_the_cuda_peak_is_the_allocators():
    """8 GiB on the device, far more than this process holds in host memory, so its RSS cannot pass."""
    torch.cuda.reset_peak_memory_stats()
    block = torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")
    del block
    metrics = memory_metrics(ENGINE)
    assert metrics["memory/cuda_peak_gb"] >= 8.0 > metrics["memory/peak_rss_gb"]
