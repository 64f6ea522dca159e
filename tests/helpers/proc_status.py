"""The kernel's own account of this process's memory: a line of /proc/self/status (Linux only)."""

from pathlib import Path


def proc_status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its high-water mark), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} line in /proc/self/status")
