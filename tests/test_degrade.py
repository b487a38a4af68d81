"""The degradation ladder: the pure policy on a virtual clock, and each step's effect.

Times are passed in (a virtual clock), so every shed and restore is checked to the second.
The monitor that drives the policy in a running server is covered in tests/test_admission.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from voxgate.engines.asr._policy import plan_decoding
from voxgate.engines.asr.base import AsrOptions
from voxgate.engines.asr.config import DecodingPolicyConfig, EncoderWindowConfig
from voxgate.engines.base import UtteranceStats
from voxgate.gateway.config import DegradeConfig
from voxgate.gateway.degrade import LADDER, DegradePolicy, QualityLevel
from voxgate.gateway.events import SpeakIn

pytestmark = pytest.mark.unit

NAN = math.nan
CFG = DegradeConfig(latency_s=1.0, restore_ratio=0.5, step_interval_s=3.0, restore_after_s=10.0)
#: The replica works past its measured capacity (the default of these samples).
OVER = True


def run(policy: DegradePolicy, samples: list[tuple[float, float, bool]]) -> list[tuple]:
    """Feed (time, real-time final p95, over capacity) samples; return the moves as tuples."""
    moves = []
    for now, final, over in samples:
        move = policy.update(now, final, over_capacity=over)
        if move is not None:
            moves.append((now, move.direction, move.step.name, move.level))
    return moves


def test_the_ladder_is_the_documented_order() -> None:
    assert [s.name for s in LADDER] == [
        "interim_results",
        "mbr",
        "beam",
        "word_times",
        "encoder_window",
        "tts_window",
    ]


def test_sheds_one_step_per_interval_in_order_and_stops_at_the_top() -> None:
    policy = DegradePolicy(CFG)
    # Overloaded for 20 s, sampled every 0.5 s.
    samples = [(t / 2, 1.5, OVER) for t in range(41)]
    moves = run(policy, samples)
    assert moves == [
        (0.0, "shed", "interim_results", 1),
        (3.0, "shed", "mbr", 2),
        (6.0, "shed", "beam", 3),
        (9.0, "shed", "word_times", 4),
        (12.0, "shed", "encoder_window", 5),
        (15.0, "shed", "tts_window", 6),
    ]
    assert policy.level == len(LADDER)


def test_slow_finals_within_capacity_shed_nothing() -> None:
    """One caller on an idle CPU: its finals are slow because the engine is, not from load."""
    policy = DegradePolicy(CFG)
    assert run(policy, [(float(t), 5.0, False) for t in range(60)]) == []
    assert policy.pressure(5.0, over_capacity=False) == 0.0
    # The same finals past capacity shed at once.
    assert run(policy, [(60.0, 5.0, OVER)]) == [(60.0, "shed", "interim_results", 1)]


def test_back_within_capacity_restores_though_finals_stay_slow() -> None:
    policy = DegradePolicy(CFG)
    run(policy, [(0.0, 2.0, OVER)])
    assert run(policy, [(1.0 + t, 2.0, False) for t in range(12)]) == [
        (11.0, "restore", "interim_results", 0)
    ]


def test_restores_in_reverse_one_step_per_calm_period() -> None:
    policy = DegradePolicy(CFG)
    run(policy, [(0.0, 2.0, OVER), (3.0, 2.0, OVER)])
    assert policy.level == 2
    calm = [(4.0 + t / 2, 0.3, OVER) for t in range(60)]  # 4.0 .. 33.5 s
    assert run(policy, calm) == [
        (14.0, "restore", "mbr", 1),
        (24.0, "restore", "interim_results", 0),
    ]


def test_hysteresis_band_holds_the_level_and_resets_the_calm_clock() -> None:
    policy = DegradePolicy(CFG)
    run(policy, [(0.0, 2.0, OVER)])
    # Below the shed threshold but above restore_ratio: hold, however long.
    assert run(policy, [(float(t), 0.8, OVER) for t in range(1, 60)]) == []
    assert policy.level == 1
    # Calm for 9 s, one sample in the band, calm again: the 10 s start over.
    samples = [(60.0 + t, 0.2, OVER) for t in range(10)] + [(70.0, 0.7, OVER)]
    samples += [(71.0 + t, 0.2, OVER) for t in range(11)]
    assert run(policy, samples) == [(81.0, "restore", "interim_results", 0)]


def test_no_observations_count_as_no_pressure() -> None:
    policy = DegradePolicy(CFG)
    run(policy, [(0.0, 3.0, OVER)])
    assert policy.pressure(NAN, over_capacity=OVER) == 0.0
    assert run(policy, [(float(t), NAN, OVER) for t in range(1, 12)]) == [
        (11.0, "restore", "interim_results", 0)
    ]


def test_renewed_overload_during_restore_sheds_again_at_once() -> None:
    policy = DegradePolicy(CFG)
    run(policy, [(0.0, 2.0, OVER), (3.0, 2.0, OVER)])
    run(policy, [(4.0 + t, 0.1, OVER) for t in range(11)])  # restores one at 14.0
    assert policy.level == 1
    assert run(policy, [(15.0, 1.2, OVER)]) == []  # 1 s after the restore: within step_interval
    assert run(policy, [(17.0, 1.2, OVER)]) == [(17.0, "shed", "mbr", 2)]


def test_disabled_never_moves() -> None:
    policy = DegradePolicy(DegradeConfig(enabled=False))
    assert run(policy, [(float(t), 9.0, OVER) for t in range(30)]) == []


# -- what each step does to a call -----------------------------------------------------------


def test_levels_apply_their_steps_and_only_theirs() -> None:
    rich = AsrOptions(beam_size=5, mbr_candidates=4, num_alternatives=2)
    q = QualityLevel(0)
    assert q.interim_results and q.asr_options(rich) is rich
    q.level = 1
    assert not q.interim_results and q.asr_options(rich) is rich
    q.level = 2
    o = q.asr_options(rich)
    assert (o.mbr_candidates, o.beam_size, o.num_alternatives) == (0, 5, 2)
    q.level = 3
    o = q.asr_options(rich)
    assert (o.mbr_candidates, o.beam_size, o.num_alternatives, o.encoder_margin_ms) == (
        0,
        1,
        0,
        None,
    )
    assert o.word_timestamps
    q.level = 4
    o = q.asr_options(rich)
    assert not o.word_timestamps and o.encoder_margin_ms is None
    q.level = 5
    assert q.asr_options(rich).encoder_margin_ms == 500
    speak = SpeakIn("hello", "s1")
    assert q.speak(speak) is speak
    q.level = 6
    assert q.speak(speak).degraded and not speak.degraded
    # Default greedy options are untouched by the MBR and beam steps.
    assert QualityLevel(3).asr_options(AsrOptions()) == AsrOptions()
    # ... and the word-times step is the first that changes them.
    assert QualityLevel(4).asr_options(AsrOptions()) == AsrOptions(word_timestamps=False)


def test_the_encoder_step_moves_an_utterance_to_a_smaller_bucket() -> None:
    audio = np.zeros(16000 * 9, dtype=np.float32)
    stats = UtteranceStats.from_frames(audio, [True] * 450, frame_ms=20)
    window, policy = EncoderWindowConfig(), DecodingPolicyConfig()
    full = plan_decoding(stats, AsrOptions(), policy, window)
    shed = plan_decoding(stats, QualityLevel(5).asr_options(AsrOptions()), policy, window)
    assert (full.encoder_frames, shed.encoder_frames) == (1500, 1000)


def test_a_level_change_tells_every_listener_once() -> None:
    q = QualityLevel(0)
    heard: list[int] = []
    q.listeners.append(heard.append)
    q.level = 2
    q.level = 2  # no change, no event
    q.level = 0
    assert heard == [2, 0]
    q.level = 3
    assert [s.name for s in q.shed] == ["interim_results", "mbr", "beam"]
