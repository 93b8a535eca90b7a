"""One run over several processes (hosts): ``jax.distributed`` started from the environment, and the
small host-side agreements a data-parallel run needs to keep its processes in step.

- :func:`initialize` starts JAX's multi-process runtime from the standard variables:
  ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID``; in a Kubernetes indexed Job the process id is the pod's
  ``JOB_COMPLETION_INDEX``; under SLURM (``srun``) JAX reads all three from SLURM's variables. On a
  CPU the collectives go through gloo.
- :func:`agree` gathers a few integers from every process (one small all-gather), from which each
  process takes the same decision.
- :func:`refuse_different_settings` raises when the processes did not build the same model.
- :func:`shard_path` names the file of one process's part (its replay) of a run's files.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import numpy as np

COORDINATOR_VARIABLE = "JAX_COORDINATOR_ADDRESS"
"""``host:port`` of process 0's coordinator (JAX's own variable)."""
COUNT_VARIABLE = "JAX_NUM_PROCESSES"
"""The number of processes of the run."""
INDEX_VARIABLE = "JAX_PROCESS_ID"
"""This process's index, 0 .. count - 1."""
KUBERNETES_INDEX_VARIABLE = "JOB_COMPLETION_INDEX"
"""The pod's index in a Kubernetes indexed Job: the process index when ``JAX_PROCESS_ID`` is not set."""


def _integer(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer.") from None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    timeout: int = 300,
) -> tuple[int, int]:
    """Start ``jax.distributed`` (before any other JAX call of the process) and return
    ``(process_index, process_count)``. Arguments not given are read from the environment
    (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` or a Kubernetes indexed
    Job's ``JOB_COMPLETION_INDEX``); what is still missing JAX detects itself (SLURM, Open MPI, Cloud
    TPU). Every process waits up to ``timeout`` seconds for the others. A second call returns the
    running state."""
    if jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count()
    env = os.environ
    if num_processes is None and env.get(COUNT_VARIABLE):
        num_processes = _integer(COUNT_VARIABLE, env[COUNT_VARIABLE])
    if process_id is None:
        for name in (INDEX_VARIABLE, KUBERNETES_INDEX_VARIABLE):
            if env.get(name):
                process_id = _integer(name, env[name])
                break
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # collectives between CPU hosts
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=timeout,
        )
    except ValueError as error:
        if "should be defined" not in str(error) and "must be defined" not in str(error):
            raise
        raise ValueError(
            f"jax.distributed needs the coordinator's address, the process count and this process's index "
            f"({error}): set {COORDINATOR_VARIABLE} (host:port of process 0), {COUNT_VARIABLE} and "
            f"{INDEX_VARIABLE} (or run under SLURM's srun, or in a Kubernetes indexed Job with "
            f"{COORDINATOR_VARIABLE} and {COUNT_VARIABLE} set)."
        ) from error
    return jax.process_index(), jax.process_count()


def agree(values: Sequence[int]) -> np.ndarray:
    """(P, n) int32: the ``values`` of every process, in process order (one all-gather over the
    processes; every process must call it at the same point). One process: ``values`` as (1, n)."""
    mine = np.asarray(values, np.int32)
    if jax.process_count() == 1:
        return mine[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), len(mine))


def _digest(value: object) -> int:
    """A 31-bit digest of ``repr(value)`` (the same in every process for equal values)."""
    return zlib.crc32(repr(value).encode()) & 0x7FFFFFFF


def refuse_different_settings(settings: Mapping[str, object], what: str) -> None:
    """Raise ValueError when any process's ``settings`` (name -> value; compared by ``repr``) differ
    from process 0's, naming them (``what``: what the processes should have built alike)."""
    if jax.process_count() == 1:
        return
    gathered = agree([_digest(value) for value in settings.values()])
    differing = {}
    for j, name in enumerate(settings):
        processes = [p for p in range(len(gathered)) if gathered[p, j] != gathered[0, j]]
        if processes:
            differing[name] = processes
    if differing:
        shown = "; ".join(f"{name} (processes {processes})" for name, processes in differing.items())
        raise ValueError(
            f"The processes of this jax.distributed run built different {what}: {shown} differ from "
            "process 0's. Every process must build the same model (the same seed, hyperparameters, env "
            "and n_envs); each steps its own envs."
        )


def shard_path(path: str | os.PathLike[str], index: int, count: int, suffix: str = ".pkl") -> Path:
    """The file of process ``index`` of ``count`` for a run's file ``path``:
    ``replay.pkl`` -> ``replay.process-1-of-2.pkl`` (``suffix`` when ``path`` has none). One process:
    ``path`` itself."""
    target = Path(path)
    if count == 1:
        return target
    own = target.suffix or suffix
    stem = target.name[: -len(target.suffix)] if target.suffix else target.name
    return target.with_name(f"{stem}.process-{index}-of-{count}{own}")


def shard_paths_of(path: str | os.PathLike[str], suffix: str = ".pkl") -> list[Path]:
    """The per-process files written for ``path`` by runs of several processes (sorted)."""
    target = Path(path)
    own = target.suffix or suffix
    stem = target.name[: -len(target.suffix)] if target.suffix else target.name
    return sorted(target.parent.glob(f"{stem}.process-*-of-*{own}"))
