"""The gather-free forms of ``blocks.backend`` (what accelerators trace) against the CPU's forms: the
same values, forced on a CPU, and programs without gathers, scatters or sorts."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks import backend as B
from sb3_worldmodels.blocks import jit as J
from sb3_worldmodels.blocks import math as M
from sb3_worldmodels.blocks import normalizers as NZ
from sb3_worldmodels.blocks.random import choice_without_replacement

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import gather_census  # noqa: E402

COMPILED_ONCE = {**J.COMPILER_OPTIONS, "xla_backend_optimization_level": 0}
"""XLA options of the programs run once here: without LLVM's optimisations they compile in about half
the time (the same program)."""


def both_forms(fn: Any, *calls: tuple, static_argnums: tuple[int, ...] = ()) -> list[tuple[Any, Any]]:
    """``fn(*args)`` for each ``args`` of ``calls``, jitted once with the gather-free forms off and
    once on: [(off, on)] per call, numpy leaves."""
    out = []
    for on in (False, True):

        def traced_anew(*args: Any) -> Any:  # a function of its own: JAX's trace cache is per function
            return fn(*args)

        with B.gather_free_forms(on):
            jitted = jax.jit(traced_anew, static_argnums=static_argnums, compiler_options=COMPILED_ONCE)
            out.append([jax.tree_util.tree_map(np.asarray, jitted(*args)) for args in calls])
            assert B.gather_free() == on
    return list(zip(*out, strict=True))


def assert_same(off: Any, on: Any, what: str, close: tuple[str, ...] = ()) -> None:
    """Every leaf equal (NaN where NaN; a zero's sign aside), or to 1e-6 relative where its path names
    one of ``close`` (sums taken in another order)."""
    on_leaves = jax.tree_util.tree_leaves(on)
    off_leaves = jax.tree_util.tree_leaves_with_path(off)
    assert len(on_leaves) == len(off_leaves), what
    for (path, a), b in zip(off_leaves, on_leaves, strict=True):
        name = f"{what}{jax.tree_util.keystr(path)}"
        if any(part in name for part in close):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(b, a, err_msg=name)


# ------------------------------------------------------------------------------------------------
# The switch
# ------------------------------------------------------------------------------------------------


def test_the_switch_defaults_to_the_backend_and_is_restored():
    default = os.environ.get(B.ENV_VAR, "auto")
    assert B.gather_free_mode() == default
    with B.gather_free_forms("auto"):
        assert B.gather_free() == (jax.default_backend() != "cpu")
    with B.gather_free_forms(True):
        assert B.gather_free() and B.gather_free_mode() == "on"
        with B.gather_free_forms("off"):
            assert not B.gather_free()
        assert B.gather_free()
    assert B.gather_free_mode() == default
    with pytest.raises(ValueError, match="one of"):
        B.set_gather_free("yes")
    with pytest.raises(ValueError, match="one of"), B.gather_free_forms("gpu"):
        pass


def test_an_agent_function_keeps_a_program_per_form_traced_in_its_form():
    @J.agent_jit
    def lookup(config: Any, table: jax.Array, index: jax.Array) -> jax.Array:
        return B.select_along(table, index) if B.gather_free() else table[index]

    config = Toy()
    table, index = jnp.arange(5.0), jnp.asarray([3, 1])
    with B.gather_free_forms(True):
        on = lookup.for_config(config)
    with B.gather_free_forms(False):
        off = lookup.for_config(config)
    assert on is not off
    # each traces in the form it was built for, whatever is in force when it is called
    assert "stablehlo.gather" not in on.lower(table, index).as_text()
    with B.gather_free_forms(True):
        assert "stablehlo.gather" in off.lower(table, index).as_text()
        assert lookup.for_config(config) is on
        over_seeds = lookup.over_seeds(config).lower(table[None], index[None]).as_text()
    assert "stablehlo.gather" not in over_seeds
    np.testing.assert_array_equal(on(table, index), off(table, index))


@dataclasses.dataclass(frozen=True)
class Toy:
    """A config with the field agent_jit reads."""

    matmul_precision: str = "float32"


# ------------------------------------------------------------------------------------------------
# The gather-free blocks against the lookups, searches and sorts they replace
# ------------------------------------------------------------------------------------------------


def test_masked_sums_equal_the_lookups():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(4, 3, 7)).astype(np.float32)
    index = rng.integers(0, 7, (4, 3))
    np.testing.assert_array_equal(
        B.select_along(values, index), np.take_along_axis(values, index[..., None], -1)[..., 0]
    )
    table = rng.normal(size=(5, 2, 3)).astype(np.float32)
    rows = rng.integers(0, 5, (4, 2))
    np.testing.assert_array_equal(B.select_rows(table, rows), table[rows])
    np.testing.assert_array_equal(B.select_rows(table, 2), table[2])
    for axis in (1, 2, -1):
        index = rows % table.shape[axis]
        expected = np.take(table, index, axis)
        np.testing.assert_array_equal(B.select_rows(table, index, axis), expected, f"axis {axis}")
    flags = rng.random((5, 3)) < 0.5
    np.testing.assert_array_equal(B.select_rows(flags, rows), flags[rows])
    assert B.select_rows(flags, rows).dtype == jnp.bool_
    ints = rng.integers(-9, 9, (5,)).astype(np.int32)
    np.testing.assert_array_equal(B.select_rows(ints, rows), ints[rows])


def test_counting_equals_searchsorted_for_every_value():
    bins = M.symexp_bins(255)
    x = np.concatenate([bins, bins * 1.5, [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30]]).astype(np.float32)
    np.testing.assert_array_equal(B.count_at_most(bins, x), jnp.searchsorted(bins, x, side="right"))


def sample_sets() -> list[np.ndarray]:
    """Arrays of every kind a percentile meets: sizes 1-2000, ties, zeros of both signs, infinities,
    magnitudes over 60 decades."""
    rng = np.random.default_rng(0)
    sets = [np.asarray([3.0]), np.asarray([-0.0, 0.0, -0.0]), np.zeros(7), np.full(9, -2.5)]
    for n in (5, 1999):
        sets.append(rng.normal(size=n))
        sets.append(rng.integers(-3, 3, n).astype(float) * np.where(rng.random(n) < 0.5, -1, 1))
        sets.append(rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n))
        sets.append(np.where(rng.random(n) < 0.1, np.inf * np.sign(rng.normal(size=n)), rng.normal(size=n)))
    return [s.astype(np.float32) for s in sets]


def assert_interpolated_alike(actual: Any, expected: Any, x: np.ndarray) -> None:
    """Equal up to one rounding of ``low·(1 − w) + high·w``: XLA fuses that multiply-add into one
    rounding in some programs and not in others (the same values either way: the order statistics)."""
    finite = x[np.isfinite(x)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2 * scale * np.finfo(np.float32).eps)


QS = (5.0, 95.0, 0.0, 100.0, 50.0)


def test_order_statistics_and_percentiles_equal_the_sort():
    percentiles = jax.jit(lambda x: B.percentiles(x, QS))
    statistics = jax.jit(lambda x: B.order_statistics(x, jnp.arange(x.size)))
    sorting = jax.jit(lambda x: jnp.stack([jnp.percentile(x, q) for q in QS]))
    for x in sample_sets():
        np.testing.assert_array_equal(statistics(x), np.sort(x), str(x.size))
        assert_interpolated_alike(percentiles(x), sorting(x), x)
    with_nan = sample_sets()[-1].copy()
    with_nan[3] = np.nan
    assert np.all(np.isnan(percentiles(with_nan))) and np.all(np.isnan(sorting(with_nan)))
    nan_keys = B.order_statistics(np.asarray([np.nan, 1.0, -np.nan, -1.0], np.float32), np.arange(4))
    np.testing.assert_array_equal(nan_keys, np.sort(np.asarray([np.nan, 1.0, np.nan, -1.0], np.float32)))


def test_a_choice_without_replacement_draws_jaxs_numbers():
    for n, k, count in ((5, 2, 300), (10, 10, 50), (2000, 5, 4)):  # 2000: two rounds of sorting
        keys = jax.random.split(jax.random.PRNGKey(n), count)
        with B.gather_free_forms(True):
            drawn = jax.jit(jax.vmap(functools.partial(choice_without_replacement, n=n, k=k)))(keys)
        expected = jax.vmap(functools.partial(jax.random.choice, a=n, shape=(k,), replace=False))(keys)
        np.testing.assert_array_equal(drawn, expected, err_msg=f"n={n}, k={k}")
        assert drawn.dtype == expected.dtype
    with B.gather_free_forms(True), pytest.raises(ValueError, match="0 < k <= n"):
        choice_without_replacement(jax.random.PRNGKey(0), 3, 4)


def test_twohot_in_both_forms_is_the_same_with_its_gradient():
    bins = M.symexp_bins(255)
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [rng.normal(size=500) * 10.0 ** rng.integers(-3, 9, 500), bins, [np.nan, np.inf, -np.inf, -0.0, 5e8]]
    ).astype(np.float32)
    logits = (3 * rng.normal(size=(x.size, 255))).astype(np.float32)

    def twohot(logits: jax.Array, x: jax.Array) -> tuple:
        log_prob = functools.partial(M.twohot_log_prob, bins=bins)
        grad = jax.grad(lambda lg: jnp.nansum(log_prob(lg, x)))(logits)
        return M.twohot_encode(x, bins), log_prob(logits, x), grad

    [(off, on)] = both_forms(twohot, (logits, x))
    assert_same(off, on, "twohot")


def test_normalisers_in_both_forms_are_the_same():
    start = NZ.PercentileNormState(jnp.float32(0.3), jnp.float32(2.0))

    def update(x: jax.Array) -> jax.Array:
        low_high = NZ.percentile_norm_update(start, x, 0.5)
        scale = NZ.running_scale_update(NZ.running_scale_init(), x, 0.5)
        return jnp.stack([low_high.low, low_high.high, scale.value])

    sets = sample_sets()
    for x, (off, on) in zip(sets, both_forms(update, *((x,) for x in sets)), strict=True):
        assert_interpolated_alike(on, off, x)


def test_tdmpc2s_symlog_twohot_has_no_lookup_in_either_form():
    def symlog_twohot(logits: jax.Array, x: jax.Array) -> tuple:
        return (
            M.symlog_twohot_encode(x, 101, -10.0, 10.0),
            M.symlog_twohot_log_prob(logits, x, 101, -10.0, 10.0),
            M.symlog_twohot_mean(logits, 101, -10.0, 10.0),
        )

    args = (jnp.zeros((4, 101)), jnp.zeros(4))
    for on in (False, True):
        with B.gather_free_forms(on):
            assert not gather_census.lookups(jax.make_jaxpr(symlog_twohot)(*args).jaxpr)


# ------------------------------------------------------------------------------------------------
# The agents: one update and one acting step in both forms, and their programs
# ------------------------------------------------------------------------------------------------

AGENTS = ("dreamerv3", "tdmpc2", "tdmpc2-multitask", "tdmpc2-pixels")
CLOSE = {"tdmpc2-multitask": ("['task_emb']",)}
"""Leaves computed from sums taken in another order: the multi-task embedding's gradient (one row
gets the gradients of many batch rows: a scatter-add there, a masked sum here), 1e-6 relative."""


@functools.cache
def programs(agent: str, on: bool) -> dict[str, gather_census.Program]:
    with B.gather_free_forms(on):
        return gather_census.PROGRAMS[agent](0)


@functools.cache
def run_program(agent: str, name: str, on: bool) -> Any:
    """One call of the agent's program ``name`` built in a form, compiled without LLVM's optimisations."""
    fn, args, kwargs = programs(agent, on)[name]
    compiled = fn.lower(*args, **kwargs).compile(compiler_options=COMPILED_ONCE)
    return jax.tree_util.tree_map(np.asarray, compiled(*args, **kwargs))


@pytest.mark.parametrize("agent", AGENTS)
def test_one_update_and_one_acting_step_are_the_same_in_both_forms(agent: str):
    for name in programs(agent, False):
        assert_same(
            run_program(agent, name, False), run_program(agent, name, True), name, CLOSE.get(agent, ())
        )


def test_the_planner_picks_the_same_elite_in_both_forms():
    """TD-MPC2's plan with the final elite drawn (pick -1) and given (a recorded pick), episodic."""
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS, preset

    config = preset(**{**SMOKE_SETTINGS, "obs_dim": 3, "action_dim": 2, "episodic": True})
    params = core.init_params_jit(config, jax.random.PRNGKey(0))[0]
    z = jax.random.normal(jax.random.PRNGKey(1), (config.latent_dim,))
    prev = jnp.full((config.horizon, 2), 0.3)
    noise = core.sample_plan_noise(config, jax.random.PRNGKey(2), config.iterations)
    flags = (jnp.asarray(False), jnp.asarray(False))  # first step, deterministic
    picks = (-1, 2)
    calls = [(config, params, z, prev, *flags, noise._replace(elite_pick=jnp.int32(pick))) for pick in picks]
    for pick, (off, on) in zip(
        picks, both_forms(core.plan_with_noise, *calls, static_argnums=(0,)), strict=True
    ):
        assert_same(off, on, f"plan (pick {pick})")


def program_text(agent: str, name: str, on: bool) -> str:
    fn, args, kwargs = programs(agent, on)[name]
    return fn.lower(*args, **kwargs).as_text()


LOOKUP_OPS = ("stablehlo.gather", "stablehlo.scatter", "stablehlo.sort", "chlo.top_k")


@pytest.mark.parametrize("agent", AGENTS)
def test_the_gather_free_programs_have_no_gathers_scatters_or_sorts(agent: str):
    """Lowered with the forms on, each program (single seed and over seeds) holds none of those
    operations but the planner's top_k; with them off, the CPU's program holds them (it is the one
    lowered by default on a CPU)."""
    with B.gather_free_forms(True):
        over_seeds = gather_census.PROGRAMS[agent](2)
    for name in programs(agent, True):
        text = program_text(agent, name, True)
        kept = {"chlo.top_k": 1} if agent.startswith("tdmpc2") and name.endswith(".act") else {}
        assert {op: text.count(op) for op in LOOKUP_OPS if op in text} == kept, name
        if name != "dreamerv3.act":  # the one program without a lookup in either form
            assert "stablehlo.gather" in program_text(agent, name, False), name
    for name, (fn, args, kwargs) in over_seeds.items():
        text = fn.lower(*args, **kwargs).as_text()
        assert not any(op in text for op in LOOKUP_OPS[:3]), name


def test_the_cpu_program_is_the_default_on_a_cpu():
    if jax.default_backend() != "cpu":
        pytest.skip("the default form is the gather-free one on this backend")
    with B.gather_free_forms("auto"):
        auto = gather_census.PROGRAMS["tdmpc2"](0)
    for name, (fn, args, kwargs) in auto.items():
        assert fn.lower(*args, **kwargs).as_text() == program_text("tdmpc2", name, False), name


# ------------------------------------------------------------------------------------------------
# The scans' unroll: another program, the same numbers
# ------------------------------------------------------------------------------------------------


SCANNED = {"dreamerv3": "dreamerv3.train", "tdmpc2": "tdmpc2.act"}
"""Each agent's program with scans over time: DreamerV3's update (posterior, imagination, returns),
TD-MPC2's plan (its iterations)."""


@pytest.mark.parametrize("agent", sorted(SCANNED))
def test_unrolled_scans_give_the_same_update_and_acting_step(agent: str):
    """Programs traced with the scans over time unrolled (3 steps per loop iteration) are kept apart
    from the others and compute the same numbers (to float rounding: XLA may fuse a sum differently)."""
    with B.scan_unroll_steps(3), B.gather_free_forms(False):
        unrolled = gather_census.PROGRAMS[agent](0)
    changed = set()
    for name, (fn, args, kwargs) in unrolled.items():
        if fn.lower(*args, **kwargs).as_text() != program_text(agent, name, False):
            changed.add(name)
        compiled = fn.lower(*args, **kwargs).compile(compiler_options=COMPILED_ONCE)
        ours = jax.tree_util.tree_map(np.asarray, compiled(*args, **kwargs))
        reference = run_program(agent, name, False)
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(reference), jax.tree_util.tree_leaves(ours), strict=True
        ):
            where = f"{name}{jax.tree_util.keystr(path)}"
            np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7, err_msg=where)
    assert changed == {SCANNED[agent]}


def test_the_unroll_is_checked_and_restored(monkeypatch: pytest.MonkeyPatch):
    assert B.scan_unroll() == 1
    with B.scan_unroll_steps(4):
        assert B.program_form() == (B.gather_free(), 4)
    assert B.scan_unroll() == 1
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"), B.scan_unroll_steps(bad):  # type: ignore[arg-type]
            pass
    monkeypatch.setenv(B.SCAN_UNROLL_ENV_VAR, "four")
    with pytest.raises(ValueError, match="SB3WM_SCAN_UNROLL='four'"):
        B._unroll_from_environment()
    monkeypatch.setenv(B.SCAN_UNROLL_ENV_VAR, "8")
    assert B._unroll_from_environment() == 8
