"""The media-streams adapter's pure parts: the two dialects' schemas and the timing policies."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from voxgate.bridges.media_streams._dialect import (
    CLOSE_INVALID,
    CLOSE_POLICY,
    CLOSE_UNSUPPORTED,
    Connected,
    Dtmf,
    Mark,
    Media,
    ProtocolError,
    ProviderError,
    Start,
    Stop,
    Unknown,
    build_clear,
    build_mark,
    build_media,
    parse,
)
from voxgate.bridges.media_streams._timing import ChunkOrderer, OutboundPacer, Rechunker

pytestmark = pytest.mark.unit

# The providers' published examples (field for field; ids shortened).
TWILIO_START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC123",
        "streamSid": "MZ123",
        "callSid": "CA123",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"FirstName": "Jane", "from": "+15550100"},
    },
    "streamSid": "MZ123",
}
TELNYX_START = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": "32DE0DEA-53CB-4B21-89A4-9E1819C043BC",
    "start": {
        "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
        "call_control_id": "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ",
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "tags": ["TAG1", "TAG2"],
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "custom_parameters": {"customer_id": "customer_123"},
        "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1},
    },
}


def j(obj: object) -> str:
    return json.dumps(obj)


def test_twilio_start_carries_the_call_metadata() -> None:
    start = parse(j(TWILIO_START), "twilio")
    assert isinstance(start, Start)
    assert (start.sequence, start.stream_id, start.call_id) == (1, "MZ123", "CA123")
    assert (start.encoding, start.sample_rate_hz, start.channels) == ("mulaw", 8000, 1)
    assert start.parameters == {"FirstName": "Jane", "from": "+15550100"}
    assert start.provider == {"accountSid": "AC123"}
    assert start.tracks == ("inbound",)


def test_telnyx_start_differs_in_names_and_takes_a_law() -> None:
    start = parse(j(TELNYX_START), "telnyx")
    assert isinstance(start, Start)
    assert start.stream_id == "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
    assert start.call_id.startswith("v2:")
    assert start.encoding == "alaw"
    assert (start.from_, start.to) == ("+13122010094", "+13122123456")
    assert start.parameters == {"customer_id": "customer_123"}
    # Twilio's field names mean nothing in the Telnyx dialect.
    with pytest.raises(ProtocolError) as err:
        parse(j(TWILIO_START), "telnyx")
    assert err.value.close_code == CLOSE_INVALID


def test_media_dtmf_mark_stop_and_telnyx_error() -> None:
    payload = base64.b64encode(b"\xff" * 160).decode()
    media = parse(
        j(
            {
                "event": "media",
                "sequenceNumber": "3",
                "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": payload},
                "streamSid": "MZ123",
            }
        ),
        "twilio",
    )
    assert media == Media(3, "MZ123", "inbound", 1, 5, b"\xff" * 160)
    dtmf = parse(
        j(
            {
                "event": "dtmf",
                "streamSid": "MZ123",
                "sequenceNumber": "5",
                "dtmf": {"track": "inbound_track", "digit": "1"},
            }
        ),
        "twilio",
    )
    assert dtmf == Dtmf(5, "MZ123", "1")
    mark = parse(j({"event": "mark", "sequence_number": "4", "mark": {"name": "x"}}), "telnyx")
    assert mark == Mark(4, None, "x")
    stop = parse(j({"event": "stop", "sequenceNumber": "9", "stop": {}}), "twilio")
    assert stop == Stop(9, None)
    err = parse(
        j({"event": "error", "payload": {"code": 100002, "title": "Unknown error"}}), "telnyx"
    )
    assert err == ProviderError(None, None, "100002", "Unknown error")
    assert parse(j({"event": "connected", "version": "1.0.0"}), "telnyx") == Connected("", "1.0.0")
    assert parse(j({"event": "newfangled"}), "twilio") == Unknown(None, None, "newfangled")


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        (b"\x00\x01", CLOSE_UNSUPPORTED, "binary"),
        ("{not json", CLOSE_INVALID, "not JSON"),
        ("[1, 2]", CLOSE_INVALID, "not a JSON object"),
        (j({"no": "event"}), CLOSE_INVALID, "no `event`"),
        (j({"event": "media", "media": "x"}), CLOSE_INVALID, "`media` must be an object"),
        (j({"event": "media", "media": {"payload": "!!!"}}), CLOSE_INVALID, "not base64"),
        (j({"event": "media", "sequenceNumber": "x1", "media": {}}), CLOSE_INVALID, "decimal"),
        (j({"event": "media", "sequenceNumber": 1.5, "media": {}}), CLOSE_INVALID, "decimal"),
        (j({"event": "dtmf", "dtmf": {"digit": "12"}}), CLOSE_INVALID, "0-9"),
        (j({"event": "mark", "mark": {}}), CLOSE_INVALID, "`name`"),
        (j({"event": "media", "streamSid": 7, "media": {}}), CLOSE_INVALID, "streamSid"),
    ],
)
def test_malformed_messages_name_the_fault_and_the_close_code(
    raw: str | bytes, code: int, words: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        parse(raw, "twilio")
    assert err.value.close_code == code
    assert words in err.value.reason


def test_a_format_the_gateway_cannot_take_is_refused_with_what_to_send() -> None:
    bad = json.loads(j(TWILIO_START))
    bad["start"]["mediaFormat"]["sampleRate"] = 16000
    with pytest.raises(ProtocolError) as err:
        parse(j(bad), "twilio")
    assert err.value.close_code == CLOSE_UNSUPPORTED
    assert "audio/x-mulaw at 8000 Hz" in err.value.reason
    other = json.loads(j(TWILIO_START))
    other["start"]["streamSid"] = "MZ999"
    with pytest.raises(ProtocolError) as err:
        parse(j(other), "twilio")
    assert err.value.close_code == CLOSE_POLICY


def test_a_huge_value_is_never_echoed_whole() -> None:
    with pytest.raises(ProtocolError) as err:
        parse(j({"event": "dtmf", "dtmf": {"digit": "9" * 100_000}}), "twilio")
    assert len(err.value.reason) < 120


def test_outbound_messages_follow_each_dialect() -> None:
    assert json.loads(build_media("twilio", "MZ1", b"\x01\x02")) == {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"payload": "AQI="},
    }
    assert json.loads(build_mark("twilio", "MZ1", "m")) == {
        "event": "mark",
        "streamSid": "MZ1",
        "mark": {"name": "m"},
    }
    assert json.loads(build_clear("twilio", "MZ1")) == {"event": "clear", "streamSid": "MZ1"}
    assert json.loads(build_clear("telnyx", "S")) == {"event": "clear"}
    assert json.loads(build_media("telnyx", "S", b"\x01")) == {
        "event": "media",
        "media": {"payload": "AQ=="},
    }


def chunk(n: int) -> bytes:
    return bytes([n]) * 160


def test_orderer_passes_in_order_chunks_at_once() -> None:
    o = ChunkOrderer()
    assert [o.push(i, chunk(i)) for i in (1, 2, 3)] == [[chunk(1)], [chunk(2)], [chunk(3)]]
    assert o.stats.late == o.stats.lost == o.stats.reordered == 0


def test_orderer_puts_a_swapped_pair_back_in_place() -> None:
    o = ChunkOrderer()
    assert o.push(1, chunk(1)) == [chunk(1)]
    assert o.push(3, chunk(3)) == []  # held: 2 may still come
    assert o.push(2, chunk(2)) == [chunk(2), chunk(3)]
    assert o.stats.reordered == 1 and o.stats.lost == 0


def test_orderer_fills_a_lost_chunk_with_silence_after_its_window() -> None:
    o = ChunkOrderer(window=2)
    out = o.push(1, chunk(1))
    for i in (3, 4, 5):
        out += o.push(i, chunk(i))
    assert out == [chunk(1), b"\xff" * 160, chunk(3), chunk(4), chunk(5)]
    assert o.stats.lost == 1
    # The lost chunk arriving after all is late and dropped; a duplicate too.
    assert o.push(2, chunk(2)) == []
    assert o.push(5, chunk(5)) == []
    assert o.stats.late == 2


def test_rechunker_makes_whole_chunks_and_pads_the_last() -> None:
    r = Rechunker()
    assert r.push(b"\x01" * 100, last=False) == []
    assert r.push(b"\x01" * 100, last=False) == [b"\x01" * 160]
    assert r.push(b"\x02" * 10, last=True) == [b"\x01" * 40 + b"\x02" * 10 + b"\xff" * 110]
    r.push(b"\x03" * 50, last=False)
    r.reset()
    assert r.push(b"\x04" * 160, last=False) == [b"\x04" * 160]


def test_pacer_lets_a_lead_go_at_once_then_holds_to_real_time() -> None:
    p = OutboundPacer(lead_ms=100)
    now = 50.0
    sent = 0
    while p.delay_s(now) == 0:
        p.sent(now)
        sent += 1
    # 100 ms of lead plus the chunk playing now: six 20 ms chunks before the first wait.
    assert sent == 6
    assert p.delay_s(now) == pytest.approx(0.02)
    # Then one chunk per 20 ms: over 1 s of steps, 50 more.
    for _ in range(1000):
        now += 0.001
        while p.delay_s(now) == 0:
            p.sent(now)
            sent += 1
    assert sent == 56
    assert p.queued_s(now) <= 0.12 + 1e-9


def test_pacer_restarts_after_a_clear_and_after_running_dry() -> None:
    p = OutboundPacer(lead_ms=40)
    for _ in range(3):
        p.sent(0.0)
    assert p.delay_s(0.0) > 0
    p.reset(0.0)
    assert p.delay_s(0.0) == 0
    # Idle for a second: the provider ran dry, the next chunk plays on arrival.
    assert p.delay_s(1.0) == 0 and p.queued_s(1.0) == 0


def test_the_stream_token_file_must_hold_one_url_safe_token(tmp_path: Path) -> None:
    from voxgate.bridges.media_streams.cli import _read_stream_token

    good = tmp_path / "good"
    good.write_text("abcdefgh-1234567_89\n")
    assert _read_stream_token(good) == "abcdefgh-1234567_89"
    assert _read_stream_token(None) is None
    for text, words in (("short", "16 or more"), ("a/b" * 8, "URL-safe"), ("x" * 20 + " y", "one")):
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(ValueError, match=words) as err:
            _read_stream_token(bad)
        assert text not in str(err.value)  # the token itself is never echoed
    with pytest.raises(ValueError, match="cannot read"):
        _read_stream_token(tmp_path / "missing")


# -- the bad-bot policy flags ------------------------------------------------------------------


def _media_args(*argv: str) -> object:
    import argparse

    from voxgate.bridges.media_streams.cli import add_media_streams_arguments

    parser = argparse.ArgumentParser()
    add_media_streams_arguments(parser)
    return parser.parse_args(list(argv))


def test_media_streams_takes_the_same_bad_bot_flags_as_the_sip_bridge() -> None:
    from voxgate.bridges.bots import bot_policy_from_args

    args = _media_args("--bot-answer-timeout", "2.5", "--bot-fallback", "One moment please.")
    policy = bot_policy_from_args(args)  # type: ignore[arg-type]
    assert (policy.answer_timeout_s, policy.fallback_speech, policy.then) == (
        2.5,
        "One moment please.",
        "hangup",
    )


def test_media_streams_does_not_offer_a_fallback_transfer_but_the_sip_bridge_does() -> None:
    """A media stream cannot transfer a call: the flag is not offered there (it used to be
    listed in --help and then refused at start); the SIP bridge keeps it."""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "voxgate.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    media = run("media-streams", "--help")
    assert media.returncode == 0, media.stderr
    assert "--bot-fallback-transfer" not in media.stdout
    assert "--bot-fallback " in media.stdout and "--bot-answer-timeout" in media.stdout
    refused = run("media-streams", "--bot-fallback-transfer", "sip:desk@example.org")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "unrecognized arguments: --bot-fallback-transfer" in refused.stderr, refused.stderr
    sip = run("sip", "--help")
    assert sip.returncode == 0 and "--bot-fallback-transfer" in sip.stdout, sip.stderr


def test_the_sip_bridge_turns_a_fallback_transfer_into_its_policy() -> None:
    import argparse

    from voxgate.bridges.bots import bot_policy_from_args
    from voxgate.bridges.sip.cli import add_sip_arguments

    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    args = parser.parse_args(["--bot-fallback-transfer", "sip:desk@example.org"])
    policy = bot_policy_from_args(args)
    assert (policy.then, policy.transfer_to) == ("transfer", "sip:desk@example.org")
