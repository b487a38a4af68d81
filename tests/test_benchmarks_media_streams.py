"""benchmarks/media_streams.py in a tiny mode, so that it never rots.

Two streams through the adapter (its own process) and the fake tone voice: both replies play
whole with no underrun, paced within the lead, and the table prints.
"""

from __future__ import annotations

import pytest

from benchmarks.media_streams import main

pytestmark = pytest.mark.e2e


async def test_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    (row,) = await main(["--streams", "2", "--reply-s", "1", "--chunk-ms", "40"])
    # Underruns and the lead are measurements of a loaded machine, the benchmark's to report,
    # not this smoke test's to bound; that every stream completes to the schema is not.
    assert row["complete"] == 2 and row["violations"] == 0
    assert row["underruns"] >= 0 and row["lead_p95_ms"] > 0
    assert row["cpu_ms_per_stream_s"] > 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("adapter --lead-ms 100") and "| 2 | 40 | 2 |" in out
