"""Pack the recorded test fixtures (``tests/fixtures/**/*.npz``) into a smaller, lossless layout.

The recorded archives are read from tests/fixtures where a file there is a plain archive (a new
recording), else from git (the first of the commits ``--source``, default ``SOURCE_COMMITS``, that holds
the file as recorded), and rewritten in place, each as an ``.npz`` with two entries that
``tests.parity_helpers.load_fixture`` decodes back into the recorded arrays, bit for bit:

- ``__layout__``: JSON, one entry per array (name, dtype, shape and how it is stored);
- ``__data__``: one xz stream with the stored elements of every array, byte plane by byte plane.

An array is stored in one of three ways, whichever compresses best:

- as it is;
- as runs copied from arrays packed before it (the same random draws recur across files: TD-MPC2's
  multi-task and termination weights are stretches of the single-task initialisation's stream, the
  DreamerV3 agents share most initial parameters, a target network starts as its online copy),
  with the remaining elements stored;
- against a base array of the same name (the state before an update, ``BASES``): the difference in
  the array's dtype where adding it back is exact for every element, otherwise the zigzag-coded
  number of representable steps between the two (always exact).

Arrays named in ``DROPPED`` are left out (recorded data that the tree cannot afford, each with the
reason and what the tests compare instead). Every packed file is decoded again and compared with the
recorded one, less those arrays, bit for bit before it is written. ``--check`` only decodes and
compares. Usage::

    python tools/pack_fixtures.py            # rewrite tests/fixtures from the recorded archives
    python tools/pack_fixtures.py --check    # verify the files in tests/fixtures
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import parity_helpers  # noqa: E402
from tests.parity_helpers import PACKED_FORMAT, ordered_bits, shuffle  # noqa: E402

FIXTURES = "tests/fixtures"
SOURCE_COMMITS = ["9dd38ab", "04940c6"]
"""Commits holding the recorded (plain) archives, tried in order."""

BASES: dict[str, list[str]] = {
    # The state after updates, stored against the state before them (the first file holding a name wins).
    "tdmpc2/params_after_update3.npz": ["tdmpc2/params_rerand_overrides.npz", "tdmpc2/params_init.npz"],
    "dreamerv3/agent1m_params_after_train.npz": ["dreamerv3/agent1m_params_init.npz"],
    "dreamerv3/agent1m_cont_params_after_train.npz": ["dreamerv3/agent1m_cont_params_init.npz"],
    "dreamerv3/agent1m_image_params_after_train.npz": ["dreamerv3/agent1m_image_params_init.npz"],
    "dreamerv3/agent1m_trained_start.npz": ["dreamerv3/agent1m_params_init.npz"],
}
DROPPED: dict[str, tuple[str, str]] = {
    # file: (regular expression matched at the start of a dropped array's name, the reason)
    "dreamerv3/agent1m_trained_updates.npz": (
        r"step[345]/",
        "updates 3-5 of 5 (the parameter changes, ~1.4 MB packed each): the trained-state test replays "
        "and compares updates 1-2, with the same comparisons and tolerances per update",
    ),
    "dreamerv3/agent1m_image_train_step.npz": (
        r"grad/",
        "the image agent's gradients (~2.1 MB): its losses, metrics and optimiser moments after the update "
        "(which square every gradient) are still compared; the vector agents' files hold full gradients",
    ),
    "dreamerv3/agent1m_train_step2.npz": (
        r"grad/",
        "the discrete agent's step-2 gradients (~1.7 MB): the continuous agent's step-2 gradients are kept "
        "(its Normal actor is code no other gradient fixture covers; the discrete path is covered by "
        "the trained-state updates), and the discrete state after step 2 is still compared",
    ),
}
"""Recorded arrays left out of the packed files, by file."""
MIN_RUN = 32
"""Shortest copied run worth its layout entry (elements)."""
NEAR_GAP, NEAR_MIN, NEAR_SHARE = 16, 256, 0.5
"""Mostly equal stretches: gaps between equal elements, equal elements in all, their share."""
XZ_PRESET = 9 | lzma.PRESET_EXTREME
XZ_FILTERS = [
    [{"id": lzma.FILTER_LZMA2, "preset": XZ_PRESET}],
    # No literal context: byte planes of floats are mostly unrelated to the byte before them.
    [{"id": lzma.FILTER_LZMA2, "preset": XZ_PRESET, "lc": 0, "lp": 0, "pb": 0}],
]
"""The xz settings tried for each file's stream (the smallest is kept; xz records them in the stream)."""
TRIAL_PRESET = 6


def recorded_files(commits: list[str]) -> list[str]:
    """The fixture archives at ``commits`` and in tests/fixtures, relative to tests/fixtures."""
    names = {str(path.relative_to(ROOT / FIXTURES)) for path in (ROOT / FIXTURES).rglob("*.npz")}
    for commit in commits:
        out = git("ls-tree", "-r", "--name-only", commit, FIXTURES).decode().split()
        names |= {name[len(FIXTURES) + 1 :] for name in out if name.endswith(".npz")}
    return sorted(names)


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout


def read_recorded(commits: list[str], name: str) -> dict[str, np.ndarray]:
    """A recorded archive, less its ``DROPPED`` arrays: the plain one in tests/fixtures if there is one
    (a new recording), else the plain one at the first of ``commits`` that has it."""
    path = ROOT / FIXTURES / name
    candidates = [path.read_bytes()] if path.exists() else []
    for commit in commits:
        listed = git("ls-tree", "--name-only", commit, f"{FIXTURES}/{name}").decode().strip()
        if listed:
            candidates.append(git("show", f"{commit}:{FIXTURES}/{name}"))
    dropped = re.compile(DROPPED[name][0]) if name in DROPPED else None
    for candidate in candidates:
        with np.load(io.BytesIO(candidate), allow_pickle=False) as data:
            if "__layout__" not in data.files:
                keys = [key for key in data.files if dropped is None or not dropped.match(key)]
                return {key: data[key] for key in keys}
    raise SystemExit(
        f"{name}: no plain archive in tests/fixtures or at {commits}; pass its commit to --source"
    )


def packing_order(names: list[str]) -> list[str]:
    """Base files first (an array may only refer to arrays packed before it), then the rest by name."""
    bases = {base for lst in BASES.values() for base in lst}
    return sorted(names, key=lambda name: (name not in bases, name))


class RunIndex:
    """Every pair of consecutive 4-byte elements of every array, to find runs repeated later."""

    def __init__(self, arrays: list[tuple[str, str, np.ndarray]]) -> None:
        self.owners = arrays
        self.starts = np.zeros(len(arrays) + 1, np.int64)
        pairs = []
        for i, (_, _, array) in enumerate(arrays):
            words = self.words(array)
            self.starts[i + 1] = self.starts[i] + words.size
            pairs.append(self.pairs(words))
        keys = np.concatenate(pairs) if pairs else np.zeros(0, np.uint64)
        order = np.argsort(keys, kind="stable")  # equal keys stay in position order
        keys = keys[order]
        first = np.ones(keys.size, bool)
        first[1:] = keys[1:] != keys[:-1]
        self.keys, self.first_position = keys[first], order[first]

    @staticmethod
    def words(array: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(array).reshape(-1)
        return flat.view(np.uint32) if flat.dtype.itemsize == 4 else np.zeros(0, np.uint32)

    @staticmethod
    def pairs(words: np.ndarray) -> np.ndarray:
        """Key of the pair starting at each element (the last element pairs with nothing: key 0)."""
        wide = words.astype(np.uint64)
        keys = np.zeros(words.size, np.uint64)
        keys[:-1] = (wide[:-1] << np.uint64(32)) | wide[1:]
        return keys

    def runs(self, index: int) -> list[tuple[int, int, int, int, bool]]:
        """Stretches of array ``index`` equal, or mostly equal, to one of an earlier array.

        Returns (start, length, source array, start in the source, exact) per stretch, flat element
        indices. A stretch that is not exact has at least ``NEAR_SHARE`` of its elements equal, with
        gaps of at most ``NEAR_GAP`` between them: it is stored as steps from the source (mostly 0).
        """
        words = self.words(self.owners[index][2])
        if words.size < MIN_RUN:
            return []
        keys = self.pairs(words)[:-1]
        where = np.clip(np.searchsorted(self.keys, keys), 0, max(self.keys.size - 1, 0))
        found = (self.keys[where] == keys) & (keys != 0)
        earliest = np.where(found, self.first_position[where], -1)
        valid = (earliest >= 0) & (earliest < self.starts[index])
        diagonal = np.where(valid, earliest - np.arange(keys.size), np.iinfo(np.int64).min)
        breaks = np.flatnonzero(np.diff(diagonal) != 0) + 1
        groups = [  # (first element, end element, diagonal) of each stretch of equal pairs
            (int(lo), int(hi) + 1, int(diagonal[lo]))
            for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, keys.size], strict=True)
            if valid[lo]
        ]
        chains: list[list[tuple[int, int, int]]] = []
        for group in groups:
            last = chains[-1][-1] if chains else None
            if last is not None and last[2] == group[2] and group[0] - last[1] <= NEAR_GAP:
                chains[-1].append(group)
            else:
                chains.append([group])
        out = []
        for chain in chains:
            lo, hi, diag = chain[0][0], chain[-1][1], chain[0][2]
            equal = sum(end - begin for begin, end, _ in chain)
            source = int(np.searchsorted(self.starts, lo + diag, "right") - 1)
            inside = lo + diag + (hi - lo) <= self.starts[source + 1]
            if len(chain) > 1 and inside and equal >= NEAR_MIN and equal >= NEAR_SHARE * (hi - lo):
                out.append((lo, hi - lo, source, int(lo + diag - self.starts[source]), False))
                continue
            for begin, end, _ in chain:
                if end - begin >= MIN_RUN:
                    source = int(np.searchsorted(self.starts, begin + diag, "right") - 1)
                    out.append((begin, end - begin, source, int(begin + diag - self.starts[source]), True))
        return disjoint(out)


def disjoint(runs: list[tuple[int, int, int, int, bool]]) -> list[tuple[int, int, int, int, bool]]:
    """The runs (in order) with each one's overlap with the one before cut from its start."""
    out, end = [], 0
    for start, length, source, source_start, exact in runs:
        cut = max(0, end - start)
        if length - cut >= (MIN_RUN if exact else NEAR_MIN):
            out.append((start + cut, length - cut, source, source_start + cut, exact))
            end = start + length
    return out


def encode_residual(array: np.ndarray, base: np.ndarray) -> tuple[str, np.ndarray]:
    """``array`` against ``base``: the dtype's difference where adding it back is exact, else steps."""
    with np.errstate(all="ignore"):
        difference = (array - base).astype(array.dtype)
        exact = (base + difference).astype(array.dtype)
    if np.array_equal(exact.view(np.uint8), array.view(np.uint8)):
        return "sub", difference
    return "ord", steps_from(array, base)


def steps_from(array: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Zigzag-coded count of representable steps from ``base`` to ``array``, in ``array``'s dtype."""
    unsigned, signed = {4: (np.uint32, np.int32), 8: (np.uint64, np.int64)}[array.dtype.itemsize]
    steps = (ordered_bits(array) - ordered_bits(base)).astype(unsigned).view(signed)
    zigzag = (steps << 1) ^ (steps >> (8 * array.dtype.itemsize - 1))
    return zigzag.view(unsigned).view(array.dtype)


def trial_size(data: bytes) -> int:
    return len(lzma.compress(data, preset=TRIAL_PRESET))


def pack_file(
    name: str, arrays: dict[str, np.ndarray], index: RunIndex, first: int, bases: list[dict[str, np.ndarray]]
) -> tuple[dict[str, Any], bytes]:
    """The layout and xz stream of one file; ``first`` is its first array's position in ``index``."""
    entries, chunks = [], []
    folder = Path(name).parent
    for offset, (key, array) in enumerate(arrays.items()):
        entry: dict[str, Any] = {"name": key, "dtype": array.dtype.str, "shape": list(array.shape)}
        flat = np.ascontiguousarray(array).reshape(-1)
        stored = flat
        runs = index.runs(first + offset) if array.dtype.itemsize == 4 else []
        if runs:
            keep = np.ones(flat.size, bool)
            values = flat.copy()
            copies: list[list[Any]] = []
            for start, length, source, source_start, exact in runs:
                source_file, source_key, source_array = index.owners[source]
                where = None if source_file == name else os.path.relpath(source_file, folder)
                copies.append([start, length, where, source_key, source_start])
                if exact:
                    keep[start : start + length] = False
                else:
                    near = source_array.reshape(-1)[source_start : source_start + length]
                    values[start : start + length] = steps_from(flat[start : start + length], near)
                    copies[-1].append("ord")
            entry["copies"], stored = copies, values[keep]
        base = next((b[key] for b in bases if key in b), None)
        comparable = base is not None and base.dtype == array.dtype and base.shape == array.shape
        if base is not None and comparable and array.dtype.kind == "f":
            mode, residual = encode_residual(flat, base.reshape(-1))
            if trial_size(shuffle(residual)) < trial_size(shuffle(stored)):
                entry.pop("copies", None)
                base_file = next(f for f, b in zip(BASES[name], bases, strict=True) if key in b)
                where = os.path.relpath(base_file, folder)
                entry["base"], stored = [where, key, mode], residual
        entries.append(entry)
        chunks.append(shuffle(stored))
    return {"format": PACKED_FORMAT, "arrays": entries}, smallest_xz(b"".join(chunks))


def smallest_xz(data: bytes) -> bytes:
    streams = [lzma.compress(data, format=lzma.FORMAT_XZ, filters=chain) for chain in XZ_FILTERS]
    return min(streams, key=len)


def write_packed(path: Path, layout: dict[str, Any], stream: bytes) -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        __layout__=np.array(json.dumps(layout, separators=(",", ":"))),
        __data__=np.frombuffer(stream, np.uint8),
    )
    temporary = path.with_suffix(".npz.tmp")
    temporary.write_bytes(buffer.getvalue())
    temporary.replace(path)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def verify(name: str, recorded: dict[str, np.ndarray]) -> None:
    """The file in tests/fixtures decodes to the recorded arrays, bit for bit, in the same order."""
    decoded = parity_helpers.load_fixture(ROOT / FIXTURES / name)
    if list(decoded) != list(recorded):
        raise SystemExit(f"{name}: names differ after decoding")
    for key, array in recorded.items():
        if not same_bits(decoded[key], array):
            raise SystemExit(f"{name}: {key} differs after decoding")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--source", nargs="+", default=SOURCE_COMMITS, help="git commits of the recorded archives"
    )
    parser.add_argument("--check", action="store_true", help="only verify the packed files")
    args = parser.parse_args()
    names = packing_order(recorded_files(args.source))
    recorded = {name: read_recorded(args.source, name) for name in names}
    if not args.check:
        owners = [(name, key, array) for name in names for key, array in recorded[name].items()]
        index = RunIndex(owners)
        first = 0
        for name in names:
            bases = [recorded[b] for b in BASES.get(name, [])]
            layout, stream = pack_file(name, recorded[name], index, first, bases)
            first += len(recorded[name])
            path = ROOT / FIXTURES / name
            write_packed(path, layout, stream)
            print(f"{path.stat().st_size:>10} {name}", flush=True)
    parity_helpers._decoded.cache_clear()
    for name in names:
        verify(name, recorded[name])
    total = sum((ROOT / FIXTURES / name).stat().st_size for name in names)
    print(f"{len(names)} files verified bit for bit, {total} bytes")


if __name__ == "__main__":
    main()
