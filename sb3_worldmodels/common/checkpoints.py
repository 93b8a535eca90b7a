"""The checkpoint format of every agent of the package, and the state codec it stores.

A checkpoint is SB3's zip layout: ``data`` (the model's attributes as plain JSON,
:mod:`~sb3_worldmodels.common.safe_io`), ``policy.pth`` (the state pytree as a flat dict of CPU
tensors keyed by its paths: the float leaves, what ``policy.state_dict()`` and ``get_parameters``
give), ``pytorch_variables.pth`` (the state's other leaves, PRNG keys and counters, keyed alike),
SB3's version and the system info.
It is written atomically (:func:`~sb3_worldmodels.common.safe_io.write_atomically`) and read without
unpickling anything. :class:`Checkpointing` gives an SB3 algorithm ``save``/``load`` and the parameter
API over this format; the algorithm builds itself from the decoded attributes in ``_from_checkpoint``.

Format versions (``data["format_version"]``): 2, attributes as JSON; 1, attributes pickled by SB3
(read only with ``trust_pickled_code=True``).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np
import stable_baselines3 as sb3
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.utils import get_system_info

from sb3_worldmodels.common import safe_io

if TYPE_CHECKING:
    from sb3_worldmodels.common.policy import JaxPolicy

FORMAT_VERSION = 2
STATE_PREFIX = "state/"  # the key prefix of every state leaf in policy.pth


# ------------------------------------------------------------------------------------ state codec
def flatten_state(tree: Any) -> dict[str, np.ndarray]:
    """Pytree -> {path: numpy array}; paths are jax key paths (stable for dicts and NamedTuples)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}


_KEY = re.compile(r"\['([^']*)'\]|\[(\d+)\]")


def _tree_position(suffix: str) -> tuple[tuple[int, Any], ...]:
    """The keys of a path below a leaf's name (``"['encoder']['0']['kernel']"``), comparable in the
    order ``jax.tree_util`` gives leaves (a dict's keys sorted, a sequence's by index); ValueError for
    a path of another form."""
    keys, end = [], 0
    for match in _KEY.finditer(suffix):
        if match.start() != end:
            break
        keys.append((0, match.group(1)) if match.group(1) is not None else (1, int(match.group(2))))
        end = match.end()
    if end != len(suffix) or not keys:
        raise ValueError(suffix)
    return tuple(keys)


def join_split_leaves(flat: dict[str, np.ndarray], current: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``flat`` with the arrays that a file stores as a tree below the name of one of ``current``'s
    leaves joined into that leaf, as it is today: an optimiser's moment is one vector of every
    parameter (:func:`~sb3_worldmodels.blocks.optim.over_flat_parameters`), where files written before
    it hold one array per parameter (``...inner_state[0].mu['encoder']['0']['kernel']``, ...). Each is
    raveled over the axes after the leaf's leading ones (a seed group's seed axis) and concatenated in
    the tree's order. Entries of any other form are left as they are (the loader's checks name them)."""
    out = dict(flat)
    for name, leaf in current.items():
        if name in flat:
            continue
        parts = {key[len(name) :]: value for key, value in flat.items() if key.startswith(name + "[")}
        try:
            order = sorted(parts, key=_tree_position)
            lead = np.shape(leaf)[:-1]
            joined = [np.asarray(parts[suffix]).reshape(*lead, -1) for suffix in order]
        except ValueError:
            continue
        if joined:
            out[name] = np.concatenate(joined, -1)
            for suffix in parts:
                del out[name + suffix]
    return out


def restore_state(template: Any, flat: dict[str, np.ndarray], what: str) -> Any:
    """Fill ``template``'s structure with the arrays of ``flat``; RuntimeError on a missing or unknown
    entry, a shape that differs, or a value of another kind (a float for an integer counter, say).
    Floats of another width are cast to the leaf's; integers (PRNG keys travel as int64) must fit it."""
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    expected = {jax.tree_util.keystr(p): leaf for p, leaf in paths_leaves}
    missing = sorted(set(expected) - set(flat))
    extra = sorted(set(flat) - set(expected))
    if missing or extra:
        raise RuntimeError(
            f"The checkpoint does not fit this {what}: {len(missing)} missing and {len(extra)} unexpected "
            f"entries (e.g. missing {missing[:3]}, unexpected {extra[:3]}). It was saved by another "
            "algorithm or with different architecture settings (model_size, widths, spaces)."
        )
    leaves = []
    for path, leaf in paths_leaves:
        key = jax.tree_util.keystr(path)
        value = np.asarray(flat[key])
        want = np.asarray(leaf)
        if value.shape != want.shape:
            raise RuntimeError(
                f"The checkpoint does not fit this {what}: {key} has shape {value.shape}, expected "
                f"{want.shape} (different architecture settings or spaces)."
            )
        _check_dtype(key, value, want.dtype, what)
        leaves.append(value.astype(want.dtype, copy=False))
    return jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(v) for v in leaves])


def _check_dtype(key: str, value: np.ndarray, dtype: np.dtype, what: str) -> None:
    kinds = {"f": "f", "b": "b", "i": "iu", "u": "iu"}.get(dtype.kind, dtype.kind)
    fits = value.dtype.kind in kinds
    if fits and dtype.kind in "iu" and value.size:
        limits = np.iinfo(dtype)
        fits = limits.min <= int(value.min()) and int(value.max()) <= limits.max
    if not fits:
        raise RuntimeError(
            f"The checkpoint does not fit this {what}: {key} holds {value.dtype} values, expected "
            f"{dtype}. The file or parameter dict was not written for this model."
        )


def state_to_tensors(state: Any, floats: bool = True) -> dict[str, th.Tensor]:
    """The leaves of ``state`` as CPU tensors keyed ``state/<path>``: with ``floats`` the float leaves
    (weights, optimiser moments, statistics), otherwise the others (PRNG keys and counters)."""
    out = {}
    for key, value in flatten_state(state).items():
        if (value.dtype.kind == "f") != floats:
            continue
        if value.dtype.kind == "u":  # torch lacks general unsigned support: PRNG keys travel as int64
            value = value.astype(np.int64)
        out[STATE_PREFIX + key] = th.from_numpy(np.array(value, copy=True))
    return out


def tensors_to_arrays(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    """``state/<path>`` tensors (or arrays) -> {path: numpy array}; RuntimeError on another key."""
    flat = {}
    for key, value in tensors.items():
        if not key.startswith(STATE_PREFIX):
            raise RuntimeError(
                f"Unexpected parameter {key!r}: this checkpoint was not written by an sb3_worldmodels agent."
            )
        array = value.detach().cpu().numpy() if isinstance(value, th.Tensor) else np.asarray(value)
        flat[key[len(STATE_PREFIX) :]] = array
    return flat


# ------------------------------------------------------------------------------------ the file
def checkpoint_header(blob: bytes, what: str) -> dict[str, Any]:
    """The checkpoint's plain JSON entries (nothing is decoded or unpickled)."""
    try:
        raw = json.loads(blob.decode(errors="replace"))
    except ValueError as error:
        raise ValueError(f"{what}: its 'data' part is not valid JSON ({error}).") from error
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: its 'data' part is not a JSON object.")
    return raw


def _stored_policy_name(header: dict[str, Any]) -> str:
    """The policy class SB3 recorded, read from the readable fields beside its pickle."""
    entry = header.get("policy_class")
    module = entry.get("__module__") if isinstance(entry, dict) else None
    if isinstance(module, str):
        parts = module.split(".")
        named = len(parts) == 3 and parts[2] == "policies" and parts[1] != "common"
        algo = f"{parts[1].upper()}, " if named else ""
        return f"{algo}a policy class from {module}"
    return "no sb3_worldmodels algorithm name"


def read_checkpoint(
    path: Any,
    algorithm: str,
    custom_objects: dict[str, Any] | None = None,
    trust_pickled_code: bool = False,
    print_system_info: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoded attributes and the ``{"policy": tensors}`` of a checkpoint written by ``algorithm``
    (a class name); a file of another algorithm, an incomplete or a newer one is refused."""
    what = safe_io.describe(path, "the checkpoint")
    members = safe_io.read_zip(path, what)
    if "data" not in members:
        raise ValueError(f"{what} holds no SB3 model data (no 'data' part in the zip).")
    header = checkpoint_header(members["data"], what)
    saved = header.get("algorithm_name")
    if saved != algorithm:
        if not isinstance(saved, str):
            saved = f"another algorithm ({_stored_policy_name(header)})"
        raise ValueError(
            f"{what} was saved by {saved}, not by {algorithm}: load it with the algorithm that saved it."
        )
    if "policy.pth" not in members:
        raise ValueError(
            f"{what} has no policy weights (policy.pth is missing from the zip): the file is "
            "incomplete or was not written by save()."
        )
    version = header.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{what} has checkpoint format {version!r}; this sb3_worldmodels reads format "
            f"{FORMAT_VERSION} and older: upgrade sb3_worldmodels to load it."
        )
    if print_system_info:
        print("== SAVED MODEL SYSTEM INFO ==")
        print(members.get("system_info.txt", b"(none)").decode(errors="replace"))
    data = safe_io.decode_attributes(header, what, custom_objects, trust_pickled_code)
    return data, {"policy": state_tensors(members, what)}


def state_tensors(members: dict[str, bytes], what: str) -> Any:
    """The state's tensors of a checkpoint's zip ``members``: policy.pth's float leaves with
    pytorch_variables.pth's keys and counters (which earlier files kept in policy.pth)."""
    tensors = safe_io.load_tensors(members["policy.pth"], f"{what} (policy.pth)")
    if "pytorch_variables.pth" not in members:
        return tensors
    variables = safe_io.load_tensors(members["pytorch_variables.pth"], f"{what} (pytorch_variables.pth)")
    if not isinstance(tensors, dict) or not isinstance(variables, dict):
        raise ValueError(f"{what}: policy.pth and pytorch_variables.pth must each hold a dict of tensors.")
    return {**tensors, **variables}


def checkpoint_members(
    attributes: dict[str, Any], policy_tensors: dict[str, th.Tensor], variables: dict[str, th.Tensor]
) -> dict[str, bytes]:
    """The zip members of a checkpoint: ``policy_tensors`` (the state's float leaves) in policy.pth,
    ``variables`` (its keys and counters) in pytorch_variables.pth; an attribute JSON cannot express is
    pickled, with a warning."""
    text, pickled = safe_io.encode_attributes(attributes)
    if pickled:
        warnings.warn(
            f"Saved {', '.join(pickled)} as pickled Python objects (not expressible as plain data): "
            f"load() will need custom_objects={{{', '.join(repr(k) + ': ...' for k in pickled)}}} "
            "or trust_pickled_code=True. A float learning rate or SB3's schedule classes "
            "(LinearSchedule, ConstantSchedule) are stored as plain data.",
            stacklevel=3,
        )
    return {
        "data": text.encode(),
        "pytorch_variables.pth": safe_io.tensors_to_bytes(variables),
        "policy.pth": safe_io.tensors_to_bytes(policy_tensors),
        "_stable_baselines3_version": sb3.__version__.encode(),
        "system_info.txt": get_system_info(print_info=False)[1].encode(),
    }


# ------------------------------------------------------------------------------------ the algorithm side
class Checkpointing(BaseAlgorithm):
    """``save``, ``load``, ``get_parameters`` and ``set_parameters`` over the package's checkpoint
    format, for an SB3 algorithm whose ``policy`` is a :class:`~sb3_worldmodels.common.policy.JaxPolicy`."""

    policy: JaxPolicy
    renamed_state_leaves: ClassVar[dict[str, str]] = {}
    """Old -> new names of state leaves, so that checkpoints of earlier releases still load."""
    renamed_attributes: ClassVar[dict[str, str]] = {"_pending_updates": "_owed_updates"}
    """Old -> new names of saved attributes (DreamerV3 saved its owed updates as ``_pending_updates``)."""

    def save(self, path: str | os.PathLike | Any, exclude: Any = None, include: Any = None) -> None:
        """SB3's zip layout with attributes as plain JSON and weights as tensors (no pickles, see
        :mod:`sb3_worldmodels.common.safe_io`), written atomically (a temporary file renamed into place).

        An attribute JSON cannot express (a callable learning rate, a custom object) is pickled as SB3
        does, with a warning: loading it then needs ``custom_objects`` or ``trust_pickled_code=True``.

        In a data-parallel run over several processes (``jax.distributed``) process 0 writes the file
        and the others write nothing: the parameters are the same in every process.
        """
        placement = getattr(self, "_batch_placement", None)
        if placement is not None and placement.process_count > 1 and placement.process_index != 0:
            return
        members = checkpoint_members(
            self._checkpoint_attributes(exclude, include),
            self.policy.state_dict(),
            self.policy.keys_and_counters(),
        )
        if not isinstance(path, (str, os.PathLike)):
            safe_io.write_zip(path, members)
            return
        safe_io.write_atomically(path, lambda tmp: safe_io.write_zip(tmp, members), ".zip")

    def _checkpoint_attributes(self, exclude: Any, include: Any) -> dict[str, Any]:
        """The attributes ``save`` stores: SB3's choice (less the policy, which travels as tensors),
        with the format version and the algorithm's name that ``load`` checks first."""
        excluded = set(exclude or ()).union(self._excluded_save_params(), ("lr_schedule", "policy_class"))
        excluded = excluded.difference(include or ())
        excluded.update(name.split(".")[0] for name in self._get_torch_save_params()[0])
        attributes = {key: value for key, value in self.__dict__.items() if key not in excluded}
        return {**attributes, "format_version": FORMAT_VERSION, "algorithm_name": type(self).__name__}

    @classmethod
    def load(  # type: ignore[override]
        cls,
        path: Any,
        env: Any = None,
        device: str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trust_pickled_code: bool = False,
        **kwargs: Any,
    ):
        """Load a model saved by :meth:`save` without unpickling anything: attributes are JSON and
        the weights are read with ``torch.load(weights_only=True)``.

        :param custom_objects: values to use instead of the stored ones (SB3's meaning); they also
            stand in for attributes that were saved pickled.
        :param trust_pickled_code: read pickled attributes (checkpoints of format 1, or ones saved with
            custom Python objects). Unpickling runs code stored in the file: only for files you trust.
        :param kwargs: attributes to set after loading (SB3's meaning).
        """
        data, params = read_checkpoint(
            path, cls.__name__, custom_objects, trust_pickled_code, print_system_info
        )
        for old, new in cls.renamed_attributes.items():
            if old in data:
                data.setdefault(new, data.pop(old))
        return cls._from_checkpoint(data, params, env, device, force_reset, kwargs)

    @classmethod
    @abstractmethod
    def _from_checkpoint(
        cls,
        data: dict[str, Any],
        params: dict[str, Any],
        env: Any,
        device: str,
        force_reset: bool,
        kwargs: dict,
    ) -> Any:
        """The model of the decoded attributes ``data`` and tensors ``params`` (``{"policy": ...}``),
        with ``load``'s ``env``, ``device``, ``force_reset`` and attribute overrides ``kwargs``."""

    def get_parameters(self) -> dict[str, dict[str, Any]]:
        """SB3's parameter dict, ``{"policy": {name: float tensor}}``: weights, optimiser moments and
        statistics. PRNG keys and counters are left out (``set_parameters`` keeps the model's own);
        ``save`` stores them too."""
        return {"policy": self.policy.state_dict()}

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: str = "auto") -> None:  # type: ignore[override]
        """SB3's ``set_parameters``; a checkpoint path is read without unpickling (its state alone).
        ``exact_match=False`` accepts a part of the weights: the others keep their values."""
        if isinstance(load_path_or_dict, dict):
            params = {name: self._renamed_weights(tensors) for name, tensors in load_path_or_dict.items()}
            return super().set_parameters(params, exact_match=exact_match, device=device)
        what = safe_io.describe(load_path_or_dict, "the file")
        members = safe_io.read_zip(load_path_or_dict, what)
        if "policy.pth" not in members:
            raise ValueError(f"{what} has no policy weights (no policy.pth in the zip).")
        return self.set_parameters({"policy": state_tensors(members, what)}, exact_match, device)

    def _renamed_weights(self, tensors: Any) -> Any:
        """``tensors`` with the names of older releases' state leaves replaced by today's."""
        if not isinstance(tensors, dict) or not self.renamed_state_leaves:
            return tensors
        return {self.renamed_state_leaves.get(name, name): value for name, value in tensors.items()}

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        return ["policy"], []
