"""Parity of the DreamerV3 core with the reference's recorded training steps (tests/fixtures/dreamerv3).

Two "1m" agents (CartPole-like: obs 4, Discrete(2); Pendulum-like: obs 3, Box(1)) with B = 2, T = 8
(9 rows with the replay context) are loaded from the reference's initial parameters and run through
two updates with the reference's recorded samples; every forward intermediate, loss, gradient (before
AGC; the discrete agent's step-2 gradients are not kept, ``GRADIENT_STEPS``), optimiser moment,
slow-critic value and normaliser statistic is compared.

How the comparison is made exact:

- Randomness. The update draws every sample from a :class:`~sb3_worldmodels.dreamerv3.agent.UpdateNoise`
  pytree (Gumbel-max for categoricals, ε for the Normal actor). The recorded one-hot samples ``y`` of the
  fixture are replayed with Gumbel noise ``1e9·y`` (argmax then picks exactly ``y``) and the continuous
  actions with the recorded ε, so the production code runs unchanged; only the noise source differs.
  Straight-through samples are built as onehot + (p − sg(p)), as in the reference, so the gradients match.
- Two-hot mean. Our expectation is exact (0 for uniform probabilities); the reference's, under
  ``jax.jit`` on CPU, gives −0.1644754 for all-zero logits because fused multiply-adds break its
  symmetric pairing (fixture README, jaxutils.py:226-250@2411f7d; docs/deviations.md D2). At these
  parameters every reward, critic and slow-critic output layer is exactly zero (outscale 0, and the
  first update is scaled by warmup 0), so every mean in the recorded steps is that constant.
  :func:`test_twohot_mean_is_the_only_difference` checks that this is the only difference: all those
  logits are zero in the fixture, the fixture's means all equal −0.1644754, ours are exactly 0, and with
  our production means the world-model terms still match while the imagined returns are exactly 0. The
  full-update tests then evaluate the same code with the reference's value substituted for the mean of
  all-zero logits (a test-only patch of ``twohot_mean`` in the core's modules), which makes returns,
  advantages, normaliser statistics, actor/critic losses and all gradients comparable.

Tolerances: forward tensors and losses ``|ours − ref| ≤ 1e-5·max|ref| + 1e-5·|ref|`` (float32 matmul
accumulation order; observed ≤ 5e-7 of the tensor scale). Imagined quantities use the same bound: with
the recorded samples the 15-step scan stays within 2e-7 of the scale, so no looser bound is needed
(continuous imagined actions are rebuilt as mean + std·ε: 1e-6 of the scale). Gradients: ``1e-5·max|ref|``
per tensor + 1e-4 relative (observed ≤ 5e-7 of the scale): they sum replay and imagination paths, so
single elements can be cancellations whose relative error is meaningless.

Optimiser: μ and the update are ratios g/√ν̂ (after one update μ = 0.1·sign(g) exactly), so an
element's relative error is the gradient's absolute error divided by that element's gradient, and a
near-zero gradient element can even flip sign. Hence two checks.
:func:`test_optimizer_on_reference_gradients` feeds the reference's own gradients to our optimiser and
compares ν, μ (1e-5·max + 1e-4 relative), the second (first nonzero) update (1e-4 relative, the fixture
README's figure) and the parameters after it (2 ulp) exactly as stated there. Along our own chain
(:func:`test_state_after_first_update`, :func:`test_state_after_second_update`) ν is compared
everywhere (1e-5·max + 1e-4), μ and the update on elements whose gradients are ≥ 1e-2 of their tensor's
largest at every step (2e-3 relative + 1e-4 of the scale), parameters to 2 ulp there, and whole-tensor
update statistics to 2e-2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sb3_worldmodels.dreamerv3.agent as agent_module
import sb3_worldmodels.dreamerv3.losses as losses_module
import sb3_worldmodels.dreamerv3.rollouts as rollouts_module
from sb3_worldmodels.blocks.math import symexp_bins, twohot_mean
from sb3_worldmodels.dreamerv3 import agent as A
from sb3_worldmodels.dreamerv3.config import DreamerV3Config, preset
from sb3_worldmodels.dreamerv3.reference_weights import (
    REF_BINS,
    flatten_tree,
    params_from_reference,
    path_to_ref,
    ref_to_path,
    to_ours,
    unflatten,
)
from tests.parity_helpers import DREAMERV3_METRICS as METRICS
from tests.parity_helpers import DREAMERV3_TERMS as TERMS
from tests.parity_helpers import assert_close, dreamerv3_update_record, load_fixture, moment_tree

FIXTURES = Path(__file__).parent / "fixtures" / "dreamerv3"
REF_JIT_ZERO_LOGITS_MEAN = np.float32(-0.1644754)
"""The reference's jitted two-hot mean of all-zero logits (fixture README "FMA";
jaxutils.py:226-250@2411f7d)."""
RECORDED = 1e9
"""Gumbel noise value that forces a recorded class (unimixed log-probs are within [log(0.01/C), 0])."""

AGENTS = {
    "discrete": dict(prefix="agent1m_", obs_dim=4, action_dim=2, discrete=True, param_count=637_511),
    "continuous": dict(prefix="agent1m_cont_", obs_dim=3, action_dim=1, discrete=False, param_count=637_318),
}
GRADIENT_STEPS = {"discrete": (1,), "continuous": (1, 2)}
"""The updates whose recorded gradients the fixtures keep (the discrete agent's step-2 gradients are
``DROPPED`` in tools/pack_fixtures.py; its step-2 forward values, metrics and state are kept)."""


# ------------------------------------------------------------------------------------------------
# Fixture loading and name mapping
# ------------------------------------------------------------------------------------------------


def load(name: str) -> dict[str, np.ndarray]:
    return load_fixture(FIXTURES / f"{name}.npz")


def config_for(agent: str) -> DreamerV3Config:
    spec = AGENTS[agent]
    return preset(
        "1m",
        obs_dim=spec["obs_dim"],
        action_dim=spec["action_dim"],
        discrete=spec["discrete"],
        batch_size=2,
        batch_length=8,
    )


def fixture_grads(train: dict[str, np.ndarray], config: DreamerV3Config) -> dict[tuple[str, ...], np.ndarray]:
    grads = {}
    for name, value in train.items():
        if not name.startswith("grad/"):
            continue
        where = ref_to_path(name[len("grad/") :])
        assert where is not None and where[0] == "params", name
        grads[where[1]] = to_ours(value, where[1], config)
    return grads


def fixture_batch(data: dict[str, np.ndarray], config: DreamerV3Config) -> dict[str, np.ndarray]:
    action = data["action"]
    if config.discrete:
        action = np.eye(config.action_dim, dtype=np.float32)[action]
    return {
        "obs": data["vector"],
        "action": action.astype(np.float32),
        "reward": data["reward"],
        "is_first": data["is_first"],
        "is_last": data["is_last"],
        "is_terminal": data["is_terminal"],
        "deter": data["deter"],
        "stoch": data["stoch"],
    }


def recorded_noise(forward: dict[str, np.ndarray], config: DreamerV3Config) -> A.UpdateNoise:
    """The fixture's samples as injected noise (fixture README "Randomness")."""
    if config.discrete:
        actions = np.concatenate([forward["imag/start_action"][None], forward["imag/scan_action"]], 0)
        action_noise = RECORDED * actions
    else:
        action_noise = np.concatenate(
            [forward["imag/start_action_noise"][None], forward["imag/scan_action_noise"]], 0
        )
    return A.UpdateNoise(
        post=jnp.asarray(RECORDED * forward["obs/stoch"]),
        imag_stoch=jnp.asarray(RECORDED * forward["imag/scan_stoch"]),
        imag_action=jnp.asarray(action_noise),
    )


def initial_state(config: DreamerV3Config, recorded: dict[str, np.ndarray]) -> A.DreamerState:
    """The agent state at the reference's recorded initial parameters (fresh optimiser and normaliser)."""
    params, slow = params_from_reference(recorded, config)
    return A.DreamerState(
        params=params,
        slow_critic=slow,
        opt_state=A.make_optimizer(config).init(params),
        retnorm=A.percentile_norm_init(),
        key=jnp.zeros((2,), jnp.uint32),
        updates=jnp.zeros((), jnp.int32),
    )


# ------------------------------------------------------------------------------------------------
# Running the reference's two steps
# ------------------------------------------------------------------------------------------------


def _reference_mean(logits: jax.Array, bins: jax.Array) -> jax.Array:
    """Our exact mean, with the reference's jitted value for all-zero logits (see the module docstring)."""
    exact = twohot_mean(logits, bins)
    return exact + jnp.where(jnp.all(logits == 0, axis=-1), REF_JIT_ZERO_LOGITS_MEAN, 0.0)


@contextlib.contextmanager
def reference_means() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for module in (agent_module, losses_module, rollouts_module):  # where the core reads it
            patch.setattr(module, "twohot_mean", _reference_mean)
        yield


def _numpy(tree: Any) -> Any:
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope="module", params=sorted(AGENTS))
def run(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Both recorded updates of one agent, from the reference's initial parameters."""
    agent = request.param
    prefix = AGENTS[agent]["prefix"]
    config = config_for(agent)
    state = initial_state(config, load(f"{prefix}params_init"))
    out: dict[str, Any] = {"agent": agent, "config": config, "prefix": prefix, "init_state": state}
    with reference_means():
        update = jax.jit(A.update_with_noise, static_argnames="config")  # traced with the patch
        for step, suffix in ((1, ""), (2, "_step2")):
            forward = load(f"{prefix}forward{suffix}")
            batch = fixture_batch(load(f"{prefix}batch{suffix}"), config)
            new_state, metrics, latents, aux = update(config, state, batch, recorded_noise(forward, config))
            out[step] = {
                **dreamerv3_update_record(state, new_state, metrics, latents, aux),
                "forward": forward,
                "train": load(f"{prefix}train_step{step if step > 1 else ''}"),
            }
            state = new_state
    out[1]["after"] = load(f"{prefix}params_after_train")
    out[2]["after"] = load(f"{prefix}params_after_step2")
    return out


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


def test_fixture_names_map_one_to_one() -> None:
    for agent, spec in AGENTS.items():
        config = config_for(agent)
        flat = load(f"{spec['prefix']}params_init")
        params, slow = params_from_reference(flat, config)
        ours_count = sum(v.size for v in flatten_tree(params).values())
        padding = 2 * (config.units + 1)  # the dropped 256th column (kernel + bias) of rew and critic
        assert ours_count + padding == spec["param_count"] == A.param_count(config) + padding
        mapped = {path_to_ref(p) for p in flatten_tree(params)}
        mapped |= {
            "agent/slowcritic/" + path_to_ref(("critic", *p))[len("agent/critic/") :]
            for p in flatten_tree(slow)
        }
        assert mapped == {k for k in flat if ref_to_path(k) is not None}
    with pytest.raises(KeyError):
        ref_to_path("agent/enc/unknown_layer/weights")
    with pytest.raises(KeyError):
        ref_to_path("agent/newmodule/h0/kernel")
    # The reference's gym wrapper names a vector observation "image": the same decoder output layer.
    assert ref_to_path("agent/dec/out_image/out/kernel") == ("params", ("dec", "out_vector", "kernel"))
    with pytest.raises(ValueError, match="missing"):  # a checkpoint of another configuration
        params_from_reference({k: v for k, v in flat.items() if "/actor/" not in k}, config)


@pytest.mark.parametrize("step", [1, 2])
def test_forward_intermediates(run: dict[str, Any], step: int) -> None:
    r, fw = run[step]["internals"], run[step]["forward"]
    config = run["config"]
    n = config.batch_size * config.batch_length
    assert_close("embed", r["embed"], fw["enc/embed"])
    assert_close("posterior deter", r["post_deter"], fw["obs/deter"])
    assert_close("posterior logits", r["post_logits"], fw["obs/logit"])
    np.testing.assert_array_equal(r["post_stoch"], fw["obs/stoch"])
    assert_close("prior logits", r["prior_logits"], fw["dynloss/prior_logit"])
    assert_close("dyn", np.maximum(r["dyn_kl"], config.free_nats), fw["dynloss/dyn"])
    assert_close("rep", np.maximum(r["rep_kl"], config.free_nats), fw["dynloss/rep"])
    assert_close("decoder", r["dec_out"]["vector"], fw["dec/vector_out_symlog"])
    assert_close("reward logits", r["rew_logits"], fw["rew0/logits"])
    assert_close("continue logits", r["con_logits"], fw["con0/logits"])
    assert_close("continue mean", jax.nn.sigmoid(r["con_logits"]), fw["con0/mean"])
    assert_close("replay critic logits", r["replay_critic_logits"], fw["critic1/logits"])
    assert_close("replay slow critic mean", r["replay_slow_mean"], fw["slowcritic1/mean"])
    # Imagination (time-major in the fixture; index 0 of ours is the start).
    assert_close("imag start deter", r["img_deter"][:, 0], fw["imag/start_deter"])
    np.testing.assert_array_equal(r["img_stoch"][:, 0], fw["imag/start_stoch"])
    if "imag/scan_deter" in fw:
        assert_close("imag deter", r["img_deter"][:, 1:], np.swapaxes(fw["imag/scan_deter"], 0, 1))
    assert_close("imag prior logits", r["img_prior_logits"], np.swapaxes(fw["imag/scan_logit"], 0, 1))
    np.testing.assert_array_equal(r["img_stoch"][:, 1:], np.swapaxes(fw["imag/scan_stoch"], 0, 1))
    ref_actions = np.concatenate(
        [fw["imag/start_action"][:, None], np.swapaxes(fw["imag/scan_action"], 0, 1)], 1
    )
    if config.discrete:
        np.testing.assert_array_equal(r["img_action"], ref_actions)
        assert_close("actor logits", r["img_actor"][0], fw["actor1/action_logits"])
        assert_close("actor probs", np.exp(r["img_actor"][0]), fw["actor1/action_probs"])
        assert_close("first actor logits", r["img_actor"][0][:, 0], fw["actor0/action_logits"])
    else:
        # mean + std·ε rebuilt from the recorded ε (the fixture reports agreement to 2.4e-7).
        assert_close("imag actions", r["img_action"], ref_actions, scale_tol=1e-6)
        assert_close("actor mean", r["img_actor"][0], fw["actor1/action_mean"])
        assert_close("actor std", r["img_actor"][1], fw["actor1/action_std"])
        assert_close("first actor mean", r["img_actor"][0][:, 0], fw["actor0/action_mean"])
    assert_close("imag reward logits", r["img_rew_logits"], fw["rew1/logits"])
    assert_close("imag continue logits", r["img_con_logits"], fw["con1/logits"])
    assert_close("imag reward", r["img_reward"], _col0(fw["rew1/mean"], fw["loss/data_reward"].reshape(n)))
    assert_close("imag continue", r["img_cont"], _col0(fw["con1/mean"], fw["loss/data_cont"].reshape(n)))
    assert_close("critic logits", r["img_critic_logits"], fw["critic0/logits"])
    assert_close("slow critic logits", r["img_slow_logits"], fw["slowcritic0/logits"])
    assert_close("critic mean", r["img_value"], fw["critic0/mean"])
    assert_close("slow critic mean", r["img_slow_value"], fw["slowcritic0/mean"])
    # Returns, advantages and the normaliser.
    assert_close("imagined returns", r["ret"], fw["retnorm0/input"])
    assert_close("advantages", r["adv"], fw["advnorm0/input"])
    assert_close("replay returns", r["replay_ret"], fw["valnorm1/input"])
    metrics = run[step]["metrics"]
    assert_close("retnorm offset", metrics["retnorm_low"], fw["retnorm0/offset"])
    assert_close("retnorm scale", metrics["retnorm_scale"], fw["retnorm0/scale"])


def _col0(seq: np.ndarray, first: np.ndarray) -> np.ndarray:
    out = np.array(seq, copy=True)
    out[:, 0] = first
    return out


@pytest.mark.parametrize("step", [1, 2])
def test_losses_and_metrics(run: dict[str, Any], step: int) -> None:
    r, fw, train = run[step]["internals"], run[step]["forward"], run[step]["train"]
    metrics = run[step]["metrics"]
    for ours, (ref, scale) in TERMS.items():
        assert_close(f"{ours} loss", scale * r["losses"][ours], fw[f"losses_scaled/{ref}_loss"])
        assert_close(f"{ours}_loss metric", metrics[f"{ours}_loss"], train[f"{ref}_loss"])
    assert_close("total loss", metrics["loss"], fw["loss/total"])
    for ours, ref in METRICS.items():
        if ours == "value_std":
            assert abs(float(metrics[ours]) - float(train[ref])) <= 1e-6, ours
            continue
        rtol = 1e-4 if ours == "update_norm" else 2e-5
        assert_close(ours, metrics[ours], train[ref], rtol=rtol, scale_tol=0.0)
    assert int(train["opt_grad_steps"]) == step


@pytest.mark.parametrize("step", [1, 2])
def test_balance_stats(run: dict[str, Any], step: int) -> None:
    """The continue and reward heads' split statistics equal the reference's, NaN where it has NaN
    (the continuous-action batches hold no reward above 0.1)."""
    metrics, train = run[step]["metrics"], run[step]["train"]
    names = [k for k in train if k.startswith(("constats/", "rewstats/"))]
    assert len(names) == 14
    for name in names:
        ref = np.asarray(train[name])
        assert np.isnan(metrics[name]) == np.isnan(ref), name
        if not np.isnan(ref):
            assert_close(name, metrics[name], ref, rtol=2e-5, scale_tol=0.0)


def test_gradients(run: dict[str, Any]) -> None:
    """Every gradient of each update whose gradients are recorded (``GRADIENT_STEPS``)."""
    for step in GRADIENT_STEPS[run["agent"]]:
        ours = run[step]["grads"]
        ref = fixture_grads(run[step]["train"], run["config"])
        assert set(ours) == set(ref)
        for path in sorted(ref):
            assert_close(
                f"step {step} grad " + "/".join(path), ours[path], ref[path], rtol=1e-4, scale_tol=1e-5
            )
        # The dropped 256th logit never receives gradient in the reference.
        for name in ("rew", "critic"):
            for leaf in ("kernel", "bias"):
                assert not np.any(run[step]["train"][f"grad/agent/{name}/dist/out/{leaf}"][..., REF_BINS - 1])


def recorded_or_own_grads(run: dict[str, Any], step: int) -> dict[tuple[str, ...], np.ndarray]:
    """The reference's gradients of an update where recorded, else ours (which select the elements
    :func:`_well_conditioned` compares, nothing else)."""
    if step in GRADIENT_STEPS[run["agent"]]:
        return fixture_grads(run[step]["train"], run["config"])
    return {path: np.asarray(value) for path, value in run[step]["grads"].items()}


@pytest.mark.parametrize("step", [1, 2])
def test_replay_latents(run: dict[str, Any], step: int) -> None:
    latents, train = run[step]["latents"], run[step]["train"]
    assert_close("replay deter", latents["deter"], train["replay_outs/deter"])
    np.testing.assert_array_equal(latents["stoch"], train["replay_outs/stoch"])
    assert latents["stoch"].dtype == np.int32


def _well_conditioned(grads: list[dict], path: tuple[str, ...]) -> np.ndarray:
    """Elements whose reference gradient is ≥ 1e-2 of its tensor's largest at every step so far.

    μ and the update are ratios g/√ν̂: an absolute gradient error δ (≤ 1e-5 of the tensor's scale,
    see :func:`test_gradients`) becomes a relative error of about δ/|g| there, i.e. ≤ 1e-3 on these
    elements, while near-zero gradients can even change sign (μ = 0.1·sign(g) after one update).
    """
    mask = np.ones(grads[0][path].shape, bool)
    for g in grads:
        mask &= np.abs(g[path]) >= 1e-2 * np.abs(g[path]).max(initial=0.0)
    return mask


def _ref_values(
    after: dict, key: str, path: tuple[str, ...], ours: np.ndarray, config: DreamerV3Config
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(our values, reference values, element positions) at the stored (full or subset) elements."""
    name = path_to_ref(path)
    ref = after[key]
    index = after.get(f"index/{name}")
    if index is None:
        ref = to_ours(ref, path, config)
        return ours.reshape(-1), ref.reshape(-1), np.arange(ours.size)
    coords = np.unravel_index(index, _ref_shape(name, config))
    keep = np.all([c < s for c, s in zip(coords, ours.shape, strict=True)], axis=0)
    flat = np.ravel_multi_index(tuple(c[keep] for c in coords), ours.shape)
    return ours.reshape(-1)[flat], ref[keep], flat


def _check_retnorm(state: A.DreamerState, after: dict) -> None:
    for name, ours in (("low", state.retnorm.low), ("high", state.retnorm.high)):
        assert_close(f"retnorm {name}", ours, after[f"agent/retnorm/{name}/value"], rtol=1e-5, scale_tol=0)


def _check_moments(
    after: dict, opt_state: Any, config: DreamerV3Config, grads: list[dict], exact_grads: bool
) -> None:
    """Optimiser counters and ν/μ against the reference (subset or full).

    With ``exact_grads`` (our optimiser fed the reference's gradients) everything is compared at
    1e-5 of the tensor scale + 1e-4 relative; otherwise μ only on :func:`_well_conditioned` elements,
    at 2e-3 relative + 1e-4 of the tensor scale (μ = 0.9·μ₁ + 0.1·r₂ can cancel to far below its terms).
    """
    rms, momentum, warmup = opt_state.inner_state[1], opt_state.inner_state[2], opt_state.inner_state[4]
    step = int(after["agent/opt/step/value"])
    assert int(warmup.count) == step == int(after["agent/opt/state/rms_count"]) == int(rms.count)
    assert int(momentum.count) == int(after["agent/opt/state/momentum_count"]) == step
    like = unflatten(grads[0])
    for key, vector in (("rms_nu", rms.nu), ("momentum_mu", momentum.mu)):
        for path, value in flatten_tree(moment_tree(vector, like)).items():
            name = path_to_ref(path)
            ours, ref, where = _ref_values(after, f"agent/opt/state/{key}/{name}", path, value, config)
            if key == "momentum_mu" and not exact_grads:
                good = _well_conditioned(grads, path).reshape(-1)[where]
                assert_close(f"{key} {name}", ours[good], ref[good], rtol=2e-3, scale_tol=1e-4)
            else:
                assert_close(f"{key} {name}", ours, ref, rtol=1e-4, scale_tol=1e-5)


def _ref_shape(name: str, config: DreamerV3Config) -> tuple[int, ...]:
    return _init_shapes(config.discrete)[name]


_SHAPES: dict[bool, dict[str, tuple[int, ...]]] = {}


def _init_shapes(discrete: bool) -> dict[str, tuple[int, ...]]:
    if discrete not in _SHAPES:
        prefix = AGENTS["discrete" if discrete else "continuous"]["prefix"]
        _SHAPES[discrete] = {k: v.shape for k, v in load(f"{prefix}params_init").items()}
    return _SHAPES[discrete]


def _check_step2_params(
    after: dict,
    before: dict,
    new: dict,
    updates: dict,
    config: DreamerV3Config,
    mask: dict | None,
    update_rtol: float,
    update_scale_tol: float,
) -> None:
    """Applied updates (rtol), new parameters (≈ 2 ulp) and whole-tensor statistics after update 2."""
    for path, value in new.items():
        name = path_to_ref(path)
        upd, ref_upd, where = _ref_values(after, f"update/{name}", path, updates[path], config)
        vals, ref_vals, _ = _ref_values(after, f"param/{name}", path, value, config)
        good = np.ones(where.shape, bool) if mask is None else mask[path].reshape(-1)[where]
        assert_close(f"update {name}", upd[good], ref_upd[good], rtol=update_rtol, scale_tol=update_scale_tol)
        # Within 2 ulp, plus the update's own tolerance where the parameter is about the update's size
        # (zero-initialised biases and output layers).
        ulp = np.spacing(np.abs(ref_vals).astype(np.float32))
        bound = 2 * ulp + update_rtol * np.abs(ref_upd) + update_scale_tol * np.abs(ref_upd).max(initial=0.0)
        err = np.abs(vals - ref_vals)
        assert np.all((err <= bound)[good]), f"param {name}: max err {err[good].max(initial=0):.3e}"
        # [Σx, Σ|x|, max|x|] over the whole tensor, for the update and for the exact delta.
        for stat, full in (("update", updates[path]), ("delta", value - before[path])):
            ref_stats = after[f"stats/{stat}/{name}"]
            ours_stats = np.array([full.sum(), np.abs(full).sum(), np.abs(full).max()], np.float64)
            stats_rtol = 2e-2 if mask is not None else (1e-4 if stat == "update" else 2e-2)
            assert_close(f"{stat} stats {name}", ours_stats[1:], ref_stats[1:], rtol=stats_rtol, scale_tol=0)
            assert abs(ours_stats[0] - ref_stats[0]) <= stats_rtol * ref_stats[1] + 1e-30, (stat, name)


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_optimizer_on_reference_gradients(agent: str) -> None:
    """Our AGC + LaProp + warmup chain fed the reference's own gradients reproduces its optimiser
    state after each update whose gradients are recorded and the second (first nonzero) update, to the
    fixture's stated tolerance."""
    prefix = AGENTS[agent]["prefix"]
    config = config_for(agent)
    params, _ = params_from_reference(load(f"{prefix}params_init"), config)
    optimizer = A.make_optimizer(config)
    opt_state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    for step in GRADIENT_STEPS[agent]:  # consecutive from 1: each update starts from the last one's state
        suffix = {1: "params_after_train", 2: "params_after_step2"}[step]
        grads = fixture_grads(load(f"{prefix}train_step{step if step > 1 else ''}"), config)
        updates, opt_state = update(unflatten(grads), opt_state, params)
        after = load(f"{prefix}{suffix}")
        _check_moments(after, opt_state, config, [grads], exact_grads=True)
        new = optax_apply(params, updates)
        if step == 1:
            for path, value in flatten_tree(updates).items():
                assert not np.any(value), path  # warmup factor 0
        else:
            _check_step2_params(
                after,
                flatten_tree(params),
                flatten_tree(new),
                flatten_tree(updates),
                config,
                None,
                1e-4,
                1e-5,
            )
        params = new


def optax_apply(params: dict, updates: dict) -> dict:
    return jax.tree_util.tree_map(lambda p, u: p + u, params, updates)


def test_state_after_first_update(run: dict[str, Any]) -> None:
    after, state, config = run[1]["after"], run[1]["state"], run["config"]
    grads = [fixture_grads(run[1]["train"], config)]
    # Warmup factor 0: the optimised parameters are unchanged (exactly).
    init = flatten_tree(run["init_state"].params)
    for path, value in flatten_tree(state.params).items():
        np.testing.assert_array_equal(value, init[path])
    # The slow critic is an exact copy of the critic; counters; normaliser; optimiser moments.
    assert int(state.updates) == int(after["agent/updater/updates/value"]) == 1
    for path, value in flatten_tree(state.slow_critic).items():
        ref = after["agent/slowcritic/" + "/".join(path_to_ref(("critic", *path)).split("/")[2:])]
        np.testing.assert_array_equal(value, to_ours(ref, ("slowcritic", *path), config))
    _check_retnorm(state, after)
    _check_moments(after, state.opt_state, config, grads, exact_grads=False)


def test_state_after_second_update(run: dict[str, Any]) -> None:
    after, state, config = run[2]["after"], run[2]["state"], run["config"]
    grads = [recorded_or_own_grads(run, s) for s in (1, 2)]
    assert int(state.updates) == int(after["agent/updater/updates/value"]) == 2
    _check_retnorm(state, after)
    # Slow critic: 0.02·critic + 0.98·slow (both equal to the initial critic up to the tiny update, so
    # the zero-initialised output layer holds 0.02·update and inherits the update's tolerance).
    for path, value in flatten_tree(state.slow_critic).items():
        ref = after["agent/slowcritic/" + "/".join(path_to_ref(("critic", *path)).split("/")[2:])]
        ref = to_ours(ref, ("slowcritic", *path), config)
        assert_close("slow critic " + "/".join(path), value, ref, rtol=2e-3, scale_tol=1e-5)
    _check_moments(after, state.opt_state, config, grads, exact_grads=False)
    mask = {path: _well_conditioned(grads, path) for path in grads[0]}
    _check_step2_params(
        after,
        flatten_tree(run[2]["before"].params),
        flatten_tree(state.params),
        run[2]["updates"],
        config,
        mask,
        2e-3,
        1e-4,
    )


def test_twohot_mean_is_the_only_difference() -> None:
    """Our production means (exact 0 for zero logits) vs the reference's jitted −0.1644754.

    Every reward, critic and slow-critic head in the recorded step outputs all-zero logits, the
    fixture's means are all exactly −0.1644754 and ours exactly 0. Running the production loss (no
    patch), everything upstream of the means still matches, the imagined rewards (k ≥ 1), values and
    hence the imagined returns and advantages are exactly 0, and only the terms downstream of the
    returns (actor, critic, replay critic) differ.
    """
    agent = "discrete"
    prefix = AGENTS[agent]["prefix"]
    config = config_for(agent)
    fw = load(f"{prefix}forward")
    for key in ("rew0", "rew1", "critic0", "critic1", "slowcritic0", "slowcritic1"):
        assert not np.any(fw[f"{key}/logits"]), key
        np.testing.assert_array_equal(fw[f"{key}/mean"], REF_JIT_ZERO_LOGITS_MEAN)
    bins = jnp.asarray(symexp_bins(config.bins))
    zero = jax.jit(twohot_mean)(jnp.zeros((3, config.bins)), bins)
    np.testing.assert_array_equal(np.asarray(zero), 0.0)

    params, slow = params_from_reference(load(f"{prefix}params_init"), config)
    batch = fixture_batch(load(f"{prefix}batch"), config)
    loss = jax.jit(A.loss_fn, static_argnames="config")
    _, aux = loss(config, params, slow, A.percentile_norm_init(), batch, recorded_noise(fw, config))
    r = _numpy(aux["internals"])
    np.testing.assert_array_equal(r["img_value"], 0.0)
    np.testing.assert_array_equal(r["img_reward"][:, 1:], 0.0)
    np.testing.assert_array_equal(r["ret"], 0.0)
    np.testing.assert_array_equal(r["adv"], 0.0)
    assert_close("posterior logits", r["post_logits"], fw["obs/logit"])
    for ours in ("rec", "rew", "con", "dyn", "rep"):
        ref, scale = TERMS[ours]
        assert_close(f"{ours} loss", scale * r["losses"][ours], fw[f"losses_scaled/{ref}_loss"])
    # The reference's returns are those of constant rewards and values m = −0.1644754: R is linear in m
    # (R = m·f(continues)), so with m = 0 ours are exactly 0 and the reference's are all negative.
    assert np.all(fw["retnorm0/input"] < 0)
