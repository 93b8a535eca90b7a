"""SB3's ``policy_kwargs=dict(net_arch=...)`` as an agent's own MLP width and depth settings.

SB3 sizes an off-policy algorithm's actor and critic with ``net_arch``: a list of hidden widths for
both (``[64, 64]``), or a dict with a list per network (``dict(pi=[...], qf=[...])``; ``vf`` for a
state-value critic, as on-policy algorithms name it). Each agent says where its config takes these
(:class:`NetArchFields`): one hidden width, and a hidden-layer count per network where it has one.
What the config cannot express is refused with the reason: widths that differ inside a network or
between the networks (one width field), a depth the agent fixes, no hidden layer.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

CRITIC_KEYS = ("qf", "vf")  # SB3's names of the critic in a dict net_arch (off-policy, on-policy)


@dataclass(frozen=True)
class NetArchFields:
    """Where an agent's config takes SB3's ``net_arch``."""

    width: str
    """The config field of the hidden width of the actor and the critic."""
    width_sizes: str
    """Which networks that width sizes (said in the docs and errors)."""
    actor_depth: str | None = None
    """The config field of the actor's hidden-layer count; None: the agent fixes it (``fixed_depth``)."""
    critic_depth: str | None = None
    """The config field of the critic's hidden-layer count; None: fixed."""
    fixed_depth: int | None = None
    """Hidden layers of the networks whose depth has no field (the reference's)."""
    own_choices: str = ""
    """The activations and optimiser the agent keeps (named when other policy_kwargs are refused)."""


def net_arch_settings(agent: type, policy_kwargs: dict | None, given: dict[str, Any]) -> dict[str, Any]:
    """The config settings that ``policy_kwargs`` asks of ``agent`` (its ``net_arch_fields``), checked
    against the settings ``given`` to the constructor: a value that differs from both the constructor's
    default and the mapped one is a conflict (ValueError). Empty without ``net_arch``."""
    if not policy_kwargs:
        return {}
    fields: NetArchFields = agent.net_arch_fields  # type: ignore[attr-defined]
    name = getattr(agent, "agent_name", agent.__name__)
    others = sorted(key for key in policy_kwargs if key != "net_arch")
    if others:
        raise ValueError(
            f"{name} takes only net_arch from policy_kwargs, not {others}: its {fields.own_choices} are "
            "the reference's, and everything else is sized by the constructor's own arguments."
        )
    arch = policy_kwargs["net_arch"]
    actor, critic = _actor_and_critic(arch, name)
    settings = _map(actor, critic, fields, name, arch)
    defaults = inspect.signature(agent).parameters
    for field, value in settings.items():
        mine = given.get(field)
        if mine is not None and mine != defaults[field].default and mine != value:
            raise ValueError(
                f"policy_kwargs net_arch={arch!r} sets {field}={value}, but {field}={mine} was given too: "
                "pass one of them."
            )
    return settings


def _actor_and_critic(arch: Any, name: str) -> tuple[list[int], list[int]]:
    """The hidden widths of the actor and of the critic in a list or dict ``net_arch``."""
    if isinstance(arch, (list, tuple)) and not any(isinstance(v, dict) for v in arch):
        widths = _widths(arch, "net_arch", name)
        return widths, widths
    if not isinstance(arch, dict):
        raise ValueError(
            f"net_arch must be a list of hidden widths ([64, 64]) or a dict of them "
            f"(dict(pi=[64, 64], qf=[64, 64])), got {arch!r}."
        )
    unknown = sorted(set(arch) - {"pi", *CRITIC_KEYS})
    if unknown:
        raise ValueError(
            f"net_arch {arch!r}: {unknown} name no network of {name} (pi: actor, qf or vf: critic)."
        )
    critics = [_widths(arch[key], f"net_arch['{key}']", name) for key in CRITIC_KEYS if key in arch]
    if "pi" not in arch or not critics:
        raise ValueError(
            f"net_arch {arch!r} leaves out the {'actor (pi)' if 'pi' not in arch else 'critic (qf or vf)'}, "
            f"which SB3 reads as a network without hidden layers; {name}'s networks have at least one. "
            "Give both, or a list for both."
        )
    if len(critics) == 2 and critics[0] != critics[1]:
        raise ValueError(
            f"net_arch {arch!r}: {name} has one critic; give qf or vf, or the same list for both."
        )
    return _widths(arch["pi"], "net_arch['pi']", name), critics[0]


def _widths(value: Any, where: str, name: str) -> list[int]:
    """A list of positive int widths of one network, all equal (the agents' MLPs have one width)."""
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    ):
        raise ValueError(f"{where} must be a list of positive integer widths, got {value!r}.")
    if not value:
        raise ValueError(
            f"{where} is empty (no hidden layer); {name}'s networks have at least one hidden layer."
        )
    if len(set(value)) > 1:
        raise ValueError(
            f"{where}={list(value)!r} has layers of different widths; {name}'s MLP layers share one width: "
            f"give equal widths, e.g. {[max(value)] * len(value)!r}."
        )
    return list(value)


def _map(actor: list[int], critic: list[int], fields: NetArchFields, name: str, arch: Any) -> dict[str, Any]:
    if actor[0] != critic[0]:
        raise ValueError(
            f"net_arch {arch!r} gives the actor width {actor[0]} and the critic width {critic[0]}; in {name} "
            f"one width ({fields.width}) sizes {fields.width_sizes}: give them the same width."
        )
    settings: dict[str, Any] = {fields.width: actor[0]}
    for network, widths, field in (
        ("actor", actor, fields.actor_depth),
        ("critic", critic, fields.critic_depth),
    ):
        if field is not None:
            settings[field] = len(widths)
        elif len(widths) != fields.fixed_depth:
            raise ValueError(
                f"net_arch {arch!r} gives the {network} {len(widths)} hidden layers; {name}'s have "
                f"{fields.fixed_depth}, as the reference's (no setting changes it): give "
                f"{[widths[0]] * int(fields.fixed_depth or 0)!r}."
            )
    return settings
