"""Convolution speed: ``blocks.convolution.conv2d``'s block convolution against ``jax.lax`` on the agents'
pixel layers.

    python benchmarks/conv_speed.py                 # DreamerV3 "1m" (cnn_depth 4), 1,024 images (16 x 64)
    python benchmarks/conv_speed.py --depth 16      # "12m"
    python benchmarks/conv_speed.py --scan          # the weight gradients also inside a lax.scan
    python benchmarks/conv_speed.py --agent tdmpc2 --channels 8    # TD-MPC2 size 1 (32: size 5)

DreamerV3: every encoder and decoder convolution of a 64 x 64 x 3 image (kernel 5, SAME). TD-MPC2: the
pixel encoder's four VALID convolutions of 64 x 64 x 9 images (7/2, 5/2, 3/2, 3/1, ``--channels``
each), and its shift augmentation (a crop of the replicate-padded uint8 images, offsets per image)
written three ways (``blocks.images.shift_images``'s methods): a vmapped dynamic slice (a gather), a
select among the seven offsets per axis, and one-hot matmuls (exact for uint8 images).
Milliseconds of the forward pass, the weight gradient and the input gradient, each jitted alone with
the agents' compiler options and at ``--precision`` (the agents' default: float32), median of
``--repeats`` calls; the implementations are timed in one process, layer by layer, so a busy
neighbour affects them alike. ``conv2d`` is ``blocks.convolution.conv2d``'s block convolution
(``method="blocks"``) on any backend (the agents' on a CPU), ``patches`` (convolutions, not
transposed ones) its one matmul of the image's patches with the kernel (``method="patches"``).
Prints one JSON line per layer and one with the totals.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.convolution import conv2d
from sb3_worldmodels.blocks.images import SHIFT_METHODS, random_shifts, shift_images
from sb3_worldmodels.blocks.jit import MATMUL_PRECISIONS, backend_compiler_options, check_matmul_precision

NUMBERS = ("NHWC", "HWIO", "NHWC")


def lax_conv(
    x: jax.Array, kernel: jax.Array, stride: int, transpose: bool, padding: str = "SAME"
) -> jax.Array:
    strides = (stride, stride)
    if transpose:
        return jax.lax.conv_transpose(x, kernel, strides, "SAME", dimension_numbers=NUMBERS)
    return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NUMBERS)


def method_conv(method: str) -> Callable:
    """``conv2d`` with ``method`` on any backend."""

    def conv(
        x: jax.Array, kernel: jax.Array, stride: int, transpose: bool, padding: str = "SAME"
    ) -> jax.Array:
        return conv2d(x, kernel, stride, transpose, padding, method=method)

    return conv


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


TDMPC2_LAYERS = ((64, 7, 2), (29, 5, 2), (13, 3, 2), (6, 3, 1))
"""(input side, kernel, stride) of TD-MPC2's pixel encoder on 64 x 64 images (VALID; the first reads
the 9 channels of three stacked RGB frames)."""


def time_shifts(images: int, repeats: int) -> dict:
    """Milliseconds of the three ways of the shift augmentation on ``images`` 64 x 64 x 9 uint8 images
    (the same crops: tests/test_tdmpc2_pixels.py)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, size=(images, 64, 64, 9)), jnp.uint8)
    offsets = random_shifts(jax.random.PRNGKey(0), (images,))
    row: dict = {"layer": "shift", "input": [64, 64, 9]}
    for method in SHIFT_METHODS:
        shift = functools.partial(shift_images, method=method)
        row[f"{method}_ms"] = round(timed(shift, x, offsets, repeats=repeats), 1)
    return row


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
    conv: Callable,
    x: jax.Array,
    kernel: jax.Array,
    stride: int,
    transpose: bool,
    repeats: int,
    scan: bool,
    padding: str = "SAME",
) -> dict[str, float]:
    """Milliseconds of one implementation's forward pass and gradients on (x, kernel)."""

    def forward(k: jax.Array, images: jax.Array) -> jax.Array:
        return conv(images, k, stride, transpose, padding)

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
    parser.add_argument("--agent", choices=["dreamerv3", "tdmpc2"], default="dreamerv3")
    parser.add_argument("--depth", type=int, default=4, help="DreamerV3's cnn_depth (4 at '1m', 16 at '12m')")
    parser.add_argument("--channels", type=int, default=8, help="TD-MPC2's num_channels (size 1: 8)")
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--precision", choices=MATMUL_PRECISIONS, default="float32")
    args = parser.parse_args()
    with jax.default_matmul_precision(check_matmul_precision(args.precision)):
        totals = time_layers(args)
    print(
        json.dumps(
            {
                "total": {k: round(v, 1) for k, v in totals.items()},
                "agent": args.agent,
                **({"depth": args.depth} if args.agent == "dreamerv3" else {"channels": args.channels}),
                "images": args.images,
                "precision": args.precision,
                "machine": f"{platform.machine()} {jax.devices()[0].platform}",
                "jax": jax.__version__,
            }
        )
    )


def time_layers(args: argparse.Namespace) -> dict[str, float]:
    """Print each layer's row; return the totals."""
    rng = np.random.default_rng(0)
    if args.agent == "dreamerv3":
        specs = [(*layer, 5, "SAME") for layer in layers(args.depth)]
    else:
        print(json.dumps(time_shifts(args.images, args.repeats)), flush=True)
        specs = [
            (f"conv{i}", side, 9 if i == 0 else args.channels, args.channels, stride, False, k, "VALID")
            for i, (side, k, stride) in enumerate(TDMPC2_LAYERS)
        ]
    totals: dict[str, float] = {}
    for name, side, cin, cout, stride, transpose, k, padding in specs:
        x = jnp.asarray(rng.normal(size=(args.images, side, side, cin)), jnp.float32)
        kernel = jnp.asarray(rng.normal(size=(k, k, cin, cout)) * 0.05, jnp.float32)
        row: dict = {"layer": name, "input": [side, side, cin], "output_channels": cout, "stride": stride}
        impls = [("lax", lax_conv), ("conv2d", method_conv("blocks"))]
        impls += [] if transpose else [("patches", method_conv("patches"))]
        for impl, conv in impls:
            parts = time_layer(conv, x, kernel, stride, transpose, args.repeats, args.scan, padding)
            for part, ms in parts.items():
                row[f"{impl}_{part}_ms"] = round(ms, 1)
                totals[f"{impl}_{part}_ms"] = totals.get(f"{impl}_{part}_ms", 0.0) + ms
        print(json.dumps(row), flush=True)
    return totals


if __name__ == "__main__":
    main()
