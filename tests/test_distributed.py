"""One data-parallel model trained by 2 processes (``jax.distributed`` on the loopback interface, the
CPU collectives through gloo, one CPU device each): both processes end with the same parameters,
equal to one process's updates on the same global batches (the processes' rows put together); the
checkpoint one run writes loads in a run of the other process count. The runs are fresh processes of
tests/distributed_runs.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sb3_worldmodels.blocks import distributed
from sb3_worldmodels.blocks.devices import data_parallel_placement

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "distributed_runs.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(**extra: str) -> dict[str, str]:
    """This process's environment (SB3WM_CPU_OPTIONS and the test session's compilation cache included:
    the runs compare programs of different shapes) with this checkout first on the path, one CPU device
    and no jax.distributed settings but ``extra``."""
    ours = (
        distributed.COORDINATOR_VARIABLE,
        distributed.COUNT_VARIABLE,
        distributed.INDEX_VARIABLE,
        "XLA_FLAGS",
    )
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
    env.update(extra)
    return env


def finished(process: subprocess.Popen, timeout: int = 900) -> dict:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    assert process.returncode == 0, f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-6000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


def on_processes(args: list[str], count: int = 2) -> list[dict]:
    """``python distributed_runs.py args...`` in ``count`` processes of one jax.distributed run."""
    port = free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, SCRIPT, *args],
            env=environment(
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES=str(count),
                JAX_PROCESS_ID=str(i),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    return [finished(p) for p in processes]


def in_one_process(args: list[str]) -> dict:
    return finished(
        subprocess.Popen(
            [sys.executable, SCRIPT, *args],
            env=environment(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return dict(archive)


@pytest.mark.parametrize("agent", ["tdmpc2", "dreamerv3"])
def test_2_processes_train_one_model_as_one_process_on_the_global_batch(agent, tmp_path):
    """Each process steps its own env and samples half of every batch of its replay; the updates run on
    the global batch (2 devices, one per process). Both processes hold the same parameters after the
    run, equal to the updates of one process on the batches put together; DreamerV3's processes each
    write back their own rows of the latents. The checkpoint process 0 wrote loads in one process
    (its parameters; process 0's replay by its name), and a one-process checkpoint loads in 2
    processes, which go on learning in step (and stop together when a callback stops one)."""
    runs = on_processes(["train", agent, str(tmp_path)])
    for index, facts in enumerate(runs):
        assert facts["process"] == index and facts["processes"] == 2 and facts["devices"] == 2
        assert facts["local_batch"] == (8 if agent == "tdmpc2" else 2)
        assert facts["shardings"] == ["P()"]
    assert runs[0]["n_updates"] == runs[1]["n_updates"] > 0
    assert runs[0]["num_timesteps"] == runs[1]["num_timesteps"]
    assert runs[0]["calls"] == runs[1]["calls"] > 0
    parts = [load(tmp_path / f"process-{p}" / "leaves.npz") for p in (0, 1)]
    for key in parts[0]:
        np.testing.assert_array_equal(parts[0][key], parts[1][key], err_msg=key)
    assert (tmp_path / "model.zip").exists()
    assert sorted(p.name for p in tmp_path.glob("replay*")) == [
        "replay.process-0-of-2.pkl",
        "replay.process-1-of-2.pkl",
    ]

    single = in_one_process(["reference", agent, str(tmp_path)])
    assert single["n_updates"] == runs[0]["n_updates"]
    reference = load(tmp_path / "reference" / "leaves.npz")
    assert reference.keys() == parts[0].keys()
    for key in reference:
        np.testing.assert_allclose(parts[0][key], reference[key], rtol=1e-4, atol=2e-5, err_msg=key)
    outputs = load(tmp_path / "reference" / "outputs.npz")
    assert bool(outputs) == (agent == "dreamerv3")
    for p in (0, 1):
        written = {
            k: v for k, v in load(tmp_path / f"process-{p}" / "calls.npz").items() if k.startswith("output_")
        }
        assert written.keys() == outputs.keys()
        for key, value in written.items():
            half = outputs[key].shape[1] // 2  # (k, B, T, ...): process p wrote rows p*B/2 .. (p+1)*B/2
            np.testing.assert_allclose(
                value, outputs[key][:, p * half : (p + 1) * half], rtol=1e-4, atol=2e-5
            )

    # The multi-process checkpoint in one process: process 0's state exactly.
    loaded = load(tmp_path / "reference" / "loaded.npz")
    for key in loaded:
        np.testing.assert_array_equal(loaded[key], parts[0][key], err_msg=key)
    assert "replay.process-0-of-2.pkl, " in single["replay_refusal"]
    assert single["placement"] is False and single["updates_after_load"] > 0

    # The one-process checkpoint in 2 processes: they learn on, in step.
    resumed = on_processes(["resume", agent, str(tmp_path)])
    assert resumed[0] == resumed[1] and resumed[0]["devices"] == 2 and resumed[0]["updates_after_load"] > 0
    assert resumed[0]["steps_before_stop"] == 2  # process 1's callback stopped both processes
    again = [load(tmp_path / f"resume-{p}" / "leaves.npz") for p in (0, 1)]
    for key in again[0]:
        np.testing.assert_array_equal(again[0][key], again[1][key], err_msg=key)


def test_processes_that_build_different_models_or_a_seed_group_are_refused(tmp_path):
    runs = on_processes(["refusals", "tdmpc2", str(tmp_path)])
    for facts in runs:
        assert (
            "built different models: seed (processes [1]) differ from process 0's" in facts["different_seed"]
        )
        assert "A seed group runs on one process's devices" in facts["seed_group"]
        assert "not a multiple of 2" in facts["batch_size"]


INITIALIZE_CHECK = """
import os
from sb3_worldmodels.blocks.distributed import initialize
for count in (None, "two"):
    if count:
        os.environ["JAX_NUM_PROCESSES"] = count
    try:
        initialize()
    except ValueError as error:
        print(error)
"""


def test_initialize_says_what_it_needs():
    """Without the variables, and with a count that is no number (one fresh process: no JAX call yet)."""
    env = {k: v for k, v in environment().items() if not k.startswith(("SLURM_", "OMPI_", "KUBERNETES_"))}
    done = subprocess.run([sys.executable, "-c", INITIALIZE_CHECK], env=env, capture_output=True, text=True)
    missing, not_a_number = done.stdout.strip().splitlines()[-2:]
    wanted = "set JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID"
    assert wanted in missing, done.stderr[-3000:]
    assert not_a_number == "JAX_NUM_PROCESSES='two' is not an integer."


def test_per_process_files_are_named_beside_the_runs_file(tmp_path):
    assert distributed.shard_path("runs/replay.pkl", 1, 2) == Path("runs/replay.process-1-of-2.pkl")
    assert distributed.shard_path("runs/replay", 0, 4) == Path("runs/replay.process-0-of-4.pkl")
    assert distributed.shard_path("runs/replay.pkl", 0, 1) == Path("runs/replay.pkl")
    for index in (1, 0):
        distributed.shard_path(tmp_path / "replay.pkl", index, 2).touch()
    assert [p.name for p in distributed.shard_paths_of(tmp_path / "replay.pkl")] == [
        "replay.process-0-of-2.pkl",
        "replay.process-1-of-2.pkl",
    ]


def test_a_batch_split_over_the_processes_devices_must_divide_evenly():
    devices = [SimpleNamespace(process_index=p, id=i) for p in (0, 1) for i in (0, 1)]
    with pytest.raises(ValueError, match="over the 4 devices of the run's 2 processes: batch_size=6 is not"):
        data_parallel_placement(6, devices=devices)
