"""dm_control suite tasks as Gymnasium envs (through shimmy), set up as both papers run them: task
names in every paper's spelling, action repeat, state or rendered-pixel observations."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from sb3_worldmodels.envs.wrappers import ActionRepeat, FlattenDictObservation, StackFrames

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
