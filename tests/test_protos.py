"""The contract: committed stubs equal a fresh regeneration; field numbers never move."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from venvs import venv_python

from voxgate.v1 import voxgate_pb2 as pb

pytestmark = pytest.mark.unit

PROTOS = Path(__file__).resolve().parents[1] / "protos"


def test_committed_stubs_match_a_fresh_regeneration(tmp_path: Path) -> None:
    """The stubs are protobuf 5.29 gencode from grpcio-tools 1.71.2 (protos/generate.sh), older
    than any runtime the server asks for, so that it installs beside pipecat-ai (protobuf < 7)."""
    py = venv_python(".venv-client-pb5")
    subprocess.run(["bash", str(PROTOS / "generate.sh"), str(tmp_path), str(py)], check=True)
    for name in ("voxgate_pb2.py", "voxgate_pb2.pyi", "voxgate_pb2_grpc.py"):
        fresh = (tmp_path / "voxgate/v1" / name).read_text()
        committed = (PROTOS / "voxgate/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run protos/generate.sh and commit"
    assert "Protobuf Python Version: 5.29." in (PROTOS / "voxgate/v1/voxgate_pb2.py").read_text()


def test_package_and_fixed_names() -> None:
    assert pb.DESCRIPTOR.package == "voxgate.v1"
    svc = pb.DESCRIPTOR.services_by_name["VoiceGateway"]
    assert {m.name for m in svc.methods} == {
        "Converse",
        "StreamingRecognize",
        "Synthesize",
        "ListModels",
        "ListVoices",
    }
    req = pb.ConverseRequest.DESCRIPTOR.oneofs_by_name["event"]
    assert [f.name for f in req.fields][:6] == [
        "config",
        "audio",
        "speak",
        "clear",
        "mark",
        "hangup",
    ]
    resp = pb.ConverseResponse.DESCRIPTOR.oneofs_by_name["event"]
    assert [f.name for f in resp.fields][:7] == [
        "started",
        "speech",
        "transcript",
        "audio",
        "mark",
        "interrupted",
        "error",
    ]
    assert pb.Encoding.Value("ENCODING_UNSPECIFIED") == 0
    assert pb.SpeechEvent.Type.Value("TYPE_UNSPECIFIED") == 0


# Field numbers of the published v1 contract. Never change a line here: add new fields below.
FROZEN = {
    "ConverseRequest": {"config": 1, "audio": 2, "speak": 3, "clear": 4, "mark": 5, "hangup": 6},
    "SessionConfig": {"input_audio": 1, "output_audio": 2, "interim_results": 4, "language": 6},
    "AudioFormat": {"encoding": 1, "sample_rate_hertz": 2},
    "AudioChunk": {"data": 1},
    "SpeechEvent": {"type": 1, "offset_ms": 2},
    "Transcript": {"text": 1, "is_final": 2, "start_ms": 3, "end_ms": 4, "words": 5},
    "ConverseResponse": {
        "started": 1,
        "speech": 2,
        "transcript": 3,
        "audio": 4,
        "mark": 5,
        "interrupted": 6,
        "error": 7,
    },
}


@pytest.mark.parametrize("message", sorted(FROZEN))
def test_field_numbers_never_move(message: str) -> None:
    desc = pb.DESCRIPTOR.message_types_by_name[message]
    for field, number in FROZEN[message].items():
        assert desc.fields_by_name[field].number == number, (message, field)
