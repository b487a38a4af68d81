"""Silence-aware decoding policy: pure functions, table-driven plus Hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxgate.engines.asr import _policy as policy
from voxgate.engines.asr._policy import mbr_select
from voxgate.engines.asr.base import AsrOptions
from voxgate.engines.asr.config import DecodingPolicyConfig, EncoderWindowConfig
from voxgate.engines.base import UtteranceStats

pytestmark = [pytest.mark.unit]

CFG = DecodingPolicyConfig()
WINDOW = EncoderWindowConfig()


def make_stats(
    duration_ms: int = 3000, speech_ms: int = 2500, speech_rms_dbfs: float = -25.0
) -> UtteranceStats:
    return UtteranceStats(
        duration_ms=duration_ms,
        speech_ms=speech_ms,
        speech_ratio=speech_ms / duration_ms,
        leading_silence_ms=200,
        trailing_silence_ms=300,
        rms_dbfs=speech_rms_dbfs - 3,
        speech_rms_dbfs=speech_rms_dbfs,
        peak_dbfs=speech_rms_dbfs + 15,
    )


@pytest.mark.parametrize(
    ("speech_ms", "rms", "aware", "expected"),
    [
        (2500, -25.0, True, ""),
        (100, -25.0, True, "too_short"),
        (199, -25.0, True, "too_short"),
        (200, -25.0, True, ""),
        (2500, -60.0, True, "too_quiet"),
        (2500, -55.0, True, ""),
        (100, -70.0, False, ""),  # silence_aware off: never skip
    ],
)
def test_skip_reason(speech_ms: int, rms: float, aware: bool, expected: str) -> None:
    stats = make_stats(speech_ms=speech_ms, speech_rms_dbfs=rms)
    assert policy.skip_reason(stats, AsrOptions(silence_aware=aware), CFG) == expected


@pytest.mark.parametrize(
    ("frames", "expected"),
    [(100, 1000), (800, 1000), (801, 1500), (1300, 1500), (1301, 2000), (1801, 3000), (5000, 3000)],
)
def test_choose_encoder_frames_table(frames: int, expected: int) -> None:
    assert policy.choose_encoder_frames(frames, WINDOW) == expected


def test_full_window_only_config_always_3000() -> None:
    full = EncoderWindowConfig(buckets_s=(30.0,))
    assert {policy.choose_encoder_frames(f, full) for f in (1, 500, 2999, 4000)} == {3000}


@given(
    frames=st.integers(min_value=0, max_value=6000),
    margin_ms=st.integers(min_value=0, max_value=5000),
)
def test_bucket_fits_audio_plus_margin_or_is_full(frames: int, margin_ms: int) -> None:
    window = EncoderWindowConfig(margin_ms=margin_ms)
    got = policy.choose_encoder_frames(frames, window)
    allowed = {round(b * 100) for b in window.buckets_s}
    assert got in allowed
    assert got == 3000 or got >= frames + margin_ms // 10
    # smallest fitting bucket: the next smaller one would not fit
    smaller = [b for b in allowed if b < got]
    assert not smaller or max(smaller) < frames + margin_ms // 10


@given(duration_ms=st.integers(min_value=0, max_value=120_000))
def test_max_new_tokens_bounded_and_monotonic(duration_ms: int) -> None:
    n = policy.max_new_tokens(duration_ms, WINDOW)
    assert WINDOW.min_max_new_tokens <= n <= policy.MAX_DECODE_TOKENS
    assert policy.max_new_tokens(duration_ms + 1000, WINDOW) >= n


def test_plan_decoding_mbr_and_alternatives() -> None:
    stats = make_stats(duration_ms=4000)
    plan = policy.plan_decoding(stats, AsrOptions(beam_size=2, mbr_candidates=5), CFG, WINDOW)
    assert plan.beam_size >= 5 and plan.num_hypotheses == 5 and plan.mbr_candidates == 5
    plan = policy.plan_decoding(stats, AsrOptions(num_alternatives=3), CFG, WINDOW)
    assert plan.num_hypotheses == 4 and plan.beam_size >= 4 and plan.mbr_candidates == 0
    plan = policy.plan_decoding(stats, AsrOptions(), CFG, WINDOW)
    assert (plan.beam_size, plan.num_hypotheses, plan.encoder_frames) == (1, 1, 1000)
    assert plan.suppress_hallucination_tokens and plan.apply_gates
    assert plan.max_new_tokens == 32  # 4 s * 8 tokens/s
    off = policy.plan_decoding(stats, AsrOptions(silence_aware=False), CFG, WINDOW)
    assert not off.suppress_hallucination_tokens and not off.apply_gates


def test_an_interim_is_planned_as_one_decode_and_a_final_as_before() -> None:
    # An interim is superseded by the next one within an interval: no temperature ladder and
    # no full-window re-encode, which cost seconds of the worker on one unsure prefix.
    stats = make_stats(duration_ms=800)
    final = policy.plan_decoding(stats, AsrOptions(), CFG, WINDOW)
    assert final == policy.plan_decoding(stats, AsrOptions(), CFG, WINDOW, is_final=True)
    assert final.temperatures == CFG.temperatures and len(final.temperatures) > 1
    assert final.window_fallback
    interim = policy.plan_decoding(stats, AsrOptions(), CFG, WINDOW, is_final=False)
    assert interim.temperatures == (0.0,) and not interim.window_fallback
    # Everything else, the gates included, is the final's.
    assert interim.apply_gates and interim.suppress_hallucination_tokens
    assert (interim.encoder_frames, interim.max_new_tokens, interim.beam_size) == (
        final.encoder_frames,
        final.max_new_tokens,
        final.beam_size,
    )


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], False),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], False),
        ([5, 6, 5, 6, 5, 6], False),  # "no, no, no": short real repetition
        ([9] + [1, 2, 3, 4] * 3, True),
        ([7] * 12, True),
        ([7] * 11, False),
        ([1, 2, 3, 4, 5, 6] * 2, False),  # only two copies
        ([1, 2, 3, 4, 5, 6] * 3 + [8], False),  # loop broke off before the end
    ],
)
def test_has_repetition_loop(tokens: list[int], expected: bool) -> None:
    assert policy.has_repetition_loop(tokens) is expected


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], False),
        (list(range(9)) * 2, True),  # a 9-token sentence said twice
        ([1] + list(range(8)) * 2, True),
        (list(range(7)) * 2, False),  # shorter phrases are real speech ("no, no")
        (list(range(9)) * 2 + [99], True),  # the copy need not be at the end
        (list(range(12)) + list(range(8)), True),  # a restarted sentence
        ([1] * 9, False),  # overlapping runs are the other detector's job
        (list(range(20)), False),
    ],
)
def test_has_repeated_block(tokens: list[int], expected: bool) -> None:
    assert policy.has_repeated_block(tokens) is expected


@pytest.mark.parametrize(
    ("text", "prompt", "expected"),
    [
        # The recital seen on a 7 s window (docs/turns.md): the prompt's words, then the new.
        ("He was not. and he'll dispose young man", "He was not.", True),
        ("he was NOT and he'll dispose", "He was not.", True),
        # Only the prompt's end counts, and at least three words of it.
        ("not what your country can do", "And so my fellow Americans, ask not what your", True),
        ("your country can do for you", "ask not what your", False),
        ("ask not what your country", "And so my fellow Americans.", False),
        # A one-word prompt, an empty one, a text shorter than the match.
        ("Not! Not what you think", "Not!", False),
        ("anything", "", False),
        ("He was", "He was not.", False),
        ("Ask what you can do", "Ask not.", False),
        ("Ask not. What you can do", "Ask not.", True),  # a two-word prompt: whole of it
    ],
)
def test_echoes_prompt(text: str, prompt: str, expected: bool) -> None:
    assert policy.echoes_prompt(text, prompt) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He was not. He was not.", True),  # the 7 s window's fragment (docs/turns.md)
        ("and he said go forward, go forward ten meters", False),  # two words: not enough
        ("I want to go, I want to go to Paris", True),
        ("Ask not what your country can do for you, ask what you can do", False),
        ("the the the", False),
        ("", False),
    ],
)
def test_repeats_a_phrase(text: str, expected: bool) -> None:
    assert policy.repeats_a_phrase(text) is expected


def test_compression_ratio_flags_loops_only() -> None:
    assert policy.compression_ratio("") == 0.0
    normal = "And so my fellow Americans, ask not what your country can do for you."
    assert policy.compression_ratio(normal) < CFG.compression_ratio_threshold
    assert policy.compression_ratio("get a chance to " * 20) > CFG.compression_ratio_threshold


@pytest.mark.parametrize(
    ("text", "lang", "ratio", "expected"),
    [
        ("Thank you for watching!", "en", 0.9, True),
        ("thanks for watching.", "de", 0.9, True),  # English captions under any language
        ("Please subscribe.", "en", 0.9, True),
        ("Subtitles by the Amara.org community", "en", 0.9, True),
        ("Untertitel im Auftrag des ZDF, 2017", "de", 0.9, True),
        ("You", "en", 0.1, True),
        ("you.", "en", 0.9, False),  # a mostly-speech utterance may really be "you"
        ("Thank you.", "en", 0.9, False),
        ("Thank you.", "en", 0.1, True),
        ("Thank you for calling, how can I help?", "en", 0.1, False),
        ("", "en", 0.1, False),
    ],
)
def test_is_hallucination_phrase(text: str, lang: str, ratio: float, expected: bool) -> None:
    stats = make_stats(duration_ms=1000, speech_ms=round(1000 * ratio))
    assert policy.is_hallucination_phrase(text, lang, stats, CFG) is expected


@pytest.mark.parametrize(
    ("text", "tokens", "lp", "nsp", "ratio", "expected"),
    [
        ("Hello there.", [1, 2, 3], -0.3, 0.1, 0.9, ""),
        ("Hello there.", [1, 2, 3], -1.1, 0.1, 0.9, ""),  # unsure, but kept above drop level
        ("Hello there.", [1, 2, 3], -1.5, 0.1, 0.9, "low_logprob"),
        ("Hello there.", [1, 2, 3], -1.1, 0.7, 0.9, "no_speech"),
        ("Hello there.", [1, 2, 3], -0.5, 0.9, 0.9, ""),  # confident text beats no-speech prob
        ("", [], 0.0, 0.0, 0.9, "no_speech"),
        ("...", [13, 13], -0.2, 0.1, 0.9, "no_speech"),
        ("get a chance to " * 20, list(range(5)), -0.2, 0.1, 0.9, "repetition"),
        ("a b c d", [1, 2, 3, 4] * 4, -0.2, 0.1, 0.9, "repetition"),
        ("Thanks for watching!", [1, 2, 3], -0.4, 0.2, 0.9, "hallucination"),
        ("you", [1], -0.4, 0.2, 0.1, "hallucination"),
    ],
)
def test_gate_result(
    text: str, tokens: list[int], lp: float, nsp: float, ratio: float, expected: str
) -> None:
    stats = make_stats(duration_ms=2000, speech_ms=round(2000 * ratio))
    got = policy.gate_result(
        text,
        tokens=tokens,
        avg_logprob=lp,
        no_speech_prob=nsp,
        language="en",
        stats=stats,
        cfg=CFG,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("lp", "ratio", "nsp", "expected"),
    [
        (-0.2, 1.5, 0.1, False),
        (-1.2, 1.5, 0.1, True),
        (-0.2, 3.0, 0.1, True),
        (-1.2, 3.0, 0.9, False),
    ],
)
def test_needs_fallback(lp: float, ratio: float, nsp: float, expected: bool) -> None:
    assert policy.needs_fallback(lp, ratio, nsp, CFG) is expected


def test_suppress_token_ids_uses_single_tokens_and_keeps_minus_one() -> None:
    vocab = {"♪": [10], " ♪": [11], "[": [12], " [": [13], "(": [14], " (": [15], "*": [16]}
    vocab.update({" *": [17], "♫": [18, 19], " ♫": [20], "♬": [21]})
    ids = policy.suppress_token_ids(lambda s: vocab[s], non_speech_ids=[3, 2, 10])
    assert ids[0] == -1
    assert list(ids[1:]) == sorted(set(ids[1:]))
    assert {2, 3, 10, 11, 12, 13, 18} <= set(ids)  # "♫" is a symbol: its first token goes
    assert 19 not in ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Thank you for watching!", "thank you for watching"), ("Don't  STOP", "dont stop"), ("", "")],
)
def test_normalize_phrase(text: str, expected: str) -> None:
    assert policy.normalize_phrase(text) == expected


def test_mbr_selects_consensus_candidate() -> None:
    # Two near-identical hypotheses outweigh a slightly more likely outlier.
    cands = ["the cat sat on the mat", "the cat sat on a mat", "a hat sat in the hat"]
    assert mbr_select(cands, [-3.0, -3.1, -2.9], temperature=1.0) in (0, 1)
    assert mbr_select(["only"], [-1.0], temperature=1.0) == 0
    # With an extremely peaked posterior MBR reduces to picking the most likely candidate.
    cands2 = ["alpha beta", "gamma delta", "alpha beta gamma"]
    assert mbr_select(cands2, [-1.0, -100.0, -100.0], temperature=1.0) == 0


@given(
    st.lists(st.text(alphabet="abc ", min_size=1, max_size=12), min_size=1, max_size=6),
    st.data(),
)
def test_mbr_returns_valid_index(cands: list[str], data: st.DataObject) -> None:
    lps = data.draw(
        st.lists(st.floats(-50, 0, allow_nan=False), min_size=len(cands), max_size=len(cands))
    )
    assert 0 <= mbr_select(cands, lps, temperature=1.0) < len(cands)


def test_config_validation_messages() -> None:
    with pytest.raises(ValueError, match="end at 30"):
        EncoderWindowConfig(buckets_s=(10.0, 20.0))
    with pytest.raises(ValueError, match="start at 0.0"):
        DecodingPolicyConfig(temperatures=(0.2, 0.4))
    from voxgate.engines.asr.config import WhisperConfig

    with pytest.raises(ValueError, match="flash_attention"):
        WhisperConfig(flash_attention=True)
    assert WhisperConfig().resolved_compute_type == "int8"
    assert WhisperConfig(device="cuda").resolved_compute_type == "float16"
    assert WhisperConfig(cpu_threads=4, inter_threads=2).resolved_intra_threads == 2


def test_gpu_defaults_to_the_full_window_and_cpu_to_buckets() -> None:
    from voxgate.engines.asr.config import WhisperConfig

    assert WhisperConfig(device="cuda").encoder.buckets_s == (30.0,)
    assert WhisperConfig().encoder.buckets_s[0] < 30.0
    explicit = WhisperConfig.model_validate(
        {"device": "cuda", "encoder": {"buckets_s": (15.0, 30.0)}}
    )
    assert explicit.encoder.buckets_s == (15.0, 30.0)
