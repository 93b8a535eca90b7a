"""What every seed group shares, online or offline, without envs: the seed list, settings given one
value per seed, each seed's metrics in the logger, and :class:`SeedLanes` (one lane per seed, the seed
axis on the devices, ``seed_model``, ``seed_index`` and each seed's counters in the checkpoint).

:class:`~sb3_worldmodels.common.seed_group.SeedGroup` builds the online agents' groups on it;
``TDMPC2MultiTask``'s offline groups use it alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats
from stable_baselines3.common.logger import Logger

from sb3_worldmodels.blocks.devices import SeedPlacement, seed_placement
from sb3_worldmodels.blocks.seeds import stack_trees, tree_slice
from sb3_worldmodels.common.training import aggregate_metric

SEED_COUNTERS = "_seed_counters"
"""The checkpoint attribute of a group: one dict per seed of :data:`LANE_COUNTERS` (and the agent's
``schedule_attributes``), restored into the lanes by ``load``."""


def seed_list(seed: Any) -> tuple[int, ...] | None:
    """The seeds of a ``seed`` argument given as a list (None for an int or None), checked."""
    if seed is None or isinstance(seed, (int, np.integer)):
        return None
    if not isinstance(seed, Sequence) or isinstance(seed, str):
        raise TypeError(f"seed must be an int, None or a list of ints, got {seed!r}.")
    seeds = tuple(seed)
    if not seeds or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"A seed list needs one or more ints, got {seed!r}.")
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            f"The seeds of a group must differ (got {list(seeds)}): equal seeds run the same run."
        )
    return tuple(int(s) for s in seeds)


def per_seed_values(given: Mapping[str, Any], defaults: Any) -> dict[str, tuple]:
    """The settings of ``given`` ({name: value}) given one value per seed: {name: S values}. A list
    (or tuple) given for a setting whose default (``defaults``' attribute, a default config) is a single
    number is one value per seed; settings that are tuples by nature (e.g. ``cnn_mults``) are never
    read so."""
    found = {}
    for name, value in given.items():
        default = getattr(defaults, name, None)
        if isinstance(value, (list, tuple)) and not isinstance(default, (list, tuple)):
            found[name] = tuple(value)
    return found


def check_per_seed_values(per_seed: Mapping[str, tuple], seeds: tuple[int, ...] | None) -> None:
    """Refuse per-seed values (:func:`per_seed_values`) without a seed list, or of another length."""
    if not per_seed:
        return
    if seeds is None:
        names = ", ".join(sorted(per_seed))
        raise ValueError(
            f"{names} given as a list (one value per seed) needs a list of seeds: pass seed=[...] "
            "with as many seeds, or a single value."
        )
    wrong = {name: len(v) for name, v in per_seed.items() if len(v) != len(seeds)}
    if wrong:
        raise ValueError(f"One value per seed: {len(seeds)} seeds {list(seeds)}, but {wrong} values.")


def record_seed_metrics(
    logger: Logger, seeds: Sequence[int], per_seed: Sequence[Mapping[str, float]]
) -> None:
    """Each seed's training metrics ({key: value}; empty for a seed that did not train) as
    ``seed_<seed>/train/<key>`` (not printed), their mean over the seeds that have them as
    ``train/<key>`` (:func:`~sb3_worldmodels.common.training.aggregate_metric`)."""
    means: dict[str, list[float]] = {}
    for seed, metrics in zip(seeds, per_seed, strict=True):
        prefix = f"seed_{seed}/train/"
        for key, value in metrics.items():
            logger.record(prefix + key, value, exclude="stdout")
            means.setdefault(key, []).append(value)
    # The keys every seed that trained has, at once (row r's mean is aggregate_metric(key, row)'s).
    most = max((len(values) for values in means.values()), default=0)
    plain = [key for key, values in means.items() if "stats/" not in key and len(values) == most]
    at_once = {}
    if plain:
        rows = np.asarray([means[key] for key in plain], np.float64)
        at_once = dict(zip(plain, np.mean(rows, axis=1).tolist(), strict=True))
    for key, seed_values in means.items():
        mean = at_once[key] if key in at_once else aggregate_metric(key, np.asarray(seed_values))
        logger.record(f"train/{key}", mean)


class SeedLanes:
    """What every seed group shares, online (:class:`SeedGroup`) or offline (``TDMPC2MultiTask``): one
    lane per seed, an ordinary single-seed model of the group's class that keeps the seed's host side
    and counters while the group holds the stacked state (``policy.state``); the seed axis on the
    devices; one seed's model (:meth:`seed_model`) and calls (:meth:`_seed_call`); each seed's counters
    in the group's checkpoint (:data:`SEED_COUNTERS`).

    A class using it sets ``seeds`` (None for a single-seed model), ``_lanes``, ``_placement`` and
    ``_predict_view``, and gives :meth:`_make_lane` and :meth:`_counter_names`."""

    _lanes: list[Any] | None
    _placement: SeedPlacement | None
    seeds: tuple[int, ...] | None
    policy: Any
    _predict_view: tuple[int, int, Any] | None  # (state version, seed index, that seed's state)

    @property
    def n_seeds(self) -> int:
        """Seeds in this model (1 for a single-seed model)."""
        return 1 if self.seeds is None else len(self.seeds)

    def _make_lane(self, index: int, counters: dict[str, Any] | None = None) -> Any:
        """The single-seed model of the ``index``-th seed, with ``counters`` (:meth:`_lane_counters`)
        when it continues a seed's run."""
        raise NotImplementedError

    def _counter_names(self) -> tuple[str, ...]:
        """The attributes that a lane counts for its seed, saved per seed."""
        raise NotImplementedError

    def _lane_counters(self, lane: Any) -> dict[str, Any]:
        """A copy of what ``lane`` counts for its seed (steps, updates, schedule, statistics, ...)."""
        return {name: copy.deepcopy(getattr(lane, name)) for name in self._counter_names()}

    def _saved_lane_counters(self) -> list[dict[str, Any]] | None:
        """The per-seed counters a checkpoint saved (``_seed_counters``, taken off the group), checked
        against this group; None when there are none."""
        saved = self.__dict__.pop(SEED_COUNTERS, None)
        if saved is not None:
            names = set(self._counter_names())
            if not (
                isinstance(saved, list)
                and len(saved) == self.n_seeds
                and all(isinstance(c, dict) and set(c) == names for c in saved)
            ):
                raise ValueError(
                    f"The checkpoint's per-seed counters ({SEED_COUNTERS}) do not fit a group of "
                    f"{self.n_seeds} seeds of {type(self).__name__} (one dict of {sorted(names)} per seed): "
                    "the file was not written by this group's save()."
                )
        return saved

    def _make_lanes(self) -> list[Any]:
        """The lanes of a group being set up: fresh, or continuing the counters a checkpoint saved
        per seed."""
        saved = self._saved_lane_counters()
        return [self._make_lane(i, None if saved is None else saved[i]) for i in range(self.n_seeds)]

    def _build_group_state(self) -> dict[str, Any]:
        """The lanes' states stacked along a leading seed axis (the lanes keep none)."""
        assert self._lanes is not None
        state = stack_trees([lane.policy.state for lane in self._lanes])
        for lane in self._lanes:
            lane.policy.state = None
        self._placement = seed_placement(self.n_seeds)
        return self._on_devices(state)

    # ------------------------------------------------------------------ the seed axis on the devices
    def _on_devices(self, tree: Any) -> Any:
        """A pytree of leaves (S, ...) on the devices: sharded along S over several, else as given."""
        return tree if self._placement is None else self._placement.put(tree)

    def _stacked(self, trees: list[Any]) -> Any:
        """S pytrees -> one of leaves (S, ...), placed along S (:meth:`_on_devices`)."""
        return stack_trees(trees) if self._placement is None else self._placement.stack(trees)

    def _unstacked(self, tree: Any) -> list[Any]:
        """One pytree of leaves (S, ...) -> S pytrees, each seed's on the device that holds it."""
        if self._placement is None:
            return [tree_slice(tree, i) for i in range(self.n_seeds)]
        return self._placement.unstack(tree)

    def _seed_slice(self, index: int) -> Any:
        """Seed ``index``'s slice of the state, on the device that holds it."""
        if self._placement is None:
            return tree_slice(self.policy.state, index)
        return self._placement.slice(self.policy.state, index)

    def seed_model(self, index: int) -> Any:
        """An ordinary single-seed model of the ``index``-th seed (of the same class, without envs or
        replay): its parameters, keys and counters, for ``predict``, ``evaluate_policy`` and ``save``."""
        if self.seeds is None:
            raise ValueError("seed_model() is for a seed group (a model built with a list of seeds).")
        if not 0 <= index < len(self.seeds):
            raise IndexError(f"seed index {index} outside [0, {len(self.seeds)}) (seeds {list(self.seeds)}).")
        assert self._lanes is not None
        model = self._make_lane(index, self._lane_counters(self._lanes[index]))
        model.policy.state = self._seed_slice(index)
        return model

    # ------------------------------------------------------------------ predict
    def _seed_index(self, seed_index: Any, call: str) -> int | None:
        """The checked ``seed_index`` of a ``call`` (``predict``, ...); None for a single-seed model
        called without one (or with 0: a single-seed model is a group of one)."""
        if self.seeds is None:
            if seed_index is None or (isinstance(seed_index, (int, np.integer)) and seed_index == 0):
                return None
            raise ValueError(f"seed_index={seed_index!r} is for a seed group; this model has one seed.")
        if seed_index is None:
            raise ValueError(
                f"{type(self).__name__}.{call} of a seed group (seeds {list(self.seeds)}) needs "
                f"seed_index=i, the index of the seed that acts (0 to {len(self.seeds) - 1}), or one seed's "
                "model: group.seed_model(i), e.g. for evaluate_policy or EvalCallback."
            )
        if isinstance(seed_index, bool) or not isinstance(seed_index, (int, np.integer)):
            raise TypeError(f"seed_index must be an int, got {seed_index!r}.")
        if not 0 <= seed_index < len(self.seeds):
            raise IndexError(
                f"seed_index {seed_index} outside [0, {len(self.seeds)}) (seeds {list(self.seeds)})."
            )
        return int(seed_index)

    def _seed_call(self, seed_index: Any, call: str, *args: Any) -> Any:
        """``call`` (``predict``, ``predict_rollout``, ...) of one seed: its lane's, on that seed's
        slice of the state (the lane keeps its own ``predict`` stream counter, as ``seed_model``'s
        model would from then on). The slice is kept until the state changes (training, loading)."""
        index = self._seed_index(seed_index, call)
        if index is None:
            return getattr(self, call)(*args)
        assert self._lanes is not None
        version = self.policy.state_version
        view = self._predict_view
        if view is None or view[:2] != (version, index):
            self._predict_view = None  # the previous slice goes before the next is made
            view = (version, index, self._seed_slice(index))
            self._predict_view = view
        lane = self._lanes[index]
        lane.policy.state = view[2]
        try:
            return getattr(lane, call)(*args)
        finally:
            lane.policy.state = None

    # ------------------------------------------------------------------ files
    def _checkpoint_attributes(self, exclude: Any, include: Any) -> dict[str, Any]:
        attributes = super()._checkpoint_attributes(exclude, include)  # type: ignore[misc]
        if self._lanes is not None:
            attributes[SEED_COUNTERS] = [self._lane_counters(lane) for lane in self._lanes]
        return attributes


def interquartile_mean(values: Sequence[float]) -> float:
    """The interquartile mean of ``values``: the mean after dropping the lowest and highest quarter
    (``scipy.stats.trim_mean(values, 0.25)``, rliable's IQM); the mean itself for fewer than 4."""
    return float(scipy.stats.trim_mean(np.asarray(values, np.float64), 0.25))
