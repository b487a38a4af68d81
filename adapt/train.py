"""LoRA fine-tuning of the served Whisper model, on encoder windows as the gateway pads them.

What is trained: low-rank adapters (peft) on the attention ``q_proj`` and ``v_proj`` of the
Whisper model read back from its CTranslate2 file (:mod:`voxgate.adapt.convert`): rank 8-16, alpha
32, dropout 0.05, the base frozen. ``decoder_only`` puts the adapters on the decoder alone and
computes each clip's encoder output once, up front: the step then costs the decoder only
(measured 0.24 s/step against 1.77 s with 30 s windows on 2 threads), which is the right trade
when the domain is vocabulary (names, jargon) rather than acoustics. ``qlora`` holds the frozen
base in 4 bits (bitsandbytes NF4) so a large model fits a small GPU; bitsandbytes also has 4-bit
kernels for the CPU (0.50 measured), so the same path runs, slower, where no GPU is, and that
is how the tests prove it.

Windows as served: the gateway does not encode 30 s for every utterance; it pads each one to the
smallest bucket of :class:`voxgate.engines.asr.config.EncoderWindowConfig` that leaves the margin
after the speech (10/15/20/30 s by default). A model trained only on 30 s windows is then served on
inputs it never saw in training, so ``windows="served"`` (the default) pads every clip exactly as
``voxgate.engines.asr._policy.choose_encoder_frames`` does, with the same mel features the engine
computes; ``"full"`` is Whisper's 30 s, and ``"utterance"`` pads to the clip plus 0.5 s rounded
up to a whole second (the audio-context fine-tuning experiment). transformers' encoder insists
on 3000 frames, so the encoder forward here is the same computation with the position table cut
to the window, as CTranslate2 does for a shorter input.

Replay (keeping the base's general speech): phrases of one domain spoken by one voice teach the
decoder that domain's words, and with nothing else it also unlearns its prior over ordinary
English (measured: general WER 3.4 -> 8.5 % on real speech after 150 steps). Examples marked
``replay`` (general sentences, :func:`voxgate.adapt.data.general_pairs`) are not fitted to their
text; each step adds, beside the domain batch's cross-entropy, ``replay_weight`` times the KL
divergence from the base model's next-token distribution (the adapters switched off: no second
model in memory) to the adapted one's on a replay batch, teacher-forced on the sentence. It pins
the decoder's behaviour on general speech to the base's rather than to a transcript, so what the
base already did well is kept; the domain batch alone moves the domain's words.

Focus on the terms (``focus="terms"``; ``voxgate adapt`` uses it whenever terms are given): a
domain phrase is mostly ordinary words around one or two terms ("I need a refill of my Xarelto
prescription."), and fitting all of it also fits the decoder to how one voice says ordinary
words. With the terms given, only the tokens that spell a term are fitted to the text; the other
words of the phrase are held to the base by the same KL as the replay (same weight); a phrase or
recording with no term in it is still fitted whole. Measured on the pharmacy example over three
seeds (docs/adapt.md), against fitting the whole text: term recall 65.2 % against 62.1 %,
held-out WER 17.3 % against 18.5 %, general-WER change +0.93 against +1.18 points (means; the
seeds spread widely on the 680 general words).

Long runs: a checkpoint (adapter weights, optimiser state, losses) is written atomically every
``checkpoint_every`` steps and when SIGINT/SIGTERM arrives, after the step in flight; ``resume``
continues from it. Batches are drawn from a generator seeded with (seed, step), so a resumed run
sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from voxgate.adapt._offline import import_bitsandbytes
from voxgate.adapt.convert import BaseModel, hf_model
from voxgate.adapt.progress import Progress
from voxgate.engines.asr._policy import choose_encoder_frames
from voxgate.engines.asr.config import UTTERANCE_ENCODER_WINDOWS, EncoderWindowConfig

__all__ = [
    "Adapter",
    "Example",
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "UTTERANCE_WINDOWS",
    "TrainingInterrupted",
    "check_device",
    "make_examples",
    "merge",
    "train",
    "window_frames",
]

F32 = npt.NDArray[np.float32]
SAMPLE_RATE_HZ = 16_000
_SAMPLES_PER_FRAME = 160
FULL_FRAMES = 3000
#: ``windows="utterance"``: the serving policy with a bucket every second and a 0.5 s margin, so
#: a clip is encoded on its own length rounded up (clips of one length batch together), and a
#: model trained so is served with exactly this ``asr.encoder`` setting.
UTTERANCE_WINDOWS = UTTERANCE_ENCODER_WINDOWS
CHECKPOINT_NAME = "checkpoint.pt"
Windows = Literal["served", "full", "utterance"]


class TrainError(RuntimeError):
    """Training cannot start or go on as asked; the message says what to change."""


class TrainingInterrupted(Exception):  # noqa: N818 - a signal, not a failure
    """SIGINT/SIGTERM stopped training; a checkpoint at ``step`` was saved to ``checkpoint``."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(f"interrupted at step {step}; checkpoint saved in {checkpoint}")
        self.step = step
        self.checkpoint = checkpoint


@dataclass(frozen=True)
class TrainConfig:
    """How to train (validated by :meth:`check`)."""

    steps: int = 200
    rank: int = 8
    alpha: int = 32
    dropout: float = 0.05
    learning_rate: float = 1e-3
    batch_size: int = 4
    decoder_only: bool = False
    windows: Windows = "served"
    encoder: EncoderWindowConfig = field(default_factory=EncoderWindowConfig)
    checkpoint_every: int = 50
    seed: int = 0
    threads: int = 0
    qlora: bool = False
    language: str = "en"
    replay_weight: float = 6.0
    # "terms": on a domain example that contains a domain term, cross-entropy on the term's
    # tokens only and the rest of the sentence held to the base (KL, as replay); "text":
    # cross-entropy on the whole text.
    focus: Literal["text", "terms"] = "text"

    def check(self) -> None:
        """Raise :class:`TrainError` for a setting that cannot work."""
        if self.steps < 1:
            raise TrainError(f"--steps must be at least 1 (got {self.steps})")
        if not 1 <= self.rank <= 256:
            raise TrainError(f"--rank must be within 1..256 (got {self.rank}); 8-16 is typical")
        if self.batch_size < 1:
            raise TrainError(f"batch size must be at least 1 (got {self.batch_size})")
        if not 0.0 < self.learning_rate < 1.0:
            raise TrainError(f"learning rate must be within (0, 1) (got {self.learning_rate})")
        if self.checkpoint_every < 1:
            raise TrainError(
                f"checkpoint interval must be at least 1 (got {self.checkpoint_every})"
            )
        if not 0.0 <= self.replay_weight <= 100.0:
            raise TrainError(f"--replay-weight must be within 0..100 (got {self.replay_weight})")
        if self.focus not in ("text", "terms"):
            raise TrainError(f"--focus must be text or terms (got {self.focus!r})")
        if self.windows not in ("served", "full", "utterance"):
            raise TrainError(f"windows must be served, full or utterance (got {self.windows!r})")


@dataclass(frozen=True)
class Example:
    """One training item: mel features at its window and the decoder's token sequence."""

    features: F32  # (n_mels, frames)
    tokens: tuple[int, ...]  # prompt + text + <|endoftext|>
    prompt_len: int
    origin: str
    replay: bool = False  # general speech: held to the base's distribution, not to its text
    # Replay under other windows than served: the base's reference forward sees the clip as the
    # gateway serves the base (its own buckets), so what is kept is the base *as served*.
    teacher_features: F32 | None = None
    # Positions in ``tokens`` that spell a domain term (empty: none found, or no terms given);
    # with ``TrainConfig.focus == "terms"`` only these are fitted to the text.
    term_positions: tuple[int, ...] = ()
    # Replay from the user's own recordings (``--replay-audio``), held to the base's transcript:
    # drawn on alternate steps with the bundled sentences, however many there are of each.
    recorded: bool = False


@dataclass(frozen=True)
class Adapter:
    """One trained low-rank update: ``W += scaling * B @ A`` on the named weight."""

    weight: str  # transformers parameter name, e.g. model.decoder.layers.0.self_attn.q_proj.weight
    a: F32  # (rank, in)
    b: F32  # (out, rank)
    scaling: float


@dataclass
class TrainResult:
    """What a training run produced."""

    adapters: list[Adapter]
    losses: list[tuple[int, float]]
    steps: int
    seconds: float
    resumed_from: int
    trainable_parameters: int
    total_parameters: int
    device: str
    windows: dict[int, int]  # encoder frames -> number of examples
    # KL from the base on each step's replay batch (before that step's update); empty without
    # replay. It starts at 0 (the adapters start as a zero update) and stays small when the
    # replay holds general speech where the base had it.
    replay_kl: list[tuple[int, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures for ``voxgate-model.json`` and the report."""
        return {
            "steps": self.steps,
            "train_seconds": round(self.seconds, 1),
            "resumed_from": self.resumed_from,
            "trainable_parameters": self.trainable_parameters,
            "total_parameters": self.total_parameters,
            "device": self.device,
            "windows": {str(k): v for k, v in sorted(self.windows.items())},
            "replay_kl_last": round(self.replay_kl[-1][1], 5) if self.replay_kl else None,
        }


def window_frames(num_samples: int, windows: Windows, encoder: EncoderWindowConfig) -> int:
    """Mel frames the encoder sees for a clip of ``num_samples`` (16 kHz).

    ``served`` is exactly the gateway's bucket choice; ``utterance`` is the clip plus half a
    second, rounded up to a whole second (:data:`UTTERANCE_WINDOWS`).
    """
    content = num_samples // _SAMPLES_PER_FRAME
    if windows == "full":
        return FULL_FRAMES
    if windows == "served":
        return choose_encoder_frames(content, encoder)
    return choose_encoder_frames(content, UTTERANCE_WINDOWS)


class _Features:
    """Mel features exactly as ``voxgate.engines.asr._whisper.WhisperEngine`` computes them."""

    def __init__(self, n_mels: int) -> None:
        from faster_whisper.feature_extractor import FeatureExtractor

        self._fe = FeatureExtractor(feature_size=n_mels)

    def __call__(self, audio: F32, frames: int) -> F32:
        mel = self._fe(audio, padding=160)[:, :-1]
        mel = mel[:, :frames]
        if mel.shape[1] < frames:
            mel = np.pad(mel, ((0, 0), (0, frames - mel.shape[1])))
        return np.ascontiguousarray(mel, dtype=np.float32)


def make_examples(
    base: BaseModel,
    pairs: Sequence[Any],
    *,
    windows: Windows = "served",
    encoder: EncoderWindowConfig | None = None,
    language: str = "en",
    replay: bool = False,
    terms: Sequence[str] = (),
    recorded: bool = False,
) -> list[Example]:
    """Turn (audio, text) pairs into training examples with the served prompt.

    The decoder sees what the gateway feeds it for a call with no prompt: start of transcript,
    language, task, no timestamps, then the text and end of text; the loss covers the text and
    the end token only.

    Args:
        base: the model (its tokenizer and mel size are used).
        pairs: objects with ``audio`` (float32 16 kHz), ``text`` and ``origin``
            (:class:`voxgate.adapt.data.Pair`).
        windows: encoder window policy (see the module docstring).
        encoder: the serving bucket policy; None = its defaults.
        language: the language token of the prompt.
        replay: mark the examples as replay (see the module docstring); with ``windows``
            other than ``served`` they also carry the served window for the base's reference.
        terms: domain terms; the tokens that spell one (whole words, any case) are recorded in
            :attr:`Example.term_positions`.
        recorded: replay from the user's recordings (:attr:`Example.recorded`).
    """
    import tokenizers
    from faster_whisper.tokenizer import Tokenizer

    enc_cfg = encoder if encoder is not None else EncoderWindowConfig()
    hf_tok = tokenizers.Tokenizer.from_file(str(base.model_dir / "tokenizer.json"))
    multilingual = base.dims.vocab_size >= 51865
    tok = Tokenizer(hf_tok, multilingual, task="transcribe", language=language)
    prompt = [*tok.sot_sequence, tok.no_timestamps]
    feats = _Features(base.dims.num_mel_bins)
    out = []
    term_re = _term_pattern(terms)
    for p in pairs:
        text = " " + p.text.strip()
        encoding = hf_tok.encode(text, add_special_tokens=False)
        text_ids = encoding.ids  # what faster-whisper's Tokenizer.encode returns
        tokens = (*prompt, *text_ids, tok.eot)
        if len(tokens) > base.dims.max_target_positions:
            raise TrainError(
                f"{p.origin}: transcript is {len(text_ids)} tokens, more than the decoder's "
                f"{base.dims.max_target_positions}; split the clip"
            )
        frames = window_frames(len(p.audio), windows, enc_cfg)
        teacher = None
        if replay and windows != "served":
            teacher = feats(p.audio, window_frames(len(p.audio), "served", enc_cfg))
        found = () if term_re is None or replay else _spans(term_re, text, encoding.offsets)
        out.append(
            Example(
                feats(p.audio, frames),
                tokens,
                len(prompt),
                p.origin,
                replay,
                teacher,
                tuple(len(prompt) + i for i in found),
                replay and recorded,
            )
        )
    return out


def _term_pattern(terms: Sequence[str]) -> re.Pattern[str] | None:
    """One case-insensitive whole-word pattern for all terms, longest first."""
    words = sorted({t.strip() for t in terms if t.strip()}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, words)) + r")(?!\w)", re.I)


def _spans(pattern: re.Pattern[str], text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the tokens whose characters overlap a match of ``pattern`` in ``text``."""
    matches = [m.span() for m in pattern.finditer(text)]
    return [
        i
        for i, (a, b) in enumerate(offsets)
        if any(a < end and start < b for start, end in matches)
    ]


def _encoder_forward(model: Any, features: Any) -> Any:
    """Whisper's encoder on a window of any even length up to 3000 frames.

    The same operations as ``WhisperEncoder.forward`` with the position table cut to the
    window, which is what CTranslate2 does when it encodes a bucket shorter than 30 s.
    """
    import torch.nn.functional as fn

    enc = model.model.encoder
    x = fn.gelu(enc.conv1(features))
    x = fn.gelu(enc.conv2(x))
    x = x.permute(0, 2, 1)
    x = x + enc.embed_positions.weight[: x.shape[1]]
    for layer in enc.layers:
        x = layer(x, None)
    return enc.layer_norm(x)


def _fingerprint(cfg: TrainConfig, examples: Sequence[Example], base: BaseModel) -> str:
    """What a checkpoint belongs to: the settings that change training, the data, the base."""
    h = hashlib.sha256()
    keep = {
        k: v
        for k, v in asdict(cfg).items()
        if k not in ("steps", "checkpoint_every", "threads", "encoder")
    }
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    h.update(json.dumps(cfg.encoder.model_dump(), sort_keys=True).encode())
    h.update(str(base.dims).encode())
    for ex in examples:
        h.update(ex.features.tobytes())
        h.update(np.asarray(ex.tokens, dtype=np.int64).tobytes())
        h.update(b"a" if ex.recorded else b"r" if ex.replay else b"d")
        h.update(np.asarray(ex.term_positions, dtype=np.int64).tobytes())
        if ex.teacher_features is not None:
            h.update(ex.teacher_features.tobytes())
    return h.hexdigest()


def _lr(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over the first 10 % of steps (at most 20), then cosine decay to 10 %."""
    warm = max(1, min(20, cfg.steps // 10))
    if step <= warm:
        return cfg.learning_rate * step / warm
    t = (step - warm) / max(1, cfg.steps - warm)
    return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


def _atomic_save(obj: Any, path: Path) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def _stop_flag() -> Iterator[list[int]]:
    """SIGINT/SIGTERM set a flag the loop checks after each step (a second one is immediate).

    Only the main thread can install handlers; elsewhere (a test runner thread) the flag is
    simply never set by a signal.
    """
    flag: list[int] = []
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        flag.append(signum)
        for sig, old in previous.items():  # a second signal interrupts at once
            signal.signal(sig, old)

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:
        previous.clear()
    try:
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def check_device(cfg: TrainConfig) -> str:
    """The device training will run on ("cuda" when visible, else "cpu").

    Raises:
        TrainError: ``qlora`` where bitsandbytes is missing or has no 4-bit kernels for the
            device (checked before data is loaded).
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.qlora:
        why = _no_4bit(device)
        if why is not None:
            raise TrainError(f"--qlora holds the base in 4 bits with bitsandbytes, but {why}")
    return device


def _no_4bit(device: str) -> str | None:
    """Why bitsandbytes cannot run a 4-bit NF4 layer on ``device``; None when it can.

    Tried on a tiny layer rather than read from a version table: CPU kernels arrived in recent
    releases and depend on the build, and a failure here is one clear line before any data is
    loaded, instead of a crash deep in transformers after minutes of synthesis.
    """
    bnb = import_bitsandbytes()
    if bnb is None:
        return "bitsandbytes is not installed: pip install 'voxgate[qlora]'"
    import torch

    nn: Any = bnb.nn  # untyped where installed, absent (Any) where not: one spelling for both
    try:
        layer = nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4")
        layer = layer.to(device)
        out = layer(torch.ones(1, 64, dtype=torch.bfloat16, device=device))
        if out.shape != (1, 64) or not bool(torch.isfinite(out).all()):
            return f"bitsandbytes {bnb.__version__} gives no usable 4-bit output on {device}"
    except Exception as e:  # any failure of the probe means: no 4-bit kernels here
        return (
            f"bitsandbytes {bnb.__version__} has no 4-bit kernels for {device} "
            f"({type(e).__name__}); train without --qlora, or install a release that has them"
        )
    return None


def _qlora_model(base: BaseModel, work_dir: Path, device: str) -> Any:
    """The base model with its linear layers in 4-bit NF4 on ``device`` (bitsandbytes)."""
    import peft
    import torch
    import transformers

    # Progress on stderr is voxgate's own (bar or JSON lines); transformers' bars would break
    # the JSON lines a supervisor parses.
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_dir = work_dir / "hf-base"
    if not (hf_dir / "config.json").is_file():
        hf_model(base).save_pretrained(str(hf_dir))
    quant = transformers.BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        str(hf_dir),
        quantization_config=quant,
        device_map={"": 0 if device == "cuda" else "cpu"},
        # transformers swaps layers for model-hub kernels by default when ``kernels`` is
        # installed (a download at run time); the plain torch layers are what was measured.
        use_kernels=False,
    )
    return peft.prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
        model, use_gradient_checkpointing=False
    )


def _target_modules(decoder_only: bool) -> str:
    side = r"model\.decoder" if decoder_only else r"model\.(encoder|decoder)"
    return side + r"\.layers\.\d+\.(self_attn|encoder_attn)\.(q_proj|v_proj)"


class _Pool:
    """Examples grouped by encoder window, drawn a batch of one window at a time.

    A batch stacks encoder inputs, so it holds one window length (and one for the base's
    reference, when replay has its own, :attr:`Example.teacher_features`); the window is drawn in
    proportion to how many examples have it, so every example is equally likely overall.
    """

    def __init__(self, indices: list[int], examples: Sequence[Example]) -> None:
        self.indices = indices
        self.groups: dict[tuple[int, int], list[int]] = {}
        for i in indices:
            ex = examples[i]
            teacher = ex.teacher_features.shape[1] if ex.teacher_features is not None else 0
            self.groups.setdefault((ex.features.shape[1], teacher), []).append(i)
        self._keys = sorted(self.groups)
        w = np.array([len(self.groups[k]) for k in self._keys], dtype=np.float64)
        self._weights = w / w.sum() if len(w) else w

    def draw(self, rng: np.random.Generator, size: int) -> list[int]:
        pool = self.groups[self._keys[int(rng.choice(len(self._keys), p=self._weights))]]
        idx = rng.choice(len(pool), size=min(size, len(pool)), replace=False)
        return [pool[int(i)] for i in idx]


def _token_batch(
    examples: Sequence[Example], batch: Sequence[int], focus: str = "text"
) -> tuple[Any, Any, Any]:
    """Decoder inputs, labels and the positions held to the base, padded with EOT.

    Labels are -100 where nothing is fitted to the text: outside the text and end token, on a
    replay example, and with ``focus="terms"`` on the words around an example's terms. The
    held mask marks the text positions that are not fitted (replay, those words): there the
    loss is the KL divergence from the base instead.
    """
    import torch

    longest = max(len(examples[i].tokens) for i in batch)
    eot = examples[batch[0]].tokens[-1]
    ids = torch.full((len(batch), longest - 1), eot, dtype=torch.long)
    labels = torch.full((len(batch), longest - 1), -100, dtype=torch.long)
    held = torch.zeros((len(batch), longest - 1), dtype=torch.bool)
    for row, i in enumerate(batch):
        ex = examples[i]
        t = torch.tensor(ex.tokens, dtype=torch.long)
        ids[row, : len(t) - 1] = t[:-1]
        text = slice(ex.prompt_len - 1, len(t) - 1)  # column j predicts token j + 1
        if ex.replay:
            held[row, text] = True
        elif focus == "terms" and ex.term_positions:
            cols = [p - 1 for p in ex.term_positions]
            labels[row, cols] = t[list(ex.term_positions)]
            held[row, text] = True
            held[row, cols] = False
        else:
            labels[row, text] = t[ex.prompt_len :]
    return ids, labels, held


def train(
    base: BaseModel,
    examples: Sequence[Example],
    cfg: TrainConfig,
    work_dir: Path,
    *,
    resume: bool = False,
    progress: Progress | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train LoRA adapters on ``examples``; checkpoints go to ``work_dir``.

    Args:
        base: the model read back from CTranslate2.
        examples: from :func:`make_examples`.
        cfg: training settings.
        work_dir: where ``checkpoint.pt`` lives (created).
        resume: continue from ``work_dir/checkpoint.pt``; a checkpoint of other data or
            settings is refused rather than silently mixed in.
        progress: where to report; None = a default :class:`Progress` on stderr.
        on_step: called after every step with (step, loss) (tests use it to interrupt).

    Raises:
        TrainError: bad settings, no examples, a mismatched or missing checkpoint.
        TrainingInterrupted: SIGINT/SIGTERM; the checkpoint was saved first.
    """
    cfg.check()
    if not examples:
        raise TrainError("no training examples")
    import_bitsandbytes()  # before peft, which imports it (when installed) with the hub lookup
    import peft
    import torch

    prog = progress if progress is not None else Progress()
    device = check_device(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = work_dir / CHECKPOINT_NAME
    fingerprint = _fingerprint(cfg, examples, base)

    model = _qlora_model(base, work_dir, device) if cfg.qlora else hf_model(base).to(device)
    lora = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=_target_modules(cfg.decoder_only),
        bias="none",
    )
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5.24 a deprecated question (is_gradient_checkpointing).
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = peft.get_peft_model(model, lora)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in peft_model.parameters())
    optim = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=0.0)

    start, losses, replay_kl = 0, [], []
    if resume:
        if not ckpt_path.is_file():
            raise TrainError(f"--resume: no checkpoint in {work_dir}; run without --resume")
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        if state.get("fingerprint") != fingerprint:
            raise TrainError(
                f"--resume: the checkpoint in {work_dir} was made with other data or settings; "
                "rerun with the same ones, or without --resume (or with another --work-dir) "
                "to start over"
            )
        peft.set_peft_model_state_dict(peft_model, state["lora"])
        optim.load_state_dict(state["optim"])
        start, losses = int(state["step"]), [tuple(x) for x in state["losses"]]
        replay_kl = [tuple(x) for x in state.get("replay_kl", [])]
        prog.note(f"resumed from step {start}", step=start)
    elif ckpt_path.exists():
        ckpt_path.unlink()  # a fresh run never leaves an older run's checkpoint to resume

    def save(step: int) -> None:
        _atomic_save(
            {
                "step": step,
                "lora": peft.get_peft_model_state_dict(peft_model),
                "optim": optim.state_dict(),
                "losses": losses,
                "replay_kl": replay_kl,
                "fingerprint": fingerprint,
                "config": {k: str(v) for k, v in asdict(cfg).items()},
            },
            ckpt_path,
        )

    feats = [torch.from_numpy(ex.features) for ex in examples]
    cached: list[Any] | None = None
    if cfg.decoder_only:
        # Encoder frozen and without adapters: its output per clip never changes.
        prog.stage("encode", clips=len(examples))
        peft_model.eval()
        with torch.no_grad():
            cached = [
                _encoder_forward(model, f[None].to(device)).squeeze(0).float().cpu() for f in feats
            ]
    domain = _Pool([i for i, ex in enumerate(examples) if not ex.replay], examples)
    # The bundled sentences and the user's recordings take turns, step by step: a few
    # recordings beside 157 sentences would otherwise be drawn once in ten replay batches.
    replay_pools = [
        pool
        for pool in (
            _Pool([i for i, ex in enumerate(examples) if ex.replay and not ex.recorded], examples),
            _Pool([i for i, ex in enumerate(examples) if ex.recorded], examples),
        )
        if pool.groups
    ]
    if not domain.groups:
        raise TrainError("no training examples besides the replay set")
    use_replay = bool(replay_pools) and cfg.replay_weight > 0.0

    def encode(batch: list[int]) -> Any:
        if cached is not None:
            return torch.stack([cached[i] for i in batch]).to(device)
        return _encoder_forward(model, torch.stack([feats[i] for i in batch]).to(device))

    # The base's reference encoder output for replay with its own (served) windows: the base is
    # frozen, so once per clip.
    teacher_enc: dict[int, Any] = {}
    with torch.no_grad(), peft_model.disable_adapter():
        for i, ex in enumerate(examples):
            if ex.teacher_features is not None:
                tf = torch.from_numpy(ex.teacher_features)[None].to(device)
                teacher_enc[i] = _encoder_forward(model, tf).squeeze(0).float().cpu()

    def reference_encode(batch: list[int]) -> Any:
        if batch[0] in teacher_enc:
            return torch.stack([teacher_enc[i] for i in batch]).to(device)
        return encode(batch)

    def logits(ids: Any, enc: Any) -> Any:
        hidden = model.model.decoder(input_ids=ids, encoder_hidden_states=enc).last_hidden_state
        return model.proj_out(hidden).float()

    def held_kl(out: Any, ids: Any, batch: list[int], held: Any) -> Any:
        """KL(base || adapted) per held position; the base is this model with adapters off."""
        with torch.no_grad(), peft_model.disable_adapter():
            ref = torch.log_softmax(logits(ids, reference_encode(batch))[held], dim=-1)
        mine = torch.log_softmax(out[held], dim=-1)
        return torch.nn.functional.kl_div(mine, ref, log_target=True, reduction="batchmean")

    prog.stage(
        "train",
        steps=cfg.steps,
        examples=len(domain.indices),
        replay=sum(len(p.indices) for p in replay_pools) if use_replay else 0,
        device=device,
    )
    peft_model.train()
    t0 = time.monotonic()
    smooth = losses[-1][1] if losses else float("nan")
    step = start
    with _stop_flag() as stop:
        while step < cfg.steps:
            step += 1
            rng = np.random.default_rng([cfg.seed, step])
            torch.manual_seed(cfg.seed * 1_000_003 + step)  # LoRA dropout: same on resume
            batch = domain.draw(rng, cfg.batch_size)
            for g in optim.param_groups:
                g["lr"] = _lr(cfg, step)
            ids, labels, held = (x.to(device) for x in _token_batch(examples, batch, cfg.focus))
            out = logits(ids, encode(batch))
            loss = torch.nn.functional.cross_entropy(
                out.reshape(-1, out.shape[-1]), labels.reshape(-1), ignore_index=-100
            )
            value = float(loss.detach())  # the domain loss is what the curve shows
            if bool(held.any()):  # --focus terms: the words around the terms stay the base's
                loss = loss + cfg.replay_weight * held_kl(out, ids, batch, held)
            if use_replay:
                rbatch = replay_pools[step % len(replay_pools)].draw(rng, cfg.batch_size)
                rids, _, rheld = (x.to(device) for x in _token_batch(examples, rbatch))
                rout = logits(rids, encode(rbatch))
                kl = held_kl(rout, rids, rbatch, rheld)
                loss = loss + cfg.replay_weight * kl
                replay_kl.append((step, float(kl.detach())))
            optim.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optim.step()
            total = float(loss.detach())
            if not math.isfinite(total):
                raise TrainError(f"loss became {total} at step {step}; lower the learning rate")
            losses.append((step, value))
            smooth = value if not math.isfinite(smooth) else 0.9 * smooth + 0.1 * value
            prog.step(step, cfg.steps, smooth)
            if on_step is not None:
                on_step(step, value)
            if stop:
                save(step)
                raise TrainingInterrupted(step, ckpt_path)
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                save(step)
                prog.note(f"checkpoint at step {step}", step=step)
    save(step)
    seconds = time.monotonic() - t0
    adapters = _adapters(peft_model, cfg)
    return TrainResult(
        adapters=adapters,
        losses=list(losses),
        steps=step,
        seconds=seconds,
        resumed_from=start,
        trainable_parameters=n_trainable,
        total_parameters=n_total,
        device=device,
        windows=dict(Counter(examples[i].features.shape[1] for i in domain.indices)),
        replay_kl=list(replay_kl),
    )


def _adapters(peft_model: Any, cfg: TrainConfig) -> list[Adapter]:
    """The trained (A, B) pairs by the base weight they update."""
    out = []
    scaling = cfg.alpha / cfg.rank
    for name, module in peft_model.named_modules():
        if not hasattr(module, "lora_A") or "default" not in getattr(module, "lora_A", {}):
            continue
        a = module.lora_A["default"].weight.detach().float().cpu().numpy()
        b = module.lora_B["default"].weight.detach().float().cpu().numpy()
        weight = name.removeprefix("base_model.model.") + ".weight"
        out.append(Adapter(weight, a, b, scaling))
    if not out:
        raise TrainError("no LoRA layers were trained (no q_proj/v_proj found)")
    return out


def merge(state: dict[str, F32], adapters: Sequence[Adapter]) -> dict[str, F32]:
    """The base state with every adapter folded in: ``W + scaling * B @ A``, in float32 NumPy.

    Done in NumPy rather than with peft's ``merge_and_unload`` so that a QLoRA run merges into
    the full-precision base, not into its 4-bit copy, and so the result feeds
    :func:`voxgate.adapt.convert.write_ct2_dir` without torch.
    """
    out = dict(state)
    for ad in adapters:
        if ad.weight not in out:
            raise TrainError(f"adapter for unknown weight {ad.weight}")
        w = out[ad.weight]
        rank = ad.a.shape[0]
        if ad.a.shape != (rank, w.shape[1]) or ad.b.shape != (w.shape[0], rank):
            raise TrainError(
                f"adapter for {ad.weight} has shapes A {ad.a.shape}, B {ad.b.shape}; "
                f"the weight is {w.shape}"
            )
        delta = (ad.b.astype(np.float32) @ ad.a.astype(np.float32)) * np.float32(ad.scaling)
        out[ad.weight] = (w + delta).astype(np.float32)
    return out
