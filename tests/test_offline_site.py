"""tools/offline_site.py: the packed site holds every module of the wheels and drops only the data
the package never loads."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from offline_site import STRIP, STRIP_DATA, unpack  # noqa: E402


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_unpack_keeps_modules_and_drops_unused_data(tmp_path: Path) -> None:
    assert "dm_control/suite/dog_assets" in STRIP and "dm_control/locomotion" in STRIP_DATA
    dm_control = make_wheel(
        tmp_path / "dm_control-1.0.50-py3-none-any.whl",
        {
            "dm_control/suite/cartpole.py": "x = 1\n",
            "dm_control/suite/cartpole.xml": "<mujoco/>",
            "dm_control/suite/dog_assets/dog.xml": "<mujoco/>",
            "dm_control/locomotion/walkers/cmu_humanoid.py": "y = 2\n",
            "dm_control/locomotion/walkers/assets/humanoid.xml": "<mujoco/>",
            "dm_control-1.0.50.dist-info/METADATA": "Name: dm-control\n",
        },
    )
    mujoco = make_wheel(
        tmp_path / "mujoco-3.17.0-cp312-cp312-linux_x86_64.whl",
        {
            "mujoco/__init__.py": "",
            "mujoco/experimental/studio/app.py": "",
            "mujoco/libmujoco.so.3.17.0": "elf",
        },
    )
    site = tmp_path / "site"
    unpack([dm_control, mujoco], site)
    kept = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert kept == [
        "dm_control-1.0.50.dist-info/METADATA",
        "dm_control/locomotion/walkers/cmu_humanoid.py",  # shimmy imports it to register its envs
        "dm_control/suite/cartpole.py",
        "dm_control/suite/cartpole.xml",
        "mujoco/__init__.py",
        "mujoco/libmujoco.so.3.17.0",
    ]
