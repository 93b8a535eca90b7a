"""Loading never runs code from the file unless the caller opts in with ``trust_pickled_code=True``.

Each test plants a payload (an object whose unpickling creates a marker directory) in one part of a
checkpoint or replay file, then checks that loading refuses the file with a clear message and that
the marker was never created.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch as th
from gymnasium.wrappers import TimeLimit
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.policy import JaxPolicy, flatten_state
from sb3_worldmodels.common.policy_file import ACTING_STATE
from sb3_worldmodels.common.safe_io import UnsafeFileError
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv, DictObsEnv

AGENTS = {
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}),
}


class Payload:
    """Unpickling it creates the directory ``marker`` (stands for any code an attacker wants run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def chain_env():
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)


@pytest.fixture(scope="module", params=list(AGENTS))
def trained(request, tmp_path_factory):
    """(agent class, checkpoint path, replay path, model) after a short run."""
    cls, settings = AGENTS[request.param]
    model = cls(chain_env(), **settings)
    model.learn(60)
    folder = tmp_path_factory.mktemp(request.param)
    model.save(folder / "model.zip")
    model.save_replay_buffer(folder / "replay.pkl")
    return cls, folder / "model.zip", folder / "replay.pkl", model


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rewrite(path: Path, out: Path, **replace: bytes) -> Path:
    parts = {**members(path), **{name.replace("__", "."): blob for name, blob in replace.items()}}
    with zipfile.ZipFile(out, "w") as archive:
        for name, blob in parts.items():
            archive.writestr(name, blob)
    return out


def pickled_entry(obj) -> dict:
    """An entry as SB3's data_to_json writes a non-JSON object."""
    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(cloudpickle.dumps(obj)).decode()}


def with_payload(path: Path, tmp_path: Path, key: str, marker: Path) -> Path:
    """A copy of checkpoint ``path`` whose attribute ``key`` is a pickled payload."""
    data = json.loads(members(path)["data"])
    data[key] = pickled_entry(Payload(marker))
    return rewrite(path, tmp_path / "bad.zip", data=json.dumps(data).encode())


def tensor_file(obj) -> bytes:
    buffer = io.BytesIO()
    th.save(obj, buffer)
    return buffer.getvalue()


def test_the_checkpoint_has_no_pickled_attribute(trained):
    _, path, _, _ = trained
    data = json.loads(members(path)["data"])
    assert not [key for key, entry in data.items() if isinstance(entry, dict) and ":serialized:" in entry]
    assert data["format_version"] == 2


def test_a_loaded_checkpoint_equals_the_saved_model(trained):
    cls, path, replay, model = trained
    loaded = cls.load(path)
    saved, back = flatten_state(model.policy.state), flatten_state(loaded.policy.state)
    assert all(np.array_equal(saved[k], back[k]) for k in saved)
    assert loaded.num_timesteps == model.num_timesteps
    assert loaded.observation_space == model.observation_space and loaded.action_space == model.action_space
    assert list(loaded.ep_info_buffer) == list(model.ep_info_buffer)
    loaded.load_replay_buffer(replay)
    before, after = model.replay_buffer.export_state(), loaded.replay_buffer.export_state()
    assert before[0].keys() == after[0].keys()
    assert all(np.array_equal(before[0][k], after[0][k]) for k in before[0])
    assert loaded.replay_buffer.rng.bit_generator.state == model.replay_buffer.rng.bit_generator.state


@pytest.mark.parametrize("key", ["observation_space", "learning_rate", "algorithm_name"])
def test_a_payload_in_the_data_part_does_not_run(trained, tmp_path, key):
    cls, path, _, _ = trained
    marker = tmp_path / "ran"
    bad = with_payload(path, tmp_path, key, marker)
    with (
        pytest.raises(ValueError, match="trust_pickled_code")
        if key != "algorithm_name"
        else pytest.raises(ValueError, match="saved by")
    ):
        cls.load(bad)
    assert not marker.exists()


@pytest.mark.parametrize("part", ["policy.pth", "pytorch_variables.pth"])
def test_a_payload_in_a_tensor_part_does_not_run(trained, tmp_path, part):
    cls, path, _, model = trained
    marker = tmp_path / "ran"
    bad = rewrite(path, tmp_path / "bad.zip", **{part.replace(".", "__"): tensor_file(Payload(marker))})
    with pytest.raises(ValueError, match="other than tensors"):
        cls.load(bad)
    with pytest.raises(ValueError, match="other than tensors"):
        model.set_parameters(str(bad))
    assert not marker.exists()


def test_set_parameters_from_a_file_reads_only_the_weights(trained, tmp_path):
    cls, path, _, model = trained
    marker = tmp_path / "ran"
    bad = with_payload(path, tmp_path, "observation_space", marker)
    fresh = cls(chain_env(), **AGENTS["tdmpc2" if cls is TDMPC2 else "dreamerv3"][1])
    fresh.set_parameters(str(bad))
    assert not marker.exists()
    saved, back = flatten_state(model.policy.state), flatten_state(fresh.policy.state)
    assert all(np.array_equal(saved[k], back[k]) for k in saved)


def test_another_algorithms_checkpoint_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "ran"
    PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64).save(tmp_path / "ppo.zip")
    data = json.loads(members(tmp_path / "ppo.zip")["data"])
    data["policy_class"][":serialized:"] = pickled_entry(Payload(marker))[":serialized:"]
    bad = rewrite(tmp_path / "ppo.zip", tmp_path / "bad.zip", data=json.dumps(data).encode())
    for cls in (TDMPC2, DreamerV3):
        with pytest.raises(ValueError, match=r"by another algorithm \(a policy class from stable_baselines3"):
            cls.load(bad)
    assert not marker.exists()


def test_a_pickled_checkpoint_needs_the_opt_in_and_then_loads(trained, tmp_path):
    """A format-1 file (SB3's pickled attributes) is refused by default, naming the opt-in."""
    cls, _, _, model = trained
    old = tmp_path / "old.zip"
    model.format_version = 1
    try:
        BaseAlgorithm.save(model, old)  # SB3's own writer: every non-JSON attribute pickled
    finally:
        model.format_version = 2
    with pytest.raises(UnsafeFileError, match=r"observation_space.*trust_pickled_code=True"):
        cls.load(old)
    loaded = cls.load(old, trust_pickled_code=True)
    assert loaded.num_timesteps == model.num_timesteps


def test_trusting_a_file_is_what_runs_its_code(trained, tmp_path):
    cls, path, _, _ = trained
    marker = tmp_path / "ran"
    bad = with_payload(path, tmp_path, "verbose", marker)
    with pytest.raises(UnsafeFileError, match="verbose"):
        cls.load(bad)
    assert not marker.exists()
    cls.load(bad, custom_objects={"verbose": 0})  # a custom object stands in without unpickling
    assert not marker.exists()
    cls.load(bad, trust_pickled_code=True)  # the caller vouched for the file: its code runs
    assert marker.exists()


def test_a_callable_learning_rate_is_saved_pickled_with_a_warning(tmp_path):
    cls, settings = AGENTS["tdmpc2"]
    model = cls(chain_env(), **{**settings, "learning_rate": lambda progress: 3e-4 * progress})
    with pytest.warns(UserWarning, match="learning_rate"):
        model.save(tmp_path / "lambda.zip")
    with pytest.raises(UnsafeFileError, match="learning_rate"):
        cls.load(tmp_path / "lambda.zip")
    assert cls.load(tmp_path / "lambda.zip", custom_objects={"learning_rate": 1e-4}).learning_rate == 1e-4
    trusted = cls.load(tmp_path / "lambda.zip", trust_pickled_code=True)
    assert trusted.lr_schedule(0.5) == pytest.approx(1.5e-4)


def test_sb3_schedule_classes_are_plain_data(tmp_path):
    cls, settings = AGENTS["tdmpc2"]
    model = cls(chain_env(), **{**settings, "learning_rate": LinearSchedule(1e-3, 1e-4, 0.5)})
    model.save(tmp_path / "linear.zip")
    loaded = cls.load(tmp_path / "linear.zip")
    assert loaded.lr_schedule(0.75) == pytest.approx(model.lr_schedule(0.75))


@pytest.mark.parametrize("agent", list(AGENTS))
def test_dict_observations_mid_episode_are_plain_data(agent, tmp_path):
    """SB3's VecEnvs hold Dict observations (dm_control's) as OrderedDicts: saved as data, not pickled,
    and loaded back with the same keys, order and values."""
    import warnings

    cls, settings = AGENTS[agent]
    no_update = {"dreamerv3": {"learning_starts": 1_000}, "tdmpc2": {"seed_steps": 1_000}}[agent]
    model = cls(make_vec_env(lambda: TimeLimit(DictObsEnv(), 10), n_envs=1), **{**settings, **no_update})
    model.learn(15)  # stops mid-episode: the last observation is part of the checkpoint
    assert model._n_updates == 0  # rows only: the checkpoint's data is what is tested, not an update
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save(tmp_path / "dict.zip")
    loaded = cls.load(tmp_path / "dict.zip")
    assert type(loaded._last_obs) is type(model._last_obs)
    assert list(loaded._last_obs) == list(model._last_obs)
    assert all(np.array_equal(loaded._last_obs[k], model._last_obs[k]) for k in model._last_obs)


def test_a_pickled_replay_needs_the_opt_in(trained, tmp_path):
    cls, path, replay, model = trained
    marker = tmp_path / "ran"
    bad = tmp_path / "payload.pkl"
    bad.write_bytes(pickle.dumps(Payload(marker)))
    loaded = cls.load(path)
    with pytest.raises(UnsafeFileError, match="pickled replay buffer.*trust_pickled_code=True"):
        loaded.load_replay_buffer(bad)
    assert not marker.exists() and loaded.replay_buffer is None
    old = tmp_path / "old.pkl"
    old.write_bytes(pickle.dumps(model.replay_buffer))
    loaded.load_replay_buffer(old, trust_pickled_code=True)
    assert loaded.replay_buffer.size() == model.replay_buffer.size()


def test_payloads_inside_a_replay_archive_do_not_run(trained, tmp_path):
    cls, path, replay, _ = trained
    marker = tmp_path / "ran"
    loaded = cls.load(path)
    with np.load(replay) as archive:
        arrays = {name: archive[name] for name in archive.files}
    object_array = np.empty(1, dtype=object)
    object_array[0] = Payload(marker)
    np.savez(tmp_path / "objects.npz", **{**arrays, "episodes": object_array, "total": object_array})
    meta = json.loads(str(arrays["__meta__"]))
    meta["rng"] = pickled_entry(Payload(marker))
    np.savez(tmp_path / "meta.npz", **{**arrays, "__meta__": np.array(json.dumps(meta))})
    for name in ("objects.npz", "meta.npz"):
        with pytest.raises(ValueError, match="replay"):
            loaded.load_replay_buffer(tmp_path / name)
        assert loaded.replay_buffer is None
    assert not marker.exists()


def test_a_replay_with_inconsistent_arrays_is_refused(trained, tmp_path):
    cls, path, replay, _ = trained
    loaded = cls.load(path)
    with np.load(replay) as archive:
        arrays = {name: archive[name] for name in archive.files}
    field = next(name for name in arrays if name.startswith("field/"))
    np.savez(tmp_path / "short.npz", **{**arrays, field: arrays[field][:-1]})
    with pytest.raises(ValueError, match=f"not a consistent .*{field}"):
        loaded.load_replay_buffer(tmp_path / "short.npz")
    assert loaded.replay_buffer is None


def test_a_policy_file_acts_as_its_model_and_never_runs_code(trained, tmp_path):
    _, checkpoint, _, model = trained
    model.policy.save(tmp_path / "policy.zip")
    parts = members(tmp_path / "policy.zip")
    weights = th.load(io.BytesIO(parts["policy.pth"]), weights_only=True)
    assert weights and all(key.startswith(ACTING_STATE) for key in weights)  # no optimiser state
    assert set(json.loads(parts["data"])["attributes"]) >= {"observation_space", "action_space", "model_size"}
    policy = JaxPolicy.load(tmp_path / "policy.zip")
    obs = np.array([[0.0, 1.0], [0.5, 1.0], [1.0, 1.0]], np.float32)
    expected, _ = model.predict(obs, deterministic=True)
    np.testing.assert_array_equal(policy.predict(obs, deterministic=True)[0], expected)

    marker = tmp_path / "ran"
    data = json.loads(parts["data"])
    data["attributes"]["observation_space"] = pickled_entry(Payload(marker))
    pickled = rewrite(tmp_path / "policy.zip", tmp_path / "pickled.zip", data=json.dumps(data).encode())
    with pytest.raises(UnsafeFileError, match="pickled"):
        JaxPolicy.load(pickled)
    in_weights = rewrite(
        tmp_path / "policy.zip", tmp_path / "weights.zip", policy__pth=tensor_file(Payload(marker))
    )
    with pytest.raises(ValueError, match="other than tensors"):
        JaxPolicy.load(in_weights)
    assert not marker.exists()
    with pytest.raises(
        ValueError, match=r"not a policy file written by model.policy.save\(\) \(a model checkpoint"
    ):
        JaxPolicy.load(checkpoint)
