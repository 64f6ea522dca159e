"""What a benchmark ran on, for its JSON line: the CPU's model name and its vector ISA flags (SSE, AVX, FMA,
AMX and their extensions, such as avx512_bf16 or avx_vnni), read from /proc/cpuinfo."""

from __future__ import annotations

import platform

from host.system import cpuinfo_text

_ISA_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx")


def cpu_description() -> dict[str, str | list[str]]:
    """{"cpu_model": ..., "cpu_isa": [...]}; the platform's processor name and no flags where there is no
    /proc/cpuinfo."""
    lines = cpuinfo_text().splitlines()
    fields: dict[str, str] = {}  # the first CPU's

    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    return {
        "cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
        "cpu_isa": sorted(flag for flag in flags if flag.startswith(_ISA_PREFIXES)),
    }
