"""G.711 and PCM16 packing (voxgate.common.pcm): bit-exact with ITU-T G.191, exhaustively."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxgate.common.pcm import (
    ALAW_DECODE,
    ALAW_ENCODE,
    MULAW_DECODE,
    MULAW_ENCODE,
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


def test_float_to_pcm16_clips_instead_of_wrapping() -> None:
    out = float_to_pcm16(np.array([1.5, -1.5, 0.0], dtype=np.float32))
    assert out.tolist() == [32767, -32768, 0]
