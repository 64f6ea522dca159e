"""The KV pool: one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], made in one place.

On CUDA it is an ordinary zeroed allocation. On the CPU it is an anonymous private mapping, which works like
virtual memory: the reservation (sized from memory_fraction) takes address space only, the kernel commits a
zero-filled page the first time it is written, so never-written blocks read as zeros (attention may read a
padded slot and weight it by 0, where garbage could be NaN) and the process grows with the blocks the engine
has written. The block manager hands out the most recently freed block first, so the written blocks stay the
high-water mark of blocks in use (including the prefix cache's).
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import sys

import torch


def commits_on_write(device: torch.device) -> bool:
    """Whether a pool on `device` takes memory as it is written (the CPU) rather than all at once."""
    return device.type == "cpu"


def allocate_kv_pool(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A zero KV pool [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]; on the CPU its
    memory is committed page by page as it is written."""
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    if not commits_on_write(device):
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * (torch.finfo(dtype).bits // 8)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        # Commit base pages: one block is a 12 KiB slab per layer and K/V (SmolLM2), and a transparent huge
        # page would commit 2 MiB around each.
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    # The tensor holds a reference to the mapping, which is unmapped when the pool's last view is freed.
    return torch.frombuffer(mapping, dtype=dtype).view(shape)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def resident_bytes(pool: torch.Tensor) -> int:
    """Bytes of `pool` held in memory. On a Linux CPU, mincore counts the pages that were touched (written,
    or read while never written); elsewhere this is the whole pool, which a device allocation commits when
    it is made (and which is an upper bound on a CPU without mincore)."""
    nbytes = pool.numel() * pool.element_size()
    if not commits_on_write(pool.device) or sys.platform != "linux":
        return nbytes
    page = mmap.PAGESIZE
    start = pool.data_ptr() // page * page
    num_pages = -(-(pool.data_ptr() + nbytes - start) // page)
    pages = bytearray(num_pages)  # bit 0 of each byte: that page is resident
    status = _libc().mincore(
        ctypes.c_void_p(start),
        ctypes.c_size_t(num_pages * page),
        (ctypes.c_ubyte * num_pages).from_buffer(pages),
    )
    if status != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mincore could not read the KV pool's pages: {os.strerror(errno)}")
    return min(nbytes, (num_pages - pages.count(0)) * page)
