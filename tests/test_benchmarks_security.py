"""benchmarks/security_overhead.py in a tiny mode, so that it never rots.

It starts its four real gateways (plaintext, token, TLS + token, mTLS + token) and checks that
every setting was measured the asked number of times, never how fast anything was (speed is
what the benchmark itself reports).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.security_overhead import KINDS, SETTINGS, main

pytestmark = pytest.mark.e2e


def test_tiny_run_measures_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rounds", "2", "--unary", "3", "--calls", "2", "--connects", "1", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[0].strip() for line in out[2:6]]
    assert rows == list(SETTINGS)
    samples = json.loads(out[-1])
    assert set(samples) == set(SETTINGS)
    for name in SETTINGS:
        assert {k: len(samples[name][k]) for k in KINDS} == {
            "unary": 6,
            "call setup": 4,
            "connect": 2,
        }
        assert all(x > 0 for k in KINDS for x in samples[name][k])
