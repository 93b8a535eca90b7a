"""Registering the Gymnasium ids of an env family when an id of its namespace is first named.

The shell calls :func:`register_namespace` for every env id it is given, so that e.g.
``DreamerV3("MlpPolicy", "dm_control/walker-walk-v0")`` works without the user importing shimmy,
while the shell itself names no env family.
"""

from __future__ import annotations


def register_namespace(env_id: str) -> None:
    """Register the ids of ``env_id``'s namespace where it belongs to an env family of this package
    (``dm_control/...``: imports shimmy, or raises an ImportError naming the ``dmc`` extra); any
    other id is left to Gymnasium's registry."""
    if env_id.startswith("dm_control/"):
        from sb3_worldmodels.envs.dmc import register_dm_control

        register_dm_control()
