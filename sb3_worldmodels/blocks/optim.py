"""The agents' optimisers as optax transformations, built by one function, :func:`optimizer`:
direction stages → ×(−learning rate, per parameter group) → stages after, with the learning rate
injected (``optax.inject_hyperparams``: it lives in the optimiser state and changes between updates
without recompiling; :func:`with_learning_rate`, :func:`get_learning_rate`).

- DreamerV3 (:func:`laprop`): AGC → LaProp (RMS, then momentum) → −lr → warmup
  (jaxutils.py:398-550,659-712@2411f7d). Each stage is a separate :class:`optax.GradientTransformation`
  with its own NamedTuple state.
- TD-MPC2 (:func:`adam`): PyTorch's Adam direction → −lr, the encoder's group at a scaled rate
  (``optax.multi_transform``; tdmpc2.py:20-27@b67b21c).

The elementwise stages that keep moments (RMS, momentum, Adam) run over one vector of every parameter
(:func:`over_flat_parameters`): their moments are one array each in the state, not one per parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from sb3_worldmodels.blocks.breaks import broken

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

__all__ = [
    "ScaleByMomentumState",
    "ScaleByRmsState",
    "WarmupState",
    "adam",
    "get_learning_rate",
    "laprop",
    "optimizer",
    "over_flat_parameters",
    "scale_by_agc",
    "scale_by_momentum_corrected",
    "scale_by_rms_corrected",
    "scale_by_warmup",
    "with_learning_rate",
]

_INJECT_STATES = tuple(
    cls
    for cls in (
        getattr(optax, "InjectStatefulHyperparamsState", None),
        getattr(optax, "InjectHyperparamsState", None),
    )
    if cls is not None
)


def scale_by_agc(clip: float = 0.3, pmin: float = 1e-3) -> optax.GradientTransformation:
    """Adaptive gradient clipping per parameter tensor (whole array, not per unit).

    For each leaf: u = ‖g‖₂, p = ‖w‖₂, limit = clip·max(pmin, p), g ← g / max(1, u/limit).
    Stateless; ``update`` requires ``params``.
    """

    def init_fn(params: Any) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update_fn(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        if params is None:
            raise ValueError("scale_by_agc needs the current params in update()")

        def clip_leaf(g: Array, w: Array) -> Array:
            upd_norm = jnp.linalg.norm(g.reshape(-1))
            param_norm = jnp.linalg.norm(w.reshape(-1))
            limit = clip * (param_norm if broken("agc_limit") else jnp.maximum(pmin, param_norm))
            return g / jnp.maximum(1.0, upd_norm / limit)

        return jax.tree_util.tree_map(clip_leaf, updates, params), state

    return optax.GradientTransformation(init_fn, update_fn)


def over_flat_parameters(stage: optax.GradientTransformation) -> optax.GradientTransformation:
    """``stage`` (elementwise) applied to one vector of all the parameters: the leaves raveled and
    concatenated in tree order (``jax.flatten_util.ravel_pytree``), its output split back into the
    tree. The same numbers as ``stage`` over the tree; its state holds one (P,) array per moment.

    A jitted update takes and returns its whole state; on an accelerator each array costs the runtime
    microseconds per call (about 8 µs in and out on a TPU v5e host, ``benchmarks/dispatch_overhead.py``),
    which for a TD-MPC2 update's 106 optimiser arrays is more than the update's own device time."""

    def init_fn(params: Any) -> Any:
        return stage.init(ravel_pytree(params)[0])

    def update_fn(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        flat, unravel = ravel_pytree(updates)
        flat_params = None if params is None else ravel_pytree(params)[0]
        flat, state = stage.update(flat, state, flat_params)
        return unravel(flat), state

    return optax.GradientTransformation(init_fn, update_fn)


class ScaleByRmsState(NamedTuple):
    """count: () int32, updates seen; nu: EMA of squared updates (raw, not bias-corrected)."""

    count: Array  # type: ignore[assignment]
    nu: Any


def scale_by_rms_corrected(beta2: float = 0.999, eps: float = 1e-20) -> optax.GradientTransformation:
    """ν ← β₂ν + (1 − β₂)g²;  g ← g / (sqrt(ν / (1 − β₂ᵗ)) + eps), t = count + 1."""

    def init_fn(params: Any) -> ScaleByRmsState:
        nu = jax.tree_util.tree_map(lambda p: jnp.zeros_like(p, jnp.float32), params)
        return ScaleByRmsState(count=jnp.zeros((), jnp.int32), nu=nu)

    def update_fn(updates: Any, state: ScaleByRmsState, params: Any = None) -> tuple[Any, ScaleByRmsState]:
        del params
        count = optax.safe_increment(state.count)
        nu = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1.0 - beta2) * jnp.square(g), state.nu, updates)
        correction = 1.0 - beta2 ** count.astype(jnp.float32)
        updates = jax.tree_util.tree_map(lambda g, v: g / (jnp.sqrt(v / correction) + eps), updates, nu)
        return updates, ScaleByRmsState(count=count, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


class ScaleByMomentumState(NamedTuple):
    """count: () int32, updates seen; mu: EMA of updates (raw, not bias-corrected)."""

    count: Array  # type: ignore[assignment]
    mu: Any


def scale_by_momentum_corrected(beta1: float = 0.9) -> optax.GradientTransformation:
    """m ← β₁m + (1 − β₁)g;  g ← m / (1 − β₁ᵗ), t = count + 1."""

    def init_fn(params: Any) -> ScaleByMomentumState:
        mu = jax.tree_util.tree_map(lambda p: jnp.zeros_like(p, jnp.float32), params)
        return ScaleByMomentumState(count=jnp.zeros((), jnp.int32), mu=mu)

    def update_fn(
        updates: Any, state: ScaleByMomentumState, params: Any = None
    ) -> tuple[Any, ScaleByMomentumState]:
        del params
        count = optax.safe_increment(state.count)
        mu = jax.tree_util.tree_map(lambda m, g: beta1 * m + (1.0 - beta1) * g, state.mu, updates)
        correction = 1.0 - beta1 ** count.astype(jnp.float32)
        updates = jax.tree_util.tree_map(lambda m: m / correction, mu)
        return updates, ScaleByMomentumState(count=count, mu=mu)

    return optax.GradientTransformation(init_fn, update_fn)


class WarmupState(NamedTuple):
    """count: () int32, optimiser steps taken so far."""

    count: Array  # type: ignore[assignment]


def scale_by_warmup(warmup: int = 1000) -> optax.GradientTransformation:
    """Multiply by clip(count/warmup, 0, 1), with ``count`` read *before* it is incremented.

    So update k (1-based) is scaled by (k − 1)/warmup: the first update is exactly zero and
    update warmup + 1 is the first at full rate. ``warmup <= 0`` disables the ramp.
    """

    def init_fn(params: Any) -> WarmupState:
        del params
        return WarmupState(count=jnp.zeros((), jnp.int32))

    def update_fn(updates: Any, state: WarmupState, params: Any = None) -> tuple[Any, WarmupState]:
        del params
        if warmup > 0:
            count = state.count + 1 if broken("warmup") else state.count
            factor = jnp.clip(count.astype(jnp.float32) / warmup, 0.0, 1.0)
            updates = jax.tree_util.tree_map(lambda g: g * factor, updates)
        return updates, WarmupState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)


def _chain(
    learning_rate: ArrayLike,
    direction: tuple[optax.GradientTransformation, ...],
    after: tuple[optax.GradientTransformation, ...],
    lr_scales: tuple[tuple[str, float], ...],
) -> optax.GradientTransformation:
    return optax.chain(*direction, _scale_by_learning_rate(learning_rate, lr_scales), *after)


_injected_chain = optax.inject_hyperparams(
    _chain, static_args=("direction", "after", "lr_scales"), hyperparam_dtype=jnp.float32
)


def _scale_by_learning_rate(
    learning_rate: ArrayLike, lr_scales: tuple[tuple[str, float], ...]
) -> optax.GradientTransformation:
    """×(−learning_rate); with ``lr_scales``, ×(−learning_rate·scale) on the parameters' top-level
    entry of each named group and ×(−learning_rate) on the others. Stateless."""
    if not lr_scales:
        return optax.scale_by_learning_rate(learning_rate)
    scales = dict(lr_scales)
    if OTHER_GROUP in scales:
        raise ValueError(f"{OTHER_GROUP!r} names the unscaled parameters; give another group name.")
    groups = {name: optax.scale_by_learning_rate(learning_rate * scale) for name, scale in scales.items()}
    groups[OTHER_GROUP] = optax.scale_by_learning_rate(learning_rate)

    def labels(params: dict) -> dict[str, str]:
        return {name: name if name in scales else OTHER_GROUP for name in params}

    return optax.multi_transform(groups, labels)


OTHER_GROUP = "other"
"""The parameter group of :func:`optimizer` whose learning rate is not scaled."""


def optimizer(
    direction: Sequence[optax.GradientTransformation],
    learning_rate: float,
    after: Sequence[optax.GradientTransformation] = (),
    lr_scales: Mapping[str, float] | None = None,
) -> optax.GradientTransformation:
    """The one optimiser construction of both agents: ``direction`` stages → ×(−learning_rate) →
    ``after`` stages, chained flat (the state's ``inner_state`` is one tuple of the stages' states,
    the learning-rate stage between them).

    The learning rate is injected: a () float32 array in ``opt_state.hyperparams["learning_rate"]``
    (:func:`with_learning_rate`). ``lr_scales`` {name: scale}: the parameters (a dict) under top-level
    key ``name`` move at learning_rate·scale (``optax.multi_transform``; e.g. TD-MPC2's encoder).
    """
    scales = tuple(sorted((lr_scales or {}).items()))
    return _injected_chain(
        learning_rate=learning_rate, direction=tuple(direction), after=tuple(after), lr_scales=scales
    )


def laprop(
    learning_rate: float = 4e-5,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-20,
    agc: float = 0.3,
    pmin: float = 1e-3,
    warmup: int = 1000,
) -> optax.GradientTransformation:
    """DreamerV3's optimiser: AGC → RMS scaling → momentum → ×(−lr) → warmup factor.

    Defaults are the reference ``opt`` config (lr 4e-5, eps 1e-20, β₁ 0.9, β₂ 0.999, AGC 0.3 with
    pmin 1e-3, warmup 1000). ``agc <= 0`` drops the clipping stage. ``update`` needs ``params``.
    The stage states are in ``opt_state.inner_state`` in chain order, e.g. ``inner_state[1].nu`` and
    ``inner_state[2].mu``, each a (P,) vector of all the parameters (:func:`over_flat_parameters`;
    see :func:`optimizer` for the learning rate).
    """
    clipped = isinstance(agc, jax.core.Tracer) or agc > 0  # traced: one positive value per seed
    direction = [scale_by_agc(agc, pmin)] if clipped else []
    direction += [
        over_flat_parameters(scale_by_rms_corrected(beta2, eps)),
        over_flat_parameters(scale_by_momentum_corrected(beta1)),
    ]
    return optimizer(direction, learning_rate, after=[scale_by_warmup(warmup)])


def adam(
    learning_rate: float,
    beta1: float,
    beta2: float,
    eps: float,
    lr_scales: Mapping[str, float] | None = None,
) -> optax.GradientTransformation:
    """PyTorch's Adam without weight decay: −lr·m̂/(sqrt(v̂) + eps), bias-corrected moments
    (``optax.scale_by_adam``); ``lr_scales`` as :func:`optimizer`'s. State ``inner_state[0]`` is the
    moments' ``ScaleByAdamState`` (count, mu, nu), each moment a (P,) vector of all the parameters
    (:func:`over_flat_parameters`)."""
    moments = over_flat_parameters(optax.scale_by_adam(b1=beta1, b2=beta2, eps=eps))
    return optimizer([moments], learning_rate, lr_scales=lr_scales)


def with_learning_rate(tree: Any, learning_rate: ArrayLike) -> Any:
    """Return ``tree`` with ``learning_rate`` written into every injected-hyperparameter state.

    ``tree`` may be an optimiser state from :func:`laprop` or any pytree that contains such
    states (e.g. a whole agent state). The value is stored as a () float32 array, so the jitted
    update is not retraced. States without a ``learning_rate`` hyperparameter are left unchanged.
    """

    def is_inject(node: Any) -> bool:
        return isinstance(node, _INJECT_STATES)

    def set_lr(node: Any) -> Any:
        if not is_inject(node) or "learning_rate" not in node.hyperparams:
            return node
        hyperparams = dict(node.hyperparams)
        hyperparams["learning_rate"] = jnp.asarray(learning_rate, jnp.float32)
        return node._replace(hyperparams=hyperparams)

    return jax.tree_util.tree_map(set_lr, tree, is_leaf=is_inject)


def get_learning_rate(opt_state: Any) -> Array:
    """The learning rate stored in the first injected-hyperparameter state found in ``opt_state``."""
    found = [
        node.hyperparams["learning_rate"]
        for node in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda n: isinstance(n, _INJECT_STATES))
        if isinstance(node, _INJECT_STATES) and "learning_rate" in node.hyperparams
    ]
    if not found:
        raise ValueError("no injected learning_rate found in the given state")
    return found[0]


def squared_global_norm(tree: Any) -> Array:
    """() sum of the squares of all leaves, as one reduction over their concatenation (a reduction
    per leaf is one more kernel per leaf to compile)."""
    return jnp.sum(jnp.square(jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)])))


def global_norm(tree: Any) -> Array:
    """() Euclidean norm of all leaves together (``optax.global_norm``, in one reduction)."""
    return jnp.sqrt(squared_global_norm(tree))
