"""Mesa's software EGL, packed from this machine for a host that renders no MuJoCo images without it.

    python tools/mesa_bundle.py --out .offline/mesa.txz      # where MuJoCo renders with MUJOCO_GL=egl

The pixel checks render dm_control on the host's CPU through EGL. A host without Mesa (the TPU host
has none) and without root to install it can use this machine's: the script renders one MuJoCo frame
with ``MUJOCO_GL=egl`` in a child process, reads from that process's memory map which shared libraries
the render loaded, and packs those of the system's library folder (Mesa's EGL and its ``swrast`` DRI
driver, glvnd's dispatch, LLVM and the rest of what they load) with Mesa's glvnd vendor file and an
``env.sh``. The C and C++ runtimes and the libraries every Linux has are left out: the host's own are
used. Debian 12 (glibc 2.36, Mesa 22.3): 46 MB as .tar.xz. On the host, with the same or a newer
glibc:

    mkdir -p /tmp/mesa && tar -xJf .offline/mesa.txz -C /tmp/mesa && . /tmp/mesa/env.sh
    python benchmarks/tdmpc2_learning.py --task cartpole-balance-pixels --seeds 0 1 2

``env.sh`` puts the folder first on ``LD_LIBRARY_PATH``, points glvnd at Mesa's vendor file
(``__EGL_VENDOR_LIBRARY_FILENAMES``) and Mesa at its DRI driver (``LIBGL_DRIVERS_PATH``), and sets
``MUJOCO_GL=egl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SYSTEM_RUNTIME = (
    "libc.so",
    "libm.so",
    "libdl.so",
    "libpthread.so",
    "librt.so",
    "ld-linux",
    "libgcc_s.so",
    "libstdc++.so",
    "libz.so",
    "libffi.so",
    "libbz2.so",
    "liblzma.so",
    "libcrypto.so",
)
"""Libraries the host has as surely as its Python does, and whose own copies it must keep using."""

PROBE = """
import os
from dm_control import suite
env = suite.load("cartpole", "balance")
env.reset()
assert env.physics.render(64, 64, camera_id=0).std() > 0
print("\\n".join(sorted({line.split()[-1] for line in open(f"/proc/{os.getpid()}/maps") if ".so" in line})))
"""
ENV_SH = """here=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export __EGL_VENDOR_LIBRARY_FILENAMES="$here/50_mesa.json" LIBGL_DRIVERS_PATH="$here/lib/dri" MUJOCO_GL=egl
"""
VENDOR = {"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_mesa.so.0"}}


def loaded_libraries() -> list[Path]:
    """The shared libraries a child process loaded to render one MuJoCo frame through EGL."""
    env = {**os.environ, "MUJOCO_GL": "egl"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            "MuJoCo could not render through EGL here, so there is no Mesa to pack: run this where "
            "`MUJOCO_GL=egl` renders (Debian: apt install libegl-mesa0 libgl1-mesa-dri).\n"
            + done.stderr[-2000:]
        )
    return [Path(line) for line in done.stdout.split()]


def mesa_libraries(loaded: list[Path]) -> list[Path]:
    """Of ``loaded``, those to carry: the system folder's, less the runtimes every host has."""
    egl = [path for path in loaded if path.name.startswith("libEGL_mesa")]
    if not egl:
        raise RuntimeError("The render loaded no libEGL_mesa: this machine's EGL is not Mesa's.")
    system = egl[0].parent
    return [
        path
        for path in loaded
        if system in path.parents and not any(path.name.startswith(name) for name in SYSTEM_RUNTIME)
    ]


def link_names(path: Path) -> list[str]:
    """The names the system gives ``path`` by symbolic links in its folder (its SONAME among them:
    libelf.so.1 for libelf-0.188.so), which the libraries that need it ask for."""
    return sorted(
        link.name
        for link in path.parent.glob(path.name.split(".so")[0].split("-")[0] + "*")
        if link.is_symlink() and link.resolve() == path.resolve() and ".so." in link.name
    )


def pack(libraries: list[Path], out: Path, level: int = 9) -> int:
    """Write ``out`` (.tar.xz): lib/ (and lib/dri/) with each library under its file name and the
    system's link names for it, 50_mesa.json and env.sh. Returns the archive's size in bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "lib" / "dri").mkdir(parents=True)
        for path in libraries:
            folder = root / "lib" / ("dri" if path.parent.name == "dri" else "")
            shutil.copy2(path, folder / path.name)
            for name in link_names(path):
                if not (folder / name).exists():
                    (folder / name).symlink_to(path.name)
        (root / "50_mesa.json").write_text(json.dumps(VENDOR, indent=1))
        (root / "env.sh").write_text(ENV_SH)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz", preset=level) as tar:
            for item in sorted(root.iterdir()):
                tar.add(item, arcname=item.name)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the .tar.xz to write")
    args = parser.parse_args(argv)
    libraries = mesa_libraries(loaded_libraries())
    size = pack(libraries, args.out)
    print(f"{args.out}: {size / 2**20:.1f} MiB, {len(libraries)} libraries")


if __name__ == "__main__":
    main()
