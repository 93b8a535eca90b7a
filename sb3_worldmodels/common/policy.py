"""The SB3 ``policy`` object of a JAX agent: a tensor adapter around the agent's state pytree.

SB3 saves ``policy.state_dict()`` with ``torch.save`` and loads it with ``weights_only=True``; so
the JAX state is stored as a flat dict of CPU tensors keyed by the pytree path, and restored into
the template pytree that the (saved) configuration builds, by the state codec of
:mod:`~sb3_worldmodels.common.checkpoints`. Keys, shapes and dtypes are checked before anything is
replaced: a failed load changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_worldmodels.common.boundary import check_finite_arrays
from sb3_worldmodels.common.checkpoints import (
    STATE_PREFIX,
    flatten_state,
    restore_state,
    state_to_tensors,
    tensors_to_arrays,
)


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
        return state_to_tensors(self.state, floats_only)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Replace the state's leaves by ``state_dict``'s, all checked first (a failure changes nothing).

        ``strict``: every float leaf must be given (PRNG keys and counters may be left out: the current
        ones stay) and no unknown entry; otherwise a leaf not given keeps its value and unknown entries
        are returned as unexpected (torch's meaning). Shapes must match either way."""
        if self.state is None:
            raise RuntimeError("The policy has no template state: build the model before loading weights.")
        flat = tensors_to_arrays(state_dict)
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
            [] if strict else [STATE_PREFIX + key for key in missing],
            [STATE_PREFIX + key for key in unexpected],
        )
