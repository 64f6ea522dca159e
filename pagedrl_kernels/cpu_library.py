"""The C kernels of pagedrl_kernels/cpu/, built on first use with the machine's C compiler and loaded through
ctypes.

A library is compiled once per source (with the shared headers), compiler, machine (with -march=native,
so it uses the CPU's vector units, whose width pagedrl_kernels/cpu/vector.h picks) and extra flags into
kernels/ of the cache directory (host.system.cache_dir), and later processes load the cached file.
$PAGEDRL_CPU_FLAGS adds compiler flags: with `-mno-avx512f`, an AVX-512 machine builds and runs the AVX2 code
(the tests check it that way too). OpenMP parallel loops share PyTorch's OpenMP runtime, so they use torch's
threads (torch.set_num_threads) and no others. Without a compiler, or when a build fails, `load_library` warns
once and returns None: the dispatchers then run the PyTorch references, which compute the same thing more
slowly.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from host.system import cache_dir, cpuinfo_text
from pagedrl_kernels.backend import get_backend

SOURCE_DIR = Path(__file__).parent / "cpu"
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=gnu11"]


def _compiler() -> str | None:
    candidates = [os.environ.get("CC"), "cc", "gcc", "clang"]
    return next((path for path in map(shutil.which, filter(None, candidates)) if path), None)


def _extra_flags() -> list[str]:
    return os.environ.get("PAGEDRL_CPU_FLAGS", "").split()


def _machine_key(compiler: str) -> str:
    """What a -march=native build depends on besides its source: the compiler's version, the CPU and the
    extra flags."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    cpu_flags = next((line for line in cpuinfo_text().splitlines() if line.startswith("flags")), "")
    return "\n".join((compiler, version, platform.machine(), cpu_flags, *_extra_flags()))


def _build(source: Path, compiler: str, target: Path) -> None:
    """Compile `source` into `target` atomically (concurrent builders each write their own file first);
    with OpenMP when the compiler has it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        errors = ""
        for openmp in (["-fopenmp"], []):
            command = [compiler, *_FLAGS, *_extra_flags(), *openmp, "-o", str(built), str(source), "-lm"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if result.returncode == 0:
                os.replace(built, target)
                return
            errors = result.stderr.strip()
        raise RuntimeError(f"{' '.join(command)} failed:\n{errors}")


@functools.cache
def load_library(name: str) -> ctypes.CDLL | None:
    """pagedrl_kernels/cpu/<name>.c as a loaded library, built first if this machine has no build of it yet;
    None (after one warning) when it cannot be built."""
    source = SOURCE_DIR / f"{name}.c"
    compiler = _compiler()
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found (looked for $CC, cc, gcc and clang)")
        headers = b"".join(path.read_bytes() for path in sorted(SOURCE_DIR.glob("*.h")))
        key = source.read_bytes() + headers + _machine_key(compiler).encode()
        digest = hashlib.sha256(key).hexdigest()[:16]
        target = cache_dir("kernels") / f"{name}-{digest}.so"
        if not target.exists():
            _build(source, compiler, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        warnings.warn(
            f"the CPU kernel {name} could not be built, so the slower PyTorch reference runs instead: "
            f"{error}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


PTR, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


class CpuKernel:
    """One C function of pagedrl_kernels/cpu/<library>.c, with its argument types (PTR, I64, I32, F32 ...) and
    the dtype of the tensors it reads (fp32 unless named)."""

    def __init__(
        self, library: str, symbol: str, *argtypes: type, dtype: torch.dtype = torch.float32
    ) -> None:
        self.library, self.symbol, self.argtypes, self.dtype = library, symbol, list(argtypes), dtype

    @functools.cached_property
    def _function(self) -> ctypes._CFuncPtr | None:
        library = load_library(self.library)
        if library is None:
            return None
        function = getattr(library, self.symbol)
        function.argtypes, function.restype = self.argtypes, ctypes.c_int
        return function

    def available(self, *tensors: torch.Tensor | None) -> bool:
        """Whether it runs for these tensors (None ones aside): the "auto" kernel backend, CPU tensors of its
        dtype, and a library that could be built here."""
        return (
            get_backend() == "auto"
            and all(t.device.type == "cpu" and t.dtype == self.dtype for t in tensors if t is not None)
            and self._function is not None
        )

    def __call__(self, *args: int | float | None) -> int:
        if self._function is None:
            raise RuntimeError(f"the CPU kernel {self.library}.{self.symbol} cannot be built on this machine")
        if not torch.autograd._profiler_enabled():
            return self._function(*args)
        # Named in torch.profiler's tables, which see only torch's own ops (checked first: 15 us a call).
        with torch.profiler.record_function(f"cpu::{self.symbol}"):
            return self._function(*args)


class CpuKernels:
    """The fp32 and the bf16 build of one C op, <symbol>_f32 and <symbol>_bf16 in
    pagedrl_kernels/cpu/<library>.c, with the same argument types: `kernels[dtype]` is the CpuKernel for
    tensors of that dtype."""

    def __init__(self, library: str, symbol: str, *argtypes: type) -> None:
        self._kernels = {
            torch.float32: CpuKernel(library, f"{symbol}_f32", *argtypes),
            torch.bfloat16: CpuKernel(library, f"{symbol}_bf16", *argtypes, dtype=torch.bfloat16),
        }

    def __getitem__(self, dtype: torch.dtype) -> CpuKernel:
        return self._kernels[dtype]

    def available(self, first: torch.Tensor, *others: torch.Tensor | None) -> bool:
        """Whether the build of `first`'s dtype runs for these tensors (see CpuKernel.available)."""
        kernel = self._kernels.get(first.dtype)
        return kernel is not None and kernel.available(first, *others)
