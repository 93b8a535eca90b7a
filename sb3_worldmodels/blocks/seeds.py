"""Many seeds in one program: states, batches and outputs with a leading seed axis S.

- :meth:`AgentFunction.over_seeds <sb3_worldmodels.blocks.jit.AgentFunction.over_seeds>` compiles an
  agent function vmapped over S.
- :func:`counted_updates` makes a core's training call of a fixed size K that runs any number of
  its updates: one program for a whole run, and for a group of seeds that owe different numbers.
- :func:`stack_trees`, :func:`tree_slice`, :func:`unstack_tree` move between S single-seed pytrees
  and one pytree with a leading S.
- :func:`with_settings` gives float settings one value per seed (a random search in one program).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.jit import SEED_AXIS, AgentFunction, agent_jit, over_seed_axis, scan_updates

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


def counted_updates(train_step: Callable[..., tuple[Any, ...]]) -> AgentFunction:
    """``fn(config, state, batches, count)`` from a core's ``train_step(config, state, batch) ->
    (state, metrics, *extra)``: the first ``count`` of the K updates over the leading K axis of
    ``batches`` (K from their shapes, ``count`` a traced () int: any count in [0, K] runs the same
    program); the state is exactly the state after ``count`` updates. ``count`` None runs all K (the
    core's ``train_many``: a scan).

    One program for every count is what a run needs: a training call whose size follows the
    schedule (k updates owed now, fewer at the end) would compile a program for each new k, seconds
    on a CPU and tens of seconds on an accelerator, whenever the schedule first asks for it.

    A loop whose trip count is ``count`` (``jax.lax.while_loop``, reading update i's batch by a dynamic
    slice); for one seed the updates past ``count`` are not run (their batches never read, their
    metrics and extras zeros). ``.over_seeds(config)`` is the training call of a group of seeds that
    owe different numbers of updates k_s: K batches per seed, ``count`` (S,) = k_s; the loop runs
    max_s k_s times (the maximum taken over the seed axis, so that the loop index stays one for all
    seeds: slices, not gathers) and a seed past its own count keeps its state (a select: every leaf,
    PRNG key and counters included), its metrics and extras there meaningless. Without a loop when K
    is 1 (:func:`~sb3_worldmodels.blocks.jit.scan_updates`: the update run and kept where ``count``
    is 1). Jitted per config (:func:`~sb3_worldmodels.blocks.jit.agent_jit`).

    Returns ``(state, metrics, *extra)``, metrics and extras with a leading K as the core's
    ``train_many``.
    """

    def counted(config: Any, state: Any, batches: Any, count: Any = None) -> tuple[Any, ...]:
        def step(state: Any, batch: Any) -> tuple[Any, tuple[Any, ...]]:
            updated, *outputs = train_step(config, state, batch)
            return updated, tuple(outputs)

        def keep(on: Any, new: Any, old: Any) -> Any:
            return jax.tree_util.tree_map(lambda n, o: jax.lax.select(on, n, o), new, old)

        if count is None:
            state, outputs = scan_updates(step, state, batches)
            return (state, *outputs)
        k = jax.tree_util.tree_leaves(batches)[0].shape[0]
        count = jnp.minimum(jnp.asarray(count, jnp.int32), k)
        first = jax.tree_util.tree_map(lambda leaf: leaf[0], batches)
        if k == 1:
            updated, outputs = step(state, first)
            expanded = jax.tree_util.tree_map(lambda leaf: jnp.expand_dims(leaf, 0), outputs)
            return (keep(count > 0, updated, state), *expanded)
        seeds = over_seed_axis()
        trips = jax.lax.pmax(count, SEED_AXIS) if seeds else count
        shapes = jax.eval_shape(step, state, first)[1]
        buffers = jax.tree_util.tree_map(lambda s: jnp.zeros((k, *s.shape), s.dtype), shapes)

        def body(carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
            i, state, stored = carry
            batch = jax.tree_util.tree_map(
                lambda leaf: jax.lax.dynamic_index_in_dim(leaf, i, keepdims=False), batches
            )
            updated, outputs = step(state, batch)
            stored = jax.tree_util.tree_map(
                lambda buffer, out: jax.lax.dynamic_update_index_in_dim(buffer, out, i, 0), stored, outputs
            )
            return i + 1, keep(i < count, updated, state) if seeds else updated, stored

        _, state, outputs = jax.lax.while_loop(
            lambda carry: carry[0] < trips, body, (jnp.asarray(0, jnp.int32), state, buffers)
        )
        return (state, *outputs)

    name = getattr(train_step, "__name__", "train_step")
    counted.__name__ = counted.__qualname__ = f"counted_{name}"  # the program's name
    counted.__doc__ = f"The first ``count`` of K ``{name}`` calls over the leading K of the batches."
    return agent_jit(counted)


# ------------------------------------------------------------------------------------------------
# Float settings per seed
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SeedSettings:
    """A config and one value per seed of some of its float fields (:func:`with_settings`); a
    :class:`~sb3_worldmodels.blocks.jit.PerSeedConfig` for
    :meth:`~sb3_worldmodels.blocks.jit.AgentFunction.over_seeds`."""

    config: Any
    """The config of every other field (its own values of the per-seed fields are not used)."""
    values: tuple[tuple[str, tuple[float, ...]], ...]
    """(field, S values) of each per-seed field, in the order given."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.values)

    @property
    def n_seeds(self) -> int:
        return len(self.values[0][1])

    def seed_config(self, index: int) -> Any:
        """Seed ``index``'s config, concrete (``dataclasses.replace``): what a single-seed run of that
        seed uses."""
        return dataclasses.replace(self.config, **{name: vals[index] for name, vals in self.values})

    @property
    def program_key(self) -> Hashable:
        return ("per-seed settings", self.config, self.names)

    def seed_values(self) -> dict[str, Any]:
        return {name: np.asarray(vals, np.float32) for name, vals in self.values}

    def traced_config(self, values: dict[str, Any]) -> Any:
        """The config with ``values`` (traced, one seed's) in the per-seed fields, built without the
        config's ``__init__``/``__post_init__`` (validation happened on the concrete values)."""
        traced: Any = object.__new__(_traced_class(type(self.config)))
        for field in dataclasses.fields(self.config):
            object.__setattr__(traced, field.name, values.get(field.name, getattr(self.config, field.name)))
        object.__setattr__(traced, "_per_seed_key", self.program_key)
        return traced


_TRACED_CLASSES: dict[type, type] = {}


def _traced_class(cls: type) -> type:
    """A subclass of the config class whose instances hash and compare by the settings' program key,
    not by their (traced, unhashable) values: the cores' per-config caches (``make_networks``, ...)
    take it, and keep it apart from the plain config."""
    if cls not in _TRACED_CLASSES:

        def __hash__(self: Any) -> int:
            return hash(self._per_seed_key)

        def __eq__(self: Any, other: Any) -> bool:
            return type(other) is type(self) and other._per_seed_key == self._per_seed_key

        namespace = {"__hash__": __hash__, "__eq__": __eq__, "__module__": __name__}
        _TRACED_CLASSES[cls] = type(f"PerSeed{cls.__name__}", (cls,), namespace)
    return _TRACED_CLASSES[cls]


NOT_FLOAT_REASONS = {
    "bool": "a switch: it selects which program is built, one for all seeds",
    "int": "an integer: counts and sizes set the compiled shapes and loops, one for all seeds",
    "other": "not a number: it selects the program's structure, one for all seeds",
}


def with_settings(
    config: Any,
    settings: Mapping[str, Sequence[float]],
    refused: Mapping[str, str] | None = None,
    validate: Callable[[Any], object] | None = None,
) -> SeedSettings:
    """``config`` with the float fields named in ``settings`` given one value per seed: {field: S
    values}, every list as long (S). Inside :meth:`~sb3_worldmodels.blocks.jit.AgentFunction.over_seeds`
    each seed's config holds its values, traced (one program for any values).

    Refused with a ValueError naming the field and the reason: a name that is no field of the
    config; a field that is not a float (int, bool, tuple, str: they set shapes or the program's
    structure); a field of ``refused`` ({field: reason}, the agent's own list of float fields that
    cannot be traced, e.g. read in Python control flow or outside the compiled functions). Each seed's
    concrete config (:meth:`SeedSettings.seed_config`) is checked by ``validate`` (the agent's config
    check), so a bad value is reported with its seed.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"with_settings takes a dataclass config, got {type(config).__name__}.")
    if not settings:
        raise ValueError("with_settings: give at least one field with one value per seed.")
    fields = {field.name: field for field in dataclasses.fields(config)}
    kind = type(config).__name__
    values = []
    for name, given in settings.items():
        if name not in fields:
            raise ValueError(f"{name!r} is not a field of {kind}; per-seed settings name config fields.")
        reason = _refusal(getattr(config, name), fields[name], (refused or {}).get(name))
        if reason:
            raise ValueError(f"{kind}.{name} cannot take one value per seed: {reason}.")
        values.append((name, _float_values(kind, name, given)))
    lengths = {name: len(vals) for name, vals in values}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"per-seed settings must all have one value per seed (as many each), got {lengths}.")
    seeded = SeedSettings(config, tuple(values))
    for index in range(seeded.n_seeds):
        seed_config = seeded.seed_config(index)
        if validate is not None:
            try:
                validate(seed_config)
            except ValueError as error:
                raise ValueError(f"per-seed settings, seed index {index}: {error}") from error
    return seeded


def _refusal(value: Any, field: dataclasses.Field, refused_reason: str | None) -> str | None:
    if refused_reason:
        return refused_reason
    annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    if annotation == "float" and isinstance(value, (float, int)) and not isinstance(value, bool):
        return None
    if annotation == "bool" or isinstance(value, bool):
        return NOT_FLOAT_REASONS["bool"]
    if annotation == "int":
        return NOT_FLOAT_REASONS["int"]
    return NOT_FLOAT_REASONS["other"]


def _float_values(kind: str, name: str, given: Any) -> tuple[float, ...]:
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence | np.ndarray) or not len(given):
        raise ValueError(f"{kind}.{name}: give a list of one value per seed, got {given!r}.")
    out = []
    for value in list(given):
        real = isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, bool)
        if not real or not math.isfinite(float(value)):
            raise ValueError(f"{kind}.{name}: every per-seed value must be a finite number, got {value!r}.")
        out.append(float(value))
    return tuple(out)
