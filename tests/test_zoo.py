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

import numpy as np
import pytest
import yaml

from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from sb3_worldmodels.zoo import HYPERPARAMS_DIR, samplers
from sb3_worldmodels.zoo.seeds import GROUP_KEYS, group_seeds


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


def zip_data(path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("data"))


def saved_seeds(data: dict) -> list | None:
    seeds = data.get("seeds")
    return seeds["items"] if isinstance(seeds, dict) else seeds


def run_failing(args, env, cwd, timeout=600) -> str:
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode != 0, f"{' '.join(args)} succeeded:\n{result.stdout[-2000:]}"
    return result.stdout + result.stderr


def test_a_seed_group_trains_evaluates_every_seed_resumes_and_plays_one_seed(zoo_env, tmp_path):
    logs = tmp_path / "logs"
    common = ["--algo", "tdmpc2", "--env", "Pendulum-v1", *SHORT_PENDULUM]
    train = ["rl_zoo3", "train", *common, "-f", str(logs)]
    out = run(
        [
            *train,
            "-n",
            "100",
            "--seed",
            "5",
            "--eval-freq",
            "90",
            "--eval-episodes",
            "1",
            "--save-replay-buffer",
        ]
        + ["-params", *TINY_TDMPC2, "n_seeds:2"],
        zoo_env,
        tmp_path,
    )
    assert "Seed group: seeds [5, 6], 1 envs each" in out
    run_dir = logs / "tdmpc2" / "Pendulum-v1_1"
    data = zip_data(run_dir / "Pendulum-v1.zip")
    assert saved_seeds(data) == [5, 6] and data["n_envs"] == 2 and data["num_timesteps"] >= 100
    assert (run_dir / "replay_buffer.pkl").exists()  # every seed's replay, one pickle-free file
    assert (run_dir / "0.monitor.csv").exists() and (run_dir / "1.monitor.csv").exists()
    assert saved_seeds(zip_data(run_dir / "best_model.zip")) == [5, 6]  # the best group, by the mean
    config = dict(yaml.load((run_dir / "Pendulum-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader))
    assert config["n_seeds"] == 2  # the run's record keeps it
    evaluations = np.load(run_dir / "evaluations.npz")
    assert evaluations["results"].shape == (1, 2) and list(evaluations["seeds"]) == [5, 6]
    mean = float(evaluations["results"][0].mean())
    assert f"mean over 2 seeds: {mean:.2f}" in out

    # enjoy plays one model: the zoo's command refuses a group, ours plays the seed it is given.
    enjoy = [*common, "-f", str(logs), "-n", "50", "--no-render"]
    refused = run_failing(["rl_zoo3", "enjoy", *enjoy], zoo_env, tmp_path)
    assert "holds a seed group (seeds [5, 6])" in refused and "--seed-index" in refused
    out = run(
        [sys.executable, "-m", "sb3_worldmodels.zoo", "enjoy", *enjoy, "--seed-index", "1"], zoo_env, tmp_path
    )
    assert "Episode Reward" in out

    # -i resumes the group (its seeds are the file's); the seed count must match.
    resume = [*train, "-n", "30", "--seed", "1", "-i", str(run_dir / "Pendulum-v1.zip")]
    refused = run_failing([*resume, "-params", *TINY_TDMPC2], zoo_env, tmp_path)
    assert "holds the seeds [5, 6] but this run trains one seed: resume it with n_seeds: 2" in refused
    out = run([*resume, "-params", *TINY_TDMPC2, "n_seeds:2"], zoo_env, tmp_path)
    assert "Loading pretrained agent" in out and "Loading replay buffer" in out
    resumed = sorted((logs / "tdmpc2").glob("Pendulum-v1_*/Pendulum-v1.zip"))[-1]
    data = zip_data(resumed)
    # As for one seed: the step counter restarts, the weights and every seed's replay carry over.
    assert saved_seeds(data) == [5, 6] and data["num_timesteps"] == 30


def test_optuna_trials_score_the_mean_over_their_seeds(zoo_env, tmp_path):
    trials = tmp_path / "trials"
    out = run(
        [
            "rl_zoo3",
            "train",
            "--algo",
            "tdmpc2",
            "--env",
            "Pendulum-v1",
            *SHORT_PENDULUM,
            "-optimize",
            "--n-trials",
            "1",
            "--n-timesteps",
            "60",
            "--n-evaluations",
            "2",
            "--eval-episodes",
            "1",
            "--sampler",
            "random",
            "--pruner",
            "median",
            "--optimization-log-path",
            str(trials),
            "-f",
            str(tmp_path / "logs"),
            "--seed",
            "3",
            "-params",
            *TINY_TDMPC2,
            "n_seeds:2",
        ],
        zoo_env,
        tmp_path,
    )
    assert "Number of finished trials:  1" in out
    evaluations = np.load(trials / "trial_0" / "evaluations.npz")
    assert evaluations["results"].shape == (2, 2) and list(evaluations["seeds"]) == [3, 4]
    value = float(out.split("Value: ")[1].split()[0])
    np.testing.assert_allclose(value, evaluations["results"][-1].mean(), rtol=1e-9)


@pytest.mark.parametrize("algo", ["tdmpc2", "dreamerv3"])
def test_n_seeds_builds_a_group_over_seed_major_envs(algo, tmp_path):
    """In process: the zoo's manager builds the group and n_envs envs per seed, seeded seed-major."""
    import argparse

    from sb3_worldmodels.zoo import register

    assert register()
    from rl_zoo3.exp_manager import ExperimentManager

    smoke = TDMPC2_SMOKE if algo == "tdmpc2" else DREAMERV3_SMOKE
    manager = ExperimentManager(
        argparse.Namespace(),
        algo,
        "Pendulum-v1",
        str(tmp_path),
        n_timesteps=10,
        eval_freq=-1,
        hyperparams={**smoke, "n_envs": 2, "n_seeds": 3},
        seed=5,
        verbose=0,
    )
    model, saved = manager.setup_experiment()
    assert model.seeds == (5, 6, 7) and model.n_envs == 6 and saved["n_seeds"] == 3
    assert model.env.unwrapped._seeds == [5, 6, 6, 7, 7, 8]
    model.env.close()


def test_a_trial_trains_the_configured_seeds_and_a_non_finite_update_prunes_it(tmp_path, monkeypatch):
    """In process: the zoo builds a trial's model with seed=None; a group's trial trains --seed, ...,
    and a NonFiniteUpdateError prunes the trial instead of ending the study."""
    import argparse

    import optuna

    from sb3_worldmodels import TDMPC2
    from sb3_worldmodels.common.training import NonFiniteUpdateError
    from sb3_worldmodels.zoo import register

    assert register()
    from rl_zoo3.exp_manager import ExperimentManager

    trained = []

    def diverge(model, *args, **kwargs):
        trained.append(model.seeds)
        raise NonFiniteUpdateError("Seed 4 (index 1): a non-finite update")

    monkeypatch.setattr(TDMPC2, "learn", diverge)
    manager = ExperimentManager(
        argparse.Namespace(),
        "tdmpc2",
        "Pendulum-v1",
        str(tmp_path),
        n_timesteps=10,
        hyperparams={**TDMPC2_SMOKE, "n_seeds": 2},
        optimize_hyperparameters=True,
        seed=3,
        verbose=0,
    )
    assert manager.setup_experiment() is None
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    with pytest.raises(optuna.TrialPruned):
        manager.objective(trial)
    assert trained == [(3, 4)]


def test_a_resumed_file_must_hold_the_runs_seed_count(tmp_path):
    """Checked from the file's header before loading (the zoo built the env for the run's count)."""
    from sb3_worldmodels import TDMPC2
    from sb3_worldmodels.zoo.seeds import GroupBuilder, saved_seed_list

    TDMPC2("Pendulum-v1", seed=2, **TDMPC2_SMOKE).save(tmp_path / "one.zip")
    TDMPC2("Pendulum-v1", seed=[2, 9], **TDMPC2_SMOKE).save(tmp_path / "two.zip")
    assert saved_seed_list(tmp_path / "one.zip") is None and saved_seed_list(tmp_path / "two.zip") == (2, 9)
    assert saved_seed_list(tmp_path / "missing.zip") is False
    with pytest.raises(ValueError, match="holds one seed but this run trains 2 seeds .* with no n_seeds"):
        GroupBuilder(TDMPC2, (0, 1)).load(tmp_path / "one.zip")
    with pytest.raises(
        ValueError, match=r"holds the seeds \[2, 9\] but this run trains 3 seeds .* n_seeds: 2"
    ):
        GroupBuilder(TDMPC2, (0, 1, 2)).load(tmp_path / "two.zip")
    assert GroupBuilder(TDMPC2, (0, 1)).load(tmp_path / "two.zip", seed=0).seeds == (2, 9)  # the file's


def test_group_seeds_from_hyperparameters():
    assert group_seeds({"n_seeds": 3}, 10) == (10, 11, 12)
    assert group_seeds({"seeds": [4, 1]}, 10) == (4, 1)
    assert group_seeds({"seeds": [4, 1], "n_seeds": 2}, 0) == (4, 1)
    assert group_seeds({"n_seeds": 1}, 10) is None and group_seeds({}, 10) is None
    params = {"n_seeds": 2, "seeds": None, "learning_rate": 1e-3}
    group_seeds(params, 0)
    assert params == {"learning_rate": 1e-3}  # never passed on to the constructor
    for bad, message in (
        ({"n_seeds": 0}, "n_seeds must be an int >= 1"),
        ({"n_seeds": True}, "n_seeds must be an int >= 1"),
        ({"n_seeds": 2.0}, "n_seeds must be an int >= 1"),
        ({"seeds": 3}, "seeds must be a list of ints"),
        ({"seeds": [1, 1]}, "must differ"),
        ({"seeds": [1, 2], "n_seeds": 3}, "disagrees"),
    ):
        with pytest.raises(ValueError, match=message):
            group_seeds(bad, 0)


def test_hyperparameter_files_build_their_models():
    """Every entry names only constructor arguments, and the dm_control entries repeat actions."""
    import inspect

    from sb3_worldmodels import TDMPC2, DreamerV3

    zoo_only = {
        "n_timesteps",
        "n_envs",
        "env_wrapper",
        "normalize",
        "frame_stack",
        "policy_kwargs",
        *GROUP_KEYS,
    }
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
