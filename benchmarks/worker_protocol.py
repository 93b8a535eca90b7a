"""The line protocol of the reference-code workers (``reference_*_worker.py``), run in the
reference's own Python: one command per line on stdin, one JSON line per answer on stdout.

A command named in ``actions`` runs and answers ``{command: seconds}``; ``peak_rss_mb`` answers the
process's peak resident memory; anything else ends the worker.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable


def serve(actions: dict[str, Callable[[], object]]) -> None:
    """Answer the commands on stdin until one that is not known (see the module)."""
    for line in sys.stdin:
        what = line.strip()
        if what == "peak_rss_mb":
            print(json.dumps({what: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
            continue
        if what not in actions:
            break
        t = time.perf_counter()
        actions[what]()
        print(json.dumps({what: time.perf_counter() - t}), flush=True)
