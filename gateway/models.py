"""Named recognition models from a models directory, loaded on first use and rescanned on SIGHUP.

``asr.models_dir`` holds one subdirectory per adapted model (``voxgate adapt`` writes them):
``<models_dir>/<name>/`` with ``model.bin``, ``config.json`` and ``tokenizer.json``, optionally a
``voxgate-model.json`` whose ``model_bin_sha256`` must match ``model.bin``. The training side
writes a model to ``.<name>.partial-<random>/``, verifies it and renames it into place, so an
entry whose name starts with ``.`` is work in progress and never served.

Two halves:

* :func:`scan_models_dir`, synchronous and side-effect free apart from reading files: which
  subdirectories are servable models, and why each other one is not (one log line each).
* :class:`ModelRegistry`, on the event loop: the entries of the last scan, the models in memory
  and the loads in flight. A call that names a model :meth:`~ModelRegistry.acquire` s it: the
  first call waits for the load, concurrent first calls share that one load, and a failed load
  fails those calls (FAILED_PRECONDITION, the reason in the message) and every later one until
  a rescan finds the model's files changed. A rescan that no longer finds a model stops offering
  it to new calls; calls holding a lease keep theirs, and the model is dropped from memory when
  the last of them ends.

Loading itself (CTranslate2, warm-up) is injected as a plain function that runs on a worker
thread, so the registry's logic is tested with fakes and the race between loads, rescans and
releases is exercised without a model (tests/test_models_registry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voxgate.engines.asr._model_files import META_FILE, REQUIRED_FILES, sha256_file
from voxgate.gateway.base import ModelDescription
from voxgate.gateway.errors import CallError, ErrorKind, echo

__all__ = [
    "BARGE_IN_KEY",
    "META_FILE",
    "REQUIRED_FILES",
    "LoadedModel",
    "ModelEntry",
    "ModelLease",
    "ModelRegistry",
    "ScanResult",
    "model_name_of",
    "scan_models_dir",
]

log = logging.getLogger("voxgate.models")

#: A model's name is a metric label and part of a health service name: keep it plain.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Separates a model's name from its load generation in :attr:`LoadedModel.key`.
_KEY_SEP = "@"
#: Routing key (and metric label) of ``asr.barge_in_model``: no models-directory name can be it.
BARGE_IN_KEY = "_barge-in"


def model_name_of(key: str) -> str:
    """The model name inside a routing key (``"support@2"`` -> ``"support"``; ``""`` stays)."""
    return key.split(_KEY_SEP, 1)[0]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One servable subdirectory of the models directory.

    Attributes:
        name: the subdirectory's name, what ``config.model`` names.
        path: the model directory.
        fingerprint: ``model.bin``'s device, inode, size and mtime; a rescan that sees another
            fingerprint treats the model as replaced (new calls get the new files).
        meta: ``voxgate-model.json`` as read (empty when absent).
    """

    name: str
    path: Path
    fingerprint: tuple[int, int, int, int]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one scan found: the servable entries by name and a reason per refused name."""

    entries: dict[str, ModelEntry]
    refused: dict[str, str]


def _fingerprint(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def scan_models_dir(
    root: Path,
    *,
    reserved: Collection[str] = (),
    sha_cache: dict[tuple[int, int, int, int], str] | None = None,
) -> ScanResult:
    """List the servable models under ``root``.

    Skipped without a word: entries whose name starts with ``.`` (a model being written) and
    plain files. Refused, each with its reason: a name that is not plain (letters, digits,
    ``._-``, at most 64) or that ``reserved`` holds (the default model's name), a directory
    without every :data:`REQUIRED_FILES`, an unreadable ``voxgate-model.json`` or one whose
    ``model_bin_sha256`` differs from ``model.bin``'s (a copy cut short, or weights changed
    after training).

    Args:
        root: the models directory; a missing one is an empty scan with one refusal.
        reserved: names that are not available to the directory.
        sha_cache: fingerprint -> sha256 of ``model.bin``, kept across rescans so that
            unchanged models are not hashed again (about 0.3 s per 150 MB).

    Returns:
        The entries by name, in name order, and the refusals by name.
    """
    entries: dict[str, ModelEntry] = {}
    refused: dict[str, str] = {}
    cache = sha_cache if sha_cache is not None else {}
    try:
        children = sorted(root.iterdir())
    except OSError as exc:
        return ScanResult({}, {"": f"cannot read asr.models_dir {root}: {exc.strerror}"})
    for child in children:
        name = child.name
        if name.startswith(".") or not child.is_dir():
            continue
        if not _NAME.fullmatch(name):
            refused[name] = "the name must be letters, digits and ._- (at most 64 characters)"
            continue
        if name in reserved:
            refused[name] = "the name is the default model's; rename the directory"
            continue
        missing = [f for f in REQUIRED_FILES if not (child / f).is_file()]
        if missing:
            refused[name] = f"missing {', '.join(missing)}"
            continue
        try:
            fingerprint = _fingerprint(child / "model.bin")
            meta: dict[str, Any] = {}
            if (child / META_FILE).is_file():
                loaded = json.loads((child / META_FILE).read_text())
                if not isinstance(loaded, dict):
                    raise ValueError(f"{META_FILE} must hold a JSON object")
                meta = loaded
            want = meta.get("model_bin_sha256")
            if want is not None:
                got = cache.get(fingerprint) or sha256_file(child / "model.bin")
                cache[fingerprint] = got
                if got != want:
                    refused[name] = (
                        f"model.bin has sha256 {got[:12]}..., {META_FILE} says "
                        f"{str(want)[:12]}...: the copy is incomplete or the weights changed "
                        "after training; copy the model again"
                    )
                    continue
        except OSError as exc:
            refused[name] = f"cannot read its files: {exc.strerror}"
            continue
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            refused[name] = f"{META_FILE} is not valid: {exc}"
            continue
        entries[name] = ModelEntry(name, child, fingerprint, meta)
    return ScanResult(entries, refused)


@dataclass(eq=False)
class LoadedModel:
    """A model in memory, as the loader returns it.

    Attributes:
        name: the model's name (``config.model``).
        description: what ListModels reports once it is loaded.
        engine: the warmed engine; batcher workers take siblings of it (``engine.sibling()``).
        key: the routing key requests carry in ``AsrOptions.model`` (name and load generation,
            so that a replaced model's calls in progress stay on the files they started with).
    """

    name: str
    description: ModelDescription
    engine: Any
    key: str = ""
    refs: int = 0
    retired: bool = False


class ModelLease:
    """One call's hold on a model: its routing key and description until :meth:`release`."""

    def __init__(self, registry: ModelRegistry | None, model: LoadedModel) -> None:
        self._registry = registry
        self._model = model
        self._released = False

    @property
    def key(self) -> str:
        """What the call's requests carry in ``AsrOptions.model`` ("" for the default)."""
        return self._model.key

    @property
    def description(self) -> ModelDescription:
        """The model as ListModels describes it (its name, languages)."""
        return self._model.description

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """The call's prompt and hotwords in this model's tokens (tokenizers may differ)."""
        return tuple(self._model.engine.encode_context(initial_prompt, hotwords))

    def release(self) -> None:
        """End the hold (idempotent); a retired model leaves memory with its last lease."""
        if self._released:
            return
        self._released = True
        if self._registry is not None:
            self._registry._release(self._model)


#: Loads one entry on a worker thread: CTranslate2, tokenizer, warm-up.
Loader = Callable[[ModelEntry], LoadedModel]


class ModelRegistry:
    """The default model plus the named models of ``asr.models_dir`` (see the module docstring).

    Args:
        default: the server's default model (always loaded, never retired).
        root: the models directory, or None for a server with the default model only.
        loader: loads an entry (runs on a worker thread; raises on failure).
        on_change: called on the loop after anything ListModels or health reports changed.
        on_load: called on the loop after each load attempt with the name and the outcome
            (``ok`` or ``failed``), for metrics.
        barge_in: ``asr.barge_in_model``, loaded at start-up: routed under
            :data:`BARGE_IN_KEY` for as long as the registry lives, never offered to calls.
    """

    def __init__(
        self,
        default: LoadedModel,
        root: Path | None = None,
        loader: Loader | None = None,
        *,
        on_change: Callable[[], None] | None = None,
        on_load: Callable[[str, str], None] | None = None,
        barge_in: LoadedModel | None = None,
    ) -> None:
        self.default = default
        self.barge_in = barge_in
        if barge_in is not None:
            barge_in.key = BARGE_IN_KEY
        self.root = root
        self._loader = loader
        #: Called on the loop after anything ListModels or health reports changed.
        self.listeners: list[Callable[[], None]] = [on_change] if on_change else []
        self._on_load = on_load or (lambda _name, _outcome: None)
        self._entries: dict[str, ModelEntry] = {}
        #: name -> the model new calls get (loaded from the entry of that name).
        self._loaded: dict[str, LoadedModel] = {}
        #: key -> every model in memory, current or retired, for routing by key.
        self._by_key: dict[str, LoadedModel] = self._pinned()
        self._loading: dict[str, asyncio.Task[LoadedModel]] = {}
        #: name -> calls awaiting its load; a model retired while it loads leaves memory as soon
        #: as none of them is left to hold it (all hung up), not never.
        self._waiters: dict[str, int] = {}
        #: name -> (fingerprint of the files that failed, why), cleared when the files change.
        self._failed: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._sha_cache: dict[tuple[int, int, int, int], str] = {}
        self._generation = 0
        self._rescan_lock = asyncio.Lock()

    def _pinned(self) -> dict[str, LoadedModel]:
        """The models routed for the registry's whole life: the default and the barge-in one."""
        pinned = {self.default.key: self.default}
        if self.barge_in is not None:
            pinned[self.barge_in.key] = self.barge_in
        return pinned

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    # -- what is offered ---------------------------------------------------------------------

    def names(self) -> list[str]:
        """The default model's name, then every named model new calls may use, in name order."""
        return [self.default.name, *self._entries]

    def descriptions(self) -> list[ModelDescription]:
        """What ListModels lists: the default first, then each named model, loaded or not."""
        out = [replace(self.default.description, loaded=True)]
        for name, entry in self._entries.items():
            model = self._loaded.get(name)
            if model is not None:
                out.append(replace(model.description, loaded=True))
            else:
                out.append(self._unloaded_description(entry))
        return out

    def _unloaded_description(self, entry: ModelEntry) -> ModelDescription:
        base = self.default.description
        return ModelDescription(
            name=entry.name,
            family=base.family,
            # A model adapted from the default speaks its languages; the exact list is known
            # once it is loaded (ListModels then reports the model's own).
            languages=base.languages,
            device=base.device,
            compute_type=base.compute_type,
            loaded=False,
        )

    def health(self) -> dict[str, bool]:
        """Per offered name, whether a call naming it can be served (False after a failed load)."""
        out = {self.default.name: True}
        for name, entry in self._entries.items():
            failed = self._failed.get(name)
            out[name] = failed is None or failed[0] != entry.fingerprint
        return out

    def model(self, key: str) -> LoadedModel | None:
        """The model in memory under a routing key (workers look them up per batch)."""
        return self._by_key.get(key)

    def is_loaded(self, name: str) -> bool:
        """Whether ``name`` is in memory for new calls."""
        return name == self.default.name or name in self._loaded

    # -- rescan ------------------------------------------------------------------------------

    async def rescan(self) -> ScanResult:
        """Read the models directory again (at start and on SIGHUP); log what changed."""
        if self.root is None:
            return ScanResult({}, {})
        async with self._rescan_lock:
            root = self.root
            result = await asyncio.to_thread(
                scan_models_dir, root, reserved={self.default.name}, sha_cache=self._sha_cache
            )
            self._apply(result)
        return result

    def _apply(self, result: ScanResult) -> None:
        old = self._entries
        for name, why in result.refused.items():
            if name:
                log.warning("models: %s is not served: %s", name, why)
            else:
                log.warning("models: %s", why)
        for name, entry in result.entries.items():
            before = old.get(name)
            if before is None:
                log.info("models: %s offered (%s)", name, entry.path)
            elif before.fingerprint != entry.fingerprint:
                log.info("models: %s changed on disk; new calls get the new files", name)
        for name, before in old.items():
            now = result.entries.get(name)
            if now is None:
                log.info("models: %s removed; calls in progress keep it", name)
            if now is None or now.fingerprint != before.fingerprint:
                self._retire(name)
        for name in list(self._failed):
            now = result.entries.get(name)
            if now is None or now.fingerprint != self._failed[name][0]:
                del self._failed[name]
        self._entries = dict(result.entries)
        self._changed()

    def _retire(self, name: str) -> None:
        model = self._loaded.pop(name, None)
        if model is None:
            return
        model.retired = True
        if model.refs == 0:
            self._drop(model)

    def _drop(self, model: LoadedModel) -> None:
        # No call holds it, so no request of it is queued. A batch of a call that just ended
        # may still run on a worker thread; dropping the references (not unload_model) lets
        # CTranslate2 free the weights when that batch lets go of them too.
        self._by_key.pop(model.key, None)
        log.info("models: %s unloaded", model.name)

    # -- per call ----------------------------------------------------------------------------

    async def acquire(self, name: str) -> ModelLease:
        """Hold model ``name`` for one call, loading it first if it is not in memory.

        Raises:
            CallError: INVALID_ARGUMENT when no such model is offered; FAILED_PRECONDITION
                when its files failed to load (until a rescan finds them changed).
        """
        if not name or name == self.default.name:
            return ModelLease(None, self.default)
        model = self._loaded.get(name)
        if model is None:
            model = await self._load(name)
        model.refs += 1
        return ModelLease(self, model)

    async def _load(self, name: str) -> LoadedModel:
        entry = self._entries.get(name)
        if entry is None or self._loader is None:
            raise CallError.invalid(
                f"config.model={echo(name)} is not loaded; ListModels has {', '.join(self.names())}"
            )
        failed = self._failed.get(name)
        if failed is not None and failed[0] == entry.fingerprint:
            raise self._load_error(name, failed[1])
        task = self._loading.get(name)
        if task is None:
            task = asyncio.create_task(self._run_load(entry), name=f"load-model-{name}")
            self._loading[name] = task
        # shield: a caller who hangs up mid-load must not cancel the load the others wait for.
        self._waiters[name] = self._waiters.get(name, 0) + 1
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._leave(name, task)
            raise
        finally:
            self._waiters[name] -= 1
            if not self._waiters[name]:
                del self._waiters[name]

    def _leave(self, name: str, task: asyncio.Task[LoadedModel]) -> None:
        # A waiter that resumed took its reference synchronously on return, so a retired model
        # with no reference and no waiter left (this one is the last) has no call to serve.
        if self._waiters.get(name, 0) > 1 or not task.done() or task.cancelled():
            return
        if task.exception() is None:
            model = task.result()
            if model.retired and model.refs == 0:
                self._drop(model)

    async def _run_load(self, entry: ModelEntry) -> LoadedModel:
        assert self._loader is not None
        loader = self._loader

        def checked_load() -> LoadedModel:
            # The scan verified the sha256 of these very bytes (same inode, size and mtime);
            # files changed since then are not what was verified.
            if _fingerprint(entry.path / "model.bin") != entry.fingerprint:
                raise RuntimeError(
                    "model.bin changed since the last scan (send SIGHUP to rescan it)"
                )
            return loader(entry)

        try:
            try:
                model = await asyncio.to_thread(checked_load)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                self._failed[entry.name] = (entry.fingerprint, why)
                log.error("models: %s failed to load from %s: %s", entry.name, entry.path, why)
                self._on_load(entry.name, "failed")
                self._changed()
                raise self._load_error(entry.name, why) from None
            self._generation += 1
            model.key = f"{entry.name}{_KEY_SEP}{self._generation}"
            model.description = replace(model.description, name=entry.name, loaded=True)
            self._by_key[model.key] = model
            current = self._entries.get(entry.name)
            if current is not None and current.fingerprint == entry.fingerprint:
                self._loaded[entry.name] = model
            else:  # removed or replaced while it loaded: serve the calls that waited, then go
                model.retired = True
                if not self._waiters.get(entry.name):  # every caller hung up mid-load
                    self._drop(model)
            log.info("models: %s loaded", entry.name)
            self._on_load(entry.name, "ok")
            self._changed()
            return model
        finally:
            self._loading.pop(entry.name, None)

    @staticmethod
    def _load_error(name: str, why: str) -> CallError:
        return CallError(
            ErrorKind.FAILED_PRECONDITION,
            f"model {name!r} is offered but failed to load ({why[:200]}); fix its files in "
            "asr.models_dir and send the server SIGHUP to rescan",
        )

    def _release(self, model: LoadedModel) -> None:
        model.refs -= 1
        if model.refs == 0 and model.retired:
            self._drop(model)

    async def load_names(self, names: Sequence[str]) -> None:
        """Load ``names`` now (``asr.load_on_start``): one acquire and release each.

        Raises:
            CallError: a name is not offered or fails to load.
        """
        for name in names:
            lease = await self.acquire(name)
            lease.release()

    async def aclose(self) -> None:
        """Wait for loads in flight (their threads cannot be stopped), then forget every model."""
        for task in list(self._loading.values()):
            with contextlib.suppress(CallError, asyncio.CancelledError):
                await task
        self._loaded.clear()
        self._by_key = self._pinned()
        self._entries = {}
