"""Times the reference TD-MPC2 (nicklashansen/tdmpc2 @ b67b21c, PyTorch) plan and update on request.

Started by ``tdmpc2_speed.py --reference-src DIR --reference-python PY``, under the reference's own
Python environment (torch, tensordict, torchrl, hydra, omegaconf); the package never imports it.
It builds the reference agent from the reference's ``config.yaml`` at the given model size, with the
same inputs as ``tdmpc2_speed.build`` (Pendulum-v1 shapes by default; a fixed batch of normal
observations and rewards and uniform actions), prints one JSON line when ready, then answers each
stdin line ``plan`` or ``update`` with the seconds of one call, timed inside this process:
``plan`` is ``TDMPC2.act`` (encode + MPPI, training mode), ``update`` is ``TDMPC2.update`` on the
fixed batch (replay sampling excluded, as in our benchmark).

The reference puts its model and buffers on ``torch.device('cuda')`` (tdmpc2.py:18,
common/scale.py:9-10 @ b67b21c); on a machine without a GPU the worker hands those two modules a
``torch`` whose ``device('cuda')`` is the CPU, without touching the reference's files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

from worker_protocol import serve


def cpu_torch(torch: types.ModuleType) -> types.ModuleType:
    """``torch`` itself, except that ``device("cuda")`` is the CPU where no GPU exists."""
    if torch.cuda.is_available():
        return torch
    proxy = types.ModuleType("torch")
    proxy.__dict__.update(torch.__dict__)

    def device(spec, *args):
        return torch.device("cpu" if str(spec).startswith("cuda") else spec, *args)

    proxy.device = device  # type: ignore[attr-defined]
    return proxy


class FixedBatch:
    """Stands in for the reference's replay buffer: ``sample()`` returns the same batch each time."""

    def __init__(self, obs, action, reward):
        self.batch = (obs, action, reward, None)

    def sample(self):
        return self.batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", required=True, help="the reference's tdmpc2/ source folder")
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--obs-dim", type=int, default=3)
    parser.add_argument("--action-dim", type=int, default=1)
    parser.add_argument("--episode-length", type=int, default=200)
    args = parser.parse_args()

    sys.path.insert(0, os.path.abspath(args.src))
    import hydra.utils
    import torch
    from omegaconf import OmegaConf

    hydra.utils.get_original_cwd = os.getcwd  # parse_cfg asks Hydra for the launch folder
    import common.scale
    import tdmpc2 as reference
    from common.parser import parse_cfg
    from tdmpc2 import TDMPC2

    reference.torch = common.scale.torch = cpu_torch(torch)

    cfg = OmegaConf.load(os.path.join(args.src, "config.yaml"))
    cfg.pop("defaults", None)
    cfg.task, cfg.model_size = "pendulum-swingup", args.size
    cfg = parse_cfg(cfg)
    cfg.obs_shape = {"state": (args.obs_dim,)}
    cfg.action_dim = args.action_dim
    cfg.episode_length = args.episode_length
    cfg.seed_steps = max(1000, 5 * args.episode_length)
    torch.manual_seed(0)
    t = time.perf_counter()
    agent = TDMPC2(cfg)
    build_s = time.perf_counter() - t

    h, b = cfg.horizon, cfg.batch_size
    gen = torch.Generator().manual_seed(0)
    buffer = FixedBatch(
        torch.randn(h + 1, b, args.obs_dim, generator=gen),
        torch.rand(h, b, args.action_dim, generator=gen) * 2 - 1,
        torch.randn(h, b, 1, generator=gen),
    )
    obs = torch.randn(args.obs_dim, generator=gen)
    agent.act(obs, t0=True)  # creates the warm start (_prev_mean) the timed calls continue
    agent.update(buffer)
    params = agent.model.total_params  # learnable: the target Qs excluded
    print(
        json.dumps(
            {
                "ready": True,
                "params": params,
                "build_s": round(build_s, 2),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )
    serve({"plan": lambda: agent.act(obs, t0=False), "update": lambda: agent.update(buffer)})


if __name__ == "__main__":
    main()
