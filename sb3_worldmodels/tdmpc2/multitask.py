"""TDMPC2MultiTask: one TD-MPC2 model for several tasks, trained offline on a task pool.

The reference's multi-task agent (nicklashansen/tdmpc2 @b67b21c): a learned task embedding conditions
every network, observations and actions are padded to the widest task, each task keeps its own action
mask and discount (:mod:`sb3_worldmodels.tdmpc2.networks`), and training is offline: gradient updates
on windows of a fixed dataset, no env interaction and no planning (offline_trainer.py:73-90@b67b21c).

``learn(n)`` runs ``n`` gradient updates (``num_timesteps`` counts updates) with SB3's callbacks,
logger and progress bar; ``predict`` plans for one named task; ``evaluate`` runs each task's env.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import configure_logger

from sb3_worldmodels.common import safe_io
from sb3_worldmodels.data.pool import TaskPool, load_pool
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks
from sb3_worldmodels.tdmpc2.config import TDMPC2Config, preset

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

FORMAT = "sb3_worldmodels.tdmpc2_multitask"
FORMAT_VERSION = 1


def reference_settings(tasks: tuple[str, ...], model_size: int) -> dict[str, int]:
    """What the reference sets for its task sets (common/parser.py:47-48,55@b67b21c): the embedding is
    64 wide for mt30 at sizes 5, 19 and 48, else 96 (our choice too for a pool of other tasks, where
    the reference has no rule), and mt30's size-19 model has a 512-wide latent."""
    mt30 = tuple(tasks) == TASK_SETS["mt30"]
    settings = {"task_dim": 64 if mt30 and model_size in (5, 19, 48) else 96}
    if mt30 and model_size == 19:
        settings["latent_dim"] = 512
    return settings


class _UpdatesProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by one gradient update per step (there is no env)."""

    def _on_step(self) -> bool:
        self.pbar.update(1)
        return True


class MultiTaskEvalCallback(BaseCallback):
    """Evaluate a :class:`TDMPC2MultiTask` on each of its tasks every ``eval_freq`` updates, as the
    reference's offline trainer does (offline_trainer.py:24-39,79-86@b67b21c; its defaults: every
    50,000 iterations, 10 episodes, eval mode): each task's mean return is logged as
    ``eval/<task>/mean_reward``, their mean as ``eval/mean_reward``, and kept in :attr:`evaluations`.

    :param envs: task name -> env with that task's spaces (as :meth:`TDMPC2MultiTask.evaluate`).
    :param eval_freq: updates between evaluations.
    :param n_eval_episodes: episodes per task.
    :param deterministic: plan in eval mode (no exploration noise on the chosen action).
    """

    def __init__(
        self,
        envs: Mapping[str, gym.Env],
        eval_freq: int = 50_000,
        n_eval_episodes: int = 10,
        deterministic: bool = True,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        if int(eval_freq) < 1 or int(n_eval_episodes) < 1:
            raise ValueError(
                f"eval_freq and n_eval_episodes must be positive, got {eval_freq} and {n_eval_episodes}."
            )
        self.envs, self.eval_freq, self.n_eval_episodes = dict(envs), int(eval_freq), int(n_eval_episodes)
        self.deterministic = deterministic
        self.evaluations: list[dict[str, float]] = []
        """One dict per evaluation: ``updates``, each task's mean return, and ``mean``."""

    def _init_callback(self) -> None:
        model: TDMPC2MultiTask = self.model  # type: ignore[assignment]
        for name, env in self.envs.items():  # a wrong env is refused before any update runs
            model._check_env(name, model.task_id(name), env)

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq == 0:
            self.evaluate()
        return True

    def evaluate(self) -> dict[str, float]:
        """Evaluate now, log and keep the scores."""
        model: TDMPC2MultiTask = self.model  # type: ignore[assignment]
        scores = model.evaluate(self.envs, self.n_eval_episodes, self.deterministic)
        for name, score in scores.items():
            self.logger.record("eval/mean_reward" if name == "mean" else f"eval/{name}/mean_reward", score)
        self.logger.record("eval/n_updates", self.num_timesteps)
        self.logger.dump(self.num_timesteps)
        self.evaluations.append({"updates": float(self.num_timesteps), **scores})
        if self.verbose:
            print(
                f"Eval after {self.num_timesteps} updates: "
                + ", ".join(f"{k} {v:.1f}" for k, v in scores.items())
            )
        return scores


class TDMPC2MultiTask:
    """One TD-MPC2 model for the tasks of a pool, trained offline.

    :param data: a :class:`~sb3_worldmodels.data.pool.TaskPool` or the path of one; its tasks,
        their observation/action widths and episode lengths set the model (None only when loading).
    :param model_size: 1, 5, 19, 48 or 317 (the reference's sizes).
    :param batch_size: windows per update (the reference's default 256; its multi-task examples 1024).
    :param learning_rate: of both Adams (the encoder's scaled by ``enc_lr_scale``).
    :param task_dim: embedding width; default :func:`reference_settings`.
    :param seed: seeds the parameters, the update noise and the window sampling.
    :param config_overrides: other :class:`~sb3_worldmodels.tdmpc2.config.TDMPC2Config` fields.
    """

    def __init__(
        self,
        data: TaskPool | str | os.PathLike[str] | None,
        model_size: int = 1,
        batch_size: int = 256,
        learning_rate: float = 3e-4,
        task_dim: int | None = None,
        seed: int | None = None,
        verbose: int = 0,
        tensorboard_log: str | None = None,
        _spec: tuple[TDMPC2Config, tuple[str, ...], tuple[int, ...]] | None = None,
        **config_overrides: Any,
    ) -> None:
        pool = None if data is None else _as_pool(data)
        if _spec is None:  # (config, task names, their observation widths): given when loading
            if pool is None:
                raise ValueError("TDMPC2MultiTask needs data: a TaskPool or its path (see pool_tasks).")
            settings = {**reference_settings(pool.tasks, model_size), **config_overrides}
            if task_dim is not None:
                settings["task_dim"] = task_dim
            config = preset(
                model_size,
                obs_dim=pool.obs_dim,
                action_dim=pool.action_dim,
                batch_size=batch_size,
                learning_rate=learning_rate,
                action_dims=pool.action_dims,
                episode_lengths=pool.episode_lengths,
                **settings,
            )
            _spec = (config, pool.tasks, pool.obs_dims)
        self.config, self.tasks, self._obs_dims = _spec
        self.model_size = model_size
        self.seed = int(np.random.default_rng().integers(2**31)) if seed is None else int(seed)
        self.verbose = verbose
        self.tensorboard_log = tensorboard_log
        self.state = core.init_state(self.config, jax.random.PRNGKey(self.seed))
        self._rng = np.random.default_rng(self.seed)
        self.num_timesteps = 0
        self._predict_calls = 0
        self._logger: Logger | None = None
        self._custom_logger = False
        self.pool: TaskPool | None = None
        if pool is not None:
            self._attach(pool)

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
    @property
    def logger(self) -> Logger:
        if self._logger is None:
            self._logger = configure_logger(self.verbose, self.tensorboard_log, "TDMPC2MultiTask", True)
        return self._logger

    def set_logger(self, logger: Logger) -> None:
        """Log to ``logger`` from now on (SB3's ``set_logger``: ``learn`` keeps it)."""
        self._logger, self._custom_logger = logger, True

    def get_env(self) -> None:
        """No env: training is offline (SB3 callbacks read it)."""
        return None

    def learn(
        self,
        total_timesteps: int,
        callback: BaseCallback | list[BaseCallback] | None = None,
        log_interval: int = 1000,
        tb_log_name: str = "TDMPC2MultiTask",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
        data: TaskPool | str | os.PathLike[str] | None = None,
    ) -> TDMPC2MultiTask:
        """Run ``total_timesteps`` gradient updates on windows of the pool (offline_trainer.py:73-90
        @b67b21c); metrics are logged every ``log_interval`` updates. ``data`` replaces the pool (e.g.
        after :meth:`load`)."""
        if data is not None:
            self._attach(data)
        if self.pool is None:
            raise ValueError("No pool to train on: pass data=... (a TaskPool or its path).")
        if int(total_timesteps) < 0:
            raise ValueError(
                f"total_timesteps counts gradient updates and must be >= 0, got {total_timesteps}."
            )
        if reset_num_timesteps:
            self.num_timesteps = 0
        if not self._custom_logger:
            self._logger = configure_logger(
                self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps
            )
        total_timesteps = self.num_timesteps + int(total_timesteps)  # the target, as SB3's learn has it
        callbacks = [] if callback is None else list(callback) if isinstance(callback, list) else [callback]
        if progress_bar:
            callbacks.append(_UpdatesProgressBar())
        cb = CallbackList(callbacks)
        cb.init_callback(self)  # type: ignore[arg-type]
        cb.on_training_start(locals(), globals())
        while self.num_timesteps < total_timesteps:
            metrics = self._update()
            self.num_timesteps += 1
            cb.update_locals(locals())
            if self.num_timesteps % log_interval == 0 or self.num_timesteps == total_timesteps:
                self._record(metrics)
            if not cb.on_step():
                break
        cb.on_training_end()
        return self

    def _update(self) -> dict[str, Any]:
        assert self.pool is not None
        sample = self.pool.sample(self._rng, self.config.batch_size, self.config.horizon)
        batch = {k: jnp.asarray(v[None]) for k, v in sample.items()}  # one update per call: K = 1
        self.state, metrics = core.train_many_jit(self.config, self.state, batch)
        return metrics

    def _record(self, metrics: Mapping[str, Any]) -> None:
        for name, value in metrics.items():
            self.logger.record(f"train/{name}", float(np.asarray(value)[-1]))
        self.logger.record("train/n_updates", self.num_timesteps)
        self.logger.dump(self.num_timesteps)

    # ------------------------------------------------------------------ acting
    def predict(
        self,
        observation: Any,
        task: str,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Plan for ``task``: observation (O_task,) or (n, O_task) → action (A_task,) or (n, A_task),
        and the state (plan mean (n, H, A),) for the next call (a restart where ``episode_start``).
        ``deterministic`` is the reference's eval mode (no exploration noise on the chosen action)."""
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
        padded = np.zeros((n, c.obs_dim), np.float32)
        padded[:, : obs.shape[1]] = obs
        prev = np.zeros((n, c.horizon, c.action_dim), np.float32) if state is None else np.asarray(state[0])
        if state is None:
            first = np.ones(n, bool)
        else:
            first = np.zeros(n, bool) if episode_start is None else np.asarray(episode_start, bool)
        key = self._predict_key(bool(deterministic), padded, prev, first, k)
        action, mean = core.act_jit(
            c,
            self.state.params,
            jnp.asarray(padded),
            jnp.asarray(prev),
            jnp.asarray(first),
            key,
            eval_mode=bool(deterministic),
            task=jnp.full((n,), k, jnp.int32),
        )
        action = np.asarray(action)[:, : c.action_dims[k]]
        return (action[0] if single else action), (np.asarray(mean),)

    def _predict_key(self, deterministic: bool, *inputs: Any) -> jax.Array:
        """Deterministic: a key from the inputs, so the same inputs give the same action whatever came
        before (and after save/load); otherwise the next key of the model's own predict stream."""
        if deterministic:
            digest = zlib.crc32(b"".join(np.ascontiguousarray(x).tobytes() for x in inputs))
            return jax.random.fold_in(jax.random.PRNGKey(self.seed), digest)
        self._predict_calls += 1
        return jax.random.fold_in(jax.random.PRNGKey(self.seed + 1), self._predict_calls)

    def evaluate(
        self, envs: Mapping[str, gym.Env], n_eval_episodes: int = 5, deterministic: bool = True
    ) -> dict[str, float]:
        """Mean return of ``n_eval_episodes`` planned episodes per task (``envs``: task name → env
        with that task's spaces) and their mean over the tasks, ``"mean"`` (as the reference's
        trainer logs them, offline_trainer.py:24-39@b67b21c)."""
        scores: dict[str, float] = {}
        for name, env in envs.items():
            k = self.task_id(name)
            self._check_env(name, k, env)
            returns = []
            for episode in range(n_eval_episodes):
                obs, _ = env.reset(seed=self.seed + episode)
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
        which gives their widths, action dims and episode lengths. The optimiser states start fresh."""
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
        if not (
            networks.same_layout(params, model.state.params)
            and networks.same_layout(target, model.state.target_qs)
        ):
            raise ValueError(
                f"the checkpoint's layers do not have the shapes of a size-{model_size} model for this pool "
                "(padded widths, action dims, task_dim): check model_size and the pool's tasks."
            )
        model.state = core.with_params(model.state, params, target)
        return model

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | os.PathLike[str]) -> None:
        """The model (config, tasks, parameters, optimiser state, counters) in one ``.npz``, written
        atomically; it loads without running code."""
        leaves = jax.tree_util.tree_leaves_with_path(self.state)
        arrays = {f"state{jax.tree_util.keystr(p)}": np.asarray(x) for p, x in leaves}
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "config": {f: getattr(self.config, f) for f in self.config.__dataclass_fields__},
            "tasks": list(self.tasks),
            "obs_dims": list(self._obs_dims),
            "model_size": self.model_size,
            "seed": self.seed,
            "num_timesteps": self.num_timesteps,
        }
        target = Path(path)
        temp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(temp, "wb") as handle:
                safe_io.save_npz(handle, arrays, meta)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], data: TaskPool | str | os.PathLike[str] | None = None
    ) -> TDMPC2MultiTask:
        """A model written by :meth:`save`; ``data`` attaches a pool to train on."""
        arrays, meta = safe_io.load_npz(path, f"{path}", "a model written by TDMPC2MultiTask.save()")
        if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path} is not a TDMPC2MultiTask file (format {meta.get('format')!r}).")
        fields = dict(meta["config"])
        for name in ("action_dims", "episode_lengths"):
            fields[name] = tuple(int(x) for x in fields[name])
        config = preset(int(meta["model_size"]), **fields)
        spec = (config, tuple(meta["tasks"]), tuple(int(x) for x in meta["obs_dims"]))
        model = cls(None, meta["model_size"], seed=meta["seed"], _spec=spec)
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(model.state)]
        missing = [p for p in paths if f"state{p}" not in arrays]
        if missing:
            raise ValueError(f"{path} lacks the state entries {missing[:3]}...: not a TDMPC2MultiTask file.")
        leaves = [jnp.asarray(arrays[f"state{p}"]) for p in paths]
        model.state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(model.state), leaves)
        model.num_timesteps = int(meta["num_timesteps"])
        if data is not None:
            model._attach(data)
        return model


def _read_reference_checkpoint(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The state dict of a reference checkpoint file, read as tensors only (no code runs)."""
    loaded = safe_io.load_tensors(Path(path).read_bytes(), f"the checkpoint {path}")
    if not isinstance(loaded, Mapping) or not isinstance(loaded.get("model"), Mapping):
        raise ValueError(f"{path}: a reference checkpoint holds {{'model': state_dict}}; this one does not.")
    return loaded["model"]


def _as_pool(data: TaskPool | str | os.PathLike[str]) -> TaskPool:
    return data if isinstance(data, TaskPool) else load_pool(data)
