"""Every break of ``tools/break_one_term.py`` still finds its text, once, in today's source (a pattern
that no longer matches would report an error instead of a test result)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import break_one_term  # noqa: E402


@pytest.mark.parametrize("brk", break_one_term.BREAKS, ids=lambda b: f"{b.agent}-{b.name}")
def test_the_text_to_break_occurs_once(brk):
    assert (ROOT / brk.path).read_text().count(brk.old) == 1
