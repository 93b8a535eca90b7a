"""How the layout of DreamerV3's categorical latent costs on an accelerator: one model step in a scan,
as the imagination and the posterior rollout run it, with the latent's S x C one-hot held three ways.

    python benchmarks/latent_layout_speed.py                       # "1m" sizes, 1 and 8 seeds
    python benchmarks/latent_layout_speed.py --classes 16 --hidden 256 --deter 2048   # "12m"

The step is a small stand-in for the RSSM's (same shapes, not the same network): features
[deter, stoch] -> hidden (matmul) -> deter' = tanh(hidden W) -> logits (D -> S*C, float32) ->
unimixed log-probabilities (1% uniform, nets.py:207-220@2411f7d) -> a straight-through one-hot sample
by Gumbel-max with noise drawn before the scan, as ``sample_update_noise`` draws it. Rows N = 1024
(16 x 64), H = 15 steps, the compute dtype bfloat16. Layouts:

- ``grouped``: the latent as (N, S, C): logits reshaped to (N, S, C), noise (H, N, S, C), the sample
  carried as (N, S, C) and flattened for the next matmul;
- ``package``: as ``grouped`` with the noise entering the scan flat, (H, N, S*C), and reshaped per
  step (the package's form, ``rollouts._flat_latent``);
- ``flat``: the latent and the noise as (N, S*C), reshaped to (N, S, C) only inside the per-class
  reductions;
- ``class_major``: (N, C*S), column c*S + s holding class c of variable s (the logit layer's
  columns and the next layer's rows permuted once), so a reduction over the classes is an
  elementwise max/sum of C slices of S lanes, and nothing is ever reshaped.

The three compute the same numbers (checked here: the class-major outputs, permuted back, equal the
grouped ones). Each is timed forward only (``--mode forward``, the imagination) and with the gradient
of a scalar of its outputs (``--mode grad``, the posterior rollout's backward), over 1 and 8 seeds
(``jax.vmap`` over each seed's own parameters and noise). One JSON line per (layout, mode, seeds):
compile seconds and the median milliseconds per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from evaluation import run_record  # noqa: E402

from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402

UNIMIX = 0.01


def unimix_logprobs(logits: jax.Array, axis: int = -1) -> jax.Array:
    """log((1 - mix) softmax + mix / C) over ``axis``, float32."""
    probs = jax.nn.softmax(logits, axis)
    return jnp.log((1.0 - UNIMIX) * probs + UNIMIX / logits.shape[axis])


def grouped_sample(logits_flat: jax.Array, gumbel: jax.Array, s: int, c: int) -> tuple[jax.Array, jax.Array]:
    """(N, S*C) logits, (N, S, C) noise -> ((N, S, C) log-probs, (N, S, C) straight-through sample)."""
    logp = unimix_logprobs(logits_flat.reshape(-1, s, c))
    onehot = jax.nn.one_hot(jnp.argmax(logp + gumbel, -1), c, dtype=jnp.float32)
    probs = jnp.exp(logp)
    return logp, onehot + probs - jax.lax.stop_gradient(probs)


def flat_sample(logits_flat: jax.Array, gumbel: jax.Array, s: int, c: int) -> tuple[jax.Array, jax.Array]:
    """(N, S*C) logits and noise -> ((N, S*C) log-probs, (N, S*C) sample), reshaped only inside."""
    logp = unimix_logprobs(logits_flat.reshape(-1, s, c)).reshape(-1, s * c)
    noisy = (logp + gumbel).reshape(-1, s, c)
    onehot = (noisy == noisy.max(-1, keepdims=True)).astype(jnp.float32).reshape(-1, s * c)
    probs = jnp.exp(logp)
    return logp, onehot + probs - jax.lax.stop_gradient(probs)


def class_major_sample(
    logits_cm: jax.Array, gumbel: jax.Array, s: int, c: int
) -> tuple[jax.Array, jax.Array]:
    """(N, C*S) class-major logits and noise -> ((N, C*S) log-probs, (N, C*S) sample): reductions
    over the classes as elementwise ops on C slices of S lanes."""
    slices = [logits_cm[:, k * s : (k + 1) * s] for k in range(c)]
    top = slices[0]
    for x in slices[1:]:
        top = jnp.maximum(top, x)
    exps = [jnp.exp(x - top) for x in slices]
    total = exps[0]
    for e in exps[1:]:
        total = total + e
    logp = jnp.log((1.0 - UNIMIX) * jnp.concatenate([e / total for e in exps], -1) + UNIMIX / c)
    noisy = logp + gumbel
    nslices = [noisy[:, k * s : (k + 1) * s] for k in range(c)]
    best = nslices[0]
    for x in nslices[1:]:
        best = jnp.maximum(best, x)
    onehot = (noisy == jnp.concatenate([best] * c, -1)).astype(jnp.float32)
    probs = jnp.exp(logp)
    return logp, onehot + probs - jax.lax.stop_gradient(probs)


def package_sample(logits_flat: jax.Array, gumbel: jax.Array, s: int, c: int) -> tuple[jax.Array, jax.Array]:
    """:func:`grouped_sample` with (N, S*C) noise reshaped here."""
    return grouped_sample(logits_flat, gumbel.reshape(-1, s, c), s, c)


SAMPLERS = {
    "grouped": grouped_sample,
    "package": package_sample,
    "flat": flat_sample,
    "class_major": class_major_sample,
}
GROUPED_CARRY = ("grouped", "package")


def make_params(key: jax.Array, deter: int, hidden: int, s: int, c: int) -> dict:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w_in": jax.random.normal(k1, (deter + s * c, hidden)) / np.sqrt(deter + s * c),
        "w_deter": jax.random.normal(k2, (hidden, deter)) / np.sqrt(hidden),
        "w_logits": jax.random.normal(k3, (deter, s * c)) / np.sqrt(deter),
    }


def class_major_order(s: int, c: int) -> np.ndarray:
    """Index i of the class-major vector holds index perm[i] of the grouped (s-major) one."""
    return np.array([si * c + ci for ci in range(c) for si in range(s)])


def to_class_major(params: dict, deter: int, s: int, c: int) -> dict:
    perm = class_major_order(s, c)
    rows = np.concatenate([np.arange(deter), deter + perm])
    return {**params, "w_in": params["w_in"][rows], "w_logits": params["w_logits"][:, perm]}


def rollout(layout: str, params: dict, deter0: jax.Array, noise: jax.Array, s: int, c: int):
    """H steps from (N, D) deter0 with (H, N, ...) noise -> stacked (features, log-probs)."""
    sampler = SAMPLERS[layout]
    dtype = jnp.bfloat16
    w_in, w_deter = params["w_in"].astype(dtype), params["w_deter"].astype(dtype)
    w_logits = params["w_logits"].astype(dtype)

    def step(carry, gumbel):
        deter, stoch = carry
        feat = jnp.concatenate([deter, stoch.reshape(stoch.shape[0], -1)], -1)
        hidden = jax.nn.silu(feat @ w_in)
        deter = jnp.tanh(hidden @ w_deter)
        logits = (deter @ w_logits).astype(jnp.float32)
        logp, sample = sampler(logits, gumbel, s, c)
        return (deter, sample.astype(dtype)), (feat, logp.astype(dtype))

    n = deter0.shape[0]
    stoch_shape = (n, s, c) if layout in GROUPED_CARRY else (n, s * c)
    carry = (deter0.astype(dtype), jnp.zeros(stoch_shape, dtype))
    _, outs = jax.lax.scan(step, carry, noise)
    return outs


def noise_for(layout: str, key: jax.Array, h: int, n: int, s: int, c: int) -> jax.Array:
    u = jax.random.uniform(key, (h * n * s * c,), minval=1e-7, maxval=1.0)
    g = -jnp.log(-jnp.log(u))
    if layout == "grouped":
        return g.reshape(h, n, s, c)
    if layout == "class_major":  # the same numbers, columns in class-major order
        return g.reshape(h, n, s * c)[..., class_major_order(s, c)]
    return g.reshape(h, n, s * c)


def program(layout: str, mode: str, args: argparse.Namespace):
    s, c, h = args.stoch, args.classes, args.horizon

    def one(params, deter0, key):
        noise = noise_for(layout, key, h, deter0.shape[0], s, c)
        if layout == "class_major":
            params = to_class_major(params, args.deter, s, c)
        if mode == "forward":
            feat, logp = rollout(layout, params, deter0, noise, s, c)
            return feat.astype(jnp.float32).sum() + logp.astype(jnp.float32).sum()

        def loss(p):
            feat, logp = rollout(layout, p, deter0, noise, s, c)
            return (feat.astype(jnp.float32) ** 2).mean() + logp.astype(jnp.float32).mean()

        return (jax.grad(loss)(params)["w_logits"] ** 2).sum()

    return one


def time_layout(layout: str, mode: str, seeds: int, args: argparse.Namespace) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), max(seeds, 1) * 3).reshape(max(seeds, 1), 3, 2)
    params = jax.vmap(lambda k: make_params(k[0], args.deter, args.hidden, args.stoch, args.classes))(keys)
    deter0 = jax.vmap(lambda k: jax.random.normal(k[1], (args.rows, args.deter)))(keys)
    noise_keys = keys[:, 2]
    fn = program(layout, mode, args)
    if seeds > 1:
        fn = jax.vmap(fn)
    else:
        params, deter0, noise_keys = jax.tree_util.tree_map(lambda x: x[0], (params, deter0, noise_keys))
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(params, deter0, noise_keys).compile()
    compile_s = time.perf_counter() - start
    out = compiled(params, deter0, noise_keys)
    jax.block_until_ready(out)
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(params, deter0, noise_keys))
        times.append(time.perf_counter() - t)
    return {
        "layout": layout,
        "mode": mode,
        "seeds": seeds,
        "value": float(np.asarray(out).sum()),
        "compile_s": round(compile_s, 2),
        "ms_median": round(1e3 * statistics.median(times), 3),
        "ms_min": round(1e3 * min(times), 3),
    }


def check_equal(args: argparse.Namespace) -> None:
    """The other rollouts equal the grouped one (class-major outputs permuted back)."""
    s, c = args.stoch, args.classes
    params = make_params(jax.random.PRNGKey(1), args.deter, args.hidden, s, c)
    deter0 = jax.random.normal(jax.random.PRNGKey(2), (64, args.deter))
    key = jax.random.PRNGKey(3)
    ref = rollout("grouped", params, deter0, noise_for("grouped", key, 3, 64, s, c), s, c)
    flat = rollout("flat", params, deter0, noise_for("flat", key, 3, 64, s, c), s, c)
    package = rollout("package", params, deter0, noise_for("package", key, 3, 64, s, c), s, c)
    cm = rollout(
        "class_major",
        to_class_major(params, args.deter, s, c),
        deter0,
        noise_for("class_major", key, 3, 64, s, c),
        s,
        c,
    )
    back = np.argsort(class_major_order(s, c))
    for name, (feat, logp) in (("flat", flat), ("package", package), ("class_major", cm)):
        if name == "class_major":
            rows = np.concatenate([np.arange(args.deter), args.deter + back])
            feat, logp = feat[..., rows], logp[..., back]
        np.testing.assert_allclose(np.float32(feat), np.float32(ref[0]), atol=2e-2, err_msg=name)
        np.testing.assert_allclose(
            np.float32(logp), np.float32(ref[1].reshape(logp.shape)), atol=2e-2, err_msg=name
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stoch", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--deter", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--horizon", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--mode", nargs="+", default=["forward", "grad"], choices=["forward", "grad"])
    parser.add_argument("--layout", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    check_equal(args)
    machine = {**run_record(), **cpu_info().as_dict()}
    for mode in args.mode:
        for seeds in args.seeds:
            for layout in args.layout:
                row = time_layout(layout, mode, seeds, args)
                row.update(jax=jax.__version__, **machine)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
