"""Environment helpers: building SB3 VecEnvs from ids and from Gymnasium vector envs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecEnvWrapper


def _monitored(make):
    return lambda: Monitor(make())


def vec_env_from_gymnasium(env: gym.vector.VectorEnv) -> VecEnv:
    """An SB3 VecEnv with the same sub-environments as a Gymnasium ``VectorEnv``.

    SB3 VecEnvs reset an env in the step that ends its episode (the final observation goes to
    ``info["terminal_observation"]``); Gymnasium's default vector envs reset one step later. Rather
    than translating between the two, the sub-environments are re-hosted:
    ``SyncVectorEnv`` -> ``DummyVecEnv`` over its env objects, ``AsyncVectorEnv`` -> ``SubprocVecEnv``
    over its env functions, and a natively vectorised env (e.g. ``gym.make_vec("CartPole-v1")``) is
    rebuilt from its registered id. Each sub-env gets SB3's ``Monitor``.
    """
    n = env.num_envs
    if isinstance(env, gym.vector.SyncVectorEnv):
        return DummyVecEnv([(lambda e=e: Monitor(e)) for e in env.envs])  # type: ignore[misc]
    if isinstance(env, gym.vector.AsyncVectorEnv):
        fns = list(env.env_fns)
        env.close()
        return SubprocVecEnv([_monitored(fn) for fn in fns])
    spec: Any = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        vector_only = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")
        kwargs = {k: v for k, v in (getattr(spec, "kwargs", {}) or {}).items() if k not in vector_only}
        env.close()
        return make_vec_env(spec.id, n_envs=n, env_kwargs=kwargs)
    raise ValueError(
        f"Cannot convert {type(env).__name__} to an SB3 VecEnv: pass the env id, a gymnasium.Env, an SB3 "
        "VecEnv, or a SyncVectorEnv/AsyncVectorEnv."
    )


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times, summing the rewards; stop early when the episode ends.

    One agent step is ``repeat`` simulator steps (the papers' DeepMind Control protocol uses 2). The
    last inner step's observation, flags and info are returned.
    """

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        if int(repeat) < 1:
            raise ValueError(f"action_repeat must be >= 1, got {repeat}.")
        self.repeat = int(repeat)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def agent_steps_per_episode(env: gym.Env) -> int | None:
    """The most agent steps an episode of ``env`` can have, where the env says so; else None.

    Read from the outermost time limit found walking the wrapper chain inwards: a ``TimeLimit``
    (``gym.make`` adds one from the spec's ``max_episode_steps``), else dm_control's own step limit
    (shimmy's dm_control envs have no ``max_episode_steps``: the simulator ends the episode after
    its time limit over the control timestep, 1,000 steps in the suite). The limit is divided by the
    repeat of every :class:`ActionRepeat` wrapped around it (integer division, as the papers'
    ``episode_length``: 1,000 simulator steps at repeat 2 are 500 agent steps).
    """
    repeat, current = 1, env
    while True:
        if isinstance(current, ActionRepeat):
            repeat *= current.repeat
        if isinstance(current, gym.wrappers.TimeLimit):
            return max(1, int(current._max_episode_steps) // repeat)
        if not isinstance(current, gym.Wrapper):
            break
        current = current.env
    spec_limit = getattr(getattr(current, "spec", None), "max_episode_steps", None)
    if spec_limit:
        return max(1, int(spec_limit) // repeat)
    step_limit = getattr(getattr(current, "_env", None), "_step_limit", None)  # dm_control.rl.control
    if isinstance(step_limit, (int, float)) and np.isfinite(step_limit) and step_limit > 0:
        return max(1, int(step_limit) // repeat)
    return None


def vec_agent_steps_per_episode(venv: VecEnv) -> int | None:
    """:func:`agent_steps_per_episode` of a VecEnv's first env (in-process VecEnvs; for others only
    the spec's ``max_episode_steps`` is known, without the action repeat)."""
    inner: Any = venv
    while isinstance(inner, VecEnvWrapper):
        inner = inner.venv
    if isinstance(inner, DummyVecEnv):
        return agent_steps_per_episode(inner.envs[0])
    spec = venv.get_attr("spec", [0])[0]
    limit = getattr(spec, "max_episode_steps", None)
    return int(limit) if limit else None


class FlattenDictObservation(gym.ObservationWrapper):
    """Concatenate a Dict of Box observations into one float32 vector, in the Dict's key order.

    The same order the agents' own observation adapter uses, so a model trained on the Dict env
    and one trained on the flattened env see identical vectors.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Dict) or not all(
            isinstance(s, gym.spaces.Box) for s in space.spaces.values()
        ):
            raise ValueError(f"FlattenDictObservation needs a Dict of Box spaces, got {space}.")
        self._keys = list(space.spaces)
        width = sum(int(np.prod(space.spaces[k].shape)) for k in self._keys)  # type: ignore[arg-type, misc]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)

    def observation(self, observation: dict) -> np.ndarray:
        return np.concatenate([np.asarray(observation[k], np.float32).reshape(-1) for k in self._keys])


DMC_EXTRA_HINT = (
    "dm_control tasks need the 'dmc' extra: pip install 'sb3_worldmodels[dmc]' (Python 3.11 or 3.12; "
    "dm_control's labmaze dependency has no wheel for Python 3.13 and needs bazel to build)."
)


def register_dm_control() -> None:
    """Import shimmy so that the ``dm_control/...`` ids are registered; a clear ImportError without
    the ``dmc`` extra. Picks headless rendering first where nothing else is set
    (:func:`use_headless_rendering`), since dm_control fixes its renderer when first imported."""
    use_headless_rendering()
    try:
        import dm_control  # noqa: F401
        import shimmy  # noqa: F401  (registers the dm_control ids)
    except ImportError as error:
        raise ImportError(f"{DMC_EXTRA_HINT} ({error})") from error


def dmc_env_id(task: str) -> str:
    """The Gymnasium id of a dm_control suite task, from any of the names papers use.

    ``"dm_control/walker-walk-v0"``, ``"walker-walk"``, ``"walker_walk"``, ``"cup-catch"``,
    ``"ball_in_cup_catch"`` and ``"cartpole-balance-sparse"`` all resolve. Importing shimmy
    registers the ids.
    """
    register_dm_control()

    if task in gym.registry:
        return task
    names: dict[str, str] = {}
    for env_id in gym.registry:
        if not env_id.startswith("dm_control/") or env_id.count("-") != 2:
            continue
        domain, name = env_id[len("dm_control/") :].rsplit("-", 1)[0].split("-", 1)
        domains = {domain, "cup"} if domain == "ball_in_cup" else {domain}
        for d in domains:
            for sep in ("-", "_"):
                names[f"{d}{sep}{name}".lower()] = env_id
                names[f"{d}{sep}{name.replace('_', '-')}".lower()] = env_id
    key = task.lower()
    if key not in names:
        suite = sorted({i for i in names.values()})
        raise ValueError(f"Unknown dm_control task {task!r}; known tasks: {', '.join(suite)}.")
    return names[key]


DMC_CAMERAS = {"quadruped": 2}
"""dm_control cameras that differ from camera 0 in both papers' pixel setups
(embodied/envs/dmc.py:10-13@2411f7d; tdmpc2/envs/dmcontrol.py:30@eece801)."""

RENDERER_HINT = (
    "dm_control renders pixels through OpenGL, and no usable renderer was found. On a machine without "
    "a display use EGL (Debian/Ubuntu: apt install libegl1; then MUJOCO_GL=egl) or OSMesa (apt install "
    "libosmesa6; MUJOCO_GL=osmesa), set before the first dm_control import."
)


def use_headless_rendering() -> None:
    """Pick EGL for MuJoCo's rendering when nothing is chosen and there is no display, as the
    DreamerV3 reference does (embodied/envs/dmc.py:17-18@2411f7d). It takes effect only before
    dm_control's renderer is first imported."""
    import os

    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"


class PixelObservation(gym.ObservationWrapper):
    """Replace a dm_control env's observation by its rendered image: (size, size, 3) uint8,
    channel-last, from ``camera`` (as embodied/envs/dmc.py:56-64@2411f7d renders it).

    A renderer that cannot start raises a RuntimeError that says how to get one.
    """

    def __init__(self, env: gym.Env, size: int = 64, camera: int = 0) -> None:
        super().__init__(env)
        if int(size) < 1:
            raise ValueError(f"size must be a positive number of pixels, got {size}.")
        self.size, self.camera = int(size), int(camera)
        self.observation_space = gym.spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        physics = self.env.unwrapped._env.physics  # type: ignore[attr-defined]
        try:
            frame = physics.render(self.size, self.size, camera_id=self.camera)
        except Exception as error:  # mujoco.FatalError, ImportError, or a context that failed
            raise RuntimeError(f"{RENDERER_HINT} ({type(error).__name__}: {error})") from error
        return np.asarray(frame, np.uint8)


class StackFrames(gym.ObservationWrapper):
    """The last ``frames`` images concatenated along the channel axis: (H, W, C) → (H, W, frames·C),
    oldest first; after a reset the first image fills every slot (tdmpc2/envs/dmcontrol.py:67-92
    @eece801, which stacks channel-first)."""

    def __init__(self, env: gym.Env, frames: int) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise ValueError(f"StackFrames needs (H, W, C) image observations, got {space}.")
        if int(frames) < 1:
            raise ValueError(f"frames must be at least 1, got {frames}.")
        self.frames = int(frames)
        h, w, c = space.shape
        self.observation_space = gym.spaces.Box(0, 255, (h, w, c * self.frames), space.dtype)
        self._stack: list[np.ndarray] = []

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(**kwargs)
        self._stack = [obs] * self.frames
        return np.concatenate(self._stack, -1), info

    def observation(self, observation: np.ndarray) -> np.ndarray:
        self._stack = [*self._stack[1:], observation]
        return np.concatenate(self._stack, -1)


def make_dmc_env(
    task: str,
    action_repeat: int = 2,
    flatten: bool = True,
    seed: int | None = None,
    pixels: bool = False,
    size: int = 64,
    camera: int | None = None,
    frame_stack: int = 1,
    **make_kwargs: Any,
) -> gym.Env:
    """A dm_control suite task as a Gymnasium env, set up as both papers run it.

    :param task: a task name in any common spelling (see :func:`dmc_env_id`).
    :param action_repeat: simulator steps per agent step (2 in both papers); rewards are summed, so an
        episode of 1,000 simulator steps is ``1000 // action_repeat`` agent steps.
    :param flatten: concatenate the Dict observation into a float32 vector (any SB3 algorithm can
        then use it; the world-model agents accept the Dict too).
    :param seed: seeds the first ``reset``.
    :param pixels: observe the rendered image instead of the state: (size, size, 3) uint8,
        channel-last, the papers' DMC-vision input (64 x 64 from camera 0, camera 2 for quadruped);
        rendered after the last repeated step. Without a display EGL is used, unless ``MUJOCO_GL``
        says otherwise (:func:`use_headless_rendering`).
    :param size: image height and width in pixels.
    :param camera: the dm_control camera id; None for the papers' choice (:data:`DMC_CAMERAS`).
    :param frame_stack: images per observation, stacked along the channels (TD-MPC2's pixel setup
        uses 3; DreamerV3's 1).
    """
    env_id = dmc_env_id(task)
    env = gym.make(env_id, **make_kwargs)
    if action_repeat > 1:
        env = ActionRepeat(env, action_repeat)
    if pixels:
        if camera is None:
            domain = env_id[len("dm_control/") :].split("-")[0]
            camera = DMC_CAMERAS.get(domain, 0)
        env = PixelObservation(env, size, camera)
        if frame_stack > 1:
            env = StackFrames(env, frame_stack)
    elif flatten:
        env = FlattenDictObservation(env)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env
