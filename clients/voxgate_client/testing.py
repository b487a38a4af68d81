"""A real voxgate server in a child process, for tests and benchmarks of code built on the client.

Also :class:`FlakyNetwork`, a TCP relay in front of one, whose connections a test can refuse or
cut, to see a client recover from a lost connection against the real server behind it, and
:func:`name_heard_otherwise`, for a test that a keyterm boost makes a name heard.

The client distribution cannot import the server (and, beside Pipecat, cannot even share its
protobuf), so tests of adapters start the server's own ``voxgate serve`` from the server's
environment on a loopback port and talk to it over gRPC, as production code does. Which
executable: ``$VOXGATE_TEST_SERVER`` (e.g. the server venv's ``bin/voxgate``), else ``voxgate`` on
``PATH``. ``$VOXGATE_TEST_TARGET`` (``host:port``) uses an already running server instead, which is
how one test run shares one loaded server across several test processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import numpy as np

from voxgate_client._audio import Int16Array
from voxgate_client._client import VoxgateClient

__all__ = [
    "BOOSTABLE_NAMES",
    "METRICS_ENV",
    "SERVER_ENV",
    "TARGET_ENV",
    "FlakyNetwork",
    "LocalServer",
    "ServerStartError",
    "name_heard_otherwise",
    "server_command",
]

#: ``host:port`` of an already running server; when set no process is started.
TARGET_ENV = "VOXGATE_TEST_TARGET"
#: Path of the ``voxgate`` executable to run the server with.
SERVER_ENV = "VOXGATE_TEST_SERVER"
#: ``host:port`` of the running server's Prometheus endpoint (with ``VOXGATE_TEST_TARGET``).
METRICS_ENV = "VOXGATE_TEST_METRICS"
#: Names the server's own voice says that Whisper may spell otherwise unless boosted, most
#: natural first. Which of them it misspells is the machine's numerics: "voxgate" came out as
#: two words ("Vox Gate") on one machine and as one on another; "Zorblax" as "Zor Black".
BOOSTABLE_NAMES = ("voxgate", "Zorblax", "Quindlex")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerStartError(RuntimeError):
    """The server process could not be found, or exited before it was SERVING."""


def server_command() -> list[str]:
    """The command that runs ``voxgate``: ``$VOXGATE_TEST_SERVER`` or ``voxgate`` on ``PATH``."""
    exe = os.environ.get(SERVER_ENV) or shutil.which("voxgate")
    if not exe or not Path(exe).exists():
        raise ServerStartError(
            f"no voxgate server to start: set {SERVER_ENV} to the server environment's "
            f"voxgate executable (in the repository: .venv/bin/voxgate), or {TARGET_ENV} "
            "to host:port of a running server"
        )
    return [exe]


class LocalServer:
    """``with LocalServer() as srv: VoxgateClient(srv.target)``.

    Starts ``voxgate serve --host 127.0.0.1 --port 0`` (real models unless ``args`` say
    otherwise), waits for its ``listening on HOST:PORT`` line (printed once health is SERVING,
    i.e. after the models are loaded and warmed), and on exit stops it with SIGTERM (the
    server's graceful drain), killing it only if it outlives ``stop_timeout_s``.

    With ``$VOXGATE_TEST_TARGET`` set, a server without ``args`` or ``config_yaml`` is that
    running one; a server with either always starts its own process, since the shared one
    cannot have them.

    Args:
        args: extra ``serve`` flags (e.g. ``["--engines", "tts"]``).
        config_yaml: a server config file's content, passed with ``--config``.
        start_timeout_s: how long loading and warm-up may take.
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        config_yaml: str = "",
        start_timeout_s: float = 300.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self._args = list(args)
        self._config_yaml = config_yaml
        self._config_file: IO[str] | None = None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self.target = ""
        #: ``host:port`` of the server's /metrics ("" when unknown).
        self.metrics = ""

    def __enter__(self) -> Self:
        existing = os.environ.get(TARGET_ENV)
        if existing and not (self._args or self._config_yaml):
            self.target = existing
            self.metrics = os.environ.get(METRICS_ENV, "")
            return self
        metrics_port = _free_port()
        cmd = [
            *server_command(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            str(metrics_port),
            *self._args,
        ]
        if self._config_yaml:
            self._config_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in __exit__
                "w", suffix=".yaml"
            )
            self._config_file.write(self._config_yaml)
            self._config_file.flush()
            cmd += ["--config", self._config_file.name]
        # stderr to a file, not a pipe: a chatty server must never block on a full pipe.
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in __exit__
        # The server reads VOXGATE_* variables as its configuration: keep ours out of it.
        ours = (TARGET_ENV, SERVER_ENV, METRICS_ENV)
        env = {k: v for k, v in os.environ.items() if k not in ours}
        self._proc = subprocess.Popen(  # noqa: S603 - our own executable
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env
        )
        found: list[str] = []
        assert self._proc.stdout is not None
        stdout = self._proc.stdout

        def read() -> None:
            for line in stdout:
                if line.startswith("listening on "):
                    found.append(line.split()[-1])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self._start_timeout_s)
        if not found:
            tail = self._stderr_tail()
            self.__exit__(None, None, None)
            raise ServerStartError(
                f"voxgate serve did not start within {self._start_timeout_s:.0f} s: {tail}"
            )
        self.target = found[0]
        self.metrics = f"127.0.0.1:{metrics_port}"
        return self

    def metric(self, name: str) -> float:
        """The current value of an unlabelled metric (e.g. ``voxgate_synthesize_active``).

        Raises:
            LookupError: no metrics endpoint is known, or it does not export ``name``.
        """
        if not self.metrics:
            raise LookupError(f"no metrics endpoint: set {METRICS_ENV} with {TARGET_ENV}")
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise LookupError(f"{name} is not exported by {self.metrics}")

    def _stderr_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-2000:]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for f in (self._log, self._config_file):
            if f is not None:
                f.close()
        self._log = self._config_file = None


class FlakyNetwork:
    """A TCP relay to a server, whose connections a test can make fail.

    Its first ``drop`` connections are closed as they open, and :meth:`cut` closes every open
    one (the connection lost mid-call). A network that fails and then recovers: gRPC's calls
    fail with UNAVAILABLE until its channel reconnects (after its own backoff), against the
    real server behind.
    ``async with FlakyNetwork(server.target, drop=1) as net: ... net.target``.
    """

    def __init__(self, upstream: str, *, drop: int = 0) -> None:
        self._host, port = upstream.rsplit(":", 1)
        self._port = int(port)
        self._drop = drop
        self.dropped = 0
        #: How many times :meth:`cut` closed open connections.
        self.cuts = 0
        self.target = ""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

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
        self._abort_all()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def cut(self) -> None:
        """Close every open connection at once, both ways; later ones are relayed again."""
        self.cuts += 1
        self._abort_all()

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.dropped < self._drop:
            self.dropped += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(dst)
            with contextlib.suppress(Exception):
                dst.close()


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z ]", "", text.lower()).split()


async def name_heard_otherwise(
    target: str, rate: int, hear: Callable[[Int16Array], Awaitable[str]]
) -> tuple[str, Int16Array]:
    """The first of :data:`BOOSTABLE_NAMES` not heard as written without a boost, and its audio.

    A keyterm test must show that the boost is what makes a name heard, and whether a name is
    heard unboosted differs between machines; so the test asks here which name this machine
    misspells, then boosts it. Each name is spoken by the server's voice at ``target`` in
    "Please call <name> support after six." at ``rate``, with a second of silence on each
    side; ``hear`` returns what the recogniser under test made of that audio, unboosted.

    Raises:
        AssertionError: every name was heard as written (the texts heard are in it).
    """
    heard: list[str] = []
    pad = np.zeros(rate, np.int16)
    async with VoxgateClient(target) as client:
        for name in BOOSTABLE_NAMES:
            greeting = f"Please call {name} support after six."
            chunks = [c.data async for c in client.synthesize(greeting, sample_rate_hz=rate)]
            speech = np.concatenate([pad, np.frombuffer(b"".join(chunks), np.int16), pad])
            text = await hear(speech)
            if name.lower() not in _words(text):
                return name, speech
            heard.append(text)
    raise AssertionError(f"every name was heard without a boost: {heard}")
