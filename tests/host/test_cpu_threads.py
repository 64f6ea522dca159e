"""The CPU thread governor: /proc/stat parsing, the free-core rule, and a real busy neighbour."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from host.cpu_threads import STAT_PATH, CpuThreads, busy_seconds, threads_for

TICKS = os.sysconf("SC_CLK_TCK")

# user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  900 0 90 5000 10 0 5 0 0 0
cpu0 300 0 30 2000 5 0 2 0 0 0
cpu1 500 10 50 1000 5 1 3 7 0 0
cpu2 100 0 10 2000 0 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""


def test_busy_seconds_sums_the_busy_fields_of_the_allowed_cpus_only() -> None:
    # cpu0: 300 + 30 + 2 = 332 ticks; cpu1: 500 + 10 + 50 + 1 + 3 = 564; idle, iowait and the hypervisor's
    # steal (7 ticks on cpu1) are not this guest's work.
    assert busy_seconds(STAT, {0, 1}) == pytest.approx((332 + 564) / TICKS)
    assert busy_seconds(STAT, {2}) == pytest.approx(110 / TICKS)
    assert busy_seconds(STAT, {5}) is None


@pytest.mark.parametrize(
    ("num_cpus", "others", "max_threads", "expected"),
    [
        (2, 0.05, 2, 2),  # background noise leaves both cores
        (2, 0.3, 2, 1),  # a neighbour taking a third of a core already stalls every barrier on it
        (2, 1.0, 2, 1),
        (2, 2.0, 2, 1),  # never below one thread
        (4, 1.0, 4, 3),
        (16, 0.0, 2, 2),  # never above the starting count
    ],
)
def test_threads_for_leaves_the_occupied_cores(num_cpus, others, max_threads, expected) -> None:
    assert threads_for(num_cpus, others, max_threads) == expected


def _stat_line(busy_ticks: int, steal_ticks: int = 0) -> str:
    cpus = sorted(os.sched_getaffinity(0))
    return "\n".join(f"cpu{cpu} {busy_ticks} 0 0 1000 0 0 0 {steal_ticks}" for cpu in cpus)


class _FakeMachine:
    """/proc/stat, the clock and this process's CPU time, advanced by hand."""

    def __init__(self) -> None:
        self.wall, self.busy_ticks, self.own = 0.0, 0, 0.0

    def advance(self, seconds: float, others_cores: float, own_cores: float) -> None:
        num_cpus = len(os.sched_getaffinity(0))
        self.wall += seconds
        self.own += own_cores * seconds
        # /proc/stat lists each cpu; spread the busy time over them.
        self.busy_ticks += round((others_cores + own_cores) * seconds * TICKS / num_cpus)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_pool_shrinks_under_a_neighbour_and_grows_back(restore_threads) -> None:
    num_cpus = len(os.sched_getaffinity(0))
    if num_cpus < 2:
        pytest.skip("needs 2 cpus to have a core to give up")
    machine = _FakeMachine()
    governor = CpuThreads(
        num_cpus,
        interval_s=0.5,
        read_stat=lambda: _stat_line(machine.busy_ticks),
        clock=lambda: machine.wall,
        own_cpu_seconds=lambda: machine.own,
    )
    torch.set_num_threads(num_cpus)
    machine.advance(0.2, others_cores=1.0, own_cores=1.0)
    assert governor.adapt() == num_cpus  # within the interval: not re-measured
    machine.advance(0.4, others_cores=1.0, own_cores=1.0)
    assert governor.adapt() == num_cpus - 1 == torch.get_num_threads()
    machine.advance(1.0, others_cores=0.0, own_cores=float(num_cpus))
    assert governor.adapt() == num_cpus == torch.get_num_threads()


def test_this_process_own_cpu_time_is_not_a_neighbour(restore_threads) -> None:
    machine = _FakeMachine()
    num_cpus = len(os.sched_getaffinity(0))
    governor = CpuThreads(
        num_cpus,
        read_stat=lambda: _stat_line(machine.busy_ticks),
        clock=lambda: machine.wall,
        own_cpu_seconds=lambda: machine.own,
    )
    machine.advance(1.0, others_cores=0.0, own_cores=float(num_cpus))
    assert governor.adapt() == num_cpus


def test_the_hypervisors_steal_is_not_a_neighbour(restore_threads) -> None:
    # half of every core stolen: no thread count gets that time back, so all threads stay
    machine = _FakeMachine()
    num_cpus = len(os.sched_getaffinity(0))
    steal_ticks = 0

    def stat() -> str:
        return _stat_line(machine.busy_ticks, steal_ticks)

    governor = CpuThreads(
        num_cpus, read_stat=stat, clock=lambda: machine.wall, own_cpu_seconds=lambda: machine.own
    )
    torch.set_num_threads(num_cpus)
    machine.advance(1.0, others_cores=0.0, own_cores=num_cpus / 2)
    steal_ticks += TICKS // 2
    assert governor.adapt() == num_cpus == torch.get_num_threads()


@pytest.mark.skipif(not STAT_PATH.exists(), reason="reads the Linux /proc/stat")
def test_a_real_busy_process_takes_a_core_away(restore_threads) -> None:
    num_cpus = len(os.sched_getaffinity(0))
    if num_cpus < 2:
        pytest.skip("needs 2 cpus to have a core to give up")
    governor = CpuThreads(num_cpus, interval_s=1.0)
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.2)
        assert governor.adapt() <= num_cpus - 1
    finally:
        neighbour.kill()
        neighbour.wait()
