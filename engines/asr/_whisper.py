"""Whisper on CTranslate2, called directly on batches: features, encode, generate, align.

One :meth:`WhisperEngine.infer_batch` call runs in rounds. Each round groups the pending work by
what CTranslate2 applies to a whole call (encoder length, prompt length, beam, temperature,
sampling) and issues one ``encode`` / ``generate`` per group:

1. skip items the policy rejects up front (too short, too quiet);
2. encode each item on the smallest bucket that fits it (the encoder-window policy) and detect
   its language where the call did not fix one;
3. decode; an item whose decode loops or fails Whisper's gates is re-encoded on the full 30 s
   window, then retried at rising temperatures, each time re-batched with the others that need
   the same retry, while its own latency budget lasts (``voxgate.engines.asr._jobs.next_step``);
4. gate, pick the output (best or MBR), align words with cross-attention, build the results.

When a logits processor applies to an item (a boosted phrase, the silence-aware end of text,
the hallucination bias; see ``voxgate.engines.asr._decode`` and docs/decode_loop.md), step 3 runs
our own decode loop for it instead of ``generate``; the other items keep ``generate``, the fast
path. The loop's results have ``generate``'s shape, so gates and fallbacks are unchanged.

Word timestamps come from CTranslate2's ``align`` (cross-attention + DTW, as faster-whisper's
``find_alignment``) rather than timestamp tokens: timestamp tokens would change the number of
task tokens (a batch key), only give segment-level times, and cost decode steps; ``align`` is one
extra decoder pass per batch over the already-encoded audio.

The step path (:meth:`WhisperEngine.add` / :meth:`~WhisperEngine.step` /
:meth:`~WhisperEngine.abort`, ``voxgate.engines.asr._step_batch``) runs the same rounds in one
open decode loop that requests join and leave between steps; the scheduler drives it.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self

import ctranslate2
import numpy as np
import numpy.typing as npt
import tokenizers
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.tokenizer import _LANGUAGE_CODES, Tokenizer

from voxgate.engines.asr import _policy as policy
from voxgate.engines.asr._align import word_times
from voxgate.engines.asr._decode import (
    DecodeItem,
    DecodeLoop,
    DecodeResult,
    LogitsProcessor,
    SharedDecoder,
    StepLoop,
)
from voxgate.engines.asr._jobs import (
    Attempt,
    EngineCounters,
    Hyp,
    Job,
    chosen_attempt,
    end_mark_probability,
    is_end_mark,
    merge,
    next_step,
    plan_jobs,
    refusal,
    runner_up_languages,
)
from voxgate.engines.asr._model_files import resolve_model_dir
from voxgate.engines.asr._phrases import PhraseBoost, PhraseTree, parse_hotwords
from voxgate.engines.asr._processors import (
    HallucinationBias,
    RepetitionPenalty,
    SilenceAwareEnd,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
    hallucination_strength,
)
from voxgate.engines.asr._step_batch import StepBatch
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult, AsrWord
from voxgate.engines.asr.config import FULL_WINDOW_FRAMES, WhisperConfig
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray, UtteranceStats

__all__ = ["EngineCounters", "WhisperEngine"]

#: Encoder output positions per second (mel frames are strided by 2).
_MAX_PROMPT_TOKENS = 223
#: A detected language's runner-up with at least this probability is tried when the first fails.
_ALT_LANGUAGE_MIN_PROB = 0.2
#: No-speech probability from which a transcript made only of hotwords is taken as recited.
_RECITED_HOTWORD_NO_SPEECH = 0.3
_WORD_RE = re.compile(r"[\w']+")
#: ``lone_encode_threads`` 0 (auto) loads the second replica only for a model this small
#: (base's model.bin is 145 MB): a large model's copy would cost gigabytes of memory.
_LONE_AUTO_MAX_MODEL_BYTES = 400 * 1024 * 1024


class _Occupancy:
    """How many workers of one engine (it and its siblings) are inside a decode round now.

    A final of a call alone on the server (``AsrRequest.alone``) whose worker is the only busy
    one may encode on every core (the lone replica): the other core would otherwise sit idle
    while the caller waits. Read without the lock at the encode (a worker that starts just
    after only shares a core for that one pass).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Count the calling worker as busy for the block."""
        with self._lock:
            self.busy += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1


class WhisperEngine:
    """A Whisper recogniser over CTranslate2 that decodes many utterances per call.

    Threading: not thread-safe; one worker thread calls every method (CTranslate2's own
    ``inter_threads`` workers run underneath). Units: audio is float32 mono 16 kHz; times in
    results are ms from the utterance start.

    Args:
        model: the CTranslate2 Whisper model.
        hf_tokenizer: its ``tokenizers.Tokenizer``.
        config: the engine's settings.
        clock: seconds on a monotonic clock; the latency budgets are kept on it (tests pass a
            fake one whose time the fake model advances).
    """

    def __init__(
        self,
        model: ctranslate2.models.Whisper,
        hf_tokenizer: Any,
        config: WhisperConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = f"whisper-{Path(config.model).name}"
        self.config = config
        self.counters = EngineCounters()
        self._clock = clock
        # Seconds per item of the last encode at each frame count: what a full-window
        # re-encode is expected to cost when deciding whether it fits an item's budget.
        self._encode_cost_s: dict[int, float] = {}
        self._model = model
        self._hf_tokenizer = hf_tokenizer
        self._multilingual = bool(model.is_multilingual)
        self._features = FeatureExtractor(feature_size=int(model.n_mels))
        self._tokenizers: dict[tuple[str, str], Tokenizer] = {}
        self._suppress_cache: tuple[int, ...] | None = None
        self._end_mark_ids: tuple[int, ...] | None = None
        # How CTranslate2 reads `max_length` (measured in warmup(); see _max_length).
        self._halved_max_length = False
        self._loop_shared = SharedDecoder(None, config.decode_loop.weights)
        self._phrase_trees: dict[tuple[str, ...], PhraseTree] = {}
        #: The open decode batch of the step path (add / step / abort); None when idle.
        self._batch: StepBatch | None = None
        #: A second replica on ``lone_encode_threads`` threads for a lone final's encoder
        #: pass (set by :meth:`load`; shared by siblings), and the workers busy now.
        self._lone: ctranslate2.models.Whisper | None = None
        self._occupancy = _Occupancy()

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def load(cls, config: object = None, *, clock: Callable[[], float] = time.monotonic) -> Self:
        """Load the model named by ``config`` from local files (never from a hub).

        Args:
            config: a :class:`WhisperConfig`, a mapping of its fields, or None for defaults.
            clock: the clock the latency budgets are kept on (see the class).

        Raises:
            voxgate.engines.asr._model_files.ModelFilesError: model files missing or corrupt.
            TypeError: ``config`` is of another type.
        """
        if config is None:
            cfg = WhisperConfig()
        elif isinstance(config, WhisperConfig):
            cfg = config
        elif isinstance(config, dict):
            cfg = WhisperConfig.model_validate(config)
        else:
            raise TypeError(f"WhisperEngine.load needs a WhisperConfig, got {type(config)!r}")
        model_dir = resolve_model_dir(
            cfg.model, Path(cfg.cache_dir) if cfg.cache_dir is not None else None
        )
        model = ctranslate2.models.Whisper(
            str(model_dir),
            device=cfg.device,
            device_index=cfg.device_index,
            compute_type=cfg.resolved_compute_type,
            inter_threads=cfg.inter_threads,
            intra_threads=cfg.resolved_intra_threads,
            flash_attention=cfg.flash_attention,
        )
        hf_tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        engine = cls(model, hf_tok, cfg, clock=clock)
        engine._loop_shared = SharedDecoder(model_dir, cfg.decode_loop.weights)
        lone = cfg.resolved_lone_encode_threads
        big = (model_dir / "model.bin").stat().st_size > _LONE_AUTO_MAX_MODEL_BYTES
        if lone > 1 and not (big and not cfg.lone_encode_threads):
            engine._lone = ctranslate2.models.Whisper(
                str(model_dir),
                device=cfg.device,
                compute_type=cfg.resolved_compute_type,
                inter_threads=1,
                intra_threads=lone,
            )
        return engine

    def sibling(self) -> Self:
        """Another engine over the same CTranslate2 model and tokenizer, for another worker.

        CTranslate2 models are safe to call from several threads, but this class keeps
        per-object caches and unsynchronised cost counters, so each batcher worker gets its
        own object. The sibling inherits this engine's measurements (warmup is not repeated).
        """
        twin = type(self)(self._model, self._hf_tokenizer, self.config, clock=self._clock)
        twin._halved_max_length = self._halved_max_length
        twin._encode_cost_s = dict(self._encode_cost_s)
        twin._loop_shared = self._loop_shared
        twin._lone = self._lone
        twin._occupancy = self._occupancy
        return twin

    def warmup(self) -> None:
        """Calibrate ``max_length``, then run encode, generate and align on faint noise.

        The noise is also encoded on the full window once: that is what a ``window`` retry
        costs, which decides whether one fits an item's budget (the encoder's cost grows
        faster than its frames: 2000 frames took a third of 3000's on the 2-core CPU), and
        the first real retry then finds CTranslate2's buffers for that shape ready.
        """
        self._calibrate_max_length()
        rng = np.random.default_rng(0)
        audio = (rng.standard_normal(ASR_SAMPLE_RATE_HZ) * 0.01).astype(np.float32)
        stats = UtteranceStats(1000, 1000, 1.0, 0, 0, -40.0, -40.0, -30.0)
        self.infer_batch([AsrRequest(audio, stats, AsrOptions(silence_aware=False))])
        began = self._clock()
        self._model.encode(self._storage([self._feature(audio, FULL_WINDOW_FRAMES)]))
        self._encode_cost_s[FULL_WINDOW_FRAMES] = self._clock() - began
        if self._lone is not None:
            # Its threads start now, not on the first final that encodes alone.
            self._lone.encode(self._storage([self._feature(audio, 1000)]))
        self.counters.reset()

    def _calibrate_max_length(self) -> None:
        """Find out whether ``generate`` stops after ``max_length // 2`` new tokens.

        ``max_length`` should mean prompt + new tokens (faster-whisper's reading), but
        CTranslate2 4.8.5 returns at most ``max_length // 2`` new tokens and at most
        ``max_length - len(prompt) + 1`` (measured: 448 -> 224, 64 -> 32, prompt 24 at 32 -> 9),
        which silently cut transcripts short ("... in size ten" became "... in Syston."). One
        64-step greedy decode with end-of-text suppressed tells which reading holds.
        """
        frames = 1000
        feats = self._storage([np.zeros((int(self._model.n_mels), frames), np.float32)])
        enc = self._model.encode(feats)
        tok = self._tokenizer("en", "transcribe")
        prompt = [*tok.sot_sequence, tok.no_timestamps]
        res = self._model.generate(
            enc,
            [prompt],
            beam_size=1,
            max_length=64,
            suppress_blank=False,
            suppress_tokens=[-1, tok.eot],
        )
        got = len(res[0].sequences_ids[0])
        self._halved_max_length = got < 64 - len(prompt)

    def max_length(self, prompt_len: int, new_tokens: int) -> int:
        """The ``max_length`` that lets ``generate`` emit ``new_tokens`` after the prompt."""
        if self._halved_max_length:
            wanted = max(2 * new_tokens, new_tokens + prompt_len - 1)
        else:
            wanted = prompt_len + new_tokens
        return min(448, wanted)

    def close(self) -> None:
        """Release the model weights (the object is unusable afterwards)."""
        self._model.unload_model()
        if self._lone is not None:
            self._lone.unload_model()

    # ------------------------------------------------------------------ helpers

    def _tokenizer(self, language: str, task: str) -> Tokenizer:
        key = (language, task)
        tok = self._tokenizers.get(key)
        if tok is None:
            tok = Tokenizer(self._hf_tokenizer, self._multilingual, task=task, language=language)
            self._tokenizers[key] = tok
        return tok

    def _end_marks(self, tok: Tokenizer) -> tuple[int, ...]:
        """The ids of the tokens that close a sentence (one vocabulary for every language)."""
        if self._end_mark_ids is None:
            vocab = self._hf_tokenizer.get_vocab()
            self._end_mark_ids = tuple(
                sorted(
                    i
                    for piece, i in vocab.items()
                    if i < tok.eot and is_end_mark(piece.replace("\u0120", " "))
                )
            )
        return self._end_mark_ids

    def _suppress_tokens(self, tok: Tokenizer) -> list[int]:
        if self._suppress_cache is None:
            self._suppress_cache = policy.suppress_token_ids(tok.encode, tok.non_speech_tokens)
        return list(self._suppress_cache)

    @property
    def languages(self) -> tuple[str, ...]:
        """Language codes this model transcribes (what ``AsrOptions.language`` may be)."""
        return tuple(_LANGUAGE_CODES) if self._multilingual else ("en",)

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """A call's prompt and hotwords as Whisper previous-text tokens.

        Whisper's text BPE does not depend on the language or task, so the gateway encodes a
        call's context once when the call starts (``AsrOptions.context_tokens``) instead of
        once per utterance on the shared workers. Thread-safe (the Rust tokenizer is).
        """
        words, _ = parse_hotwords(hotwords)
        context = " ".join(p for p in (initial_prompt.strip(), ", ".join(words)) if p)
        if not context:
            return ()
        return tuple(self._hf_tokenizer.encode(" " + context, add_special_tokens=False).ids)

    def _context(self, job: Job) -> list[int]:
        """The call's initial prompt and hotwords as previous-text tokens (may be empty)."""
        tokens = job.options.context_tokens
        if tokens is None:
            tokens = self.encode_context(job.options.initial_prompt, job.options.hotwords)
        return list(tokens[-_MAX_PROMPT_TOKENS:])

    def _prompt(self, job: Job) -> list[int]:
        assert job.language is not None
        tok = self._tokenizer(job.language, job.options.task)
        ctx = self._context(job)
        prompt = [tok.sot_prev, *ctx] if ctx else []
        return [*prompt, *tok.sot_sequence, tok.no_timestamps]

    def _feature(self, audio: FloatArray, frames: int) -> npt.NDArray[np.float32]:
        mel = self._features(audio, padding=160)[:, :-1]
        mel = mel[:, :frames]
        if mel.shape[1] < frames:
            mel = np.pad(mel, ((0, 0), (0, frames - mel.shape[1])))
        return np.ascontiguousarray(mel, dtype=np.float32)

    def _storage(self, arrays: Sequence[npt.NDArray[Any]]) -> Any:
        return ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(arrays)))

    def _chunks(self, n: int) -> list[slice]:
        size = self.config.max_batch_size
        return [slice(i, min(n, i + size)) for i in range(0, n, size)]

    # ------------------------------------------------------------------ rounds

    def _encode(self, jobs: list[Job]) -> None:
        """Encode every job that lacks an encoder output at its current frame count."""
        by_frames: dict[int, list[Job]] = defaultdict(list)
        for j in jobs:
            if j.frames not in j.encoder_out:
                by_frames[j.frames].append(j)
        to_cpu = self.config.device == "cuda"
        for frames, group in by_frames.items():
            for sl in self._chunks(len(group)):
                part = group[sl]
                began = self._clock()
                feats = self._storage([self._feature(j.audio, frames) for j in part])
                # The final of a call alone on the server, no other worker busy: every core
                # on its encoder pass (same output; docs/turns.md, "A lone call's final
                # encoded on both cores"). Not with other calls: a decode of theirs that
                # starts meanwhile would share the cores with it (measured later at four).
                wide = self._occupancy.busy == 1 and all(j.wide for j in part)
                lone = self._lone if wide else None
                t0 = time.perf_counter()
                out = np.array((lone or self._model).encode(feats, to_cpu=to_cpu))
                self.counters.encode_s += time.perf_counter() - t0
                if lone is not None:
                    self.counters.lone_encodes += len(part)
                else:
                    # What a retry on one worker's threads costs (budget decisions).
                    self._encode_cost_s[frames] = (self._clock() - began) / len(part)
                self.counters.encoded_frames += frames * len(part)
                for j, enc in zip(part, out, strict=True):
                    j.encoder_out[frames] = enc
                    j.encoded_frames += frames
                undetected = [j for j in part if j.language is None]
                if undetected:
                    self._detect([j for j in part if j.language is None], frames)

    def _detect(self, jobs: list[Job], frames: int) -> None:
        if not self._multilingual:
            for j in jobs:
                j.language = "en"
            return
        t0 = time.perf_counter()
        probs = self._model.detect_language(self._storage([j.encoder_out[frames] for j in jobs]))
        self.counters.detect_s += time.perf_counter() - t0
        for j, p in zip(jobs, probs, strict=True):
            j.language = p[0][0][2:-2]
            ranked = [(code[2:-2], float(prob)) for code, prob in p[:3]]
            j.language_probs = dict(ranked)
            # Decoding in the wrong language fails the gates and the caller's words were
            # lost: the call's language and a close runner-up get a decode of their own
            # before the window and temperature fallbacks.
            j.alt_languages = runner_up_languages(
                ranked, _ALT_LANGUAGE_MIN_PROB, j.options.language_hint
            )

    def _decode(self, jobs: list[Job]) -> None:
        """One generate per group of jobs that agree on every call-wide option.

        Jobs a logits processor applies to go through our own loop instead, all together
        (the loop has no batch keys: every item carries its own options and processors).
        """
        looped = [j for j in jobs if self._wants_loop(j)]
        if looped:
            self._loop_decode(looped)
            jobs = [j for j in jobs if not any(j is x for x in looped)]
        groups: dict[tuple[Any, ...], list[tuple[Job, list[int]]]] = defaultdict(list)
        for j in jobs:
            prompt = self._prompt(j)
            temp = j.plan.temperatures[j.temp_idx]
            key = (
                j.frames,
                len(prompt),
                temp,
                j.plan.beam_size if temp == 0.0 else 1,
                j.plan.num_hypotheses if temp == 0.0 else j.plan.best_of,
                j.plan.suppress_hallucination_tokens,
                j.plan.repetition_penalty,
                j.plan.no_repeat_ngram_size,
                j.options.end_mark,
            )
            groups[key].append((j, prompt))
        for key, members in groups.items():
            frames, prompt_len, temp, beam, nhyp, suppress, rep, ngram, end_mark = key
            for sl in self._chunks(len(members)):
                part = members[sl]
                tok0 = self._tokenizer(part[0][0].language or "en", part[0][0].options.task)
                max_len = self.max_length(prompt_len, max(j.plan.max_new_tokens for j, _ in part))
                kwargs: dict[str, Any] = {
                    "beam_size": beam,
                    "num_hypotheses": nhyp,
                    "repetition_penalty": rep,
                    "no_repeat_ngram_size": ngram,
                    "max_length": max_len,
                    "return_scores": True,
                    "return_no_speech_prob": True,
                    "suppress_blank": True,
                    "suppress_tokens": self._suppress_tokens(tok0) if suppress else [-1],
                    # Every step's scores, for the end mark's probability (a copy per step,
                    # not measurable on one CPU decode); asked for only where it is read.
                    "return_logits_vocab": end_mark,
                }
                if temp > 0.0:
                    kwargs.update(sampling_topk=0, sampling_temperature=temp)
                feats = self._storage([j.encoder_out[frames] for j, _ in part])
                t0 = time.perf_counter()
                results = self._model.generate(feats, [p for _, p in part], **kwargs)
                self.counters.generate_s += time.perf_counter() - t0
                for (j, _), res in zip(part, results, strict=True):
                    self._record(j, temp, res)

    # ------------------------------------------------------------------ our decode loop

    def _phrase_tree(self, hotwords: tuple[str, ...]) -> PhraseTree | None:
        """The prefix tree of a call's boosted hotwords (cached per distinct list)."""
        if not any("^" in h for h in hotwords):
            return None
        tree = self._phrase_trees.get(hotwords)
        if tree is None:
            _, phrases = parse_hotwords(hotwords)
            tree = PhraseTree(
                phrases, lambda t: self._hf_tokenizer.encode(t, add_special_tokens=False).ids
            )
            if len(self._phrase_trees) > 256:
                self._phrase_trees.clear()
            self._phrase_trees[hotwords] = tree
        return tree if tree else None

    def _wants_loop(self, job: Job) -> bool:
        """Whether a processor applies to ``job`` (else ``generate`` is faster and identical)."""
        cfg = self.config.decode_loop
        if job.plan.no_repeat_ngram_size > 0:
            return False  # not implemented in the loop; generate keeps its semantics
        if cfg.always or self._phrase_tree(job.options.hotwords) is not None:
            return True
        return job.options.silence_aware and (cfg.silence_end or cfg.hallucination_bias > 0.0)

    def _loop_processors(
        self, job: Job, tok: Tokenizer, timestamps: bool
    ) -> tuple[list[LogitsProcessor], Any]:
        """Whisper's rules plus ours for one job; the second item adds no-speech-aware ones."""
        mcfg = self._model_config()
        cfg = self.config.decode_loop
        ids: list[int] = []
        raw = self._suppress_tokens(tok) if job.plan.suppress_hallucination_tokens else [-1]
        for t in raw:
            ids.extend(mcfg.get("suppress_ids", []) if t == -1 else [t])
        procs: list[LogitsProcessor] = []
        if job.plan.repetition_penalty != 1.0:
            procs.append(RepetitionPenalty(job.plan.repetition_penalty))
        procs += [
            SuppressTokens.of(ids),
            SuppressBlank(tuple(mcfg.get("suppress_ids_begin", [220, tok.eot]))),
        ]
        tree = self._phrase_tree(job.options.hotwords)
        if tree is not None:
            procs.append(PhraseBoost(tree, tok.eot, cfg.phrase_floor))
        ts_begin = tok.timestamp_begin
        if timestamps:
            st = job.stats
            end_ms = st.duration_ms - st.trailing_silence_ms
            silences: list[tuple[int, int]] = []
            spans = sorted(job.voiced_spans_ms)
            if spans:
                prev = 0
                for a, b in spans:
                    if a > prev:
                        silences.append((prev, a))
                    prev = max(prev, b)
                end_ms = prev
                silences.append((prev, st.duration_ms))
            else:
                silences += [(0, st.leading_silence_ms), (end_ms, st.duration_ms)]
            procs.append(SilenceAwareEnd(tok.eot, ts_begin, end_ms, tuple(silences)))
        late = None
        if cfg.hallucination_bias > 0.0 and job.options.silence_aware:
            hall_ids = self._hallucination_ids(tok)
            stats, top = job.stats, cfg.hallucination_bias

            def late(no_speech: float) -> list[LogitsProcessor]:
                s = hallucination_strength(stats.speech_ratio, stats.speech_rms_dbfs, no_speech)
                return [HallucinationBias(hall_ids, top * s, ts_begin)]

        if timestamps:
            vocab = self._vocab_size()
            procs.append(
                TimestampRules(tok.eot, tok.no_timestamps, ts_begin, vocab - 1, ts_begin + 50)
            )
        return procs, late

    def _hallucination_ids(self, tok: Tokenizer) -> npt.NDArray[np.int64]:
        """First tokens of Whisper's non-speech phrases, as it would start an answer."""
        ids: set[int] = set()
        for phrase in policy.HALLUCINATION_PHRASES.get("en", frozenset()):
            for variant in (" " + phrase.capitalize(), phrase.capitalize()):
                enc = tok.encode(variant)
                if enc:
                    ids.add(enc[0])
        return np.asarray(sorted(ids), np.int64)

    def _model_config(self) -> dict[str, Any]:
        """The model directory's ``config.json`` (suppress lists, alignment heads)."""
        return self._loop_shared.model_config()

    def _vocab_size(self) -> int:
        """The decoder's output vocabulary (the last timestamp token is ``vocab - 1``)."""
        return self._loop_shared.decoder().w.vocab_size

    def _new_loop(self) -> StepLoop:
        """An empty decode loop (its special tokens are the model's, whatever the language)."""
        tok = self._tokenizer("en", "transcribe")
        return DecodeLoop(
            self._loop_shared.decoder(),
            sot=tok.sot,
            eot=tok.eot,
            no_timestamps=tok.no_timestamps,
            no_speech=tok.no_speech,
        )

    def _loop_item(self, job: Job) -> tuple[float, DecodeItem]:
        """The loop item for ``job``'s next decode (its temperature and processors)."""
        assert job.language is not None
        tok = self._tokenizer(job.language, job.options.task)
        ts = self.config.decode_loop.silence_end and job.options.silence_aware
        ts = ts and job.offset_s == 0.0
        prompt = self._prompt(job)
        if ts:
            prompt = prompt[:-1]  # drop <|notimestamps|>
        temp = job.plan.temperatures[job.temp_idx]
        procs, late = self._loop_processors(job, tok, ts)
        # Timestamp tokens take decode steps of their own (about one pair per phrase).
        steps = job.plan.max_new_tokens + (16 if ts else 0)
        item = DecodeItem(
            job.encoder_out[job.frames],
            prompt,
            max_length=steps,
            beam_size=job.plan.beam_size if temp == 0.0 else 1,
            num_hypotheses=job.plan.num_hypotheses if temp == 0.0 else job.plan.best_of,
            temperature=temp,
            processors=procs,
            late_processors=late,
            seed=1000 * job.req + job.temp_idx,
        )
        return temp, item

    def _loop_record(self, job: Job, temp: float, res: DecodeResult) -> None:
        """Record a loop decode in ``generate``'s shape."""
        eot = self._tokenizer("en", "transcribe").eot
        # With timestamp tokens the score is per token of every kind; _record reads it as per
        # text token (generate's no-timestamp shape), so rescale it.
        for h, ids in enumerate(res.sequences_ids):
            n_text = sum(1 for t in ids if t < eot)
            if n_text and n_text != len(ids):
                res.scores[h] *= len(ids) / n_text
        self._record(job, temp, res)

    def _loop_decode(self, jobs: list[Job]) -> None:
        """Decode ``jobs`` with our loop: one batch, per-item processors, beams and lengths."""
        for sl in self._chunks(len(jobs)):
            part = jobs[sl]
            loop = self._new_loop()
            items = [(j, *self._loop_item(j)) for j in part]
            t0 = time.perf_counter()
            results = loop.run([it for _, _, it in items])
            self.counters.loop_s += time.perf_counter() - t0
            self.counters.loop_items += len(items)
            self.counters.loop_steps += loop.steps
            self.counters.loop_rows += loop.rows
            for (j, temp, _), res in zip(items, results, strict=True):
                self._loop_record(j, temp, res)

    def _record(self, job: Job, temperature: float, res: Any) -> None:
        """Store one decode and decide the job's next step (done, full window, hotter)."""
        assert job.language is not None
        tok = self._tokenizer(job.language, job.options.task)
        hyps = []
        # Whisper sometimes starts its answer by reciting the previous-text prompt ("Captain
        # Frere of the penal colony. Captain Frere says ..."); that is the caller's context,
        # not their words.
        ctx = self._context(job)
        logits = res.logits if job.options.end_mark else []
        for i, (ids, score) in enumerate(zip(res.sequences_ids, res.scores, strict=True)):
            tokens = [t for t in ids if t < tok.eot]
            if ctx and tokens[: len(ctx)] == ctx:
                tokens = tokens[len(ctx) :]
            n = len(tokens)
            cum = float(score) * n
            mark = (
                end_mark_probability(ids, logits[i], self._end_marks(tok), tok.eot)
                if i < len(logits)
                else None
            )
            hyps.append(Hyp(tokens, tok.decode(tokens).strip(), cum / (n + 1), cum, mark))
        if temperature > 0.0:
            # Sampling returns best_of draws; Whisper keeps the most likely one first.
            hyps.sort(key=lambda h: h.avg_logprob, reverse=True)
        best = hyps[0]
        cfg = self.config.policy
        cap_hit = len(best.tokens) >= job.plan.max_new_tokens
        artifact = job.frames < FULL_WINDOW_FRAMES and self._short_window_artifact(job, best.text)
        # A final whose text stopped while the speech went on (see policy.cut_short): with a
        # prompt, whatever the model thinks of the audio (the prompt is the likely cause);
        # without one, only where the model hears speech (silence is never retried).
        speech_s = min(job.stats.speech_ms / 1000.0, len(job.audio) / ASR_SAMPLE_RATE_HZ)
        short = job.plan.prompt_fallback and policy.cut_short(len(best.tokens), speech_s)
        short = short and (bool(ctx) or float(res.no_speech_prob) <= cfg.no_speech_threshold)
        degenerate = (
            cap_hit
            or artifact
            or short
            or policy.has_repetition_loop(best.tokens)
            or policy.has_repeated_block(best.tokens)
            or policy.needs_fallback(
                best.avg_logprob,
                policy.compression_ratio(best.text),
                float(res.no_speech_prob),
                cfg,
            )
        )
        job.attempts.append(
            Attempt(
                job.frames,
                job.language,
                temperature,
                hyps,
                float(res.no_speech_prob),
                degenerate,
                window_artifact=artifact,
                short=short,
                prompted=bool(ctx),
            )
        )

    @staticmethod
    def _short_window_artifact(job: Job, text: str) -> bool:
        """Whether a short-window decode shows what only short windows were seen to do.

        A recital of the prompt's end or a phrase said twice in a row (``policy.echoes_prompt``,
        ``policy.repeats_a_phrase``): both ask for the full window, where neither is judged.
        """
        prompt = job.options.initial_prompt
        if prompt and policy.echoes_prompt(text, prompt):
            return True
        return policy.repeats_a_phrase(text)

    def _after_decode(self, job: Job, now: float) -> None:
        """The retry ladder's verdict on ``job``'s last decode (see :func:`next_step`)."""
        next_step(job, now, self.config, self.counters, self._encode_cost_s)

    def _align(self, items: list[tuple[Job, Attempt, Hyp]]) -> dict[int, list[AsrWord]]:
        """Word times from cross-attention for each (job, attempt, hyp); keyed by ``id(job)``."""
        out: dict[int, list[AsrWord]] = {}
        groups: dict[tuple[int, tuple[int, ...]], list[tuple[Job, Hyp]]] = defaultdict(list)
        for job, att, hyp in items:
            if not hyp.tokens:
                continue
            assert job.language is not None
            tok = self._tokenizer(job.language, job.options.task)
            groups[(att.frames, tuple(tok.sot_sequence))].append((job, hyp))
        for (frames, sot), members in groups.items():
            for sl in self._chunks(len(members)):
                part = members[sl]
                feats = self._storage([j.encoder_out[frames] for j, _ in part])
                t0 = time.perf_counter()
                results = self._model.align(
                    feats,
                    list(sot),
                    [h.tokens for _, h in part],
                    [min(frames, j.content_frames) for j, _ in part],
                    median_filter_width=self.config.word_timestamp_median_filter,
                )
                self.counters.align_s += time.perf_counter() - t0
                for (job, hyp), res in zip(part, results, strict=True):
                    out[id(job)] = self._words(job, hyp, res)
        return out

    def _words(self, job: Job, hyp: Hyp, res: Any) -> list[AsrWord]:
        assert job.language is not None
        tok = self._tokenizer(job.language, job.options.task)
        return word_times(
            tok, hyp.tokens, res, offset_s=job.offset_s, limit_s=len(job.audio) / ASR_SAMPLE_RATE_HZ
        )

    # ------------------------------------------------------------------ public

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        """Transcribe ``items`` together; one result per item, in order.

        Items may differ in every option: they are grouped internally by what CTranslate2
        applies per call. Audio longer than 30 s is decoded in 30 s chunks (up to
        ``max_utterance_s``; beyond that it is ignored with a warning). The steps: plan a job
        per 30 s chunk (or refuse the item), run encode/decode rounds until every job is done,
        choose and gate each job's hypothesis, align the words, merge chunks per item.

        Each item's latency budget (``policy.decode_budget_s``) starts now, when the engine
        starts on it, whatever it waited in the batcher's queue before.
        """
        started = self._clock()
        results: list[AsrResult | None] = [None] * len(items)
        jobs: list[Job] = []
        for i, req in enumerate(items):
            refused = self._refusal(req)
            if refused is not None:
                results[i] = refused
            else:
                jobs.extend(self._plan_jobs(i, req, started))
        self._run_rounds(jobs)
        chosen = {id(job): self._choose(job) for job in jobs}
        to_align = [
            (j, chosen[id(j)][0], chosen[id(j)][1])
            for j in jobs
            if j.options.word_timestamps and not chosen[id(j)][2]
        ]
        words = self._align(to_align) if to_align else {}
        per_req: dict[int, list[Job]] = defaultdict(list)
        for job in jobs:
            per_req[job.req].append(job)
        for i, req_jobs in per_req.items():
            results[i] = merge(req_jobs, chosen, words)
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    @property
    def continuous(self) -> bool:
        """Whether :meth:`add` / :meth:`step` batch at the decode-step level.

        Only our decode loop can take an utterance into a batch that has started, so this is
        ``decode_loop.always``: with it every utterance is decoded by the loop.
        """
        return self.config.decode_loop.always

    @property
    def capacity(self) -> int:
        """The most requests decoding at once (``max_batch_size``, the scheduler's too)."""
        return self.config.max_batch_size

    @property
    def open_count(self) -> int:
        """Requests added and not yet finished."""
        return self._batch.open_count if self._batch is not None else 0

    def has_unfinished(self) -> bool:
        """Whether a request is open or a finished one waits to be returned by :meth:`step`."""
        return self._batch is not None and self._batch.has_unfinished()

    def add(self, requests: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        """Start decoding ``requests`` (key, request) in the open decode batch.

        Iteration-level batching (the scheduler's ``join_running``): the newcomers are encoded
        together with CTranslate2 and their decodes join the running step loop at the next
        :meth:`step`. Each request's latency budget starts now. Jobs the loop cannot decode
        (``no_repeat_ngram_size``) run through ``generate`` at once. See
        :mod:`voxgate.engines.asr._step_batch` for the rules.
        """
        if self._batch is None:
            self._batch = StepBatch(self, self._new_loop())
        self._batch.add(requests)

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        """One decode step of every open request; the (key, result) of each that finished.

        A fallback (full window, other language, higher temperature) re-enters the loop as the
        request's next round, so each request is returned once, when its last round is done
        (gates, alignment and merging as in :meth:`infer_batch`).
        """
        return self._batch.step() if self._batch is not None else []

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop the requests of ``keys``; nothing left open closes the batch (next add: new)."""
        if self._batch is None:
            return
        self._batch.abort(keys)
        if not self._batch.has_unfinished():
            self._batch = None

    def _finish_request(self, jobs: list[Job]) -> AsrResult:
        """Choose, gate, align and merge the finished jobs of one request."""
        chosen = {id(job): self._choose(job) for job in jobs}
        to_align = [
            (j, chosen[id(j)][0], chosen[id(j)][1])
            for j in jobs
            if j.options.word_timestamps and not chosen[id(j)][2]
        ]
        words = self._align(to_align) if to_align else {}
        return merge(jobs, chosen, words)

    def _refusal(self, req: AsrRequest) -> AsrResult | None:
        """The result of an item that is not decoded at all (language, policy skip), or None."""
        return refusal(req, self.config, multilingual=self._multilingual)

    def _plan_jobs(self, index: int, req: AsrRequest, started: float) -> list[Job]:
        """One job per 30 s chunk of the request's audio (see :func:`plan_jobs`)."""
        return plan_jobs(index, req, started, self.config, multilingual=self._multilingual)

    def _run_rounds(self, jobs: list[Job]) -> None:
        """Encode and decode until every job is done (fallbacks add rounds).

        After each round every job decides its own next step against its own deadline, so a
        job whose budget is spent leaves with its best text while the others retry on.
        """
        pending = jobs
        with self._occupancy.held():
            while pending:
                self._encode(pending)
                began = self._clock()
                self._decode(pending)
                now = self._clock()
                for job in pending:
                    job.decode_s = now - began
                    self._after_decode(job, now)
                pending = [j for j in jobs if not j.done]

    def _choose(self, job: Job) -> tuple[Attempt, Hyp, str]:
        """The job's chosen attempt and hypothesis (MBR when asked) and its gate verdict."""
        cfg = self.config
        att = chosen_attempt(job, cfg.policy.compression_ratio_threshold)
        job.frames, job.language = att.frames, att.language
        idx = 0
        if job.plan.mbr_candidates > 1:
            idx = policy.mbr_select(
                [h.text for h in att.hyps],
                [h.cum_logprob for h in att.hyps],
                cfg.mbr_posterior_temperature,
            )
        hyp = att.hyps[idx]
        assert job.language is not None
        dropped = ""
        if job.plan.apply_gates:
            dropped = policy.gate_result(
                hyp.text,
                tokens=hyp.tokens,
                avg_logprob=hyp.avg_logprob,
                no_speech_prob=att.no_speech_prob,
                language=job.language,
                stats=job.stats,
                cfg=cfg.policy,
            )
            if not dropped and self._recites_hotwords(hyp.text, job.options.hotwords, att):
                dropped = "hallucination"
        return att, hyp, dropped

    @staticmethod
    def _recites_hotwords(text: str, hotwords: tuple[str, ...], att: Attempt) -> bool:
        """Whether ``text`` is nothing but the call's hotwords on audio that looks silent.

        On noise Whisper recites the last words of its prompt ("Kowalczyk," on pink noise,
        measured on the hallucination set with hotwords in the prompt, and more often with
        them boosted); the whole-prompt recitation is stripped in ``_record``, this catches a
        single hotword. A caller saying just a hotword clearly has a low no-speech probability.
        """
        if not hotwords or att.no_speech_prob < _RECITED_HOTWORD_NO_SPEECH:
            return False
        words, _ = parse_hotwords(hotwords)
        vocab = {w.lower() for h in words for w in _WORD_RE.findall(h)}
        said = _WORD_RE.findall(text.lower())
        return bool(said) and all(w in vocab for w in said)
