"""TDMPC2MultiTask: one TD-MPC2 model for several tasks, trained offline on a task pool.

The reference's multi-task agent (nicklashansen/tdmpc2 @b67b21c): a learned task embedding conditions
every network, observations and actions are padded to the widest task, each task keeps its own action
mask and discount (:mod:`sb3_worldmodels.tdmpc2.networks`), and training is offline: gradient updates
on windows of a fixed dataset, no env interaction and no planning (offline_trainer.py:73-90@b67b21c).

It is an SB3 algorithm of the package's family: ``learn(n)`` runs ``n`` gradient updates
(``num_timesteps`` counts updates) with SB3's callbacks, logger and progress bar; ``save``/``load``
use the checkpoint format of ``DreamerV3`` and ``TDMPC2`` (:mod:`sb3_worldmodels.common.checkpoints`);
``predict`` plans for one named task with the family's key rule; ``evaluate`` runs each task's env.

A list of seeds makes a seed group (:class:`~sb3_worldmodels.common.seed_lanes.SeedLanes`): one state
with a leading seed axis, one jitted update call for all seeds, each seed sampling its own windows
from the same pool with its own generator, as a single-seed model with that seed does.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import configure_logger

from sb3_worldmodels.blocks.seeds import stack_trees
from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.checkpoints import STATE_PREFIX, Checkpointing
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.common.predict import check_carried_state, check_predict_args, predict_keys
from sb3_worldmodels.common.seed_lanes import (
    SeedLanes,
    check_per_seed_values,
    per_seed_values,
    record_seed_metrics,
    seed_list,
)
from sb3_worldmodels.data.pool import TaskPool, load_pool
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks
from sb3_worldmodels.tdmpc2.config import TDMPC2Config, check_config, preset, seed_settings
from sb3_worldmodels.tdmpc2.multitask_callbacks import MultiTaskEvalCallback as MultiTaskEvalCallback
from sb3_worldmodels.tdmpc2.multitask_callbacks import UpdatesProgressBar, refuse_one_env_evaluation
from sb3_worldmodels.tdmpc2.upgrade import EarlierCheckpoints

_DMC_TASKS = (
    "walker-stand", "walker-walk", "walker-run", "cheetah-run", "reacher-easy", "reacher-hard",
    "acrobot-swingup", "pendulum-swingup", "cartpole-balance", "cartpole-balance-sparse", "cartpole-swingup",
    "cartpole-swingup-sparse", "cup-catch", "finger-spin", "finger-turn-easy", "finger-turn-hard",
    "fish-swim", "hopper-stand", "hopper-hop",
    "walker-walk-backwards", "walker-run-backwards", "cheetah-run-backwards", "cheetah-run-front",
    "cheetah-run-back", "cheetah-jump", "hopper-hop-backwards", "reacher-three-easy", "reacher-three-hard",
    "cup-spin", "pendulum-spin",
)  # fmt: skip
_METAWORLD_TASKS = tuple(
    f"mw-{name}"
    for name in (
        "assembly", "basketball", "button-press-topdown", "button-press-topdown-wall", "button-press",
        "button-press-wall", "coffee-button", "coffee-pull", "coffee-push", "dial-turn", "disassemble",
        "door-open", "door-close", "drawer-close", "drawer-open", "faucet-open", "faucet-close", "hammer",
        "handle-press-side", "handle-press", "handle-pull-side", "handle-pull", "lever-pull",
        "peg-insert-side", "peg-unplug-side", "pick-out-of-hole", "pick-place", "pick-place-wall",
        "plate-slide", "plate-slide-side", "plate-slide-back", "plate-slide-back-side", "push-back", "push",
        "push-wall", "reach", "reach-wall", "shelf-place", "soccer", "stick-push", "stick-pull",
        "sweep-into", "sweep", "window-open", "window-close", "bin-picking", "box-close", "door-lock",
        "door-unlock", "hand-insert",
    )
)  # fmt: skip
TASK_SETS: dict[str, tuple[str, ...]] = {"mt30": _DMC_TASKS, "mt80": _DMC_TASKS + _METAWORLD_TASKS}
"""The reference's task sets in its order, the order of the released models' embedding rows
(``TASK_SET``, common/__init__.py:26-60@b67b21c): 19 DMC tasks and 11 custom ones (mt30), then
Meta-World's 50 (mt80). A pool for a released model lists its tasks in this order."""

_NPZ_FORMAT = "sb3_worldmodels.tdmpc2_multitask"  # the .npz files of earlier releases (version 1)


def reference_settings(tasks: tuple[str, ...], model_size: int) -> dict[str, int]:
    """What the reference sets for its task sets (common/parser.py:47-48,55@b67b21c): the embedding is
    64 wide for mt30 at sizes 5, 19 and 48, else 96 (our choice too for a pool of other tasks, where
    the reference has no rule), and mt30's size-19 model has a 512-wide latent."""
    mt30 = tuple(tasks) == TASK_SETS["mt30"]
    settings = {"task_dim": 64 if mt30 and model_size in (5, 19, 48) else 96}
    if mt30 and model_size == 19:
        settings["latent_dim"] = 512
    return settings


class TDMPC2MultiTask(SeedLanes, EarlierCheckpoints, Checkpointing, BaseAlgorithm):
    """One TD-MPC2 model for the tasks of a pool, trained offline.

    :param data: a :class:`~sb3_worldmodels.data.pool.TaskPool` or the path of one; its tasks,
        their observation/action widths and episode lengths set the model (None only when loading).
    :param model_size: 1, 5, 19, 48 or 317 (the reference's sizes).
    :param batch_size: windows per update (the reference's default 256; its multi-task examples 1024).
    :param learning_rate: of both Adams (the encoder's scaled by ``enc_lr_scale``).
    :param task_dim: embedding width; default :func:`reference_settings`.
    :param seed: seeds the parameters, the update noise and the window sampling. A list of seeds makes
        a seed group: seed ``i`` of it trains as a single-seed model with seed ``i``, all in one program
        (``seed_model(i)`` is that model; ``predict`` and ``evaluate`` take ``seed_index=i``).
    :param config_overrides: other :class:`~sb3_worldmodels.tdmpc2.config.TDMPC2Config` fields.

    A group takes one value per seed (a list as long as the seed list) for ``learning_rate`` and the
    float fields that do not change a compiled shape (``consistency_coef=[20.0, 5.0]``); the others are
    refused with the reason (:func:`~sb3_worldmodels.tdmpc2.config.seed_settings`).

    The model's ``observation_space`` and ``action_space`` are the padded widths (the widest task's);
    ``predict`` takes and returns each task's own.
    """

    policy: JaxPolicy
    per_seed_settings: dict[str, list[float]]
    """The settings given one value per seed ({name: one value per seed}; empty for one seed)."""

    def __init__(
        self,
        data: TaskPool | str | os.PathLike[str] | None,
        model_size: int = 1,
        batch_size: int = 256,
        learning_rate: float | Sequence[float] = 3e-4,
        task_dim: int | None = None,
        seed: int | Sequence[int] | None = None,
        verbose: int = 0,
        tensorboard_log: str | None = None,
        _spec: tuple[TDMPC2Config, tuple[str, ...], tuple[int, ...]] | None = None,
        **config_overrides: Any,
    ) -> None:
        pool = None if data is None else _as_pool(data)
        seeds = seed_list(seed)
        given = {"learning_rate": learning_rate, "batch_size": batch_size, "task_dim": task_dim}
        per_seed = per_seed_values({**given, **config_overrides}, TDMPC2Config())
        check_per_seed_values(per_seed, seeds)
        if _spec is None:  # (config, task names, their observation widths): given when loading
            if pool is None:
                raise ValueError("TDMPC2MultiTask needs data: a TaskPool or its path (see pool_tasks).")
            # A setting given per seed builds the config with its first value (each seed's is its own).
            settings = {**given, **config_overrides, **{name: v[0] for name, v in per_seed.items()}}
            rate, batch, width = (settings.pop(name) for name in given)
            settings = {**reference_settings(pool.tasks, model_size), **settings}
            if width is not None:
                settings["task_dim"] = width
            config = preset(
                model_size,
                obs_dim=pool.obs_dim,
                action_dim=pool.action_dim,
                batch_size=batch,
                learning_rate=rate,
                action_dims=pool.action_dims,
                episode_lengths=pool.episode_lengths,
                **settings,
            )
            _spec = (config, pool.tasks, pool.obs_dims)
        if seeds is not None:
            seed_value: Any = list(seeds)
        else:
            seed_value = int(np.random.default_rng().integers(2**31)) if seed is None else int(seed)  # type: ignore[arg-type]
        super().__init__(
            policy=JaxPolicy,
            env=None,
            learning_rate=learning_rate,  # type: ignore[arg-type]
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device="cpu",
            seed=seed_value,
        )
        self.config, self.tasks, self._obs_dims = _spec
        self.model_size = model_size
        self.seeds = seeds
        self.per_seed_settings = {name: list(values) for name, values in per_seed.items()}
        self.observation_space = spaces.Box(-np.inf, np.inf, (self.config.obs_dim,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (self.config.action_dim,), np.float32)
        self.pool: TaskPool | None = None
        self._setup_model()
        if pool is not None:
            self._attach(pool)

    def _setup_model(self) -> None:
        """The policy holding the agent's state (from the seed) and predict's key stream; for a seed
        group, every seed's stacked (each built as that seed's single-seed model builds it)."""
        self.policy = JaxPolicy(self.observation_space, self.action_space)
        self._predict_calls = 0
        self._predict_view = None
        if self.seeds is None:
            assert self.seed is not None
            self._lanes, self._placement = None, None
            agent = core.init_state(self.config, jax.random.PRNGKey(self.seed))
            self.policy.state = {"agent": agent, "predict_key": jax.random.PRNGKey(self.seed + 1)}
            self._rng: np.random.Generator | None = np.random.default_rng(self.seed)  # the windows' sampling
            return
        self._call_config = self._group_call_config()  # refuses what cannot vary per seed
        for index in range(self.n_seeds):  # each seed's values checked before any seed is built
            self._lane_config(index)
        self._lanes = self._make_lanes()
        self.policy.state = self._build_group_state()
        self._rng = None  # each seed's lane samples its own windows

    # ------------------------------------------------------------------ seeds
    def _group_call_config(self) -> Any:
        """The config of the group's update: the float settings given per seed traced per seed (the
        learning rate lives in each seed's optimiser states)."""
        settings = {name: v for name, v in self.per_seed_settings.items() if name != "learning_rate"}
        return seed_settings(self.config, settings) if settings else self.config

    def _lane_config(self, index: int) -> TDMPC2Config:
        """The ``index``-th seed's config: the group's with that seed's values of the per-seed settings."""
        values: dict[str, Any] = {name: v[index] for name, v in self.per_seed_settings.items()}
        if not values:
            return self.config
        try:
            return check_config(dataclasses.replace(self.config, **values))
        except ValueError as error:
            raise ValueError(f"per-seed settings, seed index {index}: {error}") from error

    def _make_lane(self, index: int, counters: dict[str, Any] | None = None) -> TDMPC2MultiTask:
        """The single-seed model of the ``index``-th seed, at the group's update count, with the pool
        and ``counters`` (its window sampler and predict stream) when it continues the seed's run."""
        assert self.seeds is not None
        config = self._lane_config(index)
        lane = type(self)(
            None,
            self.model_size,
            learning_rate=config.learning_rate,
            seed=self.seeds[index],
            verbose=self.verbose,
            tensorboard_log=self.tensorboard_log,
            _spec=(config, self.tasks, self._obs_dims),
        )
        lane.pool = self.pool
        lane.num_timesteps, lane._n_updates = self.num_timesteps, self._n_updates
        lane.__dict__.update(counters or {})
        return lane

    def _counter_names(self) -> tuple[str, ...]:
        return ("_rng", "_predict_calls")

    @property
    def state(self) -> core.TDMPC2State:
        """The agent's state (parameters, optimiser states, update count); a seed group's leaves have a
        leading seed axis."""
        return self.policy.state["agent"]

    @state.setter
    def state(self, value: core.TDMPC2State) -> None:
        self.policy.state = {**self.policy.state, "agent": value}

    # ------------------------------------------------------------------ tasks
    @property
    def obs_dims(self) -> tuple[int, ...]:
        """Each task's own observation width (before padding), in task id order."""
        return self._obs_dims

    def task_id(self, task: str) -> int:
        if task not in self.tasks:
            raise ValueError(f"Unknown task {task!r}; this model's tasks are {list(self.tasks)}.")
        return self.tasks.index(task)

    def _attach(self, data: TaskPool | str | os.PathLike[str]) -> None:
        """Train on ``data`` from now on: a pool of this model's tasks, in its order, same widths."""
        pool = _as_pool(data)
        c = self.config
        ours = (self.tasks, self._obs_dims, c.action_dims, c.episode_lengths)
        theirs = (pool.tasks, pool.obs_dims, pool.action_dims, pool.episode_lengths)
        if ours != theirs:
            raise ValueError(
                f"the pool's tasks, observation and action widths and episode lengths {theirs} differ "
                f"from this model's {ours}: train on a pool of the same tasks in the same order."
            )
        self.pool = pool

    # ------------------------------------------------------------------ learning
    def learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1000,
        tb_log_name: str = "TDMPC2MultiTask",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
        data: TaskPool | str | os.PathLike[str] | None = None,
    ) -> TDMPC2MultiTask:
        """Run ``total_timesteps`` gradient updates on windows of the pool (offline_trainer.py:73-90
        @b67b21c) with SB3's callbacks (returning False from ``on_step`` stops), logger and progress
        bar; metrics are logged every ``log_interval`` updates. ``data`` replaces the pool (e.g. after
        :meth:`load`). An EvalCallback is refused: evaluate with :class:`MultiTaskEvalCallback`."""
        refuse_one_env_evaluation(callback)
        if data is not None:
            self._attach(data)
        if self.pool is None:
            raise ValueError("No pool to train on: pass data=... (a TaskPool or its path).")
        if int(total_timesteps) < 0:
            raise ValueError(
                f"total_timesteps counts gradient updates and must be >= 0, got {total_timesteps}."
            )
        total_timesteps, callback = self._setup_learn(
            int(total_timesteps), callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self._lanes is not None:  # a state loaded or set since is not placed yet
            self.state = self._on_devices(self.state)
        callback.on_training_start(locals(), globals())
        while self.num_timesteps < total_timesteps:
            metrics = self._update()
            self.num_timesteps += 1
            self._n_updates += 1
            callback.update_locals(locals())
            if self.num_timesteps % log_interval == 0 or self.num_timesteps == total_timesteps:
                self._record(metrics)
            if not callback.on_step():
                break
        callback.on_training_end()
        return self

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        """SB3's set-up of a ``learn`` call (counters, logger, callbacks) without its env reset:
        training is offline."""
        self.start_time = time.time_ns()
        if reset_num_timesteps:
            self.num_timesteps = 0
        else:
            total_timesteps += self.num_timesteps
        self._total_timesteps = total_timesteps
        self._num_timesteps_at_start = self.num_timesteps
        if not self._custom_logger:
            self._logger = configure_logger(
                self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps
            )
        return total_timesteps, self._init_callback(callback, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        """SB3's, with a progress bar that counts updates."""
        if progress_bar:
            callback = [self._init_callback(callback), UpdatesProgressBar()]
        return super()._init_callback(callback, progress_bar=False)

    def _update(self) -> dict[str, Any]:
        """One update (of every seed, in one call for a group): metrics (K=1,), a group's (S, 1)."""
        assert self.pool is not None
        c = self.config
        if self._lanes is None:
            assert self._rng is not None
            sample = self.pool.sample(self._rng, c.batch_size, c.horizon)
            batch = {k: jnp.asarray(v[None]) for k, v in sample.items()}  # one update per call: K = 1
            self.state, metrics = core.train_many_jit(c, self.state, batch)
            return metrics
        # Each seed's windows from its own sampler, as its single-seed model draws them: (S, K=1, ...).
        samples = [self.pool.sample(lane._rng, c.batch_size, c.horizon) for lane in self._lanes]
        batch = stack_trees([{k: v[None] for k, v in sample.items()} for sample in samples])
        batch = jax.tree_util.tree_map(jnp.asarray, self._on_devices(batch))
        self.state, metrics = core.train_many_jit.over_seeds(self._call_config)(self.state, batch)
        return metrics

    def _record(self, metrics: Mapping[str, Any]) -> None:
        """The last update's metrics as ``train/<key>``; a group's per seed as ``seed_<seed>/train/<key>``
        and their mean over the seeds as ``train/<key>``."""
        values = {name: np.asarray(value) for name, value in metrics.items()}
        if self.seeds is None:
            for name, value in values.items():
                self.logger.record(f"train/{name}", float(value[-1]))
        else:
            per_seed = [{name: float(v[i, -1]) for name, v in values.items()} for i in range(self.n_seeds)]
            record_seed_metrics(self.logger, self.seeds, per_seed)
        self.logger.record("train/n_updates", self.num_timesteps)
        self.logger.dump(self.num_timesteps)

    # ------------------------------------------------------------------ acting
    def predict(  # type: ignore[override]
        self,
        observation: Any,
        task: str,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        seed_index: int | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Plan for ``task``: observation (O_task,) or (n, O_task) → action (A_task,) or (n, A_task),
        and the state (plan mean (n, H, A),) for the next call (a restart where ``episode_start``).
        ``deterministic`` is the reference's eval mode (no exploration noise on the chosen action);
        its keys follow the family's rule (:func:`~sb3_worldmodels.common.predict.predict_keys`):
        the same inputs give the same action, before and after ``save``/``load``. A seed group plans
        for the seed of index ``seed_index`` (required), as ``seed_model(seed_index)``."""
        if seed_index is not None or self.seeds is not None:
            return self._seed_call(
                seed_index, "predict", observation, task, state, episode_start, deterministic
            )
        k = self.task_id(task)
        obs = np.asarray(observation, np.float32)
        single = obs.ndim == 1
        obs = obs[None] if single else obs
        width = self._obs_dims[k]
        if obs.ndim != 2 or obs.shape[1] != width:
            raise ValueError(
                f"task {task!r} observations are {width} wide (a vector or a batch of vectors), got shape "
                f"{np.shape(observation)}."
            )
        n, c = obs.shape[0], self.config
        given_starts = check_predict_args(deterministic, episode_start, n)
        carried = check_carried_state(state, {"plan": (n, c.horizon, c.action_dim)}, n)
        padded = np.zeros((n, c.obs_dim), np.float32)
        padded[:, :width] = obs
        if carried is None:
            prev, first = np.zeros((n, c.horizon, c.action_dim), np.float32), np.ones(n, bool)
        else:
            prev, first = carried[0], np.zeros(n, bool) if given_starts is None else given_starts
        tasks = np.full((n,), k, np.int32)
        used_plan = np.where(first[:, None, None], 0.0, prev)  # a restart ignores the plan
        keys = predict_keys(
            bool(deterministic),
            self.policy.state["predict_key"],
            self._predict_calls,
            padded,
            used_plan,
            first,
            tasks,
        )
        self._predict_calls += 0 if deterministic else 1
        action, mean = core.act_jit(
            c,
            self.state.params,
            jnp.asarray(padded),
            jnp.asarray(prev),
            jnp.asarray(first),
            keys,
            deterministic=bool(deterministic),
            task=jnp.asarray(tasks),
        )
        action = np.asarray(action)[:, : c.action_dims[k]]
        return (action[0] if single else action), (np.asarray(mean),)

    def evaluate(
        self,
        envs: Mapping[str, gym.Env],
        n_eval_episodes: int = 5,
        deterministic: bool = True,
        seed_index: int | None = None,
    ) -> dict[str, float]:
        """Mean return of ``n_eval_episodes`` planned episodes per task (``envs``: task name → env
        with that task's spaces) and their mean over the tasks, ``"mean"`` (as the reference's
        trainer logs them, offline_trainer.py:24-39@b67b21c). A seed group evaluates the seed of
        index ``seed_index`` (required), as ``seed_model(seed_index)``."""
        if seed_index is not None or self.seeds is not None:
            return self._seed_call(seed_index, "evaluate", envs, n_eval_episodes, deterministic)
        scores: dict[str, float] = {}
        for name, env in envs.items():
            k = self.task_id(name)
            self._check_env(name, k, env)
            returns = []
            for episode in range(n_eval_episodes):
                obs, _ = env.reset(seed=None if self.seed is None else self.seed + episode)
                state, total, done = None, 0.0, False
                while not done:
                    action, state = self.predict(obs, name, state, deterministic=deterministic)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
            scores[name] = float(np.mean(returns))
        scores["mean"] = float(np.mean([scores[name] for name in envs]))
        return scores

    def _check_env(self, name: str, k: int, env: gym.Env) -> None:
        obs, act = env.observation_space, env.action_space
        width = self._obs_dims[k]
        if (
            not isinstance(obs, gym.spaces.Box)
            or not isinstance(act, gym.spaces.Box)
            or obs.shape != (width,)
            or act.shape != (self.config.action_dims[k],)
        ):
            pixels = (
                " (multi-task models take state vectors, not images)" if len(obs.shape or ()) >= 2 else ""
            )
            raise ValueError(
                f"the env given for task {name!r} has spaces {obs} / {act}; the task's are Box({width},) "
                f"observations{pixels} and Box({self.config.action_dims[k]},) actions in [-1, 1]."
            )

    # ------------------------------------------------------------------ reference checkpoints
    @classmethod
    def from_reference(
        cls,
        checkpoint: Mapping[str, Any] | str | os.PathLike[str],
        data: TaskPool | str | os.PathLike[str],
        model_size: int,
        seed: int | None = None,
        **config_overrides: Any,
    ) -> TDMPC2MultiTask:
        """A model of the reference's multi-task agent: ``checkpoint`` is its file (``torch.save`` of
        ``{"model": WorldModel.state_dict()}``, read with ``weights_only=True``) or the state dict;
        ``data`` the pool of its tasks, in the order of its embedding rows (e.g. :data:`TASK_SETS`),
        which gives their widths, action dims and episode lengths. The optimiser states start fresh.
        With a list of seeds, every seed of the group starts from the checkpoint's parameters."""
        from sb3_worldmodels.tdmpc2.reference_weights import params_from_state_dict

        sd = checkpoint if isinstance(checkpoint, Mapping) else _read_reference_checkpoint(checkpoint)
        if "_task_emb.weight" not in sd:
            raise ValueError("the state dict has no _task_emb.weight: not a multi-task TD-MPC2 model.")
        rows, task_dim = np.shape(sd["_task_emb.weight"])
        model = cls(data, model_size, task_dim=int(task_dim), seed=seed, **config_overrides)
        if rows != model.config.num_tasks:
            raise ValueError(
                f"the checkpoint embeds {rows} tasks and the pool holds {model.config.num_tasks}: give the "
                "pool of its tasks, in its order."
            )
        params, target = params_from_state_dict(sd)
        one = model.state if model._lanes is None else model._seed_slice(0)["agent"]
        if not (networks.same_layout(params, one.params) and networks.same_layout(target, one.target_qs)):
            raise ValueError(
                f"the checkpoint's layers do not have the shapes of a size-{model_size} model for this pool "
                "(padded widths, action dims, task_dim): check model_size and the pool's tasks."
            )
        if model._lanes is None:
            model.state = core.with_params(model.config, model.state, params, target)
        else:  # every seed starts from the checkpoint's parameters, at its own learning rate
            states = model._unstacked(model.state)
            model.state = model._stacked(
                [
                    core.with_params(lane.config, state, params, target)
                    for lane, state in zip(model._lanes, states, strict=True)
                ]
            )
        return model

    # ------------------------------------------------------------------ save / load
    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "config",
            "pool",
            "_lanes",
            "_placement",
            "_predict_view",
            "_call_config",
        ]

    def _checkpoint_attributes(self, exclude: Any, include: Any) -> dict[str, Any]:
        """SB3's attributes, with the config as its fields (plain data)."""
        attributes = super()._checkpoint_attributes(exclude, include)
        attributes["config"] = {f: getattr(self.config, f) for f in self.config.__dataclass_fields__}
        return attributes

    @classmethod
    def load(  # type: ignore[override]
        cls,
        path: Any,
        env: Any = None,
        device: str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trust_pickled_code: bool = False,
        data: TaskPool | str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> TDMPC2MultiTask:
        """A model written by :meth:`save` (the family's checkpoint format, read without running
        code), or by an earlier release's ``save`` (an ``.npz``); ``data`` attaches a pool to train on.
        The other arguments are :meth:`~sb3_worldmodels.common.checkpoints.Checkpointing.load`'s."""
        if _is_npz_model(path):
            model = cls._from_npz(path)
        else:
            model = super().load(
                path,
                env,
                device,
                custom_objects,
                print_system_info,
                force_reset,
                trust_pickled_code,
                **kwargs,
            )
        if data is not None:
            model._attach(data)
        return model

    @classmethod
    def _from_checkpoint(
        cls,
        data: dict[str, Any],
        params: dict[str, Any],
        env: Any,
        device: str,
        force_reset: bool,
        kwargs: dict,
    ) -> TDMPC2MultiTask:
        if env is not None:
            raise ValueError(
                "TDMPC2MultiTask trains offline and takes no env: pass data=<pool> to train further."
            )
        fields = data.pop("config", None)
        if not isinstance(fields, dict) or not all(
            k in data for k in ("tasks", "_obs_dims", "model_size", "seed")
        ):
            raise ValueError(
                "The checkpoint lacks the multi-task model's config, tasks or widths: it is incomplete."
            )
        config = preset(int(data["model_size"]), **fields)
        spec = (config, tuple(data["tasks"]), tuple(int(x) for x in data["_obs_dims"]))
        per_seed = data.pop("per_seed_settings", None) or {}
        if not isinstance(per_seed, dict):
            raise ValueError("The checkpoint's per_seed_settings is not a dict of per-seed values.")
        model = cls(None, data["model_size"], seed=data["seed"], _spec=spec, **per_seed)
        model.set_parameters(params, exact_match=True, device=device)
        model.__dict__.update(data)
        model.__dict__.update(kwargs)
        saved = model._saved_lane_counters()
        if model._lanes is not None:
            if saved is None:
                raise ValueError(
                    f"The checkpoint of a group of {model.n_seeds} seeds lacks their counters "
                    "(_seed_counters): the file was not written by this group's save()."
                )
            model.state = model._on_devices(model.state)
            for lane, counters in zip(model._lanes, saved, strict=True):
                lane.__dict__.update(counters)
        return model

    @classmethod
    def _from_npz(cls, path: str | os.PathLike[str]) -> TDMPC2MultiTask:
        """A model saved by an earlier release (an ``.npz`` of the state leaves and JSON metadata)."""
        arrays, meta = safe_io.load_npz(path, f"{path}", "a model written by TDMPC2MultiTask.save()")
        if meta.get("format") != _NPZ_FORMAT or meta.get("version") != 1:
            raise ValueError(f"{path} is not a TDMPC2MultiTask file (format {meta.get('format')!r}).")
        fields = dict(meta["config"])
        for name in ("action_dims", "episode_lengths"):
            fields[name] = tuple(int(x) for x in fields[name])
        config = preset(int(meta["model_size"]), **fields)
        spec = (config, tuple(meta["tasks"]), tuple(int(x) for x in meta["obs_dims"]))
        model = cls(None, meta["model_size"], seed=meta["seed"], _spec=spec)
        # Its keys are "state<path>" for each leaf of the agent's state: here "state/['agent']<path>".
        tensors = {
            f"{STATE_PREFIX}['agent']{name[len('state') :]}": value
            for name, value in arrays.items()
            if name.startswith("state")
        }
        model.set_parameters({"policy": tensors}, exact_match=True)
        model.num_timesteps = int(meta["num_timesteps"])
        return model


def _is_npz_model(path: Any) -> bool:
    """Whether ``path`` is a multi-task model saved by an earlier release (an ``.npz``)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return f"{safe_io.META}.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _read_reference_checkpoint(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The state dict of a reference checkpoint file, read as tensors only (no code runs)."""
    loaded = safe_io.load_tensors(Path(path).read_bytes(), f"the checkpoint {path}")
    if not isinstance(loaded, Mapping) or not isinstance(loaded.get("model"), Mapping):
        raise ValueError(f"{path}: a reference checkpoint holds {{'model': state_dict}}; this one does not.")
    return loaded["model"]


def _as_pool(data: TaskPool | str | os.PathLike[str]) -> TaskPool:
    return data if isinstance(data, TaskPool) else load_pool(data)
