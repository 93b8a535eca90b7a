"""Compute dtypes: the float type the networks compute in, parameters staying float32.

A config's ``compute_dtype`` is one of :data:`COMPUTE_DTYPES`. With "bfloat16" every layer casts its
input and its float32 parameters to bfloat16 at use and computes its matmul or convolution, norm and
activation there (:mod:`~sb3_worldmodels.blocks.layers`); the layers whose outputs parameterise a
distribution return float32, and the losses, normalisers, returns and optimiser run in float32, as
DreamerV3's ``jax.compute_dtype: bfloat16`` with float32 parameters (configs.yaml:24-25@2411f7d,
nets.py:437,443,594-701@2411f7d). Gradients reach the float32 parameters through the casts, so they
are float32 too. With "float32" every cast is the identity and the programs are those of a float32
agent. "auto" is resolved by the agent when its config is built (:func:`resolve_compute_dtype`): its
accelerator choice on a GPU or TPU, float32 on the CPU.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["COMPUTE_DTYPES", "check_compute_dtype", "compute_dtype", "resolve_compute_dtype"]

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
"""Values of the configs' ``compute_dtype``."""


def check_compute_dtype(value: Any) -> str:
    """``value`` if it is one of :data:`COMPUTE_DTYPES`, else a ValueError naming the choices."""
    if not isinstance(value, str) or value not in COMPUTE_DTYPES:
        raise ValueError(
            f'compute_dtype must be one of {COMPUTE_DTYPES}, got {value!r}: "float32" computes in '
            'full precision, "bfloat16" computes the networks in bfloat16 with float32 parameters, '
            '"auto" picks the agent\'s default for the backend.'
        )
    return value


def resolve_compute_dtype(value: str, accelerator: str) -> str:
    """The concrete dtype name of a ``compute_dtype`` setting: ``value`` itself, or for "auto"
    ``accelerator`` (the agent's choice on a GPU or TPU) where JAX's default backend is not the CPU
    and "float32" on the CPU."""
    check_compute_dtype(value)
    if value != "auto":
        return value
    return "float32" if jax.default_backend() == "cpu" else check_compute_dtype(accelerator)


def compute_dtype(value: str, accelerator: str) -> Any:
    """The jnp dtype of a ``compute_dtype`` setting (:func:`resolve_compute_dtype`)."""
    return jnp.dtype(resolve_compute_dtype(value, accelerator))
