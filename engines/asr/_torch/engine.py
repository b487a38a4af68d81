"""The PyTorch Whisper engine: :class:`WhisperEngine`'s rounds over a torch encoder and loop.

Everything above the decoder is the CTranslate2 engine's, inherited unchanged: planning (the
encoder window, the length cap, the latency budget), the retry ladder (runner-up language, full
window, temperatures), the gates, MBR, merging chunks and the step path's joins (``add`` /
``step`` / ``abort``). What changes is below: the encoder is :class:`WhisperTorchModel`'s
(SDPA, on its own CUDA stream), language detection is one decoder step on it, every decode
runs in :class:`TorchDecodeLoop` (there is no ``generate`` to fall back to: with only
Whisper's own rules the loop returns ``generate``'s tokens), and word times come from the
alignment heads' cross-attention with the same median filter and DTW CTranslate2's ``align``
uses (faster-whisper's and OpenAI's ``find_alignment``), computed here.

Device and precision: float32 on CPU (tests; CTranslate2 stays the CPU engine), float16 or
bfloat16 on CUDA (``compute_type``: ``auto`` means float16 there). ``no_repeat_ngram_size``
is not implemented by the loop and is refused at load.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, cast

import numpy as np
import numpy.typing as npt
import tokenizers
import torch

from voxgate.engines.asr._align import word_times
from voxgate.engines.asr._decode import StepLoop
from voxgate.engines.asr._jobs import Attempt, Hyp, Job, runner_up_languages
from voxgate.engines.asr._model_files import resolve_model_dir
from voxgate.engines.asr._torch.loop import TorchDecodeLoop
from voxgate.engines.asr._torch.model import DeviceMemory, WhisperTorchModel
from voxgate.engines.asr._torch.weights import is_hf_checkpoint, load_tensors
from voxgate.engines.asr._whisper import _ALT_LANGUAGE_MIN_PROB, WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrWord
from voxgate.engines.asr.config import FULL_WINDOW_FRAMES, WhisperConfig
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, UtteranceStats

__all__ = ["TorchWhisperEngine", "dtw", "median_filter", "torch_dtype"]

_log = logging.getLogger(__name__)


def torch_dtype(cfg: WhisperConfig) -> torch.dtype:
    """The compute precision: float32 on CPU; float16 (``auto``) or bfloat16 on CUDA.

    Raises:
        ValueError: a compute type the torch engine does not run (int8 variants; half
            precision on CPU).
    """
    ct = cfg.compute_type
    if cfg.device == "cpu":
        if ct not in ("auto", "float32"):
            raise ValueError(
                f"asr.engine='torch' on cpu computes in float32; compute_type={ct!r} is not "
                "supported there (use 'auto' or 'float32', or the ctranslate2 engine)"
            )
        return torch.float32
    table = {"auto": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16}
    table["float32"] = torch.float32
    if ct not in table:
        raise ValueError(
            f"asr.engine='torch' runs float16, bfloat16 or float32; compute_type={ct!r} is not "
            "supported (int8 is a CTranslate2 type)"
        )
    return table[ct]


@dataclass(frozen=True, slots=True)
class _Alignment:
    """One hypothesis' alignment, in the shape of CTranslate2's ``WhisperAlignmentResult``."""

    alignments: list[tuple[int, int]]
    text_token_probs: list[float]


def median_filter(x: npt.NDArray[np.float32], width: int) -> npt.NDArray[np.float32]:
    """Median over a sliding window of ``width`` on the last axis, reflect-padded (Whisper's)."""
    pad = width // 2
    if width <= 1 or x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    out: npt.NDArray[np.float32] = np.median(windows, axis=-1).astype(np.float32)
    return out


def dtw(cost: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Dynamic time warping of a (tokens, frames) cost: Whisper's ``dtw_cpu`` and backtrace.

    Cells on one anti-diagonal depend only on the two before it, so each diagonal is computed
    in one vector operation (tokens + frames steps instead of tokens * frames). Ties are broken
    as Whisper does: diagonal only when strictly best, then up when strictly best, else left.
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf, np.float32)
    trace = np.full((n + 1, m + 1), -1, np.int8)
    acc[0, 0] = 0.0
    for k in range(2, n + m + 1):
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.where(t == 0, c0, np.where(t == 1, c1, c2))
        acc[i, j] = cost[i - 1, j - 1] + best
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    arr = np.array(path[::-1], np.int64)
    return arr[:, 0], arr[:, 1]


class TorchWhisperEngine(WhisperEngine):
    """Whisper on PyTorch behind the ``AsrEngine`` / ``StepAsrEngine`` contracts.

    Threading: as :class:`WhisperEngine`: one worker thread calls every method; each sibling
    (another worker) has its own KV cache over the shared weights.

    Args:
        model: the weights and this engine's cache.
        hf_tokenizer: the model's ``tokenizers.Tokenizer``.
        config: the engine's settings (``engine='torch'``).
        clock: the latency budgets' clock (see :class:`WhisperEngine`).
    """

    def __init__(
        self,
        model: WhisperTorchModel,
        hf_tokenizer: Any,
        config: WhisperConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(model, hf_tokenizer, config, clock=clock)
        self.name = f"whisper-torch-{Path(config.model).name}"
        self._torch = model
        if config.policy.no_repeat_ngram_size > 0:
            raise ValueError(
                "asr.engine='torch' does not implement no_repeat_ngram_size="
                f"{config.policy.no_repeat_ngram_size}; set asr.policy.no_repeat_ngram_size=0 "
                "or use the ctranslate2 engine"
            )

    @classmethod
    def load(cls, config: object = None, *, clock: Callable[[], float] = time.monotonic) -> Self:
        """Load the model named by ``config`` (a CTranslate2 directory or a HF checkpoint).

        Raises:
            voxgate.engines.asr._model_files.ModelFilesError: model files missing or corrupt.
            ValueError: a setting the torch engine does not support.
        """
        if config is None:
            cfg = WhisperConfig()
        elif isinstance(config, WhisperConfig):
            cfg = config
        elif isinstance(config, dict):
            cfg = WhisperConfig.model_validate(config)
        else:
            raise TypeError(f"TorchWhisperEngine.load needs a WhisperConfig, got {type(config)!r}")
        path = Path(cfg.model).expanduser()
        if path.is_dir() and is_hf_checkpoint(path):
            model_dir = path
        else:
            model_dir = resolve_model_dir(
                cfg.model, Path(cfg.cache_dir) if cfg.cache_dir is not None else None
            )
        dtype = torch_dtype(cfg)
        device = f"cuda:{cfg.device_index}" if cfg.device == "cuda" else "cpu"
        if cfg.device == "cpu" and cfg.resolved_intra_threads:
            torch.set_num_threads(cfg.resolved_intra_threads)
        model = WhisperTorchModel(
            load_tensors(model_dir),
            device,
            dtype,
            cfg.max_batch_size,
            graphs=cfg.device == "cuda",
        )
        hf_tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        return cls(model, hf_tok, cfg, clock=clock)

    def sibling(self) -> Self:
        """Another engine over the same weights with its own cache, for another worker."""
        twin = type(self)(self._torch.twin(), self._hf_tokenizer, self.config, clock=self._clock)
        twin._encode_cost_s = dict(self._encode_cost_s)
        return twin

    def warmup(self) -> None:
        """Decode faint noise end to end, then time one full-window encode (a retry's cost)."""
        rng = np.random.default_rng(0)
        audio = (rng.standard_normal(ASR_SAMPLE_RATE_HZ) * 0.01).astype(np.float32)
        stats = UtteranceStats(1000, 1000, 1.0, 0, 0, -40.0, -40.0, -30.0)
        self.infer_batch([AsrRequest(audio, stats, AsrOptions(silence_aware=False))])
        began = self._clock()
        out = self._torch.encode(torch.from_numpy(self._feature(audio, FULL_WINDOW_FRAMES))[None])
        self._sync(out)
        self._encode_cost_s[FULL_WINDOW_FRAMES] = self._clock() - began
        self.counters.reset()

    def close(self) -> None:
        """Release this engine's cache (the weights go with the last sibling)."""
        self._torch.release()

    @property
    def continuous(self) -> bool:
        """Always: every decode runs in the loop, which takes joins at any step."""
        return True

    # ------------------------------------------------------------------ hooks

    def _model_config(self) -> dict[str, Any]:
        return self._torch.meta.config

    def _vocab_size(self) -> int:
        return self._torch.vocab_size

    def _wants_loop(self, job: Job) -> bool:
        return True

    def _new_loop(self) -> StepLoop:
        tok = self._tokenizer("en", "transcribe")
        return TorchDecodeLoop(
            self._torch,
            sot=tok.sot,
            eot=tok.eot,
            no_timestamps=tok.no_timestamps,
            no_speech=tok.no_speech,
        )

    def _sync(self, t: torch.Tensor) -> None:
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)

    def _encode(self, jobs: list[Job]) -> None:
        """Encode every job lacking an encoder output at its frame count (batched per count)."""
        by_frames: dict[int, list[Job]] = defaultdict(list)
        for j in jobs:
            if j.frames not in j.encoder_out:
                by_frames[j.frames].append(j)
        for frames, group in by_frames.items():
            for sl in self._chunks(len(group)):
                part = group[sl]
                began = self._clock()
                mel = np.stack([self._feature(j.audio, frames) for j in part])
                t0 = time.perf_counter()
                out = self._torch.encode(torch.from_numpy(mel))
                ready = self._torch.encode_event()
                self.counters.encode_s += time.perf_counter() - t0
                # On CUDA this is the time to queue the encode, not to run it (the decode steps
                # are not made to wait for it); the full window's cost is measured in warmup().
                self._encode_cost_s[frames] = (self._clock() - began) / len(part)
                self.counters.encoded_frames += frames * len(part)
                for i, j in enumerate(part):
                    j.encoder_out[frames] = cast(Any, DeviceMemory(out[i], ready))
                    j.encoded_frames += frames
                undetected = [j for j in part if j.language is None]
                if undetected:
                    self._detect(undetected, frames)

    def _detect(self, jobs: list[Job], frames: int) -> None:
        if not self._multilingual:
            for j in jobs:
                j.language = "en"
            return
        lang_ids = [int(i) for i in self._torch.meta.config.get("lang_ids", [])]
        if not lang_ids:
            raise ValueError("the model's config has no lang_ids: cannot detect the language")
        codes = [self._hf_tokenizer.id_to_token(i)[2:-2] for i in lang_ids]
        t0 = time.perf_counter()
        memory = torch.stack([cast(DeviceMemory, j.encoder_out[frames]).wait() for j in jobs])
        sot = self._tokenizer("en", "transcribe").sot
        probs = self._torch.detect_language(memory, sot, lang_ids).cpu().numpy()
        self.counters.detect_s += time.perf_counter() - t0
        for j, p in zip(jobs, probs, strict=True):
            order = np.argsort(-p, kind="stable")[:3]
            j.language = codes[order[0]]
            j.language_probs = {codes[k]: float(p[k]) for k in order}
            j.alt_languages = runner_up_languages(
                [(codes[k], float(p[k])) for k in order],
                _ALT_LANGUAGE_MIN_PROB,
                j.options.language_hint,
            )

    def _decode(self, jobs: list[Job]) -> None:
        """Every decode runs in the loop: one batch, per-item processors, beams and lengths."""
        self._loop_decode(jobs)

    def _align(self, items: list[tuple[Job, Attempt, Hyp]]) -> dict[int, list[AsrWord]]:
        """Word times from the alignment heads' cross-attention (CTranslate2's ``align``)."""
        heads = [(int(a), int(b)) for a, b in self._torch.meta.config.get("alignment_heads", [])]
        if not heads:
            layers = self._torch.layers
            heads = [(li, h) for li in range(layers // 2, layers) for h in range(self._torch.heads)]
        width = self.config.word_timestamp_median_filter
        out: dict[int, list[AsrWord]] = {}
        t0 = time.perf_counter()
        for job, att, hyp in items:
            if not hyp.tokens:
                continue
            assert job.language is not None
            tok = self._tokenizer(job.language, job.options.task)
            sot = list(tok.sot_sequence)
            memory = cast(DeviceMemory, job.encoder_out[att.frames]).wait()
            tokens = [*sot, tok.no_timestamps, *hyp.tokens, tok.eot]
            logits, qk = self._torch.cross_attention(memory, tokens, heads)
            n_frames = min(att.frames, job.content_frames) // 2
            probs = torch.softmax(logits[len(sot) : len(sot) + len(hyp.tokens), : tok.eot], -1)
            rows = torch.arange(len(hyp.tokens), device=probs.device)
            text_probs = probs[rows, torch.tensor(hyp.tokens, device=probs.device)]
            w = torch.softmax(qk[:, :, :n_frames], dim=-1)
            std, mean = torch.std_mean(w, dim=-2, keepdim=True, correction=0)
            scaled = ((w - mean) / std).float().cpu().numpy()
            matrix = median_filter(scaled, width).mean(axis=0)[len(sot) : -1]
            text_idx, time_idx = dtw(-matrix)
            res = _Alignment(
                list(zip(text_idx.tolist(), time_idx.tolist(), strict=True)),
                text_probs.float().cpu().tolist(),
            )
            out[id(job)] = word_times(
                tok,
                hyp.tokens,
                res,
                offset_s=job.offset_s,
                limit_s=len(job.audio) / ASR_SAMPLE_RATE_HZ,
            )
        self.counters.align_s += time.perf_counter() - t0
        return out
