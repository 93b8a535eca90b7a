"""The callbacks of :class:`~sb3_worldmodels.tdmpc2.multitask.TDMPC2MultiTask`'s offline training: the
progress bar counted in updates and the evaluation of every task (and every seed of a group)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback, ProgressBarCallback
from stable_baselines3.common.type_aliases import MaybeCallback

from sb3_worldmodels.common.callbacks import walk_callbacks

if TYPE_CHECKING:
    from sb3_worldmodels.tdmpc2.multitask import TDMPC2MultiTask


class UpdatesProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by one gradient update per step (SB3's advances by the envs of a
    step, and training here has no env)."""

    def _on_step(self) -> bool:
        self.pbar.update(1)
        return True


def refuse_one_env_evaluation(callback: MaybeCallback) -> None:
    """Refuse an ``EvalCallback`` (SB3's, ``SeedGroupEvalCallback``) among ``learn``'s callbacks, before
    anything changes: it plays one eval env with ``model.predict``, which here plans for a named task."""
    given = callback if isinstance(callback, list) else [callback]
    for found in (c for root in given if isinstance(root, BaseCallback) for c in walk_callbacks(root)):
        if isinstance(found, EvalCallback):
            raise ValueError(
                f"{type(found).__name__} plays one eval env with model.predict, and a TDMPC2MultiTask "
                "plans for a named task (predict(obs, task=...)). Evaluate it with "
                "MultiTaskEvalCallback(envs, eval_freq=...) (from sb3_worldmodels; envs: task name -> env), "
                "which evaluates every task, and every seed of a group."
            )


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

    @property
    def _multitask(self) -> TDMPC2MultiTask:
        from sb3_worldmodels.tdmpc2.multitask import TDMPC2MultiTask  # the model's module imports this one

        if not isinstance(self.model, TDMPC2MultiTask):
            raise TypeError(
                f"MultiTaskEvalCallback evaluates a TDMPC2MultiTask, not a {type(self.model).__name__}: use "
                "SB3's EvalCallback for a single-task model."
            )
        return self.model

    def _init_callback(self) -> None:
        model = self._multitask
        for name, env in self.envs.items():  # a wrong env is refused before any update runs
            model._check_env(name, model.task_id(name), env)

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq == 0:
            self.evaluate()
        return True

    def evaluate(self) -> dict[str, float]:
        """Evaluate now, log and keep the scores. A seed group's seeds are each evaluated: their
        scores are logged as ``seed_<seed>/eval/...`` (not printed) and kept as ``seed_<seed>/<task>``
        and ``seed_<seed>/mean``; ``eval/...`` and the task keys are the means over the seeds."""
        model = self._multitask
        if model.seeds is None:
            scores = model.evaluate(self.envs, self.n_eval_episodes, self.deterministic)
            per_seed: dict[str, float] = {}
        else:
            each = [
                model.evaluate(self.envs, self.n_eval_episodes, self.deterministic, seed_index=i)
                for i in range(model.n_seeds)
            ]
            scores = {name: float(np.mean([seed_scores[name] for seed_scores in each])) for name in each[0]}
            per_seed = {
                f"seed_{seed}/{name}": score
                for seed, seed_scores in zip(model.seeds, each, strict=True)
                for name, score in seed_scores.items()
            }
            for key, score in per_seed.items():
                seed, name = key.split("/", 1)
                metric = "eval/mean_reward" if name == "mean" else f"eval/{name}/mean_reward"
                self.logger.record(f"{seed}/{metric}", score, exclude="stdout")
        for name, score in scores.items():
            self.logger.record("eval/mean_reward" if name == "mean" else f"eval/{name}/mean_reward", score)
        self.logger.record("eval/n_updates", self.num_timesteps)
        self.logger.dump(self.num_timesteps)
        self.evaluations.append({"updates": float(self.num_timesteps), **scores, **per_seed})
        if self.verbose:
            print(
                f"Eval after {self.num_timesteps} updates: "
                + ", ".join(f"{k} {v:.1f}" for k, v in scores.items())
            )
        return scores
