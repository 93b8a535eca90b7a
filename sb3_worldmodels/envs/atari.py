"""Atari (Gymnasium's ALE, ``ale-py``) set up as the DreamerV3 reference runs it.

:func:`make_dreamer_atari_env` builds one Gymnasium env that reproduces the reference's Atari env,
``embodied/envs/atari.py`` of danijar/dreamerv3 at 2411f7d (cited below as ``atari.py:LINE``), with
the ``atari`` config's settings (``dreamerv3/configs.yaml:79,193-195@2411f7d``):

- 96 x 96 images (``configs.yaml:195`` overrides the ``env.atari`` default of 64 x 64, line 79),
  grayscale, channel-last uint8;
- the action repeated 4 times by the env itself on an ALE with frame skip 1 (``atari.py:102-120``;
  the ALEInterface keeps its default ``frame_skip`` 1), summing the rewards
  (``atari.py:103``), and stopping early at the end of the episode (``atari.py:119-120``);
- the screen is captured on the last 2 of those frames only and the observation is their
  pixel-wise maximum (``pooling: 2, aggregate: max``; ``atari.py:105-106,147-149,154-155``);
- that RGB frame is resized with Pillow's bilinear filter (``resize: pillow``;
  ``atari.py:161-165``: ``Image.fromarray(image).resize(size, Image.BILINEAR)``), then turned to
  gray as ``(image * (0.299, 0.587, 0.114)).sum(-1).astype(uint8)`` (truncating, after the resize;
  ``atari.py:12,166-167``);
- sticky actions: ALE's ``repeat_action_probability`` 0.25 (``sticky: True``; ``atari.py:59``);
- all 18 ALE actions (``actions: all``: ``getLegalActionSet``; ``atari.py:60-63``), whatever the
  game uses;
- ``lives: unused``, ``noops: 0``, ``autostart: False`` (``configs.yaml:79``);
- episodes cut after ``length`` = 108,000 emulator frames (27,000 agent steps; the class default,
  ``atari.py:20,104,110-111``, which neither config block changes); ``wrapper.length: 0`` adds no
  other limit (``configs.yaml:77``, ``dreamerv3/main.py:212-213``);
- no reward clipping (``clip_reward=False``, ``atari.py:21,152-153``).

``size=64, sticky=False, gray=False`` (with ``length=100_000``) is the ``env.atari100k`` block
(``configs.yaml:81``). At 2411f7d the ``atari100k`` config's own task is ``atari_pong``
(``configs.yaml:212-213``), which ``main.py:166,192`` builds with the ``env.atari`` block, so that
config as shipped ran 64 x 64 gray images with sticky actions; later reference code runs
``atari100k_pong``.

Where this env differs from the code at 2411f7d, it does what the code means:

- On reset the observation is the reset frame. At 2411f7d the copy meant to fill the pooling
  buffers with it runs backwards (``atari.py:143-145``, ``np.copyto(self.buffers[0], dst)``), so
  the first observation of an episode was the previous episode's last frame (black in the first
  episode); fixed upstream in e3f0224 ("Fix Atari frame maxpooling on reset").
- ``sticky=False`` turns sticky actions off. The reference sets ``repeat_action_probability``
  after ``loadROM`` (``atari.py:51-59``), and the ALE reads that setting when it loads the ROM, so
  at 2411f7d (and up to e3f0224) sticky actions stay at ALE's default 0.25 either way (checked with
  ale-py 0.12.1: with the setting made after ``loadROM``, runs with different ALE seeds diverge).
- ``autostart`` presses FIRE and UP when FIRE is in the action set. The reference tests
  ``1 in self.actionset`` (``atari.py:133``), a list of ``ale_py.Action`` values, which no int
  equals (checked with ale-py 0.12.1), so its autostart presses nothing; all its configs leave it
  off.
- A time limit (``length``) ends the episode as *truncated*; the reference marks it terminal as
  well (its observation reports ``is_terminal=is_last``, ``atari.py:173``).
- ``lives="discount"``: a lost life ends the action repeat early and is reported in
  ``info["life_loss"]``, but the episode goes on and is not terminated, which is what the reference
  does in effect (its terminal flag for a life loss, ``atari.py:113-114``, is dropped by
  ``is_terminal=is_last``, ``atari.py:173``). Gymnasium has no terminal-but-continuing step.

Reset (``atari.py:125-145``): ``reset_game``, then a uniform number of NOOPs in ``[0, noops]``
(restarting the game if it ends), then, with ``autostart``, FIRE and UP when FIRE is in the action
set; the frame after that fills every pooling slot. The reference's first observation carries
reward 0 (``atari.py:96``). Step (``atari.py:97-123``): the episode is terminated at game over and,
with ``lives="reset"``, when a life is lost while lives remain (``0 < lives < previous lives``); the
next ``reset`` then restarts the whole game (unlike SB3's ``EpisodicLifeEnv``, which continues the
same game); with ``"discount"`` and ``"reset"`` a lost life also stops the repeat. As in the
reference, frames are captured only on the last ``pooling`` repeats, so a step that stops earlier in
its repeat shows the frames of the step before. The reference seeds the ALE from its own generator
(``atari.py:46,51``); here ``reset(seed=...)`` seeds ale-py's ``AtariEnv`` (the ALE) and this env's
generator (the NOOP counts), Gymnasium's convention.
"""

from __future__ import annotations

import collections
import difflib
import re
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

LivesMode = Literal["unused", "discount", "reset"]

GRAY_WEIGHTS = np.array([0.299, 0.587, 1 - (0.299 + 0.587)])
"""RGB -> gray weights of the reference (``atari.py:12@2411f7d``), applied to the resized image."""

_OWN_SETTINGS = {
    "frameskip": "repeat",
    "repeat_action_probability": "sticky",
    "full_action_space": "full_action_space",
    "obs_type": "gray",
    "max_num_frames_per_episode": "length",
    "continuous": None,
}
_INSTALL = "pip install 'sb3_worldmodels[atari]' (or pip install ale-py)"


def _import_ale() -> Any:
    try:
        import ale_py
    except ImportError as error:
        raise ImportError(
            f"Atari environments need ale-py (0.9 or newer bundles the ROMs): {_INSTALL}."
        ) from error
    return ale_py


def atari_game_id(game: str) -> str:
    """The ALE ROM id of ``game``: "pong", "Pong", "MsPacman", "ms_pacman" and "ms-pacman" all work.

    Raises a ValueError naming the closest known games when there is none, and one that says to pass
    the game's name when given a registered Gymnasium id (whose own settings this env replaces).
    """
    ale_py = _import_ale()
    ids = list(ale_py.roms.get_all_rom_ids())
    if re.search(r"/|-v\d+$|NoFrameskip|Deterministic", game):
        raise ValueError(
            f"{game!r} is a Gymnasium env id; pass the game's name (e.g. 'Pong'): this env sets the frame "
            "skip, sticky actions and action set itself."
        )
    key = "".join(c for c in game.lower() if c.isalnum())
    by_key = {"".join(c for c in rom.lower() if c.isalnum()): rom for rom in ids}
    if key in by_key:
        return by_key[key]
    close = difflib.get_close_matches(game.lower(), ids, n=5, cutoff=0.5)
    close += [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=5, cutoff=0.5)]
    hint = ", ".join(dict.fromkeys(close)) or "none"
    raise ValueError(
        f"Unknown Atari game {game!r} (closest: {hint}); ale-py {ale_py.__version__} has {len(ids)} games, "
        "listed by ale_py.roms.get_all_rom_ids()."
    )


class DreamerAtari(gym.Env[np.ndarray, np.int64]):
    """The reference's Atari env over ale-py's ``AtariEnv`` (see the module docstring); built by
    :func:`make_dreamer_atari_env`, which documents the arguments.

    The inner ``AtariEnv`` (``self.atari``; its emulator is ``self.ale``) runs at frame skip 1 with no
    episode limit of its own; this env repeats the action, pools, resizes and handles lives. ``info``
    has ``lives``, ``life_loss`` (a life was lost in this step while lives remain) and
    ``episode_frame_number`` (emulator frames since the reset, NOOPs and autostart excluded).
    ``render()`` returns the emulator's full-size RGB screen (``render_mode="rgb_array"``).
    """

    metadata = {"render_modes": ["human", "rgb_array"]}

    def __init__(
        self,
        game: str,
        size: int = 96,
        repeat: int = 4,
        sticky: bool = True,
        gray: bool = True,
        lives: LivesMode = "unused",
        noops: int = 0,
        autostart: bool = False,
        pooling: int = 2,
        length: int | None = 108_000,
        clip_reward: bool = False,
        full_action_space: bool = True,
        **ale_kwargs: Any,
    ) -> None:
        if lives not in ("unused", "discount", "reset"):
            raise ValueError(f"lives must be 'unused', 'discount' or 'reset', got {lives!r}.")
        for name, value, low in (("size", size, 1), ("repeat", repeat, 1), ("pooling", pooling, 1)):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
        if isinstance(noops, bool) or int(noops) != noops or noops < 0:
            raise ValueError(f"noops must be an integer >= 0, got {noops!r}.")
        if length is not None and (isinstance(length, bool) or int(length) != length or length < 1):
            raise ValueError(f"length must be None or an integer >= 1 (emulator frames), got {length!r}.")
        for name in ale_kwargs:
            if name in _OWN_SETTINGS:
                own = _OWN_SETTINGS[name]
                raise TypeError(
                    f"make_dreamer_atari_env sets AtariEnv's {name!r} itself"
                    + (f"; use its {own!r} argument." if own else ".")
                )
        ale_py = _import_ale()
        self.game = atari_game_id(game)
        self.atari = ale_py.env.AtariEnv(
            game=self.game,
            obs_type="rgb",
            frameskip=1,
            repeat_action_probability=0.25 if sticky else 0.0,
            full_action_space=full_action_space,
            **ale_kwargs,
        )
        self.ale: Any = self.atari.ale
        self._action_enum: Any = ale_py.Action  # NOOP, FIRE, UP: the reference's ACTION_MEANING ids 0-2
        self.render_mode = self.atari.render_mode
        self.size, self.repeat, self.pooling, self.noops = int(size), int(repeat), int(pooling), int(noops)
        self.sticky, self.gray, self.lives = bool(sticky), bool(gray), lives
        self.autostart, self.clip_reward = bool(autostart), bool(clip_reward)
        self.length = None if length is None else int(length)
        getter = self.ale.getLegalActionSet if full_action_space else self.ale.getMinimalActionSet
        self.action_set = list(getter())
        height, width = self.ale.getScreenDims()
        self._buffers = collections.deque(
            [np.zeros((height, width, 3), np.uint8) for _ in range(self.pooling)], maxlen=self.pooling
        )
        self._prevlives = 0
        self._frames = 0
        self.observation_space = spaces.Box(0, 255, (self.size, self.size, 1 if gray else 3), np.uint8)
        self.action_space = spaces.Discrete(len(self.action_set))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)  # this env's np_random draws the NOOP counts
        self.atari.reset(seed=seed, options=options)  # seeds the ALE when asked, then reset_game
        ale, Action = self.ale, self._action_enum
        for _ in range(int(self.np_random.integers(self.noops + 1))):
            ale.act(Action.NOOP)
            if ale.game_over(with_truncation=False):
                ale.reset_game()
        if self.autostart and Action.FIRE in self.action_set:
            for action in (Action.FIRE, Action.UP):
                ale.act(action)
                if ale.game_over(with_truncation=False):
                    ale.reset_game()
        self._render()
        for buffer in list(self._buffers)[1:]:
            np.copyto(buffer, self._buffers[0])
        self._prevlives = ale.lives()
        self._frames = 0
        return self._observation(), {"lives": self._prevlives, "life_loss": False, "episode_frame_number": 0}

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_space.contains(action):
            raise ValueError(f"Action {action!r} is not in {self.action_space}.")
        ale, act = self.ale, self.action_set[int(action)]
        reward = 0.0
        terminated = truncated = life_loss = False
        for repeat in range(self.repeat):
            reward += ale.act(act)
            self._frames += 1
            if repeat >= self.repeat - self.pooling:
                self._render()
            if ale.game_over(with_truncation=False):
                terminated = True
            if self.length is not None and self._frames >= self.length:
                truncated = True
            lives = ale.lives()
            if 0 < lives < self._prevlives:
                life_loss = True
                terminated = terminated or self.lives == "reset"
            self._prevlives = lives
            if terminated or truncated or (life_loss and self.lives != "unused"):
                break
        if self.clip_reward:
            reward = float(np.sign(reward))
        info = {"lives": self._prevlives, "life_loss": life_loss, "episode_frame_number": self._frames}
        return self._observation(), float(reward), terminated, truncated and not terminated, info

    def render(self) -> np.ndarray | None:
        return self.atari.render()

    def close(self) -> None:
        self.atari.close()

    def _render(self) -> None:
        self._buffers.appendleft(self._buffers.pop())
        self.ale.getScreenRGB(self._buffers[0])

    def _observation(self) -> np.ndarray:
        from PIL import Image

        image = np.amax(np.stack(self._buffers), 0)
        image = np.asarray(Image.fromarray(image).resize((self.size, self.size), Image.Resampling.BILINEAR))
        if self.gray:
            image = (image * GRAY_WEIGHTS).sum(-1).astype(np.uint8)[:, :, None]
        return image


def make_dreamer_atari_env(
    game: str,
    size: int = 96,
    repeat: int = 4,
    sticky: bool = True,
    gray: bool = True,
    lives: LivesMode = "unused",
    noops: int = 0,
    autostart: bool = False,
    pooling: int = 2,
    length: int | None = 108_000,
    seed: int | None = None,
    clip_reward: bool = False,
    full_action_space: bool = True,
    **ale_kwargs: Any,
) -> gym.Env:
    """An Atari game as a Gymnasium env with DreamerV3's Atari settings (the reference's ``atari``
    config; the module docstring cites each one).

    The observation is a uint8 image, ``(size, size, 1)`` gray or ``(size, size, 3)`` RGB,
    channel-last; the actions are ``Discrete(18)`` (all ALE actions). Any SB3 algorithm can use it;
    wrap it with SB3's ``make_vec_env`` (which adds ``Monitor``). Not to be confused with SB3's
    ``make_atari_env``, which builds a VecEnv with the DQN-style ``AtariWrapper`` (84 x 84 gray,
    30 random NOOPs, a life loss ends the episode, clipped rewards) that DreamerV3 does not use.

    The defaults are the ``atari`` config (Atari 200M in the paper). The ``env.atari100k`` block is
    ``size=64, sticky=False, gray=False, length=100_000``.

    :param game: the game, e.g. "Pong", "MsPacman" or "ms_pacman" (ALE ROM ids; ale-py 0.9 and newer
        ship the ROMs). Not a Gymnasium id such as "ALE/Pong-v5".
    :param size: image height and width in pixels (64 or 96 in the reference's settings).
    :param repeat: emulator frames per agent step (action repeat, "frame skip"); rewards are summed.
    :param sticky: ALE's sticky actions, ``repeat_action_probability=0.25``; False for 0.
    :param gray: one luminance channel instead of RGB.
    :param lives: "unused" (a lost life changes nothing), "discount" (a lost life ends the action
        repeat early and sets ``info["life_loss"]``; the episode goes on, as in the reference) or
        "reset" (a lost life terminates the episode; the next reset starts a new game).
    :param noops: at reset, a uniform number of NOOP frames in ``[0, noops]``.
    :param autostart: at reset, press FIRE then UP (games that need FIRE to start).
    :param pooling: pixel-wise maximum over the last ``pooling`` frames of each step.
    :param length: episode limit in emulator frames (108,000 = 30 minutes of play, 27,000 agent steps
        at ``repeat=4``), ending the episode as truncated; None for no limit.
    :param seed: seeds the first ``reset`` (the ALE's randomness, sticky actions, NOOP counts) and the
        action space.
    :param clip_reward: replace each step's reward by its sign (the reference's option, off in its
        configs).
    :param full_action_space: False for the game's minimal action set (the reference's
        ``actions: needed``).
    :param ale_kwargs: passed to ale-py's ``AtariEnv``: ``mode``, ``difficulty``, ``render_mode``.
    :raises ImportError: when ale-py is not installed.
    :raises ValueError: for an unknown game (naming the closest ones) or an invalid setting.
    """
    env = DreamerAtari(
        game, size=size, repeat=repeat, sticky=sticky, gray=gray, lives=lives, noops=noops,
        autostart=autostart, pooling=pooling, length=length, clip_reward=clip_reward,
        full_action_space=full_action_space, **ale_kwargs,
    )  # fmt: skip
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env
