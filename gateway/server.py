"""Server lifecycle: load and warm engines, then open the port; drain on SIGTERM.

Start-up order matters to a load balancer: health reports ``SERVING`` only after the engines
are warm and the port is bound, so no call ever lands on a cold replica.

Shutdown order (SIGTERM or SIGINT):

1. health goes ``NOT_SERVING`` and new calls are refused with ``UNAVAILABLE``;
2. active calls drain for ``grace_s``;
3. calls still open are ended without losing speech: each flushes its in-progress utterance,
   delivers SPEECH_END and the final, then ends with ``UNAVAILABLE`` (up to ``flush_s``);
4. the rest are cancelled (``server.stop``);
5. the batcher stops;
6. the engines close.

A second SIGTERM or SIGINT during steps 2-3 skips to step 4 at once, as servers usually do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import sys
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from voxgate.gateway.admission import LoadSampler
from voxgate.gateway.base import EngineHub
from voxgate.gateway.config import GatewayConfig
from voxgate.gateway.degrade import DegradePolicy
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.models import ModelRegistry
from voxgate.gateway.security import GatewaySecurity
from voxgate.gateway.service import SERVICE_NAME, VoiceGatewayServicer, add_to_server

__all__ = ["MODEL_HEALTH_PREFIX", "SERVICE_NAME", "GatewayServer", "serve"]

#: Health service name of each recognition model: ``voxgate.v1.model/<name>``. SERVING while
#: calls naming the model are served (in memory, or loaded on first use); NOT_SERVING after its
#: load failed, once a rescan no longer finds it, and during shutdown.
MODEL_HEALTH_PREFIX = "voxgate.v1.model/"

log = logging.getLogger("voxgate.server")


class GatewayServer:
    """A grpc.aio server with health, reflection and metrics around the servicer.

    Args:
        config: server configuration.
        hub: engines to serve; None serves VAD only (speech events, no transcripts or speech).
        metrics: the registry to count into and serve on ``metrics_port``; a new one if None.
    """

    def __init__(
        self,
        config: GatewayConfig,
        hub: EngineHub | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.config = config
        self.hub = hub
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.port = 0
        #: The bound metrics port (None when metrics are off).
        self.metrics_port: int | None = None
        self._metrics_http: Any = None
        self.servicer: VoiceGatewayServicer | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        #: TLS credentials and the token interceptor; built in :meth:`start`.
        self.security: GatewaySecurity | None = None
        self._abort = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None
        #: Whether health reports the service NOT_SERVING because the replica is full.
        self.full = False
        self._model_health: dict[str, bool] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def target(self) -> str:
        """``host:port`` a client on this machine can dial."""
        return f"{self.config.server.host}:{self.port}"

    async def start(self) -> None:
        """Load and warm engines, bind the port, then report SERVING."""
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        srv = self.config.server
        # Fail before minutes of model loading when the port is taken or a certificate or
        # token file is bad (ConfigError).
        _check_bindable(srv.host, srv.port)
        security = GatewaySecurity(self.config.security, SERVICE_NAME, self.metrics)
        self.security = security
        if self.hub is not None:
            await self.hub.start(self.metrics)
        self.servicer = VoiceGatewayServicer(
            self.config,
            transcriber=self.hub.transcriber if self.hub else None,
            synthesizer=self.hub.synthesizer if self.hub else None,
            info=self.hub.info if self.hub else None,
            metrics=self.metrics,
            models=self.models,
        )
        server = grpc.aio.server(
            interceptors=security.interceptors(),
            options=[
                # gRPC sets SO_REUSEPORT by default: a second server on the same port then
                # "listens" too and the kernel splits calls between two processes.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                *connection_options(self.config),
            ],
        )
        add_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if self.config.security.reflection:
            reflection.enable_server_reflection(
                (
                    SERVICE_NAME,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ),
                server,
            )
        try:
            address = f"{srv.host}:{srv.port}"
            if security.credentials is not None:
                self.port = server.add_secure_port(address, security.credentials)
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen on {srv.host}:{srv.port}: the address is in use")
        await server.start()
        self._server = server
        if srv.metrics_port is not None:
            try:
                http, _ = start_http_server(
                    srv.metrics_port, addr=srv.metrics_host, registry=self.metrics.registry
                )
            except OSError as exc:
                await server.stop(0)
                raise OSError(
                    f"cannot serve metrics on {srv.metrics_host}:{srv.metrics_port}: {exc.strerror}"
                ) from None
            self._metrics_http = http
            self.metrics_port = int(http.server_port)
            log.info("metrics on http://%s:%d/metrics", srv.metrics_host, self.metrics_port)
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.models is not None:
            self.models.listeners.append(self.on_models_changed)
        await self._sync_model_health()
        self._monitor = asyncio.create_task(self._monitor_load(), name="load-monitor")
        log.info("serving %s on %s", SERVICE_NAME, self.target)

    async def _monitor_load(self) -> None:
        """Sample the load; refresh admission, the degradation ladder, ``voxgate_load``, health.

        Runs every ``admission.sample_interval_s`` until :meth:`stop`. Health goes NOT_SERVING
        for the VoiceGateway service once a new call would be refused (``voxgate_load`` 1), and
        SERVING again below 0.9, so that it does not flap with every call that ends.
        """
        servicer = self.servicer
        assert servicer is not None
        cfg = self.config
        sampler = LoadSampler(self.metrics, cfg.admission.window_s, cfg.admission.capacity_window_s)
        ladder = DegradePolicy(cfg.degrade)
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            bulk = servicer.calls.bulk_calls()
            self.metrics.calls_bulk.set(bulk)
            snap = sampler.sample(
                now,
                calls=servicer.calls.active_calls,
                bulk_calls=bulk,
                calibrated_capacity=servicer.info.asr_capacity_calls,
            )
            servicer.load = snap
            load = servicer.admission.load(
                snap, active_calls=servicer.calls.active_calls, bulk_calls=bulk
            )
            self.metrics.load.set(load)
            self.metrics.admission_capacity.set(servicer.admission.capacity(snap) or 0)
            # As for admission: too few observations are no evidence (a cold first decode).
            least = cfg.admission.min_samples
            move = ladder.update(
                now,
                snap.final_p95_s if snap.finals >= least else math.nan,
                over_capacity=servicer.admission.over_capacity(
                    snap, active_calls=servicer.calls.active_calls - bulk
                ),
            )
            if move is not None:
                servicer.quality.level = move.level
                self.metrics.degrade_level.set(move.level)
                self.metrics.degrade_steps.labels(move.direction, move.step.name).inc()
                log.warning(
                    "degrade: %s %s (%s), level %d; real-time p95 final %.2f s, "
                    "recogniser %.0f%% busy",
                    move.direction,
                    move.step.name,
                    move.step.description,
                    move.level,
                    snap.final_p95_s,
                    100 * snap.asr_utilisation,
                )
            if cfg.admission.health_when_full and servicer.calls.accepting:
                full = load >= 1.0 if not self.full else load >= 0.9
                if full != self.full:
                    self.full = full
                    status = (
                        health_pb2.HealthCheckResponse.NOT_SERVING
                        if full
                        else health_pb2.HealthCheckResponse.SERVING
                    )
                    await self._health.set(SERVICE_NAME, status)
                    log.info("admission: %s (load %.2f)", "full" if full else "accepting", load)
            await asyncio.sleep(cfg.admission.sample_interval_s)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown in the order documented at the top of this module."""
        server, self._server = self._server, None
        if server is None:
            return
        grace = self.config.server.grace_s if grace_s is None else grace_s
        if self._monitor is not None:  # it must not report SERVING again from here on
            self._monitor.cancel()
            await asyncio.wait({self._monitor})
            self._monitor = None
        # 1. stop accepting
        await self._health.enter_graceful_shutdown()
        servicer = self.servicer
        if servicer is not None:
            servicer.calls.accepting = False
            # 2. drain
            idle = await self._idle_within(servicer, grace)
            # 3. end what is left, each call after the final of its open utterance
            if not idle and not self._abort.is_set():
                log.info("grace period over: ending %d call(s)", servicer.calls.end_calls())
                await self._idle_within(servicer, self.config.server.flush_s)
        # 4. cancel the rest (0.5 s for cancellations to propagate to the tasks)
        await server.stop(0.0 if self._abort.is_set() else 0.5)
        if servicer is not None:
            servicer.neighbours.stop()  # no call left to read the machine for
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        # 5. + 6. batcher, engines
        if self.hub is not None:
            await self.hub.aclose()

    def reload_security(self) -> bool:
        """Re-read the tokens (SIGHUP); calls in progress are not touched."""
        return self.security.reload() if self.security is not None else False

    @property
    def models(self) -> ModelRegistry | None:
        """The hub's recognition models (default and ``asr.models_dir``), if it has any."""
        models = getattr(self.hub, "models", None)
        return models if isinstance(models, ModelRegistry) else None

    async def rescan_models(self) -> None:
        """Read ``asr.models_dir`` again (SIGHUP), without a restart.

        A model added there is offered at once, a removed one no longer (calls using it keep
        it); no call is touched.
        """
        models = self.models
        if models is None or models.root is None or self._server is None:
            return
        result = await models.rescan()
        log.info(
            "models rescanned: %d named model(s) offered%s",
            len(result.entries),
            f", {len(result.refused)} refused (see the warnings)" if result.refused else "",
        )
        await self._sync_model_health()

    def reload(self) -> None:
        """SIGHUP: the tokens, then the models directory (in a task: it reads files)."""
        self.reload_security()
        if self.models is not None and self.models.root is not None:
            task = asyncio.create_task(self.rescan_models(), name="models-rescan")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _sync_model_health(self) -> None:
        """Per-model health (:data:`MODEL_HEALTH_PREFIX`) from the registry's current view."""
        models = self.models
        if models is None or self._server is None:
            return
        # A model no longer offered stays listed by health, as NOT_SERVING (grpc's health
        # servicer cannot forget a name, and a watcher must hear that it went).
        now = {name: False for name in self._model_health} | models.health()
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        for name, ok in now.items():
            if self._model_health.get(name) != ok:
                await self._health.set(MODEL_HEALTH_PREFIX + name, serving if ok else not_serving)
        self._model_health = now

    def on_models_changed(self) -> None:
        """A load finished or failed: bring per-model health up to date (from the loop)."""
        if self._server is None:
            return
        task = asyncio.create_task(self._sync_model_health(), name="models-health")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def abort(self) -> None:
        """Cut a graceful :meth:`stop` short: skip the rest of the drain and flush."""
        self._abort.set()

    async def _idle_within(self, servicer: VoiceGatewayServicer, timeout_s: float) -> bool:
        """Wait until no call is active, ``timeout_s`` passes or :meth:`abort`; True if idle."""
        idle = asyncio.ensure_future(servicer.wait_idle())
        aborted = asyncio.ensure_future(self._abort.wait())
        try:
            await asyncio.wait({idle, aborted}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            for waiter in (idle, aborted):
                waiter.cancel()
        return servicer.calls.active_calls == 0


def _check_bindable(host: str, port: int) -> None:
    """Raise OSError naming the address when ``host:port`` cannot be bound exclusively."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


async def serve(config: GatewayConfig, hub: EngineHub | None = None) -> None:
    """Run a server until SIGTERM/SIGINT; prints ``listening on HOST:PORT`` once SERVING."""
    # Handlers go in before the `listening on` line: a supervisor that reads the line and stops
    # the server at once must get a graceful shutdown, not Python's default SIGTERM death.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    server = GatewayServer(config, hub)

    def on_signal() -> None:
        if stop.is_set():  # a second signal during the drain: end now
            log.info("second signal: ending calls now")
            server.abort()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    # SIGHUP re-reads the token list and rescans asr.models_dir (the usual daemon convention),
    # not a shutdown.
    with contextlib.suppress(NotImplementedError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, server.reload)
    await server.start()
    print(f"listening on {server.target}", flush=True)
    await stop.wait()
    log.info("shutting down (grace %.1f s)", config.server.grace_s)
    await server.stop()
    print("stopped", file=sys.stderr, flush=True)


#: gRPC's "no limit" for the millisecond settings below (INT_MAX).
_NEVER_MS = 2**31 - 1


def connection_options(config: GatewayConfig) -> list[tuple[str, int]]:
    """The HTTP/2 keepalive and connection-lifetime options of ``server.*`` as gRPC args.

    The age grace defaults to more than the longest call, so a GOAWAY for age only moves new
    calls to a new connection and never cuts one in progress.
    """
    srv = config.server

    def ms(seconds: float) -> int:
        return _NEVER_MS if seconds <= 0 else min(_NEVER_MS, round(seconds * 1000))

    grace_s = srv.max_connection_age_grace_s
    if grace_s is None:
        longest = config.limits.max_call_duration_s
        grace_s = longest + 60.0 if longest else 0.0
    return [
        ("grpc.keepalive_time_ms", ms(srv.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(srv.keepalive_timeout_s)),
        # Current gRPC core waits for a ping's ack by this one (60 s by default), whatever
        # keepalive_timeout_ms says; measured here (tests/test_connection_options.py).
        ("grpc.http2.ping_timeout_ms", ms(srv.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", int(srv.keepalive_permit_without_calls)),
        # Keep pinging a connection that carries no data (a call on hold still needs it).
        ("grpc.http2.max_pings_without_data", 0),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            round(srv.min_client_ping_interval_s * 1000),
        ),
        ("grpc.max_connection_idle_ms", ms(srv.max_connection_idle_s)),
        ("grpc.max_connection_age_ms", ms(srv.max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", ms(grace_s)),
    ]
