"""The SB3 ``policy`` object of a JAX agent: a tensor adapter around the agent's state pytree.

SB3 saves ``policy.state_dict()`` with ``torch.save`` and loads it with ``weights_only=True``; so
the JAX state is stored as a flat dict of CPU tensors keyed by the pytree path, and restored into
the template pytree that the (saved) configuration builds. Keys, shapes and dtypes are checked
before anything is replaced: a failed load changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_worldmodels.common.boundary import check_finite_arrays

PREFIX = "state/"


def flatten_state(tree: Any) -> dict[str, np.ndarray]:
    """Pytree -> {path: numpy array}; paths are jax key paths (stable for dicts and NamedTuples)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}


def restore_state(template: Any, flat: dict[str, np.ndarray], what: str) -> Any:
    """Fill ``template``'s structure with the arrays of ``flat``; RuntimeError on any mismatch."""
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    expected = {jax.tree_util.keystr(p): leaf for p, leaf in paths_leaves}
    missing = sorted(set(expected) - set(flat))
    extra = sorted(set(flat) - set(expected))
    if missing or extra:
        raise RuntimeError(
            f"The checkpoint does not fit this {what}: {len(missing)} missing and {len(extra)} unexpected "
            f"entries (e.g. missing {missing[:3]}, unexpected {extra[:3]}). It was saved by another "
            "algorithm or with different architecture settings (model_size, widths, spaces)."
        )
    leaves = []
    for path, leaf in paths_leaves:
        key = jax.tree_util.keystr(path)
        value = np.asarray(flat[key])
        want_shape = tuple(np.shape(leaf))
        if value.shape != want_shape:
            raise RuntimeError(
                f"The checkpoint does not fit this {what}: {key} has shape {value.shape}, expected "
                f"{want_shape} (different architecture settings or spaces)."
            )
        leaves.append(value.astype(np.asarray(leaf).dtype, copy=False))
    return jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(v) for v in leaves])


class JaxPolicy(BasePolicy):
    """Holds the agent state pytree (``self.state``) for SB3's save/load and parameter API.

    It owns no torch parameters; ``state_dict``/``load_state_dict`` convert the pytree to and from
    CPU tensors. ``predict`` is the algorithm's (RecurrentPPO's protocol: it carries a state). A policy
    alone cannot be saved or loaded: its template state is built by the algorithm's configuration,
    so ``model.save`` / ``Algo.load`` are the way.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Callable[[float], float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(observation_space, action_space)
        self.state: Any = None
        self.training = False
        self.algorithm_predict: Callable[..., Any] | None = None  # set by the algorithm

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """The algorithm's ``predict`` (same arguments and returns)."""
        if self.algorithm_predict is None:
            raise RuntimeError("This policy is not attached to a model: call model.predict().")
        return self.algorithm_predict(observation, state, episode_start, deterministic)

    def _predict(self, observation, deterministic: bool = False):  # pragma: no cover - SB3 hook
        raise NotImplementedError("Use predict(): the agents carry a recurrent state.")

    def save(self, path: Any) -> None:
        raise NotImplementedError(
            "A world-model policy is saved with its model: model.save(path), then Algo.load(path) "
            "(its state is shaped by the algorithm's configuration, which the policy alone lacks)."
        )

    @classmethod
    def load(cls, path: Any, device: Any = "auto") -> Any:
        raise NotImplementedError(
            "A world-model policy is loaded with its model: DreamerV3.load(path) or TDMPC2.load(path), "
            "then model.policy."
        )

    def set_training_mode(self, mode: bool) -> None:
        self.training = mode

    def state_dict(self, *args, floats_only: bool = False, **kwargs) -> dict[str, th.Tensor]:  # type: ignore[override]
        """Every leaf of the state as a CPU tensor; ``floats_only``: the float leaves alone (weights,
        optimiser moments, statistics), without PRNG keys and counters."""
        if self.state is None:
            return {}
        out = {}
        for key, value in flatten_state(self.state).items():
            if floats_only and value.dtype.kind != "f":
                continue
            if value.dtype.kind == "u":  # torch lacks general unsigned support: PRNG keys travel as int64
                value = value.astype(np.int64)
            out[PREFIX + key] = th.from_numpy(np.array(value, copy=True))
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Replace the state's leaves by ``state_dict``'s, all checked first (a failure changes nothing).

        ``strict``: every float leaf must be given (PRNG keys and counters may be left out: the current
        ones stay) and no unknown entry; otherwise a leaf not given keeps its value and unknown entries
        are returned as unexpected (torch's meaning). Shapes must match either way."""
        if self.state is None:
            raise RuntimeError("The policy has no template state: build the model before loading weights.")
        flat = {}
        for key, value in state_dict.items():
            if not key.startswith(PREFIX):
                raise RuntimeError(
                    f"Unexpected parameter {key!r}: this checkpoint was not written by an "
                    "sb3_worldmodels agent."
                )
            flat[key[len(PREFIX) :]] = value.detach().cpu().numpy() if isinstance(value, th.Tensor) else value
        check_finite_arrays(
            flat,
            "The checkpoint or parameter dict",
            "a model with NaN or inf weights acts and trains on NaN. Load an earlier checkpoint.",
        )
        current = flatten_state(self.state)
        missing = [key for key in current if key not in flat]
        unexpected = [] if strict else [key for key in flat if key not in current]
        keep = [key for key in missing if not strict or current[key].dtype.kind != "f"]
        flat = {
            **{key: current[key] for key in keep},
            **{k: v for k, v in flat.items() if k not in unexpected},
        }
        self.state = restore_state(self.state, flat, type(self).__name__)
        return th.nn.modules.module._IncompatibleKeys(
            [] if strict else [PREFIX + key for key in missing], [PREFIX + key for key in unexpected]
        )
