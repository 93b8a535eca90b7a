"""SeedGroupEvalCallback: SB3's ``EvalCallback`` for a model of one seed, and for a seed group an
evaluation of every seed (a group refuses SB3's own, which evaluates ``model.predict``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import sync_envs_normalization

from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.seed_lanes import interquartile_mean


class SeedGroupEvalCallback(EvalCallback):
    """SB3's ``EvalCallback`` (same arguments), which a seed group accepts.

    For a model of one seed (``model.seeds`` None, any SB3 algorithm) it is SB3's ``EvalCallback``,
    unchanged. For a seed group (``DreamerV3(..., seed=[0, 1, 2])``, ``TDMPC2`` the same) every
    ``eval_freq`` calls it evaluates each seed's model (``seed_model(i)``), one seed after another on
    the eval env (which is not reseeded between them), ``n_eval_episodes`` episodes each:

    - ``last_mean_reward`` is the mean over the seeds of each seed's mean return; it decides the best
      model (``best_model_save_path``: the whole group is saved, ``DreamerV3.load`` / ``TDMPC2.load``
      give the group back) and ``callback_on_new_best`` (e.g. ``StopTrainingOnRewardThreshold``,
      which then stops the group's ``learn``);
    - logged: ``eval/mean_reward`` (that mean), ``eval/mean_reward_iqm`` (the seeds' interquartile
      mean), ``eval/mean_ep_length`` (over every seed's episodes), ``seed_<s>/eval/mean_reward``
      (not printed to stdout), and ``eval/success_rate`` over every seed's episodes when the env's
      final infos carry ``is_success``;
    - ``evaluations.npz`` (with ``log_path``) holds ``timesteps`` (E,), ``results`` and ``ep_lengths``
      (E, seeds x n_eval_episodes), seed-major (seed ``i``'s episodes are columns
      ``i * n_eval_episodes ...``), ``seeds`` (S,), and ``successes`` as SB3 does. A group's file is
      written atomically (:func:`~sb3_worldmodels.common.safe_io.write_atomically`: an interrupted
      write leaves the previous file); a single-seed model's is written by SB3, in place.

    A model that plays several tasks (``TDMPC2MultiTask``) has its own callback,
    ``MultiTaskEvalCallback``, and refuses this one when ``learn`` starts.
    """

    evaluates_every_seed = True
    """A seed group accepts this EvalCallback (it refuses SB3's, which evaluates ``model.predict``)."""

    def _on_step(self) -> bool:
        seeds = getattr(self.model, "seeds", None)
        if seeds is None:
            return super()._on_step()
        if self.eval_freq <= 0 or self.n_calls % self.eval_freq:
            return True
        self._sync_normalization()
        returns, lengths, successes = [], [], []
        for index in range(len(seeds)):
            self._is_success_buffer = []
            episode_returns, episode_lengths = evaluate_policy(
                self.model.seed_model(index),  # type: ignore[attr-defined]
                self.eval_env,
                n_eval_episodes=self.n_eval_episodes,
                render=self.render,
                deterministic=self.deterministic,
                return_episode_rewards=True,
                warn=self.warn,
                callback=self._log_success_callback,
            )
            returns.append(np.asarray(episode_returns, np.float64))
            lengths.append(np.asarray(episode_lengths, np.int64))
            successes.extend(self._is_success_buffer)
        self._is_success_buffer = successes
        seed_means = [float(np.mean(r)) for r in returns]
        mean_reward = float(np.mean(seed_means))
        mean_length = float(np.mean(np.concatenate(lengths)))
        self._save_evaluations(seeds, returns, lengths)
        self.last_mean_reward = mean_reward
        if self.verbose >= 1:
            print(
                f"Eval num_timesteps={self.num_timesteps}, mean over {len(seeds)} seeds: "
                f"{mean_reward:.2f} (seeds: {', '.join(f'{m:.2f}' for m in seed_means)})"
            )
        for seed, seed_mean in zip(seeds, seed_means, strict=True):
            self.logger.record(f"seed_{seed}/eval/mean_reward", seed_mean, exclude="stdout")
        self.logger.record("eval/mean_reward", mean_reward)
        self.logger.record("eval/mean_reward_iqm", interquartile_mean(seed_means))
        self.logger.record("eval/mean_ep_length", mean_length)
        if successes:
            self.logger.record("eval/success_rate", float(np.mean(successes)))
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(self.num_timesteps)
        continue_training = True
        if mean_reward > self.best_mean_reward:
            if self.verbose >= 1:
                print("New best mean reward!")
            if self.best_model_save_path is not None:
                self.model.save(os.path.join(self.best_model_save_path, "best_model"))
            self.best_mean_reward = mean_reward
            if self.callback_on_new_best is not None:
                continue_training = self.callback_on_new_best.on_step()
        if self.callback is not None:
            continue_training = continue_training and self._on_event()
        return continue_training

    def _sync_normalization(self) -> None:
        """SB3's: the eval env's VecNormalize statistics follow the training env's."""
        if self.model.get_vec_normalize_env() is None:
            return
        try:
            sync_envs_normalization(self.training_env, self.eval_env)
        except AttributeError as error:
            raise AssertionError(
                "Training and eval env are not wrapped the same way (a VecNormalize on one only): wrap "
                "the eval env as the training env."
            ) from error

    def _save_evaluations(self, seeds: tuple[int, ...], returns: list[Any], lengths: list[Any]) -> None:
        """Append this evaluation (seed-major) and rewrite ``evaluations.npz`` atomically."""
        if self.log_path is None:
            return
        self.evaluations_timesteps.append(self.num_timesteps)
        self.evaluations_results.append(np.concatenate(returns).tolist())
        self.evaluations_length.append(np.concatenate(lengths).tolist())
        arrays: dict[str, Any] = dict(
            timesteps=self.evaluations_timesteps,
            results=self.evaluations_results,
            ep_lengths=self.evaluations_length,
            seeds=np.asarray(seeds),
        )
        if self._is_success_buffer:
            self.evaluations_successes.append(self._is_success_buffer)
            arrays["successes"] = self.evaluations_successes
        safe_io.write_atomically(self.log_path, lambda tmp: np.savez(tmp, **arrays), ".npz")
