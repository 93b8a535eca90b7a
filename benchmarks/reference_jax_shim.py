"""Lets the reference DreamerV3 (danijar/dreamerv3 @ 2411f7d + 29eb964) run on a newer JAX than its
own (0.4.26), without touching its files: imported by ``reference_dreamerv3_worker.py --jax-shim``
before the reference, in the worker's process only.

- ``jax.jit(fun, in_shardings, out_shardings, ...)``: the reference passes the shardings by position
  (``jaxagent.py:338-352@2411f7d``), which JAX 0.7 and later refuse; they are passed on by keyword.
- TensorFlow Probability's JAX substrate (0.25, the first with a ``jax.interpreters.xla`` it can
  import) registers its own numpy variable type in JAX's type tables at import
  (``internal/backend/jax/ops.py``); tables that JAX 0.10 no longer has are given as empty mappings.
  The reference never creates such variables.
- ``jax_threefry_partitionable`` off, JAX 0.4.26's default (JAX 0.5 turned it on): the reference
  draws the same random numbers (its initial parameters, its noise) as under its own JAX.

Tested with JAX 0.10.2 on CPU: the worker builds the "1m" agent (637,514 parameters) and trains.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import jax.core
import jax.interpreters.xla


def _type_tables() -> None:
    for module, name in (
        (jax.interpreters.xla, "pytype_aval_mappings"),
        (jax.interpreters.xla, "canonicalize_dtype_handlers"),
        (jax.core, "pytype_aval_mappings"),
    ):
        if not hasattr(module, name):
            setattr(module, name, collections.defaultdict(lambda: None))


def _jit_with_positional_shardings() -> None:
    jit = jax.jit

    def shim(fun: Any = None, in_shardings: Any = None, out_shardings: Any = None, **kwargs: Any) -> Any:
        if in_shardings is not None:
            kwargs["in_shardings"] = in_shardings
        if out_shardings is not None:
            kwargs["out_shardings"] = out_shardings
        return jit(fun, **kwargs) if fun is not None else jit(**kwargs)

    jax.jit = shim


def apply() -> None:
    jax.config.update("jax_threefry_partitionable", False)
    _type_tables()
    _jit_with_positional_shardings()
