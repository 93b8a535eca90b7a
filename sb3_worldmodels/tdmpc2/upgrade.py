"""Checkpoints of earlier releases: their state-leaf names mapped onto today's.

A saved TD-MPC2 state is a flat dict {leaf path: array}, the paths those of
``jax.tree_util.keystr`` under the agent state's own path (``prefix``). Earlier releases named
some leaves differently:

- the learning rate was one leaf of the state (``.lr``, later ``.learning_rate``); it now lives in
  each optimiser's state (``.wm_opt.hyperparams['learning_rate']``, the same for ``.pi_opt``);
- an optimiser state was Adam's moments alone (``.wm_opt.count``, ``.mu``, ``.nu``); they are now
  the first stage of the optimiser (``.wm_opt.inner_state[0].count`` ...), and the optimiser counts
  its updates itself (``.wm_opt.count``, the same number);
- a LayerNorm's parameters were ``['ln_scale']`` and ``['ln_bias']`` of its layer; they are now
  ``['norm']['scale']`` and ``['norm']['bias']`` (the shared layers' names).

:func:`upgrade_state_leaves` rewrites those names and leaves every other one as it is (a file of
today's format passes unchanged). It only renames and copies entries: what the loaded state must hold
is checked afterwards, by the loader, as for any file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["EarlierCheckpoints", "upgrade_state_leaves"]

T = TypeVar("T")

_OPTIMISERS = (".wm_opt", ".pi_opt")
_LEARNING_RATES = (".lr", ".learning_rate")
_LEARNING_RATE = ".hyperparams['learning_rate']"
_CURRENT_OPTIMISER_PARTS = (".count", ".hyperparams", ".inner_state")
_NORM_LEAVES = {"['ln_scale']": "['norm']['scale']", "['ln_bias']": "['norm']['bias']"}


def upgrade_state_leaves(flat: Mapping[str, T], prefix: str) -> dict[str, T]:
    """``flat`` with the names of earlier releases' leaves of the agent state at ``prefix`` replaced by
    today's (see the module docstring); values are kept (a value that now has two leaves is given to
    both). ``prefix``: the agent state's own path, e.g. ``"state/['agent']"``."""
    out: dict[str, T] = {}
    old_counts: dict[str, T] = {}
    for name, value in flat.items():
        if not name.startswith(prefix):
            out[name] = value
            continue
        for old, new in _NORM_LEAVES.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        rest = name[len(prefix) :]
        if rest in _LEARNING_RATES:
            for owner in _OPTIMISERS:
                out.setdefault(prefix + owner + _LEARNING_RATE, value)
            continue
        optimiser = next((prefix + o for o in _OPTIMISERS if rest.startswith((o + ".", o + "["))), None)
        if optimiser is not None:
            part = name[len(optimiser) :]
            if part == ".count" and not _has_current_layout(flat, optimiser):
                old_counts[optimiser] = value
                out[optimiser + ".inner_state[0].count"] = value
                continue
            if not part.startswith(_CURRENT_OPTIMISER_PARTS):
                out[optimiser + ".inner_state[0]" + part] = value
                continue
        out[name] = value
    for path, count in old_counts.items():
        out.setdefault(path + ".count", count)
    return out


def _has_current_layout(flat: Mapping[str, object], optimiser: str) -> bool:
    """Whether the optimiser's leaves are today's (its moments inside ``inner_state``)."""
    return any(name.startswith(optimiser + ".inner_state") for name in flat)


AGENT_STATE = "state/['agent']"
"""Where the agent state's leaves are in a model's saved parameters (``policy.state["agent"]``)."""


class EarlierCheckpoints:
    """Mixin of the TD-MPC2 algorithm classes: the parameters they load (``load``, ``set_parameters``)
    pass through :func:`upgrade_state_leaves` (the checkpoint classes' ``_renamed_weights`` hook)."""

    def _renamed_weights(self, tensors: Any) -> Any:
        tensors = super()._renamed_weights(tensors)  # type: ignore[misc]
        return upgrade_state_leaves(tensors, AGENT_STATE) if isinstance(tensors, dict) else tensors
