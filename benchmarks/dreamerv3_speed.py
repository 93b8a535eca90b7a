"""DreamerV3 speed benchmark: rows/s with and without compilation, updates/s, compile time, memory.

    python benchmarks/dreamerv3_speed.py --config seeds      # CartPole-v1, 4 envs, 8,000 rows, "1m",
                                                             # batch 8x16, train ratio 8
    python benchmarks/dreamerv3_speed.py --config default    # Pendulum-v1, "12m", 16 envs, 16x64, ratio 512
    python benchmarks/dreamerv3_speed.py --config update-1m  # one "1m" update at 16x64

Prints one JSON line per run; copy the results into docs/performance.md with the machine and date.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.config import preset

CONFIGS = {
    "seeds": dict(
        env="CartPole-v1",
        n_envs=4,
        rows=8_000,
        kwargs=dict(model_size="1m", batch_size=8, batch_length=16, train_ratio=8),
    ),
    "default": dict(
        env="Pendulum-v1",
        n_envs=16,
        rows=2_400,
        kwargs=dict(model_size="12m", batch_size=16, batch_length=64, train_ratio=512),
    ),
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_learning(name: str, seed: int) -> dict:
    spec = CONFIGS[name]
    model = DreamerV3(spec["env"], n_envs=spec["n_envs"], seed=seed, **spec["kwargs"])
    warm_rows = 2 * (model.batch_length + 1) * model.n_envs
    t0 = time.perf_counter()
    model.learn(warm_rows)  # includes compilation of the acting step and the update
    t1 = time.perf_counter()
    updates0 = model._n_updates
    model.learn(spec["rows"] - model.num_timesteps, reset_num_timesteps=False)
    t2 = time.perf_counter()
    rows = model.num_timesteps
    return {
        "config": name,
        "env": spec["env"],
        "n_envs": spec["n_envs"],
        **spec["kwargs"],
        "rows": rows,
        "updates": model._n_updates,
        "seconds_total": round(t2 - t0, 2),
        "rows_per_s_with_compile": round(rows / (t2 - t0), 1),
        "rows_per_s_after_compile": round((rows - warm_rows) / (t2 - t1), 1),
        "updates_per_s_after_compile": round((model._n_updates - updates0) / (t2 - t1), 2),
        "warmup_seconds": round(t1 - t0, 2),
        "replay_bytes": model.replay_bytes_per_seed,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def run_update(model_size: str, batch_size: int, batch_length: int, repeats: int) -> dict:
    cfg = preset(
        model_size, obs_dim=4, action_dim=2, discrete=True, batch_size=batch_size, batch_length=batch_length
    )
    state = core.init_state(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    shape = (1, batch_size, batch_length + 1)
    batch = {
        "obs": rng.normal(size=(*shape, cfg.obs_dim)).astype(np.float32),
        "action": np.eye(2, dtype=np.float32)[rng.integers(0, 2, size=shape)],
        "reward": rng.normal(size=shape).astype(np.float32),
        "is_first": np.zeros(shape, bool),
        "is_last": np.zeros(shape, bool),
        "is_terminal": np.zeros(shape, bool),
        "deter": np.zeros((*shape, cfg.deter), np.float32),
        "stoch": np.zeros((*shape, cfg.stoch), np.int32),
    }
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    t0 = time.perf_counter()
    compiled = core.train_many_jit.lower(cfg, state, batch).compile()
    compile_s = time.perf_counter() - t0
    out = compiled(state, batch)
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = compiled(out[0], batch)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    return {
        "config": f"update-{model_size}",
        "batch": f"{batch_size}x{batch_length}",
        "compile_seconds": round(compile_s, 1),
        "ms_per_update_median": round(1000 * float(np.median(times)), 1),
        "ms_per_update_min": round(1000 * float(np.min(times)), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="seeds", choices=[*CONFIGS, "update-1m", "update-12m"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.config.startswith("update-"):
        result = run_update(args.config.split("-")[1], 16, 64, args.repeats)
    else:
        result = run_learning(args.config, args.seed)
    result.update(
        machine=f"{platform.machine()} {jax.devices()[0].platform} x{jax.local_device_count()}",
        jax=jax.__version__,
        date=time.strftime("%Y-%m-%d"),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
