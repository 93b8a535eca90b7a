"""NaN and inf never pass: not from the env, not from an update, not from a file, not to an env.

A non-finite reward or observation is refused where it enters (naming the env and the step); an
update whose loss terms or gradient norms are non-finite stops training and keeps the parameters
from before it; weights and predict states with NaN are refused; a NaN action is never sent.
"""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest
import torch as th
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.base import NonFiniteActionError, NonFiniteUpdateError
from sb3_worldmodels.common.boundary import check_rewards
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

AGENTS = {
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}),
}


class FaultyEnv(ChainEnv):
    """A chain whose reward (or first observation entry) becomes ``value`` at env step ``at``."""

    def __init__(self, at: int, value: float, where: str = "reward") -> None:
        super().__init__()
        self.at, self.value, self.where, self.steps = at, value, where, 0
        self.actions: list[np.ndarray] = []

    def step(self, action):
        self.actions.append(np.asarray(action))
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps == self.at:
            if self.where == "reward":
                reward = self.value
            else:
                obs = obs.copy()
                obs[0] = self.value
        return obs, reward, terminated, truncated, info


def vec(env_fn, n: int = 1):
    return make_vec_env(lambda: TimeLimit(env_fn(), 10), n_envs=n)


def build(agent: str, env=None):
    cls, settings = AGENTS[agent]
    return cls(vec(ChainEnv) if env is None else env, **settings)


def state_hash(model) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(model.policy.state):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def params_hash(model) -> str:
    """The trained part of the state (acting advances the other keys)."""
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(model.policy.state["agent"].params):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def all_finite(model) -> bool:
    leaves = jax.tree_util.tree_leaves(model.policy.state)
    return all(np.all(np.isfinite(np.asarray(x))) for x in leaves if np.asarray(x).dtype.kind == "f")


@pytest.mark.parametrize("agent", list(AGENTS))
@pytest.mark.parametrize(
    ("value", "where"), [(float("nan"), "reward"), (float("inf"), "reward"), (float("nan"), "obs")]
)
def test_a_non_finite_step_is_refused_where_it_enters(agent, value, where):
    env = vec(lambda: FaultyEnv(at=37, value=value, where=where))
    model = build(agent, env)
    kind = "reward" if where == "reward" else "observation"
    with pytest.raises(ValueError, match=rf"Non-finite {kind}.*from env 0.* at step \d+"):
        model.learn(200)
    assert all_finite(model)
    stored = model.replay_buffer.export_state()[0] if model.replay_buffer is not None else {}
    assert all(np.all(np.isfinite(a)) for a in stored.values() if a.dtype.kind == "f")


def test_the_refusal_names_the_env_and_the_step():
    """Of several envs, the one whose reward or observation is not finite (the end-to-end runs above
    use one env, the programs every test of this file shares)."""
    rewards = np.array([0.5, np.inf, np.nan], np.float32)
    with pytest.raises(ValueError, match=r"Non-finite reward inf from env 1 at step 7:"):
        check_rewards(rewards, " at step 7")
    adapter = build("dreamerv3").obs_adapter
    obs = np.array([[0.0, 1.0], [0.5, 1.0], [0.2, np.nan]], np.float32)
    with pytest.raises(ValueError, match=r"Non-finite observation .* from env 2, index 1 at step 7:"):
        adapter.convert(obs, " at step 7")


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_non_finite_update_stops_training_and_keeps_the_parameters(agent):
    faulty = FaultyEnv(at=10**9, value=0.0)  # records the actions it is sent
    model = build(agent, vec(lambda: faulty))
    model.learn(80)
    updates, before, sent = model._n_updates, params_hash(model), len(faulty.actions)
    assert updates > 0
    data = model.replay_buffer._data
    data["reward"][...] = np.nan  # as if a reward had overflowed inside the replay
    latents_before = {k: v.copy() for k, v in data.items() if k in ("deter", "stoch")}
    with pytest.raises(
        NonFiniteUpdateError, match=rf"Update {updates + 1} produced non-finite values \(.*rew"
    ):
        model.learn(40, reset_num_timesteps=False)
    assert params_hash(model) == before and model._n_updates == updates
    # The refused update is the first step's: checked after the next acting call is made (while the
    # device acts), it stops learn before that action reaches the env.
    assert len(faulty.actions) == sent + 1
    for name, latent in latents_before.items():  # DreamerV3: no NaN latent was written back
        assert np.array_equal(data[name], latent)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_non_finite_weights_are_refused(agent, tmp_path):
    model = build(agent)
    before = state_hash(model)
    params = model.get_parameters()
    name = next(k for k, v in params["policy"].items() if v.dtype.is_floating_point and v.numel() > 1)
    params["policy"][name] = params["policy"][name].clone()
    params["policy"][name].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite value \(NaN or inf\) in .*Load an earlier checkpoint"):
        model.set_parameters(params)
    assert state_hash(model) == before
    model.save(tmp_path / "model.zip")
    import zipfile

    with zipfile.ZipFile(tmp_path / "model.zip") as archive:
        parts = {n: archive.read(n) for n in archive.namelist()}
    import io

    buffer = io.BytesIO()
    th.save(params["policy"], buffer)
    parts["policy.pth"] = buffer.getvalue()
    with zipfile.ZipFile(tmp_path / "nan.zip", "w") as archive:
        for part, blob in parts.items():
            archive.writestr(part, blob)
    with pytest.raises(ValueError, match="non-finite"):
        type(model).load(tmp_path / "nan.zip")


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_non_finite_predict_state_is_refused(agent):
    model = build(agent)
    obs = np.array([[0.0, 1.0], [0.5, 1.0]], np.float32)
    _, state = model.predict(obs, deterministic=True)
    bad = tuple(np.array(s, dtype=np.float32) for s in state)
    bad[0].reshape(-1)[0] = np.nan
    with pytest.raises(ValueError, match="state holds a non-finite value"):
        model.predict(obs, state=bad, episode_start=np.zeros(2, bool), deterministic=True)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_nan_action_never_reaches_the_env(agent):
    faulty = FaultyEnv(at=10**9, value=0.0)
    model = build(agent, vec(lambda: faulty))
    model.learn(30)
    sent = len(faulty.actions)
    model.policy.state = jax.tree_util.tree_map(
        lambda x: x * np.nan if np.asarray(x).dtype.kind == "f" else x, model.policy.state
    )
    with pytest.raises(NonFiniteActionError, match="non-finite action.*not sent to the env"):
        model.predict(np.array([0.0, 1.0], np.float32), deterministic=True)
    with pytest.raises(NonFiniteActionError, match="non-finite action.*not sent to the env"):
        model.learn(30, reset_num_timesteps=False)
    assert len(faulty.actions) == sent
    assert all(np.all(np.isfinite(a)) for a in faulty.actions)


class BrokenEnv(ChainEnv):
    """Raises at env step ``at`` (``kind="raise"``) or returns a longer observation from then on."""

    def __init__(self, at: int, kind: str) -> None:
        super().__init__()
        self.at, self.kind, self.steps = at, kind, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps >= self.at:
            if self.kind == "raise":
                raise RuntimeError("the simulator crashed")
            obs = np.concatenate([obs, [0.0]]).astype(np.float32)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("agent", list(AGENTS))
@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        ("raise", RuntimeError, "the simulator crashed"),
        ("shape", ValueError, r"env.step failed at step \d+.*no longer fits the observation space"),
    ],
)
def test_an_env_that_fails_mid_run_leaves_a_sound_model(agent, kind, error, words):
    model = build(agent, vec(lambda: BrokenEnv(at=45, kind=kind)))
    with pytest.raises(error, match=words):
        model.learn(200)
    assert all_finite(model) and 0 < model.num_timesteps < 200
    stored = model.replay_buffer.export_state()[0]
    assert all(np.all(np.isfinite(a)) for a in stored.values() if a.dtype.kind == "f")
    model.set_env(vec(ChainEnv))  # the model goes on with a working env
    model.learn(20, reset_num_timesteps=False)
