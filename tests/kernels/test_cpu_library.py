"""Building the C kernels: a build is cached per source and machine, a machine that cannot build one gets a
warning and the PyTorch references, never an error, profiles name the kernels, the vector width follows the
ISA the build targets, and the AVX2 build computes what the references do on an AVX-512 machine too."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from pagedrl_kernels import cpu_library
from pagedrl_kernels.cpu_library import SOURCE_DIR, load_library
from pagedrl_kernels.rms_norm import rms_norm


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


def _avx512() -> bool:
    return Path("/proc/cpuinfo").exists() and " avx512f" in Path("/proc/cpuinfo").read_text()


def _built_vector_width(tmp_path: Path, flags: list[str]) -> int:
    """VLEN as pagedrl_kernels/cpu/vector.h sets it for a -march=native build with these extra flags."""
    source = tmp_path / "width.c"
    source.write_text('#include <stdio.h>\n#include "vector.h"\nint main(void) { printf("%d", VLEN); }\n')
    binary = tmp_path / "width"
    command = [
        cpu_library._compiler(),
        "-march=native",
        *flags,
        f"-I{SOURCE_DIR}",
        "-o",
        str(binary),
        str(source),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return int(subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout)


needs_avx512_and_compiler = pytest.mark.skipif(
    not (_avx512() and cpu_library._compiler()), reason="needs an AVX-512 x86 CPU and a C compiler"
)


@needs_avx512_and_compiler
def test_the_vector_width_follows_the_targeted_isa(tmp_path):
    assert _built_vector_width(tmp_path, []) == 16
    assert _built_vector_width(tmp_path, ["-mno-avx512f"]) == 8


@needs_avx512_and_compiler
def test_the_avx2_build_matches_the_references(tmp_path):
    """The CPU-kernel tests (each compares a C kernel with its PyTorch reference) again, in a process whose
    kernels are built for AVX2 (8-float vectors) into an empty cache."""
    env = {**os.environ, "PAGEDRL_CPU_FLAGS": "-mno-avx512f", "PAGEDRL_CACHE": str(tmp_path)}
    tests = [
        "tests/kernels/test_kernels_paged_attention.py",
        "tests/kernels/test_kernels_norm_act.py",
        "tests/kernels/test_kernels_rotary.py",
        "tests/kernels/test_kernels_cache_write.py",
        "tests/kernels/test_sampling_cpu.py",
    ]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-k",
        "not triton",
        *tests,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    built = sorted(path.name.split("-")[0] for path in (tmp_path / "kernels").glob("*.so"))
    assert built == ["layer_ops", "paged_decode", "sampling"]
