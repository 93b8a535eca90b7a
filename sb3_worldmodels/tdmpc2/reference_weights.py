"""Weights of the reference TD-MPC2 (nicklashansen/tdmpc2) in our parameter tree.

The reference saves ``{"model": WorldModel.state_dict()}`` (``tdmpc2.py`` ``save``). Its PyTorch
layouts map onto :mod:`.networks`' tree as follows: a ``Linear`` weight (out, in) becomes our kernel
(in, out); a ``NormedLinear``'s ``ln.weight`` / ``ln.bias`` our ``norm`` ``scale`` / ``bias``; the Q
ensemble's flat ``_Qs.params.j`` list holds, per member layer i, weight, bias, LayerNorm weight and
LayerNorm bias at j = 4i … 4i + 3, and the last layer's weight and bias at the end. A multi-task
model's ``_task_emb.weight`` (tasks, task_dim) is our ``task_emb``.

Used by the parity tests (recorded parameters) and to run a reference checkpoint with our planner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MODULES = {"encoder": "_encoder.state", "dynamics": "_dynamics", "reward": "_reward", "pi": "_pi"}
"""Our module name → the reference's ``state_dict`` prefix (``termination`` is added when episodic)."""


def _numpy(value: Any) -> np.ndarray:
    """A torch tensor or array → float32 numpy (no torch import needed for numpy input)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, np.float32)


def _module(sd: Mapping[str, Any], prefix: str) -> dict:
    """``prefix.i.weight`` … for every layer i present → ``{"i": layer}`` (normed where ``ln`` exists)."""
    indices = sorted(
        {int(m.group(1)) for k in sd if (m := re.fullmatch(re.escape(prefix) + r"\.(\d+)\.weight", k))}
    )
    if not indices:
        raise KeyError(f"the state_dict has no layers under {prefix!r}; is it a TD-MPC2 WorldModel?")
    layers = {}
    for i in indices:
        name = f"{prefix}.{i}"
        layer: dict[str, Any] = {"kernel": _numpy(sd[f"{name}.weight"]).T, "bias": _numpy(sd[f"{name}.bias"])}
        if f"{name}.ln.weight" in sd:
            layer["norm"] = {"scale": _numpy(sd[f"{name}.ln.weight"]), "bias": _numpy(sd[f"{name}.ln.bias"])}
        layers[str(i)] = layer
    return layers


def _ensemble(sd: Mapping[str, Any], prefix: str) -> dict:
    """``prefix.params.j`` (members stacked on axis 0) → our stacked Q layers."""
    count = sum(1 for k in sd if re.fullmatch(re.escape(prefix) + r"\.params\.\d+", k))
    if count < 2 or (count - 2) % 4:
        raise KeyError(f"{prefix}.params holds {count} tensors; expected 4 per hidden layer plus 2")
    p = [_numpy(sd[f"{prefix}.params.{j}"]) for j in range(count)]
    hidden = (count - 2) // 4
    layers = {}
    for i in range(hidden):
        w, b, s, o = p[4 * i : 4 * i + 4]
        layers[str(i)] = {"kernel": np.swapaxes(w, 1, 2), "bias": b, "norm": {"scale": s, "bias": o}}
    layers[str(hidden)] = {"kernel": np.swapaxes(p[-2], 1, 2), "bias": p[-1]}
    return layers


def params_from_state_dict(sd: Mapping[str, Any], episodic: bool = False) -> tuple[dict, dict]:
    """A reference ``WorldModel.state_dict()`` (tensors or arrays) → our (params, target Q params)."""
    params: dict[str, Any] = {name: _module(sd, prefix) for name, prefix in MODULES.items()}
    params["qs"] = _ensemble(sd, "_Qs")
    if "_task_emb.weight" in sd:  # a multi-task model (world_model.py:19@b67b21c)
        params["task_emb"] = _numpy(sd["_task_emb.weight"])
    if episodic:
        params["termination"] = _module(sd, "_termination")
    target = _ensemble(sd, "_target_Qs")
    to_jax = lambda tree: jax.tree_util.tree_map(jnp.asarray, tree)  # noqa: E731
    return to_jax(params), to_jax(target)
