"""Lets the plain ``rl_zoo3`` command accept ``--algo tdmpc2`` and ``--algo dreamerv3``.

rl_zoo3 has no plugin mechanism: its algorithm table ``rl_zoo3.utils.ALGOS`` is read when its
argument parser is built. This module is imported at interpreter start by the one-line
``sb3_worldmodels_zoo.pth`` that the package installs. It imports only the standard library and
puts a finder on ``sys.meta_path`` that does nothing until one of rl_zoo3's modules below finishes
executing; then :func:`sb3_worldmodels.zoo.register_module` adds this package's entries to that
module (new keys only). A Python process that never imports rl_zoo3 never imports
``sb3_worldmodels`` or JAX because of it.

Switch it off with the environment variable ``SB3_WORLDMODELS_ZOO_HOOK=0``; the explicit entry
point ``sb3wm-zoo`` (or ``python -m sb3_worldmodels.zoo``) works without it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import warnings
from typing import Any

SWITCH = "SB3_WORLDMODELS_ZOO_HOOK"
WATCHED = ("rl_zoo3.utils", "rl_zoo3.hyperparams_opt", "rl_zoo3.exp_manager", "rl_zoo3.enjoy")


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


class _RegisterAfterExec(importlib.abc.Loader):
    """Wraps a watched module's loader: run it, then register this package's entries."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            from sb3_worldmodels.zoo import register_module

            register_module(module)
        except Exception as error:  # the zoo must keep working for its own algorithms
            warnings.warn(
                f"sb3_worldmodels could not register with {self._name} ({error!r}); "
                f"use `sb3wm-zoo` instead, or set {SWITCH}=0 to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )

    def __getattr__(self, attribute: str) -> Any:  # get_source, get_filename, ... for tracebacks
        return getattr(self._loader, attribute)


class _ZooFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisterAfterExec(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once; nothing when switched off)."""
    if enabled() and not any(isinstance(f, _ZooFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ZooFinder())


install()
