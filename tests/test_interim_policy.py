"""The interim policy step by step: when a call's next interim runs, and whether it decodes.

Pure: the policy is given the time and what the driver sees (barge-in listening, decodes in
flight, a spare worker, the growing utterance's length); these tests drive it like the driver
does and read its answers.
"""

from __future__ import annotations

import pytest

from voxgate.gateway.call.interims import (
    AttemptAt,
    AwaitDecode,
    Decode,
    InterimPolicy,
    InterimState,
)
from voxgate.gateway.call.options import InterimOptions

pytestmark = pytest.mark.unit


def policy(**overrides: object) -> InterimPolicy:
    options = {
        "results": True,
        "interval_ms": 1000,
        "barge_in_interval_ms": 250,
        "barge_in_overlap_ms": 0,
        "barge_in_urgent": True,
    }
    options.update(overrides)
    return InterimPolicy(InterimOptions(**options))  # type: ignore[arg-type]


def test_the_clients_interims_follow_the_interval_after_each_wait() -> None:
    p, st = policy(), InterimState()
    assert p.wait(st, fast=False, running=0, spare_worker=False, now=5.0) == AttemptAt(6.0)
    # The interval counts from the wait, not from the last attempt.
    assert p.attempt(st, fast=False, shed=False, running=0, spare_worker=False, now=6.0)
    assert p.wait(st, fast=False, running=0, spare_worker=False, now=6.5) == AttemptAt(7.5)


def test_over_an_after_words_reply_the_interval_counts_from_the_last_attempt() -> None:
    p, st = policy(), InterimState()
    assert p.wait(st, fast=True, running=0, spare_worker=False, now=1.0) == AttemptAt(1.0)
    p.attempt(st, fast=True, shed=False, running=0, spare_worker=False, now=10.0)
    # The decode took 100 ms: the next attempt is 250 ms after the last began, not after it.
    assert p.wait(st, fast=True, running=0, spare_worker=False, now=10.1) == AttemptAt(10.25)
    # A decode longer than the interval: at once.
    assert p.wait(st, fast=True, running=0, spare_worker=False, now=10.4) == AttemptAt(10.4)


def test_one_decode_at_a_time_unless_barge_in_may_overlap_on_a_spare_worker() -> None:
    st = InterimState(started=10.0)
    plain = policy()
    assert isinstance(
        plain.wait(st, fast=True, running=1, spare_worker=True, now=10.0), AwaitDecode
    )
    assert isinstance(
        plain.wait(st, fast=False, running=1, spare_worker=True, now=10.0), AwaitDecode
    )
    overlap = policy(barge_in_overlap_ms=100)
    assert overlap.wait(st, fast=True, running=1, spare_worker=True, now=10.05) == AttemptAt(10.1)
    assert st.spacing_ms == 100
    # No spare worker, two in flight already, or no longer a barge-in: wait for the first.
    assert isinstance(
        overlap.wait(st, fast=True, running=1, spare_worker=False, now=10.05), AwaitDecode
    )
    assert isinstance(
        overlap.wait(st, fast=True, running=2, spare_worker=True, now=10.05), AwaitDecode
    )
    assert isinstance(
        overlap.wait(st, fast=False, running=1, spare_worker=True, now=10.05), AwaitDecode
    )


def test_an_attempt_looks_only_when_someone_wants_an_interim() -> None:
    st = InterimState()
    assert not policy().attempt(st, fast=False, shed=True, running=0, spare_worker=False, now=1.0)
    assert st.started == 1.0  # an attempt that finds nothing to do still starts the interval
    assert not policy(results=False).attempt(
        st, fast=False, shed=False, running=0, spare_worker=False, now=2.0
    )
    # Barge-in's interims run even while the client's are shed.
    assert policy().attempt(st, fast=True, shed=True, running=0, spare_worker=False, now=3.0)
    # A second decode beside one in flight only for barge-in, on a spare worker.
    assert not policy().attempt(st, fast=False, shed=False, running=1, spare_worker=True, now=4.0)
    assert not policy().attempt(st, fast=True, shed=False, running=1, spare_worker=False, now=4.0)
    assert policy().attempt(st, fast=True, shed=False, running=1, spare_worker=True, now=4.0)


def decide(p: InterimPolicy, st: InterimState, samples: int | None, **kw: bool) -> Decode | None:
    args = {"woken": False, "fast": False, "shed": False, "final_started": False}
    args.update(kw)
    args.setdefault("final_imminent", False)
    return p.decide(st, samples, **args)


def test_an_interim_decodes_once_the_utterance_grew_by_half_a_spacing() -> None:
    p, st = policy(), InterimState(spacing_ms=1000)
    first = decide(p, st, 8_000)
    assert first == Decode(seq=1, wanted=True, fast=False, urgent=False)
    assert decide(p, st, 15_999) is None  # 16 kHz: half of 1000 ms is 8000 samples
    assert decide(p, st, 16_000) == Decode(seq=2, wanted=True, fast=False, urgent=False)
    # A wake from barge-in decodes now, grown or not; barge-in's interims are urgent.
    assert decide(p, st, 16_001, woken=True, fast=True) == Decode(3, True, True, True)
    # Between utterances the next one starts from nothing.
    assert decide(p, st, None) is None
    assert st.last_len == 0
    assert decide(p, st, 8_000) == Decode(seq=4, wanted=True, fast=False, urgent=False)


def test_no_interim_once_the_final_has_started_or_is_about_to() -> None:
    p, st = policy(), InterimState(spacing_ms=1000)
    assert decide(p, st, 20_000, final_started=True) is None
    assert decide(p, st, 20_000, final_started=True, fast=True, woken=True) is None
    assert decide(p, st, 20_000, final_imminent=True) is None
    # Barge-in listens on while the final is merely about to start.
    assert decide(p, st, 20_000, final_imminent=True, fast=True) == Decode(1, True, True, True)
    # Shed under load: barge-in's interim goes to barge-in only; not urgent when configured so.
    calm = policy(barge_in_urgent=False)
    assert decide(calm, InterimState(), 100, woken=True, fast=True, shed=True) == Decode(
        1, False, True, False
    )
