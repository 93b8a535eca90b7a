"""Short runs of one data-parallel model over several processes (``jax.distributed`` on the loopback
interface, JAX's CPU collectives through gloo), for tests/test_distributed.py, and the one-process runs
they are compared with.

    python tests/distributed_runs.py PHASE AGENT FOLDER

Each process of a run over several processes reads ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
and ``JAX_PROCESS_ID`` (``sb3_worldmodels.blocks.distributed.initialize``) and writes into
``FOLDER/process-<index>/``. Phases:

- ``train`` (every process): a model with ``data_parallel=True`` learns; each process writes its
  state's leaves (``leaves.npz``), every training call's batches it sampled, the outputs it wrote back
  into its replay and the progress (``calls.npz``); process 0 saves the model (``FOLDER/model.zip``),
  every process its replay (``FOLDER/replay.pkl``, one file per process).
- ``reference`` (one process): the same model, its training calls given the processes' batches put
  together (process 0's rows, then process 1's), at the recorded progress; writes ``leaves.npz`` and
  the outputs of each call into ``FOLDER/reference/``. Then loads the multi-process checkpoint and
  process 0's replay, learns a few steps more in this one process and saves ``FOLDER/single.zip`` and
  ``FOLDER/single.pkl``.
- ``refusals`` (every process): the errors of models that cannot run over the processes.
- ``resume`` (every process): loads ``single.zip`` and ``single.pkl`` (the one-process checkpoint)
  and learns a few steps more; writes ``leaves.npz`` into ``FOLDER/resume-<index>/``. Then learns
  again with a callback that stops at the second step in process 1 only.

Each prints one JSON line of facts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

AGENTS = ("tdmpc2", "dreamerv3")
STEPS = {"tdmpc2": 27, "dreamerv3": 40}
"""Steps of the training run: TD-MPC2's 25 seed steps and two more (27 updates); DreamerV3's 40 rows."""
MORE_STEPS = 3
"""Steps learned after a checkpoint is loaded."""


def make_env(agent: str) -> Any:
    """TD-MPC2: Pendulum in 20-step episodes; DreamerV3: CartPole (episodes of their own lengths)."""
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env

    name, steps = ("Pendulum-v1", 20) if agent == "tdmpc2" else ("CartPole-v1", None)
    return make_vec_env(lambda: gym.make(name, max_episode_steps=steps), n_envs=1)


def build(agent: str) -> Any:
    """The run's model: one env, seed 0, data_parallel=True; TD-MPC2 with a batch of 16, DreamerV3
    with a batch of 4 windows."""
    from sb3_worldmodels import TDMPC2, DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

    if agent == "tdmpc2":
        return TDMPC2(make_env(agent), seed=0, data_parallel=True, **{**TDMPC2_SMOKE, "seed_steps": 25})
    return DreamerV3(make_env(agent), seed=0, data_parallel=True, **{**DREAMER_SMOKE, "batch_size": 4})


def agent_class(agent: str) -> Any:
    from sb3_worldmodels import TDMPC2, DreamerV3

    return TDMPC2 if agent == "tdmpc2" else DreamerV3


def leaves(model: Any, part: str | None = "agent") -> dict:
    """The leaves of the model's state (``part`` of it; None: all), in tree order."""
    import jax
    import numpy as np

    state = model.policy.state if part is None else model.policy.state[part]
    return {f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree_util.tree_leaves(state))}


def record_training(model: Any) -> dict[str, list]:
    """Wrap the model's training calls to record each call's batches, written-back outputs, updates
    and progress."""
    import numpy as np

    from sb3_worldmodels.common.agent_hooks import TrainingBatch

    record: dict[str, list] = {"batches": [], "outputs": [], "calls": []}
    sample, train = model._training_batch, model.train

    def training_batch(k: int) -> TrainingBatch:
        training = sample(k)
        record["batches"].append({name: np.array(v) for name, v in training.batch.items()})

        def commit(*outputs: Any) -> None:
            record["outputs"].append([{n: np.array(v) for n, v in o.items()} for o in outputs])
            training.commit(*outputs)

        return TrainingBatch(training.batch, commit)

    def recorded_train(gradient_steps: int, batch_size: int = 0) -> None:
        before = model._n_updates
        progress = model._current_progress_remaining
        train(gradient_steps, batch_size)
        if model._n_updates > before:
            record["calls"].append((model._n_updates - before, progress))

    model._training_batch, model.train = training_batch, recorded_train
    return record


def save_record(record: dict[str, list], path: Path) -> None:
    import numpy as np

    arrays: dict[str, Any] = {"calls": np.array(record["calls"], np.float64)}
    for i, batch in enumerate(record["batches"]):
        arrays.update({f"batch_{i}_{name}": v for name, v in batch.items()})
    for i, outputs in enumerate(record["outputs"]):
        for j, output in enumerate(outputs):
            arrays.update({f"output_{i}_{j}_{name}": v for name, v in output.items()})
    np.savez(path, **arrays)


def train(agent: str, folder: Path) -> dict:
    import jax

    model = build(agent)
    index = jax.process_index()
    own = folder / f"process-{index}"
    own.mkdir(parents=True)
    record = record_training(model)
    model.learn(STEPS[agent])
    del model._training_batch, model.train  # the recording wrappers (instance attributes) are not saved
    placement = model._batch_placement
    state = model.policy.state["agent"]
    facts = {
        "process": index,
        "processes": jax.process_count(),
        "devices": len(placement.devices),
        "local_batch": model._local_batch_size,
        "n_updates": int(model._n_updates),
        "num_timesteps": int(model.num_timesteps),
        "calls": len(record["calls"]),
        "shardings": sorted({str(leaf.sharding.spec) for leaf in jax.tree_util.tree_leaves(state)}),
    }
    model.save(folder / "model.zip")
    model.save_replay_buffer(folder / "replay.pkl")
    import numpy as np

    np.savez(own / "leaves.npz", **leaves(model))
    save_record(record, own / "calls.npz")
    return facts


def reference(agent: str, folder: Path) -> dict:
    """The one-process model trained on the processes' batches put together (see the module docstring)."""
    import numpy as np
    from stable_baselines3.common.logger import configure

    from sb3_worldmodels.common.agent_hooks import TrainingBatch

    model = build(agent)
    model.set_logger(configure(None, [""]))
    records = [dict(np.load(folder / f"process-{p}" / "calls.npz")) for p in (0, 1)]
    calls = records[0]["calls"]
    axis = model.training_batch_axis  # of the recorded batches, with their leading k
    count = iter(range(10**6))
    outputs: dict[str, Any] = {}

    def training_batch(k: int) -> TrainingBatch:
        i = next(count)
        names = sorted({key.split("_", 2)[2] for key in records[0] if key.startswith(f"batch_{i}_")})
        batch = {n: np.concatenate([r[f"batch_{i}_{n}"] for r in records], axis=axis) for n in names}

        def commit(*values: Any) -> None:
            for j, value in enumerate(values):
                outputs.update({f"output_{i}_{j}_{n}": np.array(v) for n, v in value.items()})

        return TrainingBatch(batch, commit)

    model._training_batch = training_batch
    for updates, progress in calls:
        model._owed_updates = int(updates)
        model._take_owed_updates = lambda owed=int(updates): owed
        model._current_progress_remaining = float(progress)
        model.train(0)
    own = folder / "reference"
    own.mkdir()
    np.savez(own / "leaves.npz", **leaves(model))
    np.savez(own / "outputs.npz", **outputs)
    facts: dict[str, Any] = {"n_updates": int(model._n_updates)}

    # The multi-process checkpoint in one process: its parameters, process 0's replay, more steps.
    loaded = agent_class(agent).load(folder / "model.zip", env=make_env(agent))
    np.savez(own / "loaded.npz", **leaves(loaded))  # its agent state
    try:
        loaded.load_replay_buffer(folder / "replay.pkl")
    except FileNotFoundError as error:
        facts["replay_refusal"] = str(error)
    loaded.load_replay_buffer(folder / "replay.process-0-of-2.pkl")
    facts["placement"] = loaded._batch_placement is not None
    before = int(loaded._n_updates)
    loaded.learn(MORE_STEPS, reset_num_timesteps=False)
    facts["updates_after_load"] = int(loaded._n_updates) - before
    loaded.save(folder / "single.zip")
    loaded.save_replay_buffer(folder / "single.pkl")
    return facts


def resume(agent: str, folder: Path) -> dict:
    """Every process loads the one-process checkpoint and learns a few steps more."""
    import jax
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    loaded = agent_class(agent).load(folder / "single.zip", env=make_env(agent))
    loaded.load_replay_buffer(folder / "single.pkl")
    before = int(loaded._n_updates)
    loaded.learn(MORE_STEPS, reset_num_timesteps=False)
    own = folder / f"resume-{jax.process_index()}"
    own.mkdir()
    np.savez(own / "leaves.npz", **leaves(loaded))
    facts = {
        "updates_after_load": int(loaded._n_updates) - before,
        "devices": len(loaded._batch_placement.devices),
    }

    class StopInProcess1(BaseCallback):
        """Stops learn at its second step in process 1 only."""

        def _on_step(self) -> bool:
            return not (jax.process_index() == 1 and self.n_calls == 2)

    stop = StopInProcess1()
    loaded.learn(10, reset_num_timesteps=False, callback=stop)
    facts.update(steps_before_stop=stop.n_calls, num_timesteps=int(loaded.num_timesteps))
    return facts


def refusals(agent: str, folder: Path) -> dict:
    """What every process says to models that cannot run over the processes."""
    import jax

    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

    cases = {
        "different_seed": dict(env=make_env(agent), seed=jax.process_index(), data_parallel=True),
        "seed_group": dict(env="Pendulum-v1", seed=[0, 1]),
        "batch_size": dict(env=make_env(agent), seed=0, data_parallel=True, batch_size=3),
    }
    facts = {}
    for name, arguments in cases.items():
        try:
            agent_class(agent)(**{**TDMPC2_SMOKE, **arguments})
            facts[name] = "built"
        except ValueError as error:
            facts[name] = str(error)
    return facts


def main(phase: str, agent: str, folder: str) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if phase != "reference":
        from sb3_worldmodels.blocks.distributed import initialize

        initialize()
    run = {"train": train, "reference": reference, "resume": resume, "refusals": refusals}[phase]
    print(json.dumps(run(agent, Path(folder))), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
