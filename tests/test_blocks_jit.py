"""agent_jit keeps the compiled programs of a few configurations, not of every one ever built.

XLA:CPU maps each compiled kernel into memory on its own, and Linux refuses a process more than
``vm.max_map_count`` mappings (65,530 by default): a long process that builds many configurations
(an Optuna study, a test session) aborted in its next compile once all of them were kept.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from sb3_worldmodels.blocks import jit as J
from sb3_worldmodels.blocks.cpu import cpu_info


@dataclasses.dataclass(frozen=True)
class Config:
    scale: float
    matmul_precision: str = "float32"


def _chain(config: Config, x):
    for _ in range(5):
        x = jnp.sin(x @ x.T) * config.scale + jnp.cumsum(x, 0)
    return x


@pytest.mark.skipif(J.memory_mappings() is None, reason="counts Linux memory mappings")
def test_the_programs_of_old_configs_are_released():
    fn = J.agent_jit(_chain)
    x = jnp.ones((8, 8))
    fn(Config(0.0), x)
    before = J.memory_mappings()
    for i in range(1, 60):
        fn(Config(float(i)), x)
    gc.collect()
    # Kept: about 8 mappings per program for COMPILED_CONFIGS_KEPT programs; all 60 kept: ~480 more.
    assert J.memory_mappings() - before < 150


def test_recent_configs_are_not_compiled_again_and_evicted_ones_are():
    traces = []

    def fn(config: Config, x):
        traces.append(config.scale)
        return x * config.scale

    jitted = J.agent_jit(fn)
    x = jnp.ones(3)
    configs = [Config(float(i)) for i in range(J.COMPILED_CONFIGS_KEPT + 1)]
    for config in configs[:-1]:
        assert float(jitted(config, x)[0]) == config.scale
    for config in configs[:-1]:  # all kept: no new trace
        jitted(config, x)
    assert traces == [c.scale for c in configs[:-1]]
    jitted(configs[-1], x)  # evicts the least recently used, configs[0]
    jitted(configs[0], x)
    assert traces[-2:] == [configs[-1].scale, configs[0].scale]
    assert len(jitted._compiled) == J.COMPILED_CONFIGS_KEPT


def test_a_call_inside_another_trace_is_inlined():
    fn = J.agent_jit(lambda config, x: x * config.scale)
    outer = jax.jit(lambda x: fn(Config(2.0), x) + 1.0)
    assert float(outer(jnp.ones(()))) == 3.0
    assert jax.eval_shape(lambda x: fn(Config(2.0), x), jnp.ones(3)).shape == (3,)


def test_from_stream_draws_the_key_a_caller_would_split():
    """The acting calls draw their key from the collection stream inside their program: the outputs
    and the stream's next key are those of the eager split before the call, bit for bit, one seed
    and over seeds."""

    def noisy(config: Config, x, key, shift: float = 0.0):
        return x * config.scale + jax.random.normal(key, x.shape) + shift

    fn = J.agent_jit(noisy, static_argnames=("shift",))
    stream = fn.from_stream()
    assert fn.from_stream() is stream and stream.__name__ == "noisy_from_stream"
    x, key = jnp.arange(4.0), jax.random.PRNGKey(7)
    for _ in range(3):
        (out, following) = stream(Config(2.0), x, key, shift=1.0)
        expected_key, step_key = jax.random.split(key)
        assert jnp.array_equal(out, fn(Config(2.0), x, step_key, shift=1.0))
        assert jnp.array_equal(following, expected_key)
        key = following
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    outs, following = stream.over_seeds(Config(2.0))(jnp.stack([x, x + 1]), keys, shift=1.0)
    for i in range(2):
        expected_key, step_key = jax.random.split(keys[i])
        assert jnp.array_equal(outs[i], fn(Config(2.0), x + i, step_key, shift=1.0))
        assert jnp.array_equal(following[i], expected_key)
    assert jnp.array_equal(fn.call_from_host(Config(2.0), x, key), fn(Config(2.0), x, key))


def test_timed_calls_count_the_agent_calls_inside_the_block_and_compilations_name_the_programs():
    fn = J.agent_jit(_chain)
    x, xs = jnp.ones((4, 4)), jnp.ones((2, 4, 4))
    with J.compilations() as compiled, J.timed_calls() as outer:
        fn(Config(1.0), x)  # compiled here
        with J.timed_calls() as inner:
            fn.over_seeds(Config(1.0))(xs)
    fn(Config(1.0), x)  # outside: not timed
    assert (outer.calls, inner.calls) == (2, 1)
    assert outer.seconds >= inner.seconds > 0.0
    assert compiled == ["jit(_chain)", "jit(_chain_over_seeds)"]
    with J.compilations() as again:
        fn(Config(1.0), x)
    assert again == []
    assert not J._TIMERS


CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu sse4_2 avx avx2 fma {extra}

processor\t: 1
vendor_id\t: OtherVendor
model name\t: another
flags\t\t: fpu
"""


def read_cpu(tmp_path, vendor: str, model: str, extra: str):
    path = tmp_path / f"cpuinfo_{vendor}_{extra.replace(' ', '_')}"
    path.write_text(CPUINFO.format(vendor=vendor, model=model, extra=extra))
    return cpu_info.__wrapped__(str(path))


def test_the_cpu_is_read_from_its_first_processor_block(tmp_path):
    cpu = read_cpu(tmp_path, "GenuineIntel", "Intel(R) Xeon(R) Processor", "avx512f avx512bw amx_tile")
    assert (cpu.model, cpu.vendor, cpu.has_avx512) == ("Intel(R) Xeon(R) Processor", "GenuineIntel", True)
    assert cpu.vector_extensions == ("amx_tile", "avx", "avx2", "avx512bw", "avx512f", "fma", "sse4_2")
    assert cpu.describe() == "Intel(R) Xeon(R) Processor (avx512f)"
    without = read_cpu(tmp_path, "AuthenticAMD", "AMD EPYC", "")
    assert without.describe() == "AMD EPYC (no avx512f)" and not without.has_avx512
    missing = cpu_info.__wrapped__(str(tmp_path / "no_such_file"))
    assert missing.model and missing.flags == frozenset()


def test_the_cpu_options_are_chosen_by_the_cpu_or_named(tmp_path, monkeypatch):
    monkeypatch.delenv(J.CPU_OPTIONS_ENV, raising=False)
    amd_avx512 = read_cpu(tmp_path, "AuthenticAMD", "AMD EPYC", "avx512f")
    amd = read_cpu(tmp_path, "AuthenticAMD", "AMD EPYC", "")
    intel = read_cpu(tmp_path, "GenuineIntel", "Intel Xeon", "avx512f amx_tile")
    assert J.cpu_compiler_options(amd_avx512) == J.CPU_OPTION_SETS["llvm_level_1"]
    assert J.cpu_compiler_options(intel) == J.CPU_OPTION_SETS["llvm_level_1"]
    assert J.cpu_compiler_options(amd) == J.CPU_OPTION_SETS["ynn_fusions_off"]
    monkeypatch.setenv(J.CPU_OPTIONS_ENV, "xla_defaults")
    assert J.cpu_compiler_options(intel) == {}
    assert J.cpu_compiler_options(amd, choice="auto") == J.CPU_OPTION_SETS["ynn_fusions_off"]
    monkeypatch.setenv(J.CPU_OPTIONS_ENV, "fastest")
    with pytest.raises(ValueError, match="SB3WM_CPU_OPTIONS='fastest': name one of"):
        J.cpu_compiler_options(intel)


def test_the_cpu_options_reach_cpu_programs_only(monkeypatch):
    """The agents' programs carry the CPU's XLA options on the CPU and none on an accelerator (a GPU's
    code generator would apply the CPU's LLVM level to its own kernels)."""
    built: list[dict] = []
    jit = J.jax.jit

    def recording_jit(fn, **kwargs):
        built.append(kwargs["compiler_options"])
        return jit(fn, **kwargs)

    monkeypatch.setattr(J.jax, "jit", recording_jit)
    fn = J.agent_jit(lambda config, x: x * config.scale)
    fn.for_config(Config(scale=2.0))
    assert built == [J.COMPILER_OPTIONS] and J.COMPILER_OPTIONS  # the suite pins a non-empty set
    for scale, accelerator in ((3.0, "gpu"), (4.0, "tpu")):  # a new config each: a new program
        monkeypatch.setattr(J.jax, "default_backend", lambda name=accelerator: name)
        fn.for_config(Config(scale=scale))
        fn.over_seeds(Config(scale=scale))
    assert built[1:] == [{}, {}, {}, {}]


def test_the_suite_runs_under_the_pinned_cpu_options():
    """tests/conftest.py names a set (``ynn_fusions_off`` unless the run names another) before the
    package reads it: the agents' programs in this process are compiled under it."""
    choice = os.environ[J.CPU_OPTIONS_ENV]
    assert choice in J.CPU_OPTION_SETS
    assert J.COMPILER_OPTIONS == J.CPU_OPTION_SETS[choice]
    assert J.cpu_options_name() == choice  # what the benchmarks record
    assert J.cpu_options_name({"xla_backend_optimization_level": 2}) == "custom"


def test_the_reference_parity_holds_under_the_cpus_own_choice():
    """The parity tests against the references' recorded numbers, run under the options a user of
    this CPU gets (the rest of the suite runs under the pinned set, see tests/conftest.py)."""
    own_choice = J.cpu_compiler_options(choice="auto")
    if own_choice == J.COMPILER_OPTIONS:
        name = J.cpu_options_name(own_choice)
        pytest.skip(f"this CPU's own choice is the pinned set ({name}): the parity tests ran under it")
    tests = Path(__file__).parent
    files = [str(tests / name) for name in ("test_dreamerv3_parity.py", "test_tdmpc2_parity.py")]
    env = {**os.environ, J.CPU_OPTIONS_ENV: "auto"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *files],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
