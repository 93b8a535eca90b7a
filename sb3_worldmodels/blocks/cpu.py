"""The host CPU: its model name and vector extensions, read once (Linux's ``/proc/cpuinfo``; the
platform's processor string elsewhere). Speed figures name the CPU they were measured on, and the CPU
programs' compiler options depend on its vector extensions (:mod:`sb3_worldmodels.blocks.jit`)."""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

VECTOR_FLAGS = ("sse4_2", "avx", "fma", "amx", "asimd", "sve", "neon")
"""Prefixes of the CPU flags that name vector extensions (x86 and Arm)."""


@dataclass(frozen=True)
class CpuInfo:
    """The host CPU: ``model`` (its name), ``vendor`` (``GenuineIntel``, ``AuthenticAMD``, ... or ""),
    ``flags`` (every feature flag), ``cores`` (logical CPUs)."""

    model: str
    vendor: str
    flags: frozenset[str]
    cores: int

    @property
    def vector_extensions(self) -> tuple[str, ...]:
        """The flags that name vector extensions, sorted (``avx2``, ``avx512f``, ``amx_tile``, ...)."""
        return tuple(sorted(f for f in self.flags if f.startswith(VECTOR_FLAGS)))

    @property
    def has_avx512(self) -> bool:
        """Whether the CPU has AVX-512 (its foundation, ``avx512f``)."""
        return "avx512f" in self.flags

    def describe(self) -> str:
        """``"<model> (avx512f)"`` or ``"<model> (no avx512f)"``: the CPU as a speed figure names it."""
        return f"{self.model} ({'avx512f' if self.has_avx512 else 'no avx512f'})"

    def as_dict(self) -> dict[str, object]:
        """Fields for a benchmark's result row."""
        return {
            "cpu": self.model,
            "cpu_vendor": self.vendor,
            "cpu_vector_extensions": " ".join(self.vector_extensions),
            "cpu_cores": self.cores,
        }


@functools.cache
def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    """The host CPU (read once per process)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo_path) as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())  # x86, Arm
    return CpuInfo(model, fields.get("vendor_id", ""), flags, os.cpu_count() or 1)
