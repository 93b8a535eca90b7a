"""Where numpy meets JAX: observation and action conversion between SB3 envs and the agents.

The agents see flat float32 observation vectors (with uint8 channel-last images beside them when the
observation has images) and actions in the agent's own units: a vector in
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


AgentObservation = np.ndarray | dict[str, np.ndarray]
"""A batch of observations as the agents take them: the flat float32 vectors (n, O), or, for an
observation with images, a dict with "image" (n, H, W, C) uint8 and, when it also has vector keys,
"vector" (n, O) float32."""


def _is_image(space: spaces.Space) -> bool:
    """Rank 3 is an image, as the reference routes keys by rank (nets.py:238-239@2411f7d); a 2-D uint8
    Box is a grayscale image without a channel axis (Gymnasium's Atari ``obs_type="grayscale"``)."""
    return isinstance(space, spaces.Box) and (
        len(space.shape) == 3 or (space.dtype == np.uint8 and len(space.shape) == 2)
    )


def _box_is_vector(space: spaces.Box) -> bool:
    return len(space.shape) <= 1 or (len(space.shape) == 2 and space.dtype != np.uint8)


@dataclass(frozen=True)
class ImageInput:
    """One image of an observation: where it is, and how it becomes (H, W, C) uint8 channel-last."""

    key: str
    """The Dict key, "" for a Box observation."""
    shape: tuple[int, int, int]
    """(H, W, C) as the agent sees it."""
    channels_first: bool
    """The space is (C, H, W), as SB3's ``VecTransposeImage`` makes it."""

    @classmethod
    def from_space(cls, key: str, space: spaces.Box, agent: str) -> ImageInput:
        where = f"Image observation {key!r}" if key else "Image observation"
        if space.dtype != np.uint8:
            bounded = np.all(space.low == 0) and np.all(space.high == 255)
            if not np.issubdtype(space.dtype, np.floating) or not bounded:
                raise UnsupportedSpaceError(
                    f"{where} {space}: {agent} stores pixels as uint8 in 0..255. Use a uint8 image space, "
                    "or a float space with low=0 and high=255 (e.g. multiply [0, 1] images by 255)."
                )
        shape = tuple(int(d) for d in space.shape)
        if len(shape) == 2:
            return cls(key, (shape[0], shape[1], 1), False)
        # SB3's rule (is_image_space_channels_first): the smallest axis first means channels first.
        first = int(np.argmin(shape)) == 0 and shape[0] < shape[-1]
        hwc = (shape[1], shape[2], shape[0]) if first else shape
        return cls(key, hwc, first)  # type: ignore[arg-type]

    def convert(self, image: Any, n: int, where: str) -> np.ndarray:
        """(n, *space shape) or (n, H, W, C) → (n, H, W, C) uint8; refuses other shapes and float pixels
        outside [0, 255] or not finite."""
        image = np.asarray(image)
        name = f"Image observation {self.key!r}" if self.key else "Image observation"
        expected = self.shape[2:] + self.shape[:2] if self.channels_first else self.shape
        # Channel-last images are taken for a channel-first space too, as SB3's predict takes an
        # untransposed observation of a VecTransposeImage env (preprocessing.maybe_transpose).
        move = self.channels_first and image.shape[1:] == expected and expected != self.shape
        if image.shape[1:] == self.shape[:2] and self.shape[2] == 1:
            image = image[..., None]
        elif image.shape[1:] not in (expected, self.shape):
            raise ValueError(
                f"{name} has shape {image.shape[1:]} per env{where}, expected {expected} as the observation "
                "space says. Resize the env's images to the space's size (e.g. gymnasium.wrappers."
                "ResizeObservation) or fix the space."
            )
        if image.dtype != np.uint8:
            if not np.issubdtype(image.dtype, np.number) or image.dtype.kind == "c":
                raise ValueError(f"{name} has dtype {image.dtype}{where}: pixels must be uint8 or floats.")
            bad = ~(np.isfinite(image) & (image >= 0) & (image <= 255))
            if np.any(bad):
                index = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"{name} holds {image[index]} at {index}{where}: pixels must be finite and within "
                    "[0, 255] (they are stored as uint8). Scale [0, 1] images by 255 or pass uint8 images."
                )
            image = np.rint(image).astype(np.uint8)
        if move:
            image = np.moveaxis(image, 1, -1)
        return np.ascontiguousarray(image.reshape(n, *self.shape))


@dataclass(frozen=True)
class ObservationAdapter:
    """Turns Box or Dict-of-Box observations into what the agents take (:data:`AgentObservation`).

    Vector parts: Dict keys are concatenated in the key order of the Dict space; scalar keys count as
    one value; float64 becomes float32. Images (rank 3, or 2-D uint8) stay images: channel-first ones
    (SB3's ``VecTransposeImage``) are moved to channel-last, several image keys are stacked along the
    channels (they must share height and width), float pixels in [0, 255] are stored as uint8.
    """

    space: spaces.Space
    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    images: tuple[ImageInput, ...] = ()

    @classmethod
    def from_space(cls, space: spaces.Space, agent: str, allow_images: bool = False) -> ObservationAdapter:
        kinds = (
            "Box vectors, images and Dict spaces of them"
            if allow_images
            else "flat Box vectors and Dict spaces of Box vectors"
        )
        supported = f"{agent} supports {kinds} (e.g. dm_control through shimmy)"
        if isinstance(space, spaces.Box):
            if _is_image(space):
                _refuse_images(space, agent, allow_images)
                return cls(space, (), (), (ImageInput.from_space("", space, agent),))
            if not _box_is_vector(space):
                raise UnsupportedSpaceError(f"Observation space {space} is not flat: {supported}.")
            return cls(space, ("",), (int(np.prod(space.shape, dtype=np.int64)),))
        if isinstance(space, spaces.Dict):
            keys, sizes, images = [], [], []
            for key, sub in space.spaces.items():
                if isinstance(sub, spaces.Box) and _is_image(sub):
                    _refuse_images(sub, agent, allow_images, key)
                    images.append(ImageInput.from_space(key, sub, agent))
                    continue
                if not isinstance(sub, spaces.Box) or not _box_is_vector(sub):
                    raise UnsupportedSpaceError(f"Dict observation key {key!r} has space {sub}: {supported}.")
                keys.append(key)
                sizes.append(int(np.prod(sub.shape, dtype=np.int64)))
            if len({image.shape[:2] for image in images}) > 1:
                shapes = {image.key: image.shape[:2] for image in images}
                raise UnsupportedSpaceError(
                    f"Image keys of different sizes {shapes}: {agent} stacks them along the channels, so "
                    "they must share height and width. Resize them to one size."
                )
            return cls(space, tuple(keys), tuple(sizes), tuple(images))
        raise UnsupportedSpaceError(f"Observation space {space} is not supported: {supported}.")

    @property
    def dim(self) -> int:
        """Width of the vector part (0 for an image alone)."""
        return int(sum(self.sizes))

    @property
    def decoder_keys(self) -> tuple[tuple[str, int], ...]:
        """(key, width) per vector Dict key in the flat vector's order; empty for a flat Box (one
        vector)."""
        if isinstance(self.space, spaces.Dict):
            return tuple(zip(self.keys, self.sizes, strict=True))
        return ()

    @property
    def image_shape(self) -> tuple[int, ...]:
        """(H, W, C) of the images stacked along the channels; empty without an image."""
        if not self.images:
            return ()
        height, width, _ = self.images[0].shape
        return (height, width, sum(image.shape[2] for image in self.images))

    @property
    def image_keys(self) -> tuple[tuple[str, int], ...]:
        """(key, channels) per image Dict key in the channels' order; empty for a Box image."""
        if isinstance(self.space, spaces.Dict):
            return tuple((image.key, image.shape[2]) for image in self.images)
        return ()

    def is_batched(self, obs) -> bool:
        """Whether ``obs`` carries a leading batch axis (SB3's vectorised-observation test)."""
        if isinstance(self.space, spaces.Dict):
            key = next(iter(self.space.spaces))
            return np.asarray(obs[key]).ndim > len(self.space.spaces[key].shape)  # type: ignore[arg-type]
        return np.asarray(obs).ndim > len(self.space.shape)  # type: ignore[arg-type]

    def convert(self, obs, where: str = "") -> AgentObservation:
        """A batch of env observations (n, *shape), or a dict of those → :data:`AgentObservation`;
        raises on NaN or inf, on images of another shape and on pixels outside [0, 255] (``where`` is
        added to the message, e.g. " at step 120")."""
        if isinstance(self.space, spaces.Dict):
            if not isinstance(obs, dict):
                keys = list(self.space.spaces)
                raise TypeError(f"Expected a dict observation with keys {keys}, got {type(obs).__name__}.")
            missing = [k for k in self.space.spaces if k not in obs]
            if missing:
                raise KeyError(f"Observation is missing keys {missing}; expected {list(self.space.spaces)}.")
            first = next(iter(self.space.spaces))
            if np.asarray(obs[first]).ndim <= len(self.space.spaces[first].shape):  # type: ignore[arg-type]
                raise ValueError("convert expects batched observations")
            n = np.asarray(obs[first]).shape[0]
            parts = [np.asarray(obs[k], dtype=np.float32).reshape(n, -1) for k in self.keys]
            flat = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.float32)
        elif self.images:
            n, flat = np.asarray(obs).shape[0], None
        else:
            arr = np.asarray(obs, dtype=np.float32)
            n, flat = arr.shape[0], arr.reshape(arr.shape[0], -1)
        if flat is not None:
            self._check_vector(flat, where)
        if not self.images:
            return flat  # type: ignore[return-value]
        images = [image.convert(obs[image.key] if image.key else obs, n, where) for image in self.images]
        out = {"image": images[0] if len(images) == 1 else np.concatenate(images, axis=-1)}
        if self.dim:
            out["vector"] = flat  # type: ignore[assignment]
        return out

    def _check_vector(self, flat: np.ndarray, where: str) -> None:
        if flat.shape[1] != self.dim:
            raise ValueError(f"Observation has {flat.shape[1]} values per env, expected {self.dim}.")
        bad = first_non_finite(flat)
        if bad is not None:
            raise ValueError(
                f"Non-finite observation (NaN or inf) from env {bad[0]}, index {bad[1]}{where}: the world "
                "model cannot train on it. Check the environment (or wrap it to clip/replace invalid values)."
            )


def _refuse_images(space: spaces.Box, agent: str, allow_images: bool, key: str = "") -> None:
    if not allow_images:
        where = f"Dict observation key {key!r} holds an image" if key else "Image observations"
        raise UnsupportedSpaceError(
            f"{where} {space}: {agent} does not learn from pixels yet. Use DreamerV3 for images, or the "
            "environment's state observation."
        )


def observation_rows(obs: AgentObservation) -> int:
    """The batch size n of an :data:`AgentObservation`."""
    return int((obs["image"] if isinstance(obs, dict) else obs).shape[0])


def map_observation(fn: Any, obs: AgentObservation) -> Any:
    """``fn`` applied to each array of an :data:`AgentObservation` (the same structure back)."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


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


class NonFiniteActionError(FloatingPointError):
    """The agent produced a NaN or infinite action; it was neither sent to an env nor returned."""


def refuse_non_finite_actions(actions: np.ndarray, where: str) -> None:
    """NonFiniteActionError when an agent's ``actions`` hold NaN or inf (``where`` locates it)."""
    if not np.all(np.isfinite(actions)):
        raise NonFiniteActionError(
            f"The agent produced a non-finite action{where}; it was not sent to the env. Its parameters "
            "or carried state hold NaN or inf (e.g. set by set_parameters); load a good checkpoint."
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
