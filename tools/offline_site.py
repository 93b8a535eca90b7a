"""A packed site folder for a host without internet access that already has JAX (and PyTorch).

    python tools/offline_site.py --python-version 3.12 --out .offline/site.tgz
    python tools/offline_site.py --python-version 3.12 --extras dmc --out .offline/site.tgz

Accelerator hosts often come with JAX, flax, optax and PyTorch for their own devices and no route to
a package index. This downloads the wheels of the package's other dependencies (Gymnasium,
Stable-Baselines3, ...; with ``--extras dmc`` also dm_control through shimmy, MuJoCo and their needs)
for the host's Python and platform, unpacks them into one folder, drops the parts the package never
loads (dm_control's locomotion and manipulation assets, the dog model, MuJoCo's experimental viewer,
tests) and packs the rest as one ``.tgz``: 14 MiB for Python 3.12 with dm_control, from 84 MiB of wheels. On
the host:

    mkdir -p /tmp/site && tar -xzf .offline/site.tgz -C /tmp/site
    export PYTHONPATH=/tmp/site:$PWD MUJOCO_GL=egl
    python benchmarks/tdmpc2_learning.py --task cartpole-balance --seeds 0 1 2

The host's own jax, flax and optax are used (``--with-jax-stack`` packs flax and optax too, for a
host whose versions are outside the package's range), and its scientific stack as an ML image has it:
numpy, scipy, tqdm, rich, tensorboard, filelock, and for dm_control lxml, absl-py, protobuf,
pyparsing, requests, setuptools, etils, attrs, wrapt, imageio and pillow; ``--also NAME==VERSION ...``
packs any of them a host lacks. Versions are those of ``pyproject.toml``'s tested list. Checked: a
venv with only the packages above and the site unpacked makes dm_control's cartpole from states and
from 64 x 64 pixels (EGL) and builds a TDMPC2 on reacher-easy.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

BASE = [
    "gymnasium==1.4.0",
    "farama-notifications==0.0.6",
    "stable-baselines3==2.9.2",
    "cloudpickle==3.1.3",
]
EXTRAS = {
    "dmc": [
        "shimmy==2.0.1",
        "dm-control==1.0.50",
        "mujoco==3.17.0",
        "dm-env==1.6",
        "dm-tree==0.1.10",
        "pyopengl==3.1.10",
        "glfw==2.11.0",
    ],
}
JAX_STACK = ["flax==0.12.8", "optax==0.2.8"]
STRIP = [
    "dm_control/suite/dog_assets",
    "dm_control/mujoco/testing",
    "dm_control/mjcf/test_assets",
    "dm_control/blender",
    "dm_control/suite/all_domains.png",
    "mujoco/experimental",
    "mujoco/include",
]
"""Paths (inside the unpacked site) the package never loads: the suite's domains other than dog read
only their own XML; the viewer is a separate entry point."""
STRIP_DATA = ["dm_control/locomotion", "dm_control/manipulation"]
"""Folders whose Python modules stay (shimmy imports them to register their envs) and whose models,
meshes and textures go: only those envs, which the package does not make, would read them."""
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def download(packages: list[str], python_version: str, into: Path) -> list[Path]:
    """The wheels of ``packages`` (no dependencies resolved: the lists above are complete) for
    CPython ``python_version`` on x86-64 Linux."""
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(into)]
    subprocess.run([*command, *packages], check=True)
    return sorted(into.glob("*.whl"))


def unpack(wheels: list[Path], site: Path) -> None:
    """Unzip every wheel into ``site`` (a wheel is a zip of its site-packages files) and drop STRIP."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    for relative in STRIP:
        path = site / relative
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for relative in STRIP_DATA:
        for path in (site / relative).rglob("*"):
            if path.is_file() and path.suffix != ".py":
                path.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", required=True, help="the host's Python, e.g. 3.12")
    parser.add_argument("--extras", nargs="*", default=[], choices=sorted(EXTRAS))
    parser.add_argument("--with-jax-stack", action="store_true", help="pack flax and optax too")
    parser.add_argument("--also", nargs="*", default=[], help="more packages, as NAME==VERSION")
    parser.add_argument("--out", type=Path, required=True, help="the .tgz to write")
    args = parser.parse_args(argv)
    packages = BASE + [p for extra in args.extras for p in EXTRAS[extra]]
    packages += (JAX_STACK if args.with_jax_stack else []) + args.also
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(packages, args.python_version, Path(tmp) / "wheels")
        wheel_mb = sum(wheel.stat().st_size for wheel in wheels) / 2**20
        site = Path(tmp) / "site"
        unpack(wheels, site)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            for path in sorted(site.iterdir()):
                archive.add(path, arcname=path.name)
        partial.replace(args.out)
    packed_mb = args.out.stat().st_size / 2**20
    print(f"{args.out}: {packed_mb:.1f} MiB from {len(wheels)} wheels ({wheel_mb:.1f} MiB)")


if __name__ == "__main__":
    main()
