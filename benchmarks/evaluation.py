"""What the learning benchmarks share: periodic evaluation on fresh episodes, runs split into
checkpointed segments (so a long check can span several processes), seed groups evaluated seed by
seed, and run records."""

from __future__ import annotations

import functools
import json
import os
import pickle
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import jax
import numpy as np
import scipy.stats
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

FLAT_FILES = {"model": "model.zip", "replay": "replay.pkl"}
"""The checkpoint file names of runs saved before progress.json named its files."""
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
"""The jax.monitoring events whose durations make up a compilation (trace, lower, compile)."""
_compile_seconds = [0.0]


def _count_compile(event: str, duration: float, **_: Any) -> None:
    if event in COMPILE_EVENTS:
        _compile_seconds[0] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def compile_seconds() -> float:
    """Seconds JAX has spent tracing, lowering and compiling programs in this process so far."""
    return _compile_seconds[0]


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


class GroupTrainEpisodes(BaseCallback):
    """Records every finished training episode of a seed group into its seed's list: env ``k`` of the
    group's VecEnv is the ``k // n_envs``-th seed's (seed-major), counted at that seed's own steps."""

    def __init__(self, episodes: list[list[dict]], x_key: str, action_repeat: int) -> None:
        super().__init__()
        self.episodes, self.x_key, self.action_repeat = episodes, x_key, action_repeat

    def _on_step(self) -> bool:
        per_seed = self.model.envs_per_seed
        for k, info in enumerate(self.locals.get("infos", [])):
            if "episode" in info:
                index = k // per_seed
                steps = seed_timesteps(self.model)[index]
                self.episodes[index].append(
                    {
                        self.x_key: steps,
                        "frames": steps * self.action_repeat,
                        "return": float(info["episode"]["r"]),
                    }
                )
        return True


def seed_timesteps(group: BaseAlgorithm) -> list[int]:
    """Each seed's own ``num_timesteps`` in a seed group (the group's is the least of them)."""
    return [lane.num_timesteps for lane in group._lanes]


def is_group(model: BaseAlgorithm) -> bool:
    """Whether ``model`` is a seed group (built with a list of seeds)."""
    return getattr(model, "seeds", None) is not None


def group_name(seeds: Sequence[int]) -> str:
    """The file-name part of a seed group: ``seeds0-4`` for 0, 1, 2, 3, 4; ``seeds1_5_9`` otherwise."""
    seeds = list(seeds)
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds{seeds[0]}-{seeds[-1]}"
    return "seeds" + "_".join(map(str, seeds))


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
    budget_seconds: float | None = None,
    started: float | None = None,
) -> tuple[BaseAlgorithm, dict]:
    """Train to ``total`` counted steps, evaluating every ``eval_every`` (0: only at the end) and,
    when ``checkpoint`` is a folder, saving model, replay and curves there every ``checkpoint_every``
    steps; a later call with the same folder resumes from the last checkpoint.

    A checkpoint is complete at every moment (new files are written before ``progress.json`` points
    at them). A resumed run continues the model, its schedules, replay and RNG exactly. A checkpoint
    taken between episodes (every env's episode ended at its last step: fixed-length episodes and a
    ``checkpoint_every`` that is a multiple of their length) also keeps the envs (pickled, with their
    random generators), so the resumed run equals the uninterrupted one; from a checkpoint taken
    mid-episode the envs restart, as after a crash, and the episodes that were running are cut.
    Each evaluation runs ``evaluate(model, index)`` (fresh episodes, seeded by the index) and records
    the mean return, the recent training returns, the update count and the wall-clock seconds summed
    over the processes.

    A seed group (a model built with a list of seeds) is one model for every seed: each evaluation
    runs ``evaluate(group.seed_model(i), index)`` for every seed, and the record keeps one curve per
    seed (``runs``: {"seed", "curve", "train_curve"} per seed), at that seed's own step count.

    Stops after the first segment that ends past ``stop_after_seconds`` of this process, or before a
    segment that would end past ``budget_seconds`` after ``started`` (a ``time.time()``; default: the
    call), by the longest segment of this process with its compilation time left out (the first
    segment always runs), or before an evaluation that would, by this process's longest evaluation. A
    segment that ends with an evaluation is checkpointed before it too: a process cut off while it
    evaluates (a host's time limit) loses only the evaluation, which the next process runs first.
    ``logger(steps)``, if given, makes the SB3 logger of the process that starts at ``steps``.

    :return: the model and the record {"curve", "train_curve", "seconds", "resumed_at", "done"} (a
        group's: {"seeds", "runs", "seconds", "resumed_at", "done"}).
    """
    start = time.time() if started is None else started
    model = make_model()
    group = is_group(model)
    if group:
        runs = [{"seed": int(s), "curve": [], "train_curve": []} for s in model.seeds]
        record: dict = {"seeds": list(model.seeds), "runs": runs}
    else:
        record = {"curve": [], "train_curve": []}
    record.update(seconds=0.0, resumed_at=[], done=False)
    progress = checkpoint / "progress.json" if checkpoint else None
    if progress is not None and progress.exists():
        record = json.loads(progress.read_text())
        if group and record.get("seeds") != list(model.seeds):
            raise ValueError(
                f"{checkpoint} holds a run of seeds {record.get('seeds')}, not {list(model.seeds)}: give the "
                "same seeds, or another --checkpoint folder."
            )
        model = resume_from(checkpoint, record, model)
        record["resumed_at"].append(model.num_timesteps)
        print(json.dumps({"resumed_at": model.num_timesteps}), flush=True)
    if logger is not None:
        model.set_logger(logger(model.num_timesteps))
    runs = record["runs"] if group else [record]
    if group:
        recorder: BaseCallback = GroupTrainEpisodes([r["train_curve"] for r in runs], x_key, action_repeat)
    else:
        recorder = TrainEpisodes(record["train_curve"], x_key, action_repeat)
    process_start, seconds_before = time.time(), record["seconds"]
    longest = 0.0  # the longest segment of this process (training and its evaluation), compilation left out
    longest_evaluation = 0.0  # the longest evaluation of this process, compilation left out

    def next_multiple(every: int) -> int:
        return (model.num_timesteps // every + 1) * every if every else total

    def evaluation_owed() -> bool:
        """An evaluation is due at the model's step count (one every ``eval_every`` steps, one at
        ``total``) and not yet in the curve: after a segment, or in a process resumed from the
        checkpoint a segment saved before its evaluation."""
        steps = model.num_timesteps
        due = steps // eval_every if eval_every else 0
        due += steps >= total and (not eval_every or total % eval_every != 0)
        return len(runs[0]["curve"]) < due

    def over_budget(seconds_needed: float) -> bool:
        if budget_seconds is None or time.time() + seconds_needed - start <= budget_seconds:
            return False
        print(json.dumps({"stopped_for_budget": budget_seconds, "at": model.num_timesteps}), flush=True)
        return True

    while model.num_timesteps < total or evaluation_owed():
        segment_start, compiled_before = time.time(), compile_seconds()
        if not evaluation_owed():
            every = checkpoint_every if checkpoint else 0
            target = min(total, next_multiple(eval_every), next_multiple(every))
            fresh = model.num_timesteps == 0
            model.learn(target - model.num_timesteps, callback=recorder, reset_num_timesteps=fresh)
            record["seconds"] = round(seconds_before + time.time() - process_start, 1)
            if evaluation_owed() and checkpoint is not None:  # the training survives a cut evaluation
                save_checkpoint(checkpoint, record, model)
        if evaluation_owed():
            if longest_evaluation and over_budget(longest_evaluation):
                break
            evaluation_start, compiled = time.time(), compile_seconds()
            index = len(runs[0]["curve"])
            seconds = seconds_before + time.time() - process_start
            for i, run in enumerate(runs):
                evaluated = model.seed_model(i) if group else model
                returns = evaluate(evaluated, index)
                point = eval_point(evaluated, returns, run["train_curve"], x_key, action_repeat, seconds)
                point["eval_returns"] = [float(r) for r in returns]
                run["curve"].append(point)
                shown = {k: v for k, v in point.items() if k != "eval_returns"}
                print(json.dumps({"seed": run["seed"], **shown} if group else shown), flush=True)
            evaluation = time.time() - evaluation_start - (compile_seconds() - compiled)
            longest_evaluation = max(longest_evaluation, evaluation)
            record["seconds"] = round(seconds_before + time.time() - process_start, 1)
        record["done"] = model.num_timesteps >= total
        if checkpoint is not None:
            save_checkpoint(checkpoint, record, model)
        longest = max(longest, time.time() - segment_start - (compile_seconds() - compiled_before))
        if stop_after_seconds is not None and time.time() - process_start > stop_after_seconds:
            break
        if not record["done"] and over_budget(longest):
            break
    return model, record


def resume_from(checkpoint: Path, record: dict, model: BaseAlgorithm) -> BaseAlgorithm:
    """The model of ``checkpoint`` (its replay loaded), with the envs saved there when the checkpoint
    has them (``model``'s own envs, fresh, otherwise)."""
    files = record.get("files", FLAT_FILES)
    env, force_reset = model.get_env(), True
    if "envs" in files:
        # The envs as they were at the checkpoint (pickled by save_checkpoint into this folder).
        envs = pickle.loads((checkpoint / files["envs"]).read_bytes())
        env.close()
        env, force_reset = DummyVecEnv([functools.partial(_same, e) for e in envs]), False
    model = type(model).load(checkpoint / files["model"], env=env, force_reset=force_reset)
    if model.num_timesteps != record["num_timesteps"]:
        raise RuntimeError(
            f"{checkpoint}: the model holds {model.num_timesteps} steps but progress.json says "
            f"{record['num_timesteps']}; the checkpoint is inconsistent, remove the folder to restart."
        )
    model.load_replay_buffer(checkpoint / files["replay"])
    return model


def _same(env: Any) -> Any:
    return env


def save_checkpoint(checkpoint: Path, record: dict, model: BaseAlgorithm) -> None:
    """Save the model, its replay and, between episodes, its envs into ``checkpoint``, then point
    ``progress.json`` at them (renamed into place) and remove the previous files: a process killed
    at any moment leaves a complete checkpoint behind."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    previous = record.get("files")
    n = model.num_timesteps
    replay = "npz" if is_group(model) else "pkl"
    files = {"model": f"model_{n}.zip", "replay": f"replay_{n}.{replay}"}
    model.save(checkpoint / files["model"])
    model.save_replay_buffer(checkpoint / files["replay"])
    envs = pickled_envs(model)
    if envs is not None:
        files["envs"] = f"envs_{n}.pkl"
        (checkpoint / files["envs"]).write_bytes(envs)
    record.update(num_timesteps=n, files=files)
    progress = checkpoint / "progress.json"
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, progress)
    for name in (previous or FLAT_FILES).values():
        if name not in files.values():
            (checkpoint / name).unlink(missing_ok=True)


def pickled_envs(model: BaseAlgorithm) -> bytes | None:
    """The model's envs pickled, when every env's episode has just ended and the VecEnv is a plain
    DummyVecEnv whose envs pickle (Gymnasium's classic control, dm_control through shimmy, also from
    pixels); None otherwise, and the resume restarts the envs."""
    env = model.get_env()
    if not model.at_episode_boundary or type(env) is not DummyVecEnv:
        return None
    try:
        return cloudpickle.dumps(env.envs)
    except Exception as error:  # an env holding what does not pickle (a handle, a lock, a context)
        print(json.dumps({"envs_not_saved": f"{type(error).__name__}: {error}"}), flush=True)
        return None


def evaluate_fresh(
    make_env: Callable[[int], Any],
    seed: int | None,
    episodes: int,
    deterministic: bool,
    envs: int = 1,
    processes: bool = False,
) -> Callable[[BaseAlgorithm, int], list[float]]:
    """``evaluate(model, index)``: ``episodes`` episodes on ``make_env(seed)`` with seed
    ``10_000 + 1_000 * seed + index`` (each evaluation its own fresh, reproducible episodes); with
    ``seed=None``, the evaluated model's own seed (a seed group's ``seed_model(i)`` has the i-th).

    ``envs`` > 1 runs the episodes on that many envs at once (SB3's ``evaluate_policy`` over a
    ``DummyVecEnv``: one ``predict`` per step for all of them, each env's share of the episodes
    as ``evaluate_policy`` splits them): env 0 seeded as above, env k with a seed drawn from
    ``SeedSequence([that seed, k])``. The same protocol (fresh episodes of the same policy), other
    initial states and draws than one env's; the episodes are listed as they end. ``processes``: the
    envs step in processes of their own (SB3's ``SubprocVecEnv``, started by spawning, with JAX kept
    on the CPU there), the same episodes: for envs whose step is slow (rendering), on a host with
    cores to spare. ``make_env`` must then be picklable (a module-level function or a partial of one).
    """

    def evaluate(model: BaseAlgorithm, index: int) -> list[float]:
        own = model.seed if seed is None else seed
        base = 10_000 + 1_000 * own + index
        if envs == 1:
            env = make_env(base)
        else:
            drawn = [int(np.random.SeedSequence([base, k]).generate_state(1)[0]) for k in range(1, envs)]
            seeds = [base, *drawn]
            factories = [functools.partial(make_env, s) for s in seeds]
            env = subprocess_envs(factories) if processes else DummyVecEnv(factories)
        rewards, _ = evaluate_policy(
            model, env, n_eval_episodes=episodes, deterministic=deterministic, return_episode_rewards=True
        )
        env.close()
        return [float(r) for r in rewards]

    return evaluate


def subprocess_envs(factories: list[Callable[[], Any]]) -> SubprocVecEnv:
    """A ``SubprocVecEnv`` of ``factories``, its processes spawned with ``JAX_PLATFORMS=cpu``: they
    import the package but never open the accelerator, which one process at a time may hold."""
    before = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        return SubprocVecEnv(factories, start_method="spawn")
    finally:
        if before is None:
            del os.environ["JAX_PLATFORMS"]
        else:
            os.environ["JAX_PLATFORMS"] = before


def seeds_result(scores: Sequence[float], passed: Sequence[bool]) -> dict:
    """What a seed group's check sums up: the seeds' mean score, their interquartile mean (the mean of
    the middle half, ``scipy.stats.trim_mean(scores, 0.25)``, rliable's IQM; the mean for fewer than
    4 seeds) and how many seeds pass their bar."""
    values = np.asarray(scores, np.float64)
    return {
        "mean": float(np.mean(values)),
        "iqm": float(scipy.stats.trim_mean(values, 0.25)),
        "n_passed": int(sum(bool(p) for p in passed)),
        "n_seeds": len(values),
    }


def group_results(
    record: dict, group: BaseAlgorithm, score: Callable[[list[dict]], float], threshold: float, x_key: str
) -> tuple[dict, list[dict]]:
    """A seed group's result: its summary (:func:`seeds_result`, with the bar) and one entry per seed:
    the seed, its score (``score(curve)``) and verdict against ``threshold`` (a pass needs the run
    done), its own step count and updates, its evaluation curve and training episodes."""
    per_seed = []
    for run, lane in zip(record["runs"], group._lanes, strict=True):
        value = score(run["curve"])
        per_seed.append(
            {
                "seed": run["seed"],
                "score": value,
                "passed": bool(record["done"] and value >= threshold),
                x_key: lane.num_timesteps,
                "updates": lane._n_updates,
                "curve": run["curve"],
                "train_curve": run["train_curve"],
            }
        )
    summary = seeds_result([s["score"] for s in per_seed], [s["passed"] for s in per_seed])
    return {**summary, "threshold": threshold}, per_seed


def check_result(
    task: str,
    seed: int | None,
    seeds: list[int] | None,
    model: BaseAlgorithm,
    record: dict,
    score: Callable[[list[dict]], float],
    threshold: float,
    x_key: str,
    settings: dict,
    where: dict,
) -> dict:
    """A learning check's result file: the run's head (task, seed or seeds, ``x_key`` steps, done,
    updates, time, resume point), then one model's score, bar, verdict and curves, or a seed group's
    summary (:func:`group_results`) and its entries per seed; the settings and ``where`` it ran."""
    head = {
        "task": task,
        **({"seed": seed} if seeds is None else {"seeds": seeds}),
        x_key: model.num_timesteps,
        "done": record["done"],
        "updates": model._n_updates,
        "wall_seconds": record["seconds"],
        "resumed_at": record["resumed_at"],
    }
    config = getattr(model, "config", None)
    if config is not None:  # the numerics the run computed in ("auto" resolved for its backend)
        numerics = {"compute_dtype": config.compute_dtype, "matmul_precision": config.matmul_precision}
        settings = {**settings, **numerics}
    if seeds is not None:
        summary, per_seed = group_results(record, model, score, threshold, x_key)
        return {**head, **summary, "settings": settings, **where, "per_seed": per_seed}
    value = score(record["curve"])
    return {
        **head,
        "score": value,
        "threshold": threshold,
        "passed": bool(record["done"] and value >= threshold),
        "settings": settings,
        **where,
        "curve": record["curve"],
        "train_curve": record["train_curve"],
    }


def brief(result: dict) -> dict:
    """A result without its curves (what the scripts print)."""
    shown = {k: v for k, v in result.items() if k not in ("curve", "train_curve", "per_seed")}
    if "per_seed" in result:
        shown["per_seed"] = [
            {k: v for k, v in s.items() if k not in ("curve", "train_curve")} for s in result["per_seed"]
        ]
    return shown


def script_command(script: str, argv: Sequence[str] | None) -> list[str]:
    """The command line of a benchmark ``script`` (its ``__file__``) run with ``argv`` (default: this
    process's arguments), as run from the repository's root."""
    path = Path(script).resolve()
    try:
        shown = str(path.relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        shown = str(path)
    return ["python", shown, *(sys.argv[1:] if argv is None else argv)]


def run_record(command: Sequence[str] | None = None) -> dict:
    """Where, how and when a result was measured: the commit, the machine (CPU model and count, JAX's
    backend and device kind), the command (default: this process's) and the date."""
    from sb3_worldmodels.blocks.cpu import cpu_info

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    devices = jax.devices()
    return {
        "commit": commit,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "cpu_model": cpu_info().model,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "command": shlex.join(["python", *sys.argv] if command is None else command),
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
