"""Times the reference DreamerV3 (danijar/dreamerv3 @ 2411f7d + fix 29eb964, JAX) training step on
request.

Started by ``dreamerv3_speed.py --reference-src DIR --reference-python PY``, under the reference's own
Python environment (jax 0.4.26 as its fixtures were recorded with, tensorflow-probability 0.24,
optax, chex, einops, ruamel.yaml); the package never imports it. It builds the reference agent as
the "1m" model (the reference's defaults with ``dyn.rssm`` deter 512, hidden 64, classes 4, every
``units`` 64 and CNN ``depth`` 4, the same sizes as ``preset("1m")``) on CartPole-v1's spaces (a
4-vector, two discrete actions), batch ``B`` x (``T`` + 1) (``replay_context`` 1: one context step
and ``T`` trained steps, as our ``batch_length`` counts them), compute dtype float32 by default.
``JAXAgent`` compiles its train step when built; the worker prints one JSON line when ready, then
answers each stdin line ``update`` with the seconds of one ``agent.train(batch, carry)`` (the jitted
step with the wrapper's bookkeeping, until the new parameters are ready), timed inside this
process, or ``peak_rss_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from worker_protocol import serve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", required=True, help="the reference's checkout (holds dreamerv3/, embodied/)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batch-length", type=int, default=64, help="trained steps (the context step added)")
    parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    sys.path.insert(0, os.path.abspath(args.src))
    import embodied
    import jax
    import numpy as np
    from dreamerv3 import agent as agt

    config = embodied.Config(agt.Agent.configs["defaults"])
    config = config.update(
        {
            "dyn.rssm.deter": 512,
            "dyn.rssm.hidden": 64,
            "dyn.rssm.classes": 4,
            r".*\.units": 64,
            r".*\.depth": 4,
            "jax.platform": "cpu",
            "jax.compute_dtype": args.compute_dtype,
            "jax.prealloc": False,
            "batch_size": args.batch_size,
            "batch_length": args.batch_length + 1,
            "replay_context": 1,
            "seed": 0,
            "logdir": "/dev/null",
        }
    )
    obs_space = {
        "vector": embodied.Space(np.float32, (4,)),
        "reward": embodied.Space(np.float32),
        "is_first": embodied.Space(bool),
        "is_last": embodied.Space(bool),
        "is_terminal": embodied.Space(bool),
    }
    act_space = {"action": embodied.Space(np.int32, (), 0, 2), "reset": embodied.Space(bool)}
    t = time.perf_counter()
    agent = agt.Agent(obs_space, act_space, config)  # compiles train and report
    build_s = time.perf_counter() - t

    b, length = config.batch_size, config.batch_length
    rng = np.random.default_rng(0)
    data = {
        "vector": rng.normal(size=(b, length, 4)).astype(np.float32),
        "reward": rng.normal(size=(b, length)).astype(np.float32),
        "is_first": np.zeros((b, length), bool),
        "is_last": np.zeros((b, length), bool),
        "is_terminal": np.zeros((b, length), bool),
        "action": rng.integers(0, 2, size=(b, length)).astype(np.int32),
        "stepid": np.zeros((b, length, 20), np.uint8),
    }
    for key, space in agent.agent.aux_spaces.items():  # the replay's latents (deter, stoch)
        if key not in data:
            data[key] = np.zeros((b, length, *space.shape), space.dtype)
    data = jax.device_put(data, agent.train_sharded)
    carry = agent.init_train(b)

    def update() -> None:
        nonlocal carry
        batch = {**data, "seed": agent._next_seeds(agent.train_sharded)}
        _, carry, _ = agent.train(batch, carry)
        jax.block_until_ready(agent.params)

    update()  # the first call after compiling
    params = sum(
        int(np.prod(v.shape)) for k, v in agent.params.items() if "/opt/" not in k and "slowcritic" not in k
    )
    print(
        json.dumps(
            {
                "ready": True,
                "params": params,
                "build_s": round(build_s, 2),
                "jax": jax.__version__,
                "compute_dtype": args.compute_dtype,
            }
        ),
        flush=True,
    )
    serve({"update": update})


if __name__ == "__main__":
    main()
