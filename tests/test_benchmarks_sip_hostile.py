"""benchmarks/sip_hostile.py in a tiny mode, so that it never rots.

It runs the three hostile cases against a real bridge and gateway and checks what this bridge
promises: nothing sent to a spoofed ``c=``, nothing to a stranger, the caller still heard, and
vanished calls ended after the RTP timeout. (The full run prints the same table for comparison
with an older bridge.)
"""

from __future__ import annotations

import pytest

from benchmarks.sip_hostile import main

pytestmark = pytest.mark.e2e


async def test_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    res = await main(["--window", "1", "--calls", "2", "--hold", "2.5", "--rtp-timeout", "1"])
    assert res["spoofed c="] == {"packets": 0, "bytes": 0, "byes": 0}
    assert res["hijack"]["to_stranger_after_1_pkt"] == 0 and res["hijack"]["to_stranger"] == 0
    assert res["hijack"]["to_caller_after_attack"] > 0
    assert res["vanished"] == {"answered": 2, "still_up_after_2.5s": 0}
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "bridge rtp_timeout_s: 1 s" and "vanished" in out
