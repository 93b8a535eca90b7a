"""How the agents' pure functions are compiled: XLA options and a pinned matmul precision."""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
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


def scan_updates(body: Callable[[Any, Any], tuple[Any, Any]], state: Any, batches: Any) -> tuple[Any, Any]:
    """``jax.lax.scan(body, state, batches)`` over the leading K axis, without the loop when K is 1
    (the call's one update, its outputs given the leading axis of 1).

    XLA:CPU runs a convolution's weight gradient inside a while loop 20-100x slower than the same
    gradient outside one (a 7x7 stride-2 convolution of 256 images, 9 to 8 channels: 99 ms outside,
    4.1 s inside), so a pixel update of one per call must not sit in a loop of one.
    """
    leaves = jax.tree_util.tree_leaves(batches)
    if leaves and all(leaf.shape[0] == 1 for leaf in leaves):
        state, out = body(state, jax.tree_util.tree_map(lambda leaf: leaf[0], batches))
        return state, jax.tree_util.tree_map(lambda leaf: jax.numpy.expand_dims(leaf, 0), out)
    return jax.lax.scan(body, state, batches)


def check_matmul_precision(value: str) -> str:
    if value not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {value!r}.")
    return value


COMPILED_CONFIGS_KEPT = 4
"""How many configurations' compiled programs each :func:`agent_jit` function keeps (least recently
used dropped first). XLA:CPU maps every compiled kernel into memory separately: one small DreamerV3
configuration's update alone holds about 4,500 memory mappings, and a process may hold 65,530
(Linux's default ``vm.max_map_count``) before the next compile aborts it. Keeping every program
ever compiled would crash a process that builds many configurations, such as an Optuna study or a
test session; a dropped configuration is compiled again (or read from JAX's persistent cache) when
it is used again."""


def memory_mappings() -> int | None:
    """The memory mappings this process holds (``/proc/<pid>/maps``); None where there is no such file
    (not Linux)."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


class AgentFunction:
    """``fn(config, ...)`` compiled per ``config`` (static), with every matmul traced inside under
    ``config.matmul_precision`` (:data:`MATMUL_PRECISIONS`) and :data:`COMPILER_OPTIONS`; the
    programs of the :data:`COMPILED_CONFIGS_KEPT` most recently used configs are kept."""

    def __init__(self, fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._static_argnames = tuple(static_argnames)
        self._compiled: OrderedDict[Any, Any] = OrderedDict()

    def _pinned(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        precision = check_matmul_precision(config.matmul_precision)
        if precision == "default":
            return self._fn(config, *args, **kwargs)
        with jax.default_matmul_precision(precision):
            return self._fn(config, *args, **kwargs)

    def for_config(self, config: Any) -> Any:
        """The ``jax.jit`` function of ``config`` (``lower``, ``trace``, ... work on it)."""
        jitted = self._compiled.pop(config, None)
        if jitted is None:

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._pinned(config, *args, **kwargs)

            call.__name__ = call.__qualname__ = self._fn.__name__  # the program's name
            jitted = jax.jit(
                call,
                static_argnames=self._static_argnames,
                compiler_options=COMPILER_OPTIONS,
            )
            while len(self._compiled) >= COMPILED_CONFIGS_KEPT:
                self._compiled.popitem(last=False)
        self._compiled[config] = jitted
        return jitted

    def __call__(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return self._pinned(config, *args, **kwargs)  # inside another trace: inline it
        return self.for_config(config)(*args, **kwargs)

    def _cache_size(self) -> int:
        """Compiled programs held, over the kept configs (``jax.jit``'s ``_cache_size``)."""
        return sum(jitted._cache_size() for jitted in self._compiled.values())

    def lower(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return self.for_config(config).lower(*args, **kwargs)

    def trace(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return self.for_config(config).trace(*args, **kwargs)


def agent_jit(fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> AgentFunction:
    """``fn(config, ...)`` compiled per config: see :class:`AgentFunction`."""
    return AgentFunction(fn, static_argnames)
