"""Sizing torch's CPU thread pool to the cores that other processes leave free.

torch's intra-op pool (OpenMP, which MKL and the C kernels of pagedrl_kernels/cpu/ share) splits each op
statically over its threads and waits at a barrier for all of them. When another process shares a core with
one of those threads, every barrier waits for that thread's next time slice, which is milliseconds, while a
decode step's ops last tens of microseconds. On 2 cores with one busy neighbour, a 2-thread decode step runs
3.5x slower than on a quiet machine, whereas 1 thread on the free core runs 1.7x slower.

`adapt_cpu_threads()`, called once per engine step and per training micro-batch, samples the machine's CPU
time at most every `interval_s` and sets `torch.set_num_threads` to the cores not busy with other
processes: at least 1, and at most the thread count torch had at the first call (`OMP_NUM_THREADS`, or the
number of cores). Set `PAGEDRL_ADAPTIVE_THREADS=0` to keep torch's thread count fixed.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

STAT_PATH = Path("/proc/stat")
# Fractions of a core that other processes may use before it counts as taken: background daemons and this
# process's own spin-waiting show up as a few percent.
_OCCUPIED_ABOVE = 0.25


def busy_seconds(stat_text: str, cpus: set[int]) -> float | None:
    """CPU seconds the guest spent busy (user, nice, system, irq, softirq) on `cpus`, from /proc/stat's text.

    Steal, the time the hypervisor ran other guests on these virtual CPUs, is left out: it falls on all of
    them alike, so no thread count escapes it, and 2 threads beat 1 under it (bench/RESULTS.md, 2 cores at
    5-20% steal: 1.25-1.6x faster). Counted as a neighbour, it halved the threads whenever it passed a
    quarter of a core.
    """
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    total, seen = 0, 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in rest.split()[:7])
        total += user + nice + system + irq + softirq
        seen += 1
    return total / ticks_per_s if seen else None


def threads_for(num_cpus: int, others_cores: float, max_threads: int) -> int:
    """Threads to run: the cores not occupied by other processes' `others_cores`, within [1, max_threads]."""
    occupied = max(0, math.ceil(others_cores - _OCCUPIED_ABOVE))
    return max(1, min(max_threads, num_cpus - occupied))


class CpuThreads:
    """Keeps torch's thread count at the free cores, re-measured every `interval_s` seconds."""

    def __init__(
        self,
        max_threads: int,
        interval_s: float = 0.5,
        read_stat: Callable[[], str] = STAT_PATH.read_text,
        clock: Callable[[], float] = time.monotonic,
        own_cpu_seconds: Callable[[], float] = time.process_time,
    ) -> None:
        self.max_threads = max_threads
        self.interval_s = interval_s
        self.cpus = os.sched_getaffinity(0)
        self._read_stat, self._clock, self._own = read_stat, clock, own_cpu_seconds
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            busy = busy_seconds(self._read_stat(), self.cpus)
        except (OSError, ValueError):
            return None
        return None if busy is None else (self._clock(), busy, self._own())

    def adapt(self) -> int:
        """Re-size the pool if `interval_s` has passed since the last measurement; returns the threads."""
        if self._last is None or self._clock() - self._last[0] < self.interval_s:
            return torch.get_num_threads()
        now = self._sample()
        if now is None:
            return torch.get_num_threads()
        wall, busy, own = (a - b for a, b in zip(now, self._last, strict=True))
        self._last = now
        others_cores = max(0.0, busy - own) / wall
        threads = threads_for(len(self.cpus), others_cores, self.max_threads)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads


@functools.cache
def _governor() -> CpuThreads | None:
    if os.environ.get("PAGEDRL_ADAPTIVE_THREADS", "1") == "0" or not STAT_PATH.exists():
        return None
    return CpuThreads(torch.get_num_threads())


def adapt_cpu_threads() -> None:
    """Fit torch's thread pool to the free cores (see the module docstring); cheap between measurements."""
    governor = _governor()
    if governor is not None:
        governor.adapt()
