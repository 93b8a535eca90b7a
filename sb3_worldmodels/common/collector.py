"""Collection: SB3's env loop with the agent's carried state, the checks at the env boundary, and the
replay the agent writes to (its creation, its checks, its files).

SB3's own collection does not carry a recurrent state per env, so ``collect_rollouts`` is overridden:
every vector step calls the agent once for all envs (``_collect_act``: the agent's ``_act_call``),
refuses non-finite actions and rewards, keeps SB3's callback calls in order and the local names
callbacks read (``actions``, ``new_obs``, ``rewards``, ``dones``, ``infos``), and hands the outcome
to ``_collect_observe``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax
import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import load_from_pkl
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import should_collect_more_steps
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize

from sb3_worldmodels.blocks import distributed
from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.agent_hooks import AgentCall, AgentHooks
from sb3_worldmodels.common.boundary import AgentObservation, check_rewards, refuse_non_finite_actions
from sb3_worldmodels.common.callbacks import WorldModelCallback, emit_eval_metrics
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.common.processes import ProcessSpan
from sb3_worldmodels.common.replay_state import replay_from_state


def run_call(config: Any, call: AgentCall, agent_state: Any, stream_key: jax.Array) -> tuple[Any, jax.Array]:
    """(the outputs of ``call`` on ``agent_state``, the stream's next key): the call's key is drawn
    from ``stream_key`` inside the call's program (:meth:`AgentFunction.from_stream`)."""
    function = call.function.from_stream()
    return function.call_from_host(
        config, call.reads(agent_state), *call.arguments, stream_key, **call.static
    )


class Collector(ProcessSpan, AgentHooks, OffPolicyAlgorithm):
    """``collect_rollouts``, the env checks, and the agent's replay."""

    policy: JaxPolicy
    allow_vecnormalize_obs: bool
    _last_obs: Any
    at_episode_boundary: bool  # every env between episodes (saved with the model)
    _flat_obs: tuple[Any, AgentObservation] | None  # (an observation, it flattened)
    _wm_callbacks: list[WorldModelCallback]
    _eval_callbacks: list[EvalCallback]

    # ------------------------------------------------------------------ envs
    def _check_env(self, env: VecEnv) -> None:
        """Refuse a VecNormalize that changes what the world model learns (unless allowed)."""
        vec_normalize = unwrap_vec_normalize(env)
        if vec_normalize is None:
            return
        if vec_normalize.norm_reward:
            raise ValueError(
                f"{self.agent_name} needs the raw rewards: VecNormalize(norm_reward=True) changes the reward "
                "the world model learns to predict and the returns it plans or imagines with (the agent "
                "scales returns itself). Use VecNormalize(norm_reward=False) or no VecNormalize."
            )
        if vec_normalize.norm_obs and not self.allow_vecnormalize_obs:
            raise ValueError(
                f"{self.agent_name} wants raw observations (it applies its own symlog / normalisation): "
                "VecNormalize(norm_obs=True) makes the model learn a moving target. Remove VecNormalize, or "
                "pass allow_vecnormalize_obs=True to train on the normalised observations anyway."
            )
        if vec_normalize.norm_obs:
            warnings.warn(
                "Training on VecNormalize-normalised observations (allow_vecnormalize_obs=True): the "
                "world model's targets drift while the statistics move.",
                stacklevel=3,
            )

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """SB3's ``set_env`` (same spaces and number of envs), with the agent's VecNormalize checks; the
        agent's per-env state restarts (every env begins a new episode)."""
        self._check_env(self._wrap_env(env, self.verbose) if not isinstance(env, VecEnv) else env)
        super().set_env(env, force_reset=force_reset)
        self._forget_rollouts()

    # ------------------------------------------------------------------ the env loop
    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        train_freq: TrainFreq,
        replay_buffer: ReplayBuffer | None,
        action_noise=None,
        learning_starts: int = 0,
        log_interval: int | None = None,
    ) -> RolloutReturn:
        """SB3's off-policy collection, with the agent's carried state and its own replay rows."""
        self.policy.set_training_mode(False)
        num_collected_steps, num_collected_episodes = 0, 0
        assert train_freq.unit == TrainFrequencyUnit.STEP
        callback.on_rollout_start()
        continue_training = True
        while should_collect_more_steps(train_freq, num_collected_steps, num_collected_episodes):
            buffer_actions = self._collect_act(self._flat_last_obs(), learning_starts)
            refuse_non_finite_actions(buffer_actions, f" at step {self.num_timesteps}")
            actions = self.action_adapter.to_env(buffer_actions)
            env.step_async(actions)  # envs in processes step from here on
            self._train_before_step()  # the step's update, where the agent allows, while the envs step
            try:
                new_obs, rewards, dones, infos = env.step_wait()
            except ValueError as error:  # e.g. DummyVecEnv storing an observation of another shape
                raise ValueError(
                    f"env.step failed at step {self.num_timesteps} (num_timesteps): {error}. An observation "
                    f"that no longer fits the observation space {self.observation_space} is the usual cause."
                ) from error
            where = f" at step {self.num_timesteps} (num_timesteps, before this step)"
            check_rewards(rewards, where)
            flat_obs = self.obs_adapter.convert(new_obs, where)
            rows = self._count_step(dones)
            self.num_timesteps += rows
            num_collected_steps += 1
            callback.update_locals(locals())
            go_on = callback.on_step()
            if go_on:
                emit_eval_metrics(self._wm_callbacks, self._eval_callbacks, self.logger)
                self._update_info_buffer(infos, dones)
                self._observe_step(flat_obs, rewards, dones, infos)
                self._last_obs = new_obs
                self._flat_obs = (new_obs, flat_obs)
                self.at_episode_boundary = bool(np.all(dones))
            if self._spans_processes:  # the processes agree on the step, going on and the updates
                go_on = self._agree_on_step(rows, go_on)
            if not go_on:
                return RolloutReturn(
                    num_collected_steps * env.num_envs, num_collected_episodes, continue_training=False
                )
            self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
            self._on_step()
            for done in dones:
                if done:
                    num_collected_episodes += 1
                    self._episode_num += 1
                    if log_interval is not None and self._episode_num % log_interval == 0:
                        self.dump_logs()
        callback.on_rollout_end()
        return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, continue_training)

    def _collect_act(self, obs: AgentObservation, learning_starts: int) -> np.ndarray:
        """(n_envs, A) agent-unit actions for ``obs``: the agent's acting call (``_act_call``), its key
        drawn from the collection stream ``act_key`` inside the call. The training call before it is
        settled meanwhile (:meth:`_settle_training`): its results are checked while the device acts."""
        state = self.policy.state
        call = self._act_call(obs, learning_starts)
        agent = self._local_agent_state()  # data_parallel=True: the first device's copy, not every device's
        placement = self._batch_placement
        if placement is not None and placement.process_index != 0:
            # A later process of a jax.distributed run: its step key folded with its index (_step_key).
            act_key, step_key = jax.random.split(state["act_key"])
            arguments = (*call.arguments, self._step_key(step_key))
            outputs = call.function(self._config, call.reads(agent), *arguments, **call.static)
        else:
            outputs, act_key = run_call(self._config, call, agent, state["act_key"])
        self._settle_training()  # a refused update raises here: this call's outputs are dropped
        self.policy.state = {**self.policy.state, "act_key": act_key}
        return call.finish(outputs)

    def _count_step(self, dones: np.ndarray) -> int:
        """How much ``num_timesteps`` advances for this vector step (the agent's ``_rows_in_step``)."""
        return self._rows_in_step(dones)

    def _observe_step(
        self, obs: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        """Hand a vector step's outcome to the agent (``_collect_observe``)."""
        self._collect_observe(obs, rewards, dones, infos)

    def _forget_rollouts(self) -> None:
        """Every env starts a new episode (after a reset): the agent's per-env state restarts."""
        self._rollout = None

    def _flat_last_obs(self) -> AgentObservation:
        """``_last_obs`` flattened, reusing the step's flattening unless SB3 reset the envs since."""
        if self._flat_obs is None or self._flat_obs[0] is not self._last_obs:
            self._flat_obs = (self._last_obs, self.obs_adapter.convert(self._last_obs))
        return self._flat_obs[1]

    def _terminal_observations(self, infos: list[dict], envs: np.ndarray) -> AgentObservation:
        """(len(envs), O) flat ``terminal_observation`` of the finished episodes of ``envs``."""
        observations = [infos[i].get("terminal_observation") for i in envs]
        if any(o is None for o in observations):
            raise RuntimeError(
                "The VecEnv did not report info['terminal_observation'] for a finished episode."
            )
        if isinstance(observations[0], dict):
            batch = {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        else:
            batch = np.stack(observations)  # type: ignore[assignment]
        return self.obs_adapter.convert(batch)

    # ------------------------------------------------------------------ the replay
    @property
    def _replay_window(self) -> int:
        """Rows of each sampled replay window."""
        return int(getattr(self._config, self.window_setting)) + 1

    def _new_replay(self, capacity: int) -> Any:
        """An empty replay of this agent holding ``capacity`` rows."""
        return self.replay_class(
            capacity,
            self.observation_space,
            self.action_space,
            n_envs=self.n_envs,
            fields=self._replay_fields(),
            window=self._replay_window,
            seed=self._collection_seed(),
            **self._replay_options(),
        )

    def _check_replay_buffer(self, buffer: Any) -> None:
        """Raise if ``buffer`` was not written by this agent with these spaces, sizes and n_envs."""
        if not isinstance(buffer, self.replay_class):
            raise ValueError(
                f"This replay buffer was not written by {self.agent_name} (expected a "
                f"{self.replay_class.__name__})."
            )
        if buffer.fields != self._replay_fields() or buffer.n_envs != self.n_envs:
            raise ValueError(
                "This replay buffer does not fit the model: it was saved with other spaces, model sizes or "
                f"n_envs (buffer n_envs={buffer.n_envs}, model n_envs={self.n_envs})."
            )
        if buffer.window != self._replay_window:
            name = self.window_setting
            raise ValueError(
                f"This replay buffer samples windows of {buffer.window} rows, but the model trains on "
                f"{name} + 1 = {self._replay_window}: it was saved with {name}={buffer.window - 1}. "
                f"Load it into a model with that {name}."
            )

    def save_replay_buffer(self, path: str | os.PathLike | Any) -> None:
        """The replay as arrays plus JSON metadata in one ``.npz`` archive (no pickles), written
        atomically; a path without a suffix gets SB3's ``.pkl``. In a data-parallel run over several
        processes each process writes its own replay beside ``path``:
        ``replay.pkl`` -> ``replay.process-<index>-of-<count>.pkl``."""
        if self.replay_buffer is None:
            raise ValueError(
                "There is no replay buffer to save yet: it is created by the first learn() call."
            )
        arrays, meta = self._replay_file_contents()
        if isinstance(path, (str, os.PathLike)) and self._spans_processes:
            path = distributed.shard_path(path, jax.process_index(), jax.process_count())
        if not isinstance(path, (str, os.PathLike)):
            safe_io.save_npz(path, arrays, meta)
            return

        def write(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                safe_io.save_npz(handle, arrays, meta)

        safe_io.write_atomically(path, write, ".pkl")

    def load_replay_buffer(
        self, path: Any, truncate_last_traj: bool = True, trust_pickled_code: bool = False
    ) -> None:
        """Load a replay written by :meth:`save_replay_buffer`. A pickled replay (older files) loads
        only with ``trust_pickled_code=True``: unpickling runs code stored in the file. A refused or
        mismatched file leaves the current replay in place. In a data-parallel run over several
        processes each process loads its own file (``replay.process-<index>-of-<count>.pkl``), or, if
        there is none, ``path`` itself (each process then samples it with its own stream)."""
        path, foreign = self._replay_file_of_process(path)
        what = safe_io.describe(path, "the replay file")
        if safe_io.is_zip_file(path):
            arrays, meta = safe_io.load_npz(path, what)
            self._load_replay_file(arrays, meta, what)
            if foreign:  # a file of another process (or of a one-process run): sample it otherwise
                self.replay_buffer.rng = np.random.default_rng(self._collection_seed())
            return
        if not trust_pickled_code:
            raise safe_io.UnsafeFileError(f"{what} is a pickled replay buffer. {safe_io.TRUST_HINT}")
        buffer = load_from_pkl(path, self.verbose)
        if not isinstance(buffer, ReplayBuffer):
            raise ValueError(f"{what} does not hold a replay buffer (found {type(buffer).__name__}).")
        self._check_replay_buffer(buffer)
        self.replay_buffer = buffer

    def _replay_file_of_process(self, path: Any) -> tuple[Any, bool]:
        """(the replay file this process loads for ``path``, whether it was written by another
        process). FileNotFoundError naming the per-process files of ``path`` when it is not there."""
        if not isinstance(path, (str, os.PathLike)):
            return path, False
        if self._spans_processes:
            own = distributed.shard_path(path, jax.process_index(), jax.process_count())
            if own.exists():
                return own, False
        if os.path.exists(path) or os.path.exists(f"{os.fspath(path)}.pkl"):
            return path, self._process_offset() > 0
        shards = distributed.shard_paths_of(path)
        if shards:
            raise FileNotFoundError(
                f"{os.fspath(path)!r} does not exist, but each process of a run over several processes "
                f"wrote its own replay beside it: {', '.join(str(s) for s in shards)}. Load one of them by "
                "its name (its rows only), or load them in a run of as many processes."
            )
        return path, False

    def _replay_file_contents(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, meta)`` of the replay for :meth:`save_replay_buffer`'s ``.npz``."""
        return self.replay_buffer.export_state()

    def _load_replay_file(self, arrays: dict[str, np.ndarray], meta: dict[str, Any], what: str) -> None:
        """Take the replay of a replay file's ``arrays`` and ``meta``, once it is checked against the
        model (a refused file changes nothing)."""
        buffer = replay_from_state(arrays, meta, what)
        self._check_replay_buffer(buffer)
        self.replay_buffer = buffer
