"""Steady state: once ``learn`` has run its first training call, a further ``learn`` compiles nothing.

A program compiled inside a run (a training call of a size not seen before, an eager operation on a
new shape) costs seconds on a CPU and tens of seconds on a TPU, and it lands wherever the schedule
first asks for it. Every compilation is counted (``blocks.jit.compilations``: JAX's backend compile
event, whether or not its persistent cache answers it), not only those of the agents' functions.
"""

from __future__ import annotations

import jax
import pytest

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.blocks.jit import compilations
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE


def through_first_training_call(model, chunk: int) -> None:
    """``learn`` in pieces of ``chunk`` until the first training call has run (and no further)."""
    model.learn(chunk)
    while model._n_updates == 0:
        model.learn(chunk, reset_num_timesteps=False)


def tdmpc2(seed):
    # Two envs per seed: two updates per training call, and single ones after the seed phase's burst.
    return TDMPC2("Pendulum-v1", n_envs=2, seed=seed, **{**TDMPC2_SMOKE, "seed_steps": 11})


def dreamerv3(seed):
    # Two envs per seed at a train ratio of one update per row: two updates per call, more or fewer
    # when an episode's reset row comes (CartPole's episodes end at different steps).
    return DreamerV3("CartPole-v1", n_envs=2, seed=seed, **DREAMER_SMOKE)


def check_steady_state(model, chunk: int, steady: int) -> None:
    # Another test in this process may have compiled the same programs: start from empty caches so
    # that the warm-up's compilations are heard whatever ran before.
    jax.clear_caches()
    with compilations() as warm_up:
        through_first_training_call(model, chunk)
    assert warm_up  # the counter hears compilations
    with compilations() as compiled:
        model.learn(steady, reset_num_timesteps=False)
    assert model._n_updates > 0
    assert compiled == [], f"learn compiled {compiled} after its first training call"


@pytest.mark.parametrize("seed", [0, [0, 1]], ids=["one seed", "group of 2"])
def test_tdmpc2_learn_compiles_nothing_after_the_first_training_call(seed):
    check_steady_state(tdmpc2(seed), chunk=2, steady=240)


def test_dreamerv3_learn_compiles_nothing_after_the_first_training_call():
    # The first call runs single updates (the ratio's first answer), the later ones two at a time.
    check_steady_state(dreamerv3(0), chunk=2, steady=60)


def test_dreamerv3_group_learn_compiles_nothing_after_the_first_training_call():
    check_steady_state(dreamerv3([0, 1]), chunk=2, steady=60)
