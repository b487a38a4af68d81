"""G.711 codecs and the edge converters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.audio import (
    ALAW_DECODE,
    ALAW_ENCODE,
    MULAW_DECODE,
    MULAW_ENCODE,
    AudioFormatError,
    InputDecoder,
    OutputEncoder,
    WireEncoding,
    alaw_compress_ref,
    alaw_expand_ref,
    float_to_pcm16,
    ulaw_compress_ref,
    ulaw_expand_ref,
)

pytestmark = pytest.mark.unit

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int64)


def test_tables_match_the_g191_reference_for_every_int16_and_every_code() -> None:
    mu = np.array([ulaw_compress_ref(int(x)) for x in ALL_INT16], dtype=np.uint8)
    al = np.array([alaw_compress_ref(int(x)) for x in ALL_INT16], dtype=np.uint8)
    assert np.array_equal(MULAW_ENCODE, mu)
    assert np.array_equal(ALAW_ENCODE, al)
    assert [int(v) for v in MULAW_DECODE] == [ulaw_expand_ref(c) for c in range(256)]
    assert [int(v) for v in ALAW_DECODE] == [alaw_expand_ref(c) for c in range(256)]


def test_known_values_from_the_itu_g711_tables() -> None:
    # Decoder outputs printed in G.711 (Tables 2a/2b and 1a/1b), 16-bit left-justified.
    assert MULAW_DECODE[0x00] == -32124 and MULAW_DECODE[0x80] == 32124
    assert MULAW_DECODE[0x7F] == 0 and MULAW_DECODE[0xFF] == 0
    assert MULAW_DECODE[0x70] == -120 and MULAW_DECODE[0xF0] == 120
    assert ALAW_DECODE[0xD5] == 8 and ALAW_DECODE[0x55] == -8
    assert ALAW_DECODE[0xAA] == 32256 and ALAW_DECODE[0x2A] == -32256
    # Silence encodes to the idle codes (0xFF for mu-law, 0xD5 for A-law).
    assert MULAW_ENCODE[32768 + 0] == 0xFF and ALAW_ENCODE[32768 + 0] == 0xD5


def test_every_code_survives_decode_then_encode() -> None:
    codes = np.arange(256)
    mu_back = MULAW_ENCODE[MULAW_DECODE[codes].astype(np.int64) + 32768]
    al_back = ALAW_ENCODE[ALAW_DECODE[codes].astype(np.int64) + 32768]
    # mu-law has two codes for zero (0x7F, 0xFF); both decode to 0 and re-encode to 0xFF.
    expected_mu = codes.copy()
    expected_mu[0x7F] = 0xFF
    assert np.array_equal(mu_back, expected_mu)
    assert np.array_equal(al_back, codes)


@given(st.integers(min_value=-32768, max_value=32767))
def test_quantisation_error_is_within_half_a_segment_step(x: int) -> None:
    for enc, dec, max_step in (
        (MULAW_ENCODE, MULAW_DECODE, 1024),
        (ALAW_ENCODE, ALAW_DECODE, 1024),
    ):
        y = int(dec[enc[x + 32768]])
        # The step doubles per segment; the error never exceeds the local step.
        step = max(8, min(max_step, 2 ** int(np.log2(abs(x) + 64)) // 16))
        assert abs(y - x) <= step, (x, y, step)
        assert (y >= 0) == (x >= 0) or y == 0 or abs(x) < 16


def test_linear16_rejects_an_odd_byte_count() -> None:
    dec = InputDecoder(WireEncoding.LINEAR16, 16000)
    with pytest.raises(AudioFormatError, match="even byte count"):
        dec.decode(b"\x00\x01\x02")


@pytest.mark.parametrize("rate", [11025, 44100, 0])
def test_unsupported_rates_are_refused_with_the_field_name(rate: int) -> None:
    with pytest.raises(AudioFormatError, match="sample_rate_hertz"):
        InputDecoder(WireEncoding.MULAW, rate)


@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_streaming_resampler_is_chunking_invariant_and_length_exact(rate: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(rate) * 3000).astype(np.int16).tobytes()
    one = InputDecoder(WireEncoding.LINEAR16, rate)
    whole = np.concatenate([one.decode(x), one.flush()])
    two = InputDecoder(WireEncoding.LINEAR16, rate)
    parts = [two.decode(x[i : i + 322]) for i in range(0, len(x), 322)] + [two.flush()]
    chunked = np.concatenate(parts)
    assert len(whole) == 16000 and len(chunked) == 16000
    assert np.allclose(whole, chunked, atol=1e-5)


def test_output_encoder_mulaw_round_trips_a_tone() -> None:
    t = np.arange(22050) / 22050
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    enc = OutputEncoder(WireEncoding.MULAW, 8000, 22050)
    data = enc.encode(tone, last=True)
    assert abs(len(data) - 8000) <= 1
    back = MULAW_DECODE[np.frombuffer(data, np.uint8)].astype(np.float64) / 32768
    ref = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(back)) / 8000)
    # Compare away from the resampler's edges; G.711 gives ~38 dB SNR on a loud tone.
    mid = slice(400, len(back) - 400)
    lag = int(np.argmax(np.correlate(back[mid], ref[mid], "full"))) - (len(ref[mid]) - 1)
    err = back[mid] - np.roll(ref, lag)[mid]
    snr = 10 * np.log10(np.mean(ref[mid] ** 2) / np.mean(err**2))
    assert snr > 30, snr


def test_float_to_pcm16_clips_instead_of_wrapping() -> None:
    out = float_to_pcm16(np.array([1.5, -1.5, 0.0], dtype=np.float32))
    assert out.tolist() == [32767, -32768, 0]
