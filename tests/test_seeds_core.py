"""Many seeds in one program (sb3_worldmodels.blocks.seeds): an agent function over a leading seed
axis equals the separate single-seed calls, for both cores, vector and pixel observations."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from typing import Any, NamedTuple

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


def test_a_program_over_seeds_compiles_ahead_of_time():
    fn = J.agent_jit(toy_act, static_argnames=("deterministic",))
    w, x, off = jnp.ones((2, 4, 2)), jnp.ones((2, 5, 4)), jnp.ones((2, 5, 2))
    compiled = fn.over_seeds(Toy()).lower(w, x, off, deterministic=True).compile()
    np.testing.assert_allclose(compiled(w, x, off)[0], fn.over_seeds(Toy())(w, x, off, deterministic=True)[0])


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


def toy_train_step(config: Toy, state: ToyState, batch):
    """(state, metrics, extra) as the cores' train_step: one gradient-free "update" of w."""
    w = state.w * 0.5 + batch * config.scale
    return ToyState(w, state.count + 1), {"norm": jnp.sum(w**2)}, w[0]


def test_counted_updates_run_the_first_count_and_leave_the_rest_unread():
    train = S.counted_updates(toy_train_step)
    state = ToyState(jnp.asarray([1.0, 2.0]), jnp.asarray(0, jnp.int32))
    batches = jnp.asarray([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    expected = [state]
    for batch in batches:
        expected.append(toy_train_step(Toy(), expected[-1], batch)[0])
    for count in range(4):
        new, metrics, extra = train(Toy(), state, batches, np.int32(count))
        np.testing.assert_array_equal(new.w, expected[count].w)  # exactly: the updates run, no arithmetic
        assert int(new.count) == count and metrics["norm"].shape == (3,) and extra.shape == (3,)
        np.testing.assert_array_equal(extra[count:], 0.0)  # updates past the count are not run
    poisoned = batches.at[2].set(jnp.nan)  # a batch past the count is never read
    assert np.isfinite(train(Toy(), state, poisoned, np.int32(2))[0].w).all()
    everything = train(Toy(), state, batches, None)  # None: all K, the core's train_many
    np.testing.assert_array_equal(everything[0].w, expected[3].w)
    assert train.__name__ == "counted_toy_train_step"
    assert train._cache_size() == 2  # one program for every count (and one for None)
    # Over seeds: each seed its own number of updates, one call.
    states = S.stack_trees([state, ToyState(state.w + 1.0, state.count)])
    group = train.over_seeds(Toy())(states, jnp.stack([batches, batches]), np.asarray([3, 1], np.int32))[0]
    np.testing.assert_array_equal(S.tree_slice(group, 0).w, expected[3].w)
    alone = toy_train_step(Toy(), ToyState(state.w + 1.0, state.count), batches[0])[0]
    np.testing.assert_array_equal(S.tree_slice(group, 1).w, alone.w)
    assert [int(c) for c in group.count] == [3, 1]
    # The loop index is one for all seeds (the largest count): update i's batches are read and its
    # outputs written by slices; an index per seed would be a gather and scatters.
    lowered = train.over_seeds(Toy()).lower(states, jnp.stack([batches, batches]), np.int32([3, 1]))
    compiled = lowered.compile().jitted.as_text()
    assert "dynamic-slice(" in compiled and "gather(" not in compiled and "scatter(" not in compiled


def test_counted_updates_run_one_update_without_a_loop():
    """K = 1 is not a loop of one (XLA:CPU's slow convolution gradients in loops, blocks.jit.scan_updates)."""
    train = S.counted_updates(toy_train_step)
    state = ToyState(jnp.ones(2), jnp.asarray(0, jnp.int32))
    one = train.lower(Toy(), state, jnp.ones((1, 2)), np.int32(1)).as_text()
    two = train.lower(Toy(), state, jnp.ones((2, 2)), np.int32(1)).as_text()
    assert "stablehlo.while" not in one and "stablehlo.while" in two
    kept = train(Toy(), state, jnp.ones((1, 2)), np.int32(0))[0]  # none of its one update: the state
    np.testing.assert_array_equal(kept.w, state.w)
    assert int(kept.count) == 0


# ------------------------------------------------------------------------------------------------
# The cores: a group of seeds equals the single-seed runs
# ------------------------------------------------------------------------------------------------

SEEDS = (0, 1, 2)
VECTOR_ACTIVE = ((True, True), (True, False), (False, False))
"""Seed 0 trains both updates, seed 1 its first only, seed 2 none (its state must stay exactly)."""
PIXEL_ACTIVE = ((True,), (False,), (True,))
"""Pixels: one update per call (a loop of convolution gradients is slow on CPU, blocks.jit.scan_updates)."""
RTOL, ATOL = 1e-5, 1e-6
"""A group's seed against its single-seed run: the batched programs round differently (measured: at
most 3e-6 relative on a parameter or metric after two updates)."""


@dataclasses.dataclass
class Case:
    """One core on one observation type: the seeds' states and K batches each, stacked over seeds."""

    core: Any
    config: Any
    states: list
    batches: list  # per seed, leading K
    active: tuple[tuple[bool, ...], ...]
    acting: Callable[[Any, Any, int], tuple]  # (config, state, seed) -> the acting function's arguments


def dreamerv3_case(pixels: bool) -> Case:
    from sb3_worldmodels.dreamerv3 import agent as core
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS, preset
    from sb3_worldmodels.dreamerv3.synthetic import random_batches

    small = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    small.update(batch_size=2, batch_length=3, warmup=1)  # warmup 1: the second update moves the weights
    image = dict(obs_dim=0, image_shape=(8, 8, 3), cnn_depth=4, cnn_mults=(1, 2))
    spaces = image if pixels else dict(obs_dim=3)
    config = preset("1m", action_dim=2, discrete=True, **spaces, **small)
    active = PIXEL_ACTIVE if pixels else VECTOR_ACTIVE
    k = len(active[0])

    def batches(seed: int) -> dict:
        return random_batches(config, k, np.random.default_rng(100 + seed))

    def acting(config: Any, state: Any, seed: int) -> tuple:
        rng = np.random.default_rng(200 + seed)
        n = 3
        obs = (
            {"image": rng.integers(0, 256, (n, *config.image_shape)).astype(np.uint8)}
            if pixels
            else rng.normal(size=(n, config.obs_dim)).astype(np.float32)
        )
        carry = core.Carry(
            deter=rng.normal(size=(n, config.deter)).astype(np.float32),
            stoch=np.eye(config.classes, dtype=np.float32)[
                rng.integers(0, config.classes, (n, config.stoch))
            ],
            action=np.eye(2, dtype=np.float32)[rng.integers(0, 2, n)],
        )
        first = np.asarray([True, False, False])
        return core.policy_params(state), carry, obs, first, jax.random.PRNGKey(300 + seed)

    states = [core.init_state(config, jax.random.PRNGKey(s)) for s in SEEDS]
    return Case(core, config, states, [batches(s) for s in SEEDS], active, acting)


def tdmpc2_case(pixels: bool) -> Case:
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS, preset

    small = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    spaces = dict(obs_dim=0, image_shape=(64, 64, 3), latent_dim=64, num_channels=4) if pixels else {}
    config = preset(1, **{"obs_dim": 3, "action_dim": 2, **small, **spaces})
    active = PIXEL_ACTIVE if pixels else VECTOR_ACTIVE
    k, h, b = len(active[0]), config.horizon, config.batch_size

    def batches(seed: int) -> dict:
        rng = np.random.default_rng(100 + seed)
        obs_shape = config.image_shape if pixels else (config.obs_dim,)
        obs = rng.integers(0, 256, (k, h + 1, b, *obs_shape)).astype(np.uint8) if pixels else None
        return {
            "obs": obs if pixels else rng.normal(size=(k, h + 1, b, *obs_shape)).astype(np.float32),
            "action": rng.uniform(-1, 1, (k, h, b, 2)).astype(np.float32),
            "reward": rng.normal(size=(k, h, b)).astype(np.float32),
        }

    def acting(config: Any, state: Any, seed: int) -> tuple:
        rng = np.random.default_rng(200 + seed)
        n = 2
        obs_shape = config.image_shape if pixels else (config.obs_dim,)
        obs = rng.integers(0, 256, (n, *obs_shape)).astype(np.uint8) if pixels else None
        obs = obs if pixels else rng.normal(size=(n, *obs_shape)).astype(np.float32)
        prev_mean = rng.uniform(-1, 1, (n, h, 2)).astype(np.float32)
        return state.params, obs, prev_mean, np.asarray([True, False]), jax.random.PRNGKey(300 + seed)

    states = [core.init_state(config, jax.random.PRNGKey(s)) for s in SEEDS]
    return Case(core, config, states, [batches(s) for s in SEEDS], active, acting)


CASES = {
    "dreamerv3-vector": lambda: dreamerv3_case(False),
    "dreamerv3-pixels": lambda: dreamerv3_case(True),
    "tdmpc2-vector": lambda: tdmpc2_case(False),
    "tdmpc2-pixels": lambda: tdmpc2_case(True),
}


def assert_trees_close(actual: Any, expected: Any, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    paths = jax.tree_util.tree_leaves_with_path(expected)
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected), what
    for (path, want), got in zip(paths, jax.tree_util.tree_leaves(actual), strict=True):
        np.testing.assert_allclose(
            np.asarray(got),
            np.asarray(want),
            rtol=rtol,
            atol=atol,
            err_msg=f"{what}{jax.tree_util.keystr(path)}",
        )


def train_alone(case: Case, seed: int, updates: int) -> tuple:
    """Seed ``seed``'s first ``updates`` updates through the core's own train_many_jit, one call each
    (the one-update program, without a loop); outputs stacked over the updates."""
    state, outputs = case.states[seed], []
    for i in range(updates):
        batch = jax.tree_util.tree_map(lambda x, i=i: x[i : i + 1], case.batches[seed])
        state, *out = case.core.train_many_jit(case.config, state, batch)
        outputs.append(jax.tree_util.tree_map(lambda x: x[0], tuple(out)))
    return state, S.stack_trees(outputs) if outputs else None


@pytest.fixture(scope="module", params=["dreamerv3-vector", "tdmpc2-vector"])
def case(request) -> Case:
    return CASES[request.param]()


def test_a_group_of_seeds_trains_as_each_seed_alone(case: Case):
    check_training(case)


def test_a_group_of_seeds_acts_as_each_seed_alone(case: Case):
    check_acting(case)


@pytest.mark.parametrize("name", ["dreamerv3-pixels", "tdmpc2-pixels"])
def test_a_group_of_pixel_seeds_trains_and_acts_as_each_seed_alone(name: str):
    case = CASES[name]()
    check_training(case)
    check_acting(case)


def check_training(case: Case) -> None:
    """Seeds 0, 1, 2 from init_state(config, PRNGKey(s)), each with its own batches, one call: each
    equals its own single-seed updates (parameters, optimiser state, every leaf; metrics and extras),
    an inactive update changes nothing. Seed 0 trains at three times the learning rate, written into
    its optimiser state (core.set_learning_rate): a stacked state carries each seed's rate."""
    core = case.core
    case = dataclasses.replace(case, states=list(case.states))
    case.states[0] = core.set_learning_rate(case.states[0], 3 * case.config.learning_rate)
    train = S.counted_updates(core.train_step)
    states = S.stack_trees(case.states)
    counts = np.asarray([sum(active) for active in case.active], np.int32)
    group = train.over_seeds(case.config)(states, S.stack_trees(case.batches), counts)
    new_states = S.unstack_tree(group[0])
    for seed, active in zip(SEEDS, case.active, strict=True):
        if not any(active):  # exactly the state it had
            assert_trees_close(new_states[seed], case.states[seed], f"seed {seed} state", rtol=0, atol=0)
            continue
        updates = active.index(False) if False in active else len(active)
        alone, outputs = train_alone(case, seed, updates)
        assert_trees_close(new_states[seed], alone, f"seed {seed} state")
        trained = jax.tree_util.tree_map(lambda x, seed=seed, n=updates: x[seed, :n], tuple(group[1:]))
        assert_trees_close(trained, outputs, f"seed {seed} metrics and extras")


def check_acting(case: Case) -> None:
    """The acting function (DreamerV3's policy_step, TD-MPC2's act) over seeds, each seed its own
    parameters, observations, carry and key, equals the separate calls."""
    act = case.core.policy_step_jit if hasattr(case.core, "policy_step_jit") else case.core.act_jit
    args = [case.acting(case.config, case.states[seed], seed) for seed in SEEDS]
    group = act.over_seeds(case.config)(*S.stack_trees(args))
    for seed in SEEDS:
        assert_trees_close(S.tree_slice(group, seed), act(case.config, *args[seed]), f"seed {seed} acting")


# ------------------------------------------------------------------------------------------------
# Float settings per seed
# ------------------------------------------------------------------------------------------------

UNREAD = {
    "dreamerv3": {
        "minstd": "the continuous actor's (the case's actions are discrete)",
        "maxstd": "the continuous actor's (the case's actions are discrete)",
        "rec_image_scale": "the image decoder's (the case has no image)",
    },
    "tdmpc2": {"termination_coef": "episodic agents' (the case is not episodic)"},
}
"""Float fields the test's configs have no use for, with the reason."""
CHANGED = {"grad_clip_norm": 1e-3, "eps": 1e-2, "temperature": 50.0, "min_std": 1.0}
"""Changed values that show where half the value would not: the gradients' norms lie below half of
20 and far above DreamerV3's epsilon, the planner's values differ by 1e-4 and its stds stay above
0.05."""
SCALES = {
    "dreamerv3": {"rep_scale": 0.3, "actent": 1e-2},
    "tdmpc2": {"consistency_coef": 5.0, "reward_coef": 1.0},
}
"""Two loss scales of seed 1 in the equality test."""
SETTINGS_TOLERANCE = (1e-4, 1e-5)
"""rtol, atol of a seed with traced settings against the single-seed program, whose settings are
constants (folded, some in float64 on the host: γ = 1 − 1/333): LaProp's normalised momentum of
small gradients differed by up to 1.2e-6 (6e-4 relative) after one update."""


def config_module(case: Case) -> Any:
    return importlib.import_module(case.core.__name__.replace(".agent", ".config"))


def per_seed_fields(case: Case) -> list[str]:
    refused = config_module(case).PER_SEED_REFUSED
    return [f.name for f in dataclasses.fields(case.config) if f.type == "float" and f.name not in refused]


def same_over_seeds(leaf: Any) -> bool:
    leaf = np.asarray(leaf)  # a metric with nothing to average is NaN in both
    return np.array_equal(leaf[0], leaf[1], equal_nan=bool(np.issubdtype(leaf.dtype, np.inexact)))


def test_settings_per_seed_equal_single_seed_runs_and_every_field_reaches_the_program(case: Case):
    """Every float field but the refused ones given per seed, in one program (train and act): with two
    loss scales changed, seed 1 equals the single-seed run of dataclasses.replace(config, ...), seed
    0 (the config's values) the config's run; and each field, changed alone for seed 1, changes its
    outputs (it is read inside the program, not ignored), but those :data:`UNREAD` by the case."""
    agent = case.core.__name__.split(".")[1]
    module, config = config_module(case), case.config
    fields = per_seed_fields(case)
    # Two updates in: the reward, value and critic heads start at zero, which hides the discount, λ
    # and the planner's temperature at the first update; the slow critic is past its copy.
    state, _ = train_alone(case, 0, 2)
    batch = jax.tree_util.tree_map(lambda x: x[:1], case.batches[1])
    states, batches = S.stack_trees([state, state]), S.stack_trees([batch, batch])
    act_args = S.stack_trees([case.acting(config, state, 0)] * 2)
    train = S.counted_updates(case.core.train_step)
    act = case.core.policy_step_jit if agent == "dreamerv3" else case.core.act_jit

    def run(changes: dict[str, float]) -> tuple:
        values = {name: [getattr(config, name), changes.get(name, getattr(config, name))] for name in fields}
        seeded = module.seed_settings(config, values)
        trained = train.over_seeds(seeded)(states, batches, np.ones(2, np.int32))
        return trained, act.over_seeds(seeded)(*act_args)

    trained, _ = run(SCALES[agent])
    alone = case.core.train_many_jit(config, state, batch)
    assert_trees_close(S.tree_slice(trained, 0), alone, "seed 0", *SETTINGS_TOLERANCE)
    scaled = case.core.train_many_jit(dataclasses.replace(config, **SCALES[agent]), state, batch)
    assert_trees_close(S.tree_slice(trained, 1), scaled, "seed 1", *SETTINGS_TOLERANCE)

    unread = []
    for name in fields:
        value = getattr(config, name)
        outputs = run({name: CHANGED.get(name, 0.5 * value if value else 0.1)})
        if all(same_over_seeds(x) for x in jax.tree_util.tree_leaves(outputs)):
            unread.append(name)
    assert sorted(unread) == sorted(UNREAD[agent])


def test_settings_refuse_what_cannot_differ_per_seed(case: Case):
    module, config = config_module(case), case.config
    int_field = "batch_size"
    bool_field = "discrete" if hasattr(config, "discrete") else "episodic"
    scale = next(iter(SCALES["dreamerv3" if hasattr(config, "discrete") else "tdmpc2"]))
    for name, reason in module.PER_SEED_REFUSED.items():
        with pytest.raises(ValueError, match=f"{name} cannot take one value per seed: {re.escape(reason)}"):
            module.seed_settings(config, {name: [1.0, 2.0]})
    for name, words in ((int_field, "an integer"), (bool_field, "a switch"), ("image_shape", "not a number")):
        with pytest.raises(ValueError, match=f"{name} cannot take one value per seed: {words}"):
            module.seed_settings(config, {name: [1, 2]})
    with pytest.raises(ValueError, match="'scale' is not a field"):
        module.seed_settings(config, {"scale": [1.0]})
    with pytest.raises(ValueError, match="one value per seed"):
        module.seed_settings(
            config, {scale: [1.0, 2.0], "tau" if "tau" in per_seed_fields(case) else "lam": [0.5]}
        )
    with pytest.raises(ValueError, match=f"seed index 1: .*{scale}=-1.0 is invalid"):
        module.seed_settings(config, {scale: [1.0, -1.0]})  # each seed's config checked
    with pytest.raises(ValueError, match="finite number"):
        module.seed_settings(config, {scale: [1.0, float("nan")]})
    seeded = module.seed_settings(config, {scale: [1.0, 2.0]})
    assert seeded.n_seeds == 2 and getattr(seeded.seed_config(1), scale) == 2.0
    with pytest.raises(TypeError, match="over_seeds"):  # a single-seed call cannot take per-seed values
        case.core.train_many_jit.for_config(seeded)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU's form of a pixel group")
def test_on_a_cpu_a_pixel_group_convolves_each_seed_apart():
    """Vmapped over the seeds' weights, a convolution becomes one grouped convolution, which the CPU
    runs far slower than the seeds' convolutions one by one (``blocks.jit.seeds_in_sequence``): on a
    CPU the pixel update over seeds holds no grouped convolution, in its forward pass or its
    gradients."""
    case = CASES["tdmpc2-pixels"]()
    train = S.counted_updates(case.core.train_step)
    counts = np.ones(len(SEEDS), np.int32)
    args = (S.stack_trees(case.states), S.stack_trees(case.batches), counts)
    text = train.over_seeds(case.config).lower(*args).as_text()
    convolutions = [line for line in text.splitlines() if "stablehlo.convolution" in line]
    assert len(convolutions) >= 4  # the encoder's layers and their gradients
    groups = [
        int(n) for line in convolutions for n in re.findall(r"(?:feature|batch)_group_count = (\d+)", line)
    ]
    assert groups and set(groups) == {1}
