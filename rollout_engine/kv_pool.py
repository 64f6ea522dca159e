"""The KV pool: one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], made in one place.

On CUDA it is an ordinary zeroed allocation. On the CPU it is an anonymous private mapping, which works like
virtual memory: the reservation (sized from memory_fraction) takes address space only, the kernel commits a
zero-filled page the first time it is written, so never-written blocks read as zeros (attention may read a
padded slot and weight it by 0, where garbage could be NaN) and the process grows with the blocks the engine
has written. The block manager hands out the most recently freed block first, so the written blocks stay the
high-water mark of blocks in use (including the prefix cache's), and `release_blocks` gives the memory of
free blocks back (the engine does so whenever its prefix cache is reset, after each weight update).
`commit_blocks` commits the pages of blocks about to be written in a few system calls: the model runner calls
it before each step for the blocks the step writes first, where a page fault per page would cost the step.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
from collections.abc import Iterable
from errno import EINVAL, ENOSYS

import torch

from host.system import libc
from rollout_engine.block_manager import ceil_div


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


def _resident_pages(pool: torch.Tensor) -> tuple[int, bytearray, int]:
    """(address of the pool's first page, one byte a page whose bit 0 says it is resident, the bytes of the
    pool on resident pages), by mincore."""
    page, nbytes = mmap.PAGESIZE, pool.numel() * pool.element_size()
    start = pool.data_ptr() // page * page
    num_pages = ceil_div(pool.data_ptr() + nbytes - start, page)
    pages = bytearray(num_pages)
    status = libc().mincore(
        ctypes.c_void_p(start),
        ctypes.c_size_t(num_pages * page),
        (ctypes.c_ubyte * num_pages).from_buffer(pages),
    )
    if status != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mincore could not read the KV pool's pages: {os.strerror(errno)}")
    return start, pages, min(nbytes, (num_pages - pages.count(0)) * page)


def resident_bytes(pool: torch.Tensor) -> int:
    """Bytes of `pool` held in memory. On a Linux CPU, mincore counts the pages that were touched (written,
    or read while never written); elsewhere this is the whole pool, which a device allocation commits when
    it is made (and which is an upper bound on a CPU without mincore)."""
    nbytes = pool.numel() * pool.element_size()
    if not commits_on_write(pool.device) or sys.platform != "linux":
        return nbytes
    return _resident_pages(pool)[2]


def resident_blocks(pool: torch.Tensor) -> tuple[int, list[int]]:
    """(resident_bytes(pool), the blocks that lie, in any layer's K or V, on a page held in memory) from one
    read of the page map. Those are the only blocks whose release can give memory back, found at the cost of
    the page map rather than of the block count; off a Linux CPU there are none."""
    page, nbytes = mmap.PAGESIZE, pool.numel() * pool.element_size()
    if not commits_on_write(pool.device) or sys.platform != "linux":
        return nbytes, []
    start, pages, resident = _resident_pages(pool)
    held = torch.nonzero(torch.frombuffer(pages, dtype=torch.uint8) & 1).flatten()
    if not held.numel():
        return resident, []
    block_bytes = pool[0, 0, 0].numel() * pool.element_size()
    first = (held * page + (start - pool.data_ptr())).clamp(0, nbytes - 1)
    last = (first + page - 1).clamp(max=nbytes - 1)
    span = torch.arange(ceil_div(page, block_bytes) + 1)  # the most blocks one page can touch
    slab_blocks = (first // block_bytes)[:, None] + span
    touched = slab_blocks[slab_blocks <= (last // block_bytes)[:, None]]
    return resident, torch.unique(touched % pool.shape[2]).tolist()


def _runs(block_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted [start, end) runs of consecutive block ids."""
    runs: list[tuple[int, int]] = []
    for block_id in sorted(block_ids):
        if runs and runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], block_id + 1)
        else:
            runs.append((block_id, block_id + 1))
    return runs


def _byte_ranges(pool: torch.Tensor, block_ids: Iterable[int]) -> list[list[int]]:
    """[start, stop) addresses of these blocks in every layer's K and V, in address order, merged where they
    touch (also across slab boundaries)."""
    num_slabs = pool.shape[0] * pool.shape[1]  # one slab per layer and K / V: [num_blocks, block_size, ...]
    num_blocks = pool.shape[2]
    block_bytes = pool[0, 0, 0].numel() * pool.element_size()
    runs = _runs(block_ids)
    ranges: list[list[int]] = []
    for slab in range(num_slabs):
        for first, end in runs:
            start = pool.data_ptr() + (slab * num_blocks + first) * block_bytes
            stop = start + (end - first) * block_bytes
            if ranges and ranges[-1][1] == start:
                ranges[-1][1] = stop
            else:
                ranges.append([start, stop])
    return ranges


def _madvise(start: int, stop: int, advice: int) -> int:
    """madvise over [start, stop); 0, or the errno of its failure."""
    if libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), advice) == 0:
        return 0
    return ctypes.get_errno()


def release_blocks(pool: torch.Tensor, block_ids: Iterable[int]) -> None:
    """Give the memory of these (free) blocks back to the system: on a Linux CPU, every page of the pool that
    lies wholly inside them is dropped and reads as zeros again; a page shared with another block is kept.
    Elsewhere nothing happens."""
    if not commits_on_write(pool.device) or sys.platform != "linux":
        return
    page = mmap.PAGESIZE
    for start, stop in _byte_ranges(pool, block_ids):
        start, stop = ceil_div(start, page) * page, stop // page * page
        if stop > start and (errno := _madvise(start, stop, mmap.MADV_DONTNEED)):
            raise OSError(errno, f"madvise could not release KV pool pages: {os.strerror(errno)}")


# Linux 5.14's MADV_POPULATE_WRITE (Python's mmap names it from 3.12 on); set to 0 once the kernel refuses it.
_populate_advice = [getattr(mmap, "MADV_POPULATE_WRITE", 23)]


def commit_blocks(pool: torch.Tensor, block_ids: Iterable[int]) -> None:
    """Commit the pages of these blocks now, one system call per run of blocks, instead of a page fault for
    each page as a step writes them (a 128-sequence SmolLM2 decode step takes about 1,500). On a Linux CPU;
    elsewhere, or on a kernel before 5.14, the pages fault in as they are written."""
    if not commits_on_write(pool.device) or sys.platform != "linux" or not _populate_advice[0]:
        return
    page = mmap.PAGESIZE
    for start, stop in _byte_ranges(pool, block_ids):
        start, stop = start // page * page, ceil_div(stop, page) * page
        errno = _madvise(start, stop, _populate_advice[0])
        if errno in (EINVAL, ENOSYS):  # a kernel without it: the writes commit the pages themselves
            _populate_advice[0] = 0
            return
        if errno:
            raise OSError(errno, f"madvise could not commit KV pool pages: {os.strerror(errno)}")
