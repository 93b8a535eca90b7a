"""Many seeds in one program: states, batches and outputs with a leading seed axis S.

- :meth:`AgentFunction.over_seeds <sb3_worldmodels.blocks.jit.AgentFunction.over_seeds>` compiles an
  agent function vmapped over S.
- :func:`masked_updates` makes a core's training call for a group of seeds that owe different
  numbers of updates.
- :func:`stack_trees`, :func:`tree_slice`, :func:`unstack_tree` move between S single-seed pytrees
  and one pytree with a leading S.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.jit import AgentFunction, agent_jit, scan_updates

# ------------------------------------------------------------------------------------------------
# Pytrees with a seed axis
# ------------------------------------------------------------------------------------------------


def stack_trees(trees: Sequence[Any]) -> Any:
    """S pytrees of one structure → one pytree whose leaves have a leading S: leaf (...) → (S, ...).

    A leaf is stacked with numpy where all S are numpy arrays or Python numbers (host data, e.g. a
    replay's), else with ``jnp.stack`` (on the device).
    """
    if not trees:
        raise ValueError("stack_trees needs at least one pytree (one per seed), got none.")
    structure: Any = jax.tree_util.tree_structure(trees[0])
    for i, tree in enumerate(trees[1:], 1):
        if jax.tree_util.tree_structure(tree) != structure:
            raise ValueError(
                f"stack_trees: pytree {i} differs in structure from pytree 0; every seed's pytree must "
                f"have the same structure.\n0: {structure}\n{i}: {jax.tree_util.tree_structure(tree)}"
            )

    def stack(path: Any, *leaves: Any) -> Any:
        shapes = {np.shape(leaf) for leaf in leaves}
        if len(shapes) > 1:
            raise ValueError(
                f"stack_trees: leaf {jax.tree_util.keystr(path)} has different shapes over the seeds "
                f"({[np.shape(leaf) for leaf in leaves]}); each seed's leaf must have the same shape."
            )
        if all(isinstance(leaf, (np.ndarray, np.generic, numbers.Number)) for leaf in leaves):
            return np.stack(leaves)
        return jnp.stack(leaves)

    return jax.tree_util.tree_map_with_path(stack, trees[0], *trees[1:])


def tree_slice(tree: Any, index: int) -> Any:
    """One seed of a pytree with a leading S: leaf (S, ...) → (...) at ``index`` (numpy leaves stay
    numpy, jax leaves jax)."""
    return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def seed_count(tree: Any) -> int:
    """S, the leading axis that every leaf of ``tree`` shares."""
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(tree)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "the pytree's leaves must share a leading seed axis; their leading sizes are "
            f"{sorted(map(str, sizes))}."
        )
    return int(sizes.pop())  # type: ignore[arg-type]


def unstack_tree(tree: Any) -> list[Any]:
    """One pytree with a leading S → S pytrees: leaf (S, ...) → S leaves (...), numpy or jax as given."""
    return [tree_slice(tree, i) for i in range(seed_count(tree))]


# ------------------------------------------------------------------------------------------------
# Training calls of a group of seeds
# ------------------------------------------------------------------------------------------------


def masked_updates(train_step: Callable[..., tuple[Any, ...]]) -> AgentFunction:
    """``fn(config, state, batches, active)`` from a core's ``train_step(config, state, batch) ->
    (state, metrics, *extra)``: K updates over the leading K axis of ``batches`` where ``active`` (K,)
    bool is true; an inactive update leaves the state exactly as it was (a select: every leaf, PRNG
    key and counters included), its metrics and extras are computed but meaningless.

    Returns ``(state, metrics, *extra)``, metrics and extras with a leading K as the core's
    ``train_many``; without a loop when K is 1 (:func:`~sb3_worldmodels.blocks.jit.scan_updates`).
    Jitted per config (:func:`~sb3_worldmodels.blocks.jit.agent_jit`): ``.over_seeds(config)`` is the
    training call of a group of seeds that owe different numbers of updates k_s: K = max_s k_s
    batches per seed, ``active`` (S, K) true for the first k_s of each seed's.
    """

    def masked(config: Any, state: Any, batches: Any, active: Any) -> tuple[Any, ...]:
        def body(state: Any, xs: tuple[Any, Any]) -> tuple[Any, tuple[Any, ...]]:
            batch, on = xs
            updated, *outputs = train_step(config, state, batch)
            kept = jax.tree_util.tree_map(lambda new, old: jax.lax.select(on, new, old), updated, state)
            return kept, tuple(outputs)

        state, outputs = scan_updates(body, state, (batches, jnp.asarray(active, bool)))
        return (state, *outputs)

    name = getattr(train_step, "__name__", "train_step")
    masked.__name__ = masked.__qualname__ = f"masked_{name}"  # the program's name
    masked.__doc__ = f"``{name}`` over the leading K of the batches where ``active`` (K,) is true."
    return agent_jit(masked)
