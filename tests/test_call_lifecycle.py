"""Every call ends: call-ending errors in every playback phase, undecodable bytes, statuses.

A real grpc.aio server on a loopback port. The voice here is the FAKE tone voice (the defect is
in the session's task graph, not in synthesis); the bundled voice's own Speak errors are covered
in test_tts_gateway.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from calls import config

from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.fake_engines import FakeToneHub, FakeToneSynthesizer
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

#: A hang guard only (a zombie call never ends): nothing here asserts on how long things take.
HANG_S = 20.0


@asynccontextmanager
async def tone_server(
    synth: FakeToneSynthesizer | None = None, **overrides: object
) -> AsyncIterator[tuple[GatewayServer, pb_grpc.VoiceGatewayStub]]:
    async with (
        running_server(hub=FakeToneHub(synth), **overrides) as srv,  # type: ignore[arg-type]
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        yield srv, pb_grpc.VoiceGatewayStub(ch)


_LOCAL_INTERNAL = "Internal error from Core"


class Call:
    """A Converse call with explicit writes and a concurrent reader."""

    def __init__(self, stub: pb_grpc.VoiceGatewayStub, method: str = "Converse") -> None:
        self.rpc = getattr(stub, method)()
        self.codes: list[tuple[grpc.StatusCode, str]] = []
        self.rpc.add_done_callback(self._on_done)
        self.events: list[pb.ConverseResponse] = []
        self.arrived = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> grpc.StatusCode:
        try:
            while (msg := await self.rpc.read()) is not grpc.aio.EOF:
                self.events.append(msg)
                self.arrived.set()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
            return exc.code()
        return grpc.StatusCode.OK

    async def send(self, msg: pb.ConverseRequest) -> None:
        # A write after the call ended fails; the reader has the status.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.rpc.write(msg)

    async def wait_for(self, pred: Callable[[pb.ConverseResponse], bool]) -> None:
        async def loop() -> None:
            while not any(pred(m) for m in self.events):
                if self.reader.done():
                    raise AssertionError(f"call ended first: {self.kinds()}")
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(loop(), HANG_S)

    def kinds(self) -> list[str]:
        return [str(m.WhichOneof("event")) for m in self.events]

    def _on_done(self, rpc: Any) -> None:
        # grpc.aio overwrites the server's status with a local INTERNAL "Internal error from
        # Core" when a write fails as the call ends (grpc/grpc#36066); done callbacks run on
        # every set, so each status is kept here, as the client library does.
        values = []
        for coro in (rpc.code(), rpc.details()):
            try:
                coro.send(None)
            except StopIteration as stop:
                values.append(stop.value)
            else:
                coro.close()
                return
        self.codes.append((values[0], values[1] or ""))

    async def status(self) -> grpc.StatusCode:
        """The server's status, seeing through grpc's local INTERNAL (see ``_on_done``)."""
        code = await asyncio.wait_for(self.reader, HANG_S)
        if code != grpc.StatusCode.INTERNAL:
            return code
        for _ in range(500):
            peer = [c for c, d in self.codes if (c, d) != (code, _LOCAL_INTERNAL)]
            if peer:
                return peer[0]
            await asyncio.sleep(0.002)
        return code


def kind(name: str) -> Callable[[pb.ConverseResponse], bool]:
    return lambda m: m.WhichOneof("event") == name


def last_audio(m: pb.ConverseResponse) -> bool:
    return m.WhichOneof("event") == "audio" and m.audio.is_last


LONG = "x" * 100  # 10 s of tone
#: max_queued_speaks in the playback-phase tests: a few writes overflow the queue.
QUEUED = 4
#: playout_lead_ms there: the longest tail, so the "tail" phase lasts a second after the last
#: frame leaves. With the default 60 ms a loaded machine could let the tail end (and the queue
#: drain) before the overflowing marks arrived, and the call rightly stayed open.
TAIL_LEAD_MS = 1_000
#: Each call-ending request with the status it must end the call with.
ENDINGS: dict[str, tuple[list[pb.ConverseRequest], grpc.StatusCode]] = {
    "bad-dtmf": ([pb.ConverseRequest(dtmf=pb.Dtmf(digit="Z"))], grpc.StatusCode.INVALID_ARGUMENT),
    "second-config": ([config()], grpc.StatusCode.INVALID_ARGUMENT),
    "odd-audio": (
        [pb.ConverseRequest(audio=pb.AudioChunk(data=b"\0\0\0"))],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "oversized-chunk": (
        [pb.ConverseRequest(audio=pb.AudioChunk(data=bytes(64_002)))],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "queue-overflow": (
        [pb.ConverseRequest(mark=pb.Mark(name=f"m{i}")) for i in range(QUEUED + 2)],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    "empty-mark": ([pb.ConverseRequest(mark=pb.Mark())], grpc.StatusCode.INVALID_ARGUMENT),
}
#: Where playback is when the error arrives.
PHASES = ["synthesizing", "playing", "tail", "queued-behind"]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_call_ending_error_during_playback_ends_the_call(ending: str, phase: str) -> None:
    """v0.1: the tts task swallowed its own cancellation and the call stayed open forever."""
    synth = FakeToneSynthesizer(first_piece_delay_s=30.0 if phase == "synthesizing" else 0.0)
    lead_ms = TAIL_LEAD_MS if phase == "tail" else 60
    async with tone_server(
        synth, limits={"max_queued_speaks": QUEUED}, session={"playout_lead_ms": lead_ms}
    ) as (srv, stub):
        call = Call(stub)
        await call.send(config())
        await call.wait_for(kind("started"))
        await call.send(pb.ConverseRequest(speak=pb.Speak(text="x" if phase == "tail" else LONG)))
        if phase == "queued-behind":
            for i in range(3):
                await call.send(pb.ConverseRequest(speak=pb.Speak(text=LONG, speak_id=f"q{i}")))
        if phase in ("playing", "queued-behind"):
            await call.wait_for(kind("audio"))
        elif phase == "tail":
            await call.wait_for(last_audio)  # the session now waits for the tail to be heard
        msgs, code = ENDINGS[ending]
        for msg in msgs:
            await call.send(msg)
        assert await call.status() == code, call.kinds()
        assert srv.servicer is not None
        for _ in range(200):
            if srv.servicer.calls.active_calls == 0:
                break
            await asyncio.sleep(0.01)
        assert srv.servicer.calls.active_calls == 0


async def test_a_voice_fault_mid_reply_is_an_error_event_and_the_call_goes_on() -> None:
    synth = FakeToneSynthesizer(fail_after_pieces=2)
    async with tone_server(synth) as (_, stub):
        call = Call(stub)
        await call.send(config())
        await call.send(pb.ConverseRequest(speak=pb.Speak(text=LONG, speak_id="a")))
        await call.wait_for(kind("error"))
        (err,) = [m.error for m in call.events if m.WhichOneof("event") == "error"]
        assert err.scope == "speak" and err.speak_id == "a"
        assert err.code == grpc.StatusCode.INTERNAL.value[0]
        assert "scripted" not in err.message  # the fault's text stays in the server log
        await call.send(pb.ConverseRequest(mark=pb.Mark(name="after")))
        await call.wait_for(kind("mark"))
        await call.rpc.done_writing()
        assert await call.status() == grpc.StatusCode.OK


# --- undecodable bytes and other wrong statuses -------------------------------------------------


def _raw(ch: grpc.aio.Channel, method: str, stream: bool) -> object:
    path = f"/voxgate.v1.VoiceGateway/{method}"
    if stream:
        return ch.stream_stream(path, request_serializer=None, response_deserializer=None)
    return ch.unary_stream(path, request_serializer=None, response_deserializer=None)


GARBAGE = b"\xff\xff\xff\xff\x0f"  # a varint that never ends: not a protobuf message


@pytest.mark.parametrize("method", ["Converse", "StreamingRecognize"])
@pytest.mark.parametrize("position", ["first", "after-config"])
async def test_undecodable_request_bytes_are_invalid_argument(method: str, position: str) -> None:
    """v0.1: INTERNAL with protobuf's DecodeError text."""
    async with tone_server() as (srv, _), grpc.aio.insecure_channel(srv.target) as ch:
        rpc = _raw(ch, method, stream=True)
        msgs = [GARBAGE] if position == "first" else [config().SerializeToString(), GARBAGE]

        async def gen() -> AsyncIterator[bytes]:
            for m in msgs:
                yield m

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in rpc(gen()):  # type: ignore[operator]
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid voxgate.v1.ConverseRequest" in (info.value.details() or "")
        assert "DecodeError" not in (info.value.details() or "")


@pytest.mark.parametrize("method", ["Synthesize", "ListModels", "ListVoices"])
async def test_undecodable_unary_request_is_invalid_argument(method: str) -> None:
    """v0.1: UNKNOWN for Synthesize."""
    async with tone_server() as (srv, _), grpc.aio.insecure_channel(srv.target) as ch:
        if method == "Synthesize":
            call = _raw(ch, method, stream=False)(GARBAGE)  # type: ignore[operator]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
        else:
            unary = ch.unary_unary(
                f"/voxgate.v1.VoiceGateway/{method}",
                request_serializer=None,
                response_deserializer=None,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await unary(GARBAGE)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid voxgate.v1." in (info.value.details() or "")


async def test_a_huge_dtmf_digit_is_reported_not_echoed() -> None:
    """v0.1: 300,000 characters echoed into the status; trailers over gRPC's metadata limit."""
    async with tone_server() as (_, stub):
        call = Call(stub)
        await call.send(config())
        await call.send(pb.ConverseRequest(dtmf=pb.Dtmf(digit="7" * 300_000)))
        assert await call.status() == grpc.StatusCode.INVALID_ARGUMENT
        details = call.error.details() or ""
        assert "dtmf.digit='7777" in details and "(300000 characters)" in details
        assert len(details) < 300


@pytest.mark.parametrize(
    ("cfg", "text"),
    [
        (pb.SessionConfig(call_id="c" * 1_000_000), "config.call_id has 1000000 characters"),
        (pb.SessionConfig(voice="v" * 100_000), "(100000 characters) is not loaded"),
    ],
    ids=["call-id", "voice"],
)
async def test_oversized_ids_are_refused_with_a_short_message(
    cfg: pb.SessionConfig, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """v0.1: a 1 MB call_id made a 1 MB log line."""
    cfg.input_audio.CopyFrom(pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000))
    async with tone_server() as (_, stub):
        call = Call(stub)
        await call.send(pb.ConverseRequest(config=cfg))
        assert await call.status() == grpc.StatusCode.INVALID_ARGUMENT
        details = call.error.details() or ""
        assert text in details and len(details) < 300
    assert all(len(r.getMessage()) < 1_000 for r in caplog.records)


async def test_a_long_speak_id_or_mark_name_is_refused() -> None:
    async with tone_server() as (_, stub):
        call = Call(stub)
        await call.send(config())
        await call.send(pb.ConverseRequest(speak=pb.Speak(text="hi", speak_id="s" * 10_000)))
        await call.wait_for(kind("error"))
        (err,) = [m.error for m in call.events if m.WhichOneof("event") == "error"]
        assert "speak.speak_id has 10000 characters" in err.message and err.speak_id == ""
        await call.send(pb.ConverseRequest(mark=pb.Mark(name="m" * 10_000)))
        assert await call.status() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mark.name has 10000 characters" in (call.error.details() or "")


async def test_churned_calls_are_counted_as_cancelled_without_error_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """v0.1: some client cancels were `internal` with a traceback, cancels before config
    `invalid_argument`."""
    rounds = 80
    async with tone_server() as (srv, stub):

        async def churn(i: int) -> None:
            call = stub.Converse()
            stage = i % 4
            if stage >= 1:
                await call.write(config())
                await call.read()
            if stage >= 2:
                await call.write(pb.ConverseRequest(speak=pb.Speak(text=LONG)))
                await call.write(pb.ConverseRequest(audio=pb.AudioChunk(data=bytes(640))))
            if stage == 3:
                await call.read()
                await call.read()
            await asyncio.sleep(0.001 * (i % 7))
            call.cancel()

        await asyncio.gather(*(churn(i) for i in range(rounds)))
        assert srv.servicer is not None
        for _ in range(500):
            if srv.servicer.calls.active_calls == 0:
                break
            await asyncio.sleep(0.01)
        assert srv.servicer.calls.active_calls == 0
        # A call cancelled before its first message may never reach the server; every one
        # that did is counted as cancelled, and as nothing else.
        outcomes = dict(srv.servicer.calls.outcomes)
    assert set(outcomes) == {"cancelled"}, outcomes
    assert outcomes["cancelled"] >= rounds * 3 // 4
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_an_internal_fault_sends_a_generic_message_and_logs_the_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """v0.1 put the exception's text (`internal error: FakeEngineError(...)`) in the status."""
    async with tone_server(FakeToneSynthesizer(fail_after_pieces=0)) as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Synthesize(pb.SynthesizeRequest(text="hello")):
                pass
    assert info.value.code() == grpc.StatusCode.INTERNAL
    details = info.value.details() or ""
    assert "scripted" not in details and "FakeEngineError" not in details
    m = re.search(r"the server log has the details under call (\w+)", details)
    assert m, details
    logged = [r for r in caplog.records if r.levelname == "ERROR" and m.group(1) in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log


async def test_the_log_says_when_a_call_ended_how_and_after_how_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """v0.1 logged "call started" and never "call ended"."""
    caplog.set_level("INFO", logger="voxgate.service")
    async with tone_server() as (_, stub):
        call = Call(stub)
        await call.send(config())
        await call.wait_for(kind("started"))
        await call.rpc.done_writing()
        assert await call.status() == grpc.StatusCode.OK
    lines = [r.getMessage() for r in caplog.records if r.name == "voxgate.service"]
    started = [m for m in lines if re.fullmatch(r"call (\w+) started .*", m)]
    assert len(started) == 1
    call_id = started[0].split()[1]
    assert any(re.fullmatch(rf"call {call_id} ended: ok after \d+\.\d s", m) for m in lines), lines


# --- idle streams cannot lock the server ---------------------------------------------------------


async def test_streams_that_never_send_config_are_ended_and_free_their_slots() -> None:
    """v0.1: 500 silent streams held 200 slots for good and real callers were refused."""
    limits = {"max_concurrent_calls": 4, "first_message_timeout_s": 0.3}
    async with tone_server(limits=limits) as (srv, stub):
        squatters = [stub.Converse() for _ in range(12)]

        async def status(rpc: grpc.aio.StreamStreamCall) -> grpc.StatusCode:
            try:
                while await rpc.read() is not grpc.aio.EOF:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        codes = await asyncio.wait_for(asyncio.gather(*(status(r) for r in squatters)), HANG_S)
        # Each was either ended for silence or refused while the slots were taken.
        assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
        assert srv.servicer is not None and srv.servicer.calls.active_calls == 0
        # A real caller gets in.
        call = Call(stub)
        await call.send(config())
        await call.wait_for(kind("started"))
        await call.rpc.done_writing()
        assert await call.status() == grpc.StatusCode.OK


async def test_a_silent_stream_is_told_which_limit_ended_it() -> None:
    async with tone_server(limits={"first_message_timeout_s": 0.2}) as (_, stub):
        call = Call(stub)
        assert await call.status() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no `config` arrived within first_message_timeout_s=0.2" in (
            call.error.details() or ""
        )
