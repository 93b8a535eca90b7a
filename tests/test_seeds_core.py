"""Many seeds in one program (sb3_worldmodels.blocks.seeds): an agent function over a leading seed
axis equals the separate single-seed calls, for both cores, vector and pixel observations."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks import jit as J
from sb3_worldmodels.blocks import seeds as S

# ------------------------------------------------------------------------------------------------
# The mechanism on a toy function (fast)
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Toy:
    scale: float = 2.0
    matmul_precision: str = "float32"


class ToyState(NamedTuple):
    w: jax.Array
    count: jax.Array


def toy_act(config: Toy, w, x, offset, deterministic: bool = False):
    """A static flag read in Python, a vmapped keyword argument, a tuple output."""
    y = (x @ w) * config.scale + offset
    return (y if deterministic else -y), jnp.sum(y)


def test_over_seeds_equals_the_separate_calls_and_keeps_static_arguments_static():
    fn = J.agent_jit(toy_act, static_argnames=("deterministic",))
    rng = np.random.default_rng(0)
    w, x, offset = (rng.normal(size=s).astype(np.float32) for s in ((3, 4, 2), (3, 5, 4), (3, 5, 2)))
    for deterministic in (False, True):
        out = fn.over_seeds(Toy())(w, x, offset=offset, deterministic=deterministic)
        for s in range(3):
            single = fn(Toy(), w[s], x[s], offset=offset[s], deterministic=deterministic)
            np.testing.assert_allclose(out[0][s], single[0], rtol=1e-6)
            np.testing.assert_allclose(out[1][s], single[1], rtol=1e-6)
    assert out[0].shape == (3, 5, 2) and out[1].shape == (3,)
    with pytest.raises(ValueError, match="inconsistent sizes"):  # every argument carries the same S
        fn.over_seeds(Toy())(w, x[:2], offset=offset)


def test_over_seeds_pins_the_precision_and_keeps_its_own_programs():
    fn = J.agent_jit(toy_act, static_argnames=("deterministic",))
    w, x, off = jnp.ones((2, 4, 2)), jnp.ones((2, 5, 4)), jnp.ones((2, 5, 2))
    assert "HIGHEST" in fn.over_seeds(Toy()).lower(w, x, off).as_text()  # float32: full-precision dots
    assert "HIGHEST" not in fn.over_seeds(Toy(matmul_precision="default")).lower(w, x, off).as_text()
    single = fn.for_config(Toy())
    configs = [Toy(scale=float(i)) for i in range(J.COMPILED_CONFIGS_KEPT + 2)]
    for config in configs:
        fn.over_seeds(config)(w, x, off)
    assert len(fn._compiled_over_seeds) == J.COMPILED_CONFIGS_KEPT
    assert fn.for_config(Toy()) is single  # the single-seed program is not evicted by those over seeds
    before = fn._cache_size()
    fn.over_seeds(configs[-1])(w + 1.0, x, off)  # kept: no new program
    assert fn._cache_size() == before


def test_trees_stack_slice_and_unstack():
    states = [ToyState(jnp.full((2, 3), float(s)), jnp.asarray(s, jnp.int32)) for s in range(3)]
    stacked = S.stack_trees(states)
    assert isinstance(stacked, ToyState) and stacked.w.shape == (3, 2, 3) and stacked.count.shape == (3,)
    assert isinstance(stacked.w, jax.Array)
    for s, state in enumerate(S.unstack_tree(stacked)):
        np.testing.assert_array_equal(state.w, states[s].w)
        assert int(state.count) == s and isinstance(state.w, jax.Array)
    host = S.stack_trees([{"obs": np.zeros((4, 2), np.uint8) + s, "n": s} for s in range(2)])
    assert isinstance(host["obs"], np.ndarray) and host["obs"].dtype == np.uint8  # numpy stays numpy
    assert host["obs"].shape == (2, 4, 2) and list(host["n"]) == [0, 1]
    assert isinstance(S.tree_slice(host, 1)["obs"], np.ndarray) and S.tree_slice(host, 1)["obs"][0, 0] == 1
    assert S.seed_count(host) == 2


def test_trees_refuse_seeds_that_differ():
    with pytest.raises(ValueError, match="pytree 1 differs in structure"):
        S.stack_trees([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match=r"leaf \['a'\]\.w has different shapes"):
        S.stack_trees([{"a": ToyState(np.zeros(2), 0)}, {"a": ToyState(np.zeros(3), 0)}])
    with pytest.raises(ValueError, match="at least one"):
        S.stack_trees([])
    with pytest.raises(ValueError, match="share a leading seed axis"):
        S.unstack_tree({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))})
