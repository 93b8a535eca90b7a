"""XLA compiler options shared by every jitted agent function."""

from __future__ import annotations

COMPILER_OPTIONS = {"xla_backend_optimization_level": 1, "xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA options of the agents' jitted functions (CPU options; other backends ignore them). LLVM's level
1 instead of the default halves the compile time of the DreamerV3 update on CPU, which dominates a
short run, at no measured cost in step time. Without YNNPACK fusions the dots run on XLA's own
(multi-threaded) kernels: the "1m" DreamerV3 update is about 10% faster on a 2-core machine, and a
dot with a transposed right operand at a few rows is not several times slower
(benchmarks/profile_update.py)."""
