"""Range checks of configuration fields, with errors that name the field, the value and the range."""

from __future__ import annotations

import math
from typing import Any

INT_AT_LEAST_1 = (1, None, "an integer >= 1")
POSITIVE = (0.0, None, "a positive number")
NON_NEGATIVE = (0.0, None, "a number >= 0")
UNIT_OPEN = (0.0, 1.0, "a number in (0, 1)")
UNIT_HALF_OPEN = (0.0, 1.0, "a number in (0, 1]")
PROBABILITY_BELOW_1 = (0.0, 1.0, "a number in [0, 1)")


def check_fields(config: Any, rules: dict[str, tuple], agent: str) -> None:
    """Raise ValueError for the first field of ``config`` outside its rule's range.

    ``rules`` maps a field name to one of this module's rules (INT_AT_LEAST_1, POSITIVE, ...).
    """
    for name, rule in rules.items():
        value = getattr(config, name)
        if not _ok(value, rule):
            raise ValueError(f"{agent}: {name}={value!r} is invalid; it must be {rule[2]}.")


def _ok(value: Any, rule: tuple) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if rule is INT_AT_LEAST_1:
        return isinstance(value, int) and value >= 1
    if not math.isfinite(value):
        return False
    if rule is POSITIVE:
        return value > 0
    if rule is NON_NEGATIVE:
        return value >= 0
    if rule is UNIT_OPEN:
        return 0 < value < 1
    if rule is UNIT_HALF_OPEN:
        return 0 < value <= 1
    if rule is PROBABILITY_BELOW_1:
        return 0 <= value < 1
    raise ValueError(f"unknown rule {rule!r}")
