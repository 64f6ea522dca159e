"""Puts this folder's helper module (loop_models) on the path, for the tests and their child processes; the
fixed_cpu_threads fixture."""

import sys
from pathlib import Path

import pytest
import torch

from host import cpu_threads

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def fixed_cpu_threads(monkeypatch):
    """Keeps torch's thread count fixed for runs compared bit for bit: F.linear's results at a few rows differ
    between 1 and 2 threads, and the adaptive pool (host/cpu_threads.py) changes the count whenever another
    process, or the VM's steal time, takes a core."""
    monkeypatch.setattr(cpu_threads, "_governor", lambda: None)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
