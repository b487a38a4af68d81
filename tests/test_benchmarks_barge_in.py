"""benchmarks/barge_in in its tiny mode (one cell of each kind), so that it never rots.

Real models and a real server, but one call per row: it checks that every row is produced and
that the guard's column has no false barge-in on the echo it is given; the figures themselves
come from the full run.
"""

from __future__ import annotations

import pytest

from benchmarks import barge_in

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def test_barge_in_benchmark_tiny_mode(capsys: pytest.CaptureFixture[str]) -> None:
    out = barge_in.main(["--tiny", "--barge-in-model", "tiny.en", "--echo-canceller", "aec3"])
    printed = capsys.readouterr().out
    assert "false barge-ins" in printed and "true barge-in" in printed
    ((row,),) = [out["echo"]]
    assert row["today"]["calls"] == row["now"]["calls"] == row["aec3"]["calls"] == 1
    assert row["now"]["false_barge_ins"] == 0 and row["aec3"]["false_barge_ins"] == 0
    # --echo-canceller aec3: the immediate cases again on a server that cancels with AEC3.
    assert len(out["latency"]["immediate, aec3 (echo -10 dB, 120 ms)"]) == 1
    assert set(out["latency"]) >= {
        "immediate, today (no echo, guard off)",
        "immediate, now (echo -10 dB, 120 ms)",
        "after_words, now (echo -20 dB, 120 ms)",
    }
    assert all(len(v) == 1 for v in out["latency"].values())
    # (what the interrupting backchannel was heard as, should it ever interrupt)
    heard = out["backchannel_heard"]
    assert out["backchannel"]["after_words"] == {"interrupted": 0, "calls": 1}, heard
    # Every after_words case counts its interim decodes (the caller's words over the reply).
    words = out["interims"]["after_words, now (echo -20 dB, 120 ms)"]
    assert words["with_text"] >= 1 and 0 <= words["not_english"] <= words["with_text"]
    assert words["barge_in_model"] == 0  # the default server: the call's own model
    # --barge-in-model: the same case on a server whose word-count interims go to tiny.en.
    variant = "after_words, now (echo -20 dB, 120 ms), word count by tiny.en"
    assert len(out["latency"][variant]) == 1
    counted = out["interims"][variant]
    assert counted["with_text"] >= 1 and counted["barge_in_model"] == counted["with_text"]
    counted_back = out["backchannel"]["after_words, word count by tiny.en"]
    assert counted_back == {"interrupted": 0, "calls": 1}, heard


def test_echo_canceller_benchmark_tiny_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """The offline comparison: every row, and the finding it records (echo opens utterances
    unless handled; the guard leaves none)."""
    from benchmarks import echo_canceller  # noqa: PLC0415

    out = echo_canceller.main(["--tiny"])
    assert set(out) == {"none", "AEC3", "AEC3 + guard", "echo guard", "gate_aec3"}
    assert out["none"]["false_begins"] >= 1
    assert out["echo guard"]["false_begins"] == 0 and out["AEC3"]["false_begins"] == 0
    assert out["echo guard"]["onset_delay_ms"] < float("inf")
    assert "later @-10 dB" in capsys.readouterr().out


def test_echo_canceller_pools_fresh_replies(capsys: pytest.CaptureFixture[str]) -> None:
    """``--replies N``: the grid in fresh processes (a fresh reply each), cells pooled."""
    from benchmarks import echo_canceller  # noqa: PLC0415

    out = echo_canceller.main(["--replies", "1", "--tiny"])
    assert out["none"]["false_begins"] >= 1 and out["none"]["over_500_at_10_db"] == 1
    assert out["gate_aec3"]["false_begins"] == 0 and out["echo guard"]["false_begins"] == 0
    assert out["gate_aec3"]["worst_ms_at_10_db"] < float("inf")
    assert "pooled over 1 replies" in capsys.readouterr().out


def test_echo_canceller_dispersion_mode_shows_aec3_cancelling_a_spread_echo() -> None:
    """``--dispersion``: echo a path spreads over milliseconds opens an utterance unless
    handled, and AEC3 (``echo_canceller: aec3``) leaves none."""
    from benchmarks import echo_canceller  # noqa: PLC0415

    out = echo_canceller.dispersion_main(tiny=True)
    assert out["none"]["tau_1.33"] >= 1
    assert out["AEC3"]["tau_1.33"] == 0


def test_echo_correlation_mode_measures_the_echo_alone() -> None:
    """The figures behind the quiet-caller limit: echo alone correlates highly, not always."""
    import numpy as np  # noqa: PLC0415

    from benchmarks import echo_canceller  # noqa: PLC0415

    line = echo_canceller.Line(barge_in.SHORT_REPLY)
    rho = echo_canceller.block_correlations(line, -20, None)
    assert len(rho) > 20 and float(np.median(rho)) > 0.9
    assert all(0.0 <= r <= 1.0 + 1e-9 for r in rho)


def test_gate_aec3_hears_a_caller_quieter_than_the_echo_within_a_quarter_second() -> None:
    """The quiet-caller limit of the gate, offline on the real voice and a real caller: the
    softest of the three callers (about 5 dB under a -10 dB echo, 120 ms late) is seen by the
    segmenter within 250 ms of when it sees them on a line without echo through
    ``gate_aec3`` (measured 20-60 ms over four replies; through the gate alone 80-860 ms,
    usually 820), and the echo before them opens nothing."""
    from benchmarks import echo_canceller  # noqa: PLC0415

    line = echo_canceller.Line(barge_in.REPLY)
    caller = barge_in.load_caller("cmu_goforward.wav")
    at = echo_canceller.CALLER_AT_MS
    alone = echo_canceller.segment(line, line.inbound(None, 120, caller), "none")[0]
    over = echo_canceller.segment(line, line.inbound(-10, 120, caller), "gate_aec3")[0]
    first_alone = next(b for b in alone if b >= at - 100)
    assert over and over[0] >= at - 100, over  # nothing opened on the echo before the caller
    assert over[0] - first_alone <= 250, (over, first_alone)


def test_echo_stays_out_on_a_loaded_line_through_the_gate_and_gate_aec3() -> None:
    """``--stalls``: the far end's and the gateway's loops stall (2 a second, up to 250 ms),
    so reply frames go out late, the far end's playout runs dry and the rest of the reply
    echoes shifted. Through the gate and through ``gate_aec3`` echo alone opens nothing:
    ``gate_aec3`` silences an echo block once AEC3 leaves more of it than the gate's own fit
    does, or the echo's delay jumps, until a block the reply clearly explains shows AEC3 has
    the path again (trusting AEC3 until a clear block showed it had lost the echo, 6 of 18
    such calls barged in through it). AEC3 alone, which must find the delay again after each
    shift, is the witness that the line is loaded enough to matter. The reply is seeded (the
    voice samples each afresh): the cells below are ones that barged in through ``gate_aec3``
    before AEC3's output was kept out of blocks where no caller could be and only a block
    fitted at |rho| 0.99 restored the trust in it (13 of 40 seeded replies had such a cell,
    14 of 1080 calls)."""
    import numpy as np  # noqa: PLC0415

    from benchmarks import echo_canceller  # noqa: PLC0415

    # (reply seed, echo level, stall pattern, delay): each opened an utterance, on AEC3's
    # residue of a clearly fitted echo block (-60 dBFS between silenced ones), or after a
    # block fitted at |rho| 0.92-0.98 had restored the trust in a lost AEC3.
    cells = ((2, -20, 0, 40), (8, -20, 2, 40), (21, -10, 2, 40), (33, -10, 2, 250))
    for reply, level, seed, delay in cells:
        line = echo_canceller.Line(barge_in.REPLY, seed=reply)
        rng = np.random.default_rng(seed)
        b = echo_canceller.segment_loaded(
            line, level, delay, "gate_aec3", rng, rate_hz=2.0, max_stall_s=0.25
        )
        assert b == [], (reply, level, seed, delay, b)
    # And on a line without stalls: AEC3's output of fitted blocks, -63 dBFS, that a floor
    # on what the fit leaves alone let through.
    line = echo_canceller.Line(barge_in.REPLY, seed=2)
    assert echo_canceller.segment(line, line.inbound(-10, 40, None), "gate_aec3")[0] == []
    line = echo_canceller.Line(barge_in.REPLY, seed=0)
    begins: dict[str, int] = {}
    interrupted: dict[str, int] = {}
    for mode in ("none", "AEC3", "echo guard", "gate_aec3"):
        for level in (-10, -20, -30):
            for seed in range(2):
                b = echo_canceller.segment_loaded(
                    line,
                    level,
                    250,
                    mode,
                    np.random.default_rng(seed),
                    rate_hz=2.0,
                    max_stall_s=0.25,
                )
                begins[mode] = begins.get(mode, 0) + len(b)
                interrupted[mode] = interrupted.get(mode, 0) + bool(b)
    assert interrupted["none"] == 6  # the echo, unhandled, barges in on every call
    assert interrupted["AEC3"] >= 2, interrupted
    assert begins["echo guard"] == 0 and begins["gate_aec3"] == 0, begins
    # The command line that prints the table (one level and delay, two stall patterns), and
    # the callers over that echo (three callers, the same patterns).
    table = echo_canceller.stalls_main(["--stalls", "--tiny", "--callers", "--replies", "1"])
    assert set(table) == {"none", "AEC3", "echo guard", "gate_aec3"}
    assert table["none"]["calls"] == table["none"]["interrupted"] == 2
    assert table["gate_aec3"]["begins"] == 0
    assert table["gate_aec3"]["callers"] == 6
    assert table["gate_aec3"]["caller_median_ms"] < float("inf")
