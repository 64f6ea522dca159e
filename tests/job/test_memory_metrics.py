"""memory_metrics: the trainer's peak from the CUDA allocator on a GPU (the process's peak RSS on the CPU) and
the engine's KV pool, resident at most and reserved."""

import resource
import sys
from types import SimpleNamespace

import pytest
import torch

from rl.report.metrics import memory_metrics

GIB = 2**30
ENGINE = SimpleNamespace(stats=lambda: {"kv_bytes_resident_peak": 3 * GIB // 4, "kv_bytes_total": 2 * GIB})


def test_the_engine_reports_its_pool_held_at_most_and_reserved():
    metrics = memory_metrics(ENGINE)
    assert metrics["memory/engine_gb"] == 0.75 and metrics["memory/engine_reserved_gb"] == 2.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the trainer's peak is the CUDA allocator's")
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss counts KiB on Linux, bytes on macOS")
def test_on_the_cpu_the_trainer_peak_is_the_process_peak_rss():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    peak = memory_metrics(ENGINE)["memory/trainer_peak_gb"]
    assert before <= peak <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


@pytest.mark.gpu
def test_on_a_gpu_the_trainer_peak_is_the_cuda_allocators():
    """8 GiB on the device, far more than this process holds in host memory, so its RSS cannot pass."""
    torch.cuda.reset_peak_memory_stats()
    block = torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")
    del block
    assert memory_metrics(ENGINE)["memory/trainer_peak_gb"] >= 8.0
