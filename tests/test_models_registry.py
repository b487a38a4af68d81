"""The named-model registry's logic with a fake loader (no model): scan, load race, rescans.

The real model path (a grpc.aio server, the bundled Whisper base under other names) is in
tests/test_models_serving.py; here the loader is a fake so that the orderings of loads,
releases and rescans can be forced exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import UtteranceStats
from voxgate.gateway.base import ModelDescription
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.models import (
    META_FILE,
    LoadedModel,
    ModelEntry,
    ModelLease,
    ModelRegistry,
    model_name_of,
    scan_models_dir,
)
from voxgate.gateway.runtime import ModelRouter

pytestmark = pytest.mark.unit


def make_model(root: Path, name: str, payload: bytes = b"weights", **meta: Any) -> Path:
    """A directory that passes the scan (the files' contents are never parsed here)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(payload)
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    if meta:
        (d / META_FILE).write_text(json.dumps(meta))
    return d


class FakeAsrEngine:
    """A stand-in engine that answers with its model's name (named as a fake: no decoding)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.siblings = 0

    def sibling(self) -> FakeAsrEngine:
        self.siblings += 1
        return FakeAsrEngine(self.name)

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        return (len(self.name),)

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        return [AsrResult(text=self.name) for _ in items]


def default_model() -> LoadedModel:
    desc = ModelDescription(name="whisper-base", family="whisper", languages=("en", "de"))
    return LoadedModel(name="whisper-base", description=desc, engine=FakeAsrEngine("base"))


class FakeLoader:
    """Counts loads; can hold them on an event or fail them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.fail: set[str] = set()

    def __call__(self, entry: ModelEntry) -> LoadedModel:
        self.calls.append(entry.name)
        assert self.release.wait(10)
        if entry.name in self.fail:
            raise RuntimeError("model.bin is truncated")
        desc = ModelDescription(name="ignored", family="whisper", languages=("en",))
        return LoadedModel(name=entry.name, description=desc, engine=FakeAsrEngine(entry.name))


def test_scan_serves_complete_directories_and_says_why_it_refuses_the_rest(
    tmp_path: Path,
) -> None:
    make_model(tmp_path, "support")
    good = b"the real weights"
    make_model(tmp_path, "checked", good, model_bin_sha256=hashlib.sha256(good).hexdigest())
    make_model(tmp_path, "tampered", b"other bytes", model_bin_sha256="0" * 64)
    make_model(tmp_path, ".support-v2.partial-3f2a")  # being written: never served or named
    broken = make_model(tmp_path, "no-tokenizer")
    (broken / "tokenizer.json").unlink()
    make_model(tmp_path, "bad meta")
    make_model(tmp_path, "whisper-base")
    (make_model(tmp_path, "json") / META_FILE).write_text("{not json")
    (tmp_path / "notes.txt").write_text("a file, not a model")

    result = scan_models_dir(tmp_path, reserved={"whisper-base"})

    assert list(result.entries) == ["checked", "support"]
    assert result.entries["support"].path == tmp_path / "support"
    assert set(result.refused) == {"tampered", "no-tokenizer", "bad meta", "whisper-base", "json"}
    assert "missing tokenizer.json" in result.refused["no-tokenizer"]
    assert "sha256" in result.refused["tampered"]
    assert "copy the model again" in result.refused["tampered"]
    assert "letters, digits" in result.refused["bad meta"]
    assert "default model" in result.refused["whisper-base"]
    assert META_FILE in result.refused["json"]
    assert not any(".partial" in name for name in result.refused)


def test_scan_hashes_an_unchanged_model_once(tmp_path: Path) -> None:
    payload = b"w" * 1000
    make_model(tmp_path, "a", payload, model_bin_sha256=hashlib.sha256(payload).hexdigest())
    cache: dict[tuple[int, int, int, int], str] = {}
    assert list(scan_models_dir(tmp_path, sha_cache=cache).entries) == ["a"]
    assert len(cache) == 1
    # A cached digest that disagrees proves the second scan read the cache, not the file.
    (key,) = cache
    cache[key] = "f" * 64
    assert "a" in scan_models_dir(tmp_path, sha_cache=cache).refused


def test_scan_of_a_missing_directory_is_empty_with_a_reason(tmp_path: Path) -> None:
    result = scan_models_dir(tmp_path / "absent")
    assert result.entries == {}
    assert "cannot read asr.models_dir" in result.refused[""]


async def test_concurrent_first_calls_share_one_load(tmp_path: Path) -> None:
    make_model(tmp_path, "support")
    loader = FakeLoader()
    loader.release.clear()
    changes: list[int] = []
    registry = ModelRegistry(default_model(), tmp_path, loader, on_change=lambda: changes.append(1))
    await registry.rescan()
    assert [(d.name, d.loaded) for d in registry.descriptions()] == [
        ("whisper-base", True),
        ("support", False),
    ]
    waiters = [asyncio.create_task(registry.acquire("support")) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)  # every first call waits for the load
    loader.release.set()
    leases = await asyncio.gather(*waiters)
    assert loader.calls == ["support"]
    assert len({lease.key for lease in leases}) == 1
    assert model_name_of(leases[0].key) == "support"
    assert leases[0].description.name == "support"  # the directory's name, not the loader's
    assert [(d.name, d.loaded) for d in registry.descriptions()][1] == ("support", True)
    assert registry.is_loaded("support")
    assert changes  # ListModels and health were told
    for lease in leases:
        lease.release()
    assert registry.model(leases[0].key) is not None  # still offered: stays in memory


async def test_a_caller_that_leaves_mid_load_does_not_cancel_it_for_the_others(
    tmp_path: Path,
) -> None:
    make_model(tmp_path, "support")
    loader = FakeLoader()
    loader.release.clear()
    registry = ModelRegistry(default_model(), tmp_path, loader)
    await registry.rescan()
    leaving = asyncio.create_task(registry.acquire("support"))
    staying = asyncio.create_task(registry.acquire("support"))
    await asyncio.sleep(0.05)
    leaving.cancel()
    loader.release.set()
    lease = await staying
    assert leaving.cancelled()
    assert loader.calls == ["support"]
    lease.release()


async def test_a_failed_load_fails_its_calls_clearly_until_the_files_change(
    tmp_path: Path,
) -> None:
    model_dir = make_model(tmp_path, "broken")
    loader = FakeLoader()
    loader.fail.add("broken")
    outcomes: list[tuple[str, str]] = []
    registry = ModelRegistry(
        default_model(), tmp_path, loader, on_load=lambda n, o: outcomes.append((n, o))
    )
    await registry.rescan()
    results = await asyncio.gather(
        *(registry.acquire("broken") for _ in range(3)), return_exceptions=True
    )
    for exc in results:
        assert isinstance(exc, CallError)
        assert exc.kind is ErrorKind.FAILED_PRECONDITION
        assert "'broken'" in exc.message and "truncated" in exc.message
        assert "SIGHUP" in exc.message
    assert loader.calls == ["broken"] and outcomes == [("broken", "failed")]
    assert registry.health() == {"whisper-base": True, "broken": False}
    # The default model is untouched by another model's failure.
    assert (await registry.acquire("")).key == ""
    # Same files: a rescan does not retry (the next call fails at once, no second load).
    await registry.rescan()
    with pytest.raises(CallError) as again:
        await registry.acquire("broken")
    assert again.value.kind is ErrorKind.FAILED_PRECONDITION
    assert loader.calls == ["broken"]
    # Fixed files (new model.bin): the rescan clears the failure and the next call loads.
    loader.fail.clear()
    (model_dir / "model.bin").write_bytes(b"fixed weights")
    os.utime(model_dir / "model.bin", ns=(1, 10**18))
    await registry.rescan()
    assert registry.health()["broken"]
    lease = await registry.acquire("broken")
    assert loader.calls == ["broken", "broken"]
    lease.release()


async def test_unknown_names_are_invalid_and_the_message_is_bounded(tmp_path: Path) -> None:
    make_model(tmp_path, "support")
    registry = ModelRegistry(default_model(), tmp_path, FakeLoader())
    await registry.rescan()
    with pytest.raises(CallError) as err:
        await registry.acquire("x" * 5000)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert len(err.value.message) < 300
    assert "ListModels has whisper-base, support" in err.value.message
    # The default by its listed name and by "" are the same model.
    assert (await registry.acquire("whisper-base")).key == (await registry.acquire("")).key


async def test_a_removed_model_stays_with_the_calls_that_hold_it(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "support")
    registry = ModelRegistry(default_model(), tmp_path, FakeLoader())
    await registry.rescan()
    held = await registry.acquire("support")
    for f in model_dir.iterdir():
        f.unlink()
    model_dir.rmdir()
    await registry.rescan()
    assert registry.names() == ["whisper-base"]
    assert [d.name for d in registry.descriptions()] == ["whisper-base"]
    with pytest.raises(CallError) as err:
        await registry.acquire("support")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert registry.model(held.key) is not None  # the call in progress still decodes on it
    held.release()
    held.release()  # idempotent
    assert registry.model(held.key) is None  # and it leaves memory with its last call


async def test_a_replaced_model_serves_new_calls_from_the_new_files(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "support")
    loader = FakeLoader()
    registry = ModelRegistry(default_model(), tmp_path, loader)
    await registry.rescan()
    old = await registry.acquire("support")
    (model_dir / "model.bin").write_bytes(b"retrained weights")
    os.utime(model_dir / "model.bin", ns=(1, 10**18))
    await registry.rescan()
    assert not registry.is_loaded("support")  # the new files are not in memory yet
    new = await registry.acquire("support")
    assert new.key != old.key and model_name_of(new.key) == model_name_of(old.key)
    assert loader.calls == ["support", "support"]
    assert registry.model(old.key) is not None
    old.release()
    assert registry.model(old.key) is None
    assert registry.model(new.key) is not None
    new.release()


async def removed_while_loading(
    tmp_path: Path,
) -> tuple[ModelRegistry, FakeLoader, asyncio.Task[ModelLease]]:
    """A call waits for model ``support``'s load (held) while a rescan finds it removed."""
    model_dir = make_model(tmp_path, "support")
    loader = FakeLoader()
    loader.release.clear()
    registry = ModelRegistry(default_model(), tmp_path, loader)
    await registry.rescan()
    waiting = asyncio.create_task(registry.acquire("support"))
    await asyncio.sleep(0.05)
    for f in model_dir.iterdir():
        f.unlink()
    model_dir.rmdir()
    await registry.rescan()
    return registry, loader, waiting


async def test_a_model_removed_while_it_loads_serves_its_waiting_calls_then_goes(
    tmp_path: Path,
) -> None:
    registry, loader, waiting = await removed_while_loading(tmp_path)
    loader.release.set()
    lease = await waiting
    assert not registry.is_loaded("support")
    assert registry.model(lease.key) is not None
    lease.release()
    assert registry.model(lease.key) is None


async def test_a_model_removed_while_it_loads_goes_when_its_waiting_call_hung_up(
    tmp_path: Path,
) -> None:
    registry, loader, waiting = await removed_while_loading(tmp_path)
    task = registry._loading["support"]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    loader.release.set()
    model = await task
    # No call holds it and none can ask for it (it is no longer offered): out of memory.
    assert registry.model(model.key) is None
    assert registry._waiters == {}


async def test_load_names_loads_at_start_and_reports_a_missing_one(tmp_path: Path) -> None:
    make_model(tmp_path, "support")
    loader = FakeLoader()
    registry = ModelRegistry(default_model(), tmp_path, loader)
    await registry.rescan()
    await registry.load_names(["support"])
    assert registry.is_loaded("support") and loader.calls == ["support"]
    with pytest.raises(CallError):
        await registry.load_names(["absent"])


async def test_files_changed_after_the_scan_are_not_loaded(tmp_path: Path) -> None:
    """The scan checked voxgate-model.json's sha256 against the bytes it saw, not these."""
    payload = b"verified weights"
    model_dir = make_model(
        tmp_path, "support", payload, model_bin_sha256=hashlib.sha256(payload).hexdigest()
    )
    loader = FakeLoader()
    registry = ModelRegistry(default_model(), tmp_path, loader)
    await registry.rescan()
    (model_dir / "model.bin").write_bytes(b"something else entirely")
    os.utime(model_dir / "model.bin", ns=(1, 10**18))
    with pytest.raises(CallError) as err:
        await registry.acquire("support")
    assert err.value.kind is ErrorKind.FAILED_PRECONDITION
    assert "changed since the last scan" in err.value.message
    assert loader.calls == []
    await registry.rescan()  # now the sha256 is checked against the new bytes: refused
    assert registry.names() == ["whisper-base"]


def test_load_on_start_needs_a_models_dir() -> None:
    from pydantic import ValidationError

    from voxgate.engines.asr.config import WhisperConfig

    with pytest.raises(ValidationError, match="needs models_dir"):
        WhisperConfig(load_on_start=("support",))
    assert WhisperConfig(models_dir="/m", load_on_start=("support",)).load_on_start == ("support",)


def request(key: str) -> AsrRequest:
    stats = UtteranceStats(1000, 1000, 1.0, 0, 0, -30.0, -30.0, -20.0)
    return AsrRequest(np.zeros(1600, np.float32), stats, AsrOptions(model=key))


async def test_the_router_sends_each_batch_to_its_models_engine(tmp_path: Path) -> None:
    make_model(tmp_path, "support")
    registry = ModelRegistry(default_model(), tmp_path, FakeLoader())
    await registry.rescan()
    lease = await registry.acquire("support")
    assert request(lease.key).batch_key != request("").batch_key  # never one batch
    worker_default = FakeAsrEngine("base")
    router = ModelRouter(1, worker_default, registry)
    assert [r.text for r in router.infer_batch([request(""), request("")])] == ["base"] * 2
    assert [r.text for r in router.infer_batch([request(lease.key)])] == ["support"]
    assert router.infer_batch([request(lease.key)])[0].text == "support"
    model = registry.model(lease.key)
    assert model is not None and model.engine.siblings == 1  # one engine object per worker
    assert lease.encode_context("", ()) == (len("support"),)
    # Removed and released: the router no longer finds it (a late request fails its batch).
    for f in (tmp_path / "support").iterdir():
        f.unlink()
    (tmp_path / "support").rmdir()
    await registry.rescan()
    lease.release()
    with pytest.raises(RuntimeError, match="no longer loaded"):
        router.infer_batch([request(lease.key)])
