"""Transcripts through the full gateway: real Whisper, real server, real calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
import telephony as tel
from calls import chunks, config, encode_wav, requests

from benchmarks import _wer
from voxgate.common.pcm import MULAW_ENCODE, float_to_pcm16
from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate.gateway.testing.signals import hallucination_set
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]


FAST = {"limits": {"max_realtime_factor": 1000.0}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[GatewayServer]:
    hub = build_hub(load_config(None, {"engines": "asr,tts"}))
    async with running_server(hub=hub, **FAST) as srv:  # type: ignore[arg-type]
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stub(server: GatewayServer) -> AsyncIterator[pb_grpc.VoiceGatewayStub]:
    async with grpc.aio.insecure_channel(server.target) as ch:
        yield pb_grpc.VoiceGatewayStub(ch)


async def run_call(
    rpc: Any, cfg: pb.ConverseRequest, data: bytes, chunk: int, pace_s: float = 0.0
) -> list[pb.ConverseResponse]:
    """One call; refused at admission (the server's capacity), it retries after the hint.

    Several tests open a dozen calls at once, more than a busy 2-core machine's capacity may
    hold: a well-behaved client sends its config, and when the server refuses the call before
    ``started`` it waits the ``grpc-retry-pushback-ms`` hint and tries again. Audio goes out
    only once the call is admitted (a write after the refusal would fail in grpc's core with
    INTERNAL instead of the server's status).
    """
    for _ in range(60):
        call = rpc()
        await call.write(cfg)
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            refused = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (
                exc.details() or ""
            ).startswith("server is at capacity")
            if not refused:
                raise
            hint = dict(exc.trailing_metadata() or ()).get("grpc-retry-pushback-ms", "1000")
            await asyncio.sleep(int(hint) / 1000.0)
            continue
        out = [first]

        async def send(c: Any = call) -> None:
            for m in chunks(data, chunk):
                await c.write(m)
                await asyncio.sleep(pace_s)
            await c.done_writing()

        sender = asyncio.create_task(send())
        while (r := await call.read()) is not grpc.aio.EOF:
            out.append(r)
        await sender
        return out
    raise AssertionError("refused at admission for two minutes")


def finals(resp: list[pb.ConverseResponse]) -> list[pb.Transcript]:
    return [
        r.transcript
        for r in resp
        if r.WhichOneof("event") == "transcript" and r.transcript.is_final
    ]


@pytest.mark.parametrize(
    ("encoding", "rate", "chunk"),
    [(pb.MULAW, 8000, 160), (pb.LINEAR16, 16000, 640)],
    ids=["mulaw_8k", "linear16_16k"],
)
async def test_a_call_gets_one_accurate_final_per_utterance(
    stub: pb_grpc.VoiceGatewayStub, speech_dir: Path, encoding: int, rate: int, chunk: int
) -> None:
    wav = sorted((speech_dir / "calls").glob("call_01*.wav"))[0]
    truth = json.loads(wav.with_suffix(".json").read_text())["segments"]
    cfg = config(encoding, rate, decoding=pb.DecodingOptions(word_timestamps=True))
    resp = await run_call(stub.Converse, cfg, encode_wav(wav, encoding, rate), chunk)
    got = finals(resp)
    assert [t.utterance_index for t in got] == list(range(len(truth)))
    refs = [_wer.normalize(t["text"]) for t in truth]
    hyps = [_wer.normalize(t.text) for t in got]
    wer = _wer.corpus_wer(refs, hyps)
    assert wer <= 0.15, (wer, list(zip(refs, hyps, strict=True)))
    for t, g in zip(truth, got, strict=True):
        assert g.start_ms <= 1000 * t["speech_start_s"] + 250
        assert g.end_ms >= 1000 * t["speech_end_s"] - 250
        assert g.words and 0.0 < g.confidence <= 1.0
        starts = [w.start_ms for w in g.words]
        assert starts == sorted(starts)
        assert g.start_ms - 50 <= g.words[0].start_ms and g.words[-1].end_ms <= g.end_ms + 50


async def test_streaming_recognize_and_interim_results(
    stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    wav = speech_dir / "ljspeech_LJ001-0001.wav"  # 9.7 s: interims have time to arrive
    cfg = config(pb.LINEAR16, 16000, interim_results=True, interim_interval_ms=500)
    # Real time, so that the utterance grows while interim decodes run.
    resp = await run_call(
        stub.StreamingRecognize, cfg, encode_wav(wav, pb.LINEAR16, 16000), 3200, pace_s=0.1
    )
    kinds = [
        ("final" if r.transcript.is_final else "interim")
        if r.WhichOneof("event") == "transcript"
        else ""
        for r in resp
    ]
    assert "interim" in kinds
    assert kinds.index("interim") < kinds.index("final")
    speech_end = next(
        i
        for i, r in enumerate(resp)
        if r.WhichOneof("event") == "speech" and r.speech.type == pb.SpeechEvent.SPEECH_END
    )
    assert max(i for i, k in enumerate(kinds) if k == "interim") < speech_end
    interim = [
        r.transcript
        for r in resp
        if r.WhichOneof("event") == "transcript" and not r.transcript.is_final
    ]
    assert all(t.utterance_index == 0 and t.text for t in interim)
    (final,) = finals(resp)
    ref = json.loads(
        next(
            line
            for line in (speech_dir / "manifest.jsonl").read_text().splitlines()
            if "LJ001-0001" in line
        )
    )["text"]
    assert _wer.corpus_wer([_wer.normalize(ref)], [_wer.normalize(final.text)]) <= 0.15


async def test_hallucination_set_yields_zero_words_through_the_gateway(
    stub: pb_grpc.VoiceGatewayStub, server: GatewayServer
) -> None:
    signals = hallucination_set()
    assert len(signals) >= 10

    async def one(samples: np.ndarray) -> list[pb.ConverseResponse]:
        # As a phone line would deliver it: 8 kHz mu-law, 0.5 s of quiet around the signal.
        pad = np.zeros(4000, dtype=np.float32)
        import soxr

        x8 = soxr.resample(np.concatenate([pad, samples, pad]), 16000, 8000).astype(np.float32)
        data = MULAW_ENCODE[float_to_pcm16(x8).astype(np.int64) + 32768].tobytes()
        return await run_call(stub.Converse, config(pb.MULAW, 8000), data, 160)

    # All signals at once, as concurrent calls: their utterances share engine batches.
    for model in ("silero", "webrtc"):
        with vad_model(server, model):
            results = await asyncio.gather(*(one(s.samples) for s in signals))
        emitted = {
            s.name: [t.text for t in finals(r) if t.text.strip()]
            for s, r in zip(signals, results, strict=True)
        }
        assert all(not texts for texts in emitted.values()), (model, emitted)
        if model == "webrtc":
            # The decode-side gates must see the set: several signals are voiced to webrtcvad
            # (the default model lets few of them reach the recogniser at all).
            assert any(r.WhichOneof("event") == "transcript" for res in results for r in res)


@contextlib.contextmanager
def vad_model(server: GatewayServer, model: str) -> Iterator[None]:
    """The same server and engines with another voice model for the calls started inside."""
    assert server.servicer is not None
    base = server.servicer.config
    vad = base.vad.model_copy(update={"model": model})
    server.servicer.config = base.model_copy(update={"vad": vad})
    try:
        yield
    finally:
        server.servicer.config = base


async def test_line_noise_opens_no_utterance_and_inband_digits_arrive(
    stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    """The default ear on a phone line: hum, hiss, clicks and keypad tones are not speech;
    speech between keypad tones still transcribes, and the tones arrive as dtmf events."""
    noise = np.concatenate(
        [tel.line_noise(), tel.hum(16000 * 3, 60.0), tel.clicks(16000 * 3, seed=5)]
    )
    resp = await run_call(stub.Converse, config(pb.MULAW, 8000), tel.to_mulaw_8k(noise), 160)
    assert [r for r in resp if r.WhichOneof("event") in ("speech", "transcript")] == []
    assert "".join(r.dtmf.digit for r in resp if r.WhichOneof("event") == "dtmf") == "1590"

    clip = tel.load_clips(speech_dir, limit=1)[0]
    gap = np.zeros(8000, dtype=np.float32)
    call = np.concatenate(
        [tel.dtmf_sequence("42", 120, 200), gap, clip.audio, gap, tel.dtmf_tone("#", 300), gap]
    )
    noisy = tel.mix_at_snr(call, tel.hum(len(call), 50.0), 20.0)
    resp = await run_call(stub.Converse, config(pb.MULAW, 8000), tel.to_mulaw_8k(noisy), 160)
    assert "".join(r.dtmf.digit for r in resp if r.WhichOneof("event") == "dtmf") == "42#"
    text = " ".join(t.text for t in finals(resp))
    wer = _wer.corpus_wer([_wer.normalize(clip.text)], [_wer.normalize(text)])
    assert wer <= 0.15, (wer, text)


async def test_tts_to_asr_round_trip_wer_at_most_ten_percent(
    stub: pb_grpc.VoiceGatewayStub,
) -> None:
    sentences = [
        "Your appointment is confirmed for Tuesday at three in the afternoon.",
        "Please hold while I transfer you to the billing department.",
        "The package was delivered to the front desk this morning.",
        "Would you like me to send a copy of the receipt by email?",
    ]
    refs, hyps = [], []
    for text in sentences:
        audio = b"".join(
            [
                r.data
                async for r in stub.Synthesize(
                    pb.SynthesizeRequest(
                        text=text,
                        output_audio=pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000),
                    )
                )
            ]
        )
        data = bytes(16000) + audio + bytes(32000)  # 0.5 s before, 1 s after
        resp = await run_call(stub.StreamingRecognize, config(pb.LINEAR16, 16000), data, 640)
        refs.append(_wer.normalize(text))
        hyps.append(_wer.normalize(" ".join(t.text for t in finals(resp))))
    wer = _wer.corpus_wer(refs, hyps)
    assert wer <= 0.10, (wer, list(zip(refs, hyps, strict=True)))


async def test_an_engine_fault_fails_one_utterance_and_the_call_goes_on(
    server: GatewayServer, stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    assert server.servicer is not None
    real = server.servicer.transcriber
    server.servicer.transcriber = _Recording(real, fail_first=True)
    try:
        resp = await run_call(stub.Converse, config(), encode_wav(wav, pb.LINEAR16, 16000), 640)
    finally:
        server.servicer.transcriber = real
    errors = [r.error for r in resp if r.WhichOneof("event") == "error"]
    assert len(errors) == 1 and errors[0].scope == "utterance" and errors[0].utterance_index == 0
    assert errors[0].code == grpc.StatusCode.INTERNAL.value[0]
    # The fault's own text goes to the server log, never to the client.
    assert "illegal memory access" not in errors[0].message
    assert "recognition failed (internal error" in errors[0].message
    assert [t.utterance_index for t in finals(resp)] == [1, 2, 3]


async def test_finals_are_accurate_with_speculation_at_4x_real_time(
    stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    """Finals at 4x real time, with speculation on, are accurate. (How much speculation hides
    is timing: exact on the virtual clock in test_session.py, measured in asr_capacity.)"""
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    truth = json.loads(wav.with_suffix(".json").read_text())["segments"]

    # 100 ms chunks at 4x real time: the recogniser is idle when each hangover settles.
    resp = await run_call(
        stub.Converse, config(), encode_wav(wav, pb.LINEAR16, 16000), 3200, pace_s=0.025
    )
    got = finals(resp)
    assert len(got) == len(truth)
    refs = [_wer.normalize(t["text"]) for t in truth]
    assert _wer.corpus_wer(refs, [_wer.normalize(t.text) for t in got]) <= 0.15


async def test_list_models_reports_the_bundled_whisper(stub: pb_grpc.VoiceGatewayStub) -> None:
    resp = await stub.ListModels(pb.ListModelsRequest())
    (model,) = resp.models
    assert model.family == "whisper" and model.is_default and model.device == "cpu"
    assert "en" in model.languages and "de" in model.languages and len(model.languages) >= 99


async def _refused(stub: pb_grpc.VoiceGatewayStub, cfg: pb.ConverseRequest) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Converse(requests([cfg])):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert len(details) < 1_500  # even the list of Whisper's 99 languages stays bounded
    return details


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"language": "tlh"}, "config.language='tlh' is not a language of model"),
        ({"language": "x" * 50_000}, "(50000 characters) is not a language"),
        (
            {"model": "../../etc/passwd"},
            "config.model='../../etc/passwd' is not loaded; ListModels",
        ),
        (
            {"decoding": pb.DecodingOptions(hotwords=["acme"] * 101)},
            "hotwords and boosted_phrases have 101 entries together, over max_hotwords=100",
        ),
        (
            {
                "decoding": pb.DecodingOptions(
                    hotwords=["acme"] * 60,
                    boosted_phrases=[pb.PhraseBoost(phrase="acme", boost=2)] * 41,
                )
            },
            "hotwords and boosted_phrases have 101 entries together, over max_hotwords=100",
        ),
        (
            {
                "decoding": pb.DecodingOptions(
                    boosted_phrases=[pb.PhraseBoost(phrase="a^6", boost=2)]
                )
            },
            "config.decoding.boosted_phrases[0].phrase must be words without '^'; got 'a^6'",
        ),
        (
            {"decoding": pb.DecodingOptions(boosted_phrases=[pb.PhraseBoost(phrase=" ", boost=2)])},
            "config.decoding.boosted_phrases[0].phrase must be words without '^'; got ''",
        ),
        (
            {
                "decoding": pb.DecodingOptions(
                    boosted_phrases=[
                        pb.PhraseBoost(phrase="acme", boost=2),
                        pb.PhraseBoost(phrase="acme", boost=0),
                    ]
                )
            },
            "config.decoding.boosted_phrases[1].boost must be in (0, 10] nats; got 0",
        ),
        (
            {
                "decoding": pb.DecodingOptions(
                    boosted_phrases=[pb.PhraseBoost(phrase="a", boost=11)]
                )
            },
            "config.decoding.boosted_phrases[0].boost must be in (0, 10] nats; got 11",
        ),
        (
            {"decoding": pb.DecodingOptions(hotwords=["word"] * 99, initial_prompt="p" * 1_700)},
            "have 2096 characters together, over max_context_chars=2000",
        ),
        (
            {"decoding": pb.DecodingOptions(hotwords=["Xylophonic-Quadrantizer"] * 60)},
            "over max_prompt_tokens=223",
        ),
    ],
    ids=[
        "klingon",
        "huge-language",
        "path-model",
        "hotword-count",
        "hotword-and-phrase-count",
        "phrase-with-caret",
        "empty-phrase",
        "zero-boost",
        "boost-over-10",
        "context-chars",
        "tokens",
    ],
)
async def test_unknown_language_model_and_unbounded_context_are_invalid_argument(
    stub: pb_grpc.VoiceGatewayStub, kw: dict[str, Any], text: str
) -> None:
    """v0.1 accepted them: empty finals, an ignored model, 161 MB for a 1 MB prompt."""
    assert text in await _refused(stub, config(**kw))


async def test_a_typed_boosted_phrase_steers_the_spelling_like_a_caret_hotword(
    stub: pb_grpc.VoiceGatewayStub,
) -> None:
    """``boosted_phrases`` (the typed field) reaches the decoder's phrase boost: the bundled
    voice says "voxgate", which Whisper writes otherwise unless the name is boosted."""
    import soxr

    from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer

    tts = VitsStreamer.load(TtsConfig())
    try:
        chunk = tts.synthesize_oneshot(
            "Please call voxgate support after six.", SpeakOptions(noise_scale=0.0, noise_w=0.0)
        )
    finally:
        tts.close()
    audio = soxr.resample(chunk.samples, chunk.sample_rate_hz, 16000).astype(np.float32)
    pad = np.zeros(8000, np.float32)
    data = float_to_pcm16(np.concatenate([pad, audio, pad])).tobytes()

    async def final(decoding: pb.DecodingOptions) -> str:
        cfg = config(pb.LINEAR16, 16000, decoding=decoding)
        out = await run_call(stub.Converse, cfg, data, 640)
        texts = [r.transcript.text for r in out if r.WhichOneof("event") == "transcript"]
        return " ".join(t for t in texts if t).lower()

    assert "voxgate" not in await final(pb.DecodingOptions())
    typed = pb.DecodingOptions(boosted_phrases=[pb.PhraseBoost(phrase="voxgate", boost=6)])
    assert "voxgate" in await final(typed)


async def test_known_language_forms_and_the_listed_model_are_accepted(
    stub: pb_grpc.VoiceGatewayStub,
) -> None:
    models = await stub.ListModels(pb.ListModelsRequest())
    for kw in ({"language": "en-US"}, {"language": "DE"}, {"model": models.models[0].name}):
        resp = [r async for r in stub.Converse(requests([config(**kw)]))]
        assert resp[0].WhichOneof("event") == "started"


class _Recording:
    """Wraps the real transcriber and records what the session hands it; with ``fail_first``
    the first utterance raises, as an engine fault would."""

    def __init__(self, inner: Any, *, fail_first: bool = False) -> None:
        self.inner = inner
        self.fail_first = fail_first
        self.encodes = 0
        self.requests: list[AsrRequest] = []

    def can_speculate(self) -> bool:
        return bool(self.inner.can_speculate())

    def spare_worker(self) -> bool:
        return bool(self.inner.spare_worker())

    def encode_context(self, initial_prompt: str, hotwords: Any) -> tuple[int, ...]:
        self.encodes += 1
        return tuple(self.inner.encode_context(initial_prompt, hotwords))

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        self.requests.append(request)
        if self.fail_first and len(self.requests) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        result: AsrResult = await self.inner.transcribe(request)
        return result


async def test_the_prompt_is_tokenised_once_per_call(
    server: GatewayServer, stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    """v0.1 re-tokenised prompt and hotwords for every utterance on the shared workers."""
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    assert server.servicer is not None
    real = server.servicer.transcriber
    rec = _Recording(real)
    server.servicer.transcriber = rec
    try:
        cfg = config(
            decoding=pb.DecodingOptions(
                initial_prompt="Sense and sensibility.", hotwords=["Norland", "Dashwood"]
            )
        )
        resp = await run_call(stub.Converse, cfg, encode_wav(wav, pb.LINEAR16, 16000), 640)
    finally:
        server.servicer.transcriber = real
    assert len(finals(resp)) == 4
    assert rec.encodes == 1
    expected = tuple(real.encode_context("Sense and sensibility.", ("Norland", "Dashwood")))
    assert expected and all(r.options.context_tokens == expected for r in rec.requests)


async def test_utterances_total_counts_finals_not_interim_decodes(
    server: GatewayServer, stub: pb_grpc.VoiceGatewayStub, speech_dir: Path
) -> None:
    """v0.1 counted every interim re-decode as an utterance."""
    wav = speech_dir / "librispeech_1272-128104-0000.wav"  # one 5.9 s utterance

    def counted() -> float:
        return sum(
            server.metrics.value("voxgate_utterances_total", outcome=o)
            for o in ("text", "too_short", "too_quiet", "no_speech", "low_logprob", "repetition")
        )

    before = counted()
    cfg = config(interim_results=True, interim_interval_ms=300)
    # Real time, so that interims are decoded while each utterance grows.
    audio = encode_wav(wav, pb.LINEAR16, 16000) + bytes(32_000)  # + 1 s of silence
    resp = await run_call(stub.Converse, cfg, audio, 3200, pace_s=0.1)
    interims = [
        r for r in resp if r.WhichOneof("event") == "transcript" and not r.transcript.is_final
    ]
    assert interims, "the call produced no interim transcript to tell apart"
    assert counted() - before == len(finals(resp)) == 1
