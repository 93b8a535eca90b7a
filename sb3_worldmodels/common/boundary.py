"""Where numpy meets JAX: observation and action conversion between SB3 envs and the agents.

The agents see flat float32 observation vectors and actions in the agent's own units: a vector in
[-1, 1] (continuous, mapped onto the env's bounds here) or a one-hot vector (Discrete). Everything
that crosses the boundary is checked here, once, with errors that name the problem and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


class UnsupportedSpaceError(ValueError):
    """An observation or action space the agent cannot use."""


def _box_is_vector(space: spaces.Box) -> bool:
    return len(space.shape) <= 1 or (len(space.shape) == 2 and space.dtype != np.uint8)


def _is_image(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and (
        len(space.shape) == 3 or (space.dtype == np.uint8 and len(space.shape) >= 2)
    )


@dataclass(frozen=True)
class ObservationAdapter:
    """Flattens Box or Dict-of-Box observations into float32 vectors of width ``dim``.

    Dict observations (dm_control through shimmy) are concatenated in the key order of the Dict
    space; scalar keys count as one value. float64 becomes float32.
    """

    space: spaces.Space
    keys: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def from_space(cls, space: spaces.Space, agent: str) -> ObservationAdapter:
        supported = (
            f"{agent} supports flat Box observation vectors and Dict spaces of Box vectors "
            "(e.g. dm_control through shimmy)"
        )
        if isinstance(space, spaces.Box):
            if _is_image(space):
                raise UnsupportedSpaceError(
                    f"Image observations {space} are not supported yet: {supported}. Pixel "
                    "observations are planned; for now use the environment's state observation."
                )
            if not _box_is_vector(space):
                raise UnsupportedSpaceError(f"Observation space {space} is not flat: {supported}.")
            return cls(space, ("",), (int(np.prod(space.shape, dtype=np.int64)),))
        if isinstance(space, spaces.Dict):
            keys, sizes = [], []
            for key, sub in space.spaces.items():
                if not isinstance(sub, spaces.Box) or _is_image(sub) or not _box_is_vector(sub):
                    raise UnsupportedSpaceError(f"Dict observation key {key!r} has space {sub}: {supported}.")
                keys.append(key)
                sizes.append(int(np.prod(sub.shape, dtype=np.int64)))
            return cls(space, tuple(keys), tuple(sizes))
        raise UnsupportedSpaceError(f"Observation space {space} is not supported: {supported}.")

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    @property
    def decoder_keys(self) -> tuple[tuple[str, int], ...]:
        """(key, width) per Dict key in the flat vector's order; empty for a flat Box (one vector)."""
        if isinstance(self.space, spaces.Dict):
            return tuple(zip(self.keys, self.sizes, strict=True))
        return ()

    def is_batched(self, obs) -> bool:
        """Whether ``obs`` carries a leading batch axis (SB3's vectorised-observation test)."""
        if isinstance(self.space, spaces.Dict):
            key = self.keys[0]
            return np.asarray(obs[key]).ndim > len(self.space.spaces[key].shape)  # type: ignore[arg-type]
        return np.asarray(obs).ndim > len(self.space.shape)  # type: ignore[arg-type]

    def flatten(self, obs, where: str = "") -> np.ndarray:
        """(n, *shape) or dict of those -> (n, dim) float32; raises on NaN or inf (``where`` is added
        to that message, e.g. " at step 120")."""
        if isinstance(self.space, spaces.Dict):
            if not isinstance(obs, dict):
                raise TypeError(
                    f"Expected a dict observation with keys {self.keys}, got {type(obs).__name__}."
                )
            missing = [k for k in self.keys if k not in obs]
            if missing:
                raise KeyError(f"Observation is missing keys {missing}; expected {list(self.keys)}.")
            parts = [np.asarray(obs[k], dtype=np.float32) for k in self.keys]
            n = parts[0].shape[0] if parts[0].ndim > len(self.space.spaces[self.keys[0]].shape) else None  # type: ignore[arg-type]
            if n is None:
                raise ValueError("flatten expects batched observations")
            flat = np.concatenate([p.reshape(n, -1) for p in parts], axis=1)
        else:
            arr = np.asarray(obs, dtype=np.float32)
            flat = arr.reshape(arr.shape[0], -1)
        if flat.shape[1] != self.dim:
            raise ValueError(f"Observation has {flat.shape[1]} values per env, expected {self.dim}.")
        bad = first_non_finite(flat)
        if bad is not None:
            raise ValueError(
                f"Non-finite observation (NaN or inf) from env {bad[0]}, index {bad[1]}{where}: the world "
                "model cannot train on it. Check the environment (or wrap it to clip/replace invalid values)."
            )
        return flat


def first_non_finite(array: Any) -> tuple[int, ...] | None:
    """Index of the first NaN or inf in a float array, None when there is none (or no floats)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc" or np.all(np.isfinite(array)):
        return None
    return tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])


def check_rewards(rewards: Any, where: str = "") -> None:
    """Raise ValueError naming the env when a reward is NaN or infinite."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    bad = first_non_finite(rewards)
    if bad is not None:
        raise ValueError(
            f"Non-finite reward {rewards[bad]} from env {bad[0]}{where}: the world model would learn it "
            "and every parameter would turn NaN. Fix the env's reward (e.g. a division by zero), or wrap "
            "the env to clip or replace invalid rewards."
        )


def check_finite_arrays(arrays: dict[str, np.ndarray], what: str, fix: str) -> None:
    """Raise ValueError naming the first array (and index) that holds NaN or inf."""
    for name, array in arrays.items():
        index = first_non_finite(array)
        if index is not None:
            raise ValueError(f"{what} holds a non-finite value (NaN or inf) in {name} at {index}: {fix}")


@dataclass(frozen=True)
class ActionAdapter:
    """Maps agent actions (continuous in [-1, 1], or one-hot) to env actions and back."""

    space: spaces.Space
    discrete: bool
    dim: int

    @classmethod
    def from_space(cls, space: spaces.Space, agent: str, allow_discrete: bool = True) -> ActionAdapter:
        if isinstance(space, spaces.Discrete):
            if not allow_discrete:
                raise UnsupportedSpaceError(
                    f"{agent} supports continuous (Box) actions only, got {space}. "
                    "Use DreamerV3 for discrete actions."
                )
            if space.start != 0:
                raise UnsupportedSpaceError(f"Discrete action spaces must start at 0, got {space}.")
            return cls(space, True, int(space.n))
        if isinstance(space, spaces.Box):
            if len(space.shape) != 1:
                raise UnsupportedSpaceError(
                    f"{agent} needs a flat Box action space, got shape {space.shape}."
                )
            if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
                raise UnsupportedSpaceError(f"Box action space {space} must have finite bounds.")
            if not np.all(space.low < space.high):
                bad = int(np.flatnonzero(~(space.low < space.high))[0])
                raise UnsupportedSpaceError(
                    f"Box action space {space}: low must be below high in every dimension (dimension {bad} "
                    f"has low={space.low[bad]}, high={space.high[bad]}). Fix the env's action_space."
                )
            return cls(space, False, int(space.shape[0]))
        kinds = "Box or Discrete" if allow_discrete else "Box"
        raise UnsupportedSpaceError(f"{agent} supports {kinds} action spaces, got {space}.")

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """(n, dim) agent actions -> env actions: argmax index, or [-1, 1] clipped and rescaled."""
        if self.discrete:
            return np.argmax(action, axis=-1).astype(np.int64)
        low = self.space.low.astype(np.float64)  # type: ignore[attr-defined]
        high = self.space.high.astype(np.float64)  # type: ignore[attr-defined]
        clipped = np.clip(action, -1.0, 1.0).astype(np.float64)
        return (low + (clipped + 1.0) * 0.5 * (high - low)).astype(self.space.dtype)

    def from_env(self, env_action: np.ndarray) -> np.ndarray:
        """Env actions (n, ...) -> agent units (n, dim) float32 (one-hot, or rescaled to [-1, 1])."""
        if self.discrete:
            idx = np.asarray(env_action).reshape(-1).astype(np.int64)
            return np.eye(self.dim, dtype=np.float32)[idx]
        low = self.space.low.astype(np.float64)  # type: ignore[attr-defined]
        high = self.space.high.astype(np.float64)  # type: ignore[attr-defined]
        a = np.asarray(env_action, dtype=np.float64).reshape(-1, self.dim)
        return (2.0 * (a - low) / (high - low) - 1.0).astype(np.float32)

    def random(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, dim) uniform random agent actions."""
        if self.discrete:
            return np.eye(self.dim, dtype=np.float32)[rng.integers(0, self.dim, size=n)]
        return rng.uniform(-1.0, 1.0, size=(n, self.dim)).astype(np.float32)
