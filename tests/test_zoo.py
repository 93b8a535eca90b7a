"""rl_zoo3: the real console commands in subprocesses, on tiny settings.

The hook (``sb3_worldmodels_zoo.pth``) is installed by ``pip install -e .``; these tests run the
literal ``rl_zoo3`` command, so they also check that the installed hook works. Compiled XLA programs
are shared between the subprocesses through JAX's persistent cache to keep the module short.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from sb3_worldmodels.zoo import HYPERPARAMS_DIR, samplers


def as_params(settings: dict) -> list[str]:
    """Constructor settings as the zoo's ``-params key:value`` words."""
    return [f"{key}:{value!r}" for key, value in settings.items()]


TINY_TDMPC2 = as_params({**TDMPC2_SMOKE, "seed_steps": 20})
TINY_DREAMERV3 = as_params(DREAMERV3_SMOKE)
SHORT_PENDULUM = ["--env-kwargs", "max_episode_steps:40"]

pytestmark = pytest.mark.skipif(shutil.which("rl_zoo3") is None, reason="rl_zoo3 is not installed")


@pytest.fixture(scope="module")
def zoo_env(tmp_path_factory):
    # The session's shared cache (tests/conftest.py) when there is one, else one for this module.
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("jax_cache"))
    env = dict(os.environ)
    env.update(
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        PYTHONWARNINGS="ignore",
    )
    env.pop("SB3_WORLDMODELS_ZOO_HOOK", None)
    return env


def run(args, env, cwd, timeout=600):
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(args)}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )
    return result.stdout + result.stderr


def test_hook_is_lazy_adds_only_new_keys_and_can_be_switched_off(zoo_env, tmp_path):
    probe = (
        "import json, sys\n"
        "lazy = 'jax' not in sys.modules and 'sb3_worldmodels' not in sys.modules\n"
        "import rl_zoo3, stable_baselines3 as sb3\n"
        "from rl_zoo3.hyperparams_opt import HYPERPARAMS_SAMPLER\n"
        "print(json.dumps({'lazy': lazy, 'hooked': '_sb3_worldmodels_zoo_hook' in sys.modules,\n"
        "  'algos': sorted(rl_zoo3.ALGOS), 'sac': rl_zoo3.ALGOS['sac'] is sb3.SAC,\n"
        "  'tdmpc2': getattr(rl_zoo3.ALGOS.get('tdmpc2'), '__name__', None),\n"
        "  'sampler': 'tdmpc2' in HYPERPARAMS_SAMPLER}))\n"
    )
    on = json.loads(run([sys.executable, "-c", probe], zoo_env, tmp_path).strip().splitlines()[-1])
    assert on["lazy"] and on["hooked"] and on["sac"]
    assert on["tdmpc2"] == "TDMPC2" and "dreamerv3" in on["algos"] and on["sampler"]
    off = json.loads(
        run([sys.executable, "-c", probe], {**zoo_env, "SB3_WORLDMODELS_ZOO_HOOK": "0"}, tmp_path)
        .strip()
        .splitlines()[-1]
    )
    assert off["tdmpc2"] is None and not off["sampler"]
    assert set(on["algos"]) - set(off["algos"]) == {"tdmpc2", "dreamerv3"}


def test_tdmpc2_train_enjoy_and_resume_with_the_plain_zoo_command(zoo_env, tmp_path):
    logs = tmp_path / "logs"
    common = ["--algo", "tdmpc2", "--env", "Pendulum-v1", *SHORT_PENDULUM]
    run(
        [
            "rl_zoo3",
            "train",
            *common,
            "-n",
            "100",
            "-f",
            str(logs),
            "--seed",
            "0",
            "--eval-freq",
            "90",
            "--eval-episodes",
            "1",
            "--save-replay-buffer",
            "-params",
            *TINY_TDMPC2,
        ],
        zoo_env,
        tmp_path,
    )
    run_dir = logs / "tdmpc2" / "Pendulum-v1_1"
    for name in (
        "Pendulum-v1.zip",
        "best_model.zip",
        "replay_buffer.pkl",
        "evaluations.npz",
        "Pendulum-v1/config.yml",
    ):
        assert (run_dir / name).exists(), name
    config = dict(yaml.load((run_dir / "Pendulum-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader))
    assert config["model_size"] == 1 and config["enc_dim"] == 16  # our yml entry, then -params
    with zipfile.ZipFile(run_dir / "Pendulum-v1.zip") as archive:
        data = json.loads(archive.read("data"))
    assert data["num_timesteps"] == 100 and data["_n_updates"] > 0
    first_updates = data["_n_updates"]

    out = run(["rl_zoo3", "enjoy", *common, "-f", str(logs), "-n", "50", "--no-render"], zoo_env, tmp_path)
    assert "Loading" in out and "Episode Reward" in out

    out = run(
        [
            "rl_zoo3",
            "train",
            *common,
            "-n",
            "30",
            "-f",
            str(logs),
            "--seed",
            "1",
            "-i",
            str(run_dir / "Pendulum-v1.zip"),
            "-params",
            *TINY_TDMPC2,
        ],
        zoo_env,
        tmp_path,
    )
    assert "Loading pretrained agent" in out and "Loading replay buffer" in out
    resumed = logs / "tdmpc2" / "Pendulum-v1_2" / "Pendulum-v1.zip"
    with zipfile.ZipFile(resumed) as archive:
        data = json.loads(archive.read("data"))
    # The zoo resumes as for SAC: the step counter restarts, the weights and the replay carry over.
    assert data["num_timesteps"] == 30 and data["_n_updates"] > first_updates


def test_dreamerv3_train_with_eval_and_replay(zoo_env, tmp_path):
    logs = tmp_path / "logs"
    run(
        [
            "rl_zoo3",
            "train",
            "--algo",
            "dreamerv3",
            "--env",
            "CartPole-v1",
            "-n",
            "64",
            "-f",
            str(logs),
            "--eval-freq",
            "32",
            "--eval-episodes",
            "1",
            "--save-replay-buffer",
            "--seed",
            "0",
            "-params",
            "n_envs:2",
            *TINY_DREAMERV3,
        ],
        zoo_env,
        tmp_path,
    )
    run_dir = logs / "dreamerv3" / "CartPole-v1_1"
    assert (run_dir / "CartPole-v1.zip").exists() and (run_dir / "replay_buffer.pkl").exists()
    config = dict(yaml.load((run_dir / "CartPole-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader))
    assert config["n_envs"] == 2 and config["model_size"] == "1m"


def test_optuna_through_the_explicit_entry_point_without_the_hook(zoo_env, tmp_path):
    out = run(
        [
            sys.executable,
            "-m",
            "sb3_worldmodels.zoo",
            "train",
            "--algo",
            "tdmpc2",
            "--env",
            "Pendulum-v1",
            *SHORT_PENDULUM,
            "-optimize",
            "--n-trials",
            "2",
            "--n-timesteps",
            "60",
            "--n-evaluations",
            "1",
            "--eval-episodes",
            "1",
            "--sampler",
            "random",
            "--pruner",
            "none",
            "-f",
            str(tmp_path / "logs"),
            "--seed",
            "0",
            "-params",
            *TINY_TDMPC2,
        ],
        {**zoo_env, "SB3_WORLDMODELS_ZOO_HOOK": "0"},
        tmp_path,
    )
    assert "Number of finished trials:  2" in out
    assert "learning_rate" in out and "temperature" in out


def test_hyperparameter_files_build_their_models():
    """Every entry names only constructor arguments, and the dm_control entries repeat actions."""
    import inspect

    from sb3_worldmodels import TDMPC2, DreamerV3

    zoo_only = {"n_timesteps", "n_envs", "env_wrapper", "normalize", "frame_stack", "policy_kwargs"}
    for algo, cls in (("tdmpc2", TDMPC2), ("dreamerv3", DreamerV3)):
        entries = yaml.load((HYPERPARAMS_DIR / f"{algo}.yml").read_text(), Loader=yaml.UnsafeLoader)
        accepted = set(inspect.signature(cls.__init__).parameters)
        assert "default" in entries and "Pendulum-v1" in entries
        for env_id, params in entries.items():
            unknown = set(params) - accepted - zoo_only
            assert not unknown, (algo, env_id, unknown)
            if env_id.startswith("dm_control/"):
                assert params["action_repeat"] == 2
                assert params["env_wrapper"] == [{"sb3_worldmodels.ActionRepeat": {"repeat": 2}}]


def test_samplers_search_only_cost_neutral_parameters():
    import inspect

    import optuna

    from sb3_worldmodels import TDMPC2, DreamerV3

    for algo, cls in (("tdmpc2", TDMPC2), ("dreamerv3", DreamerV3)):
        trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
        params = samplers.SAMPLERS[algo](trial, 1, 1, {})
        assert samplers.CONVERTERS[algo](trial.params) == params  # --trial-id reloads the same values
        assert set(params) <= set(inspect.signature(cls.__init__).parameters)
        assert not set(params) & {"model_size", "batch_size", "batch_length", "num_samples", "train_ratio"}
