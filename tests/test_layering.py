"""The package's layering, read from every module's import statements (nothing is imported).

- ``blocks`` (math, layers, optimisers) imports nothing else of the package;
- ``envs`` (environment families and wrappers) imports nothing else of the package;
- ``common`` (the SB3 shell) knows no agent, no offline data and not the zoo; of ``envs`` it uses
  only the family-agnostic parts (wrappers, id registration), except the modules that keep the old
  import paths of the env families for users (``common/envs.py``, ``atari.py``, ``crafter.py``);
- ``data`` (offline episodes and task pools) knows no agent, no env and not the zoo; of ``common``
  it uses only the pickle-free file formats (``safe_io``);
- the agents never import each other, and each agent's config, networks and pure core (``agent``,
  ``losses``, ``rollouts``) import nothing from ``common``;
- only the zoo imports the zoo.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sb3_worldmodels"
AGENTS = ("dreamerv3", "tdmpc2")
PURE_MODULES = ("config", "networks", "agent", "losses", "rollouts")
ENVS_FOR_THE_SHELL = ("sb3_worldmodels.envs.wrappers", "sb3_worldmodels.envs.registration")
OLD_ENV_PATHS = (
    "sb3_worldmodels.common.envs",
    "sb3_worldmodels.common.atari",
    "sb3_worldmodels.common.crafter",
)
DATA_USES_OF_COMMON = ("sb3_worldmodels.common.safe_io",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The package modules ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "sb3_worldmodels"}


MODULES = sorted(PACKAGE.rglob("*.py"))


def layer(name: str) -> str:
    """The top-level part of the package a module belongs to ('' for the package's __init__)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def within(target: str, modules: tuple[str, ...]) -> bool:
    """Whether ``target`` is one of ``modules`` or a name inside one."""
    return any(target == module or target.startswith(f"{module}.") for module in modules)


def violations(path: Path) -> list[str]:
    name = module_name(path)
    own = layer(name)
    found = []
    for target in sorted(imported_modules(path)):
        other = layer(target)
        if other in ("", own):
            continue
        if own in ("blocks", "envs"):
            found.append(f"{own} imports {target}")
        if own == "common" and other in (*AGENTS, "zoo", "data"):
            found.append(f"common imports {target}")
        if (
            own == "common"
            and other == "envs"
            and name not in OLD_ENV_PATHS
            and not within(target, ENVS_FOR_THE_SHELL)
        ):
            found.append(f"common imports an env family ({target})")
        if own == "data" and other in (*AGENTS, "zoo", "envs"):
            found.append(f"data imports {target}")
        if own == "data" and other == "common" and not within(target, DATA_USES_OF_COMMON):
            found.append(f"data imports the shell ({target})")
        if own in AGENTS and other in AGENTS:
            found.append(f"{own} imports the other agent ({target})")
        if own in AGENTS and name.rpartition(".")[2] in PURE_MODULES and other == "common":
            found.append(f"the pure {name} imports the shell ({target})")
        if other == "zoo":
            found.append(f"{name} imports the zoo ({target})")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_module_respects_the_layering(path):
    assert violations(path) == []


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """A module that breaks the rules is reported (the test above can fail)."""
    fake = PACKAGE / "tdmpc2" / "networks.py"
    text = "from sb3_worldmodels.common.base import WorldModelAlgorithm\nfrom ..dreamerv3 import agent\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text)
    assert violations(fake) == [
        "the pure sb3_worldmodels.tdmpc2.networks imports the shell (sb3_worldmodels.common.base)",
        "the pure sb3_worldmodels.tdmpc2.networks imports the shell "
        "(sb3_worldmodels.common.base.WorldModelAlgorithm)",
        "tdmpc2 imports the other agent (sb3_worldmodels.dreamerv3)",
        "tdmpc2 imports the other agent (sb3_worldmodels.dreamerv3.agent)",
    ]


def test_the_checker_sees_the_shell_reach_for_an_env_family_or_data(monkeypatch):
    """The shell may use the generic wrappers, not a family or the offline data; data may use the
    file formats, not the shell's other modules or an agent."""
    text = (
        "from sb3_worldmodels.envs.wrappers import ActionRepeat\n"
        "from sb3_worldmodels.envs import dmc\n"
        "from sb3_worldmodels.data.pool import TaskPool\n"
    )
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text)
    assert violations(PACKAGE / "common" / "base.py") == [
        "common imports sb3_worldmodels.data.pool",
        "common imports sb3_worldmodels.data.pool.TaskPool",
        "common imports an env family (sb3_worldmodels.envs)",
        "common imports an env family (sb3_worldmodels.envs.dmc)",
    ]
    assert violations(PACKAGE / "common" / "envs.py") == [
        "common imports sb3_worldmodels.data.pool",
        "common imports sb3_worldmodels.data.pool.TaskPool",
    ]
    text = (
        "from sb3_worldmodels.common.safe_io import load_tensordict\n"
        "from sb3_worldmodels.common.base import WorldModelAlgorithm\n"
        "import sb3_worldmodels.tdmpc2.config\n"
    )
    assert violations(PACKAGE / "data" / "pool.py") == [
        "data imports the shell (sb3_worldmodels.common.base)",
        "data imports the shell (sb3_worldmodels.common.base.WorldModelAlgorithm)",
        "data imports sb3_worldmodels.tdmpc2.config",
    ]
