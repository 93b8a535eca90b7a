"""Crafter (``pip install crafter``) as a Gymnasium env, set up as the DreamerV3 reference runs it.

:func:`make_crafter_env` builds one Gymnasium env over ``crafter.Env`` (crafter 1.8.3) that
reproduces the reference's Crafter env, ``embodied/envs/crafter.py`` of danijar/dreamerv3 at
2411f7d (cited below as ``crafter.py:LINE``), with the ``crafter`` config's settings
(``dreamerv3/configs.yaml:80,221-231@2411f7d``: task ``crafter_reward``, one env, train ratio 512,
1.1M steps; ``dreamerv3/main.py:165-199@2411f7d`` builds it):

- 64 x 64 RGB images, channel-last uint8 (``env.crafter.size: [64, 64]``, ``configs.yaml:80``;
  ``crafter.Env(size=size, ...)``, ``crafter.py:12``);
- ``Discrete(17)`` actions, crafter's whole action set (``crafter.py:41``,
  ``crafter.constants.actions``);
- ``reward=True`` is the task ``crafter_reward``: +1 for each achievement unlocked for the first
  time in the episode, plus the change in health / 10 (crafter ``env.py:97-104``);
  ``reward=False`` is ``crafter_noreward``, whose reward crafter sets to 0 (``crafter.py:10,12``;
  crafter ``env.py:116-117``);
- the episode ends when the player dies (crafter's ``done`` with ``info["discount"] == 0``) or after
  crafter's own limit of 10,000 steps (crafter ``env.py:29,105-107``; the reference does not pass
  ``length``, and ``wrapper.length: 0`` adds no other limit, ``configs.yaml:77``,
  ``main.py:212-213``). The reference reports ``is_last=done`` and
  ``is_terminal=info["discount"] == 0`` (``crafter.py:53,58-61``): death is terminal, the time limit
  is not. Here death is ``terminated`` and the time limit ``truncated``, the same split
  (consistent with deviation D21; no departure);
- seeds: ``crafter.Env`` takes one seed at construction (the reference passes ``seed=None``: its
  crafter config has no ``use_seed``, ``configs.yaml:80``, ``main.py:194-195``, so crafter draws
  one from NumPy's global generator, crafter ``env.py:32``) and each reset builds the world from
  ``hash((seed, episode))`` (crafter ``env.py:74``; a hash of ints, the same in every process).

The reference logs ``log_reward`` (the task reward whatever ``reward`` is, ``crafter.py:72``) and,
with ``logs=True``, one ``log_achievement_<name>`` count per achievement (``crafter.py:32-35,74-78``;
the crafter config keeps ``logs: False`` and ``use_logdir: False``, ``configs.yaml:80``, but sets
``log_keys_max: '^log_achievement_.*'`` and ``log_keys_sum: '^log_reward$'``,
``configs.yaml:225-226``). Here ``info`` carries crafter's own step info: ``achievements`` (the
episode's count of each of the 22 achievements, a copy), ``inventory``, ``discount``, ``semantic``
(the world's material and object ids), ``player_pos`` and ``reward`` (the task reward also when
``reward=False``, the reference's ``log_reward``). :func:`crafter_score` turns the last
``info["achievements"]`` of each episode into the Crafter score.

Where this env departs from the reference:

- Gymnasium's API: ``reset()`` returns the first image and an ``info`` with zero achievements and
  the initial inventory; the reference returns the first image from ``step`` with ``is_first``,
  reward 0 and empty logs (``crafter.py:46-52``).
- Seeding follows Gymnasium: ``reset(seed=s)`` (or ``make_crafter_env(seed=s)``, applied at the
  first reset) builds a new ``crafter.Env(seed=s)``, so its episodes are ``hash((s, 1))``,
  ``hash((s, 2))``, ... as in crafter; an unseeded first reset draws the crafter seed from this
  env's ``np_random`` (OS entropy) instead of NumPy's global generator.
- A step in which the player dies at the time limit is ``terminated`` and not ``truncated``.
- ``size`` is one int (square images); the reference's ``size`` is a pair, and crafter 1.8.3's
  observation space has the wrong shape for non-square sizes.
- The reference's ``stats.jsonl`` (``crafter.py:56-57,81-92``, off in its configs) is not written.

Crafter's world generation (opensimplex noise for each of the 64 x 64 tiles) is slow in pure Python:
about 1-2 s a reset with opensimplex 0.4.5 (a step takes about 1-3 ms). With ``numba`` installed,
opensimplex compiles its noise (a few seconds once, cached with ``NUMBA_CACHE_DIR``) and a reset
takes about 0.1 s, with the same worlds. A smaller world (``area=(32, 32)``) also resets faster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

_INSTALL = 'pip install "sb3_worldmodels[crafter]" (or pip install crafter)'


def _import_crafter() -> Any:
    try:
        import crafter
    except ImportError as error:
        raise ImportError(f"The Crafter environment needs the crafter package: {_INSTALL}.") from error
    return crafter


class CrafterEnv(gym.Env[np.ndarray, np.int64]):
    """The reference's Crafter env over ``crafter.Env`` (see the module docstring); built by
    :func:`make_crafter_env`, which documents the arguments.

    ``self.env`` is the current ``crafter.Env`` (None before the first reset); a seeded reset
    replaces it. ``achievement_names`` and ``action_names`` are crafter's. ``render()`` returns the
    current image (``render_mode="rgb_array"``).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        reward: bool = True,
        size: int = 64,
        length: int | None = 10_000,
        seed: int | None = None,
        render_mode: str | None = None,
        **crafter_kwargs: Any,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 18:
            raise ValueError(f"size must be an integer >= 18 (crafter draws 9 x 9 tiles), got {size!r}.")
        if length is not None and (
            isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1
        ):
            raise ValueError(f"length must be None or an integer >= 1 (steps), got {length!r}.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}.")
        crafter = _import_crafter()  # not kept: a module would stop the env from pickling
        self.reward, self.size = bool(reward), int(size)
        self.length = None if length is None else int(length)
        self.render_mode = render_mode
        self.crafter_kwargs = dict(crafter_kwargs)  # area, view
        self.achievement_names: tuple[str, ...] = tuple(crafter.constants.achievements)
        self.action_names: tuple[str, ...] = tuple(crafter.constants.actions)
        self.observation_space = spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        self.action_space = spaces.Discrete(len(self.action_names))
        self.env: Any = None
        self._first_seed = None if seed is None else int(seed)
        self._image: np.ndarray | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is None and self.env is None:
            seed = self._first_seed
        super().reset(seed=seed)
        if seed is not None or self.env is None:
            world_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
            self.env = _import_crafter().Env(
                size=(self.size, self.size),
                reward=self.reward,
                length=self.length or 0,  # crafter: 0 (or None) for no limit
                seed=world_seed,
                **self.crafter_kwargs,
            )
        self._image = np.ascontiguousarray(self.env.reset())
        items = _import_crafter().constants.items
        info = {
            "inventory": {name: item["initial"] for name, item in items.items()},
            "achievements": dict.fromkeys(self.achievement_names, 0),
            "discount": 1.0,
            "reward": 0.0,
        }
        return self._image, info

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.env is None:
            raise RuntimeError("Call reset() before step().")
        if not self.action_space.contains(action):
            raise ValueError(f"Action {action!r} is not in {self.action_space}.")
        image, reward, done, info = self.env.step(int(action))
        self._image = np.ascontiguousarray(image)
        terminated = info["discount"] == 0  # the player died (crafter env.py:105,111)
        truncated = bool(done) and not terminated  # crafter's step limit
        info = dict(info)
        info["achievements"] = dict(info["achievements"])  # crafter copies; copy again, cheaply
        info["player_pos"] = np.array(info["player_pos"])
        info["discount"] = float(info["discount"])
        info["reward"] = float(info["reward"])
        return self._image, float(reward), bool(terminated), truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or self._image is None:
            return None
        return self._image.copy()


def make_crafter_env(
    reward: bool = True,
    size: int = 64,
    seed: int | None = None,
    length: int | None = 10_000,
    **kwargs: Any,
) -> gym.Env:
    """Crafter as a Gymnasium env with DreamerV3's Crafter settings (the reference's ``crafter``
    config; the module docstring cites each one).

    The observation is a uint8 RGB image ``(size, size, 3)``, channel-last; the actions are
    ``Discrete(17)``. Any SB3 algorithm can use it; wrap it with SB3's ``make_vec_env`` (which adds
    ``Monitor``). ``info["achievements"]`` holds the episode's achievement counts; feed the last one
    of each episode to :func:`crafter_score`.

    :param reward: True for the task ``crafter_reward`` (the benchmark's reward), False for
        ``crafter_noreward`` (reward 0; ``info["reward"]`` still has the task reward).
    :param size: image height and width in pixels (64 in the reference; at least 18).
    :param seed: the seed of the first reset that is given none (the world of each episode follows
        from it) and of the action space. ``reset(seed=...)`` reseeds.
    :param length: episode limit in steps, ending the episode as truncated (crafter's 10,000); None
        for no limit.
    :param kwargs: passed to ``crafter.Env``: ``area`` (world size in tiles, default ``(64, 64)``),
        ``view`` (tiles seen, default ``(9, 9)``); and ``render_mode`` (None or "rgb_array").
    :raises ImportError: when crafter is not installed.
    :raises ValueError: for an invalid setting.
    """
    env = CrafterEnv(reward=reward, size=size, length=length, seed=seed, **kwargs)
    if seed is not None:
        env.action_space.seed(seed)
    return env


def crafter_success_rates(achievements: Iterable[Mapping[str, int]]) -> dict[str, float]:
    """Each achievement's success rate in percent: the share of episodes that unlocked it at least
    once, from the last ``info["achievements"]`` of each episode (crafter's
    ``analysis/common.py``, ``compute_success_rates``)."""
    episodes = list(achievements)
    if not episodes:
        raise ValueError("crafter_success_rates needs at least one episode.")
    names = sorted(set().union(*episodes))
    return {
        name: 100.0 * float(np.mean([episode.get(name, 0) >= 1 for episode in episodes])) for name in names
    }


def crafter_score(achievements: Iterable[Mapping[str, int]]) -> float:
    """The Crafter score (Hafner, 2021) of a set of episodes: ``exp(mean(log(1 + s))) - 1`` over the
    success rates ``s`` in percent of all achievements (crafter's ``analysis/common.py``,
    ``compute_scores``). Pass the last ``info["achievements"]`` of each episode; every one of
    crafter's 22 achievements should be a key (this env's dicts always have all of them)."""
    rates = np.array(list(crafter_success_rates(achievements).values()))
    return float(np.exp(np.mean(np.log1p(rates))) - 1.0)
