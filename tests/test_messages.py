"""The event-to-message mapping both sides share (voxgate.common.messages.fill).

The servicer's outbound events (gateway/wire.py) and the client library's typed events
(voxgate_client._events) are copied into their ``ConverseResponse`` case by the contract's field
names, and both sides' VAD settings into ``VadConfig`` the same way. These tests hold every
such event to carrying every field of its message, and pin what ``fill`` does with optional,
repeated, nested and all-default values.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

import voxgate_client as vc
from voxgate.common.messages import fill
from voxgate.gateway import events as sev
from voxgate.gateway import wire
from voxgate.gateway.config import VadConfig
from voxgate.gateway.errors import ErrorKind
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import _events as cev
from voxgate_client._proto import voxgate_pb2 as cpb

pytestmark = pytest.mark.unit


def _message_fields(message: object) -> set[str]:
    return {f.name for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("cases", "response"),
    [(wire._PLAIN_CASES, pb.ConverseResponse), (cev._PLAIN_CASES, cpb.ConverseResponse)],
    ids=["server", "client"],
)
def test_every_plain_event_carries_every_field_of_its_message(cases, response) -> None:
    assert cases, "no plain events"
    for event_cls, case in cases.items():
        message = getattr(response(), case)
        attrs = {f.name for f in dataclasses.fields(event_cls)}
        missing = _message_fields(message) - attrs
        assert not missing, f"{event_cls.__name__} lacks {sorted(missing)} of {case}"


def test_nested_client_items_and_both_vad_settings_carry_their_message_fields() -> None:
    for item_cls, message in [(cev.Word, cpb.Word()), (cev.Alternative, cpb.Alternative())]:
        assert _message_fields(message) <= {f.name for f in dataclasses.fields(item_cls)}
    assert _message_fields(cpb.VadConfig()) <= {f.name for f in dataclasses.fields(vc.VadOptions)}
    assert _message_fields(pb.VadConfig()) <= set(VadConfig.model_fields)


def test_server_outbound_events_become_their_messages() -> None:
    got = wire.outbound(sev.InterruptedOut("s1", 1200, ("yes", "I"), 3400, "stop"))
    assert got == pb.ConverseResponse(
        interrupted=pb.PlaybackInterrupted(
            speak_id="s1",
            played_ms=1200,
            words_played=["yes", "I"],
            at_offset_ms=3400,
            caller_text="stop",
        )
    )
    assert wire.outbound(sev.MarkReachedOut("")).WhichOneof("event") == "mark"
    assert wire.outbound(sev.SpeechOut(False, 80, 2)) == pb.ConverseResponse(
        speech=pb.SpeechEvent(type=pb.SpeechEvent.SPEECH_END, offset_ms=80, utterance_index=2)
    )
    err = wire.outbound(sev.ErrorOut(ErrorKind.RESOURCE_EXHAUSTED, "busy", "speak", 0, "s2"))
    assert err.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert (err.error.message, err.error.scope, err.error.speak_id) == ("busy", "speak", "s2")
    with pytest.raises(TypeError):
        wire.outbound(object())  # type: ignore[arg-type]


def test_client_events_round_trip_through_their_messages() -> None:
    config = cpb.SessionConfig(language="en")
    events: list[cev.ServerEvent] = [
        cev.SessionStarted("id", "base", "joe", "1", config, 2.0),
        cev.SpeechBegin(10, 1, 2.0),
        cev.Transcript(
            "hi there",
            True,
            100,
            900,
            1,
            0.5,
            0.25,
            "en",
            7,
            (cev.Word("hi", 100, 300, 0.5), cev.Word("there", 300, 900, 0.25)),
            (cev.Alternative("hi dare", 0.125),),
            2.0,
            turn_index=3,
        ),
        cev.Transcript("", False, 0, 0, 0, received_s=2.0),  # turn_index None stays unset
        cev.PlaybackInterrupted("s", 5, ("a",), 6, 2.0, "no"),
        cev.ErrorEvent(grpc.StatusCode.INVALID_ARGUMENT, "bad", "speak", 0, "s", 2.0),
        cev.QualityChanged((), "", 2.0),  # every field default: the case is still chosen
        cev.EndOfTurn(1, 0.5, 2, "t", 0, 1, "smart", 300, 4, 2.0),
    ]
    for event in events:
        message = cev.event_to_proto(event)
        assert cev.event_from_proto(message, 2.0) == event, message
    assert not cev.event_to_proto(events[3]).transcript.HasField("turn_index")


def test_fill_leaves_none_unset_and_names_a_missing_attribute() -> None:
    vad = fill(cpb.VadConfig(), vc.VadOptions(frame_ms=30))
    assert not vad.HasField("aggressiveness") and vad.frame_ms == 30
    assert fill(cpb.VadConfig(), vc.VadOptions(aggressiveness=0)).HasField("aggressiveness")

    @dataclasses.dataclass
    class NoName:
        other: str = ""

    with pytest.raises(AttributeError, match="name"):
        fill(cpb.MarkReached(), NoName())
