"""TD-MPC2 against data recorded from the reference code (nicklashansen/tdmpc2 @b67b21c; episodic
records @7ec6bc8): the size-1 parameters are loaded into our tree and every recorded value is matched
at float32 tolerance. See tests/fixtures/tdmpc2/README.md for how the randomness was fixed."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks.episodes import discount_from_episode_length
from sb3_worldmodels.blocks.layers import dropout
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks as N
from sb3_worldmodels.tdmpc2.config import preset
from sb3_worldmodels.tdmpc2.reference_weights import params_from_state_dict
from tests.parity_helpers import (  # noqa: F401 (highest_precision: a fixture)
    close,
    close_mostly,
    highest_precision,
    load_fixture,
    tdmpc2_plan_noise,
    tdmpc2_start_state,
    tdmpc2_update_noise,
)

FIX = Path(__file__).parent / "fixtures" / "tdmpc2"
# The fixtures' configuration: size 1, obs 3, action 1, episode length 500, batch 8, dropout disabled.
CONFIG = preset(1, obs_dim=3, action_dim=1, batch_size=8, discount=0.99, q_dropout="off")
EPISODIC = CONFIG.replace(episodic=True)


def load(name: str) -> dict[str, np.ndarray]:
    return load_fixture(FIX / name)


def rerandomised(episodic: bool = False) -> tuple[dict, dict]:
    sd = {**load("params_init.npz"), **load("params_rerand_overrides.npz")}
    if episodic:
        sd.update(load("episodic_params_termination_init.npz"))
        sd.update(load("episodic_params_termination_overrides.npz"))
    return params_from_state_dict(sd, episodic)


pytestmark = pytest.mark.usefixtures("highest_precision")


# ------------------------------------------------------------------------------------------------
# Math and small blocks
# ------------------------------------------------------------------------------------------------


def test_discount_heuristic():
    table = json.loads((FIX / "discount.json").read_text())["episode_length_to_discount"]
    for length, expected in table.items():
        assert discount_from_episode_length(int(length)) == pytest.approx(expected, abs=1e-12)


def test_policy_head_arithmetic():
    m = load("math.npz")
    for a in (1, 6):
        config = CONFIG.replace(action_dim=a)
        mu, pi, log_pi, log_std = N.policy_head(config, m[f"pihead_A{a}_raw"], m[f"pihead_A{a}_eps"])
        close(mu, m[f"pihead_A{a}_mu"])
        close(pi, m[f"pihead_A{a}_pi"])
        # log(1 - tanh(u)^2 + 1e-6) near saturation: one ulp of tanh moves it by up to ~1e-2.
        close(log_pi, m[f"pihead_A{a}_log_pi"][:, 0], rtol=1e-3, atol=1e-4)
        close(log_std, m[f"pihead_A{a}_log_std"])


def test_parameter_layout_matches_reference_init():
    """Our tree has the reference's shapes; init zeroes the reward and Q output layers, targets = online."""
    ours, target = N.init_params(CONFIG, jax.random.PRNGKey(0))
    ref, ref_target = params_from_state_dict(load("params_init.npz"))
    shapes = lambda t: jax.tree_util.tree_map(lambda x: x.shape, t)  # noqa: E731
    assert shapes(ours) == shapes(ref) and shapes(target) == shapes(ref_target)
    assert not np.any(ours["reward"]["2"]["kernel"]) and not np.any(ours["qs"]["2"]["kernel"])
    for a, b in zip(jax.tree_util.tree_leaves(ours["qs"]), jax.tree_util.tree_leaves(target), strict=True):
        np.testing.assert_array_equal(a, b)
    kernel = np.asarray(ours["dynamics"]["1"]["kernel"])
    assert abs(kernel.std() - 0.02) < 1e-3 and abs(kernel.mean()) < 1e-3
    trainable = sum(x.size for x in jax.tree_util.tree_leaves(ours))
    assert trainable == json.loads((FIX / "params_init.json").read_text())["trainable_param_count"]
    with pytest.raises(KeyError, match="_pi"):  # not a TD-MPC2 WorldModel state_dict
        params_from_state_dict({k: v for k, v in load("params_init.npz").items() if not k.startswith("_pi")})


# ------------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", ["model_init_io.npz", "model_rerand_io.npz"])
def test_heads_match_reference(record):
    io = load(record)
    if record == "model_init_io.npz":
        params, target = params_from_state_dict(load("params_init.npz"))
    else:
        params, target = rerandomised()
    c = CONFIG
    z, a = io["in_z"], io["in_action"]
    pair = jnp.asarray(io["in_q_pair"], jnp.int32)
    close(N.encode(c, params, io["in_obs"]), io["out_encode_z"])
    close(N.next_latent(c, params, z, a), io["out_next_z"])
    logits = N.reward_logits(c, params, z, a)
    close(logits, io["out_reward_logits"], atol=1e-5)
    close(N.decode(c, logits), io["out_reward_value"][:, 0], atol=1e-5)
    q = N.q_logits(c, params["qs"], z, a, None)
    close(q, io["out_q_logits"], atol=1e-5)
    close(N.q_logits(c, target, z, a, None), io["out_q_target_logits"], atol=1e-5)
    close(N.decode(c, q), io["out_q_values"][..., 0], atol=1e-5)
    close(N.q_pair_value(c, params["qs"], z, a, pair, None, "min"), io["out_q_min"][:, 0], atol=1e-5)
    close(N.q_pair_value(c, params["qs"], z, a, pair, None, "avg"), io["out_q_avg"][:, 0], atol=1e-5)
    close(N.q_pair_value(c, target, z, a, pair, None, "min"), io["out_q_target_min"][:, 0], atol=1e-5)
    close(N.q_pair_value(c, target, z, a, pair, None, "avg"), io["out_q_target_avg"][:, 0], atol=1e-5)
    mu, pi, log_pi, log_std = N.policy(c, params, z, io["in_eps_pi"])
    close(mu, io["out_pi_mu"])
    close(pi, io["out_pi_action"])
    close(log_pi, io["out_pi_log_pi"][:, 0], atol=1e-4)
    close(log_std, io["out_pi_log_std"])
    td, parts = core.td_target(
        c, params, target, io["in_td_next_z"], io["in_td_reward"][..., 0], None, io["in_eps_td"], pair, None
    )
    close(parts["td_pi_action"], io["out_td_pi_action"])
    close(td, io["out_td_target"][..., 0], atol=1e-5)


def test_q_dropout_is_active_in_every_evaluation_by_default():
    """b67b21c: two identical Q calls differ (dropout on, target included); "off" makes them equal."""
    params, target = rerandomised()
    io = load("model_rerand_io.npz")
    z, a = io["in_z"], io["in_action"]
    config = CONFIG.replace(q_dropout="always")
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    for qs in (params["qs"], target):
        first = N.q_logits(config, qs, z, a, keys[0])
        second = N.q_logits(config, qs, z, a, keys[1])
        assert float(jnp.max(jnp.abs(first - second))) > 1e-3
    noise = core.UpdateNoise(None, None, None, None, jnp.stack(keys[:1].repeat(3, 0)))
    for index, train in ((0, False), (1, True), (2, True)):
        assert core._dropout_key(config, noise.dropout, index, train) is not None
        assert core._dropout_key(CONFIG, noise.dropout, index, train) is None
    later = config.replace(q_dropout="train")
    assert core._dropout_key(later, noise.dropout, 0, False) is None  # target Qs: off
    assert core._dropout_key(later, noise.dropout, 1, True) is not None  # value loss: on


@pytest.mark.parametrize("masks", ["hash", "threefry"])
def test_dropout_masks_of_either_generator(masks):
    """``dropout_masks`` picks the generator: "threefry" is exactly ``jax.random.bernoulli``'s mask,
    "hash" the hashed one (T13); both zero about ``rate`` of the elements and rescale the rest."""
    key, rate = jax.random.PRNGKey(3), 0.25
    x = jnp.ones((64, 384), jnp.float32)
    out = dropout(x, key, rate, masks)
    kept = out != 0
    np.testing.assert_allclose(np.asarray(out)[np.asarray(kept)], 1.0 / (1.0 - rate), rtol=1e-6)
    assert abs(float(jnp.mean(kept)) - (1.0 - rate)) < 5 * np.sqrt(rate * (1 - rate) / x.size)
    threefry = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    assert bool(jnp.all(kept == threefry)) == (masks == "threefry")
    config = CONFIG.replace(q_dropout="always", dropout_masks=masks)
    io = load("model_rerand_io.npz")
    params, _ = rerandomised()
    logits = N.q_logits(config, params["qs"], io["in_z"], io["in_action"], jax.random.PRNGKey(0))
    assert bool(jnp.all(jnp.isfinite(logits)))
    with pytest.raises(ValueError, match="dropout_masks"):
        preset(1, obs_dim=3, action_dim=1, dropout_masks="torch")


# ------------------------------------------------------------------------------------------------
# Updates
# ------------------------------------------------------------------------------------------------


_start_state = tdmpc2_start_state


def test_three_updates_match_reference():
    params, target = rerandomised()
    state = _start_state(CONFIG, params, target)
    io = load("update_io.npz")
    metrics_ref = json.loads((FIX / "update_metrics.json").read_text())["updates"]
    update = jax.jit(core.update_with_noise, static_argnums=0)
    names = (
        "next_z",
        "td_targets",
        "z0",
        "q_logits",
        "reward_logits",
        "pi_step_action",
        "pi_step_q_avg_unscaled",
    )
    for k in (1, 2, 3):
        p = f"u{k}_"
        batch = {
            "obs": jnp.asarray(io[p + "in_obs"]),
            "action": jnp.asarray(io[p + "in_action"]),
            "reward": jnp.asarray(io[p + "in_reward"][..., 0]),
        }
        state, metrics, aux = update(CONFIG, state, batch, tdmpc2_update_noise(io, p))
        for name in names:
            ref = io[p + name]
            ours = np.asarray(aux["internals"][name]).reshape(ref.shape)
            if k == 1:  # same parameters in: float32 agreement
                # A Q value is the two-hot expectation over 101 bins of up to 10 in magnitude: its
                # float32 rounding depends on the CPU's summation order, up to about 101 * 10 * 6e-8.
                atol = 6e-5 if name == "pi_step_q_avg_unscaled" else 2e-5
                close(ours, ref, atol=atol, err=f"{name} {k}")
            else:  # parameters after Adam steps (see close_mostly)
                close(ours, ref, rtol=1e-4, atol=5e-4, err=f"{name} {k}")
        close(aux["internals"]["pi_step_log_pi"], io[p + "pi_step_log_pi"][..., 0], rtol=1e-4, atol=1e-3)
        close(state.scale.value, io[p + "scale_value"][0])
        ref = metrics_ref[k - 1]
        for ours, theirs in (
            ("consistency_loss", "consistency_loss"),
            ("reward_loss", "reward_loss"),
            ("value_loss", "value_loss"),
            ("pi_loss", "pi_loss"),
            ("total_loss", "total_loss"),
            ("grad_norm", "grad_norm"),
            ("pi_grad_norm", "pi_grad_norm_preclip"),
            ("pi_scale", "pi_scale"),
        ):
            # The policy gradient passes log(1 - tanh(u)^2 + 1e-6), which magnifies ulp differences.
            rel = 1e-4 if ours in ("pi_loss", "pi_grad_norm") or k > 1 else 2e-5
            assert float(metrics[ours]) == pytest.approx(ref[theirs], rel=rel, abs=1e-6), (k, ours)
    after, after_target = params_from_state_dict(load("params_after_update3.npz"))
    theirs = dict(jax.tree_util.tree_leaves_with_path(after))
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.params):
        close_mostly(leaf, theirs[path], jax.tree_util.keystr(path))
    for a, b in zip(
        jax.tree_util.tree_leaves(state.target_qs), jax.tree_util.tree_leaves(after_target), strict=True
    ):
        close_mostly(a, b, "target")


# ------------------------------------------------------------------------------------------------
# Planner
# ------------------------------------------------------------------------------------------------


def _check_plan(config, params, io, p, first, eval_mode, prev_mean):
    z = N.encode(config, params, io[p + "obs"][None])[0]
    close(z, io[p + "z"][0])
    plan = jax.jit(core.plan_with_noise, static_argnums=0)
    action, mean, it = plan(
        config,
        params,
        z,
        prev_mean,
        jnp.asarray(first),
        jnp.asarray(eval_mode),
        tdmpc2_plan_noise(io, p, config.action_dim),
    )
    close(it["actions"], io[p + "iter_actions"], atol=1e-5)
    close(it["values"], io[p + "iter_values"][..., 0], rtol=1e-4, atol=1e-4)
    close(it["mean_before"], io[p + "iter_mean_before"], atol=1e-5)
    close(it["std_before"], io[p + "iter_std_before"], atol=1e-5)
    close(it["mean_after"], io[p + "iter_mean_after"], atol=1e-5)
    close(it["std_after"], io[p + "iter_std_after"], atol=1e-5)
    for i in range(config.iterations):  # ties make the order of equal elites arbitrary: compare sets
        ours = np.sort(np.asarray(it["values"][i])[np.asarray(it["elite_idxs"][i])])
        close(ours, np.sort(io[p + "iter_elite_value"][i, :, 0]), rtol=1e-4, atol=1e-4)
    close(it["score"][-1], io[p + "elite_p"], atol=1e-5)
    close(mean, io[p + "prev_mean_after"], atol=1e-5)
    close(action, io[p + "action"], atol=1e-5)
    return mean


def test_two_plans_match_reference():
    params, _ = rerandomised()
    io = load("plan_io.npz")
    mean = _check_plan(CONFIG, params, io, "call1_", True, False, jnp.zeros((3, 1)))
    close(mean, io["call2_prev_mean_before"], atol=1e-5)
    _check_plan(CONFIG, params, io, "call2_", False, True, mean)


# ------------------------------------------------------------------------------------------------
# Episodic (7ec6bc8 semantics on the b67b21c agent)
# ------------------------------------------------------------------------------------------------


def test_episodic_head_td_target_and_update():
    params, target = rerandomised(episodic=True)
    io = load("episodic_model_io.npz")
    c = EPISODIC
    close(N.termination_logit(c, params, io["in_z"]), io["out_term_logit"][:, 0], atol=1e-4)
    close(N.termination_logit(c, params, io["in_z_3d"]), io["out_term_logit_3d"][..., 0], atol=1e-4)
    td, _ = core.td_target(
        c,
        params,
        target,
        io["in_td_next_z"],
        io["in_td_reward"][..., 0],
        io["in_td_terminated"][..., 0],
        io["in_eps_td"],
        jnp.asarray(io["in_q_perm"], jnp.int32),
        None,
    )
    close(td, io["out_td_target"][..., 0], atol=1e-5)

    up = load("episodic_update_io.npz")
    meta = json.loads((FIX / "episodic_meta.json").read_text())["update"]
    state = _start_state(c, params, target)
    batch = {
        "obs": jnp.asarray(up["in_obs"]),
        "action": jnp.asarray(up["in_action"]),
        "reward": jnp.asarray(up["in_reward"][..., 0]),
        "terminated": jnp.asarray(up["in_terminated"][..., 0]),
    }
    noise = core.UpdateNoise(
        eps_td=jnp.asarray(up["in_eps_td"]),
        pair_td=jnp.asarray(up["in_perm_td"], jnp.int32),
        eps_pi=jnp.asarray(up["in_eps_pi"]),
        pair_pi=jnp.asarray(up["in_perm_pi"], jnp.int32),
        dropout=None,
    )
    new, metrics, aux = jax.jit(core.update_with_noise, static_argnums=0)(c, state, batch, noise)
    close(aux["internals"]["td_targets"], up["td_targets"][..., 0], atol=1e-5)
    close(aux["internals"]["termination_logits"], up["termination_logits"][..., 0], rtol=1e-4, atol=1e-3)
    for key in ("termination_loss", "consistency_loss", "reward_loss", "value_loss", "grad_norm"):
        ref = meta[key]
        assert float(metrics[key]) == pytest.approx(ref, rel=1e-4), key
    delta = load("episodic_params_termination_after_update_delta.npz")
    before = params_from_state_dict(
        {
            **load("params_init.npz"),
            **load("params_rerand_overrides.npz"),
            **load("episodic_params_termination_init.npz"),
            **load("episodic_params_termination_overrides.npz"),
        },
        True,
    )[0]
    for i in range(3):
        for name, ours in (("weight", "kernel"), ("bias", "bias")):
            key = f"_termination.{i}.{name}"
            expected = np.asarray(before["termination"][str(i)][ours]) + (
                delta[key].T if name == "weight" else delta[key]
            )
            # A first Adam step moves each weight by lr·g/(|g| + 1e-8): for gradients near 1e-8 float
            # noise in g changes the step itself, so allow a tenth of the step size (lr 3e-4).
            close(new.params["termination"][str(i)][ours], expected, rtol=1e-4, atol=3e-5, err=key)


def test_episodic_plan_masks_terminated_candidates():
    params, _ = rerandomised(episodic=True)
    io = load("episodic_plan_io.npz")
    c = EPISODIC
    p = ""
    z = N.encode(c, params, io["obs"][None])[0]
    noise = core.PlanNoise(
        pi_traj=jnp.asarray(io["pi_traj_eps"]),
        mppi=jnp.asarray(io["mppi_eps"]),
        value_pi=jnp.asarray(io["value_pi_eps"]),
        value_pair=jnp.asarray(io["value_q_perm"], jnp.int32),
        elite_u=jnp.zeros((), jnp.float32),
        elite_pick=jnp.asarray(io["elite_pick"], jnp.int32),
        final=jnp.asarray(io["final_eps"], jnp.float32),
        dropout=None,
    )
    action, mean, it = core.plan_with_noise(
        c, params, z, jnp.zeros((3, 1)), jnp.asarray(True), jnp.asarray(False), noise
    )
    close(it["values"], io[p + "iter_values"][..., 0], rtol=1e-4, atol=1e-3)
    close(mean, io["prev_mean_after"], atol=1e-5)
    close(action, io["action"], atol=1e-5)


@pytest.mark.parametrize(
    ("obs_dim", "action_dim", "total", "q_total"),
    # Size 5 (common/__init__.py:7-10@b67b21c), walker and dog: 4.96M/2.91M and 5.16M/2.99M learnable
    # parameters (total/Q ensemble); target Qs excluded, as in total_params (world_model.py:35-37@b67b21c).
    [(24, 6, 4_960_618, 2_911_225), (223, 38, 5_159_082, 2_993_145)],
)
def test_parameter_counts_of_the_default_size(obs_dim, action_dim, total, q_total):
    config = preset(5, obs_dim=obs_dim, action_dim=action_dim)
    params, target = jax.eval_shape(
        lambda k: N.init_params(config, k), jax.ShapeDtypeStruct((2,), jnp.uint32)
    )
    count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
    assert count(params) == total and count(params["qs"]) == q_total and count(target) == q_total
    assert round(total / 1e6, 2) == (4.96 if obs_dim == 24 else 5.16)


def test_model_size_presets():
    for size, (enc, mlp, latent, layers, k) in {
        1: (256, 384, 128, 2, 2),
        5: (256, 512, 512, 2, 5),
        19: (1024, 1024, 768, 3, 5),
        48: (1792, 1792, 768, 4, 5),
        317: (4096, 4096, 1376, 5, 8),
    }.items():
        c = preset(size)
        assert (c.enc_dim, c.mlp_dim, c.latent_dim, c.num_enc_layers, c.num_q) == (
            enc,
            mlp,
            latent,
            layers,
            k,
        )
    with pytest.raises(ValueError, match="model_size"):
        preset(3)
