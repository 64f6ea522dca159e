"""Building the C kernels: a build is cached per source and machine, a machine that cannot build one gets a
warning and the PyTorch references, never an error, and profiles name the kernels."""

import shutil

import pytest
import torch
from torch.profiler import profile

from kernels import cpu_library
from kernels.cpu_library import load_library
from kernels.rms_norm import rms_norm


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty build cache, and no library loaded yet in this process (restored afterwards)."""
    monkeypatch.setenv("PAGEDRL_CACHE", str(tmp_path))
    load_library.cache_clear()
    yield tmp_path / "kernels"
    monkeypatch.undo()
    load_library.cache_clear()


def test_a_build_is_reused(fresh_cache):
    library = load_library("paged_decode")
    assert library is not None and hasattr(library, "paged_decode_f32")
    (built,) = fresh_cache.glob("paged_decode-*.so")
    stamp = built.stat().st_mtime_ns
    load_library.cache_clear()
    assert load_library("paged_decode") is not None
    assert list(fresh_cache.glob("paged_decode-*.so")) == [built]
    assert built.stat().st_mtime_ns == stamp  # loaded, not rebuilt


def test_a_failed_build_warns_and_falls_back(fresh_cache, monkeypatch):
    monkeypatch.setenv("CC", shutil.which("false"))  # a "compiler" that always fails
    with pytest.warns(RuntimeWarning, match="paged_decode could not be built.*PyTorch reference"):
        assert load_library("paged_decode") is None
    assert list(fresh_cache.glob("*.so")) == []


def test_no_compiler_warns_and_falls_back(fresh_cache, monkeypatch):
    monkeypatch.setattr(cpu_library, "_compiler", lambda: None)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        assert load_library("paged_decode") is None


def test_profiler_tables_name_the_c_kernels():
    """torch.profiler sees only torch's ops; a C kernel call under it is recorded by its symbol."""
    x, weight = torch.randn(4, 32), torch.ones(32)
    with profile() as prof:
        rms_norm(x, weight, 1e-6)
    assert "cpu::rms_norm_f32" in [event.key for event in prof.key_averages()]
