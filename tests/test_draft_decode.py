"""Drafted greedy decoding (engines/asr/_draft.py) and the drafts the session hands it (issue 38).

The search's bookkeeping on a FAKE decoder whose every choice depends on the whole token
history it reads from its cache, so a stale or misplaced cache entry shows as a wrong token:
whatever the draft says, the result is the decoder's own greedy choice, and the draft only
changes how many passes that takes. Then the session: each final carries its utterance's
longest interim as the draft, and the turn decoded whole carries the turn's finals. The real
decoder against the real model is in tests/test_draft_decode_model.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from voxgate.common.pcm import WireEncoding
from voxgate.engines.asr._draft import draft_greedy, lookup
from voxgate.engines.asr._processors import SuppressTokens
from voxgate.engines.asr.base import AsrRequest
from voxgate.gateway.call.options import (
    IngressOptions,
    InterimOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.events import AudioIn, InboundEvent, OutboundEvent, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.fake_engines import EnergyVoiceDetector, FakeTranscriber
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate.gateway.turns import TurnOptions

pytestmark = pytest.mark.unit

VOCAB = 64
SOT, EOT, NO_SPEECH, NO_TS = 60, 61, 62, 63
PROMPT = [SOT, 59, NO_TS]
#: What the FAKE decoder says after the prompt, token by token, then EOT.
TRUTH = [5, 9, 14, 3, 22, 9, 14, 7, 30, 11, 2, 40]


@dataclass
class FakeCache:
    tokens: list[int]
    length: int = 0


@dataclass
class FakeDecoder:
    """A FAKE decoder: the next token is a function of every token before it in the cache.

    After the prompt and a prefix of ``truth`` it says the truth's next token (EOT at its
    end); after any other history it says token 1, so a history read wrongly (a stale cache
    entry, a position off by one) gives a result that is not the truth. Its hidden state is
    the history itself (an index into ``histories``). At the SOT position it says
    ``NO_SPEECH`` with probability ``no_speech``. Counts its passes and the tokens run.
    """

    truth: Sequence[int] = tuple(TRUTH)
    no_speech: float = 0.25
    histories: list[tuple[int, ...]] = field(default_factory=list)
    passes: int = 0
    tokens_run: int = 0

    def new_cache(self, memory: npt.NDArray[Any], capacity: int) -> FakeCache:
        return FakeCache([-1] * capacity)

    def extend(self, cache: FakeCache, tokens: Sequence[int]) -> npt.NDArray[Any]:
        self.passes += 1
        self.tokens_run += len(tokens)
        rows = []
        for i, t in enumerate(tokens):
            cache.tokens[cache.length + i] = t
            self.histories.append(tuple(cache.tokens[: cache.length + i + 1]))
            rows.append([float(len(self.histories) - 1)])
        cache.length += len(tokens)
        return np.asarray(rows, np.float32)

    def next_token(self, history: tuple[int, ...]) -> int:
        if list(history[: len(PROMPT)]) != PROMPT:
            return 1
        said = list(history[len(PROMPT) :])
        if said != list(self.truth[: len(said)]):
            return 1
        return self.truth[len(said)] if len(said) < len(self.truth) else EOT

    def logits(self, x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        out = np.full((len(x), VOCAB), -5.0, np.float32)
        for r, (h,) in enumerate(x):
            history = self.histories[int(h)]
            if history[-1] == SOT:
                p = self.no_speech
                out[r] = np.log((1 - p) / (VOCAB - 1))
                out[r, NO_SPEECH] = np.log(p)
            else:
                out[r, self.next_token(history)] = 5.0
        return out


def decode(
    draft: Sequence[int],
    *,
    truth: Sequence[int] = tuple(TRUTH),
    max_length: int = 100,
    processors: Sequence[Any] = (),
) -> tuple[list[int], FakeDecoder, Any]:
    dec = FakeDecoder(truth)
    out = draft_greedy(
        dec,
        np.zeros((4, 4), np.float32),
        PROMPT,
        draft,
        sot=SOT,
        eot=EOT,
        no_speech=NO_SPEECH,
        max_length=max_length,
        processors=processors,
    )
    assert out.passes == dec.passes
    return out.result.sequences_ids[0], dec, out


def test_the_decode_s_own_words_as_the_draft_take_one_pass() -> None:
    got, dec, out = decode(TRUTH)
    assert got == TRUTH
    assert dec.passes == 1  # the prompt, the draft and the EOT after it, together
    assert out.accepted == len(TRUTH)
    assert len(out.logits) == len(TRUTH) + 1  # a row per token chosen, the EOT's last
    assert out.result.no_speech_prob == pytest.approx(0.25, rel=1e-5)


def test_without_a_draft_each_token_is_one_pass_and_the_result_the_same() -> None:
    got, dec, out = decode([])
    assert got == TRUTH
    assert dec.passes == len(TRUTH) + 1
    assert out.accepted == 0


@pytest.mark.parametrize(
    "draft",
    [
        TRUTH[:5] + [33] + TRUTH[6:],  # a word changed
        TRUTH[:4] + TRUTH[5:],  # a word lost
        TRUTH[:7] + [33, 34] + TRUTH[7:],  # words inserted
        TRUTH[:-3],  # the interim stopped short of the end
        TRUTH + [17, 18, 19],  # the draft goes on past the decode's end
        [33, 34, 35],  # nothing right
    ],
    ids=["changed", "lost", "inserted", "short", "longer", "wrong"],
)
def test_whatever_the_draft_says_the_result_is_the_decoders_choice(draft: list[int]) -> None:
    got, dec, out = decode(draft)
    assert got == TRUTH
    # Never more passes than stepping one token at a time.
    assert dec.passes <= len(TRUTH) + 1


def test_a_draft_that_lost_a_word_is_picked_up_again_after_it() -> None:
    """After the first disagreement the draft's tokens that follow the decoded ones are
    checked together: a word lost in the middle costs a pass or two, not a step per token."""
    got, dec, out = decode(TRUTH[:4] + TRUTH[5:])
    assert got == TRUTH
    assert dec.passes <= 3
    assert out.accepted >= len(TRUTH) - 2


def test_the_length_cap_stops_the_decode_as_the_loop_does() -> None:
    got, _, out = decode(TRUTH, max_length=5)
    assert got == TRUTH[:5]
    assert len(out.logits) == 5


def test_processors_apply_at_every_position_the_draft_covers() -> None:
    """A token the rules forbid is not taken from the draft: the decoder's next best is."""
    got, _, _ = decode(TRUTH, processors=[SuppressTokens.of([TRUTH[2]])])
    assert TRUTH[2] not in got
    assert got[:2] == TRUTH[:2]


def test_the_score_is_the_mean_log_probability_the_loop_reports() -> None:
    got, _, out = decode(TRUTH)
    # Each chosen token: logit 5 against 63 at -5, EOT included, over the text tokens.
    lp = 5.0 - np.log(np.exp(5.0) + 63 * np.exp(-5.0))
    assert out.result.scores[0] == pytest.approx(lp * (len(TRUTH) + 1) / len(TRUTH), rel=1e-3)


def test_lookup_finds_what_follows_the_last_tokens_decoded() -> None:
    draft = [1, 2, 3, 4, 2, 3, 9, 8]
    assert lookup([7, 2, 3], draft, 3) == [9, 8]  # the latest "2 3"
    assert lookup([5, 4], draft, 2) == [2, 3]  # one token matched when two are not
    assert lookup([5, 6], draft, 4) == []
    assert lookup([], draft, 4) == []


# -- the session's drafts -------------------------------------------------------------------------


def tone(ms: int) -> bytes:
    t = np.arange(16 * ms) / 16000.0
    return (0.3 * 32767 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(32 * ms)


def call(turns: str) -> list[AsrRequest]:
    """Two utterances 1 s apart (one turn with smart turns) through a session on a FAKE
    recogniser that names each interim's text by its request number; the requests."""

    def text(req: AsrRequest) -> str:
        return f"words of {len(req.audio)} samples"

    asr = FakeTranscriber(text, delay_s=0.15)
    cfg = CallConfig(
        ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
        playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
        vad=VadConfig(end_silence_ms=600 if turns == "off" else 200),
        interims=InterimOptions(results=True, interval_ms=200),
        recognition=RecognitionOptions(
            turns=TurnOptions(mode="smart", min_silence_ms=200, max_pause_ms=1600)
            if turns == "smart"
            else TurnOptions()
        ),
    )
    session = CallSession(
        cfg, LimitsConfig(), asr, None, metrics=GatewayMetrics(), detector=EnergyVoiceDetector()
    )
    out: list[OutboundEvent] = []
    pcm = silence(200) + tone(1500) + silence(1000) + tone(1500) + silence(1500)

    async def main() -> None:
        inbox: asyncio.Queue[InboundEvent | None] = asyncio.Queue()

        async def sink(event: OutboundEvent) -> None:
            out.append(event)

        runner = asyncio.create_task(session.run(inbox.get, sink))
        for i in range(0, len(pcm), 640):
            await inbox.put(AudioIn(pcm[i : i + 640]))
            await asyncio.sleep(0.02)
        await inbox.put(None)
        await asyncio.wait_for(runner, 600)  # virtual seconds: a hang guard

    run_virtual(main())
    assert len([e for e in out if isinstance(e, TranscriptOut) and e.is_final]) == 2
    return asr.requests


@pytest.mark.parametrize("turns", ["smart", "off"])
def test_each_final_carries_its_utterance_s_longest_interim_as_its_draft(turns: str) -> None:
    requests = call(turns)
    finals = [r for r in requests if r.is_final and not r.bulk]
    assert len({r.utterance for r in finals}) == 2
    for k, r in enumerate(requests):
        if not r.is_final or r.bulk:
            continue
        before = [q for q in requests[:k] if not q.is_final and q.utterance == r.utterance]
        assert before  # interims did run before it (the check is not vacuous)
        longest = max(len(q.audio) for q in before)
        # The longest interim back by then: at most the longest started.
        assert r.draft.startswith("words of ")
        assert int(r.draft.split()[2]) <= longest


def test_the_turn_decoded_whole_carries_the_turn_s_finals_as_its_draft() -> None:
    requests = call("smart")
    finals = [r for r in requests if r.is_final and not r.bulk]
    whole = [r for r in requests if r.bulk]
    assert whole, "the two-utterance turn was not decoded whole"
    joined = " ".join(f"words of {len(r.audio)} samples" for r in finals)
    assert whole[-1].draft == joined
