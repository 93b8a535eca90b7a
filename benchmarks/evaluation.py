"""What the learning benchmarks share: periodic evaluation on fresh episodes, runs split into
checkpointed segments (so a long check can span several processes), and run records."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import Logger

FLAT_FILES = {"model": "model.zip", "replay": "replay.pkl"}
"""The checkpoint file names of runs saved before progress.json named its files."""


def eval_point(
    model: BaseAlgorithm,
    returns: list[float],
    train_curve: list[dict],
    x_key: str,
    action_repeat: int,
    seconds: float,
) -> dict:
    """One evaluation point: counted steps, frames, the mean of ``returns`` and of as many recent
    training returns, the update count and the wall-clock seconds."""
    recent = [e["return"] for e in train_curve[-len(returns) :]]
    return {
        x_key: model.num_timesteps,
        "frames": model.num_timesteps * action_repeat,
        "eval_mean": float(np.mean(returns)),
        "train_mean": float(np.mean(recent)) if recent else None,
        "updates": int(model._n_updates),
        "seconds": round(seconds, 1),
    }


def record_finished_episodes(
    local_vars: dict, episodes: list[dict], x_key: str, steps: int, action_repeat: int
) -> None:
    """Append every training episode that ended in this step (SB3's Monitor info, exploration on)."""
    for info in local_vars.get("infos", []):
        if "episode" in info:
            episodes.append(
                {x_key: steps, "frames": steps * action_repeat, "return": float(info["episode"]["r"])}
            )


class EvalEvery(BaseCallback):
    """Evaluates every ``every`` counted steps (``num_timesteps``) on ``episodes`` fresh episodes.

    Each point records ``x_key`` (the counted steps), ``frames`` (steps x ``action_repeat``),
    the mean evaluation return, the update count and the wall-clock seconds; every finished
    training episode (SB3's Monitor info) is recorded in ``train_curve`` with the same counters.
    """

    def __init__(
        self,
        make_env: Callable,
        every: int,
        episodes: int,
        deterministic: bool,
        x_key: str = "steps",
        action_repeat: int = 1,
    ) -> None:
        super().__init__()
        self.env = make_env()
        self.every, self.episodes, self.deterministic = every, episodes, deterministic
        self.x_key, self.action_repeat = x_key, action_repeat
        self.next_at = every
        self.curve: list[dict] = []
        self.train_curve: list[dict] = []
        self.start = time.time()

    def evaluate(self) -> None:
        rewards, _ = evaluate_policy(
            self.model,
            self.env,
            n_eval_episodes=self.episodes,
            deterministic=self.deterministic,
            return_episode_rewards=True,
        )
        point = eval_point(
            self.model, rewards, self.train_curve, self.x_key, self.action_repeat, time.time() - self.start
        )
        self.curve.append(point)
        print(json.dumps(point), flush=True)

    def finish(self) -> None:
        """Evaluate once more unless the last point is at the final step."""
        if not self.curve or self.curve[-1][self.x_key] < self.num_timesteps:
            self.evaluate()

    def _on_step(self) -> bool:
        record_finished_episodes(
            self.locals, self.train_curve, self.x_key, self.num_timesteps, self.action_repeat
        )
        if self.every and self.num_timesteps >= self.next_at:
            self.next_at += self.every
            self.evaluate()
        return True


class TrainEpisodes(BaseCallback):
    """Records every finished training episode (SB3's Monitor info) into ``episodes``."""

    def __init__(self, episodes: list[dict], x_key: str, action_repeat: int) -> None:
        super().__init__()
        self.episodes, self.x_key, self.action_repeat = episodes, x_key, action_repeat

    def _on_step(self) -> bool:
        record_finished_episodes(
            self.locals, self.episodes, self.x_key, self.num_timesteps, self.action_repeat
        )
        return True


def learn_in_segments(
    make_model: Callable[[], BaseAlgorithm],
    total: int,
    evaluate: Callable[[BaseAlgorithm, int], list[float]],
    eval_every: int,
    checkpoint_every: int,
    checkpoint: Path | None = None,
    x_key: str = "steps",
    action_repeat: int = 1,
    stop_after_seconds: float | None = None,
    logger: Callable[[int], Logger] | None = None,
) -> tuple[BaseAlgorithm, dict]:
    """Train to ``total`` counted steps, evaluating every ``eval_every`` (0: only at the end) and,
    when ``checkpoint`` is a folder, saving model, replay and curves there every ``checkpoint_every``
    steps; a later call with the same folder resumes from the last checkpoint.

    A checkpoint is complete at every moment (new files are written before ``progress.json`` points
    at them). A resumed run continues the model, its schedules, replay and RNG exactly; only the episodes that
    were running when the process stopped are cut (the envs restart, as after a crash). Each
    evaluation runs ``evaluate(model, index)`` (fresh episodes, seeded by the index) and records the
    mean return, the recent training returns, the update count and the wall-clock seconds summed over
    the processes. Stops after the first segment that ends past ``stop_after_seconds`` of this process.
    ``logger(steps)``, if given, makes the SB3 logger of the process that starts at ``steps``.

    :return: the model and the record {"curve", "train_curve", "seconds", "resumed_at", "done"}.
    """
    model = make_model()
    record: dict = {"curve": [], "train_curve": [], "seconds": 0.0, "resumed_at": [], "done": False}
    progress = checkpoint / "progress.json" if checkpoint else None
    if progress is not None and progress.exists():
        record = json.loads(progress.read_text())
        files = record.get("files", FLAT_FILES)
        model = type(model).load(checkpoint / files["model"], env=model.get_env())
        if model.num_timesteps != record["num_timesteps"]:
            raise RuntimeError(
                f"{checkpoint}: the model holds {model.num_timesteps} steps but progress.json says "
                f"{record['num_timesteps']}; the checkpoint is inconsistent, remove the folder to restart."
            )
        model.load_replay_buffer(checkpoint / files["replay"])
        record["resumed_at"].append(model.num_timesteps)
        print(json.dumps({"resumed_at": model.num_timesteps}), flush=True)
    if logger is not None:
        model.set_logger(logger(model.num_timesteps))
    recorder = TrainEpisodes(record["train_curve"], x_key, action_repeat)
    start, seconds_before = time.time(), record["seconds"]

    def next_multiple(every: int) -> int:
        return (model.num_timesteps // every + 1) * every if every else total

    while model.num_timesteps < total:
        target = min(total, next_multiple(eval_every), next_multiple(checkpoint_every if checkpoint else 0))
        fresh = model.num_timesteps == 0
        model.learn(target - model.num_timesteps, callback=recorder, reset_num_timesteps=fresh)
        record["seconds"] = round(seconds_before + time.time() - start, 1)
        at_eval = eval_every and model.num_timesteps >= (len(record["curve"]) + 1) * eval_every
        if at_eval or model.num_timesteps >= total:
            returns = evaluate(model, len(record["curve"]))
            seconds = seconds_before + time.time() - start
            point = eval_point(model, returns, record["train_curve"], x_key, action_repeat, seconds)
            point["eval_returns"] = [float(r) for r in returns]
            record["curve"].append(point)
            print(json.dumps({k: v for k, v in point.items() if k != "eval_returns"}), flush=True)
        record["done"] = model.num_timesteps >= total
        if checkpoint is not None:
            # New files first, then progress.json (renamed into place) points at them, then the old
            # ones go: a process killed at any moment leaves a complete checkpoint behind.
            checkpoint.mkdir(parents=True, exist_ok=True)
            previous = record.get("files")
            files = {
                "model": f"model_{model.num_timesteps}.zip",
                "replay": f"replay_{model.num_timesteps}.pkl",
            }
            model.save(checkpoint / files["model"])
            model.save_replay_buffer(checkpoint / files["replay"])
            record.update(num_timesteps=model.num_timesteps, files=files)
            tmp = progress.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, progress)
            for name in (previous or FLAT_FILES).values():
                if name not in files.values():
                    (checkpoint / name).unlink(missing_ok=True)
        if stop_after_seconds is not None and time.time() - start > stop_after_seconds:
            break
    return model, record


def evaluate_fresh(
    make_env: Callable[[int], Any], seed: int, episodes: int, deterministic: bool
) -> Callable[[BaseAlgorithm, int], list[float]]:
    """``evaluate(model, index)``: ``episodes`` episodes on ``make_env(seed)`` with seed
    ``10_000 + 1_000 * seed + index`` (each evaluation its own fresh, reproducible episodes)."""

    def evaluate(model: BaseAlgorithm, index: int) -> list[float]:
        env = make_env(10_000 + 1_000 * seed + index)
        rewards, _ = evaluate_policy(
            model, env, n_eval_episodes=episodes, deterministic=deterministic, return_episode_rewards=True
        )
        env.close()
        return [float(r) for r in rewards]

    return evaluate


def run_record() -> dict:
    """Where and when a result was measured."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "commit": commit,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "date": time.strftime("%Y-%m-%d"),
    }


def evaluate_agent_states(
    model: BaseAlgorithm,
    candidates: list[tuple[str, Any]],
    make_env: Callable[[], Any],
    episodes: int,
    deterministic: bool,
) -> None:
    """Evaluate ``model`` with each (label, agent state) of ``candidates`` in turn (the state put in
    ``model.policy.state["agent"]``), each on the same episodes (a fresh ``make_env()``), and print one
    JSON row per candidate: the episode returns, their mean and the seconds taken."""
    for label, agent_state in candidates:
        model.policy.state = {**model.policy.state, "agent": agent_state}
        env = make_env()
        start = time.time()
        rewards, _ = evaluate_policy(
            model, env, n_eval_episodes=episodes, deterministic=deterministic, return_episode_rewards=True
        )
        row = {
            "episodes": [round(float(r), 1) for r in rewards],
            "mean": round(float(np.mean(rewards)), 1),
            "seconds": round(time.time() - start, 1),
        }
        print(label, json.dumps(row), flush=True)
