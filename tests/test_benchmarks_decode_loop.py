"""benchmarks/decode_loop.py in its tiny mode, so that it never rots.

One clip: float32 loop vs generate (the run fails if any token differs), one speed row, one
Piper-spoken phrase sentence. Speed itself is what the benchmark reports, never checked here.
"""

from __future__ import annotations

import pytest

from benchmarks.decode_loop import main

pytestmark = pytest.mark.model


def test_tiny_run_prints_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--tiny", "--equality", "--speed", "--phrases"])
    out = capsys.readouterr().out
    assert "float32       1          1     1" in out
    rows = [line.split() for line in out.splitlines()]
    speed = [r for r in rows if r and r[0] == "1" and len(r) == 8]
    assert len(speed) == 1 and all(float(x) > 0 for x in speed[0][1:])
    assert "boosted ^6" in out


def test_tiny_join_section_runs_all_three_configs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--tiny", "--join"])
    out = capsys.readouterr().out
    rows = {
        name: line.split()[-5:]
        for line in out.splitlines()
        for name in ("generate, batch at a time", "loop, batch at a time", "loop + join_running")
        if line.startswith(name)
    }
    assert len(rows) == 3, out
    assert all(float(x) > 0 for r in rows.values() for x in r[:3])
    # Only the join_running config may join (the short one arrived while the long one ran,
    # or, if the long one had already finished, ran alone: both are valid outcomes).
    assert rows["generate, batch at a time"][3] == "0" and rows["loop, batch at a time"][3] == "0"
