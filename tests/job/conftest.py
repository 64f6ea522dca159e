"""The fixed_cpu_threads fixture."""

import pytest
import torch

from host import cpu_threads


@pytest.fixture
def fixed_cpu_threads(monkeypatch):
    """Keeps torch's thread count fixed for runs compared bit for bit: F.linear's results at a few rows differ
    between 1 and 2 threads, and the adaptive pool (host/cpu_threads.py) changes the count whenever another
    process, or the VM's steal time, takes a core."""
    monkeypatch.setattr(cpu_threads, "_governor", lambda: None)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
