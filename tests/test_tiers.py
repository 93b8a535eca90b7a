"""The second tier's table names tests that exist: a renamed test must not slip into the default run."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import EXTENDED_FILES, EXTENDED_TESTS

TESTS = Path(__file__).parent


def _functions(file: str) -> set[str]:
    tree = ast.parse((TESTS / file).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_extended_file_exists() -> None:
    missing = [file for file in EXTENDED_FILES if not (TESTS / file).is_file()]
    assert not missing, f"tests/conftest.py EXTENDED_FILES names files that do not exist: {missing}"


def test_every_extended_test_exists() -> None:
    missing = []
    for entry in EXTENDED_TESTS:
        file, function = entry.split("::")
        if not (TESTS / file).is_file() or function not in _functions(file):
            missing.append(entry)
    assert not missing, f"tests/conftest.py EXTENDED_TESTS names tests that do not exist: {missing}"
