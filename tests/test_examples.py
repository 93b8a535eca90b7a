"""Every example runs end to end at its tiny budget."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import custom_env  # noqa: E402
import dmc_paper_protocol  # noqa: E402
import quickstart  # noqa: E402
import swap_sac_for_tdmpc2  # noqa: E402
import world_model_predictions  # noqa: E402


def test_quickstart():
    assert math.isfinite(quickstart.main(["--tiny"]))


def test_swap_sac_for_tdmpc2_keeps_the_pipeline(tmp_path):
    assert math.isfinite(swap_sac_for_tdmpc2.main(["--algo", "tdmpc2", "--tiny", "--logdir", str(tmp_path)]))
    assert (tmp_path / "best_model.zip").exists() and list((tmp_path / "ckpt").glob("*replay_buffer*"))


@pytest.mark.parametrize("agent", ["tdmpc2", "dreamerv3"])
def test_custom_env(agent):
    assert math.isfinite(custom_env.main(["--agent", agent, "--tiny"]))


@pytest.mark.parametrize("agent", ["tdmpc2", "dreamerv3"])
def test_world_model_predictions(agent, tmp_path):
    record = world_model_predictions.main(["--agent", agent, "--tiny", "--out", str(tmp_path)])
    assert len(record["real"]) == len(record["predicted"]) == 100
    # TD-MPC2: the plan's horizon; DreamerV3: 15 open-loop steps (fewer near the episode's end).
    lengths = [len(rewards) for _, rewards in record["plans"]]
    assert lengths and set(lengths) == ({3} if agent == "tdmpc2" else {15, 10})
    assert np.all(np.isfinite(record["predicted"])) and (tmp_path / "world_model_predictions.csv").exists()


def test_dmc_paper_protocol():
    # A DMC episode is 1,000 simulator steps with rewards in [0, 1]: scores lie in [0, 1000].
    assert 0.0 <= dmc_paper_protocol.main(["--agent", "tdmpc2", "--tiny"]) <= 1000.0


def test_zoo_commands_script_lists_valid_commands():
    """Every rl_zoo3 line of the shell script parses (the algorithm key and every flag are known)."""
    if shutil.which("rl_zoo3") is None:
        pytest.skip("rl_zoo3 is not installed")
    script = (EXAMPLES / "zoo_commands.sh").read_text().splitlines()
    commands = [line.split()[1:] for line in script if line.startswith("rl_zoo3 ")]
    assert len(commands) == 6
    probe = (
        "import argparse, json, sys\n"
        "import rl_zoo3.enjoy, rl_zoo3.train\n"
        "class Parsed(Exception):\n"
        "    pass\n"
        "def parse_args(self, args=None, namespace=None):\n"
        "    _, unknown = self.parse_known_args(args, namespace)\n"
        "    raise Parsed(unknown)\n"
        "argparse.ArgumentParser.parse_args = parse_args\n"
        "commands = json.loads(sys.argv[1])\n"
        "for words in commands:\n"
        "    sys.argv = ['rl_zoo3', *words[1:]]\n"
        "    try:\n"
        "        {'train': rl_zoo3.train.train, 'enjoy': rl_zoo3.enjoy.enjoy}[words[0]]()\n"
        "    except Parsed as parsed:\n"
        "        assert not parsed.args[0], (words, parsed.args[0])\n"
        "print('parsed', len(commands))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(commands)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "parsed 6" in result.stdout, result.stderr[-2000:]
