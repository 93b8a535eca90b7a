"""tools/mesa_bundle.py: the packed Mesa renders MuJoCo's images from its own folder, as the system's."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))

import mesa_bundle  # noqa: E402

RENDER = """
import os, sys
import numpy as np
from dm_control import suite
env = suite.load("cartpole", "balance", task_kwargs={"random": 0})
env.reset()
np.save(sys.argv[1], env.physics.render(64, 64, camera_id=0))
print("\\n".join(line.split()[-1] for line in open(f"/proc/{os.getpid()}/maps") if "libEGL_mesa" in line))
"""


def test_the_bundle_renders_from_its_own_folder_as_the_system_does(tmp_path):
    pytest.importorskip("dm_control")
    try:
        loaded = mesa_bundle.loaded_libraries()
        libraries = mesa_bundle.mesa_libraries(loaded)
    except RuntimeError as error:
        pytest.skip(f"no Mesa EGL on this machine: {str(error).splitlines()[0]}")
    names = {path.name for path in libraries}
    assert any(n.startswith("libEGL_mesa") for n in names) and "swrast_dri.so" in names
    assert not any(n.startswith(("libc.so", "libstdc++", "ld-linux")) for n in names)
    archive = tmp_path / "mesa.txz"
    assert mesa_bundle.pack(libraries, archive, level=0) == archive.stat().st_size
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "mesa", filter="tar")
    folder = tmp_path / "mesa"
    assert (folder / "lib" / "libEGL_mesa.so.0").is_symlink()  # the name libEGL.so's vendor file asks for

    script = tmp_path / "render.py"
    script.write_text(RENDER)
    system = subprocess.run(
        ["bash", "-c", f'MUJOCO_GL=egl "{sys.executable}" {script} {tmp_path / "system.npy"}'],
        capture_output=True,
        text=True,
        check=True,
    )
    bundled = subprocess.run(
        ["bash", "-c", f'. {folder}/env.sh && "{sys.executable}" {script} {tmp_path / "bundled.npy"}'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(folder) not in system.stdout
    assert bundled.stdout.split() and all(line.startswith(str(folder)) for line in bundled.stdout.split())
    import numpy as np

    np.testing.assert_array_equal(np.load(tmp_path / "bundled.npy"), np.load(tmp_path / "system.npy"))
