"""A griffe extension for the docs build: Sphinx roles in docstrings as Markdown code.

The package's docstrings are Sphinx-style (``:param x:``, parsed by mkdocstrings' ``sphinx`` style),
and some name objects with roles such as ``:class:`~sb3_worldmodels.envs.wrappers.ActionRepeat```,
which Markdown would show verbatim. This extension rewrites each role into a code span: the last
component when the target starts with ``~`` (Sphinx's meaning), else the whole target.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|obj|exc|const):`(~?)([^`]+)`")


def _code(match: re.Match) -> str:
    target = match[2].replace("\n", "").replace(" ", "")
    return f"`{target.split('.')[-1] if match[1] else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
