"""Several seeds in one model: one state pytree with a leading seed axis, one jitted call per env step
and one per training call for all seeds.

``DreamerV3("CartPole-v1", seed=[0, 1, 2, 3])`` is a *seed group*. Each seed has a *lane*: an ordinary
single-seed model of the same class, without envs and without a state of its own, that keeps the
seed's numpy side (its replay, its collection state, its training schedule and step counter) and
describes its jitted calls (the agent hooks ``_act_call`` and ``_training_batch``). The group holds
the seeds' states stacked (``policy.state``: every leaf with a leading seed axis), makes each call once
for all seeds with the call vmapped over that axis, and hands every lane its slice of the outputs, so
that seed ``i`` of a group does what a single-seed model with seed ``i`` does, to float tolerance.

The envs: ``n_envs`` per seed, seed-major (env ``j`` of the ``i``-th seed is env ``i * n_envs + j`` of
the VecEnv, seeded ``seed_i + j`` as a single-seed model seeds its envs). ``num_timesteps`` is the
least over the seeds (DreamerV3's rows differ between seeds whose episodes end at different steps):
``learn(n)`` gives every seed at least ``n``.

Files: ``save`` stores the stacked state and each lane's counters and schedule (``_seed_counters``, a
list of plain values per seed), ``load`` gives the group back; ``save_replay_buffer`` writes every
seed's replay in one ``.npz``. ``predict`` acts for one seed, named by ``seed_index``: as
``seed_model(seed_index)`` would, with the lane holding that seed's slice of the state for the call.

The devices: on a host of several devices the seed axis is sharded over them
(:func:`~sb3_worldmodels.blocks.devices.seed_placement`: S / D seeds on each of D devices, D the
largest device count that divides S); the state, each call's stacked arguments and each training call's
batches are placed along it, the programs run on every device at once and their outputs stay there.

:class:`SeedGroup` builds the online agents' groups on
:class:`~sb3_worldmodels.common.seed_lanes.SeedLanes`, the part that does not depend on envs (the
lanes, the seed axis on the devices, ``seed_model``, ``seed_index``, the counters in the checkpoint),
which ``TDMPC2MultiTask``'s offline groups use alone.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.utils import FloatSchedule, safe_mean
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from sb3_worldmodels.blocks.seeds import stack_trees, tree_slice
from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.agent_hooks import AgentHooks
from sb3_worldmodels.common.boundary import AgentObservation, map_observation
from sb3_worldmodels.common.callbacks import WorldModelCallback, record_extra_metrics, walk_callbacks
from sb3_worldmodels.common.device_replay import fields_on_device, updated_copies
from sb3_worldmodels.common.group_calls import (
    GroupCall,
    GroupRound,
    GroupStaged,
    padded_batches,
    update_means,
)
from sb3_worldmodels.common.replay_state import group_replay_state, group_replays_from_state
from sb3_worldmodels.common.seed_lanes import (
    SeedLanes,
    check_per_seed_values,
    interquartile_mean,
    per_seed_values,
    record_seed_metrics,
)
from sb3_worldmodels.common.training import (
    aggregate_metric,
    draws_undone,
    training_call,
    training_chunks,
)

LANE_COUNTERS = (
    "num_timesteps",
    "_n_updates",
    "_owed_updates",
    "at_episode_boundary",
    "ep_info_buffer",
    "ep_success_buffer",
)
"""What each lane counts for its seed, besides the agent's own schedule."""


def group_vec_env(make_one: Any, seeds: tuple[int, ...]) -> VecEnv:
    """One DummyVecEnv of every seed's envs, seed-major, from ``make_one(seed)`` -> a seed's VecEnv."""
    envs = []
    for seed in seeds:
        vec = make_one(seed)
        if not isinstance(vec, DummyVecEnv):
            raise TypeError("A seed group builds its envs from an env id as DummyVecEnvs.")
        envs.extend(vec.envs)
    return DummyVecEnv([functools.partial(_same, env) for env in envs])


class HandOuts:
    """The per-seed pieces of stacked arrays that a group handed to its lanes, so that the pieces a
    lane passes back in its next call (its carried state, its observations, its key) are stacked by
    taking the stacked array again, not by stacking S pieces (a dispatch and a copy per leaf).

    A piece is known by identity (``is``): the lane's own object, unchanged. Host pieces are read-only
    views (a write would raise instead of leaving the stacked array stale)."""

    def __init__(self) -> None:
        self._pieces: dict[int, tuple[Any, int, Any]] = {}  # id(piece) -> (piece, seed index, stacked)

    def clear(self) -> None:
        self._pieces.clear()

    def hand(self, stacked: Any, pieces: Sequence[Any]) -> None:
        """Record ``pieces[i]`` as seed ``i``'s piece of ``stacked`` (one leaf)."""
        for index, piece in enumerate(pieces):
            self._pieces[id(piece)] = (piece, index, stacked)

    def hand_tree(self, stacked: Any, trees: Sequence[Any]) -> None:
        """Record every leaf of the pytrees ``trees`` (one per seed) as that seed's piece of the
        corresponding leaf of ``stacked``."""
        structure: Any = jax.tree_util.tree_structure(stacked)
        columns = zip(*(structure.flatten_up_to(tree) for tree in trees), strict=True)
        for leaf, column in zip(structure.flatten_up_to(stacked), columns, strict=True):
            self.hand(leaf, column)

    def stacked(self, column: Sequence[Any]) -> Any | None:
        """The stacked array whose pieces ``column`` (one leaf per seed, in seed order) are, or None."""
        first = self._pieces.get(id(column[0]))
        if first is None:
            return None
        whole = first[2]
        for index, leaf in enumerate(column):
            entry = self._pieces.get(id(leaf))
            if entry is None or entry[0] is not leaf or entry[1] != index or entry[2] is not whole:
                return None
        return whole


def _read_only(tree: Any) -> Any:
    """Host arrays that cannot be written (views of them cannot either)."""

    def freeze(leaf: Any) -> Any:
        leaf = np.asarray(leaf)
        leaf.flags.writeable = False
        return leaf

    return jax.tree_util.tree_map(freeze, tree)


def _same(env: Any) -> Any:
    return env


class SeedGroup(SeedLanes, AgentHooks, OffPolicyAlgorithm):
    """The group's side of the shell: its lanes, and the collection, training and logging steps that
    run every lane's calls as one (a single-seed model has no lanes and skips all of it)."""

    _config: Any
    _call_config: Any
    seed_settings: Any
    config_class: Any
    _wm_callbacks: list[WorldModelCallback]
    action_repeat: int
    _hand_outs: HandOuts | None  # a group's pieces handed to its lanes (None for a single seed)
    _rates_written: tuple[Any, bytes] | None  # Trainer's
    _unsettled: Any  # Trainer's: for a group, its call that settles at the next acting call
    _staged: Any  # Trainer's: for a group, its call dispatched before the step's env step
    _spans_processes: bool  # ProcessSpan's
    _total_timesteps: int  # Trainer's
    _keep_training_call: Callable[..., None]  # Trainer's
    _with_learning_rates: Callable[..., Any]  # Trainer's

    # ------------------------------------------------------------------ set-up
    @property
    def envs_per_seed(self) -> int:
        return self.n_envs // self.n_seeds

    def _lane_attributes(self) -> dict[str, Any]:
        """What a lane takes from the group: the attributes a checkpoint keeps, less the group's own."""
        excluded = {*self._excluded_save_params(), "seed", "seeds", "n_envs", "_lanes", "num_timesteps"}
        return {k: v for k, v in self.__dict__.items() if k not in excluded}

    def _per_seed_values(self) -> dict[str, tuple]:
        """The hyperparameters given one value per seed: {name: S values}. A list (or tuple) given
        for a setting whose default is a single number (a config float, or ``learning_rate``) is one
        value per seed (:func:`per_seed_values`)."""
        names = (*self.config_settings(), "learning_rate")  # type: ignore[attr-defined]
        return per_seed_values({name: getattr(self, name, None) for name in names}, self.config_class())

    def _setup_lr_schedule(self) -> None:
        """SB3's schedule; a group given one rate per seed keeps the first (each lane has its own)."""
        rates = self._per_seed_values().get("learning_rate")
        if rates is None:
            super()._setup_lr_schedule()
            return
        self.lr_schedule = FloatSchedule(rates[0])

    def _check_per_seed_values(self) -> None:
        """Refuse per-seed values without a seed list, or of another length than it."""
        check_per_seed_values(self._per_seed_values(), self.seeds)

    def _group_call_config(self) -> Any:
        """The config of the group's calls: the static config, with the float settings given per seed
        traced per seed (the agent's ``seed_settings``, which refuses what cannot vary per seed)."""
        settings = {k: list(v) for k, v in self._per_seed_values().items() if k != "learning_rate"}
        if not settings:
            return self._config
        return self.seed_settings(self._config, settings)

    def _make_lane(self, index: int, counters: dict[str, Any] | None = None) -> Any:
        """The single-seed model of the ``index``-th seed (no envs), set up as a loaded model is, with
        ``counters`` (:meth:`_lane_counters`) when it continues a seed's run."""
        assert self.seeds is not None
        lane = type(self)(policy=type(self.policy), env=None, _init_setup_model=False)  # type: ignore[call-arg,arg-type]
        lane.__dict__.update(self._lane_attributes())
        lane.seed = self.seeds[index]
        for name, values in self._per_seed_values().items():
            setattr(lane, name, values[index])
        lane.seeds = None
        lane._lanes = None
        lane.n_envs = self.envs_per_seed
        lane.num_timesteps = 0
        lane.__dict__.update(counters or {})
        lane._setup_model()
        return lane

    def _counter_names(self) -> tuple[str, ...]:
        return (*LANE_COUNTERS, *self.schedule_attributes)

    def _make_lanes(self) -> list[Any]:
        self._check_group_env()
        return super()._make_lanes()

    def _check_group_env(self) -> None:
        if self.seeds is not None and self.n_envs % len(self.seeds):
            raise ValueError(
                f"A group of {len(self.seeds)} seeds needs n_envs envs per seed (seed-major): the VecEnv has "
                f"{self.n_envs} envs, not a multiple of {len(self.seeds)}."
            )

    def set_random_seed(self, seed: Any = None) -> None:
        """SB3's seeding; for a group, Python's, numpy's and torch's generators take the first seed, and
        each seed's envs are seeded as a single-seed model seeds them (seed + env index); the seeds go to
        the innermost VecEnv, the one whose ``reset`` reads them, under any VecEnvWrapper."""
        if self.seeds is None:
            super().set_random_seed(seed)
            return
        super().set_random_seed(self.seeds[0])
        if self.env is not None:
            self.env.unwrapped._seeds = [s + j for s in self.seeds for j in range(self.envs_per_seed)]

    def predict_rollout(
        self,
        observation: Any,
        actions: Any,
        state: Any = None,
        episode_start: Any = None,
        seed_index: Any = None,
    ) -> dict[str, np.ndarray]:
        """A seed group's ``predict_rollout`` for the seed of index ``seed_index`` (the agent's
        ``predict_rollout`` says what it predicts)."""
        if self._seed_index(seed_index, "predict_rollout") is None:
            return super().predict_rollout(observation, actions, state, episode_start)  # type: ignore[misc]
        return self._seed_call(seed_index, "predict_rollout", observation, actions, state, episode_start)

    # ------------------------------------------------------------------ files and envs
    def _policy_file_contents(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        if self.seeds is not None:
            raise ValueError(
                "A seed group's policy holds every seed's parameters: save one seed's policy with "
                "group.seed_model(i).policy.save(path), or the whole group with group.save(path)."
            )
        return super()._policy_file_contents()  # type: ignore[misc]

    def _replay_file_contents(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self._lanes is None:
            return super()._replay_file_contents()  # type: ignore[misc]
        assert self.seeds is not None
        return group_replay_state([lane.replay_buffer for lane in self._lanes], self.seeds)

    def load_replay_buffer(
        self, path: Any, truncate_last_traj: bool = True, trust_pickled_code: bool = False
    ) -> None:
        """SB3's ``load_replay_buffer``; a group's file holds every seed's replay (its own
        ``save_replay_buffer``'s ``.npz``), checked against each seed's settings before any is taken."""
        if self._lanes is not None and not safe_io.is_zip_file(path):
            raise ValueError(
                f"{safe_io.describe(path, 'the replay file')} is a pickled replay of one seed; a seed group "
                "loads the .npz file its own save_replay_buffer wrote."
            )
        super().load_replay_buffer(path, truncate_last_traj, trust_pickled_code)  # type: ignore[call-arg]

    def _load_replay_file(self, arrays: dict[str, np.ndarray], meta: dict[str, Any], what: str) -> None:
        if self._lanes is None:
            super()._load_replay_file(arrays, meta, what)  # type: ignore[misc]
            return
        buffers = group_replays_from_state(arrays, meta, what)
        if len(buffers) != len(self._lanes):
            raise ValueError(
                f"{what} holds the replays of {len(buffers)} seeds (seeds {meta.get('seeds')}); this group "
                f"has {len(self._lanes)} (seeds {self.seeds})."
            )
        for index, (lane, buffer) in enumerate(zip(self._lanes, buffers, strict=True)):
            try:
                lane._check_replay_buffer(buffer)
            except ValueError as error:
                raise ValueError(f"{what}, seed index {index}: {error}") from None
        for lane, buffer in zip(self._lanes, buffers, strict=True):
            lane.replay_buffer = buffer
        self.replay_buffer = SeedReplays(buffers)

    @property
    def replay_bytes_per_seed(self) -> int:
        """Bytes held by the allocated replay of one seed (a group's mean over its seeds; 0 before
        the replay is allocated)."""
        if self.replay_buffer is None:
            return 0
        return int(self.replay_buffer.nbytes) // self.n_seeds

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """SB3's ``set_env``; a group's VecEnv has ``n_envs`` envs per seed, seed-major (env ``j`` of the
        ``i``-th seed is env ``i * n_envs + j``), as many as the group's."""
        if self.seeds is not None:
            vec = env if isinstance(env, VecEnv) else self._wrap_env(env, self.verbose)
            if vec.num_envs != self.n_envs:
                raise ValueError(
                    f"A group of {self.n_seeds} seeds with {self.envs_per_seed} envs each needs a VecEnv of "
                    f"{self.n_envs} envs, seed-major (env j of the i-th seed is env i * {self.envs_per_seed} "
                    f"+ j); got {vec.num_envs}."
                )
        super().set_env(env, force_reset)

    def _refuse_group_evaluation(self, callback: Any) -> None:
        """Refuse SB3's EvalCallback for a group before ``learn`` changes anything: it evaluates
        ``model.predict``, which acts for one seed named by ``seed_index``. An EvalCallback that says
        ``evaluates_every_seed = True`` evaluates ``seed_model(i)`` itself
        (:class:`~sb3_worldmodels.common.seed_eval.SeedGroupEvalCallback`)."""
        if self.seeds is None:
            return
        given = callback if isinstance(callback, list) else [callback]
        found = [c for root in given for c in walk_callbacks(root)]
        if any(isinstance(c, EvalCallback) and not getattr(c, "evaluates_every_seed", False) for c in found):
            raise ValueError(
                f"EvalCallback evaluates model.predict, and a seed group (seeds {list(self.seeds)}) acts "
                "for one seed at a time (predict(..., seed_index=i)). Use SeedGroupEvalCallback(eval_env, "
                "...) (from sb3_worldmodels; SB3's EvalCallback arguments), which evaluates every seed and "
                "logs their mean as eval/mean_reward, or evaluate one seed's model, "
                "evaluate_policy(group.seed_model(i), eval_env)."
            )

    # ------------------------------------------------------------------ collection
    def _seed_rows(self, index: int) -> slice:
        n = self.envs_per_seed
        return slice(index * n, (index + 1) * n)

    def _collect_act(self, obs: AgentObservation, learning_starts: int) -> np.ndarray:
        """Every lane's acting call as one call over the seeds (each seed's key drawn from its stream
        inside it). The lanes get pieces of the group's arrays (their rows of the observations, their
        part of the call's outputs, as host arrays fetched in one transfer) and pass them back in the
        next call: those are stacked by taking the group's arrays again (:class:`HandOuts`), e.g. a
        carried state stays on the device."""
        if self._lanes is None:
            return super()._collect_act(obs, learning_starts)  # type: ignore[misc]
        assert self._hand_outs is not None
        hand_outs = self._hand_outs
        state = self.policy.state
        n = self.envs_per_seed
        stacked_obs = map_observation(lambda x: x.reshape(self.n_seeds, n, *x.shape[1:]), obs)
        seed_obs = [map_observation(lambda x, i=i: x[i], stacked_obs) for i in range(self.n_seeds)]
        hand_outs.hand_tree(self._on_devices(stacked_obs), seed_obs)
        calls = [lane._act_call(seed_obs[i], learning_starts) for i, lane in enumerate(self._lanes)]
        if len({call.function for call in calls}) != 1:
            raise RuntimeError("The seeds of a group disagree on how to act (with the model or at random).")
        first = calls[0]
        arguments = self._stacked_arguments([call.arguments for call in calls])
        outputs, act_keys = first.function.from_stream().over_seeds(self._call_config)(
            first.reads(state["agent"]), *arguments, state["act_key"], **first.static
        )
        self._settle_training()  # a refused update raises here: this call's outputs are dropped
        self.policy.state = {**self.policy.state, "act_key": act_keys}
        host = _read_only(jax.device_get(outputs))  # one transfer; each seed's part a view
        per_seed = [tree_slice(host, i) for i in range(self.n_seeds)]
        hand_outs.clear()
        hand_outs.hand_tree(outputs, per_seed)
        return np.concatenate([call.finish(per_seed[i]) for i, call in enumerate(calls)])

    def _stacked_arguments(self, trees: list[Any]) -> Any:
        """The lanes' call arguments (one pytree per seed) stacked along S: a leaf whose pieces the
        group handed out is the group's array again, any other is stacked (:meth:`_stacked`)."""
        assert self._hand_outs is not None
        structure: Any = jax.tree_util.tree_structure(trees[0])
        per_seed = [structure.flatten_up_to(tree) for tree in trees]
        leaves = []
        for column in zip(*per_seed, strict=True):
            whole = self._hand_outs.stacked(column)
            leaves.append(self._stacked(list(column)) if whole is None else whole)
        return jax.tree_util.tree_unflatten(structure, leaves)

    def _count_step(self, dones: np.ndarray) -> int:
        if self._lanes is None:
            return super()._count_step(dones)  # type: ignore[misc]
        for i, lane in enumerate(self._lanes):
            lane.num_timesteps += lane._rows_in_step(dones[self._seed_rows(i)])
        return min(lane.num_timesteps for lane in self._lanes) - self.num_timesteps

    def _observe_step(
        self, obs: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        if self._lanes is None:
            super()._observe_step(obs, rewards, dones, infos)  # type: ignore[misc]
            return
        for i, lane in enumerate(self._lanes):
            rows = self._seed_rows(i)
            lane._update_info_buffer(infos[rows], dones[rows])
            lane.at_episode_boundary = bool(np.all(dones[rows]))
            lane._collect_observe(
                map_observation(lambda x, r=rows: x[r], obs), rewards[rows], dones[rows], infos[rows]
            )

    def _forget_rollouts(self) -> None:
        super()._forget_rollouts()  # type: ignore[misc]
        for lane in self._lanes or ():
            lane._forget_rollouts()

    # ------------------------------------------------------------------ the replay
    def _group_replays(
        self, total_timesteps: int, reset_num_timesteps: bool
    ) -> tuple[SeedReplays, list[int]]:
        """Every lane's replay for this run and its reservation."""
        assert self._lanes is not None
        pairs = [lane._replay_for_run(total_timesteps, reset_num_timesteps) for lane in self._lanes]
        return SeedReplays([replay for replay, _ in pairs]), [rows for _, rows in pairs]

    def _set_up_lanes_for_run(self, replays: SeedReplays, reset_num_timesteps: bool) -> None:
        assert self._lanes is not None
        self.policy.state = self._on_devices(self.policy.state)  # a loaded state is not placed yet
        for lane, replay in zip(self._lanes, replays.buffers, strict=True):
            lane.replay_buffer = replay
            if reset_num_timesteps:
                lane.num_timesteps = 0
                lane._n_updates = 0
                lane._reset_training_schedule()
            if lane.ep_info_buffer is None or reset_num_timesteps:
                lane.ep_info_buffer = deque(maxlen=self._stats_window_size)
                lane.ep_success_buffer = deque(maxlen=self._stats_window_size)

    # ------------------------------------------------------------------ training
    def train(self, gradient_steps: int, batch_size: int = 0) -> None:
        """The group's training calls, one program over the seeds (each seed's owed updates, the rest
        padded); inside ``learn`` the last call settles at the next acting call, as one model's."""
        if self._lanes is None:
            super().train(gradient_steps, batch_size)
            return
        self._settle_training()
        staged, self._staged = getattr(self, "_staged", None), None
        owed = np.array([lane._take_owed_updates() for lane in self._lanes])
        if staged is not None and self._takes_group_staged(staged, owed):
            self._keep_training_call(staged.call, staged.state, True, staged.rates)
            return
        if owed.max() <= 0:
            return
        if self._n_updates == 0:
            for cb in self._wm_callbacks:
                cb.on_pretrain()
        rates = self._lane_rates(self._current_progress_remaining)
        kept = self.policy.state["agent"]  # what a refused call leaves
        round_ = GroupRound(owed, float(np.mean(rates)))
        chunks = training_chunks(int(owed.max()), self._lanes[0]._updates_per_call)
        done = 0
        for i, k in enumerate(chunks):
            call, new_state = self._group_call(kept, rates, round_, done, k)
            self._keep_training_call(call, new_state, i == len(chunks) - 1, rates.tobytes())
            kept = new_state
            done += k

    def _lane_rates(self, progress: float) -> np.ndarray:
        """(S,) float32: each seed's learning rate at ``progress`` (remaining)."""
        assert self._lanes is not None
        return np.asarray([float(lane.lr_schedule(progress)) for lane in self._lanes], np.float32)

    def _group_call(self, kept: Any, rates: np.ndarray, round_: GroupRound, done: int, k: int) -> tuple:
        """Dispatch one training call of up to ``k`` updates per seed (seed i: its owed ones left) from
        ``kept`` with ``rates``, its batches drawn from each seed's replay: (the call, its new state)."""
        assert self._lanes is not None
        counts = np.clip(round_.owed - done, 0, k)
        agent_state = self._with_learning_rates(kept, rates, self._on_devices(rates))
        fields = self._group_device_fields()  # before the draws: each lane draws those fields' slots
        batches = [
            lane._training_batch(int(c)) if c else None for lane, c in zip(self._lanes, counts, strict=True)
        ]
        replays = [lane.replay_buffer for lane in self._lanes]
        stores = updated_copies(self, fields, self._on_devices, replays)  # every entry drawn is stored
        batch = stack_trees(
            padded_batches([b.batch if b else None for b in batches], self._lanes[0]._updates_per_call)
        )
        # Host arrays: the call sends each field in one transfer (placed: to each device of the seeds)
        batch, count = self._on_devices((batch, counts.astype(np.int32)))
        train = training_call(self.core).over_seeds(self._call_config)
        new_state, metrics, *outputs = train(agent_state, batch, count, stores)
        return GroupCall(round_, kept, metrics, tuple(outputs), batches, counts, done, k), new_state

    def _group_device_fields(self) -> tuple[str, ...]:
        """One model's ``_device_fields``, decided for every seed's replay at once (and told to each)."""
        assert self._lanes is not None
        decided = getattr(self, "_decided_device_fields", None)
        if decided is None:
            replay, n = self._lanes[0].replay_buffer, len(self._lanes)
            setting = getattr(self, "replay_on_device", None)  # files of earlier releases lack it
            decided = fields_on_device(setting, replay, self.device_replay_fields, n, self.agent_name)
            self._decided_device_fields = decided
        for lane in self._lanes:
            lane._decided_device_fields = decided
        return decided

    def _train_before_step(self) -> None:
        """One model's: ``Trainer._train_before_step``. A group's: the seeds' training call of the coming
        step, dispatched before its env step where the seeds' schedules allow it (TD-MPC2 after its seed
        phase), kept apart until ``train`` takes it: the same updates, step, rates and state (each seed's
        replay then draws as if it had sampled now), else it is dropped."""
        if self._lanes is None:
            super()._train_before_step()
            return
        if not getattr(self, "_learning", False) or self._spans_processes:
            return
        owed = np.array([lane._updates_before_step() for lane in self._lanes])
        if owed.max() <= 0:
            return
        timesteps = min(lane.num_timesteps + lane.n_envs for lane in self._lanes)
        rates = self._lane_rates(1.0 - float(timesteps) / float(self._total_timesteps))
        round_ = GroupRound(owed, float(np.mean(rates)))
        (call, new_state), sampled = draws_undone(
            [lane.replay_buffer.rng for lane in self._lanes],
            lambda: self._group_call(self.policy.state["agent"], rates, round_, 0, int(owed.max())),
        )
        call.copy_to_host_async()
        self._staged = GroupStaged(call, new_state, timesteps, rates.tobytes(), sampled)

    def _takes_group_staged(self, staged: GroupStaged, owed: np.ndarray) -> bool:
        """Whether ``train`` takes the staged group call (see :meth:`_train_before_step`)."""
        assert self._lanes is not None
        if (
            not np.array_equal(owed, staged.call.round.owed)
            or self.num_timesteps != staged.timesteps
            or self._lane_rates(self._current_progress_remaining).tobytes() != staged.rates
            or self.policy.state["agent"] is not staged.call.before
        ):
            return False
        for lane, state in zip(self._lanes, staged.sampled, strict=True):
            lane.replay_buffer.rng.bit_generator.state = state
        return True

    def _settle(self, unsettled: Any) -> None:
        """:meth:`Trainer._settle` of one model's call, or of a group's (:class:`GroupCall`)."""
        if isinstance(unsettled, GroupCall):
            self._settle_group_call(unsettled)
        else:
            super()._settle(unsettled)  # type: ignore[misc]

    def _settle_group_call(self, call: GroupCall) -> None:
        """Fetch a group's training call, refuse a seed's non-finite update (the state from before the
        call kept), hand each seed's outputs to its lane, and log the ``train`` once its last call is
        settled."""
        assert self._lanes is not None
        metrics, outputs = jax.device_get((call.metrics, call.outputs))  # one transfer each
        metrics = metrics.unpack()
        try:
            self._refuse_non_finite_seeds(metrics, call.counts, call.done)
        except FloatingPointError:
            self.policy.state = {**self.policy.state, "agent": call.before}
            raise
        for i, training in enumerate(call.batches):
            if training is not None:
                training.commit(*(jax.tree_util.tree_map(lambda x, i=i, c=call.counts[i]: x[i, :c], outputs)))
        round_ = call.round
        round_.metrics.append({key: value[:, : call.k] for key, value in metrics.items()})
        if call.done + call.k < int(round_.owed.max()):
            return
        for lane, c in zip(self._lanes, round_.owed, strict=True):
            lane._n_updates += int(c)
        self._n_updates += int(round_.owed.max())
        # Seed i's updates are the first owed[i] of each row (a seed's updates come before its padding).
        stacked = {key: np.concatenate([m[key] for m in round_.metrics], axis=1) for key in round_.metrics[0]}
        self._log_group_metrics(stacked, round_.owed, round_.lr)

    def _refuse_non_finite_seeds(self, metrics: dict[str, np.ndarray], counts: np.ndarray, done: int) -> None:
        """Refuse a call where a seed's update (one of the first ``counts[i]`` of its row of the (S, K)
        ``metrics``) is not finite: the first such seed's error (:meth:`_refuse_non_finite_seed`)."""
        assert self._lanes is not None
        ran = np.arange(next(iter(metrics.values())).shape[1])[None, :] < counts[:, None]
        bad = np.zeros(len(counts), bool)
        for key, values in metrics.items():
            if not key.startswith(self.nan_allowed_metrics):
                bad |= np.any(ran & ~np.isfinite(values), axis=1)
        for i in np.flatnonzero(bad):
            seed_metrics = {key: value[i, : counts[i]] for key, value in metrics.items()}
            self._refuse_non_finite_seed(int(i), self._lanes[i], seed_metrics, done)

    def _refuse_non_finite_seed(self, index: int, lane: Any, metrics: dict, done: int) -> None:
        try:
            lane._refuse_non_finite_update(metrics, done)
        except FloatingPointError as error:
            raise type(error)(f"Seed {lane.seed} (index {index}): {error}") from None

    def _log_group_metrics(
        self, metrics: dict[str, np.ndarray], owed: np.ndarray, learning_rate: float
    ) -> None:
        """Each seed's metrics as ``seed_<seed>/train/<key>`` (not printed), their mean over the seeds
        as ``train/<key>``; callbacks get every update's metrics averaged over the seeds that ran it.
        ``metrics``: {key: (S, U)}, seed i's updates the first ``owed[i]`` of its row."""
        assert self.seeds is not None
        seed_metrics: list[dict[str, float]] = [{} for _ in self.seeds]
        for count in np.unique(owed[owed > 0]):  # the seeds that ran as many updates, at once
            rows = np.flatnonzero(owed == count)
            for key, values in metrics.items():
                ran = values[rows, :count]
                means = np.mean(ran, axis=1).tolist()  # each row's as aggregate_metric(key, row) gives it
                if "stats/" in key:  # NaN where a batch lacked the class: the mean of the others
                    for r in np.flatnonzero(np.isnan(ran).any(axis=1)):
                        means[r] = aggregate_metric(key, ran[r])
                for row, mean in zip(rows, means, strict=True):
                    seed_metrics[row][key] = float(mean)
        record_seed_metrics(self.logger, self.seeds, seed_metrics)
        if self._wm_callbacks:
            for update in update_means(metrics, owed):
                for cb in self._wm_callbacks:
                    record_extra_metrics(self.logger, cb.on_post_update(update))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/learning_rate", learning_rate)
        self.logger.record("rollout/env_frames", self.num_timesteps * self.action_repeat)
        self.logger.record("train/replay_bytes", self.replay_bytes_per_seed)

    def dump_logs(self) -> None:
        """SB3's logs; for a group, each seed's episode statistics as ``seed_<seed>/rollout/...`` and
        their interquartile mean over the seeds as ``rollout/ep_rew_iqm`` (``rollout/ep_rew_mean`` is
        the mean over every seed's episodes)."""
        if self._lanes is not None:
            assert self.seeds is not None
            returns = []
            for seed, lane in zip(self.seeds, self._lanes, strict=True):
                if lane.ep_info_buffer:
                    ret = safe_mean([info["r"] for info in lane.ep_info_buffer])
                    returns.append(ret)
                    self.logger.record(f"seed_{seed}/rollout/ep_rew_mean", ret, exclude="stdout")
                    length = safe_mean([info["l"] for info in lane.ep_info_buffer])
                    self.logger.record(f"seed_{seed}/rollout/ep_len_mean", length, exclude="stdout")
            if returns:
                self.logger.record("rollout/ep_rew_iqm", interquartile_mean(returns))
        super().dump_logs()


class SeedReplays:
    """The replays of a seed group's seeds (``buffers[i]`` is the ``i``-th seed's)."""

    def __init__(self, buffers: list[Any]) -> None:
        self.buffers = buffers

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.buffers))

    def bytes_to_reserve(self, reservations: list[int]) -> int:
        return int(sum(b.bytes_to_reserve(r) for b, r in zip(self.buffers, reservations, strict=True)))

    def reserve(self, reservations: list[int]) -> None:
        for buffer, rows in zip(self.buffers, reservations, strict=True):
            buffer.reserve(rows)

    def __len__(self) -> int:
        return len(self.buffers)

    def __getitem__(self, index: int) -> Any:
        return self.buffers[index]
