"""``--write-bundle DIR``: a folder that produces every gpu_check figure on a GPU host offline.

A GPU host lent for a few minutes has Python 3.12 and a CUDA build of PyTorch (the engine under
test needs one, and its wheel with the CUDA libraries is gigabytes) but none of the rest, and no
network. The folder holds:

* ``site.tar.xz``: one compressed archive of the wheels such a host lacks, for CPython 3.12
  on x86-64 Linux, fetched with ``pip download --only-binary=:all: --python-version 3.12
  --platform manylinux_2_28_x86_64`` (plus the older manylinux tags a 2.28 host also installs).
  Which distributions: those of every module the check imports (found by importing it here),
  less this project's own code, the standard library and what comes with torch (its own
  dependencies, numpy); ``av`` is replaced by a stub (faster-whisper imports it at package
  import; the check never decodes an audio file, and its wheel alone is 35 MB). The wheels are
  stored unpacked (a site-packages tree put on ``PYTHONPATH``: no pip needed there);
* ``src/``: the project's source files the check imports (the same list), and the base
  model's tokenizer files the random models are built with;
* ``run.sh``: unpack, then ``python -m benchmarks.gpu_check --device cuda --skip tts`` with the
  host's Python (its torch) under an 8-minute limit; the report lands in ``gpu_check.json``
  beside it, the table on stdout.

The folder must stay within 50 MB (:data:`LIMIT_BYTES`); the writer refuses to finish above it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from benchmarks.gpu_check.common import log

__all__ = ["LIMIT_BYTES", "host_distributions", "write_bundle"]

LIMIT_BYTES = 50 * 1024 * 1024
#: Modules whose import is the check's whole import graph (what the host will run).
ENTRY_MODULES = (
    "benchmarks.gpu_check.__main__",  # what ``python -m`` runs (importing it runs nothing)
    "benchmarks.gpu_check.cli",
    "benchmarks.gpu_check.torch_engine",
    "benchmarks.gpu_check.capacity",
    "benchmarks.gpu_check.models",
    "benchmarks.gpu_check.tts",
    "voxgate.engines.asr",
    "voxgate.engines.asr._torch.engine",
    "voxgate.gateway.scheduling",
    "faster_whisper",
    "ctranslate2.specs",
)
#: What a host with a CUDA build of torch has already: torch, its dependencies, numpy.
ON_HOST = frozenset(
    {
        "torch",
        "triton",
        "numpy",
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
        "filelock",
        "fsspec",
        "typing-extensions",
        "setuptools",
        "pip",
    }
)
#: Imported by a dependency but never used by the check: a stub stands in (see the module doc).
STUBBED = {"av": "faster-whisper imports av at package import; the check decodes no audio file."}
_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "any",
)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def host_distributions() -> tuple[dict[str, str], list[str]]:
    """The distributions (name -> installed version) the host lacks, and our module names.

    Imports :data:`ENTRY_MODULES` here and maps every imported top-level module to the
    distribution that installed it.
    """
    for name in ENTRY_MODULES:
        importlib.import_module(name)
    owners = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    ours = {"voxgate", "voxgate_client", "benchmarks", "tests"}
    wanted: dict[str, str] = {}
    for top in sorted({m.split(".")[0] for m in list(sys.modules)}):
        if top in stdlib or top in ours or top.startswith("_"):
            continue
        for dist in owners.get(top, []):
            key = _norm(dist)
            if key in ON_HOST or key.startswith("nvidia-") or key in STUBBED:
                continue
            if key == "voxgate":
                continue
            wanted[key] = importlib.metadata.version(dist)
    modules = sorted(m for m in list(sys.modules) if m.split(".")[0] in ("voxgate", "benchmarks"))
    return wanted, modules


def _copy_sources(modules: list[str], src: Path) -> int:
    """Copy each module's file under ``src`` by its import path; returns bytes copied."""
    total = 0
    for name in modules:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if not path:
            continue
        parts = name.split(".")
        is_pkg = Path(path).name == "__init__.py"
        target = (
            src.joinpath(*parts, "__init__.py")
            if is_pkg
            else src.joinpath(*parts[:-1], parts[-1] + ".py")
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        total += target.stat().st_size
    # Packages whose __init__ was never imported on its own (namespace-like parents).
    for d in [p for p in src.rglob("*") if p.is_dir()]:
        init = d / "__init__.py"
        if not init.exists():
            init.write_text('"""Bundled for gpu_check."""\n')
    return total


def _tokenizer_files(dest: Path) -> None:
    from benchmarks.gpu_check.models import TokenizerFiles

    files = TokenizerFiles.bundled()
    dest.mkdir(parents=True, exist_ok=True)
    data = files.tokenizer_json.parent
    for name in ("tokenizer.json", "vocabulary.txt", "config.json"):
        shutil.copyfile(data / name, dest / name)


RUN_SH = """#!/usr/bin/env bash
# Every gpu_check figure on this GPU host, offline: the CTranslate2 and PyTorch engines side by
# side (decode steps with and without CUDA graphs at batch 1-256, encoder ms per window,
# processors on vs off, capacity through the real batcher at p95 <= 500 ms). Needs Python 3.12
# with a CUDA build of torch (PYTHON=... to choose it). Extra arguments go to gpu_check.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3.12}"
cd "${here}"
[[ -d site ]] || tar -xJf site.tar.xz
if [[ -z "${GPU_CHECK_ALLOW_CPU:-}" ]]; then  # set it for a CPU dry run (with --device cpu)
    "${python}" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \\
        || { echo "${python} has no CUDA build of torch (set PYTHON=...)" >&2; exit 1; }
fi
# CTranslate2's wheel loads cuBLAS 12 by soname: the copies torch's nvidia-* wheels installed.
nv="$("${python}" - <<'PY' 2>/dev/null || true
import glob, site
dirs = (d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib"))
print(":".join(sorted(dirs)))
PY
)"
export LD_LIBRARY_PATH="${nv}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
path="${here}/src:${here}/site"
PYTHONPATH="${path}" "${python}" -c "import av" 2>/dev/null || path="${path}:${here}/stubs"
export PYTHONPATH="${path}" VOXGATE_GPU_CHECK_TOKENIZER_DIR="${here}/src/tokenizer"
exec timeout --signal=INT --kill-after=20 "${GPU_CHECK_TIMEOUT_S:-480}" \\
    "${python}" -m benchmarks.gpu_check --device cuda --skip tts --budget-s 440 \\
    --out "${here}/gpu_check.json" "$@"
"""


def write_bundle(out: Path) -> int:
    """Write the folder; 0 when it is complete and within :data:`LIMIT_BYTES`, else 1."""
    out = out.expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        log(f"{out} is not empty; choose a new folder")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    wanted, modules = host_distributions()
    log(f"bundle: {len(modules)} source modules, wheels for {sorted(wanted)}")
    source_bytes = _copy_sources(modules, out / "src")
    _tokenizer_files(out / "src" / "tokenizer")
    for name, why in STUBBED.items():
        stub = out / "stubs" / name / "__init__.py"
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text(f'"""Stub: {why}"""\n')
    with tempfile.TemporaryDirectory(prefix="gpu_check_wheels_") as tmp:
        wheels = Path(tmp) / "wheels"
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "--no-deps", "-d", str(wheels),
            *(arg for p in _PLATFORMS for arg in ("--platform", p)),
            *(f"{k}=={v}" for k, v in sorted(wanted.items())),
        ]  # fmt: skip
        log("bundle: " + " ".join(cmd[:12]) + " ...")
        subprocess.run(cmd, check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        names = sorted(p.name for p in wheels.glob("*.whl"))
        # Unpacked (a wheel is a site-packages tree in a zip): xz over the raw files is a
        # third smaller than over the wheels' deflated members (32 vs 54 MB measured), and
        # the host needs no pip, only PYTHONPATH.
        site = Path(tmp) / "site"
        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
        for data in site.glob("*.data"):
            for sub in ("purelib", "platlib"):
                if (data / sub).is_dir():
                    shutil.copytree(data / sub, site, dirs_exist_ok=True)
            shutil.rmtree(data)
        with tarfile.open(out / "site.tar.xz", "w:xz", preset=9) as tar:
            tar.add(site, arcname="site")
    run = out / "run.sh"
    run.write_text(RUN_SH)
    run.chmod(0o755)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    manifest = {
        "wheels": names,
        "assumed_on_host": sorted(ON_HOST) + ["nvidia-* (torch's CUDA libraries)", "python 3.12"],
        "stubbed": STUBBED,
        "source_files": len(modules),
        "source_bytes": source_bytes,
        "archive_bytes": (out / "site.tar.xz").stat().st_size,
        "total_bytes": total,
        "limit_bytes": LIMIT_BYTES,
        "run": "./run.sh  (report: gpu_check.json; table on stdout)",
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    log(f"bundle: {total / 2**20:.1f} MB in {out} ({len(names)} wheels)")
    if total > LIMIT_BYTES:
        log(f"bundle is over {LIMIT_BYTES / 2**20:.0f} MB")
        return 1
    return 0
