"""How the agents' pure functions are compiled: XLA options and a pinned matmul precision."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from sb3_worldmodels.blocks.backend import program_form, traced_in_form
from sb3_worldmodels.blocks.compile_cache import use_compilation_cache
from sb3_worldmodels.blocks.cpu import CpuInfo, cpu_info

CPU_OPTION_SETS: dict[str, dict[str, Any]] = {
    "ynn_fusions_off": {"xla_backend_optimization_level": 1, "xla_cpu_experimental_ynn_fusion_type": ""},
    "llvm_level_1": {"xla_backend_optimization_level": 1},
    "xla_defaults": {},
}
"""The named sets of XLA options for the agents' CPU programs (passed on the CPU only:
:func:`backend_compiler_options`). LLVM's
level 1 instead of the default halves the compile time of the DreamerV3 update, which dominates a
short run, at no measured cost in step time. Without YNNPACK fusions the dots run on XLA's own
(multi-threaded) kernels: faster on a CPU without AVX-512, slower on an AMD CPU with it, the same on
an Intel one (:func:`cpu_compiler_options`; ``benchmarks/cpu_options.py`` times every set side by
side)."""

CPU_OPTIONS_ENV = "SB3WM_CPU_OPTIONS"
"""The environment variable that names the set (:data:`CPU_OPTION_SETS`) instead of the choice by CPU
(unset, empty or ``auto``)."""


def cpu_compiler_options(cpu: CpuInfo | None = None, choice: str | None = None) -> dict[str, Any]:
    """The XLA options of the agents' programs on ``cpu`` (default: this host's): the set named by
    ``choice`` (default: :data:`CPU_OPTIONS_ENV`'s value), else chosen by the CPU's vector extensions,
    from ``benchmarks/cpu_options.py`` run on each CPU type (docs/performance.md, CPU compiler options):

    - with AVX-512: ``llvm_level_1``, YNNPACK's fusions kept (TD-MPC2 size 1's plan + update 1.4x
      faster than without them on an AMD EPYC, 2026-12-04; on an Intel Xeon with AMX both agents
      within 1-4% of the other sets, and the programs compile fastest: 2026-12-06);
    - without: ``ynn_fusions_off`` (DreamerV3 "1m"'s update about 10% faster, TD-MPC2's plan and
      update 10% / 3% faster, on an AMD EPYC without AVX-512, 2026-11-30)."""
    choice = os.environ.get(CPU_OPTIONS_ENV, "") if choice is None else choice
    if choice not in ("", "auto"):
        if choice not in CPU_OPTION_SETS:
            raise ValueError(
                f"{CPU_OPTIONS_ENV}={choice!r}: name one of {sorted(CPU_OPTION_SETS)}, or 'auto' (chosen "
                "by the CPU)."
            )
        return dict(CPU_OPTION_SETS[choice])
    cpu = cpu_info() if cpu is None else cpu
    return dict(CPU_OPTION_SETS["llvm_level_1" if cpu.has_avx512 else "ynn_fusions_off"])


COMPILER_OPTIONS = cpu_compiler_options()
"""The XLA options of the agents' jitted functions on this host's CPU (:func:`cpu_compiler_options`)."""


def backend_compiler_options() -> dict[str, Any]:
    """The XLA options of a program compiled now: :data:`COMPILER_OPTIONS` when JAX's default backend
    is the CPU, none on an accelerator. XLA reads the options' names on every backend, and a GPU's
    code generator applies ``xla_backend_optimization_level`` to its own kernels, which the CPU's
    measurements never chose. Asked when a program is built (not at import), so that a process
    whose backend is set later (``jax.distributed.initialize``, ``JAX_PLATFORMS``) gets its own."""
    return dict(COMPILER_OPTIONS) if jax.default_backend() == "cpu" else {}


def cpu_options_name(options: dict[str, Any] | None = None) -> str:
    """The name of ``options`` (default: :data:`COMPILER_OPTIONS`) in :data:`CPU_OPTION_SETS`, else
    ``"custom"``: what a speed figure records of the options it ran under."""
    options = COMPILER_OPTIONS if options is None else options
    return next((name for name, known in CPU_OPTION_SETS.items() if known == options), "custom")


MATMUL_PRECISIONS = ("float32", "tensorfloat32", "bfloat16", "default")
"""Values of the configs' ``matmul_precision``: "float32" computes every matmul and convolution in
full float32, as the reference codes ran them (their numbers come from float32 GEMMs); "tensorfloat32"
and "bfloat16" allow the faster reduced-precision passes of recent GPUs; "default" leaves JAX's
default (TF32 on recent NVIDIA GPUs). CPUs compute float32 in every mode."""


SEED_AXIS = "seeds"
"""The name of the seed axis inside :meth:`AgentFunction.over_seeds` (``jax.vmap``'s ``axis_name``):
a function can reduce over the seeds there (``jax.lax.pmax(x, SEED_AXIS)``)."""


def seeds_in_sequence(config: Any) -> bool:
    """Whether :meth:`AgentFunction.over_seeds` runs the seeds one after the other in its program
    (``jax.lax.map``) rather than side by side (``jax.vmap``): on a CPU, for a config with images.
    Vmapped over the seeds' weights, a convolution becomes one grouped convolution, which XLA's CPU
    backend runs far slower than the seeds' convolutions one by one (TD-MPC2's pixel update at size
    1: 6.8 s for 2 seeds against 0.6 s for one, AMD EPYC, 2 cores). The seeds' numbers are the same
    either way."""
    return jax.default_backend() == "cpu" and bool(getattr(config, "image_shape", ()))


def over_seed_axis() -> bool:
    """Whether the function being traced runs over the seed axis (inside
    :meth:`AgentFunction.over_seeds`), rather than for one seed."""
    try:
        jax.lax.axis_size(SEED_AXIS)
    except NameError:  # the axis name is not bound: one seed's program
        return False
    return True


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


@runtime_checkable
class PerSeedConfig(Protocol):
    """A config some of whose float fields take one value per seed (built by
    :func:`~sb3_worldmodels.blocks.seeds.with_settings`): what :meth:`AgentFunction.over_seeds`
    needs of it."""

    @property
    def program_key(self) -> Hashable:
        """What the program depends on (the config and the names of the per-seed fields, not their
        values): per-seed values that change keep the compiled program."""
        ...

    def seed_values(self) -> dict[str, Any]:
        """The per-seed values, {field: (S,) float32}: an argument of the program, vmapped."""
        ...

    def traced_config(self, values: dict[str, Any]) -> Any:
        """The config inside the vmapped function: the fields of ``values`` (one seed's () values,
        traced) in place of the config's."""
        ...


_PER_SEED_TYPES: dict[type, bool] = {}


def _per_seed(config: Any) -> bool:
    """Whether ``config`` is a :class:`PerSeedConfig` (the protocol's check, once per config class: it
    looks up every member, at every call of an agent's function)."""
    kind = type(config)
    if kind not in _PER_SEED_TYPES:
        _PER_SEED_TYPES[kind] = isinstance(config, PerSeedConfig)
    return _PER_SEED_TYPES[kind]


class AgentFunction:
    """``fn(config, ...)`` compiled per ``config`` (static), with every matmul traced inside under
    ``config.matmul_precision`` (:data:`MATMUL_PRECISIONS`) and :func:`backend_compiler_options`; the
    programs of the :data:`COMPILED_CONFIGS_KEPT` most recently used configs are kept. A config's
    program is kept per form (:func:`~sb3_worldmodels.blocks.backend.program_form`: gather-free or not,
    the scans' unroll): each traces under the form that was in force when it was built.

    :meth:`over_seeds` compiles the same function vmapped over a leading seed axis (its own kept
    programs)."""

    def __init__(self, fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._static_argnames = tuple(static_argnames)
        self._compiled: OrderedDict[Any, Any] = OrderedDict()
        self._compiled_over_seeds: OrderedDict[Any, Any] = OrderedDict()
        self._from_stream: AgentFunction | None = None

    def _pinned(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        precision = check_matmul_precision(config.matmul_precision)
        if precision == "default":
            return self._fn(config, *args, **kwargs)
        with jax.default_matmul_precision(precision):
            return self._fn(config, *args, **kwargs)

    def for_config(self, config: Any) -> Any:
        """The ``jax.jit`` function of ``config`` (``lower``, ``trace``, ... work on it)."""
        if _per_seed(config):
            raise TypeError(
                f"{self._fn.__name__}: a config with per-seed settings runs over a seed axis; call "
                "over_seeds(config) instead."
            )
        key = (config, program_form())
        jitted = self._compiled.pop(key, None)
        if jitted is None:
            use_compilation_cache()
            form = key[1]

            def call(*args: Any, **kwargs: Any) -> Any:
                with traced_in_form(form):
                    return self._pinned(config, *args, **kwargs)

            call.__name__ = call.__qualname__ = self._fn.__name__  # the program's name
            jitted = jax.jit(
                call,
                static_argnames=self._static_argnames,
                compiler_options=backend_compiler_options(),
            )
            while len(self._compiled) >= COMPILED_CONFIGS_KEPT:
                self._compiled.popitem(last=False)
        self._compiled[key] = jitted
        return jitted

    def over_seeds(self, config: Any) -> Any:
        """``fn`` over a leading seed axis S: the ``jax.jit`` of ``jax.vmap(fn(config, ...))``, every
        positional argument, every keyword argument but the static ones and every output with a
        leading S (the static keyword arguments, e.g. ``deterministic=``, are given by name and shared
        by all seeds). Compiled per ``config`` as :meth:`for_config` (same precision pinning and
        compiler options), the programs of the :data:`COMPILED_CONFIGS_KEPT` most recently used
        configs kept apart from the single-seed ones.

        ``config`` may carry per-seed float settings (:class:`PerSeedConfig`, from
        :func:`~sb3_worldmodels.blocks.seeds.with_settings`): their values are an argument of the
        program (other values, same program), each seed's traced in its config. The returned
        function has ``lower`` and ``trace`` either way."""
        per_seed = config if _per_seed(config) else None
        key = (config if per_seed is None else per_seed.program_key, program_form())
        jitted = self._compiled_over_seeds.pop(key, None)
        if jitted is None:
            use_compilation_cache()
            jitted = self._jit_over_seeds(config, per_seed)
            while len(self._compiled_over_seeds) >= COMPILED_CONFIGS_KEPT:
                self._compiled_over_seeds.popitem(last=False)
        self._compiled_over_seeds[key] = jitted
        return _WithSeedValues(jitted, None if per_seed is None else per_seed.seed_values())

    def _jit_over_seeds(self, config: Any, per_seed: PerSeedConfig | None) -> Any:
        form = program_form()

        def call(values: Any, *args: Any, **kwargs: Any) -> Any:
            static = {name: kwargs.pop(name) for name in self._static_argnames if name in kwargs}

            def one_seed(seed_values: Any, *seed_args: Any, **seed_kwargs: Any) -> Any:
                seed_config = config if per_seed is None else per_seed.traced_config(seed_values)
                return self._pinned(seed_config, *seed_args, **seed_kwargs, **static)

            with traced_in_form(form):
                if seeds_in_sequence(config):
                    return jax.lax.map(lambda xs: one_seed(xs[0], *xs[1], **xs[2]), (values, args, kwargs))
                return jax.vmap(one_seed, axis_name=SEED_AXIS)(values, *args, **kwargs)

        call.__name__ = call.__qualname__ = f"{self._fn.__name__}_over_seeds"  # the program's name
        return jax.jit(
            call, static_argnames=self._static_argnames, compiler_options=backend_compiler_options()
        )

    def from_stream(self) -> AgentFunction:
        """This function drawing its key from a key stream: ``g(config, *args, stream_key, **kwargs) ->
        (fn(config, *args, step_key, **kwargs), next_key)`` with ``next_key, step_key =
        jax.random.split(stream_key)`` (``fn``'s last positional argument is its key). The split is
        the one a caller would make before each call, inside the call's program instead of a dispatch
        of its own; the same keys, the same outputs."""
        if self._from_stream is None:
            fn = self._fn

            def from_stream(config: Any, *args: Any, **kwargs: Any) -> tuple[Any, jax.Array]:
                *arguments, stream_key = args
                next_key, step_key = jax.random.split(stream_key)
                return fn(config, *arguments, step_key, **kwargs), next_key

            from_stream.__name__ = from_stream.__qualname__ = f"{fn.__name__}_from_stream"
            self._from_stream = AgentFunction(from_stream, self._static_argnames)
        return self._from_stream

    def __call__(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return self._pinned(config, *args, **kwargs)  # inside another trace: inline it
        return self.call_from_host(config, *args, **kwargs)

    def call_from_host(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        """The compiled call, from host code that is never traced (the training loop's calls): the
        call without ``__call__``'s look for tracers among the arguments, a walk over every leaf of
        the agent state (about 60-80 us per call for TD-MPC2 size 1's on a 2-core Xeon)."""
        if _TIMERS:
            return _timed(self.for_config(config), args, kwargs)
        return self.for_config(config)(*args, **kwargs)

    def _cache_size(self) -> int:
        """Compiled programs held, over the kept configs (``jax.jit``'s ``_cache_size``), single-seed
        and over seeds."""
        programs = (*self._compiled.values(), *self._compiled_over_seeds.values())
        return sum(jitted._cache_size() for jitted in programs)

    def lower(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return self.for_config(config).lower(*args, **kwargs)

    def trace(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return self.for_config(config).trace(*args, **kwargs)


class _WithSeedValues:
    """A program over seeds with its first argument (the per-seed values, or None) given: calling,
    ``lower`` and ``trace`` take the program's other arguments, and so does the ``compile()`` of what
    ``lower`` returns."""

    def __init__(self, jitted: Any, values: Any) -> None:
        self.jitted = jitted
        self.values = values

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _TIMERS:
            return _timed(self.jitted, (self.values, *args), kwargs)
        return self.jitted(self.values, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> _LoweredWithSeedValues:
        return _LoweredWithSeedValues(self.jitted.lower(self.values, *args, **kwargs), self.values)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.trace(self.values, *args, **kwargs)


class _LoweredWithSeedValues:
    """``jax.stages.Lowered`` of a program over seeds (``as_text``, ``cost_analysis``, ... as
    ``Lowered``), whose ``compile()`` is called without the per-seed values."""

    def __init__(self, lowered: Any, values: Any) -> None:
        self.lowered = lowered
        self.values = values

    def compile(self, *args: Any, **kwargs: Any) -> _WithSeedValues:
        return _WithSeedValues(self.lowered.compile(*args, **kwargs), self.values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lowered, name)


def agent_jit(fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> AgentFunction:
    """``fn(config, ...)`` compiled per config: see :class:`AgentFunction`."""
    return AgentFunction(fn, static_argnames)


# ------------------------------------------------------------------------------------------------
# Measuring the programs of a run
# ------------------------------------------------------------------------------------------------

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""JAX's monitoring event of one XLA compilation (also when the persistent cache answers it)."""


@contextlib.contextmanager
def compilations() -> Iterator[list[str]]:
    """The names of the programs compiled inside the block, in order (every compilation, the agents'
    and any other: an eager operation on a new shape is one too)."""
    names: list[str] = []

    def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == COMPILE_EVENT:
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


CACHE_LOOKUP_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
"""JAX's event of a program looked up in the persistent compilation cache before it is compiled."""
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
"""JAX's event of a program loaded from the persistent cache (no compilation)."""
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"
"""JAX's event of a compiled program written to the persistent cache (jax 0.10 names it a miss but
records it only for a written entry: a program under the cache's thresholds misses silently)."""


@dataclasses.dataclass
class CacheEvents:
    """What JAX's persistent compilation cache did for the programs compiled inside a block, by
    program name (a name once per compilation)."""

    hits: list[str] = dataclasses.field(default_factory=list)
    """Loaded from the cache: nothing compiled."""
    misses: list[str] = dataclasses.field(default_factory=list)
    """Looked up, not found, compiled (written or not)."""
    written: list[str] = dataclasses.field(default_factory=list)
    """The misses written to the cache (the others compiled faster than its threshold or call back
    to the host)."""
    uncached: list[str] = dataclasses.field(default_factory=list)
    """Compiled without a look-up: JAX's cache switched off (``jax_enable_compilation_cache``)."""


@contextlib.contextmanager
def cache_events() -> Iterator[CacheEvents]:
    """The persistent cache's answer for every program compiled inside the block (the agents' and any
    other), from JAX's monitoring events: a compilation's cache events come between its start and its
    end (:data:`COMPILE_EVENT`), in the compiling thread."""
    events = CacheEvents()
    local = threading.local()

    def started(event: str, value: float | int, **kwargs: str | int) -> None:
        if event == COMPILE_EVENT:
            local.__dict__.setdefault("open", []).append(set())

    def cache_event(event: str, **kwargs: str | int) -> None:
        if event in (CACHE_LOOKUP_EVENT, CACHE_HIT_EVENT, CACHE_WRITE_EVENT) and getattr(local, "open", None):
            local.open[-1].add(event)

    def ended(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event != COMPILE_EVENT or not getattr(local, "open", None):
            return
        seen, name = local.open.pop(), str(kwargs.get("fun_name"))
        if CACHE_HIT_EVENT in seen:
            events.hits.append(name)
        elif CACHE_LOOKUP_EVENT in seen:
            events.misses.append(name)
            if CACHE_WRITE_EVENT in seen:
                events.written.append(name)
        else:
            events.uncached.append(name)

    jax.monitoring.register_scalar_listener(started)
    jax.monitoring.register_event_listener(cache_event)
    jax.monitoring.register_event_duration_secs_listener(ended)
    try:
        yield events
    finally:
        jax.monitoring.unregister_scalar_listener(started)
        jax.monitoring.unregister_event_listener(cache_event)
        jax.monitoring.unregister_event_duration_listener(ended)


@dataclasses.dataclass
class CallTimes:
    """Seconds spent in the agents' jitted calls, and how many calls."""

    seconds: float = 0.0
    calls: int = 0


_TIMERS: list[CallTimes] = []


@contextlib.contextmanager
def timed_calls() -> Iterator[CallTimes]:
    """The wall time of every call of an :class:`AgentFunction` (and of its programs over seeds) inside
    the block, each call waited for (``jax.block_until_ready``) before its time is taken: dispatch,
    the transfer of host arguments and the device's time. A run's other time is the host's."""
    times = CallTimes()
    _TIMERS.append(times)
    try:
        yield times
    finally:
        _TIMERS.remove(times)


def _timed(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    start = time.perf_counter()
    out = jax.block_until_ready(jitted(*args, **kwargs))
    spent = time.perf_counter() - start
    for times in _TIMERS:
        times.seconds += spent
        times.calls += 1
    return out
