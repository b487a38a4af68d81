"""Joining the bundled Whisper base parts into the cache: checksum, idempotence, races."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from voxgate.engines.asr import _model_files as model_files
from voxgate.engines.asr._model_files import ModelFilesError, join_base_model, resolve_model_dir

pytestmark = [pytest.mark.unit]


def make_parts(root: Path, a: bytes = b"A" * 1000, b: bytes = b"B" * 777) -> tuple[Path, Path, str]:
    p1, p2 = root / "p1" / "data", root / "p2" / "data"
    p1.mkdir(parents=True)
    p2.mkdir(parents=True)
    (p1 / "model.bin.part1").write_bytes(a)
    (p2 / "model.bin.part2").write_bytes(b)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (p1 / name).write_text(f"{name} contents")
    return p1, p2, hashlib.sha256(a + b).hexdigest()


def test_join_concatenates_verifies_and_copies_small_files(tmp_path: Path) -> None:
    p1, p2, digest = make_parts(tmp_path)
    out = join_base_model(tmp_path / "cache", (p1, p2), digest)
    assert out == tmp_path / "cache" / "whisper-base"
    assert (out / "model.bin").read_bytes() == b"A" * 1000 + b"B" * 777
    assert (out / "tokenizer.json").read_text() == "tokenizer.json contents"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]


def test_join_is_idempotent(tmp_path: Path) -> None:
    p1, p2, digest = make_parts(tmp_path)
    out = join_base_model(tmp_path / "c", (p1, p2), digest)
    before = (out / "model.bin").stat().st_mtime_ns
    (p1 / "model.bin.part1").write_bytes(b"Z" * 1000)  # would fail the checksum if re-joined
    assert join_base_model(tmp_path / "c", (p1, p2), digest) == out
    assert (out / "model.bin").stat().st_mtime_ns == before


def test_checksum_mismatch_raises_and_leaves_nothing(tmp_path: Path) -> None:
    p1, p2, _ = make_parts(tmp_path)
    with pytest.raises(ModelFilesError, match=r"sha256 .* expected 0{64}.*reinstall"):
        join_base_model(tmp_path / "c", (p1, p2), "0" * 64)
    leftovers = [p.name for p in (tmp_path / "c" / "whisper-base").iterdir()]
    assert "model.bin" not in leftovers
    assert not [n for n in leftovers if n.startswith(".")]  # no temp files left behind


def test_missing_part_is_a_clear_error(tmp_path: Path) -> None:
    p1, p2, digest = make_parts(tmp_path)
    (p2 / "model.bin.part2").unlink()
    with pytest.raises(ModelFilesError, match="model.bin.part2"):
        join_base_model(tmp_path / "c", (p1, p2), digest)


def test_concurrent_joins_all_succeed(tmp_path: Path) -> None:
    p1, p2, digest = make_parts(tmp_path, b"x" * 300_000, b"y" * 200_000)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            join_base_model(tmp_path / "c", (p1, p2), digest)
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    out = tmp_path / "c" / "whisper-base"
    assert hashlib.sha256((out / "model.bin").read_bytes()).hexdigest() == digest
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_cache_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXGATE_CACHE_DIR", str(tmp_path / "vc"))
    assert model_files.default_cache_dir() == tmp_path / "vc" / "models"
    monkeypatch.delenv("VOXGATE_CACHE_DIR")
    assert model_files.default_cache_dir() == Path.home() / ".cache" / "voxgate" / "models"


def test_resolve_directory_and_unknown_names(tmp_path: Path) -> None:
    d = tmp_path / "large-v3"
    d.mkdir()
    with pytest.raises(ModelFilesError, match="missing model.bin"):
        resolve_model_dir(str(d))
    for name in ("model.bin", "config.json", "tokenizer.json"):
        (d / name).write_text("x")
    assert resolve_model_dir(str(d)) == d
    with pytest.raises(ModelFilesError, match="neither a bundled name"):
        resolve_model_dir(str(tmp_path / "nope"))


def test_real_bundled_parts_join_to_the_published_checksum(tmp_path: Path) -> None:
    out = resolve_model_dir("base", cache_dir=tmp_path)
    h = hashlib.sha256((out / "model.bin").read_bytes()).hexdigest()
    assert h == model_files.BASE_MODEL_SHA256
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
