"""What ``pip install .`` puts into site-packages: two top-level packages, whole and importable.

The folders stay where the design card puts them (gateway/, engines/, cli/, ...) and
``protos/voxgate`` links them in under their import names (pyproject's packaging comment).
This builds the real wheel, as pip does for a user, and checks that the links became files,
that no pre-namespace top-level name (gateway, cli, pcmcodec, clients, ...) leaks into
site-packages, and that the installed tree imports on its own, away from the repository. The
client distribution's wheel is checked in test_client_packages.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[1]


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[0] for n in z.namelist() if ".dist-info/" not in n}


def test_server_wheel_installs_voxgate_and_voxgate_client_only(tmp_path: Path) -> None:
    # Built from a copy of what a clean checkout has (links kept as links), so that no build/
    # folder lands in the repository.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(
        "__pycache__", ".mypy_cache", ".pytest_cache", "*.egg-info", "build", ".venv*"
    )
    for name in ("protos", "gateway", "engines", "cli", "adapt", "bridges", "common", "clients"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheel = _wheel(src, tmp_path / "server")
    assert _top_level(wheel) == {"voxgate", "voxgate_client"}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(
            z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")
        )
        # Each linked folder arrives as plain files under its import name, data included.
        for member in (
            "voxgate/v1/voxgate_pb2.py",
            "voxgate/gateway/session.py",
            "voxgate/gateway/data/reference_utterance.wav",
            "voxgate/engines/asr/_whisper.py",
            "voxgate/cli/call.py",
            "voxgate/bridges/sip/_bridge.py",
            "voxgate/bridges/sample_bot.yaml",
            "voxgate/adapt/general_en.txt",
            "voxgate/common/pcm.py",
            "voxgate_client/_common/aio.py",
        ):
            assert member in names, member
            assert z.getinfo(member).file_size > 0, member
    assert "voxgate = voxgate.cli:main" in entry_points

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        + [str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    probe = (
        "import voxgate.gateway.service, voxgate.bridges.sip, voxgate.cli, voxgate_client\n"
        "for m in (voxgate.gateway.service, voxgate.bridges.sip, voxgate.cli, voxgate_client):\n"
        "    print(m.__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,  # not the repository: nothing may come from the source tree
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert len(out) == 4
    assert all(Path(p).resolve().is_relative_to(site.resolve()) for p in out), out
