"""Test files in order of their recorded time, slowest first, so that two workers end together.

pytest-xdist's ``--dist loadfile`` hands each worker whole files in the order of the collection (and
by default it first sorts them by their number of tests, so that a file of one slow test came last
and kept one worker busy while the other waited). Here the files come by the time their selected
tests took when last recorded (``tests/test_durations.json``: seconds per test id, setup, call and
teardown together), slowest first; files without a record come last, in collection order. A stale
record changes only the order, never which tests run.

Record the times again after a change that moves them (a run of each tier):

    python -m pytest -q --store-durations && python -m pytest -q -m extended --store-durations
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("test_durations.json")
_SPENT: defaultdict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write the tests' times into {RECORD.name} (merged with its other tests' times)",
    )


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    recorded: dict[str, float] = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    file_time: defaultdict[str, float] = defaultdict(float)
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(_file(item), len(first_seen))
        file_time[_file(item)] += recorded.get(item.nodeid, 0.0)
    items.sort(key=lambda item: (-file_time[_file(item)], first_seen[_file(item)]))


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SPENT[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("store_durations") or not _SPENT:
        return  # the controller (or a run without workers) writes the record once
    recorded = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    recorded.update({test: round(seconds, 1) for test, seconds in _SPENT.items()})
    RECORD.write_text(json.dumps(dict(sorted(recorded.items())), indent=0) + "\n")
