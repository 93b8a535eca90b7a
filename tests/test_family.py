"""DreamerV3, TDMPC2 and TDMPC2MultiTask behave as one family: the same checkpoint format and
round trip, the same predict rules (shapes, state, the deterministic key rule), the same SB3
callback sequence, and loading never runs code stored in the file."""

from __future__ import annotations

import base64
import io
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch as th
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3, TDMPC2MultiTask, pool_tasks
from sb3_worldmodels.common.checkpoints import flatten_state
from sb3_worldmodels.common.safe_io import UnsafeFileError
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv
from tests.test_tdmpc2_multitask import _write_export


@dataclass
class Member:
    """One algorithm of the family, with what its tests need to drive it."""

    build: Callable[[Path], Any]  # (a folder for data) -> a fresh model
    predict: Callable[..., tuple[np.ndarray, tuple[np.ndarray, ...]]]  # (model, obs, state, start, det)
    obs_width: int
    action_width: int


def chain_env():
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)


def multitask_pool(folder: Path):
    rng = np.random.default_rng(1)
    sources = {
        "up": _write_export(folder / "up.npz", rng, 3, 1, 4, 20, lambda o, a: o[0]),
        "down": _write_export(folder / "down.npz", rng, 5, 2, 4, 20, lambda o, a: -o[0] + a[1]),
    }
    return pool_tasks(sources, folder / "pool")


def tiny_multitask(folder: Path) -> TDMPC2MultiTask:
    settings = {k: v for k, v in TDMPC2_SMOKE.items() if k not in ("model_size", "batch_size")}
    return TDMPC2MultiTask(
        multitask_pool(folder), model_size=1, batch_size=16, task_dim=8, seed=0, **settings
    )


def predict_online(model, obs, state=None, episode_start=None, deterministic=False):
    return model.predict(obs, state, episode_start, deterministic)


def predict_task(model, obs, state=None, episode_start=None, deterministic=False):
    return model.predict(obs, "up", state, episode_start, deterministic)


MEMBERS = {
    "DreamerV3": Member(lambda _: DreamerV3(chain_env(), **DREAMER_SMOKE, seed=0), predict_online, 2, 1),
    "TDMPC2": Member(
        lambda _: TDMPC2(chain_env(), **TDMPC2_SMOKE, seed=0, seed_steps=10), predict_online, 2, 1
    ),
    "TDMPC2MultiTask": Member(tiny_multitask, predict_task, 3, 1),
}


@pytest.fixture(scope="module", params=list(MEMBERS))
def member(request, tmp_path_factory) -> tuple[Member, Any]:
    """(the member, a model whose float parameters were moved off their initial values)."""
    entry = MEMBERS[request.param]
    model = entry.build(tmp_path_factory.mktemp(request.param))
    rng = np.random.default_rng(0)
    moved = {  # within 1% of their values: a learning rate stays positive
        name: value * th.from_numpy(rng.uniform(0.99, 1.01, value.shape).astype(np.float32))
        for name, value in model.get_parameters()["policy"].items()
    }
    model.set_parameters({"policy": moved}, exact_match=True)
    return entry, model


# ------------------------------------------------------------------------------------------ save/load
def test_save_and_load_round_trip(member, tmp_path):
    entry, model = member
    obs = np.linspace(-1, 1, entry.obs_width, dtype=np.float32)
    model.save(tmp_path / "model.zip")
    with zipfile.ZipFile(tmp_path / "model.zip") as archive:
        names = set(archive.namelist())
        data = json.loads(archive.read("data"))
    assert {"data", "policy.pth"} <= names  # one checkpoint format for the family
    assert data["algorithm_name"] == type(model).__name__ and data["format_version"] == 2
    loaded = type(model).load(tmp_path / "model.zip")
    saved, back = flatten_state(model.policy.state), flatten_state(loaded.policy.state)
    assert saved.keys() == back.keys()
    for key in saved:
        assert back[key].dtype == saved[key].dtype, key
        np.testing.assert_array_equal(back[key], saved[key], err_msg=key)
    assert loaded.num_timesteps == model.num_timesteps
    np.testing.assert_array_equal(
        entry.predict(loaded, obs, deterministic=True)[0], entry.predict(model, obs, deterministic=True)[0]
    )


def test_a_checkpoint_of_another_member_is_refused(member, tmp_path):
    _, model = member
    model.save(tmp_path / "model.zip")
    others = [cls for cls in (DreamerV3, TDMPC2, TDMPC2MultiTask) if cls is not type(model)]
    for cls in others:
        with pytest.raises(ValueError, match=f"saved by {type(model).__name__}, not by {cls.__name__}"):
            cls.load(tmp_path / "model.zip")


# ------------------------------------------------------------------------------------------ predict
def test_predict_shapes_state_and_the_deterministic_key_rule(member):
    entry, model = member
    one = np.linspace(-1, 1, entry.obs_width, dtype=np.float32)
    batch = np.stack([one, -one])
    action, state = entry.predict(model, one, deterministic=True)
    assert np.shape(action) == (entry.action_width,)
    assert all(s.shape[0] == 1 for s in state)
    actions, states = entry.predict(model, batch, deterministic=True)
    assert actions.shape == (2, entry.action_width) and all(s.shape[0] == 2 for s in states)

    # The deterministic action is a function of the inputs: the predict stream does not move it.
    entry.predict(model, one)
    entry.predict(model, one)
    np.testing.assert_array_equal(entry.predict(model, one, deterministic=True)[0], action)
    # Stochastic calls draw from the stream, which advances with each call.
    drawn = [entry.predict(model, batch)[0] for _ in range(2)]
    assert not np.array_equal(drawn[0], drawn[1])

    # The state argument: passed back it is used; episode_start restarts it (as no state at all).
    _, after = entry.predict(model, one, state, np.array([False]), deterministic=True)
    assert [s.shape for s in after] == [s.shape for s in state]
    restarted, _ = entry.predict(model, one, after, np.array([True]), deterministic=True)
    np.testing.assert_array_equal(restarted, action)
    with pytest.raises(ValueError, match="state must be"):
        entry.predict(model, one, tuple(np.zeros((2, *s.shape[1:]), np.float32) for s in state))
    with pytest.raises(ValueError, match="episode_start has shape"):
        entry.predict(model, one, state, np.array([True, False]))
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        entry.predict(model, one, deterministic="False")


# ------------------------------------------------------------------------------------------ callbacks
class Recorder(BaseCallback):
    """Records SB3's callback calls; its ``on_step`` returns False at call ``stop_at``."""

    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.stop_at, self.events = stop_at, []

    def _on_training_start(self) -> None:
        self.events.append("training_start")

    def _on_step(self) -> bool:
        self.events.append("step")
        return self.n_calls < self.stop_at

    def _on_training_end(self) -> None:
        self.events.append("training_end")


def test_callbacks_follow_sb3s_sequence_and_false_stops(member):
    _, model = member
    first, second = Recorder(stop_at=3), Recorder(stop_at=100)
    model.learn(50, callback=[first, second], progress_bar=True)
    for recorder in (first, second):
        assert recorder.model is model and recorder.logger is model.logger
        assert recorder.events == ["training_start", "step", "step", "step", "training_end"]
    assert 0 < model.num_timesteps < 50  # the third step stopped the run


# ------------------------------------------------------------------------------------------ safety
class Payload:
    """Unpickling it creates the directory ``marker`` (stands for any code an attacker wants run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def rewritten(path: Path, out: Path, name: str, blob: bytes) -> Path:
    with zipfile.ZipFile(path) as archive:
        parts = {member: archive.read(member) for member in archive.namelist()}
    with zipfile.ZipFile(out, "w") as archive:
        for member, content in {**parts, name: blob}.items():
            archive.writestr(member, content)
    return out


def test_loading_never_runs_code_from_the_file(member, tmp_path):
    _, model = member
    model.save(tmp_path / "model.zip")
    marker = tmp_path / "ran"
    with zipfile.ZipFile(tmp_path / "model.zip") as archive:
        data = json.loads(archive.read("data"))
    payload = base64.b64encode(cloudpickle.dumps(Payload(marker))).decode()
    data["verbose"] = {":type:": "<class 'object'>", ":serialized:": payload}  # as SB3 pickles a value
    in_data = rewritten(tmp_path / "model.zip", tmp_path / "data.zip", "data", json.dumps(data).encode())
    with pytest.raises(UnsafeFileError, match=r"verbose.*trust_pickled_code"):
        type(model).load(in_data)
    buffer = io.BytesIO()
    th.save(Payload(marker), buffer)
    in_weights = rewritten(tmp_path / "model.zip", tmp_path / "weights.zip", "policy.pth", buffer.getvalue())
    with pytest.raises(ValueError, match="other than tensors"):
        type(model).load(in_weights)
    assert not marker.exists()
