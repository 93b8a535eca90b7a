"""DreamerV3's Atari 100k protocol, as code.

    python benchmarks/atari_protocol.py --game Pong --seed 0          # "200m", 400K frames: a GPU
    python benchmarks/atari_protocol.py --game Pong --smoke           # tiny model, 400 frames, a CPU
    python benchmarks/compare_atari.py benchmarks/results/atari100k_dreamerv3_pong_seed0.json

The reference (danijar/dreamerv3 @2411f7d, cited as FILE:LINE) runs Atari 100k with the ``atari100k``
config block (``dreamerv3/configs.yaml:212-219``): one env (``run.num_envs: 1``), train ratio 256,
the image alone (``enc.spaces``/``dec.spaces: 'image'``). The block sets no model size, so the
network is the ``defaults`` block's (``configs.yaml:110-129``: deter 8192, hidden 1024, classes 64,
depth 64, units 1024), which is this package's ``"200m"`` preset; the smaller presets apply only where a
block merges them (``<<: *size12m`` in ``dmc_proprio``/``dmc_vision``, ``configs.yaml:234,241``).

The env: the published runs (``scores/atari100k-dreamerv3.json.gz``) were built from the
``env.atari100k`` block (``configs.yaml:81``), not the ``env.atari`` one: one frostbite episode
there lasts exactly 100,004 frames, i.e. 25,000 agent steps cut by that block's ``length: 100000``
plus the reset row (``env.atari`` keeps the class's 108,000-frame limit, ``embodied/envs/atari.py:20``).
So: 64 x 64 RGB (``gray: False``), action repeat 4, all 18 actions, no NOOPs, ``lives: unused``,
no autostart, max-pooling of the last 2 frames (the class default, ``atari.py:20``; the block has no
``pooling`` key), Pillow resizing, episodes cut at 100,000 frames. ``sticky: False`` is the block's
setting; the reference's Atari class sets ALE's ``repeat_action_probability`` after ``loadROM``
(``atari.py:51-59``), too late for the ALE to use it, so if the published runs ran that code they
had sticky actions (0.25) anyway (see ``sb3_worldmodels/envs/atari.py``); ``--sticky`` runs that.
The config as shipped names ``task: atari_pong`` (``configs.yaml:213``), which ``main.py:166,192``
would build with ``env.atari`` (64 x 64 gray, sticky, 108,000 frames); the episode lengths above say
the published runs did not; later reference code names ``atari100k_pong``.

Budget: 100,000 agent steps = 400,000 frames (the benchmark's, and the score file's last x); the
reference counts a step per replay row, reset rows included, as ``num_timesteps`` does here. The
score is the reference's: the return of the training episodes (``episode/score``), see
compare_atari.py. No separate evaluation is run. ``--smoke`` shrinks the images to 16 x 16 and the
model (train ratio 4), cuts the episodes at 100 frames and the budget to 400 frames, so the pipeline
runs in about a minute on a CPU (mostly compiling); a smoke result is marked as such and gets no
verdict.
Writes benchmarks/results/atari100k_dreamerv3_<game>_seed<seed>[_smoke].json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from evaluation import TrainEpisodes, run_record
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import DreamerV3, make_dreamer_atari_env
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS
from sb3_worldmodels.envs.atari import atari_game_id

ACTION_REPEAT = 4
PROTOCOL: dict[str, Any] = dict(
    frames=400_000,
    n_envs=1,
    kwargs=dict(model_size="200m", train_ratio=256),
    # env.atari100k (configs.yaml:81@2411f7d) in make_dreamer_atari_env's terms; pooling 2 is the
    # Atari class's default (embodied/envs/atari.py:20), which the block does not change.
    env=dict(
        size=64,
        repeat=ACTION_REPEAT,
        sticky=False,
        gray=False,
        lives="unused",
        noops=0,
        autostart=False,
        pooling=2,
        length=100_000,
        full_action_space=True,
    ),
)
SMOKE = dict(SMOKE_SETTINGS, train_ratio=4, cnn_depth=2)  # the smallest image model: mostly compiling
SMOKE_SIZE = 16  # smoke images: the pipeline is the same, the compile much shorter than at 64 x 64
SMOKE_FRAMES = 400
SMOKE_LENGTH = 100  # emulator frames per smoke episode (25 agent steps): 3 episodes end in the budget


def run(game: str, seed: int, smoke: bool = False, frames: int | None = None, sticky: bool = False) -> dict:
    env_kwargs = dict(PROTOCOL["env"], sticky=sticky)
    if smoke:
        env_kwargs.update(length=SMOKE_LENGTH, size=SMOKE_SIZE)
    frames = frames or (SMOKE_FRAMES if smoke else PROTOCOL["frames"])
    game_id = atari_game_id(game)

    def env_fn():
        return make_dreamer_atari_env(game_id, **env_kwargs)

    train_env = make_vec_env(env_fn, n_envs=PROTOCOL["n_envs"], seed=seed)
    kwargs = {**PROTOCOL["kwargs"], **(SMOKE if smoke else {})}
    model = DreamerV3("CnnPolicy", train_env, action_repeat=ACTION_REPEAT, seed=seed, **kwargs)
    train_curve: list[dict] = []
    start = time.time()
    model.learn(frames // ACTION_REPEAT, callback=TrainEpisodes(train_curve, "steps", ACTION_REPEAT))
    train_env.close()
    return {
        "agent": "dreamerv3",
        "protocol": "atari100k",
        "game": game_id,
        "seed": seed,
        "smoke": smoke,
        "frames": model.num_timesteps * ACTION_REPEAT,
        "steps": model.num_timesteps,
        "updates": model._n_updates,
        "wall_seconds": round(time.time() - start, 1),
        "settings": {"n_envs": PROTOCOL["n_envs"], "action_repeat": ACTION_REPEAT, **kwargs},
        "env": env_kwargs,
        **run_record(),
        "train_curve": train_curve,
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser()
    parser.add_argument("--game", default="Pong", help="an Atari game, e.g. Pong, MsPacman, ms_pacman")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=None, help="override the protocol's budget")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 100-frame episodes, 400 frames")
    parser.add_argument(
        "--sticky", action="store_true", help="sticky actions (0.25), as the reference's code ran in effect"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    result = run(args.game, args.seed, args.smoke, args.frames, args.sticky)
    name = f"atari100k_dreamerv3_{result['game']}_seed{args.seed}{'_smoke' if args.smoke else ''}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / name
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "train_curve"}))
    return path


if __name__ == "__main__":
    main()
