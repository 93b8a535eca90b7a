"""Seed groups from rl_zoo3: ``n_seeds: N`` in a hyperparameter entry (or ``-params n_seeds:N``) trains
the seeds ``[S, ..., S + N - 1]`` (``S`` the zoo's ``--seed``) as one model, ``seeds: [a, b, c]`` names
them. See docs/zoo.md.

The zoo builds the env and the model itself; :func:`patch_experiment_manager` makes it build a group's:

- ``_preprocess_hyperparams`` takes ``n_seeds`` / ``seeds`` out of the hyperparameters (the saved
  ``config.yml`` keeps them) and keeps the seeds on the manager;
- ``create_envs`` builds ``n_envs`` envs per seed (``n_envs x N``, seed-major) for training; the eval
  env stays as the zoo makes it. The model seeds them (:meth:`SeedGroup.set_random_seed`);
- the zoo's ``ALGOS`` as ``rl_zoo3.exp_manager`` reads it (:class:`ZooAlgos`) gives our algorithms as
  :class:`GroupBuilder`, which passes the group's seed list where the zoo passes one int (or None:
  every Optuna trial trains the same seeds) and checks the file of a resumed run;
- ``EvalCallback`` and ``TrialEvalCallback`` as the manager makes them evaluate every seed
  (:class:`~sb3_worldmodels.common.seed_eval.SeedGroupEvalCallback`, the package's): the zoo's mean
  reward, best model and Optuna report are the mean over the seeds;
- ``objective`` prunes a trial of ours whose update is not finite (:class:`NonFiniteUpdateError`, in
  any seed), as the zoo prunes its own algorithms' NaN trials, instead of ending the study.

``rl_zoo3 enjoy`` plays one model: :func:`patch_enjoy` makes it read our algorithms as
:class:`EnjoyLoader`, which refuses a group's file with the reason, or gives the seed that
``sb3wm-zoo enjoy --seed-index i`` names.

A manager for another algorithm, or for ours without ``n_seeds``, runs exactly as before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.checkpoints import checkpoint_header
from sb3_worldmodels.common.seed_eval import SeedGroupEvalCallback
from sb3_worldmodels.common.seed_lanes import seed_list
from sb3_worldmodels.common.training import NonFiniteUpdateError

GROUP_KEYS = ("n_seeds", "seeds")
"""Hyperparameter keys that make a seed group; the zoo never passes them to the constructor."""

_PATCHED_MARK = "_sb3_worldmodels_seed_groups"


# ---------------------------------------------------------------------- the seeds of a run
def group_seeds(hyperparams: dict[str, Any], base_seed: int) -> tuple[int, ...] | None:
    """Pop ``n_seeds`` and ``seeds`` from ``hyperparams``: the group's seeds, or None for one seed.

    ``n_seeds: N`` gives ``base_seed, ..., base_seed + N - 1`` (``n_seeds: 1`` is a plain run);
    ``seeds: [a, b]`` gives those seeds (with ``n_seeds``, their number must agree)."""
    n_seeds = hyperparams.pop("n_seeds", None)
    listed = hyperparams.pop("seeds", None)
    if n_seeds is not None and (isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1):
        raise ValueError(f"n_seeds must be an int >= 1 (the seeds trained as one model), got {n_seeds!r}.")
    if listed is not None:
        if isinstance(listed, (int, np.integer)):
            raise ValueError(
                f"seeds must be a list of ints (got {listed!r}); the zoo's --seed sets one seed, "
                "n_seeds:N trains --seed, ..., --seed + N - 1."
            )
        seeds = seed_list(list(listed) if isinstance(listed, tuple) else listed)
        assert seeds is not None
        if n_seeds is not None and n_seeds != len(seeds):
            raise ValueError(f"n_seeds: {n_seeds} disagrees with seeds: {list(seeds)} ({len(seeds)} seeds).")
        return seeds
    if n_seeds is None or n_seeds == 1:
        return None
    return tuple(range(int(base_seed), int(base_seed) + n_seeds))


# ---------------------------------------------------------------------- building the model
def saved_seed_list(path: Any) -> tuple[int, ...] | None | Literal[False]:
    """The seeds of a checkpoint's group (None for a single-seed model), read from its JSON header
    without loading it; False when the file cannot be read so (``load`` then says why)."""
    what = safe_io.describe(path, "the checkpoint")
    try:
        members = safe_io.read_zip(path, what)
        header = checkpoint_header(members["data"], what)
        seeds = safe_io.decode(header["seeds"]) if header.get("seeds") is not None else None
    except (KeyError, TypeError, ValueError):
        return False
    return None if seeds is None else tuple(int(s) for s in seeds)


class GroupBuilder:
    """Stands for one of our algorithm classes in the zoo's experiment manager: called (a new model)
    with the group's seed list in place of the zoo's seed, ``load`` (``-i``, a resumed run) checks that
    the file holds the same number of seeds; every other attribute is the class's."""

    def __init__(self, cls: type, seeds: tuple[int, ...] | None) -> None:
        self.cls = cls
        self.seeds = seeds

    def __call__(self, *args: Any, seed: Any = None, **kwargs: Any) -> Any:
        return self.cls(*args, seed=seed if self.seeds is None else list(self.seeds), **kwargs)

    def load(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """The model of a checkpoint, refused before loading when its seed count is not this run's
        (the zoo built the env for this run's count)."""
        saved, configured = saved_seed_list(path), self.seeds
        if saved is not False and (
            (saved is None) != (configured is None) or (saved and len(saved) != len(configured or ()))
        ):
            raise ValueError(
                f"{path} holds {'one seed' if saved is None else f'the seeds {list(saved)}'} but this run "
                f"trains {'one seed' if configured is None else f'{len(configured)} seeds (n_seeds)'}: "
                f"resume it with {'no n_seeds' if saved is None else f'n_seeds: {len(saved)}'}."
            )
        if configured is not None:
            kwargs.pop("seed", None)  # the file's seeds rule (and seed the envs, seed-major)
        return self.cls.load(path, *args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)


class EnjoyLoader:
    """Stands for one of our algorithm classes in ``rl_zoo3 enjoy``, which plays one model with
    ``model.predict``: a seed group's file gives the seed named by ``seed_index`` (``sb3wm-zoo enjoy
    --seed-index i``) as an ordinary model, and without one is refused with the reason."""

    seed_index: int | None = None
    """Set for the process by ``sb3wm-zoo enjoy --seed-index i``."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def load(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        model = self.cls.load(path, *args, **kwargs)  # type: ignore[attr-defined]
        seeds = getattr(model, "seeds", None)
        if seeds is None:
            if self.seed_index not in (None, 0):
                raise ValueError(f"--seed-index {self.seed_index}: {path} holds one seed (give 0 or none).")
            return model
        if self.seed_index is None:
            raise ValueError(
                f"{path} holds a seed group (seeds {list(seeds)}) and rl_zoo3 enjoy plays one model: "
                f"pick a seed with `sb3wm-zoo enjoy ... --seed-index i` (i in 0..{len(seeds) - 1}), or "
                f"in Python `{self.cls.__name__}.load(path).seed_model(i)`."
            )
        return model.seed_model(self.seed_index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)


class ZooAlgos(Mapping):
    """``rl_zoo3.utils.ALGOS`` as one rl_zoo3 module reads it: the same entries, with ``builders`` in
    place of our classes. A read-through view: keys registered later show."""

    def __init__(self, algos: Mapping, builders: dict[str, Any]) -> None:
        self.algos = algos
        self.builders = builders

    def __getitem__(self, key: str) -> Any:
        return self.builders[key] if key in self.builders else self.algos[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.algos)

    def __len__(self) -> int:
        return len(self.algos)


# ---------------------------------------------------------------------- evaluation
def _trial_eval_callback(trial_eval_callback: type) -> type:
    """rl_zoo3's ``TrialEvalCallback`` over :class:`SeedGroupEvalCallback` (its ``super()._on_step()``
    evaluates every seed): its report to the trial at each evaluation, what the pruner sees, and the
    trial's value are the mean over the seeds."""
    return type("SeedGroupTrialEvalCallback", (trial_eval_callback, SeedGroupEvalCallback), {})


PATCHED_NAMES = ("ALGOS", "EvalCallback", "TrialEvalCallback")
"""The names of ``rl_zoo3.exp_manager`` that a seed group's manager replaces."""
PATCHED_METHODS = ("_preprocess_hyperparams", "create_envs", "objective")
"""The methods of ``ExperimentManager`` wrapped for seed groups (and ``objective``, to prune a trial
whose update is not finite)."""


def missing_names(exp_manager: Any) -> list[str]:
    """What this rl_zoo3's ``exp_manager`` lacks of the names that seed groups patch."""
    manager = getattr(exp_manager, "ExperimentManager", None)
    missing = [name for name in PATCHED_NAMES if not hasattr(exp_manager, name)]
    return missing + [f"ExperimentManager.{name}" for name in PATCHED_METHODS if not hasattr(manager, name)]


# ---------------------------------------------------------------------- the manager
def patch_experiment_manager(exp_manager: Any, utils: Any, our_algorithms: dict[str, type]) -> None:
    """Teach ``exp_manager.ExperimentManager`` seed groups for ``our_algorithms`` (idempotent)."""
    manager = exp_manager.ExperimentManager
    if getattr(manager._preprocess_hyperparams, _PATCHED_MARK, False):
        return
    preprocess, create_envs, objective = (
        manager._preprocess_hyperparams,
        manager.create_envs,
        manager.objective,
    )
    group_trial_callback = _trial_eval_callback(exp_manager.TrialEvalCallback)

    @functools.wraps(preprocess)
    def _preprocess_hyperparams(self: Any, hyperparams: dict[str, Any]) -> Any:
        self.seed_group = None
        if self.algo in our_algorithms:
            self.seed_group = group_seeds(hyperparams, self.seed)
            builder = GroupBuilder(our_algorithms[self.algo], self.seed_group)
            exp_manager.ALGOS = ZooAlgos(utils.ALGOS, {self.algo: builder})
            if self.seed_group is not None:  # both behave as the zoo's own for a single-seed model
                exp_manager.EvalCallback = SeedGroupEvalCallback
                exp_manager.TrialEvalCallback = group_trial_callback
            if self.seed_group is not None and self.verbose > 0:
                print(f"Seed group: seeds {list(self.seed_group)}, {hyperparams.get('n_envs', 1)} envs each")
        return preprocess(self, hyperparams)

    @functools.wraps(create_envs)
    def _create_envs(self: Any, n_envs: int, eval_env: bool = False, no_log: bool = False) -> Any:
        seeds = getattr(self, "seed_group", None)
        if seeds is not None and not eval_env:
            n_envs *= len(seeds)  # seed-major: the model seeds env i * n_envs + j with seeds[i] + j
        return create_envs(self, n_envs, eval_env=eval_env, no_log=no_log)

    @functools.wraps(objective)
    def _objective(self: Any, trial: Any) -> float:
        try:
            return objective(self, trial)
        except NonFiniteUpdateError as error:
            if self.algo not in our_algorithms:
                raise
            # The zoo prunes its own algorithms' trials that fail with NaN (ValueError, AssertionError).
            import optuna

            print(f"{error}\n============\nSampled hyperparams:\n{trial.params}")
            raise optuna.exceptions.TrialPruned() from error

    setattr(_preprocess_hyperparams, _PATCHED_MARK, True)
    manager._preprocess_hyperparams = _preprocess_hyperparams
    manager.create_envs = _create_envs
    manager.objective = _objective


def patch_enjoy(enjoy: Any, utils: Any, our_algorithms: dict[str, type]) -> None:
    """``rl_zoo3.enjoy`` reads our algorithms as :class:`EnjoyLoader` (idempotent)."""
    if not isinstance(enjoy.ALGOS, ZooAlgos):
        enjoy.ALGOS = ZooAlgos(utils.ALGOS, {key: EnjoyLoader(cls) for key, cls in our_algorithms.items()})
