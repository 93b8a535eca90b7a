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

``--pixels`` observes 64 x 64 x 3 uint8 images (key ``image``, the reference's CNN encoder and decoder)
instead of the 4-vector. ``--platform tpu`` (or ``gpu``) trains on that accelerator, ``--model-size 12m``
builds the "12m" sizes (deter 2048, hidden 256, classes 16, units 256, CNN depth 16), and ``--jax-shim`` lets
it run on a newer JAX than its own (``reference_jax_shim.py``: JAX 0.10.2 with TensorFlow Probability 0.25; on
a TPU host, which has no other JAX). On an accelerator only one process holds the device: time the reference
and ours one after the other, each worker answering a list of ``update`` lines, e.g.

    (for i in $(seq 12); do echo update; done) | python benchmarks/reference_dreamerv3_worker.py \
        --src REF --platform tpu --jax-shim --compute-dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from worker_protocol import serve

SIZES = {"1m": (512, 64, 4, 64, 4), "12m": (2048, 256, 16, 256, 16)}
"""Model size -> (deter, hidden, classes, units, CNN depth): the reference's configs.yaml:149-177@2411f7d,
as ``sb3_worldmodels.dreamerv3.config.MODEL_SIZES``."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", required=True, help="the reference's checkout (holds dreamerv3/, embodied/)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batch-length", type=int, default=64, help="trained steps (the context step added)")
    parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--platform", default="cpu", choices=["cpu", "gpu", "tpu"])
    parser.add_argument("--model-size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--pixels", action="store_true", help="64 x 64 x 3 uint8 images, not a 4-vector")
    parser.add_argument("--jax-shim", action="store_true", help="run on a newer JAX (reference_jax_shim.py)")
    args = parser.parse_args()

    if args.jax_shim:
        import reference_jax_shim

        reference_jax_shim.apply()
    sys.path.insert(0, os.path.abspath(args.src))
    import embodied
    import jax
    import numpy as np
    from dreamerv3 import agent as agt

    deter, hidden, classes, units, depth = SIZES[args.model_size]
    config = embodied.Config(agt.Agent.configs["defaults"])
    config = config.update(
        {
            "dyn.rssm.deter": deter,
            "dyn.rssm.hidden": hidden,
            "dyn.rssm.classes": classes,
            r".*\.units": units,
            r".*\.depth": depth,
            "jax.platform": args.platform,
            "jax.compute_dtype": args.compute_dtype,
            "jax.prealloc": False,
            "batch_size": args.batch_size,
            "batch_length": args.batch_length + 1,
            "replay_context": 1,
            "seed": 0,
            "logdir": "/dev/null",
        }
    )
    observed = ("image", np.uint8, (64, 64, 3)) if args.pixels else ("vector", np.float32, (4,))
    obs_space = {
        observed[0]: embodied.Space(observed[1], observed[2]),
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
        observed[0]: (
            rng.integers(0, 256, size=(b, length, *observed[2]), dtype=np.uint8)
            if args.pixels
            else rng.normal(size=(b, length, 4)).astype(np.float32)
        ),
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
                "platform": args.platform,
                "model_size": args.model_size,
                "device": str(jax.devices()[0].device_kind),
            }
        ),
        flush=True,
    )
    serve({"update": update})


if __name__ == "__main__":
    main()
