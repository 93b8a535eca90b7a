"""The compute dtype (``compute_dtype``): float32 programs unchanged, bfloat16 where the reference has it.

DreamerV3 in bfloat16 follows the reference's casts (``jax.compute_dtype: bfloat16``,
configs.yaml:24-25@2411f7d): every matmul and convolution, the RSSM's state, samples and unimixed
log-probabilities in bfloat16; the heads' distribution parameters, losses, metrics, parameters,
gradients and optimiser state in float32. Traced with ``jax.eval_shape``/``jax.make_jaxpr`` (nothing
compiled) where only dtypes are checked.

The bfloat16 update on the reference's recorded batch is compared with the reference's float32 losses
and with the reference's own bfloat16 run of the same update (``agent1m*_bf16_train_step.npz``,
tests/fixtures/dreamerv3/README.md) at ``|ours − ref| ≤ BF16_LOSS_RTOL·|ref| + BF16_LOSS_ATOL``:
bfloat16 keeps 8 significant bits, so each rounded value is off by up to 2⁻⁹ ≈ 2e-3 of itself; a loss
term is a mean over many such values (errors of both signs), and its largest observed departure is
3.2e-3 (the dyn/rep KL, whose log-probabilities are rounded to bfloat16 before the float32 KL, as in
the reference; the reference's own bfloat16 run departs from its float32 one by up to 2.5e-3). 1e-2
is about three times that; the absolute term covers losses near zero (the actor's, about −0.01, whose
imagined samples are the float32 recording's: the bfloat16 run's are not recorded). The same update
is not bit for bit the reference's in bfloat16: XLA versions round fused bfloat16 operations
differently, and the update's layout differs (the block-first GRU, the heads' merged first layers),
so the replay deter agrees to a few bfloat16 steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit
from jax.extend import core as jax_core
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3, WorldModelCallback
from sb3_worldmodels.blocks import precision
from sb3_worldmodels.dreamerv3 import agent as dreamer
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset
from sb3_worldmodels.dreamerv3.synthetic import random_batches
from sb3_worldmodels.tdmpc2 import agent as tdmpc2
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from sb3_worldmodels.tdmpc2.config import preset as tdmpc2_preset
from tests.probe_envs import ChainEnv

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
BF16_LOSS_RTOL = 1e-2
"""Relative bound of a bfloat16 loss term against the reference's float32 value (module docstring)."""
BF16_LOSS_ATOL = 1e-4
BF16_DETER_ATOL = 2.0**-6
"""Bound of the replay deter (values in (-1, 1)) against the reference's bfloat16 run: four bfloat16
steps at 1 (observed: two, 7.8e-3)."""
BF16_DETER_MEAN = 2e-3
"""Bound of its mean absolute difference (observed 4.9e-4 and 6.0e-4)."""


def chain():
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)


def dreamer_config(image: bool = False, **fields):
    settings = {k: v for k, v in DREAMER_SMOKE.items() if k != "model_size"}
    if image:
        fields = {"image_shape": (16, 16, 3), "cnn_depth": 8, **fields}
    return dreamer_preset("1m", **settings, obs_dim=3, action_dim=2, discrete=True, **fields)


def dtypes(tree):
    return {jnp.dtype(x.dtype) for x in jax.tree_util.tree_leaves(tree)}


def products(jaxpr) -> list[tuple[str, tuple]]:
    """(primitive, operand dtypes) of every matmul and convolution of a jaxpr, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.append((eqn.primitive.name, tuple(jnp.dtype(v.aval.dtype) for v in eqn.invars)))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jax_core.ClosedJaxpr):
                    found += products(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    found += products(sub)
    return found


# ------------------------------------------------------------------------------------------------
# The setting
# ------------------------------------------------------------------------------------------------


def test_auto_resolves_for_the_backend(monkeypatch):
    assert jax.default_backend() == "cpu"
    assert dreamer_config().compute_dtype == "float32"  # "auto", the default, on the CPU
    assert tdmpc2_preset(1).compute_dtype == "float32"
    assert dreamer_config(compute_dtype="bfloat16").dtype == BF16
    assert tdmpc2_preset(1, compute_dtype="bfloat16").dtype == BF16
    monkeypatch.setattr(precision.jax, "default_backend", lambda: "tpu")
    assert dreamer_config().compute_dtype == "bfloat16"  # the reference's, on an accelerator
    assert tdmpc2_preset(1).compute_dtype == "float32"  # the reference computes in float32
    assert dreamer_config(compute_dtype="float32").compute_dtype == "float32"
    for bad in ("bf16", "float16", None):
        with pytest.raises(ValueError, match="compute_dtype must be one of"):
            dreamer_config(compute_dtype=bad or 3)
        with pytest.raises(ValueError, match="compute_dtype must be one of"):
            tdmpc2_preset(1, compute_dtype=bad or 3)


@pytest.mark.parametrize("algorithm", [DreamerV3, TDMPC2])
def test_compute_dtype_cannot_differ_per_seed(algorithm):
    smoke = DREAMER_SMOKE if algorithm is DreamerV3 else TDMPC2_SMOKE
    with pytest.raises(ValueError, match="compute_dtype cannot take one value per seed: "):
        algorithm("Pendulum-v1", n_envs=1, seed=[0, 1], compute_dtype=["float32", "bfloat16"], **smoke)


# ------------------------------------------------------------------------------------------------
# DreamerV3
# ------------------------------------------------------------------------------------------------


def state_shapes(core, config):
    """A fresh agent state, as shapes (traced, not compiled)."""
    return jax.eval_shape(lambda key: core.init_state(config, key), jax.ShapeDtypeStruct((2,), jnp.uint32))


def dreamer_update_shapes(config):
    """(state shapes, a batch, noise) of one update."""
    state = state_shapes(dreamer, config)
    batch = {k: v[0] for k, v in random_batches(config, 1, np.random.default_rng(0)).items()}
    noise = dreamer.sample_update_noise(config, jax.random.PRNGKey(1), config.batch_size, config.batch_length)
    return state, batch, noise


def test_dreamerv3_bfloat16_computes_where_the_reference_does():
    config = dreamer_config(image=True, compute_dtype="bfloat16")
    state, batch, noise = dreamer_update_shapes(config)
    new, metrics, latents, aux = jax.eval_shape(
        lambda s, b, n: dreamer.update_with_noise(config, s, b, n), state, batch, noise
    )
    r = aux["internals"]
    # The RSSM's carry, samples and log-probabilities and the layers' outputs: bfloat16.
    rssm = ("post_deter", "post_stoch", "post_logits", "prior_logits", "img_deter", "img_stoch", "img_action")
    for name in ("embed", *rssm, "img_prior_logits"):
        assert r[name].dtype == BF16, name
    # Distribution parameters, KLs, returns, losses and metrics: float32.
    heads = ("rew_logits", "con_logits", "replay_critic_logits", "dyn_kl", "rep_kl")
    for name in (*heads, "ret", "adv", "replay_ret"):
        assert r[name].dtype == F32, name
    assert dtypes(r["dec_out"]) == dtypes(r["img_actor"]) == dtypes(r["losses"]) == {F32}
    assert dtypes(metrics) == {F32}
    assert latents["deter"].dtype == F32 and latents["stoch"].dtype == jnp.int32  # the replay's
    # Parameters, gradients, optimiser state: float32 (the optimiser's counters are int32).
    assert dtypes(new.params) == dtypes(aux["grads"]) == dtypes(new.slow_critic) == {F32}
    assert dtypes(new.opt_state) <= {F32, jnp.dtype(jnp.int32)}
    # Every matmul and convolution, forward and backward, on bfloat16 operands.
    jaxpr = jax.make_jaxpr(lambda s, b, n: dreamer.update_with_noise(config, s, b, n))(state, batch, noise)
    found = products(jaxpr.jaxpr)
    assert {kind for kind, _ in found} == {"dot_general", "conv_general_dilated"}
    assert {operands for _, operands in found} == {(BF16, BF16)}


def test_dreamerv3_bfloat16_acting_keeps_float32_outside():
    config = dreamer_config(compute_dtype="bfloat16")
    state = state_shapes(dreamer, config)
    carry, n = dreamer.init_carry(config, 2), 2
    obs, first, key = jnp.zeros((n, config.obs_dim)), jnp.ones((n,), bool), jax.random.PRNGKey(0)
    action, new_carry, deter, stoch = jax.eval_shape(
        lambda p: dreamer.policy_step(config, p, carry, obs, first, key), dreamer.policy_params(state)
    )
    assert action.dtype == deter.dtype == F32 and dtypes(new_carry) == {F32}  # bf16 values, stored as f32
    jaxpr = jax.make_jaxpr(lambda p: dreamer.policy_step(config, p, carry, obs, first, key))(
        dreamer.policy_params(state)
    )
    assert {operands for _, operands in products(jaxpr.jaxpr)} == {(BF16, BF16)}


def test_dreamerv3_float32_programs_hold_no_bfloat16():
    config = dreamer_config(image=True)
    assert config.compute_dtype == "float32"
    state, batch, noise = dreamer_update_shapes(config)
    batches = jax.tree_util.tree_map(lambda x: x[None], batch)
    text = dreamer.train_many_jit.lower(config, state, batches).as_text()
    assert "bf16" not in text
    bf16 = config.replace(compute_dtype="bfloat16")
    assert "bf16" in dreamer.train_many_jit.lower(bf16, state, batches).as_text()


@pytest.mark.parametrize("agent", ["discrete", "continuous"])
def test_dreamerv3_bfloat16_update_on_the_reference_batch(agent):
    """The reference's first recorded update (its initial parameters, batch and samples) in bfloat16:
    every loss term within the bfloat16 bound of the reference's float32 value, and, with the
    posterior samples of the reference's own bfloat16 run, of that run's losses and replay deter
    (``*_bf16_train_step.npz``; module docstring)."""
    from tests.parity_helpers import DREAMERV3_TERMS
    from tests.test_dreamerv3_parity import (
        AGENTS,
        config_for,
        fixture_batch,
        initial_state,
        load,
        recorded_noise,
        reference_means,
    )

    prefix = AGENTS[agent]["prefix"]
    config = config_for(agent).replace(compute_dtype="bfloat16")
    forward, reference_bf16 = load(f"{prefix}forward"), load(f"{prefix}bf16_train_step")
    state = initial_state(config, load(f"{prefix}params_init"))
    batch = fixture_batch(load(f"{prefix}batch"), config)
    own_samples = {
        **forward,
        "obs/stoch": np.eye(config.classes, dtype=np.float32)[reference_bf16["replay_outs/stoch"]],
    }
    with reference_means():
        update = jax.jit(dreamer.update_with_noise, static_argnames="config")
        runs = {
            "float32 reference": (
                load(f"{prefix}train_step"),
                update(config, state, batch, recorded_noise(forward, config)),
            ),
            "bfloat16 reference": (
                reference_bf16,
                update(config, state, batch, recorded_noise(own_samples, config)),
            ),
        }
    departures = {}
    for name, (reference, (_, metrics, _, aux)) in runs.items():
        assert aux["internals"]["post_deter"].dtype == BF16
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(aux["grads"]))
        for ours, (ref, _) in {**DREAMERV3_TERMS, "": ("opt", 1.0)}.items():
            value = float(metrics[f"{ours}_loss" if ours else "loss"])
            expected = float(reference[f"{ref}_loss"])
            bound = BF16_LOSS_RTOL * abs(expected) + BF16_LOSS_ATOL
            assert abs(value - expected) <= bound, (name, ours, value, expected)
            departures[name, ours] = abs(value - expected) / abs(expected)
    assert max(departures.values()) > 1e-5  # bfloat16 rounding shows (float32 agrees to ~1e-7)
    deter = np.asarray(runs["bfloat16 reference"][1][2]["deter"])
    error = np.abs(deter - reference_bf16["replay_outs/deter"])
    assert error.max() <= BF16_DETER_ATOL and error.mean() <= BF16_DETER_MEAN, (error.max(), error.mean())


# ------------------------------------------------------------------------------------------------
# TD-MPC2 (float32 in the reference; bfloat16 our option, docs/deviations.md T21)
# ------------------------------------------------------------------------------------------------

TDMPC2_VARIANTS = {
    "state": {"obs_dim": 3},
    "pixels": {"obs_dim": 0, "image_shape": (64, 64, 3)},
    "episodic": {"obs_dim": 3, "episodic": True},
    "multitask": {"obs_dim": 3, "task_dim": 8, "action_dims": (1, 2), "episode_lengths": (500, 100)},
}


def tdmpc2_config(variant: str, **fields):
    settings = {k: v for k, v in TDMPC2_SMOKE.items() if k != "model_size"}
    return tdmpc2_preset(1, **settings, **TDMPC2_VARIANTS[variant], action_dim=2, **fields)


@pytest.mark.parametrize("variant", sorted(TDMPC2_VARIANTS))
def test_tdmpc2_bfloat16_networks_float32_heads_targets_losses_and_planner(variant):
    config = tdmpc2_config(variant, compute_dtype="bfloat16")
    state = state_shapes(tdmpc2, config)
    h, b, a = config.horizon, config.batch_size, config.action_dim
    obs_shape = config.image_shape or (config.obs_dim,)
    batch = {
        "obs": jnp.zeros((h + 1, b, *obs_shape), jnp.uint8 if config.image_shape else jnp.float32),
        "action": jnp.zeros((h, b, a)),
        "reward": jnp.zeros((h, b)),
        **({"terminated": jnp.zeros((h, b))} if config.episodic else {}),
        **({"task": jnp.zeros((b,), jnp.int32)} if config.multitask else {}),
    }
    noise = tdmpc2.sample_update_noise(config, jax.random.PRNGKey(0), b)
    update = lambda s, x, n: tdmpc2.update_with_noise(config, s, x, n)  # noqa: E731
    new, metrics, aux = jax.eval_shape(update, state, batch, noise)
    r = aux["internals"]
    assert r["zs"].dtype == r["next_z"].dtype == BF16  # the latents
    heads = ("q_logits", "reward_logits", "td_targets", "td_q_target_min", "pi_step_action", "pi_step_log_pi")
    for name in (*heads, *(("termination_logits",) if config.episodic else ())):
        assert r[name].dtype == F32, name
    assert dtypes(metrics) == dtypes(new.params) == dtypes(new.target_qs) == {F32}
    assert dtypes((new.wm_opt, new.pi_opt, new.scale)) <= {F32, jnp.dtype(jnp.int32)}
    found = products(jax.make_jaxpr(update)(state, batch, noise).jaxpr)
    assert found and {operands for _, operands in found} == {(BF16, BF16)}
    # The planner: bfloat16 networks, float32 values, scores, elite means and stds, actions.
    z = jnp.zeros((config.latent_dim,), BF16)
    task = jnp.zeros((), jnp.int32) if config.multitask else None
    plan_noise = tdmpc2.sample_plan_noise(config, jax.random.PRNGKey(1), config.iterations)
    plan = lambda p: tdmpc2.plan_with_noise(  # noqa: E731
        config, p, z, jnp.zeros((h, a)), jnp.asarray(True), jnp.asarray(False), plan_noise, task
    )
    action, mean, iters = jax.eval_shape(plan, state.params)
    assert action.dtype == mean.dtype == F32
    assert {iters[k].dtype for k in ("values", "score", "mean_after", "std_after", "elite_actions")} == {F32}
    assert {operands for _, operands in products(jax.make_jaxpr(plan)(state.params).jaxpr)} == {(BF16, BF16)}


def test_tdmpc2_float32_programs_hold_no_bfloat16():
    config = tdmpc2_config("state")
    assert config.compute_dtype == "float32"
    params = state_shapes(tdmpc2, config).params
    args = (jnp.zeros((2, 3)), jnp.zeros((2, config.horizon, 2)), jnp.ones((2,), bool), jax.random.PRNGKey(1))
    assert "bf16" not in tdmpc2.act_jit.lower(config, params, *args).as_text()


# ------------------------------------------------------------------------------------------------
# Both agents through the SB3 surface
# ------------------------------------------------------------------------------------------------


class Losses(WorldModelCallback):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_post_update(self, metrics):
        # every loss but the balance statistics (NaN for a class absent from the batch, as the reference's)
        self.losses += [v for k, v in metrics.items() if k.endswith("loss") and "stats/" not in k]

    def _on_step(self) -> bool:
        return True


@pytest.mark.parametrize("algorithm", [DreamerV3, TDMPC2])
def test_bfloat16_learns_with_finite_losses_and_saves_its_setting(algorithm, tmp_path):
    smoke = DREAMER_SMOKE if algorithm is DreamerV3 else {**TDMPC2_SMOKE, "seed_steps": 10}
    model = algorithm(chain(), seed=0, compute_dtype="bfloat16", **smoke)
    assert model._config.dtype == BF16
    losses = Losses()
    model.learn(30, callback=losses)
    assert model._n_updates > 0 and losses.losses and np.isfinite(losses.losses).all()
    assert dtypes(model.policy.state["agent"].params) == {F32}
    model.save(tmp_path / "bf16")
    loaded = algorithm.load(tmp_path / "bf16")
    assert loaded.compute_dtype == "bfloat16" and loaded._config.dtype == BF16
    action, _ = loaded.predict(loaded.observation_space.sample(), deterministic=True)
    assert np.isfinite(action).all()
    # "auto" is saved as the choice, and resolved again where the model is loaded.
    auto = algorithm(chain(), seed=0, **smoke)
    assert auto.compute_dtype == "auto" and auto._config.compute_dtype == "float32"
    auto.save(tmp_path / "auto")
    assert algorithm.load(tmp_path / "auto").compute_dtype == "auto"
