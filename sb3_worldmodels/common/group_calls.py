"""A seed group's training calls as data: one ``train``'s round, a dispatched call, a call staged before
its step's env step, and the per-seed padding and metric means they need
(:class:`~sb3_worldmodels.common.seed_group.SeedGroup` dispatches and settles them)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from sb3_worldmodels.common.training import copy_to_host_async


@dataclasses.dataclass
class GroupRound:
    """The calls of one group ``train``: each seed's owed updates, the mean learning rate, each settled
    call's metrics {key: (S, k)}."""

    owed: np.ndarray
    lr: float
    metrics: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)


class GroupCall(NamedTuple):
    """A group's training call dispatched and not yet checked."""

    round: GroupRound
    before: Any  # the agent state before the call: kept when one of its updates is refused
    metrics: Any  # PackedMetrics with a leading seed axis, on the device
    outputs: tuple[Any, ...]
    batches: list[Any]  # each seed's training batch (None: no update owed), committed once checked
    counts: np.ndarray  # (S,) the updates each seed ran
    done: int  # the updates of the same ``train`` before it
    k: int

    def copy_to_host_async(self) -> None:
        copy_to_host_async((self.metrics, self.outputs))


class GroupStaged(NamedTuple):
    """A group's training call dispatched before its step's env step (``_Staged`` of one model)."""

    call: GroupCall
    state: Any  # the call's new agent state
    timesteps: int  # num_timesteps after the step
    rates: bytes  # the (S,) learning rates it ran with
    sampled: list[Any]  # each seed's replay random state after the call's batches were drawn


def update_means(metrics: dict[str, np.ndarray], owed: np.ndarray) -> list[dict[str, float]]:
    """Per update index u, each ``train/<key>`` averaged over the seeds that ran update u
    (``metrics``: {key: (S, U)}, seed i's updates the first ``owed[i]`` of its row)."""
    rows = []
    for u in range(int(owed.max(initial=0))):
        seeds = owed > u
        ran = {key: values[seeds, u].astype(np.float64) for key, values in metrics.items()}
        rows.append({f"train/{key}": float(np.mean(values)) for key, values in ran.items()})
    return rows


def padded_batches(batches: list[Any], k: int) -> list[Any]:
    """Every seed's (numpy) batch with k updates: a seed that owes fewer gets zero batches for the
    rest (its updates there are not run), one that owes none zeros throughout."""
    template = next(b for b in batches if b is not None)

    def pad(leaf: Any, like: Any) -> Any:
        rows = 0 if leaf is None else leaf.shape[0]
        if rows == k:
            return leaf
        zeros = np.zeros((k - rows, *like.shape[1:]), like.dtype)
        return zeros if leaf is None else np.concatenate([leaf, zeros])

    return [
        jax.tree_util.tree_map(lambda like: pad(None, like), template)
        if b is None
        else jax.tree_util.tree_map(pad, b, template)
        for b in batches
    ]
