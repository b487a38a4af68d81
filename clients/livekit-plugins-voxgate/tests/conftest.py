"""A real voxgate server for the session, and recorded speech as LiveKit audio frames."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import numpy as np
import pytest
from livekit import rtc
from voxgate_client import read_wav, sample_call_path
from voxgate_client.testing import LocalServer


@pytest.fixture(scope="session")
def server() -> Iterator[LocalServer]:
    with LocalServer() as srv:
        yield srv


#: The idle timeout of ``short_idle_server``, s: an input silent for longer loses its stream.
IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def short_idle_server() -> Iterator[LocalServer]:
    """A second real server, the default configuration but for a short ``idle_timeout_s``, so
    that a test can have the server end a stream mid-call (DEADLINE_EXCEEDED) in seconds."""
    with LocalServer(config_yaml=f"limits:\n  idle_timeout_s: {IDLE_TIMEOUT_S}\n") as srv:
        yield srv


class FlakyNetwork:
    """A TCP relay to a server whose first ``drop`` connections are closed as they open.

    A network that fails and then recovers: gRPC's calls fail with UNAVAILABLE until its
    channel reconnects (after its own backoff), which makes LiveKit retry, against the real
    server behind. ``async with FlakyNetwork(server.target, drop=1) as net: ... net.target``.
    """

    def __init__(self, upstream: str, *, drop: int) -> None:
        self._host, port = upstream.rsplit(":", 1)
        self._port = int(port)
        self._drop = drop
        self.dropped = 0
        self.target = ""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.target = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.dropped < self._drop:
            self.dropped += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()


@pytest.fixture(scope="session")
def sample_call() -> tuple[np.ndarray, int]:
    """The bundled 19 s two-utterance recording (16 kHz PCM16): JFK, then LJ Speech."""
    return read_wav(sample_call_path())


def frames(pcm: np.ndarray, rate: int, chunk_ms: int = 100) -> list[rtc.AudioFrame]:
    step = rate * chunk_ms // 1000
    return [
        rtc.AudioFrame(pcm[i : i + step].tobytes(), rate, 1, len(pcm[i : i + step]))
        for i in range(0, len(pcm), step)
    ]
