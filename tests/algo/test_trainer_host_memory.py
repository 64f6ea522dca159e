"""After an optimizer step the C heap's free pages go back to the system: glibc would keep the freed
activations of the micro-batches, interleaved with tensors that stay, for the rest of the run."""

import ctypes
import sys
from pathlib import Path

import pytest
import torch

from rl.algo.trainer import optimizer_step

glibc_only = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="glibc's heap"
)


def vm_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line in /proc/self/status")


@glibc_only
def test_an_optimizer_step_returns_the_freed_activations_to_the_system():
    torch.ones(4 * 2**20)  # freeing this 16 MiB mapping lifts glibc's mmap threshold above 1 MiB
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    activations, kept = [], []
    for _ in range(200):  # 1 MiB activations, each followed by a tensor that outlives them
        activations.append(torch.ones(2**18))
        kept.append(torch.ones(2**18))
    (weight.sum() * sum(a.sum() for a in activations)).backward()
    del activations
    before = vm_rss_bytes()
    optimizer_step(optimizer, None, [weight], max_grad_norm=None, loss=torch.tensor(0.0))
    assert before - vm_rss_bytes() > 150 * 2**20
    assert len(kept) == 200
