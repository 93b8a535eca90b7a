"""Checkpoint and replay files that load without running code.

Unpickling a file runs whatever code the file names, so a shared checkpoint must not be unpickled
by default. The formats here hold only:

- JSON, with a closed set of tagged values (:func:`encode` / :func:`decode`): numpy arrays and
  scalars, tuples, deques, Gymnasium spaces, ``np.random.Generator`` states and the few schedule
  classes listed in ``_SAFE_CLASSES``. Decoding builds only those types; it imports nothing named
  by the file.
- Tensors read with ``torch.load(..., weights_only=True)`` (torch's restricted unpickler).
- ``.npz`` arrays read with ``np.load(..., allow_pickle=False)``.

An attribute that none of these can express (a user's lambda learning rate, a custom object) is
stored the way SB3 stores it, cloudpickled, and its key is listed; reading it back needs the key in
``custom_objects`` or ``trust_pickled_code=True``, whose name says what it does.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tempfile
import zipfile
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.save_util import data_to_json, json_to_data
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule

from sb3_worldmodels.common.schedule import RatioSchedule

TAG = "__sb3wm__"  # the key of every tagged value: {"__sb3wm__": kind, ...}
PICKLED = ":serialized:"  # SB3's key for a cloudpickled value (data_to_json)
_ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: no objects, no raw bytes
TRUST_HINT = (
    "Unpickling runs code stored in the file: pass trust_pickled_code=True only for a file you "
    "trust (you wrote it, or you would run a script from its author), then save it again to get a "
    "file that loads safely."
)


class NotEncodable(TypeError):
    """Raised by :func:`encode` for a value outside the safe set."""


class UnsafeFileError(ValueError):
    """A file needs unpickling (code execution) and the caller did not opt in."""


# ---------------------------------------------------------------------------------------- values
def _encode_array(value: np.ndarray) -> dict[str, Any]:
    if value.dtype.kind not in _ARRAY_KINDS:
        raise NotEncodable(f"numpy array of dtype {value.dtype}")
    little = value.astype(value.dtype.newbyteorder("<"), copy=False)
    return {
        TAG: "ndarray",
        "dtype": little.dtype.str,
        "shape": list(value.shape),
        "data": base64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii"),
    }


def _decode_array(obj: Mapping[str, Any]) -> np.ndarray:
    dtype = np.dtype(str(obj["dtype"]))
    if dtype.kind not in _ARRAY_KINDS:
        raise ValueError(f"array of dtype {dtype} is not allowed")
    shape = tuple(int(d) for d in obj["shape"])
    raw = base64.b64decode(str(obj["data"]), validate=True)
    if len(raw) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"array data of {len(raw)} bytes does not fit shape {shape} {dtype}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _encode_space(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Box):
        return {TAG: "Box", "low": encode(space.low), "high": encode(space.high), "dtype": space.dtype.str}
    if isinstance(space, spaces.Discrete):
        return {TAG: "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {TAG: "MultiDiscrete", "nvec": encode(space.nvec), "start": encode(space.start)}
    if isinstance(space, spaces.MultiBinary):
        return {TAG: "MultiBinary", "n": encode(np.asarray(space.n))}
    if isinstance(space, spaces.Dict):
        return {TAG: "Dict", "items": [[key, _encode_space(sub)] for key, sub in space.spaces.items()]}
    if isinstance(space, spaces.Tuple):
        return {TAG: "Tuple", "items": [_encode_space(sub) for sub in space.spaces]}
    raise NotEncodable(f"space {type(space).__name__}")


def _decode_space(obj: Mapping[str, Any]) -> spaces.Space:
    kind = obj[TAG]
    if kind == "Box":
        return spaces.Box(low=decode(obj["low"]), high=decode(obj["high"]), dtype=np.dtype(str(obj["dtype"])))
    if kind == "Discrete":
        return spaces.Discrete(int(obj["n"]), start=int(obj["start"]))
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(decode(obj["nvec"]), start=decode(obj["start"]))
    if kind == "MultiBinary":
        n = decode(obj["n"])
        return spaces.MultiBinary(n.tolist() if n.ndim else int(n))
    if kind == "Dict":
        return spaces.Dict({str(key): _decode_space(sub) for key, sub in obj["items"]})
    return spaces.Tuple([_decode_space(sub) for sub in obj["items"]])


def _simple_linear_schedule() -> type | None:
    try:
        from rl_zoo3.utils import SimpleLinearSchedule
    except ImportError:
        return None
    return SimpleLinearSchedule


# name -> (class, attributes restored through the constructor, attributes set afterwards)
_SAFE_CLASSES: dict[str, tuple[Any, tuple[str, ...], tuple[str, ...]]] = {
    "ConstantSchedule": (ConstantSchedule, ("val",), ()),
    "LinearSchedule": (LinearSchedule, ("start", "end", "end_fraction"), ()),
    "FloatSchedule": (FloatSchedule, ("value_schedule",), ()),
    "RatioSchedule": (RatioSchedule, ("train_ratio", "batch_size", "batch_length", "train_fill"), ("prev",)),
    "SimpleLinearSchedule": (_simple_linear_schedule, ("initial_value",), ()),
}


def _safe_class(value: Any) -> str | None:
    name = type(value).__name__
    entry = _SAFE_CLASSES.get(name)
    if entry is None:
        return None
    cls = entry[0]() if entry[0] is _simple_linear_schedule else entry[0]
    return name if cls is not None and type(value) is cls else None


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data; raises :class:`NotEncodable` outside the safe set."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return value
    if isinstance(value, np.ndarray):
        return _encode_array(value)
    if isinstance(value, np.generic):
        return {TAG: "scalar", "value": _encode_array(np.asarray(value))}
    if isinstance(value, TrainFreq):
        return {TAG: "TrainFreq", "frequency": int(value.frequency), "unit": value.unit.value}
    if isinstance(value, tuple) and type(value) is tuple:
        return {TAG: "tuple", "items": [encode(v) for v in value]}
    if isinstance(value, list) and type(value) is list:
        return [encode(v) for v in value]
    if isinstance(value, deque):
        return {TAG: "deque", "items": [encode(v) for v in value], "maxlen": value.maxlen}
    if type(value) is OrderedDict:  # SB3's VecEnvs return Dict observations as OrderedDicts
        return {TAG: "OrderedDict", "items": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, dict) and type(value) is dict:
        if all(isinstance(k, str) and not k.startswith(("__", ":")) for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {TAG: "dict", "items": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, spaces.Space):
        return _encode_space(value)
    if isinstance(value, np.random.Generator):
        return {TAG: "Generator", "state": value.bit_generator.state}
    name = _safe_class(value)
    if name is not None:
        fields = _SAFE_CLASSES[name][1] + _SAFE_CLASSES[name][2]
        return {TAG: "object", "class": name, "fields": {f: encode(getattr(value, f)) for f in fields}}
    raise NotEncodable(type(value).__qualname__)


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`; raises ValueError on anything it did not write."""
    if obj is None or isinstance(obj, (bool, str, int, float)):
        return obj
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        raise ValueError(f"unexpected JSON value of type {type(obj).__name__}")
    if PICKLED in obj:
        raise UnsafeFileError("a pickled value inside a safe entry")
    kind = obj.get(TAG)
    if kind is None:
        return {k: decode(v) for k, v in obj.items()}
    if kind == "ndarray":
        return _decode_array(obj)
    if kind == "scalar":
        return _decode_array(obj["value"])[()]
    if kind == "TrainFreq":
        return TrainFreq(int(obj["frequency"]), TrainFrequencyUnit(str(obj["unit"])))
    if kind == "tuple":
        return tuple(decode(v) for v in obj["items"])
    if kind == "deque":
        maxlen = obj["maxlen"]
        return deque((decode(v) for v in obj["items"]), maxlen=None if maxlen is None else int(maxlen))
    if kind == "dict":
        return {decode(k): decode(v) for k, v in obj["items"]}
    if kind == "OrderedDict":
        return OrderedDict((decode(k), decode(v)) for k, v in obj["items"])
    if kind in ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple"):
        return _decode_space(obj)
    if kind == "Generator":
        state = obj["state"]
        if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
            raise ValueError("only PCG64 generator states are read")
        generator = np.random.Generator(np.random.PCG64())
        generator.bit_generator.state = state
        return generator
    if kind == "object" and obj.get("class") in _SAFE_CLASSES:
        factory, init_fields, set_fields = _SAFE_CLASSES[obj["class"]]
        cls = factory() if factory is _simple_linear_schedule else factory
        if cls is None:
            raise ValueError(f"{obj['class']} needs rl_zoo3 installed")
        fields = {name: decode(value) for name, value in obj["fields"].items()}
        instance = cls(*(fields[name] for name in init_fields))
        for name in set_fields:
            setattr(instance, name, fields[name])
        return instance
    raise ValueError(f"unknown tagged value {kind!r}")


# ------------------------------------------------------------------------------------ attributes
def encode_attributes(attributes: Mapping[str, Any]) -> tuple[str, list[str]]:
    """A JSON text of ``attributes`` and the keys that had to be pickled (SB3's serialisation)."""
    entries: dict[str, Any] = {}
    pickled = []
    for key, value in attributes.items():
        try:
            entries[key] = encode(value)
        except NotEncodable:
            entries[key] = json.loads(data_to_json({key: value}))[key]
            pickled.append(key)
    return json.dumps(entries, indent=2), pickled


def is_pickled(entry: Any) -> bool:
    return isinstance(entry, dict) and PICKLED in entry


def decode_attributes(
    raw: Mapping[str, Any], what: str, custom_objects: Mapping[str, Any] | None, trust_pickled_code: bool
) -> dict[str, Any]:
    """Decode the parsed JSON object of :func:`encode_attributes` (or of an older, fully pickled SB3
    ``data`` part).

    A key in ``custom_objects`` takes that value without reading the stored one (SB3's rule).
    Pickled entries are unpickled only with ``trust_pickled_code``; otherwise UnsafeFileError
    names them.
    """
    custom_objects = dict(custom_objects or {})
    pickled = sorted(key for key, entry in raw.items() if is_pickled(entry) and key not in custom_objects)
    if pickled and not trust_pickled_code:
        raise UnsafeFileError(
            f"{what} stores {len(pickled)} value(s) as pickled Python objects ({', '.join(pickled)}). "
            f"Pass them in custom_objects={{...}} to load without unpickling, or: {TRUST_HINT}"
        )
    out: dict[str, Any] = {}
    for key, entry in raw.items():
        if key in custom_objects:
            out[key] = custom_objects[key]
        elif is_pickled(entry):
            out[key] = json_to_data(json.dumps({key: entry}))[key]
        else:
            try:
                out[key] = decode(entry)
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"{what}: the entry {key!r} is malformed ({error}).") from error
    return out


# ------------------------------------------------------------------------------- atomic writes
def write_atomically(path: str | os.PathLike[str], write: Callable[[str], None], suffix: str = "") -> Path:
    """Call ``write`` on a temporary file beside ``path``, flush it to disk, then rename it into place:
    an interrupted write never leaves a truncated file behind. Every file the package writes for a
    user (checkpoints, replays, exported episodes, pools) goes through here.

    :param suffix: added to ``path`` when it has none (SB3's rule: ``.zip`` for a model).
    :return: the path written.

    The file gets the permissions a plain ``open`` would give (0666 less the umask, as SB3's files).
    The temporary file is ``.<name>.<pid>.<random>.tmp<suffix>``; those left by a writer that was
    killed (its process is gone) are removed, whatever file they were for (a CheckpointCallback's
    next save has another name).
    """
    target = Path(path)
    if target.suffix == "":
        target = target.with_suffix(suffix)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temporaries(target.parent, target.suffix)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp" + target.suffix, dir=target.parent
    )
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        _fsync_directory(target.parent)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def _remove_orphaned_temporaries(folder: Path, suffix: str) -> None:
    """Delete the ``.<name>.<pid>.<random>.tmp<suffix>`` files in ``folder`` whose writer is gone."""
    pattern = re.compile(r"^\..+\.(\d+)\.[A-Za-z0-9_]+\.tmp" + re.escape(suffix) + "$")
    for leftover in folder.glob(f".*.tmp{suffix}"):
        match = pattern.match(leftover.name)
        if match and not _process_alive(int(match.group(1))):
            leftover.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fsync_directory(folder: Path) -> None:
    """Persist a rename on POSIX (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ zip files
def describe(path: Any, default: str) -> str:
    """``repr`` of a path for messages, ``default`` for a file object."""
    return repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else default


def read_zip(path: Any, what: str) -> dict[str, bytes]:
    """Every member of a zip (path or binary file object), read into memory; ValueError naming
    ``what`` when it cannot be read as one."""
    source = path if hasattr(path, "read") else _existing_path(path, ".zip")
    try:
        with zipfile.ZipFile(source) as archive:
            return {name: archive.read(name) for name in archive.namelist()}
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise ValueError(f"Could not read {what} as an SB3 checkpoint (zip): {error}") from error


def _existing_path(path: Any, suffix: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path) and os.path.exists(path + suffix):
        return path + suffix
    return path


def load_tensors(blob: bytes, what: str) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and plain containers only."""
    try:
        return th.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"{what} holds something other than tensors ({type(error).__name__}: {error}); it was "
            "not written by save() and is not loaded."
        ) from error


class _TensorDictFields:
    """What a pickled TensorDict becomes when read: a plain object holding its attributes, no code."""


# The names under which tensordict's classes are pickled (0.2 as of the reference, and later).
_TENSORDICT_GLOBALS: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
    (_TensorDictFields, "tensordict.tensordict.TensorDict"),
    (_TensorDictFields, "tensordict._td.TensorDict"),
    (dict, "tensordict.utils._StringOnlyDict"),
    set,
]


def load_tensordict(path: str | os.PathLike[str], what: str) -> dict[str, th.Tensor]:
    """The entries of a TensorDict written with ``torch.save`` (as the tensordict library pickles
    it), read with ``weights_only=True``: only tensors and plain containers are rebuilt, the
    TensorDict class is never imported or run. Tensors are memory-mapped from the file.

    :return: key -> tensor (nested TensorDicts are not supported).
    """
    try:
        with th.serialization.safe_globals(_TENSORDICT_GLOBALS):
            loaded = th.load(os.fspath(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise ValueError(
            f"{what} is not a TensorDict saved with torch.save, or holds more than tensors "
            f"({type(error).__name__}: {str(error)[:300]}); it is not loaded."
        ) from error
    entries = getattr(loaded, "_tensordict", None) if isinstance(loaded, _TensorDictFields) else loaded
    if not isinstance(entries, dict) or not all(
        isinstance(k, str) and isinstance(v, th.Tensor) for k, v in entries.items()
    ):
        raise ValueError(f"{what} does not hold a TensorDict of tensors (got {type(loaded).__name__}).")
    return dict(entries)


def write_zip(target: Any, members: Mapping[str, bytes]) -> None:
    """Write ``members`` to a zip (path or binary file object)."""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, blob in members.items():
            archive.writestr(name, blob)


def tensors_to_bytes(tensors: Any) -> bytes:
    buffer = io.BytesIO()
    th.save(tensors, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------ npz files
META = "__meta__"


def save_npz(target: Any, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Arrays plus a JSON text of safe values (:func:`encode`) in one ``.npz``, no pickles."""
    if META in arrays:
        raise ValueError(f"{META!r} is reserved")
    np.savez(target, **{META: np.array(json.dumps(encode(dict(meta))))}, **arrays)  # type: ignore[arg-type]


def is_zip_file(path: Any) -> bool:
    if hasattr(path, "read"):
        start = path.tell()
        head = path.read(4)
        path.seek(start)
    else:
        with open(_existing_path(path, ".pkl"), "rb") as handle:
            head = handle.read(4)
    return head == b"PK\x03\x04"


def load_npz(
    source: Any, what: str, expected: str = "a replay file written by save_replay_buffer()"
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and metadata written by :func:`save_npz`; nothing is unpickled. ``expected`` names
    the kind of file in the error for one that is not."""
    source = source if hasattr(source, "read") else _existing_path(source, ".pkl")
    try:
        with np.load(source, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = decode(json.loads(str(arrays.pop(META)[()])))
    except (KeyError, ValueError, TypeError, zipfile.BadZipFile) as error:
        raise ValueError(f"{what} is not {expected}: {error}") from error
    if not isinstance(meta, dict):
        raise ValueError(f"{what} has malformed metadata.")
    return arrays, meta
