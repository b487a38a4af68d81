"""The ear on a phone line: Silero behind the VoiceDetector seam, in-band DTMF, line noise."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import telephony as tel
from calls import chunks, config, requests

from voxgate.common.pcm import WireEncoding
from voxgate.engines.vad import SILERO_WINDOW, SileroVad
from voxgate.gateway.audio import InputDecoder
from voxgate.gateway.config import DtmfConfig, VadConfig
from voxgate.gateway.dtmf import DTMF_KEYS, DtmfDigit, DtmfGate
from voxgate.gateway.segmenter import Segmenter, SpeechBegin, Utterance, WebRtcVoiceDetector
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.unit

KEYS = "".join(DTMF_KEYS)
SIL = np.zeros(1600, dtype=np.float32)  # 100 ms


def gate_all(x: np.ndarray, step: int = 320, cfg: DtmfConfig | None = None) -> tuple:
    """Run a gate over x in chunks of ``step``; return (output samples, digits)."""
    g = DtmfGate(cfg or DtmfConfig())
    outs, digits = [], []
    for i in range(0, len(x), step):
        o, d = g.push(x[i : i + step])
        outs.append(o)
        digits += d
    o, d = g.flush()
    return np.concatenate([*outs, o]), digits + d


def keys_of(digits: list[DtmfDigit]) -> str:
    return "".join(d.digit for d in digits)


# --- Silero ---------------------------------------------------------------------------------------


def test_silero_streams_identically_however_the_audio_is_chunked(speech_dir: Path) -> None:
    """The per-call state (LSTM h/c, 64-sample context, partial window) carries across pushes."""
    clip = tel.load_clips(speech_dir, limit=1)[0].audio[: 3 * 16000]
    model = SileroVad.load()
    n = len(clip) // SILERO_WINDOW
    for prime in (0, 8):
        one = model.stream(prime)
        ref: list[float] = []
        for i in range(n):
            one.push(clip[i * SILERO_WINDOW : (i + 1) * SILERO_WINDOW])
            ref += list(one.last_probabilities)
        assert len(ref) == n
        for step in (160, 320, 480, 1000, 5000):
            s = model.stream(prime)
            probs: list[float] = []
            for i in range(0, n * SILERO_WINDOW, step):
                s.push(clip[i : min(i + step, n * SILERO_WINDOW)])
                probs += list(s.last_probabilities)
            assert s.windows == n
            assert probs == pytest.approx(ref, abs=1e-6)
        assert max(ref) > 0.8 and min(ref) < 0.2  # a real clip: speech and pauses


def test_priming_stops_the_start_of_call_burst_on_a_humming_line() -> None:
    """From the all-zero state the LSTM calls the first windows of any sound speech."""
    hum = tel.through_mulaw_8k(tel.hum(16000 * 2, 60.0, -20.0))
    model = SileroVad.load()
    raw, primed = model.stream(prime_windows=0), model.stream()
    raw.push(hum)
    primed.push(hum)
    assert max(raw.last_probabilities[:8]) > 0.6
    assert max(primed.last_probabilities) < 0.3
    assert len(primed.last_probabilities) == len(raw.last_probabilities)


def test_calls_share_the_model_but_not_the_state(speech_dir: Path) -> None:
    a, b = (c.audio[:32000] for c in tel.load_clips(speech_dir, limit=2))
    model = SileroVad.load()
    assert SileroVad.load() is model  # one session per process
    alone_a, alone_b = model.stream(), model.stream()
    pa = [alone_a.push(a[i : i + 512]) for i in range(0, 32000, 512)]
    pb_ = [alone_b.push(b[i : i + 512]) for i in range(0, 32000, 512)]
    x, y = model.stream(), model.stream()
    for i, k in enumerate(range(0, 32000, 512)):  # interleaved, as calls on one loop are
        assert x.push(a[k : k + 512]) == pytest.approx(pa[i], abs=1e-6)
        assert y.push(b[k : k + 512]) == pytest.approx(pb_[i], abs=1e-6)


def test_a_missing_silero_model_stops_start_up_with_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from voxgate.gateway import service
    from voxgate.gateway.config import ConfigError, GatewayConfig

    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        SileroVad.load(tmp_path / "missing.onnx")

    def missing(path: Path | None = None) -> SileroVad:
        raise FileNotFoundError("no silero_vad*.onnx in faster_whisper/assets")

    monkeypatch.setattr(service.SileroVad, "load", missing)
    with pytest.raises(ConfigError, match="vad.model=silero: no silero_vad"):
        service.VoiceGatewayServicer(GatewayConfig())
    service.VoiceGatewayServicer(GatewayConfig(vad=VadConfig(model="webrtc")))  # no model needed


def test_the_default_model_is_silero_and_webrtc_stays_available() -> None:
    assert VadConfig().model == "silero"
    assert isinstance(Segmenter(VadConfig(model="webrtc"))._detector, WebRtcVoiceDetector)
    with pytest.raises(ValueError, match="silence_threshold"):
        VadConfig(speech_threshold=0.3, silence_threshold=0.4)


@pytest.mark.parametrize("noise", ["clean", "hum", "clicks"])
def test_a_caller_who_speaks_from_the_first_sample_keeps_the_first_word(
    speech_dir: Path, noise: str
) -> None:
    """Silero primes on a call's first 256 ms: those frames are held and judged once it can,
    not taken for silence (which made the call's noise floor out of the first word and cut
    it off the utterance's audio: "Printing" at 0 s was heard from 0.18 s on)."""
    (clip,) = [c for c in tel.load_clips(speech_dir) if c.name == "ljspeech_LJ001-0001.wav"]
    x = clip.audio
    if noise != "clean":
        x = tel.mix_at_snr(x, tel.noise(noise, len(x), 1), 20.0)
    data = tel.to_mulaw_8k(x)
    dec, seg = InputDecoder(WireEncoding.MULAW, 8000), Segmenter(VadConfig())
    events: list[object] = []
    for i in range(0, len(data), 160):
        events += seg.push(dec.decode(data[i : i + 160]))
    events += seg.flush()
    utt = next(e for e in events if isinstance(e, Utterance))
    assert utt.start_ms == 0  # the whole first word is in the audio Whisper gets
    assert utt.speech_start_ms <= 280


# --- DTMF detection -------------------------------------------------------------------------------


@pytest.mark.parametrize("line", ["mulaw", "alaw"])
@pytest.mark.parametrize("level", [-3.0, -10.0, -20.0, -30.0])
def test_every_key_at_every_level_with_speech_around_it(
    speech_dir: Path, line: str, level: float
) -> None:
    clip = tel.load_clips(speech_dir, limit=1)[0].audio
    a, b = clip[:32000], clip[32000:64000]  # 2 s of speech before and after
    tones = np.concatenate([np.concatenate([tel.dtmf_tone(k, 70, level), SIL]) for k in KEYS])
    x = np.concatenate([a, SIL, tones, b])
    sent = tel.through_mulaw_8k(x) if line == "mulaw" else tel.through_alaw_8k(x)
    out, digits = gate_all(sent)
    assert keys_of(digits) == KEYS
    assert len(out) == len(sent)  # nothing lost or added: the gate delays, never drops
    for d in digits:
        assert 50 <= d.duration_ms <= 90, d
    first = digits[0]
    assert abs(first.offset_ms - (len(a) + len(SIL)) / 16) <= 20


def test_tones_are_silenced_for_the_vad_and_the_rest_passes_untouched() -> None:
    x = np.concatenate([SIL, tel.dtmf_tone("5", 500, -6.0), SIL, tel.hiss(3200, 1, -40.0)])
    out, digits = gate_all(x)
    assert keys_of(digits) == "5"
    tone = slice(1600 + 320, 1600 + 8000 - 320)
    assert np.max(np.abs(out[tone])) == 0.0
    assert np.array_equal(out[-2400:], x[-2400:])


@pytest.mark.parametrize(
    ("twist_db", "found"),
    [(0.0, True), (3.5, True), (-7.5, True), (5.0, False), (-9.5, False)],
)
def test_twist_limits(twist_db: float, found: bool) -> None:
    x = np.concatenate([SIL, tel.dtmf_tone("8", 100, -12.0, twist_db), SIL])
    assert keys_of(gate_all(x)[1]) == ("8" if found else "")


@pytest.mark.parametrize(("ms", "found"), [(15, False), (22, False), (40, True), (45, True)])
def test_short_tones_are_rejected(ms: int, found: bool) -> None:
    # Every alignment against the 10 ms analysis grid.
    for shift in range(0, 160, 40):
        x = np.concatenate([np.zeros(shift, np.float32), SIL, tel.dtmf_tone("3", ms), SIL])
        assert keys_of(gate_all(x)[1]) == ("3" if found else ""), (ms, shift)


def test_a_sequence_with_gaps_and_a_repeated_key() -> None:
    seq = "1990#*0"
    x = np.concatenate([SIL, tel.dtmf_sequence(seq, tone_ms=60, gap_ms=45), SIL])
    assert keys_of(gate_all(tel.through_mulaw_8k(x))[1]) == seq


def test_a_10ms_dropout_inside_a_tone_is_one_digit() -> None:
    t = tel.dtmf_tone("7", 200)
    t[1600:1760] = 0.0
    digits = gate_all(np.concatenate([SIL, t, SIL]))[1]
    assert keys_of(digits) == "7" and 190 <= digits[0].duration_ms <= 210


def test_too_quiet_tones_are_ignored() -> None:
    x = np.concatenate([SIL, tel.dtmf_tone("2", 200, -42.0), SIL])
    assert keys_of(gate_all(x)[1]) == ""
    assert keys_of(gate_all(x, cfg=DtmfConfig(min_level_dbm0=-45.0))[1]) == "2"


def test_no_false_digits_on_the_shared_speech(speech_dir: Path) -> None:
    """All 40 clips through μ-law (and with each line noise at 5 dB SNR): no digit."""
    clips = tel.load_clips(speech_dir)
    for c in clips:
        assert keys_of(gate_all(tel.through_mulaw_8k(c.audio))[1]) == "", c.name
    for kind, _snr, c in tel.noisy_clips(clips[:8], snrs=(5.0,)):
        assert keys_of(gate_all(tel.through_mulaw_8k(c.audio))[1]) == "", (kind, c.name)


# --- the segmenter on line noise ------------------------------------------------------------------


def _begins(x: np.ndarray, model: str) -> tuple[int, str]:
    """Through a μ-law line, the gateway's inbound path (decoder, DTMF gate, segmenter)."""
    data = tel.to_mulaw_8k(x)
    dec = InputDecoder(WireEncoding.MULAW, 8000)
    gate, seg = DtmfGate(DtmfConfig()), Segmenter(VadConfig(model=model))
    begins, digits = 0, []
    for i in range(0, len(data), 160):
        y, d = gate.push(dec.decode(data[i : i + 160]))
        digits += d
        begins += sum(isinstance(e, SpeechBegin) for e in seg.push(y))
    return begins, keys_of(digits)


@pytest.mark.parametrize("name", ["silence", "hum", "hum60", "hiss", "pink", "clicks", "dtmf"])
def test_line_noise_opens_no_utterance_with_the_default_model(name: str) -> None:
    x = tel.non_speech_files(10.0)[name]
    begins, digits = _begins(x, VadConfig().model)
    assert begins == 0
    if name == "dtmf":  # every tone is a digit, in order; none is speech
        assert len(digits) >= 30 and digits == ("0123456789*#ABCD" * 2)[: len(digits)]
    else:
        assert digits == ""


def test_webrtc_hears_hum_and_clicks_as_speech() -> None:
    """Why the default changed: the same files open utterances with webrtcvad."""
    files = tel.non_speech_files(10.0)
    assert _begins(files["clicks"], "webrtc")[0] > 0
    assert _begins(files["line_noise"], "webrtc")[0] > 0


def test_speech_between_tones_is_still_one_utterance(speech_dir: Path) -> None:
    clip = tel.load_clips(speech_dir, limit=1)[0].audio
    x = np.concatenate([tel.dtmf_sequence("42", 120, 200), clip, SIL * 10, tel.dtmf_tone("#", 300)])
    data = tel.to_mulaw_8k(x)
    dec = InputDecoder(WireEncoding.MULAW, 8000)
    gate, seg = DtmfGate(DtmfConfig()), Segmenter(VadConfig())
    events, digits = [], []
    for i in range(0, len(data), 160):
        y, d = gate.push(dec.decode(data[i : i + 160]))
        digits += d
        events += seg.push(y)
    y, d = gate.flush()
    events += seg.push(y) + seg.flush()
    assert keys_of(digits + d) == "42#"
    utts = [e for e in events if isinstance(e, Utterance)]
    assert len(utts) >= 1
    tones_end_ms = 2 * 320
    assert all(u.speech_start_ms >= tones_end_ms - 50 for u in utts)
    assert utts[-1].speech_end_ms <= (len(x) - 300 * 16) / 16


# --- through a real server ------------------------------------------------------------------------


async def test_a_real_server_hears_no_speech_on_line_noise_and_reports_inband_digits() -> None:
    """VAD-only server, default configuration, the issue's composite file over μ-law 8 kHz."""
    x = np.concatenate(
        [tel.line_noise(), tel.hum(16000 * 3, 60.0), tel.clicks(16000 * 3, seed=5), SIL * 10]
    )
    data = tel.to_mulaw_8k(x)
    async with (
        running_server(limits={"max_realtime_factor": 1000.0}) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        resp = [
            r async for r in stub.Converse(requests([config(pb.MULAW, 8000), *chunks(data, 160)]))
        ]
    speech = [r for r in resp if r.WhichOneof("event") == "speech"]
    dtmf = [r.dtmf for r in resp if r.WhichOneof("event") == "dtmf"]
    assert speech == []
    assert "".join(d.digit for d in dtmf) == "1590"
    assert all(140 <= d.duration_ms <= 160 for d in dtmf)
