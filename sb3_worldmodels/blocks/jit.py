"""How the agents' pure functions are compiled: XLA options and a pinned matmul precision."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

COMPILER_OPTIONS = {"xla_backend_optimization_level": 1, "xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA options of the agents' jitted functions (CPU options; other backends ignore them). LLVM's level
1 instead of the default halves the compile time of the DreamerV3 update on CPU, which dominates a
short run, at no measured cost in step time. Without YNNPACK fusions the dots run on XLA's own
(multi-threaded) kernels: the "1m" DreamerV3 update is about 10% faster on a 2-core machine, and a
dot with a transposed right operand at a few rows is not several times slower
(tools/profile_update.py)."""

MATMUL_PRECISIONS = ("float32", "tensorfloat32", "bfloat16", "default")
"""Values of the configs' ``matmul_precision``: "float32" computes every matmul and convolution in
full float32, as the reference codes ran them (their numbers come from float32 GEMMs); "tensorfloat32"
and "bfloat16" allow the faster reduced-precision passes of recent GPUs; "default" leaves JAX's
default (TF32 on recent NVIDIA GPUs). CPUs compute float32 in every mode."""


def check_matmul_precision(value: str) -> str:
    if value not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {value!r}.")
    return value


def agent_jit(fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> Callable[..., Any]:
    """``jax.jit`` of ``fn(config, ...)`` with ``config`` static and every matmul traced inside under
    ``config.matmul_precision`` (:data:`MATMUL_PRECISIONS`), compiled with :data:`COMPILER_OPTIONS`."""

    @functools.wraps(fn)
    def pinned(config: Any, *args: Any, **kwargs: Any) -> Any:
        precision = check_matmul_precision(config.matmul_precision)
        if precision == "default":
            return fn(config, *args, **kwargs)
        with jax.default_matmul_precision(precision):
            return fn(config, *args, **kwargs)

    return jax.jit(pinned, static_argnames=("config", *static_argnames), compiler_options=COMPILER_OPTIONS)
