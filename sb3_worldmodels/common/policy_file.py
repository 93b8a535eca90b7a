"""A policy saved alone, for deployment: SB3's ``model.policy.save(path)`` and ``Policy.load(path)``.

The file is a zip, written atomically (:func:`~sb3_worldmodels.common.safe_io.write_atomically`):
``data``, a JSON object with the format's name and version, the algorithm's name and the attributes
that rebuild its networks (the config settings, spaces, ``policy_kwargs``, seed) as
:func:`~sb3_worldmodels.common.safe_io.encode` values, and ``policy.pth``, the acting parameters as
float tensors. It holds no replay and no optimiser state, and reading it runs no code: the JSON
decoder builds a closed set of types, the tensors are read with ``weights_only=True``, and the
algorithm is looked up by name among the package's own.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.checkpoints import STATE_PREFIX, checkpoint_header

POLICY_FORMAT = "sb3_worldmodels.policy"
POLICY_FORMAT_VERSION = 1
ACTING_STATE = STATE_PREFIX + "['agent'].params"
"""The key prefix of the acting parameters among the state's tensors (the agent core's ``params``)."""
POLICY_ATTRIBUTES = ("observation_space", "action_space", "action_repeat", "seed", "policy_kwargs")
"""The attributes a policy file stores besides the algorithm's hyperparameters."""

_ALGORITHMS: dict[str, Any] = {}  # class name -> algorithm class that writes policy files


def write_policy_file(path: Any, algorithm: str, attributes: dict[str, Any], tensors: dict[str, Any]) -> None:
    """Write a policy file (a path, atomically and as named, or a binary file object)."""
    header = {
        "format": POLICY_FORMAT,
        "version": POLICY_FORMAT_VERSION,
        "algorithm_name": algorithm,
        "attributes": {key: safe_io.encode(value) for key, value in attributes.items()},
    }
    members = {"data": json.dumps(header, indent=2).encode(), "policy.pth": safe_io.tensors_to_bytes(tensors)}
    if not isinstance(path, (str, os.PathLike)):
        safe_io.write_zip(path, members)
        return
    safe_io.write_atomically(path, lambda tmp: safe_io.write_zip(tmp, members))


def read_policy_file(path: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(the algorithm class, its decoded attributes, the acting tensors) of a policy file; a file of
    another kind, a newer format, an unknown algorithm or a pickled value is refused (ValueError)."""
    what = safe_io.describe(path, "the policy file")
    members = safe_io.read_zip(path, what)
    header = checkpoint_header(members["data"], what) if "data" in members else {}
    if header.get("format") != POLICY_FORMAT or "policy.pth" not in members:
        model = " (a model checkpoint: Algo.load(path).policy)" if "algorithm_name" in header else ""
        raise ValueError(f"{what} is not a policy file written by model.policy.save(){model}.")
    version = header.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version > POLICY_FORMAT_VERSION:
        raise ValueError(
            f"{what} has policy format {version!r}; this sb3_worldmodels reads format "
            f"{POLICY_FORMAT_VERSION} and older: upgrade sb3_worldmodels to load it."
        )
    algorithm = _ALGORITHMS.get(header.get("algorithm_name"))  # type: ignore[arg-type]
    if algorithm is None:
        raise ValueError(
            f"{what} was saved by {header.get('algorithm_name')!r}, not one of {sorted(_ALGORITHMS)}."
        )
    stored = header.get("attributes")
    if not isinstance(stored, dict):
        raise ValueError(f"{what}: its attributes are not a JSON object.")
    attributes = safe_io.decode_attributes(stored, what, None, trust_pickled_code=False)
    tensors = safe_io.load_tensors(members["policy.pth"], f"{what} (policy.pth)")
    if not isinstance(tensors, dict):
        raise ValueError(f"{what}: policy.pth does not hold a dict of tensors.")
    return algorithm, attributes, tensors


class PolicyFiles:
    """The algorithm side of policy files: what ``model.policy.save`` writes and how ``load`` rebuilds
    the policy (a model without env or replay, whose ``policy`` acts as the saved one)."""

    policy: Any
    hyperparameter_names: Any
    policy_aliases: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _ALGORITHMS[cls.__name__] = cls

    def _policy_file_contents(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(algorithm name, attributes, acting tensors) for :func:`write_policy_file`."""
        names = (*self.hyperparameter_names(), *POLICY_ATTRIBUTES)
        attributes = {name: getattr(self, name) for name in names if hasattr(self, name)}
        tensors = {k: v for k, v in self.policy.state_dict().items() if k.startswith(ACTING_STATE)}
        return type(self).__name__, attributes, tensors

    @classmethod
    def _from_policy_file(cls, attributes: dict[str, Any], tensors: dict[str, Any]) -> Any:
        """The policy of a model built from a policy file's attributes, with its acting tensors."""
        model: Any = cls(policy=cls.policy_aliases["MlpPolicy"], env=None, _init_setup_model=False)  # type: ignore[call-arg]
        model.__dict__.update(attributes)
        model._setup_model()
        expected = {k for k in model.policy.state_dict() if k.startswith(ACTING_STATE)}
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise RuntimeError(
                f"The policy file's parameters do not fit {cls.__name__}'s networks: missing {missing[:3]}, "
                f"unexpected {extra[:3]}."
            )
        model.policy.load_state_dict(tensors, strict=False)
        return model.policy
