"""benchmarks/sip_calls.py in a tiny mode (one short call per path), so that it never rots.

It runs the real bridge process, SIPp and Kamailio, and checks that both paths produce a row
with reply audio, a setup time and a CPU figure (the full run prints the 1/10/25-call table).
"""

from __future__ import annotations

import pytest

from benchmarks.sip_calls import main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("sipp")]


async def test_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    table = await main(["--calls", "1", "--call-ms", "2000"])
    assert set(table) == {("direct", 1), ("proxy", 1)}
    for row in table.values():
        assert row["packets"] > 50  # a 2 s call greeted for its whole length: ~100 packets
        # SIPp times the INVITE -> 200 on its millisecond clock: a direct call on a fast
        # machine answers within the same millisecond (0), one through Kamailio takes more.
        assert 0 <= row["setup_p50_ms"] <= row["setup_p95_ms"]
        assert row["cpu_pct_per_call"] > 0
    # Kamailio's processes are measured apart from the bridge's (a few clock ticks per call at
    # most: far below the bridge, which streams the RTP).
    proxy = table["proxy", 1]
    assert proxy["setup_p50_ms"] > 0  # the proxy's hop is never within the same millisecond
    assert 0 <= proxy["proxy_cpu_pct_per_call"] < proxy["cpu_pct_per_call"]
    assert table["direct", 1]["proxy_cpu_pct_per_call"] == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["path", "calls"]
    assert [ln.split()[0] for ln in lines[1:]] == ["direct", "proxy"]
