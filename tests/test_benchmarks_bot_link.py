"""benchmarks/bot_link.py in a tiny mode, so that it never rots.

Every door completes every round trip (the benchmark raises otherwise) and the table prints
one row per door and call count.
"""

from __future__ import annotations

import pytest

from benchmarks.bot_link import DOORS, main

pytestmark = pytest.mark.e2e


async def test_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    res = await main(["--calls", "1,2", "--rounds", "3", "--repeats", "2"])
    for calls in (1, 2):
        for door in DOORS:
            row = res[calls][door]
            assert row["n"] == calls * 3 * 2
            assert 0 < row["p50"] <= row["p95"]
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["calls", "door"]
    assert sum("link (gRPC bot)" in line for line in out.splitlines()) == 2
