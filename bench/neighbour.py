"""A CPU-bound neighbour process for the benchmarks' loaded arms: one busy loop, as another job on the
machine would be. `PAGEDRL_ADAPTIVE_THREADS=0` runs the same arm with torch's thread count fixed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator


@contextlib.contextmanager
def busy_neighbour(settle_s: float = 1.0) -> Iterator[None]:
    """Run the body beside a process that keeps one core busy; `settle_s` lets it start first."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(settle_s)
        yield
    finally:
        process.kill()
        process.wait()
