"""One Optuna study shared by zoo workers (sb3_worldmodels/zoo/sweeps.py, scripts/postgres.sh).

The storages and the zoo's optimization run in process on SQLite, a journal file and a PostgreSQL
server that scripts/postgres.sh starts (the PostgreSQL tests skip, saying why, only where no server can
be had). The second tier runs ``rl_zoo3`` workers in subprocesses on one study and kills one mid-trial.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from sb3_worldmodels.zoo import register, samplers, sweeps
from sb3_worldmodels.zoo.sweeps import (
    GRACE_VARIABLE,
    HEARTBEAT_VARIABLE,
    HeartbeatJournalStorage,
    HeartbeatSettings,
    build_storage,
    heartbeat_settings,
)
from tests.test_zoo import SHORT_PENDULUM, as_params

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"
# The heartbeat is written by hand here, outside Study.optimize (Optuna warns).
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")

NO_SERVER = 3
"""scripts/postgres.sh's exit status when no PostgreSQL server can be had."""


def script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def postgres_url():
    # Under /tmp: the server runs as the user postgres, who must reach the folder (pytest's are private).
    folder = tempfile.mkdtemp(prefix="sb3wm-pg-", dir="/tmp" if os.path.isdir("/tmp") else None)
    started = script("start", folder, timeout=900)
    if started.returncode == NO_SERVER:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"no PostgreSQL server can be had here: {started.stderr.strip()}")
    assert started.returncode == 0, started.stdout + started.stderr
    yield started.stdout.strip().splitlines()[-1]
    script("stop", folder)
    shutil.rmtree(folder, ignore_errors=True)


def load_study(storage: str, study_name: str) -> optuna.Study:
    """The study as the zoo's --storage names it (a ``.log`` path is a journal file)."""
    if storage.endswith(".log"):
        return optuna.load_study(storage=JournalStorage(JournalFileBackend(storage)), study_name=study_name)
    return optuna.load_study(storage=storage, study_name=study_name)


def states(study: optuna.Study) -> dict[int, TrialState]:
    return {trial.number: trial.state for trial in study.get_trials(deepcopy=False)}


# ---------------------------------------------------------------------- settings and storages
def test_heartbeat_settings_from_the_environment():
    assert heartbeat_settings({}) is None and heartbeat_settings({HEARTBEAT_VARIABLE: "off"}) is None
    assert heartbeat_settings({HEARTBEAT_VARIABLE: "30"}) == HeartbeatSettings(30, 60)
    assert heartbeat_settings({HEARTBEAT_VARIABLE: " 30 ", GRACE_VARIABLE: "45"}) == HeartbeatSettings(30, 45)
    for bad, message in (
        ({HEARTBEAT_VARIABLE: "1.5"}, "whole number of seconds > 0"),
        ({HEARTBEAT_VARIABLE: "-2"}, "whole number of seconds > 0"),
        ({HEARTBEAT_VARIABLE: "10", GRACE_VARIABLE: "soon"}, "SB3WM_OPTUNA_GRACE='soon'"),
        ({HEARTBEAT_VARIABLE: "10", GRACE_VARIABLE: "10"}, "must exceed SB3WM_OPTUNA_HEARTBEAT=10"),
        ({GRACE_VARIABLE: "10"}, "without a heartbeat: set SB3WM_OPTUNA_HEARTBEAT"),
    ):
        with pytest.raises(ValueError, match=message):
            heartbeat_settings(bad)


def test_journal_heartbeat_fails_a_silent_trial_and_retries_it_once(tmp_path):
    """Two workers on one journal file and one clock: the dead worker's trial is failed after its grace
    period, retried once with its hyperparameters; the retry's copied heartbeat does not count."""
    now = [1000.0]
    path = str(tmp_path / "study.log")

    def worker() -> HeartbeatJournalStorage:
        return HeartbeatJournalStorage(
            JournalFileBackend(path), 5, 12, sweeps._retry_callback(), clock=lambda: now[0]
        )

    dead = optuna.create_study(storage=worker(), study_name="s")
    alive = optuna.load_study(storage=worker(), study_name="s")
    trial = dead.ask()
    x = trial.suggest_float("x", 0.0, 1.0)
    dead._storage.record_heartbeat(trial._trial_id)
    quiet = alive.ask()  # no heartbeat yet: never stale, as in RDBStorage
    now[0] += 12.0
    sweeps.fail_stale_trials(alive)
    assert states(alive) == {0: TrialState.RUNNING, 1: TrialState.RUNNING}  # exactly the grace: kept
    now[0] += 0.5
    sweeps.fail_stale_trials(alive)
    sweeps.fail_stale_trials(dead)  # a second worker finds it failed already: one retry only
    assert states(alive) == {0: TrialState.FAIL, 1: TrialState.RUNNING, 2: TrialState.WAITING}
    dead._storage.record_heartbeat(trial._trial_id)  # a late heartbeat of a failed trial is ignored

    retry = alive.ask()
    assert retry.number == 2 and retry.suggest_float("x", 0.0, 1.0) == x
    attrs = alive._storage.get_trial(retry._trial_id).system_attrs
    assert attrs["failed_trial"] == 0 and attrs[sweeps.JOURNAL_HEARTBEAT_ATTR][0] == trial._trial_id  # copied
    now[0] += 100.0
    sweeps.fail_stale_trials(alive)
    assert alive.trials[2].state == TrialState.RUNNING  # the copy is not its heartbeat
    alive._storage.record_heartbeat(retry._trial_id)
    now[0] += 13.0
    sweeps.fail_stale_trials(alive)
    assert states(alive) == {0: TrialState.FAIL, 1: TrialState.RUNNING, 2: TrialState.FAIL}  # retried once
    alive.tell(quiet, 1.0)


def test_rdb_heartbeat_fails_a_silent_trial_and_retries_it(tmp_path):
    storage = build_storage(f"sqlite:///{tmp_path / 'study.db'}", HeartbeatSettings(1, 2))
    assert isinstance(storage, optuna.storages.RDBStorage) and storage.grace_period == 2
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    x = trial.suggest_float("x", 0.0, 1.0)
    storage.record_heartbeat(trial._trial_id)
    time.sleep(3.2)  # the database's clock, whole seconds
    sweeps.fail_stale_trials(study)
    assert states(study) == {0: TrialState.FAIL, 1: TrialState.WAITING}
    assert study.ask().suggest_float("x", 0.0, 1.0) == x


def test_a_journal_path_gets_the_journal_heartbeat(tmp_path):
    storage = build_storage(str(tmp_path / "deep" / "study.log"), HeartbeatSettings(3, 7))
    assert isinstance(storage, HeartbeatJournalStorage) and (tmp_path / "deep").is_dir()
    assert storage.get_heartbeat_interval() == 3 and storage.grace_period == 7
    assert optuna.storages._heartbeat.is_heartbeat_enabled(storage)


def test_the_patch_records_the_worker_and_restores_the_zoos_names():
    """On a stand-in for rl_zoo3.exp_manager: the worker attribute with a storage only, the shared-study
    names during the optimization only."""
    seen = {}

    class Manager:
        storage: str | None = "sqlite://"

        def objective(self, trial):
            return 1.0

        def hyperparameters_optimization(self):
            seen["optuna"], seen["callback"] = module.optuna, module.MaxTrialsCallback

    module = argparse.Namespace(
        ExperimentManager=Manager, optuna=optuna, MaxTrialsCallback=optuna.study.MaxTrialsCallback
    )
    assert sweeps.missing_names(module) == []
    sweeps.patch_experiment_manager(module)
    sweeps.patch_experiment_manager(module)  # idempotent
    manager = Manager()
    manager.hyperparameters_optimization()
    assert isinstance(seen["optuna"], sweeps.SharedStudy) and seen["optuna"].storage is None  # no heartbeat
    assert seen["callback"] is sweeps.MaxTrialsFailingStale
    assert module.optuna is optuna and module.MaxTrialsCallback is optuna.study.MaxTrialsCallback
    trial = optuna.create_study().ask()
    assert manager.objective(trial) == 1.0 and trial.user_attrs["worker"] == sweeps.worker_name()
    manager.storage = None
    seen.clear()
    manager.hyperparameters_optimization()
    assert seen["optuna"] is optuna  # no storage: the zoo's own
    trial = optuna.create_study().ask()
    manager.objective(trial)
    assert "worker" not in trial.user_attrs
    assert sweeps.missing_names(argparse.Namespace(optuna=optuna)) == [
        "MaxTrialsCallback",
        "ExperimentManager.hyperparameters_optimization",
        "ExperimentManager.objective",
    ]


# ---------------------------------------------------------------------- the zoo's optimization
def _zoo_manager(storage: str, study_name: str, logs: Path, max_total_trials: int):
    assert register()
    from rl_zoo3.exp_manager import ExperimentManager

    manager = ExperimentManager(
        argparse.Namespace(),
        "tdmpc2",
        "Pendulum-v1",
        str(logs),
        n_timesteps=10,
        hyperparams=dict(TDMPC2_SMOKE),
        optimize_hyperparameters=True,
        storage=storage,
        study_name=study_name,
        max_total_trials=max_total_trials,
        sampler="random",
        pruner="none",
        no_optim_plots=True,
        seed=0,
        verbose=0,
    )
    assert manager.setup_experiment() is None
    return manager


def _instant_objective(trial: optuna.Trial) -> float:
    """The zoo's sampling, no training: the value is a sampled hyperparameter."""
    assert optuna.storages._heartbeat.is_heartbeat_enabled(trial.study._storage)
    return samplers.SAMPLERS["tdmpc2"](trial, 1, 1, {})["rho"]


@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgresql"])
def test_the_zoo_fails_a_dead_workers_trial_retries_it_and_keeps_the_budget(
    kind, tmp_path, monkeypatch, request
):
    """A worker joins a study whose only worker died mid-trial: the trial is failed, its retry runs with
    its hyperparameters, the study ends with --max-total-trials finished trials; further workers with
    the same --seed sample other hyperparameters than each other."""
    if kind == "postgresql":
        storage = request.getfixturevalue("postgres_url")
    else:
        storage = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else str(tmp_path / "study.log")
    study_name = f"budget_{time.time_ns()}"  # one PostgreSQL server for the module
    monkeypatch.setenv(HEARTBEAT_VARIABLE, "1")
    monkeypatch.setenv(GRACE_VARIABLE, "2")
    dead_storage = build_storage(storage, HeartbeatSettings(1, 2))
    study = optuna.create_study(storage=dead_storage, study_name=study_name, direction="maximize")
    dead = study.ask()
    dead_params = samplers.SAMPLERS["tdmpc2"](dead, 1, 1, {})
    dead_storage.record_heartbeat(dead._trial_id)
    time.sleep(3.2)  # past the grace period

    # Counted as RUNNING, the dead trial fills --max-total-trials 1: the zoo alone would not even start.
    manager = _zoo_manager(storage, study_name, tmp_path / "logs", max_total_trials=1)
    manager.objective = _instant_objective
    manager.hyperparameters_optimization()
    from rl_zoo3 import exp_manager

    assert exp_manager.optuna is optuna and exp_manager.MaxTrialsCallback is optuna.study.MaxTrialsCallback
    trials = load_study(storage, study_name).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].system_attrs["failed_trial"] == 0 and trials[1].value == dead_params["rho"]
    assert trials[1].params == dead.params

    for budget in (3, 5):  # two more workers, both --seed 0 (the zoo seeds the random sampler with it)
        worker = _zoo_manager(storage, study_name, tmp_path / "logs", max_total_trials=budget)
        worker.objective = _instant_objective
        worker.hyperparameters_optimization()
    trials = load_study(storage, study_name).trials
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.COMPLETE] * 5
    rhos = [t.params["rho"] for t in trials[2:]]
    assert len(set(rhos)) == 4, rhos


def test_the_postgres_script_serves_optuna_on_a_unix_socket_only(postgres_url):
    import sqlalchemy

    assert postgres_url.startswith("postgresql+psycopg2://postgres@/optuna?host=/")
    engine = sqlalchemy.create_engine(postgres_url)
    with engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SHOW listen_addresses")).scalar() == ""
    engine.dispose()
    folder = postgres_url.split("host=")[1]
    again = script("start", folder)
    assert again.returncode == 0 and again.stdout.strip() == postgres_url  # already running: the same URL
    assert (Path(folder).stat().st_mode & 0o777) == 0o700


# ---------------------------------------------------------------------- workers in subprocesses
WORKER_SETTINGS = {
    # The trials act and are evaluated without an update (seed_steps / learning_starts past
    # --n-timesteps): each builds its model, acts through its episodes and is scored in seconds.
    "tdmpc2": [*as_params({**TDMPC2_SMOKE, "seed_steps": 1000}), "n_seeds:2"],
    "dreamerv3": as_params({**DREAMERV3_SMOKE, "learning_starts": 1000}),
}


LONGER_THAN_THE_TEST = 1_000_000
"""The killed worker's ``--n-timesteps``: its trial is still running when it is killed (the others'
trials of 80 steps take about a second once compiled). Not a hyperparameter: its retry runs 80."""


def start_worker(
    algo: str, storage: str, study_name: str, trials: int, folder: Path, env: dict, n_timesteps: int = 80
):
    """One ``rl_zoo3 train -optimize`` worker on the shared study, its output in ``folder``."""
    command = ["rl_zoo3", "train", "--algo", algo, "--env", "Pendulum-v1", *SHORT_PENDULUM, "-optimize"]
    command += ["--storage", storage, "--study-name", study_name, "--max-total-trials", str(trials)]
    command += ["--n-timesteps", str(n_timesteps), "--n-evaluations", "2", "--eval-episodes", "1"]
    command += ["--seed", "0"]
    command += ["--optimization-log-path", str(folder / "trials"), "-f", str(folder / "logs")]
    command += ["--no-optim-plots", "-params", *WORKER_SETTINGS[algo]]
    output = open(folder / f"worker_{time.time_ns()}.txt", "w")  # closed by output_of
    process = subprocess.Popen(command, env=env, cwd=folder, stdout=output, stderr=subprocess.STDOUT)
    process.output = output  # type: ignore[attr-defined]
    return process


def wait_for_workers(workers: list) -> None:
    for worker in workers:
        worker.wait(timeout=300)
        out = output_of(worker)
        assert worker.returncode == 0, out[-4000:]
        assert "Number of finished trials" in out


def output_of(process) -> str:
    process.output.close()
    return Path(process.output.name).read_text()


def worker_of(process) -> str:
    return f"{socket.gethostname()}:{process.pid}"


def running_trial_of(process, others, storage: str, study_name: str, timeout: float = 240) -> FrozenTrial:
    """The worker's RUNNING trial, once it has sampled its hyperparameters and every one of the
    ``others`` has started a trial (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the worker ended early:\n{output_of(process)[-3000:]}"
        try:
            trials = load_study(storage, study_name).get_trials()
        except KeyError:  # the study does not exist yet
            trials = []
        started = {trial.user_attrs.get("worker") for trial in trials}
        for trial in trials:
            if (
                trial.state == TrialState.RUNNING
                and trial.user_attrs.get("worker") == worker_of(process)
                and len(trial.params) >= 4
                and started >= {worker_of(other) for other in others}
            ):
                return trial
        time.sleep(0.2)
    raise AssertionError(f"no running trial of {worker_of(process)} within {timeout} s")


@pytest.mark.skipif(shutil.which("rl_zoo3") is None, reason="rl_zoo3 is not installed")
@pytest.mark.parametrize(
    "kind, algo, trials",
    [("postgresql", "tdmpc2", 6), ("journal", "dreamerv3", 4)],
    ids=["postgresql-tdmpc2", "journal-dreamerv3"],
)
def test_zoo_workers_share_a_study_and_a_killed_workers_trial_fails(kind, algo, trials, tmp_path, request):
    """Three ``rl_zoo3`` workers on one study of ``trials``; one is killed (SIGKILL) mid-trial. Its trial
    ends FAIL through the heartbeat and is retried with its hyperparameters (by a survivor, or, when the
    survivors filled the budget within the grace period of the kill, by a worker that joins after
    them, as the docs say); every other trial is
    COMPLETE or PRUNED, ``trials`` of them, their numbers unique; a seed group's trial (TD-MPC2) scores
    the mean over its seeds."""
    storage = request.getfixturevalue("postgres_url") if kind == "postgresql" else str(tmp_path / "study.log")
    study_name = f"workers_{algo}_{time.time_ns()}"
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path / "jax_cache")
    env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": cache,
        "PYTHONWARNINGS": "ignore",
        HEARTBEAT_VARIABLE: "1",
        GRACE_VARIABLE: "3",
    }
    env.pop("SB3_WORLDMODELS_ZOO_HOOK", None)
    workers = []
    try:
        for n_timesteps in (LONGER_THAN_THE_TEST, 80, 80):  # started a little apart, as machines are
            workers.append(start_worker(algo, storage, study_name, trials, tmp_path, env, n_timesteps))
            time.sleep(2.0)
        # Mid-trial, while the other two run trials of their own.
        killed = running_trial_of(workers[0], workers[1:], storage, study_name)
        time.sleep(1.0)
        workers[0].send_signal(signal.SIGKILL)
        assert workers[0].wait(timeout=60) == -signal.SIGKILL
        wait_for_workers(workers[1:])
        (dead,) = [t for t in load_study(storage, study_name).trials if t.number == killed.number]
        if dead.state == TrialState.RUNNING:
            # The survivors filled the budget within the grace period of the kill (the killed trial
            # still counted as RUNNING): as documented, a worker that joins later fails and retries it.
            time.sleep(int(env[GRACE_VARIABLE]) + 1)
            workers.append(start_worker(algo, storage, study_name, trials, tmp_path, env))
            wait_for_workers(workers[3:])
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    study = load_study(storage, study_name)
    by_number = {trial.number: trial for trial in study.trials}
    assert sorted(by_number) == list(range(trials + 1))  # unique, no gap: the budget and the dead trial
    assert by_number[killed.number].state == TrialState.FAIL
    finished = [t for t in study.trials if t.number != killed.number]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in finished), [
        t.state for t in finished
    ]
    (retry,) = [t for t in finished if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.params == killed.params
    survivors = {worker_of(worker) for worker in workers[1:]}
    assert {t.user_attrs["worker"] for t in finished} <= survivors
    assert len({tuple(sorted(t.params.items())) for t in finished}) == trials  # no worker repeated another
    if algo == "tdmpc2":  # a group of seeds 0 and 1 in every trial: the mean over them is the score
        for trial in finished:
            evaluations = np.load(tmp_path / "trials" / f"trial_{trial.number}" / "evaluations.npz")
            assert list(evaluations["seeds"]) == [0, 1]
            if trial.state == TrialState.COMPLETE:
                np.testing.assert_allclose(trial.value, evaluations["results"][-1].mean(), rtol=1e-9)
