"""Callbacks for the agents' extension phases: pretrain, post_update and eval_metrics."""

from __future__ import annotations

from stable_baselines3.common.callbacks import BaseCallback


class WorldModelCallback(BaseCallback):
    """An SB3 callback that also hears the world-model agents' phases.

    - ``on_pretrain()``: once, right before the first update of a model.
    - ``on_post_update(metrics)``: after every update, with that update's ``train/*`` metrics.
    - ``on_eval_metrics(metrics)``: where evaluation metrics are assembled (after each evaluation of an
      ``EvalCallback`` in the same ``learn`` call), with ``eval/mean_reward`` and ``eval/mean_ep_length``.

    ``on_post_update`` and ``on_eval_metrics`` may return a dict of extra metrics; they are recorded in
    the logger. Plain SB3 hooks (``_on_step`` returning False stops training) keep their meaning.
    """

    def on_pretrain(self) -> None:
        """Called once before the first update."""

    def on_post_update(self, metrics: dict[str, float]) -> dict[str, float] | None:
        """Called after every update; may return extra metrics to log."""
        return None

    def on_eval_metrics(self, metrics: dict[str, float]) -> dict[str, float] | None:
        """Called with assembled evaluation metrics; may return extra metrics to log."""
        return None

    def _on_step(self) -> bool:
        return True
