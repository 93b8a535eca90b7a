"""Checkpoints survive a killed save, carry SB3's permissions, and incomplete or newer files are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from tests.probe_envs import ChainEnv

SETTINGS = {**SMOKE_SETTINGS, "seed": 0, "seed_steps": 10}


def tiny_model() -> TDMPC2:
    return TDMPC2(make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1), **SETTINGS)


def test_a_checkpoint_has_the_permissions_of_a_plain_file(tmp_path):
    umask = os.umask(0o022)
    try:
        tiny_model().save(tmp_path / "model.zip")
    finally:
        os.umask(umask)
    assert (tmp_path / "model.zip").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["model.zip"]


KILLED_SAVE = textwrap.dedent(
    """
    import sys, time
    from sb3_worldmodels.common import safe_io
    from tests.test_checkpoint_faults import tiny_model

    model = tiny_model()
    model.save(sys.argv[1])  # one complete checkpoint
    print("saved", flush=True)

    def stalled(path, members):
        with open(path, "wb") as handle:
            handle.write(b"PK partial checkpoint")
            handle.flush()
        time.sleep(600)

    safe_io.write_zip = stalled
    model.save(sys.argv[1])
    """
)


def test_a_killed_save_keeps_the_last_checkpoint_and_its_leftover_is_removed(tmp_path):
    target = tmp_path / "model.zip"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(target)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert proc.stdout.readline().strip() == "saved"
        deadline = time.time() + 120
        while not list(tmp_path.glob(".model.zip.*.tmp.zip")) and time.time() < deadline:
            time.sleep(0.1)
        leftovers = list(tmp_path.glob(".model.zip.*.tmp.zip"))
        assert leftovers, "the second save never started writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The killed save left its temporary file, and the last complete checkpoint is untouched.
    assert leftovers[0].exists()
    loaded = TDMPC2.load(target)
    assert loaded.seed_steps == 10
    # The next save removes the dead process's leftover.
    loaded.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]


KILLED_LEARN = textwrap.dedent(
    """
    import sys
    from stable_baselines3.common.callbacks import CheckpointCallback
    from tests.test_checkpoint_faults import tiny_model

    model = tiny_model()
    callback = CheckpointCallback(save_freq=5, save_path=sys.argv[1], save_replay_buffer=True)
    model.learn(100_000, callback=callback)
    """
)


def test_a_run_killed_during_learn_leaves_loadable_checkpoints(tmp_path):
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_LEARN, str(tmp_path)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        deadline = time.time() + 300
        while len(list(tmp_path.glob("rl_model_*_steps.zip"))) < 4 and time.time() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # wherever it is: acting, updating or saving
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    models = sorted(tmp_path.glob("rl_model_*_steps.zip"), key=lambda p: int(p.name.split("_")[2]))
    assert len(models) >= 4
    last = TDMPC2.load(models[-1])  # every checkpoint that exists is complete
    steps = int(models[-1].name.split("_")[2])
    replay = tmp_path / f"rl_model_replay_buffer_{steps}_steps.pkl"
    if replay.exists():  # the run may have died between the model and its replay
        last.load_replay_buffer(replay)
    assert last.num_timesteps == steps
    last.save(models[-1])  # a save in that folder removes any leftover of the killed one
    assert not list(tmp_path.glob(".*.tmp.zip"))


def test_a_save_removes_the_leftovers_of_dead_writers_of_any_file_in_its_folder(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(finished.stdout)
    other = tmp_path / f".rl_model_25_steps.zip.{dead}.x1y2z3ab.tmp.zip"  # a killed checkpoint's save
    alive = tmp_path / f".model.zip.{os.getpid()}.q9w8e7rt.tmp.zip"  # a save under way here
    other.write_bytes(b"PK partial")
    alive.write_bytes(b"PK partial")
    tiny_model().save(tmp_path / "rl_model_30_steps.zip")
    assert not other.exists() and alive.exists()


def _rewrite(src: Path, dst: Path, drop: str | None = None, data_update: dict | None = None) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            if item.filename == drop:
                continue
            content = zin.read(item.filename)
            if item.filename == "data" and data_update:
                content = json.dumps({**json.loads(content), **data_update}).encode()
            zout.writestr(item, content)


def test_incomplete_and_newer_checkpoints_are_refused(tmp_path):
    tiny_model().save(tmp_path / "model.zip")
    _rewrite(tmp_path / "model.zip", tmp_path / "no_policy.zip", drop="policy.pth")
    with pytest.raises(ValueError, match="policy.pth is missing"):
        TDMPC2.load(tmp_path / "no_policy.zip")
    _rewrite(tmp_path / "model.zip", tmp_path / "newer.zip", data_update={"format_version": 99})
    with pytest.raises(ValueError, match="format 99.*upgrade"):
        TDMPC2.load(tmp_path / "newer.zip")
