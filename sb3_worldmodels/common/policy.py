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
    join_split_leaves,
    restore_state,
    state_to_tensors,
    tensors_to_arrays,
)
from sb3_worldmodels.common.policy_file import read_policy_file, write_policy_file


class JaxPolicy(BasePolicy):
    """Holds the agent state pytree (``self.state``) for SB3's save/load and parameter API.

    It owns no torch parameters; ``state_dict``/``load_state_dict`` convert the pytree to and from
    CPU tensors. ``predict`` is the algorithm's (RecurrentPPO's protocol: it carries a state). ``save``
    writes the policy alone (configuration, spaces, acting parameters), which ``load`` rebuilds.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Callable[[float], float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(observation_space, action_space)
        self.state_version = 0
        self.state = None
        self.training = False
        self.algorithm_predict: Callable[..., Any] | None = None  # set by the algorithm
        self.policy_file_contents: Callable[[], tuple[str, dict, dict]] | None = None  # likewise

    @property
    def state(self) -> Any:
        """The agent's state pytree; every assignment counts in :attr:`state_version` (the leaves are
        immutable JAX arrays: a new state is a new pytree, assigned)."""
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        # Plain attributes, set past torch's Module.__setattr__ (a lookup of parameters, buffers and
        # submodules at each of the loop's assignments, two per step).
        object.__setattr__(self, "_state", value)
        object.__setattr__(self, "state_version", self.state_version + 1)

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """The algorithm's ``predict`` (same arguments and returns)."""
        if self.algorithm_predict is None:
            raise RuntimeError("This policy is not attached to a model: call model.predict().")
        return self.algorithm_predict(observation, state, episode_start, deterministic)

    def _predict(self, observation, deterministic: bool = False):  # pragma: no cover - SB3 hook
        raise NotImplementedError("Use predict(): the agents carry a recurrent state.")

    def save(self, path: Any) -> None:
        """Save this policy alone, for deployment: its algorithm's name, configuration, spaces and
        acting parameters, without replay or optimiser state (:mod:`~sb3_worldmodels.common.policy_file`),
        written atomically to ``path`` as named; ``JaxPolicy.load(path)`` reads it back."""
        if self.policy_file_contents is None:
            raise RuntimeError(
                "This policy is not attached to a model: save the model with model.save(path)."
            )
        write_policy_file(path, *self.policy_file_contents())

    @classmethod
    def load(cls, path: Any, device: Any = "auto") -> Any:
        """A policy saved by :meth:`save`, read without running code; its ``predict`` gives the saved
        model's deterministic actions (its non-deterministic stream starts afresh from the seed)."""
        algorithm, attributes, tensors = read_policy_file(path)
        return algorithm._from_policy_file(attributes, tensors)

    def set_training_mode(self, mode: bool) -> None:
        object.__setattr__(self, "training", mode)  # a plain attribute (SB3 sets it every vector step)

    def state_dict(self, *args, **kwargs) -> dict[str, th.Tensor]:  # type: ignore[override]
        """The float leaves of the state as CPU tensors (weights, optimiser moments, statistics), as
        torch's parameters are: ``th.rand_like`` and the like apply to each. The PRNG keys and counters
        are :meth:`keys_and_counters`."""
        if self.state is None:
            return {}
        return state_to_tensors(self.state)

    def keys_and_counters(self) -> dict[str, th.Tensor]:
        """The state's other leaves (PRNG keys and counters) as int64 CPU tensors, keyed as
        :meth:`state_dict`'s; a checkpoint stores them beside it."""
        if self.state is None:
            return {}
        return state_to_tensors(self.state, floats=False)

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
        flat = join_split_leaves(flat, current)
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
