"""Weights of the reference DreamerV3 (danijar/dreamerv3) in our parameter tree.

The reference names its variables ``agent/<module>/<layer>/{kernel,bias}`` and
``agent/<module>/<layer>/norm/scale`` (the keys of its checkpoint's ``"agent"`` entry and of the
recorded fixtures). They map onto :func:`~sb3_worldmodels.dreamerv3.agent.init_params`' trees with
three renamings and one cut:

- the distribution heads' ``dist/out`` is our ``out``;
- the decoder's ``out_<key>/out`` is our ``out_<key>`` for a Dict observation, and our ``out_vector``
  for a flat one (named "vector" in the recorded fixtures and "image" by the reference's gym wrapper);
- the actor's ``action/{out,std}`` is our ``{out,std}``;
- the reward and critic output layers have 256 logits, the last of which the reference never reads;
  ours have ``config.bins`` (255).

Used by the parity tests (recorded parameters) and to run a reference checkpoint with our agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.dreamerv3 import agent as A
from sb3_worldmodels.dreamerv3.config import DreamerV3Config

REF_BINS = 256
"""The reference's reward/critic output width; its last logit is dropped, ours has ``config.bins``."""


def ref_to_path(name: str, keyed_decoder: bool = False) -> tuple[str, tuple[str, ...]] | None:
    """Reference state name → ("params" | "slow_critic", path in that tree); None for non-parameters.

    ``keyed_decoder``: the config has ``obs_keys`` (a Dict observation), so decoder outputs keep their
    key; otherwise the one decoder output is ``out_vector`` whatever the reference called it.

    Raises KeyError for any name this mapping does not know, so that nothing is silently ignored.
    """
    parts = name.split("/")
    if parts[0] != "agent" or len(parts) < 3:
        raise KeyError(f"unmapped reference name {name!r}")
    module, rest = parts[1], parts[2:]
    if module in ("opt", "retnorm", "updater"):
        return None
    if module not in ("enc", "dyn", "dec", "rew", "con", "actor", "critic", "slowcritic"):
        raise KeyError(f"unmapped reference module in {name!r}")
    if rest[:2] == ["dist", "out"] and module in ("rew", "con", "critic", "slowcritic"):
        rest = ["out", *rest[2:]]
    elif len(rest) > 1 and rest[0].startswith("out_") and rest[1] == "out" and module == "dec":
        rest = [rest[0] if keyed_decoder else "out_vector", *rest[2:]]
    elif rest[:1] == ["action"] and module == "actor" and rest[1:2] in (["out"], ["std"]):
        rest = rest[1:]
    leaf_ok = (
        (len(rest) == 2 and rest[1] in ("kernel", "bias"))
        or (len(rest) == 3 and rest[1:] == ["norm", "scale"])
        or (module == "dec" and rest == ["spacenorm", "scale"])  # the image decoder's plain norm
    )
    if not leaf_ok or rest[0] in ("dist", "action"):
        raise KeyError(f"unmapped reference name {name!r}")
    if module == "slowcritic":
        return "slow_critic", tuple(rest)
    return "params", (module, *rest)


def path_to_ref(path: tuple[str, ...]) -> str:
    """Our params path (module, ...) → the reference's state name."""
    module, *rest = path
    if module in ("rew", "con", "critic") and rest[0] == "out":
        rest = ["dist", "out", *rest[1:]]
    elif module == "dec" and rest[0].startswith("out_"):
        rest = [rest[0], "out", *rest[1:]]
    elif module == "actor" and rest[0] in ("out", "std"):
        rest = ["action", *rest]
    return "/".join(["agent", module, *rest])


def to_ours(value: np.ndarray, path: tuple[str, ...], config: DreamerV3Config) -> np.ndarray:
    """Drop the reference's padding logit (256th bin) of reward/critic output layers."""
    if path[-2:-1] == ("out",) and path[0] in ("rew", "critic", "slowcritic"):
        if value.shape[-1] != REF_BINS:
            raise ValueError(f"{path}: expected {REF_BINS} reference logits, got shape {value.shape}")
        return value[..., : config.bins]
    return value


def flatten_tree(tree: Any) -> dict[tuple[str, ...], Any]:
    """A nested dict of arrays → {path: array} (shape structs kept as they are)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        tuple(str(k.key) for k in path): leaf if isinstance(leaf, jax.ShapeDtypeStruct) else np.asarray(leaf)
        for path, leaf in leaves
    }


def unflatten(flat: Mapping[tuple[str, ...], Any]) -> dict:
    """{path: array} → a nested dict of jax arrays."""
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = jnp.asarray(value)
    return tree


def params_from_reference(flat: Mapping[str, Any], config: DreamerV3Config) -> tuple[dict, dict]:
    """Reference variables {name: array} → our (params, slow critic), checked against our init's
    structure and shapes (a mismatch names what is missing or unexpected)."""
    out: dict[str, dict] = {"params": {}, "slow_critic": {}}
    for name, value in flat.items():
        where = ref_to_path(name, keyed_decoder=bool(config.obs_keys))
        if where is None:
            continue
        tree, path = where
        key = ("slowcritic", *path) if tree == "slow_critic" else path
        out[tree][path] = to_ours(np.asarray(value, np.float32), key, config)
    ours, ours_slow = jax.eval_shape(lambda key: A.init_params(config, key), jax.random.PRNGKey(0))
    for tree, template in (("params", ours), ("slow_critic", ours_slow)):
        want = {p: v.shape for p, v in flatten_tree(template).items()}
        got = {p: v.shape for p, v in out[tree].items()}
        if got != want:
            wrong = {p for p in set(got) & set(want) if got[p] != want[p]}
            raise ValueError(
                f"{tree}: missing {sorted(set(want) - set(got))}, unexpected {sorted(set(got) - set(want))}, "
                f"wrong shapes {sorted(wrong)}: the reference's configuration differs from this config"
            )
    return unflatten(out["params"]), unflatten(out["slow_critic"])
