"""One Optuna study shared by zoo workers on several machines: ``rl_zoo3 train -optimize --storage URL
--study-name S`` on each machine (docs/beyond-one-machine.md).

rl_zoo3 already shares a study: ``--storage`` is a database URL (Optuna's ``RDBStorage``: PostgreSQL,
MySQL, SQLite) or a ``.log`` file (Optuna's ``JournalStorage``), ``--max-total-trials`` bounds the
study's trials (COMPLETE, PRUNED and RUNNING ones). :func:`patch_experiment_manager` adds, for a run
with ``--storage``:

- each worker's sampler draws from its own random stream (:class:`SharedStudy`): the zoo seeds it with
  ``--seed``, so workers given one ``--seed`` (a seed group's trials train ``--seed, ...``) would
  sample the same hyperparameters;
- each trial records the worker that ran it as its user attribute ``worker`` (``host:pid``);
- with ``SB3WM_OPTUNA_HEARTBEAT=<seconds>`` (:func:`heartbeat_settings`), a heartbeat: a worker that
  dies mid-trial (SIGKILL, a lost machine) no longer leaves its trial RUNNING for ever, counted against
  ``--max-total-trials``. Every running trial records a heartbeat every ``interval`` seconds; a trial
  without one for ``grace`` seconds (``SB3WM_OPTUNA_GRACE``, default twice the interval) is set FAIL by
  the next worker that starts a trial, ends one (:class:`MaxTrialsFailingStale`) or joins the study,
  and retried once with the same hyperparameters (``RetryHeartbeatStaleTrialCallback(max_retry=1)``):
  the study still finishes ``--max-total-trials`` trials, FAIL ones not counted. :func:`build_storage`
  builds Optuna's ``RDBStorage`` with it, or for a ``.log`` file :class:`HeartbeatJournalStorage`
  (Optuna's journal storage has none).

Without ``--storage`` the zoo runs as before; without the heartbeat setting it builds its storage itself.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, TrialState

HEARTBEAT_VARIABLE = "SB3WM_OPTUNA_HEARTBEAT"
"""Seconds between a running trial's heartbeats; unset, empty, ``0`` or ``off``: no heartbeat."""
GRACE_VARIABLE = "SB3WM_OPTUNA_GRACE"
"""Seconds without a heartbeat before a running trial is failed (default: twice the interval)."""
MAX_RETRY = 1
"""Times a trial whose worker died is run again with the same hyperparameters."""
WORKER_ATTR = "worker"
"""The trial user attribute naming the worker that ran it: ``host:pid``."""
JOURNAL_HEARTBEAT_ATTR = "sb3wm_heartbeat"
"""The trial system attribute of :class:`HeartbeatJournalStorage`: ``[trial_id, unix time]``."""

_PATCHED_MARK = "_sb3_worldmodels_sweeps"
_OFF = ("", "0", "off", "no", "false")


@dataclass(frozen=True)
class HeartbeatSettings:
    """Heartbeat of a shared study's running trials."""

    interval: int
    """Seconds between heartbeats."""
    grace: int
    """Seconds without a heartbeat before the trial is failed (> interval)."""


def _positive_seconds(raw: str, name: str) -> int:
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ValueError(f"{name}={raw!r}: give a whole number of seconds > 0 (Optuna counts whole seconds).")
    return seconds


def heartbeat_settings(environ: Mapping[str, str] = os.environ) -> HeartbeatSettings | None:
    """The heartbeat asked for by ``SB3WM_OPTUNA_HEARTBEAT`` / ``SB3WM_OPTUNA_GRACE``, or None."""
    raw = environ.get(HEARTBEAT_VARIABLE, "").strip()
    grace_raw = environ.get(GRACE_VARIABLE, "").strip()
    if raw.lower() in _OFF:
        if grace_raw:
            raise ValueError(
                f"{GRACE_VARIABLE}={grace_raw!r} without a heartbeat: set {HEARTBEAT_VARIABLE}=<seconds> too."
            )
        return None
    interval = _positive_seconds(raw, HEARTBEAT_VARIABLE)
    grace = _positive_seconds(grace_raw, GRACE_VARIABLE) if grace_raw else 2 * interval
    if grace <= interval:
        raise ValueError(
            f"{GRACE_VARIABLE}={grace} must exceed {HEARTBEAT_VARIABLE}={interval}: a live trial would be "
            f"failed between two heartbeats (default: twice the interval)."
        )
    return HeartbeatSettings(interval, grace)


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's ``JournalStorage`` with the heartbeat of its ``RDBStorage``.

    A heartbeat is the trial's system attribute :data:`JOURNAL_HEARTBEAT_ATTR`, ``[trial_id, time]``
    (one journal line per ``interval`` seconds of a running trial; the trial id keeps a retry from
    reading the heartbeat copied from the trial it retries). A RUNNING trial is stale when its last
    heartbeat is older than ``grace`` seconds by the reader's ``clock``: the machines' clocks must agree
    to well within the grace period (NTP does). A trial without a heartbeat is never stale, as in
    ``RDBStorage``."""

    def __init__(
        self,
        backend: BaseJournalBackend,
        heartbeat_interval: int,
        grace_period: int,
        heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback
        self.clock = clock

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, JOURNAL_HEARTBEAT_ATTR, [trial_id, self.clock()])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker has failed it (a heartbeat later than the grace period)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = self.clock()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(JOURNAL_HEARTBEAT_ATTR)
            if beat is not None and beat[0] == trial._trial_id and now - beat[1] > self.grace_period:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.heartbeat_stale_trial_callback


def _retry_callback() -> Callable[[optuna.Study, FrozenTrial], None]:
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:
        raise RuntimeError(
            f"{HEARTBEAT_VARIABLE} needs optuna >= 4.9 (RetryHeartbeatStaleTrialCallback); this is optuna "
            f"{optuna.__version__}: pip install 'sb3_worldmodels[sweeps]'."
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return retry(max_retry=MAX_RETRY)


def build_storage(storage: str, settings: HeartbeatSettings) -> BaseStorage:
    """The zoo's ``--storage`` with a heartbeat: a ``.log`` path (as rl_zoo3 reads it) gives a
    :class:`HeartbeatJournalStorage` on that file, anything else Optuna's ``RDBStorage`` of that URL."""
    callback = _retry_callback()
    if storage.endswith(".log"):
        Path(storage).parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(storage)
        return HeartbeatJournalStorage(backend, settings.interval, settings.grace, callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(
            storage,
            heartbeat_interval=settings.interval,
            grace_period=settings.grace,
            heartbeat_stale_trial_callback=callback,
        )


def fail_stale_trials(study: optuna.Study) -> None:
    """Optuna's ``fail_stale_trials`` (FAIL and retry the trials past their grace period), quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class MaxTrialsFailingStale(MaxTrialsCallback):
    """rl_zoo3's ``MaxTrialsCallback`` (after each trial: stop when the study holds ``n_trials`` in
    ``states``) that fails the stale trials first, so that a dead worker's trial past its grace period
    is no longer counted as RUNNING and its retry is run."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        fail_stale_trials(study)
        super().__call__(study, trial)


class SharedStudy:
    """The ``optuna`` module as ``rl_zoo3.exp_manager`` reads it during one optimization on a shared
    storage: ``create_study`` opens ``storage`` when given (in place of what rl_zoo3 passes), reseeds the
    sampler from the system's entropy (each worker its own stream, whatever its ``--seed``) and fails the
    stale trials at once (a worker that joins a study whose workers all died runs their retries)."""

    def __init__(self, storage: BaseStorage | None) -> None:
        self.storage = storage

    def create_study(self, **kwargs: Any) -> optuna.Study:
        if self.storage is not None:
            kwargs = {**kwargs, "storage": self.storage}
        study = optuna.create_study(**kwargs)
        study.sampler.reseed_rng()
        fail_stale_trials(study)
        return study

    def __getattr__(self, name: str) -> Any:
        return getattr(optuna, name)


def worker_name() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


PATCHED_NAMES = ("optuna", "MaxTrialsCallback")
"""The names of ``rl_zoo3.exp_manager`` replaced during an optimization on a shared storage."""
PATCHED_METHODS = ("hyperparameters_optimization", "objective")
"""The methods of ``ExperimentManager`` wrapped."""


def missing_names(exp_manager: Any) -> list[str]:
    """What this rl_zoo3's ``exp_manager`` lacks of the names that shared studies patch."""
    manager = getattr(exp_manager, "ExperimentManager", None)
    missing = [name for name in PATCHED_NAMES if not hasattr(exp_manager, name)]
    return missing + [f"ExperimentManager.{name}" for name in PATCHED_METHODS if not hasattr(manager, name)]


def patch_experiment_manager(exp_manager: Any) -> None:
    """Shared studies for ``exp_manager.ExperimentManager`` (idempotent; every algorithm, only for a
    run with ``--storage``)."""
    manager = exp_manager.ExperimentManager
    if getattr(manager.hyperparameters_optimization, _PATCHED_MARK, False):
        return
    optimize, objective = manager.hyperparameters_optimization, manager.objective

    @functools.wraps(optimize)
    def hyperparameters_optimization(self: Any) -> None:
        if self.storage is None:
            return optimize(self)
        settings = heartbeat_settings()
        storage = None if settings is None else build_storage(self.storage, settings)
        saved = exp_manager.optuna, exp_manager.MaxTrialsCallback
        exp_manager.optuna, exp_manager.MaxTrialsCallback = SharedStudy(storage), MaxTrialsFailingStale
        try:
            return optimize(self)
        finally:
            exp_manager.optuna, exp_manager.MaxTrialsCallback = saved

    @functools.wraps(objective)
    def _objective(self: Any, trial: optuna.Trial) -> float:
        if self.storage is not None:
            trial.set_user_attr(WORKER_ATTR, worker_name())
        return objective(self, trial)

    setattr(hyperparameters_optimization, _PATCHED_MARK, True)
    manager.hyperparameters_optimization = hyperparameters_optimization
    manager.objective = _objective
