"""Many seeds in one program: states, batches and outputs with a leading seed axis S.

- :meth:`AgentFunction.over_seeds <sb3_worldmodels.blocks.jit.AgentFunction.over_seeds>` compiles an
  agent function vmapped over S.
- :func:`stack_trees`, :func:`tree_slice`, :func:`unstack_tree` move between S single-seed pytrees
  and one pytree with a leading S.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
