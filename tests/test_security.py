"""TLS, mutual TLS, bearer tokens and per-token quotas on a real grpc.aio server (loopback).

Certificates are made at run time (gateway/testing/pki.py, with ``cryptography``): a throwaway
CA, a server certificate for 127.0.0.1/localhost, client certificates from that CA and from a
stranger's CA. The gateway runs the fake tone voice (FakeToneHub) where the model does not
matter: these tests prove who gets in, not what the engines say. One call at the end runs the
real Whisper model and voice through ``voxgate call`` over TLS with a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from voxgate.bridges.door_args import add_connection_arguments, connection_from_args
from voxgate.bridges.sip import BridgeConfig, SilentBot, SipBridge
from voxgate.bridges.sip._bridge import gateway_client
from voxgate.gateway.config import ConfigError, SecurityConfig, load_config
from voxgate.gateway.security import (
    REFUSAL_FIRST_MESSAGE_S,
    GatewaySecurity,
    TokenStore,
    parse_tokens,
)
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.pki import Pki, make_pki
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc
from voxgate_client import (
    CallConfig,
    VoxgateClient,
    VoxgateError,
    auth_metadata,
    read_token,
    read_wav,
    tls_credentials,
)

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[1]
GOOD = "tok-acme-0123456789abcdef"
OTHER = "tok-beta-0123456789abcdef"
UNKNOWN = "tok-nobody-0123456789abcd"
ALL_TOKENS = (GOOD, OTHER, UNKNOWN)
OK = grpc.StatusCode.OK
RPCS = (
    "Converse",
    "StreamingRecognize",
    "Synthesize",
    "ListModels",
    "ListVoices",
    "health",
    "reflection",
)


# -- certificates -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        "# tenants of this replica\n"
        f"- token: {GOOD}\n  tenant: acme\n  max_calls: 2\n"
        f"- token: {OTHER}\n  tenant: beta\n  max_calls: 1\n"
    )
    return path


# -- one RPC of each kind -------------------------------------------------------------------------


async def exercise(channel: grpc.aio.Channel, rpc: str, token: str | None) -> grpc.StatusCode:
    """Make one ``rpc`` with ``token``; its status code (OK once it produced its first answer)."""
    md = auth_metadata(token)
    stub = pb_grpc.VoiceGatewayStub(channel)
    try:
        if rpc in ("Converse", "StreamingRecognize"):
            call = getattr(stub, rpc)(metadata=md, timeout=20)
            await call.write(pb.ConverseRequest(config=CallConfig().to_proto()))
            first = await call.read()
            assert first is not grpc.aio.EOF and first.WhichOneof("event") == "started"
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        elif rpc == "Synthesize":
            stream = stub.Synthesize(pb.SynthesizeRequest(text="hi"), metadata=md, timeout=20)
            chunks = [msg async for msg in stream]
            assert chunks and chunks[-1].is_last
        elif rpc == "ListModels":
            await stub.ListModels(pb.ListModelsRequest(), metadata=md, timeout=20)
        elif rpc == "ListVoices":
            resp = await stub.ListVoices(pb.ListVoicesRequest(), metadata=md, timeout=20)
            assert [v.name for v in resp.voices] == ["tone"]
        elif rpc == "health":
            health = health_pb2_grpc.HealthStub(channel)
            resp = await health.Check(health_pb2.HealthCheckRequest(), metadata=md, timeout=20)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        elif rpc == "reflection":
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            req = reflection_pb2.ServerReflectionRequest(list_services="")
            names = set()
            async for r in refl.ServerReflectionInfo(iter([req]), metadata=md, timeout=20):
                names |= {s.name for s in r.list_services_response.service}
            assert "voxgate.v1.VoiceGateway" in names
        else:
            raise AssertionError(rpc)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return OK


@asynccontextmanager
async def gateway(**security: Any) -> AsyncIterator[GatewayServer]:
    """A real server with the fake tone voice and the given ``security`` section."""
    clean = {k: str(v) if isinstance(v, Path) else v for k, v in security.items()}
    async with running_server(hub=FakeToneHub(), security=clean) as srv:
        yield srv


def tls_channel(
    srv: GatewayServer, pki: Pki, *, cert: Path | None = None, key: Path | None = None
) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(srv.target, tls_credentials(pki.ca, cert, key))


async def wait_for(pred: Callable[[], bool], what: str, limit: int = 400) -> None:
    """Poll every 25 ms, at most ``limit`` times (a bound on waiting, never a speed check)."""
    for _ in range(limit):
        if pred():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never happened: {what}")


# -- the auth matrix ------------------------------------------------------------------------------


async def test_without_tokens_every_rpc_is_open() -> None:
    async with gateway() as srv, grpc.aio.insecure_channel(srv.target) as ch:
        for rpc in RPCS:
            assert await exercise(ch, rpc, None) == OK, rpc


@pytest.mark.parametrize("rpc", RPCS)
async def test_with_tokens_no_rpc_works_without_valid_credentials(
    rpc: str, tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        gateway(tokens_file=tokens_file, open_health=False) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        assert await exercise(ch, rpc, None) == grpc.StatusCode.UNAUTHENTICATED
        assert await exercise(ch, rpc, UNKNOWN) == grpc.StatusCode.PERMISSION_DENIED
        assert await exercise(ch, rpc, GOOD) == OK
        # malformed: another scheme, an empty bearer, two headers
        for md in (
            (("authorization", f"Basic {GOOD}"),),
            (("authorization", "Bearer "),),
            (("authorization", f"Bearer {GOOD}"), ("authorization", f"Bearer {OTHER}")),
        ):
            call = pb_grpc.VoiceGatewayStub(ch).ListModels(
                pb.ListModelsRequest(), metadata=md, timeout=20
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert GOOD not in (info.value.details() or "")
        refused = srv.metrics.value("voxgate_auth_refused_total", reason="unauthenticated")
        assert refused == 4
        assert srv.metrics.value("voxgate_auth_refused_total", reason="permission_denied") == 1
    for token in ALL_TOKENS:
        assert token not in caplog.text


async def test_an_unknown_method_without_credentials_is_unauthenticated(tokens_file: Path) -> None:
    async with (
        gateway(tokens_file=tokens_file) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        probe = ch.unary_unary("/voxgate.v1.VoiceGateway/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await probe(b"", timeout=20)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await probe(b"", metadata=auth_metadata(GOOD), timeout=20)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_refused_stream_is_refused_after_its_first_message_or_without_one(
    tokens_file: Path,
) -> None:
    """A refusal waits for the first request of a stream (bounded), so an asyncio client's
    in-flight config write cannot turn it into grpcio's local INTERNAL (grpc/grpc#36066)."""
    async with (
        gateway(tokens_file=tokens_file) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        # The config is written and has reached the server before the status is sent: the
        # write itself succeeds, and the read gets the server's code.
        call = stub.Converse(metadata=auth_metadata(UNKNOWN), timeout=20)
        await call.write(pb.ConverseRequest(config=CallConfig().to_proto()))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # A client that never writes is not held open past the bound.
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        call = stub.StreamingRecognize(metadata=auth_metadata(None), timeout=20)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert loop.time() - t0 < 10 * REFUSAL_FIRST_MESSAGE_S  # a hang guard, not a timing
        assert srv.metrics.value("voxgate_auth_refused_total", reason="unauthenticated") == 1


async def test_health_is_open_by_default_and_reflection_can_be_off(tokens_file: Path) -> None:
    async with (
        gateway(tokens_file=tokens_file, reflection=False) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        assert await exercise(ch, "health", None) == OK
        assert await exercise(ch, "reflection", None) == grpc.StatusCode.UNAUTHENTICATED
        assert await exercise(ch, "reflection", GOOD) == grpc.StatusCode.UNIMPLEMENTED
        assert await exercise(ch, "ListVoices", None) == grpc.StatusCode.UNAUTHENTICATED


async def test_tokens_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXGATE_TEST_TOKENS", f"{GOOD}, {OTHER}")
    async with (
        gateway(tokens_env="VOXGATE_TEST_TOKENS") as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        assert await exercise(ch, "ListModels", OTHER) == OK
        assert await exercise(ch, "ListModels", UNKNOWN) == grpc.StatusCode.PERMISSION_DENIED


# -- TLS and mutual TLS ---------------------------------------------------------------------------


async def test_tls_works_and_plaintext_to_the_tls_port_fails(pki: Pki, tokens_file: Path) -> None:
    async with gateway(tls_cert=pki.server_cert, tls_key=pki.server_key) as srv:
        async with tls_channel(srv, pki) as ch:
            for rpc in ("Converse", "Synthesize", "ListVoices"):
                assert await exercise(ch, rpc, None) == OK, rpc
        async with grpc.aio.insecure_channel(srv.target) as ch:
            assert await exercise(ch, "ListVoices", None) == grpc.StatusCode.UNAVAILABLE
        # a client that trusts another CA does not accept this server
        creds = tls_credentials(pki.stranger_ca)
        async with grpc.aio.secure_channel(srv.target, creds) as ch:
            assert await exercise(ch, "ListVoices", None) == grpc.StatusCode.UNAVAILABLE


async def test_tls_with_tokens_through_the_client_library(pki: Pki, tokens_file: Path) -> None:
    async with gateway(
        tls_cert=pki.server_cert, tls_key=pki.server_key, tokens_file=tokens_file
    ) as srv:
        async with VoxgateClient(srv.target, tls_credentials(pki.ca), GOOD) as client:
            assert [v.name for v in await client.list_voices()] == ["tone"]
            chunks = [c async for c in client.synthesize("hello")]
            assert chunks[-1].is_last
        async with VoxgateClient(srv.target, tls_credentials(pki.ca)) as client:
            with pytest.raises(VoxgateError) as info:
                await client.list_voices()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_mutual_tls_needs_a_client_certificate_from_the_ca(pki: Pki) -> None:
    async with gateway(tls_cert=pki.server_cert, tls_key=pki.server_key, client_ca=pki.ca) as srv:
        async with tls_channel(srv, pki) as ch:  # no client certificate
            assert await exercise(ch, "ListVoices", None) == grpc.StatusCode.UNAVAILABLE
            assert await exercise(ch, "health", None) == grpc.StatusCode.UNAVAILABLE
        async with tls_channel(srv, pki, cert=pki.stranger_cert, key=pki.stranger_key) as ch:
            assert await exercise(ch, "ListVoices", None) == grpc.StatusCode.UNAVAILABLE
        async with tls_channel(srv, pki, cert=pki.client_cert, key=pki.client_key) as ch:
            for rpc in ("Converse", "ListVoices", "health"):
                assert await exercise(ch, rpc, None) == OK, rpc


async def test_the_container_healthcheck_probes_a_mutual_tls_port(pki: Pki) -> None:
    async with gateway(tls_cert=pki.server_cert, tls_key=pki.server_key, client_ca=pki.ca) as srv:

        def probe(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(  # noqa: PLW1510 - the return code is the assertion
                [sys.executable, str(REPO_ROOT / "deploy" / "healthcheck.py"), *flags],
                capture_output=True,
                text=True,
                timeout=60,
            )

        target = ("--target", srv.target)
        mtls = ("--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key))
        ok = await asyncio.to_thread(probe, *target, "--tls-ca", str(pki.ca), *mtls)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "SERVING" in ok.stdout
        # by name, as a probe inside a container would when the certificate names a host
        named = await asyncio.to_thread(
            probe,
            *("--target", f"localhost:{srv.port}", "--tls-ca", str(pki.ca)),
            *("--tls-server-name", "localhost", *mtls),
        )
        assert named.returncode == 0, named.stdout + named.stderr
        plain = await asyncio.to_thread(probe, *target)
        no_cert = await asyncio.to_thread(probe, *target, "--tls-ca", str(pki.ca))
        assert plain.returncode == no_cert.returncode == 2


# -- quotas -------------------------------------------------------------------------------------


async def open_call(ch: grpc.aio.Channel, token: str) -> grpc.aio.StreamStreamCall:
    """A Converse call that has started (the server holds it until the client ends it)."""
    call = pb_grpc.VoiceGatewayStub(ch).Converse(metadata=auth_metadata(token))
    await call.write(pb.ConverseRequest(config=CallConfig().to_proto()))
    first = await call.read()
    assert first is not grpc.aio.EOF and first.WhichOneof("event") == "started"
    return call


async def refused_converse(ch: grpc.aio.Channel, token: str) -> grpc.aio.AioRpcError:
    call = pb_grpc.VoiceGatewayStub(ch).Converse(metadata=auth_metadata(token), timeout=20)
    # A refused call may fail the write before the read says why.
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await call.write(pb.ConverseRequest(config=CallConfig().to_proto()))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    return info.value


async def test_a_token_quota_refuses_the_next_call_and_frees_the_slot_when_a_call_ends(
    tokens_file: Path,
) -> None:
    async with (
        gateway(tokens_file=tokens_file) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):

        def open_for(tenant: str) -> float:
            return srv.metrics.value("voxgate_tenant_calls_active", tenant=tenant)

        first, second = await open_call(ch, GOOD), await open_call(ch, GOOD)
        assert open_for("acme") == 2

        # the third acme call is refused, with the quota's name and a retry hint
        err = await refused_converse(ch, GOOD)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "acme" in (err.details() or "") and GOOD not in (err.details() or "")
        (raw,) = [v for k, v in err.trailing_metadata() or () if k == "grpc-status-details-bin"]
        status = status_pb2.Status.FromString(raw)
        quota, retry = error_details_pb2.QuotaFailure(), error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(quota) and status.details[1].Unpack(retry)
        assert quota.violations[0].subject == "security.max_calls"
        assert retry.retry_delay.seconds >= 1
        # Synthesize counts against the same quota; the client library names the quota
        async with VoxgateClient(srv.target, token=GOOD) as client:
            with pytest.raises(VoxgateError) as info:
                _ = [c async for c in client.synthesize("hi")]
            assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.quota == "security.max_calls"
        assert srv.metrics.value("voxgate_auth_refused_total", reason="token_quota") == 2

        # another tenant still gets in while acme is full
        beta = await open_call(ch, OTHER)
        assert (await refused_converse(ch, OTHER)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        # an acme call ends normally: its slot is free again
        await first.done_writing()
        while await first.read() is not grpc.aio.EOF:
            pass
        assert await first.code() == OK
        await wait_for(lambda: open_for("acme") == 1, "the ended call's slot freed")
        third = await open_call(ch, GOOD)
        assert open_for("acme") == 2

        # the client cancels: the slot is freed too
        second.cancel()
        await wait_for(lambda: open_for("acme") == 1, "the cancelled call's slot freed")
        fourth = await open_call(ch, GOOD)

        # a call the server refuses (here: a bad config) releases its slot as well
        fourth.cancel()
        await wait_for(lambda: open_for("acme") == 1, "slot freed")
        bad = pb_grpc.VoiceGatewayStub(ch).Converse(metadata=auth_metadata(GOOD), timeout=20)
        await bad.write(pb.ConverseRequest(config=pb.SessionConfig()))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bad.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await wait_for(lambda: open_for("acme") == 1, "the refused call's slot freed")

        for call in (third, beta):
            call.cancel()
        await wait_for(lambda: open_for("acme") == open_for("beta") == 0, "all freed")


async def test_the_default_quota_applies_to_tokens_without_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VOXGATE_TEST_TOKENS", GOOD)
    async with (
        gateway(tokens_env="VOXGATE_TEST_TOKENS", max_calls_per_token=1) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        held = await open_call(ch, GOOD)
        assert (await refused_converse(ch, GOOD)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # unary RPCs are not metered
        assert await exercise(ch, "ListVoices", GOOD) == OK
        held.cancel()


def rewrite(path: Path, text: str) -> None:
    """Replace a token file as an operator's tooling would: write aside, then rename."""
    aside = path.with_suffix(".new")
    aside.write_text(text)
    aside.replace(path)


# -- reload -------------------------------------------------------------------------------------


async def test_reload_adds_and_removes_tokens_and_keeps_them_on_a_broken_file(
    tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        gateway(tokens_file=tokens_file) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        held = await open_call(ch, GOOD)
        rewrite(tokens_file, f"- token: {UNKNOWN}\n  tenant: newcomer\n")
        assert srv.reload_security()
        assert await exercise(ch, "ListModels", UNKNOWN) == OK
        assert await exercise(ch, "ListModels", GOOD) == grpc.StatusCode.PERMISSION_DENIED
        # a call already running keeps running when its token goes
        await held.write(pb.ConverseRequest(audio=pb.AudioChunk(data=b"\0" * 640)))
        assert not held.done()
        held.cancel()

        rewrite(tokens_file, f"- token: {GOOD}\n  tenant: [broken\n")
        assert not srv.reload_security()
        assert await exercise(ch, "ListModels", UNKNOWN) == OK
        rewrite(tokens_file, "")
        assert srv.reload_security()
        assert await exercise(ch, "ListModels", UNKNOWN) == grpc.StatusCode.PERMISSION_DENIED
    assert "token reload failed" in caplog.text
    for token in ALL_TOKENS:
        assert token not in caplog.text


def _serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxgate.cli", "serve", "--engines", "none", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    if not m:
        proc.kill()
        raise AssertionError(f"unexpected first line {line!r}; stderr: {proc.communicate()[1]}")
    return proc, m.group(1)


async def test_sighup_reloads_the_tokens_of_voxgate_serve(tokens_file: Path) -> None:
    proc, target = _serve("--tokens-file", str(tokens_file), "--log-level", "DEBUG")
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            assert await exercise(ch, "ListModels", GOOD) == OK
            assert await exercise(ch, "ListModels", UNKNOWN) == grpc.StatusCode.PERMISSION_DENIED
            rewrite(tokens_file, f"- {UNKNOWN}\n")
            proc.send_signal(signal.SIGHUP)
            for _ in range(400):
                if await exercise(ch, "ListModels", UNKNOWN) == OK:
                    break
                await asyncio.sleep(0.025)
            assert await exercise(ch, "ListModels", UNKNOWN) == OK
            assert await exercise(ch, "ListModels", GOOD) == grpc.StatusCode.PERMISSION_DENIED
            assert proc.poll() is None, "SIGHUP must not stop the server"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "tokens reloaded: 1 token(s), tenants: token-1" in err
    for token in ALL_TOKENS:
        assert token not in err


# -- token files and configuration errors -----------------------------------------------------


def test_token_formats() -> None:
    entries = parse_tokens(f"{GOOD},{OTHER}", "env")
    assert [e.tenant for e in entries] == ["token-1", "token-2"]
    entries = parse_tokens(
        f"tokens:\n  - {GOOD}\n  - {{token: {OTHER}, tenant: beta, max_calls: 3}}\n", "f", 5
    )
    assert [(e.tenant, e.max_calls) for e in entries] == [("token-1", 5), ("beta", 3)]
    assert GOOD not in repr(entries)
    assert parse_tokens("", "f") == ()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("- short\n", "shorter than 16"),
        (f"- {GOOD}\n- {GOOD}\n", "entry 2: the same token as entry 1"),
        ("- 12345678901234567890\n", "must be a string"),
        (f"- {{{GOOD}: acme}}\n", "a mapping needs 'token'"),
        (f"- {{token: {GOOD}, max_calls: -1}}\n", "max_calls must be"),
        (f"- {{token: {GOOD}, tenant: ''}}\n", "tenant must be"),
        (f"- token: {GOOD}\n  tenant: [acme\n", "not valid YAML (line 3"),
        (f"{{token: {GOOD}}}\n", "expected a list"),
    ],
)
def test_a_bad_token_file_is_one_error_that_never_quotes_a_token(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_tokens(text, "security.tokens_file t.yaml")
    message = str(info.value)
    assert needle in message and message.startswith("security.tokens_file t.yaml")
    assert GOOD not in message and "12345678901234567890" not in message


def test_lookup_compares_every_token(tokens_file: Path) -> None:
    store = TokenStore(SecurityConfig(tokens_file=tokens_file), environ={})
    store.load()
    assert store.enabled
    assert store.lookup(GOOD) is not None and store.lookup(GOOD).tenant == "acme"  # type: ignore[union-attr]
    assert store.lookup(OTHER).tenant == "beta"  # type: ignore[union-attr]
    assert store.lookup(UNKNOWN) is None and store.lookup("") is None
    assert not TokenStore(SecurityConfig(), environ={}).enabled


def test_configuration_errors_name_the_field(pki: Pki, tmp_path: Path) -> None:
    def fails(security: dict[str, Any], needle: str) -> None:
        with pytest.raises(ConfigError) as info:
            cfg = load_config(None, {"security": {k: str(v) for k, v in security.items()}})
            GatewaySecurity(cfg.security, "voxgate.v1.VoiceGateway", _metrics(), environ={})
        assert needle in str(info.value), str(info.value)

    missing = tmp_path / "missing.pem"
    fails({"tls_cert": missing, "tls_key": pki.server_key}, "security.tls_cert: ")
    fails({"tls_cert": pki.server_cert}, "tls_cert and tls_key go together")
    fails({"client_ca": pki.ca}, "client_ca (mutual TLS) needs tls_cert")
    fails({"tokens_file": missing}, "security.tokens_file: ")
    # the key of another certificate, a file that is no PEM, a CA that is no certificate
    fails({"tls_cert": pki.server_cert, "tls_key": pki.client_key}, "security.tls_key: ")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    fails({"tls_cert": junk, "tls_key": pki.server_key}, "holds no PEM certificate")
    fails(
        {"tls_cert": pki.server_cert, "tls_key": pki.server_key, "client_ca": junk},
        "security.client_ca: ",
    )
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(pki.server_key.read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    fails({"tls_cert": pki.server_cert, "tls_key": encrypted}, "the private key is encrypted")
    empty = tmp_path / "empty.yaml"
    empty.write_text("[]\n")
    fails({"tokens_file": empty}, "authentication is on but there is no token")


def _metrics() -> Any:
    from voxgate.gateway.metrics import GatewayMetrics

    return GatewayMetrics()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/k"], "tls_cert:"),
        (["--tokens-file", "/nonexistent/tokens.yaml"], "security.tokens_file:"),
    ],
)
def test_voxgate_serve_exits_2_on_a_bad_security_file(flags: list[str], needle: str) -> None:
    out = subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "voxgate.cli", "serve", "--engines", "none", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_voxgate_serve_exits_2_on_a_key_that_does_not_match(pki: Pki) -> None:
    out = subprocess.run(  # noqa: PLW1510
        [
            *(sys.executable, "-m", "voxgate.cli", "serve", "--engines", "none", "--port", "0"),
            *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.client_key)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 2, out.stderr
    assert "security.tls_key:" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "PRIVATE KEY" not in out.stderr


# -- metrics stay off the public address ------------------------------------------------------


def test_metrics_bind_to_their_own_host_by_default() -> None:
    cfg = load_config(None, {"server": {"host": "0.0.0.0"}})
    assert cfg.server.metrics_host == "127.0.0.1"


async def test_metrics_listen_on_metrics_host_not_on_the_grpc_host() -> None:
    async with running_server(
        server={"host": "127.0.0.1", "metrics_port": 0, "metrics_host": "127.0.0.2"}
    ) as srv:
        port = srv.metrics_port

        def fetch(host: str) -> str:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
                return str(resp.read().decode())

        assert "voxgate_calls_active" in await asyncio.to_thread(fetch, "127.0.0.2")
        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(fetch, "127.0.0.1")


# -- clients: flags, files, the SIP bridge's gateway leg ------------------------------------------


def _call_args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    return parser.parse_args(list(argv))


def test_client_flags(pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VOXGATE_TOKEN", raising=False)
    assert connection_from_args(_call_args()) == (False, None)
    assert connection_from_args(_call_args("--tls")) == (True, None)
    tls, token = connection_from_args(_call_args("--tls-ca", str(pki.ca), "--token", GOOD))
    assert isinstance(tls, grpc.ChannelCredentials) and token == GOOD
    token_file = tmp_path / "token"
    token_file.write_text(f"{OTHER}\n")
    assert connection_from_args(_call_args("--token-file", str(token_file)))[1] == OTHER
    monkeypatch.setenv("VOXGATE_TOKEN", GOOD)
    assert connection_from_args(_call_args())[1] == GOOD
    assert read_token(GOOD, token_file) == GOOD  # the flag beats the file
    for argv, needle in (
        (["--tls-cert", str(pki.client_cert)], "--tls-cert and --tls-key go together"),
        (["--tls-ca", str(tmp_path / "nope.pem")], "TLS CA: cannot read"),
        (["--tls-ca", str(token_file)], "is not a PEM file"),
        (["--token-file", str(tmp_path / "nope")], "cannot read token file"),
    ):
        with pytest.raises(ValueError, match=re.escape(needle)):
            connection_from_args(_call_args(*argv))


def test_voxgate_call_refuses_an_unreadable_ca_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(  # noqa: PLW1510
        [
            *(sys.executable, "-m", "voxgate.cli", "call", str(tmp_path / "a.wav")),
            *("--tls-ca", str(tmp_path / "ca.pem")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"voxgate call: TLS CA: cannot read {tmp_path / 'ca.pem'}: No such file or directory"
    ]


def test_the_sip_bridge_config_never_shows_its_token() -> None:
    cfg = BridgeConfig(gateway_token=GOOD)  # type: ignore[arg-type]
    assert GOOD not in repr(cfg) and GOOD not in str(cfg.model_dump())


async def test_the_sip_bridge_reaches_a_gateway_over_mutual_tls_with_a_token(
    pki: Pki, tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateway(
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        client_ca=pki.ca,
        tokens_file=tokens_file,
    ) as srv:
        for token in (None, OTHER):
            config = BridgeConfig(
                listen_host="127.0.0.1",
                listen_port=0,
                gateway=srv.target,
                gateway_tls_ca=pki.ca,
                gateway_tls_cert=pki.client_cert,
                gateway_tls_key=pki.client_key,
                gateway_token=token,  # type: ignore[arg-type]
            )
            # The client the bridge opens from its config (passed in, so the test can use it).
            client = gateway_client(config)
            bridge = SipBridge(config, SilentBot(), client=client)
            await bridge.start()
            try:
                # The bridge asks for the gateway's voices at start (over mTLS, with its token)
                # and opens each call's Converse with the same client (channel and metadata).
                if token:
                    call = await client.converse(CallConfig())
                    assert call.session is not None
                    await call.aclose()
                else:
                    with pytest.raises(VoxgateError) as info:
                        await client.converse(CallConfig())
                    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
            finally:
                await bridge.aclose()
    assert "UNAUTHENTICATED" in caplog.text
    for token in ALL_TOKENS:
        assert token not in caplog.text


# -- one real call: the real models over TLS with a token, through `voxgate call` ---------------


@pytest.fixture
def real_hub() -> Iterator[Any]:
    from voxgate.gateway.runtime import build_hub

    yield build_hub(load_config(None, {"engines": "asr,tts"}))


@pytest.mark.model
async def test_voxgate_call_over_tls_with_a_token_against_the_real_models(
    real_hub: Any, pki: Pki, tokens_file: Path, speech_dir: Path, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(GOOD + "\n")
    security = {
        "tls_cert": str(pki.server_cert),
        "tls_key": str(pki.server_key),
        "tokens_file": str(tokens_file),
    }
    async with running_server(
        hub=real_hub, security=security, limits={"max_realtime_factor": 1000.0}
    ) as srv:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "voxgate.cli", "call", str(speech_dir / "cmu_goforward.wav")),
            *("--target", srv.target, "--tls-ca", str(pki.ca), "--token-file", str(token_file)),
            *("--say", "Hello, how can I help?", "--wait-for-bot", "start"),
            *("--out", str(tmp_path / "reply.wav")),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
            env={k: v for k, v in os.environ.items() if k != "VOXGATE_TOKEN"},
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
        assert srv.metrics.value("voxgate_calls_total", rpc="converse") == 1
    text = out.decode()
    assert proc.returncode == 0, (text, err.decode())
    assert re.search(r"go forward,? (ten|10) meters", text, re.IGNORECASE), text
    # the greeting was synthesized by the real voice and heard out before the caller spoke
    assert "BARGE-IN" not in text, text
    samples, rate = read_wav(tmp_path / "reply.wav")
    assert len(samples) > rate  # more than a second of the bot's voice
    assert GOOD not in text and GOOD not in err.decode()
