"""Callbacks for the agents' extension phases: pretrain, post_update and eval_metrics."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback
from stable_baselines3.common.logger import Logger


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


def walk_callbacks(callback: BaseCallback | None) -> Iterator[BaseCallback]:
    """``callback`` and every callback nested in it (lists, EvalCallback's children)."""
    if callback is None:
        return
    yield callback
    if isinstance(callback, CallbackList):
        for child in callback.callbacks:
            yield from walk_callbacks(child)
    for attr in ("callback", "callback_on_new_best", "callback_after_eval"):
        nested = getattr(callback, attr, None)
        if isinstance(nested, BaseCallback) and nested is not callback:
            yield from walk_callbacks(nested)


def record_extra_metrics(logger: Logger, extra: dict[str, float] | None) -> None:
    """Record the metrics a :class:`WorldModelCallback` phase returned."""
    for key, value in (extra or {}).items():
        logger.record(key, value)


def emit_eval_metrics(
    callbacks: list[WorldModelCallback], evaluations: list[EvalCallback], logger: Logger
) -> None:
    """``on_eval_metrics`` of each :class:`WorldModelCallback`, after an ``EvalCallback`` evaluated."""
    for ec in evaluations:
        if ec.eval_freq > 0 and ec.n_calls % ec.eval_freq == 0 and callbacks:
            metrics = {"eval/mean_reward": float(ec.last_mean_reward)}
            if ec.evaluations_length:
                metrics["eval/mean_ep_length"] = float(np.mean(ec.evaluations_length[-1]))
            for cb in callbacks:
                record_extra_metrics(logger, cb.on_eval_metrics(dict(metrics)))
