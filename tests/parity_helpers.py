"""Helpers shared by the parity tests (comparison with recorded reference numbers)."""

from __future__ import annotations

import functools
import json
import lzma
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

TDMPC2_FIXTURES = Path(__file__).parent / "fixtures" / "tdmpc2"


def assert_close(name: str, ours: Any, ref: Any, rtol: float = 1e-5, scale_tol: float = 1e-5) -> None:
    """|ours − ref| ≤ scale_tol·max|ref| + rtol·|ref|, elementwise, with matching shapes."""
    ours = np.asarray(ours, np.float64)
    ref = np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != {ref.shape}"
    err = np.abs(ours - ref)
    bound = scale_tol * np.max(np.abs(ref), initial=0.0) + rtol * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.all(err <= bound), (
        f"{name}: max abs err {err.max():.3e} (bound {bound[worst]:.3e} at {worst}), "
        f"ref max {np.abs(ref).max():.3e}"
    )


def tdmpc2_start_state(config: Any, params: dict, target: dict, scale: float = 1.0) -> Any:
    """A TD-MPC2 state with given parameters, fresh Adam states for both optimisers (world model eps
    1e-8, policy 1e-5, as the reference) and RunningScale ``scale``."""
    import jax
    import jax.numpy as jnp

    from sb3_worldmodels.tdmpc2 import agent as core

    state = core.with_params(config, core.init_state(config, jax.random.PRNGKey(0)), params, target)
    return state._replace(scale=state.scale._replace(value=jnp.asarray(scale, jnp.float32)))


DREAMERV3_TERMS = {  # our loss term -> (reference loss name, loss scale), agent.py:403-406@2411f7d
    "rec": ("vector", 1.0),
    "rew": ("reward", 1.0),
    "con": ("cont", 1.0),
    "dyn": ("dyn", 1.0),
    "rep": ("rep", 0.1),
    "actor": ("actor", 1.0),
    "critic": ("critic", 1.0),
    "repval": ("replay_critic", 0.3),
}
DREAMERV3_METRICS = {  # our metric -> reference metric (agent.py:362-390@2411f7d, jaxutils.py:526-548)
    "loss": "opt_loss",
    "grad_norm": "opt_grad_norm",
    "param_norm": "opt_param_norm",
    "update_norm": "opt_update_norm",
    "actor_entropy": "ent/action/mean",
    "post_entropy": "post_ent/mean",
    "prior_entropy": "prior_ent/mean",
    "return_mean": "ret/mean",
    "return_std": "ret/std",
    "return_min": "ret/min",
    "return_max": "ret/max",
    "value_mean": "val/mean",
    "value_std": "val/std",
    "weight_mean": "weight/mean",
    "adv_mean": "adv/mean",
    "replay_return_mean": "replay_ret/mean",
    "imag_reward_mean": "rew/mean",
    "imag_reward_std": "rew/std",
}


def dreamerv3_update_record(before: Any, after: Any, metrics: Any, latents: Any, aux: dict) -> dict:
    """What the DreamerV3 parity tests keep of one ``update_with_noise`` call, as numpy."""
    import jax

    from sb3_worldmodels.dreamerv3.reference_weights import flatten_tree

    def as_numpy(tree: Any) -> Any:
        return jax.tree_util.tree_map(np.asarray, tree)

    return {
        "before": before,
        "state": after,
        "metrics": as_numpy(metrics),
        "latents": as_numpy(latents),
        "grads": flatten_tree(aux["grads"]),
        "updates": flatten_tree(aux["updates"]),
        "internals": as_numpy(aux["internals"]),
    }


# ------------------------------------------------------------------------------------------------
# Packed fixtures (tools/pack_fixtures.py writes them; tests/fixtures/README.md describes the format)
# ------------------------------------------------------------------------------------------------

PACKED_FORMAT = 1
"""Version of the packed layout that :func:`load_fixture` reads."""


def load_fixture(path: Path | str) -> dict[str, np.ndarray]:
    """Every array of a fixture ``.npz`` as recorded, bit for bit: name → fresh numpy array.

    A plain archive is read as it is; a packed one (entries ``__layout__`` and ``__data__``) is
    decoded. Nothing is unpickled.
    """
    return {name: array.copy() for name, array in _decoded(str(Path(path).resolve())).items()}


@functools.cache
def _decoded(path: str) -> dict[str, np.ndarray]:
    """The arrays of one fixture file, decoded once per process and read-only (shared by copies)."""
    with np.load(path, allow_pickle=False) as data:
        if "__layout__" not in data.files:
            arrays = {name: data[name] for name in data.files}
        else:
            layout = json.loads(str(data["__layout__"]))
            if layout.get("format") != PACKED_FORMAT:
                raise ValueError(
                    f"{path}: packed format {layout.get('format')!r}, this loader reads {PACKED_FORMAT}; "
                    "rebuild it with tools/pack_fixtures.py"
                )
            stream = lzma.decompress(data["__data__"].tobytes())
            arrays = _unpack(Path(path), layout["arrays"], stream)
    for array in arrays.values():
        array.setflags(write=False)
    return arrays


def _unpack(path: Path, entries: list[dict[str, Any]], stream: bytes) -> dict[str, np.ndarray]:
    """Rebuild each array from its stored elements, its copies of earlier arrays and its base."""
    arrays: dict[str, np.ndarray] = {}
    offset = 0

    def source(file: str | None, key: str) -> np.ndarray:
        found = arrays[key] if file is None else _decoded(str((path.parent / file).resolve()))[key]
        return found.reshape(-1)

    for entry in entries:
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        size = int(np.prod(shape, dtype=np.int64))
        flat = np.empty(size, dtype)
        stored = np.ones(size, bool)
        copies = entry.get("copies", [])
        for start, length, file, key, source_start, *mode in copies:
            if not mode:  # an exact copy; otherwise the stored elements are steps from the source
                flat[start : start + length] = source(file, key)[source_start : source_start + length]
                stored[start : start + length] = False
        count = int(stored.sum())
        nbytes = count * dtype.itemsize
        flat[stored] = unshuffle(stream[offset : offset + nbytes], dtype, count)
        offset += nbytes
        for start, length, file, key, source_start, *mode in copies:
            if mode:
                near = source(file, key)[source_start : source_start + length]
                flat[start : start + length] = add_residual(near, flat[start : start + length], mode[0])
        if "base" in entry:
            file, key, mode = entry["base"]
            flat = add_residual(source(file, key), flat, mode)
        arrays[entry["name"]] = flat.reshape(shape)
    if offset != len(stream):
        raise ValueError(f"{path}: {len(stream) - offset} bytes left after the last array")
    return arrays


def shuffle(values: np.ndarray) -> bytes:
    """The bytes of ``values`` plane by plane (every element's first byte, then every second ...)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    return np.ascontiguousarray(flat.view(np.uint8).reshape(flat.size, flat.dtype.itemsize).T).tobytes()


def unshuffle(data: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    """Inverse of :func:`shuffle`: ``count`` elements of ``dtype``."""
    planes = np.frombuffer(data, np.uint8).reshape(dtype.itemsize, count)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(count)


def _unsigned(dtype: np.dtype) -> Any:
    """The unsigned integer type of ``dtype``'s width (4 or 8 bytes)."""
    return {4: np.uint32, 8: np.uint64}[dtype.itemsize]


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """Float bits mapped to unsigned integers in the floats' order (a bijection on bit patterns)."""
    unsigned = _unsigned(values.dtype)
    bits = values.view(unsigned)
    sign = unsigned(1) << unsigned(8 * values.dtype.itemsize - 1)
    return np.where(bits & sign, ~bits, bits | sign)


def from_ordered_bits(ordered: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`ordered_bits`."""
    unsigned = _unsigned(dtype)
    sign = unsigned(1) << unsigned(8 * dtype.itemsize - 1)
    return np.where(ordered & sign, ordered & ~sign, ~ordered).astype(unsigned).view(dtype)


def add_residual(base: np.ndarray, residual: np.ndarray, mode: str) -> np.ndarray:
    """``base`` moved by ``residual``: ``"sub"`` adds in the array's dtype (stored only where that
    is exact), ``"ord"`` adds a zigzag-coded count of representable steps (always exact)."""
    if mode == "sub":
        return (base + residual).astype(base.dtype)
    if mode != "ord":
        raise ValueError(f"unknown residual mode {mode!r}")
    unsigned = _unsigned(base.dtype)
    zigzag = residual.view(unsigned)
    steps = (zigzag >> unsigned(1)) ^ (unsigned(0) - (zigzag & unsigned(1)))
    return from_ordered_bits(ordered_bits(base) + steps, base.dtype)


def close(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6, err: str = "") -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=err)


def close_mostly(
    actual: Any, expected: Any, err: str, tight: float = 2e-6, loose: float = 3e-4, fraction: float = 1e-3
) -> None:
    """All elements within ``loose``, all but ``fraction`` of them (or 2) within ``tight`` + 1e-4 relative.

    Adam moves a weight by about lr·m̂/(sqrt(v̂) + eps): where a gradient is itself near eps, float
    noise in it changes the step (measured: a few reward/Q kernel entries off by up to 2.4e-4 after
    three updates, every other entry within 3e-6); ``loose`` stays below one step (lr 3e-4).
    """
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    diff = np.abs(actual - expected)
    assert diff.max() <= loose, (err, float(diff.max()))
    bad = diff > tight + 1e-4 * np.abs(expected)
    assert bad.sum() <= max(2, fraction * bad.size), (err, int(bad.sum()), bad.size, float(diff.max()))


@pytest.fixture
def highest_precision():
    """Every matmul of the test at float32 precision, as the reference's GEMMs (import it into a test
    module with ``pytestmark = pytest.mark.usefixtures("highest_precision")``)."""
    import jax

    with jax.default_matmul_precision("highest"):
        yield


def tdmpc2_update_noise(io: dict, prefix: str = "") -> Any:
    """The recorded draws of one TD-MPC2 update (``<prefix>in_eps_td`` ...), dropout off."""
    import jax.numpy as jnp

    from sb3_worldmodels.tdmpc2 import agent as core

    return core.UpdateNoise(
        eps_td=jnp.asarray(io[f"{prefix}in_eps_td"]),
        pair_td=jnp.asarray(io[f"{prefix}in_pair_td"], jnp.int32),
        eps_pi=jnp.asarray(io[f"{prefix}in_eps_pi"]),
        pair_pi=jnp.asarray(io[f"{prefix}in_pair_pi"], jnp.int32),
        dropout=None,
    )


def tdmpc2_plan_noise(io: dict, prefix: str, action_dim: int) -> Any:
    """The recorded draws of one TD-MPC2 plan (``<prefix>pi_traj_eps`` ...), dropout off."""
    import jax.numpy as jnp

    from sb3_worldmodels.tdmpc2 import agent as core

    final = io[prefix + "final_eps"] if prefix + "final_eps" in io else np.zeros(action_dim, np.float32)
    return core.PlanNoise(
        pi_traj=jnp.asarray(io[prefix + "pi_traj_eps"]),
        mppi=jnp.asarray(io[prefix + "mppi_eps"]),
        value_pi=jnp.asarray(io[prefix + "value_pi_eps"]),
        value_pair=jnp.asarray(io[prefix + "value_q_pair"], jnp.int32),
        elite_u=jnp.zeros((), jnp.float32),
        elite_pick=jnp.asarray(io[prefix + "elite_pick"], jnp.int32),
        final=jnp.asarray(final, jnp.float32),
        dropout=None,
    )


def moment_tree(vector: Any, like: Any) -> Any:
    """An optimiser moment, one (P,) vector of every parameter (``blocks.optim.over_flat_parameters``),
    as a tree shaped as ``like`` (the parameters or their gradients)."""
    return ravel_pytree(like)[1](vector)


def moment_vector(tree: Any) -> Any:
    """A moment given as a tree of the parameters' shapes → the (P,) vector the optimiser keeps."""
    return ravel_pytree(tree)[0]
