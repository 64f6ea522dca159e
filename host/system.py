"""What the project reads of its host: the process's C library, for the system calls Python lacks (madvise,
mincore, malloc_trim), the text of /proc/cpuinfo, and the cache directory where what is built once is kept
(the converted default model, the generated SQL databases, the compiled CPU kernels)."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path


@functools.cache
def libc() -> ctypes.CDLL:
    """The process's C library (glibc, musl or macOS's), with errno kept for ctypes.get_errno."""
    return ctypes.CDLL(None, use_errno=True)


def cpuinfo_text() -> str:
    """The text of /proc/cpuinfo; empty where there is none (not Linux), so no CPU flag is assumed."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cache_dir(name: str) -> Path:
    """The cache entry ``name`` (not created here): under ``$PAGEDRL_CACHE``, else ``~/.cache/pagedrl``."""
    return Path(os.environ.get("PAGEDRL_CACHE", Path.home() / ".cache" / "pagedrl")) / name
