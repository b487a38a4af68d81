"""Put an adapted model into a models directory so that no server ever sees half of it.

The gateway (``voxgate serve --models-dir``) serves every subdirectory of the models directory
that holds ``model.bin``, ``config.json`` and ``tokenizer.json`` and whose name does not start
with ".". So the model is written to ``<models_dir>/.<name>.partial-<random>/``, which the server
ignores, then loaded with CTranslate2 through the serving engine and made to decode one clip,
and only then renamed to ``<models_dir>/<name>/`` (a rename within one file system is atomic).
A crash or an interrupt at any point leaves either no model or a hidden partial directory, never
a broken model where the server would load it. ``voxgate-model.json`` records where the model
came from and the sha256 of its ``model.bin``, which the server checks at load.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# Re-exported: the pipeline writes the digest the gateway's scan checks, with the same helper.
from voxgate.engines.asr._model_files import META_FILE, sha256_file

__all__ = [
    "META_FILE",
    "ModelNameError",
    "PublishError",
    "check_name",
    "publish",
    "sha256_file",
    "verify_model_dir",
]

META_FORMAT = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The bundled models and the names the gateway gives them (the default model's name is not
#: available to the models directory): an adapted model may not shadow them.
_RESERVED = frozenset({"base", "tiny.en", "default", "whisper-base", "whisper-tiny.en"})


class PublishError(RuntimeError):
    """The model cannot be written or did not pass verification; nothing was published."""


class ModelNameError(PublishError):
    """The requested model name is malformed, reserved or taken (the user's to change)."""


def check_name(name: str, models_dir: Path) -> Path:
    """Validate a model name and return where the model will live.

    Checked before training starts so that an hour of training never ends in a refusal.

    Raises:
        ModelNameError: the name is not a plain identifier, is reserved, or is taken.
    """
    if not _NAME.fullmatch(name):
        raise ModelNameError(
            f"--name {name[:64]!r} is not a model name: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if name in _RESERVED:
        raise ModelNameError(f"--name {name!r} is reserved for the bundled models; pick another")
    target = models_dir / name
    if target.exists():
        raise ModelNameError(
            f"{target} already exists; pick another --name or remove the old model first"
        )
    return target


def verify_model_dir(model_dir: Path, audio: npt.NDArray[np.float32]) -> str:
    """Load ``model_dir`` as the gateway does and transcribe ``audio``; return the text.

    The check :func:`publish` runs when there is nothing to score: CTranslate2 reads the file,
    the tokenizer loads, and one clip goes through ``infer_batch`` as a call's would.

    Raises:
        PublishError: the model does not load or the decode fails.
    """
    from voxgate.engines.asr._whisper import WhisperEngine
    from voxgate.engines.asr.base import AsrOptions, AsrRequest
    from voxgate.engines.base import UtteranceStats

    try:
        engine = WhisperEngine.load({"model": str(model_dir), "cpu_threads": 2})
        try:
            n = len(audio)
            ms = n * 1000 // 16000
            stats = UtteranceStats(ms, ms, 1.0, 0, 0, -20.0, -20.0, -10.0)
            (res,) = engine.infer_batch([AsrRequest(audio, stats, AsrOptions(language="en"))])
        finally:
            engine.close()
    except Exception as e:  # the file we just wrote is at fault, whatever CTranslate2 raised
        raise PublishError(f"the written model in {model_dir} failed to load or decode: {e}") from e
    return str(res.text)


def publish(
    models_dir: Path,
    name: str,
    *,
    write: Callable[[Path], object],
    meta: Mapping[str, Any],
    check: Callable[[Path], object],
) -> Path:
    """Write, verify, then rename a model into ``models_dir/name``.

    Args:
        models_dir: the server's models directory (created if missing).
        name: the model name (see :func:`check_name`).
        write: writes a CTranslate2 directory at the path it is given (which does not exist).
        meta: what to record in ``voxgate-model.json`` (``model_bin_sha256`` is added).
        check: loads the written (partial) directory with the serving engine and decodes with
            it, e.g. :func:`verify_model_dir` on one clip, or the scoring of the held-out clips;
            it may add files (the report), which are then in place the moment the model
            appears. Whatever it raises means the model is not published.

    Returns:
        The published directory.

    Raises:
        ModelNameError: the name is taken (also when another run took it meanwhile).
        PublishError: the written model failed ``check``; the partial directory is removed.
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    target = check_name(name, models_dir)
    partial = models_dir / f".{name}.partial-{secrets.token_hex(4)}"
    try:
        write(partial)
        sha = sha256_file(partial / "model.bin")
        record = {
            "format": META_FORMAT,
            "name": name,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            **meta,
            "model_bin_sha256": sha,
        }
        (partial / META_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        try:
            check(partial)
        except PublishError:
            raise
        except Exception as e:  # the model just written is at fault, whatever was raised
            raise PublishError(f"the written model failed verification: {e}") from e
        for f in partial.iterdir():
            os.chmod(f, 0o644)
        os.chmod(partial, 0o755)
        if target.exists():
            raise ModelNameError(f"{target} appeared while training; the new model was not kept")
        os.rename(partial, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(partial)
        raise
    return target
