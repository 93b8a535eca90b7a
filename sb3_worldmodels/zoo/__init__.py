"""rl_zoo3 integration: ``--algo tdmpc2`` and ``--algo dreamerv3`` with their own hyperparameter
files and Optuna samplers.

Two ways in (docs/zoo.md):

- the plain ``rl_zoo3 train --algo tdmpc2 ...``: the installed ``sb3_worldmodels_zoo.pth`` hook
  calls :func:`register_module` as rl_zoo3's modules load (switch: ``SB3_WORLDMODELS_ZOO_HOOK=0``);
- ``sb3wm-zoo train --algo tdmpc2 ...`` / ``python -m sb3_worldmodels.zoo ...``: :func:`main`
  registers explicitly, then runs rl_zoo3's own command line. No hook involved.

Registration adds keys (``ALGOS``, ``HYPERPARAMS_SAMPLER``, ``HYPERPARAMS_CONVERTER``), makes
``ExperimentManager`` read ``hyperparams/<algo>.yml`` from this package when no ``--conf-file`` is
given for one of our algorithms, and teaches the zoo seed groups (:mod:`sb3_worldmodels.zoo.seeds`:
``n_seeds`` in train and ``-optimize``, ``enjoy`` of one seed of a group) and shared studies
(:mod:`sb3_worldmodels.zoo.sweeps`: a dead worker's trial failed by its heartbeat). It is idempotent and
refuses (with a warning) an rl_zoo3 outside the tested range or one whose patched names are missing.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
TESTED_RL_ZOO3 = ((2, 8), (3, 0))
"""rl_zoo3 versions [low, high) whose ``ALGOS``, samplers and ``ExperimentManager`` are patched."""

_PATCHED_MARK = "_sb3_worldmodels_patched"


def algorithms() -> dict[str, type]:
    """The zoo keys of this package's algorithms."""
    from sb3_worldmodels import TDMPC2, DreamerV3

    return {"tdmpc2": TDMPC2, "dreamerv3": DreamerV3}


def supported_zoo_version() -> str | None:
    """The installed rl_zoo3 version when it is in :data:`TESTED_RL_ZOO3`, else None."""
    try:
        installed = version("rl_zoo3")
    except PackageNotFoundError:
        return None
    parts = tuple(int(p) for p in installed.split(".")[:2] if p.isdigit())
    low, high = TESTED_RL_ZOO3
    return installed if low <= parts < high else None


def _warn(message: str) -> None:
    warnings.warn(f"sb3_worldmodels did not register with rl_zoo3: {message}", RuntimeWarning, stacklevel=3)


def _add_keys(table: Any, entries: dict[str, Any], table_name: str) -> None:
    """Add new keys only; a key another package already owns is left to it, with a warning."""
    for key, value in entries.items():
        present = table.get(key)
        if present is None:
            table[key] = value
        elif present is not value and getattr(present, "__module__", "").split(".")[0] != "sb3_worldmodels":
            _warn(f"{table_name}[{key!r}] already belongs to {present!r}; it is kept.")


def _register_algos(utils: ModuleType) -> None:
    _add_keys(utils.ALGOS, algorithms(), "ALGOS")


def _register_samplers(hyperparams_opt: ModuleType) -> None:
    from sb3_worldmodels.zoo import samplers

    _add_keys(hyperparams_opt.HYPERPARAMS_SAMPLER, samplers.SAMPLERS, "HYPERPARAMS_SAMPLER")
    _add_keys(hyperparams_opt.HYPERPARAMS_CONVERTER, samplers.CONVERTERS, "HYPERPARAMS_CONVERTER")


def _patch_experiment_manager(exp_manager: ModuleType) -> None:
    manager = exp_manager.ExperimentManager
    if getattr(manager.__init__, _PATCHED_MARK, False):
        return
    original = manager.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        given = signature.bind(self, *args, **kwargs).arguments.get("config")
        if given is None and self.algo in algorithms():
            self.config = str(HYPERPARAMS_DIR / f"{self.algo}.yml")

    setattr(__init__, _PATCHED_MARK, True)
    manager.__init__ = __init__
    _patch_seed_groups(exp_manager)
    _patch_sweeps(exp_manager)


def _patch_seed_groups(exp_manager: ModuleType) -> None:
    """``n_seeds`` / ``seeds`` hyperparameters (:mod:`sb3_worldmodels.zoo.seeds`), where this rl_zoo3
    has every name they patch."""
    import importlib

    from sb3_worldmodels.zoo import seeds

    missing = seeds.missing_names(exp_manager)
    if missing:
        warnings.warn(
            f"sb3_worldmodels: seed groups (n_seeds) are not available with this rl_zoo3: "
            f"rl_zoo3.exp_manager lacks {', '.join(missing)}.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    seeds.patch_experiment_manager(exp_manager, importlib.import_module("rl_zoo3.utils"), algorithms())


def _patch_sweeps(exp_manager: ModuleType) -> None:
    """Shared studies (:mod:`sb3_worldmodels.zoo.sweeps`: the heartbeat of ``SB3WM_OPTUNA_HEARTBEAT``,
    the ``worker`` attribute), where this rl_zoo3 has every name they patch."""
    from sb3_worldmodels.zoo import sweeps

    missing = sweeps.missing_names(exp_manager)
    if missing:
        warnings.warn(
            f"sb3_worldmodels: trial heartbeats ({sweeps.HEARTBEAT_VARIABLE}) are not available with this "
            f"rl_zoo3: rl_zoo3.exp_manager lacks {', '.join(missing)}.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    sweeps.patch_experiment_manager(exp_manager)


def _patch_enjoy(enjoy: ModuleType) -> None:
    import importlib

    from sb3_worldmodels.zoo import seeds

    seeds.patch_enjoy(enjoy, importlib.import_module("rl_zoo3.utils"), algorithms())


_REGISTRARS = {
    "rl_zoo3.utils": ("ALGOS", _register_algos),
    "rl_zoo3.hyperparams_opt": ("HYPERPARAMS_SAMPLER", _register_samplers),
    "rl_zoo3.exp_manager": ("ExperimentManager", _patch_experiment_manager),
    "rl_zoo3.enjoy": ("ALGOS", _patch_enjoy),
}


def register_module(module: ModuleType) -> bool:
    """Add this package's entries to one freshly loaded rl_zoo3 module; True when done."""
    name = module.__name__
    if name not in _REGISTRARS:
        return False
    attribute, registrar = _REGISTRARS[name]
    if supported_zoo_version() is None:
        low, high = TESTED_RL_ZOO3
        _warn(f"rl_zoo3 {version('rl_zoo3')} is outside the tested range [{low}, {high}).")
        return False
    if not hasattr(module, attribute):
        _warn(f"{name}.{attribute} does not exist in this rl_zoo3.")
        return False
    registrar(module)
    return True


def register() -> bool:
    """Register with every patched rl_zoo3 module (imports rl_zoo3); True when all succeeded."""
    import importlib

    return all([register_module(importlib.import_module(name)) for name in _REGISTRARS])


def main(argv: list[str] | None = None) -> None:
    """``sb3wm-zoo <train|enjoy|...> ...``: rl_zoo3's command line with our algorithms registered.

    ``sb3wm-zoo enjoy ... --seed-index i`` plays the ``i``-th seed of a seed group's file (the zoo's
    own ``enjoy`` has no such option and refuses a group)."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    if not register():
        raise SystemExit("sb3_worldmodels could not register with this rl_zoo3 (see the warning above).")
    if sys.argv[1:2] == ["enjoy"]:
        _take_seed_index()
    from rl_zoo3.cli import main as zoo_main

    zoo_main()


def _take_seed_index() -> None:
    """Remove ``--seed-index i`` from ``sys.argv`` (rl_zoo3's parser refuses it) and hand it to enjoy."""
    import argparse

    from sb3_worldmodels.zoo.seeds import EnjoyLoader

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # --seed stays the zoo's
    parser.add_argument("--seed-index", type=int, default=None)
    known, rest = parser.parse_known_args(sys.argv[2:])
    if known.seed_index is not None and known.seed_index < 0:
        raise SystemExit(f"--seed-index must be >= 0, got {known.seed_index}.")
    EnjoyLoader.seed_index = known.seed_index
    sys.argv = sys.argv[:2] + rest
