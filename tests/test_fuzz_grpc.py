"""Structured fuzzing through a real server, bounded for CI (benchmarks/fuzz_grpc.py has the rest).

Hypothesis draws whole calls (valid messages with random field values, in random order and
timing, plus raw bytes) for Converse, StreamingRecognize, Synthesize and the discovery RPCs, many
at once, against a real grpc.aio server with the real Whisper model; Speak is voiced by the fake
tone (voxgate.gateway.testing) to keep CPU for recognition. Meanwhile one well-behaved caller
streams a real clip at real time, over and over. Derandomized: the same cases every run.

Properties: no INTERNAL or UNKNOWN status, every stream ends with its status within the bound,
no server ERROR log line, no call left open, and the well-behaved transcript never changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from benchmarks.fuzz_grpc import END_BOUND_S, Case, FuzzRig, batches, main

pytestmark = [pytest.mark.e2e, pytest.mark.model]

BATCH = 16
EXAMPLES = 20  # 320 cases; about 20 s of fuzzing on 2 cores


@pytest.fixture(scope="module")
def rig(speech_dir: Path) -> Iterator[FuzzRig]:
    with FuzzRig(speech_dir=speech_dir) as r:
        yield r
    # An unclosed loop is found by the collector later, in another test, as ResourceWarnings.
    assert r.loop.is_closed()


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=batches(BATCH))
def test_fuzzed_calls_end_deliberately(rig: FuzzRig, batch: list[Case]) -> None:
    bad_before, hung_before = len(rig.stats.bad), len(rig.stats.hung)
    logs_before = len(rig.stats.error_logs)
    rig.run_batch(batch)
    assert rig.stats.bad[bad_before:] == [], "INTERNAL/UNKNOWN status"
    assert rig.stats.hung[hung_before:] == [], f"a stream did not end within {END_BOUND_S} s"
    assert rig.stats.error_logs[logs_before:] == [], "the server logged an ERROR"


def test_zz_after_the_fuzz_nothing_is_left_open_and_the_caller_heard_the_same(
    rig: FuzzRig,
) -> None:
    """Runs after the fuzz in this module (file order): closes the rig and checks the end state."""
    rig.__exit__(None, None, None)
    assert rig.stats.cases >= BATCH * EXAMPLES
    assert rig.left_open == 0
    assert rig.server_outcomes.get("internal", 0) == 0
    assert rig.stats.well_behaved_runs >= 1
    assert rig.stats.well_behaved_changed == [], rig.baseline
    # The fuzz reached past the first message: calls ran, ended by the client and by limits.
    assert rig.server_outcomes.get("ok", 0) > 0
    assert rig.server_outcomes.get("invalid_argument", 0) > 0


def test_the_benchmark_runs_in_a_tiny_mode(
    speech_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--cases", "8", "--batch", "8", "--speech-dir", str(speech_dir)]) == 0
    out = capsys.readouterr().out
    assert "well-behaved unchanged          yes" in out
    assert "INTERNAL or UNKNOWN             0" in out
