"""The per-call audio edges (voxgate.gateway.audio): decoders, encoders, streaming resamplers."""

from __future__ import annotations

import numpy as np
import pytest

from voxgate.common.pcm import MULAW_DECODE, WireEncoding
from voxgate.gateway.audio import AudioFormatError, InputDecoder, OutputEncoder

pytestmark = pytest.mark.unit


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
