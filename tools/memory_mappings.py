"""Memory mappings of one process that builds many DreamerV3 configurations in turn (Linux only).

    python tools/memory_mappings.py                  # 20 configurations, the library's setting
    python tools/memory_mappings.py --kept 1000      # every configuration kept: aborts near 15

XLA:CPU maps every compiled kernel into memory separately, and Linux allows a process
``vm.max_map_count`` mappings (65,530 by default); past it, the next compile fails ("LLVM compilation
error: Cannot allocate memory") and the process dies. ``--kept`` overrides
``blocks.jit.COMPILED_CONFIGS_KEPT``, the number of configurations whose programs each jitted agent
function keeps. Each configuration is the smallest DreamerV3 (``SMOKE_SETTINGS``) on CartPole-v1
with another ``return_horizon``, training from its first rows (``train_fill=0``), for 400 rows.
Prints one JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels import DreamerV3  # noqa: E402
from sb3_worldmodels.blocks import jit  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--configs", type=int, default=20)
    parser.add_argument("--kept", type=int, default=jit.COMPILED_CONFIGS_KEPT)
    args = parser.parse_args()
    jit.COMPILED_CONFIGS_KEPT = args.kept
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    for i in range(args.configs):
        model = DreamerV3("CartPole-v1", **SMOKE_SETTINGS, return_horizon=2.0 + i, train_fill=0, seed=0)
        model.learn(400)
        row = {"configs": i + 1, "kept": args.kept, "mappings": jit.memory_mappings(), "limit": limit}
        print(json.dumps(row), flush=True)
        del model


if __name__ == "__main__":
    main()
