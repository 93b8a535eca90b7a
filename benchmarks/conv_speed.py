"""Convolution speed: ``blocks.convolution.conv2d`` against ``jax.lax`` on DreamerV3's pixel layers.

    python benchmarks/conv_speed.py                 # "1m" (cnn_depth 4), 1,024 images (16 x 64)
    python benchmarks/conv_speed.py --depth 16      # "12m"
    python benchmarks/conv_speed.py --scan          # the weight gradients also inside a lax.scan

For every encoder and decoder convolution of a 64 x 64 x 3 image (kernel 5, SAME): milliseconds of the
forward pass, the weight gradient and the input gradient, each jitted alone with the agents' compiler
options, median of ``--repeats`` calls; both implementations are timed in one process, layer by layer,
so a busy neighbour affects both alike. Prints one JSON line per layer and one with the totals.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.convolution import conv2d
from sb3_worldmodels.blocks.jit import backend_compiler_options

NUMBERS = ("NHWC", "HWIO", "NHWC")


def lax_conv(x: jax.Array, kernel: jax.Array, stride: int, transpose: bool) -> jax.Array:
    strides = (stride, stride)
    if transpose:
        return jax.lax.conv_transpose(x, kernel, strides, "SAME", dimension_numbers=NUMBERS)
    return jax.lax.conv_general_dilated(x, kernel, strides, "SAME", dimension_numbers=NUMBERS)


def layers(depth: int) -> list[tuple[str, int, int, int, int, bool]]:
    """(name, input side, in channels, out channels, stride, transposed) of DreamerV3's image layers
    at ``cnn_depth`` = depth (depths depth x (1, 2, 3, 4, 4), networks.Encoder / Decoder)."""
    d = [depth * m for m in (1, 2, 3, 4, 4)]
    enc = [
        (f"enc{i}", 64 >> max(i - 1, 0), 3 if i == 0 else d[i - 1], d[i], 1 if i == 0 else 2, False)
        for i in range(5)
    ]
    dec = [(f"dec{i}", 64 >> (i + 1), d[i + 1], d[i], 2, True) for i in reversed(range(4))]
    return enc + dec + [("imgout", 64, d[0], 3, 1, True)]


def timed(fn: Callable, *args: jax.Array, repeats: int) -> float:
    compiled = jax.jit(fn, compiler_options=backend_compiler_options()).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def in_scan(fn: Callable) -> Callable:
    """``fn`` as the body of a one-step ``lax.scan`` (as in a training call of several updates)."""
    return lambda a, b: jax.lax.scan(lambda c, ab: (c, fn(*ab)), 0.0, (a[None], b[None]))[1]


def time_layer(
    conv: Callable, x: jax.Array, kernel: jax.Array, stride: int, transpose: bool, repeats: int, scan: bool
) -> dict[str, float]:
    """Milliseconds of one implementation's forward pass and gradients on (x, kernel)."""

    def forward(k: jax.Array, images: jax.Array) -> jax.Array:
        return conv(images, k, stride, transpose)

    dy = jnp.ones_like(forward(kernel, x)) * 0.01

    def weight_grad(images: jax.Array, grad: jax.Array) -> jax.Array:
        return jax.vjp(lambda k: forward(k, images), kernel)[1](grad)[0]

    def input_grad(k: jax.Array, grad: jax.Array) -> jax.Array:
        return jax.vjp(lambda images: forward(k, images), x)[1](grad)[0]

    parts = {
        "forward": timed(forward, kernel, x, repeats=repeats),
        "weight_grad": timed(weight_grad, x, dy, repeats=repeats),
        "input_grad": timed(input_grad, kernel, dy, repeats=repeats),
    }
    if scan:
        parts["weight_grad_in_scan"] = timed(in_scan(weight_grad), x, dy, repeats=max(1, repeats // 3))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=4, help="cnn_depth (4 at '1m', 16 at '12m')")
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scan", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    totals: dict[str, float] = {}
    for name, side, cin, cout, stride, transpose in layers(args.depth):
        x = jnp.asarray(rng.normal(size=(args.images, side, side, cin)), jnp.float32)
        kernel = jnp.asarray(rng.normal(size=(5, 5, cin, cout)) * 0.05, jnp.float32)
        row: dict = {"layer": name, "input": [side, side, cin], "output_channels": cout, "stride": stride}
        for impl, conv in (("lax", lax_conv), ("conv2d", conv2d)):
            parts = time_layer(conv, x, kernel, stride, transpose, args.repeats, args.scan)
            for part, ms in parts.items():
                row[f"{impl}_{part}_ms"] = round(ms, 1)
                totals[f"{impl}_{part}_ms"] = totals.get(f"{impl}_{part}_ms", 0.0) + ms
        print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "total": {k: round(v, 1) for k, v in totals.items()},
                "depth": args.depth,
                "images": args.images,
                "machine": f"{platform.machine()} {jax.devices()[0].platform}",
                "jax": jax.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
