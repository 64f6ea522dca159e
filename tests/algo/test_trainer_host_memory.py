"""After an optimizer step the C heap's free pages go back to the system: glibc would keep the freed
activations of the micro-batches, interleaved with tensors that stay, for the rest of the run."""

import ctypes
import sys

import pytest
import torch

from rl.algo.trainer import optimizer_step
from tests.helpers.proc_status import proc_status_bytes

glibc_only = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="glibc's heap"
)


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
    before = proc_status_bytes("VmRSS")
    optimizer_step(optimizer, None, [weight], max_grad_norm=None, loss=torch.tensor(0.0))
    assert before - proc_status_bytes("VmRSS") > 150 * 2**20
    assert len(kept) == 200
