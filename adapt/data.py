"""Training data for ``voxgate adapt``: (audio, text) pairs in, validated, augmented and split.

Where pairs come from:

- :func:`load_pairs` reads the user's own recordings: a folder of ``name.wav`` + ``name.txt``
  files, or a ``.jsonl`` / ``.csv`` manifest whose rows name an audio file and its transcript.
- :func:`synthesize_phrases` turns domain phrases (:func:`read_phrases`) into speech with the
  bundled Piper voice, one rendering per variant with its own rate and expressiveness.
- :func:`phone_line` makes a clip sound as it does after a phone call: speed/pitch moved by up to
  10 %, a random level, 8 kHz band-limited to 300-3400 Hz, line noise at a random SNR, and a
  G.711 mu-law round trip through the same codec tables the gateway decodes calls with.

Every check runs here, before any training starts, and fails with :class:`AdaptDataError`
naming the file or the manifest line and saying what to do: a training run that dies an hour in
on clip 900 of 1000 wastes the hour, and a silently skipped clip changes what was trained on.
Messages never quote transcripts (they are the user's call content), only paths, line numbers
and measured figures.
"""

from __future__ import annotations

import csv
import json
import math
import wave
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import onnxruntime
import soxr

from voxgate.common.pcm import MULAW_DECODE, MULAW_ENCODE, float_to_pcm16, pcm16_to_float
from voxgate.engines.tts import SpeakOptions, TtsConfig, TtsInputError, VitsStreamer

__all__ = [
    "MAX_CLIP_S",
    "MAX_WORDS_PER_S",
    "MIN_CLIP_S",
    "MIN_SPLIT_PAIRS",
    "SAMPLE_RATE_HZ",
    "GENERAL_SENTENCES",
    "AdaptDataError",
    "Pair",
    "general_sentences",
    "load_pairs",
    "phone_line",
    "read_audio",
    "read_phrases",
    "split",
    "summarize",
    "synthesize_phrases",
]

F32 = npt.NDArray[np.float32]
_T = TypeVar("_T")

#: Whisper's input rate; every Pair's audio is at this rate.
SAMPLE_RATE_HZ = 16_000
#: Whisper's window: a longer clip cannot be trained on without cutting its transcript too,
#: which only the user can do correctly.
MAX_CLIP_S = 30.0
#: Shorter than this holds no word (and Whisper's policy skips it at serving time anyway).
MIN_CLIP_S = 0.2
#: A transcript with more words per second of audio than this cannot belong to the clip (fast
#: read English is about 3-4 words/s); it is most often the neighbouring file's transcript.
MAX_WORDS_PER_S = 7.0
#: Fewest pairs on each side of a held-out split: one held-out clip measures nothing.
MIN_SPLIT_PAIRS = 2
#: Below this rate there is no speech band left to learn from.
_MIN_RATE_HZ = 8_000
#: Peak under which a clip is taken as digital silence (about -80 dBFS).
_SILENT_PEAK = 1e-4
#: Audio formats a folder may hold that this reader does not decode: refused, not skipped.
_OTHER_AUDIO = (".mp3", ".flac", ".ogg", ".opus", ".m4a", ".aac", ".wma", ".aiff", ".au")
#: Longest phrase accepted from a phrase list (the TTS front end's own limit is larger).
_MAX_PHRASE_CHARS = 400
_CONVERT_HINT = "convert it to 16-bit PCM WAV (e.g. sox in.x -b 16 -c 1 out.wav)"


class AdaptDataError(ValueError):
    """Training data that cannot be used; the message names the file or line and the fix."""


@dataclass(frozen=True)
class Pair:
    """One training or evaluation example.

    Attributes:
        audio: 16 kHz mono float32 samples in [-1, 1].
        text: the transcript, whitespace-collapsed, otherwise as the user wrote it.
        origin: where it came from, for error messages and reports: ``"calls/a.wav"``,
            ``"manifest.jsonl:12"`` or ``"phrase:3#v2"`` (phrase 3, variant 2).
    """

    audio: F32
    text: str
    origin: str

    @property
    def duration_s(self) -> float:
        """Length of the audio in seconds."""
        return len(self.audio) / SAMPLE_RATE_HZ

    @property
    def group(self) -> str:
        """What must not be split across train and held-out: variants of one phrase."""
        return self.origin.split("#", 1)[0]


# -- reading ------------------------------------------------------------------------------------


def _pcm_to_float(raw: bytes, width: int) -> F32:
    """Integer PCM of any WAV sample width to float32 in [-1, 1]."""
    if width == 1:  # 8-bit WAV is unsigned, centred on 128
        return ((np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0).astype(
            np.float32
        )
    if width == 2:
        return pcm16_to_float(np.frombuffer(raw, dtype="<i2"))
    if width == 3:  # 24-bit: widen each little-endian triple to int32
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        return (v / float(1 << 23)).astype(np.float32)
    if width == 4:
        return (np.frombuffer(raw, dtype="<i4") / float(1 << 31)).astype(np.float32)
    raise AdaptDataError(f"{width * 8}-bit samples are not a PCM WAV width")


def read_audio(path: Path, origin: str | None = None) -> F32:
    """Read a WAV file as 16 kHz mono float32, or explain why it cannot be used.

    8-, 16-, 24- and 32-bit integer PCM at any rate from 8 kHz up are accepted; several
    channels are averaged to one (as ffmpeg's ``-ac 1`` does for Whisper); other rates are
    resampled with soxr. Compressed formats, float WAV and G.711 WAV are refused with the
    command that converts them, rather than decoded by a second, less tested path.

    Args:
        path: the WAV file.
        origin: how to name it in errors (default: the path).

    Raises:
        AdaptDataError: missing, unreadable, not PCM WAV, too low a rate, silent, too short, or
            longer than :data:`MAX_CLIP_S`.
    """
    where = origin or str(path)
    if not path.is_file():
        raise AdaptDataError(f"{where}: audio file not found: {path}")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, n = (
                w.getnchannels(),
                w.getsampwidth(),
                w.getframerate(),
                w.getnframes(),
            )
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise AdaptDataError(f"{where}: not a readable PCM WAV file ({e}); {_CONVERT_HINT}") from e
    except OSError as e:
        raise AdaptDataError(f"{where}: cannot read {path}: {e.strerror or e}") from e
    if rate < _MIN_RATE_HZ:
        raise AdaptDataError(
            f"{where}: sample rate {rate} Hz is below {_MIN_RATE_HZ} Hz; record at 8 kHz or more"
        )
    try:
        samples = _pcm_to_float(raw[: len(raw) - len(raw) % (width * channels)], width)
    except AdaptDataError as e:
        raise AdaptDataError(f"{where}: {e}; {_CONVERT_HINT}") from e
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    duration = len(samples) / rate
    if duration > MAX_CLIP_S:
        raise AdaptDataError(
            f"{where}: {duration:.1f} s is longer than Whisper's {MAX_CLIP_S:.0f} s window; "
            "cut it into clips under 30 s, each with its own part of the transcript"
        )
    if duration < MIN_CLIP_S:
        raise AdaptDataError(
            f"{where}: {duration * 1000:.0f} ms of audio is too short to hold speech "
            f"(at least {MIN_CLIP_S * 1000:.0f} ms)"
        )
    if float(np.max(np.abs(samples))) < _SILENT_PEAK:
        raise AdaptDataError(f"{where}: the audio is silent (peak under -80 dBFS)")
    if rate != SAMPLE_RATE_HZ:
        samples = soxr.resample(samples, rate, SAMPLE_RATE_HZ, quality="VHQ").astype(np.float32)
    return np.clip(samples, -1.0, 1.0).astype(np.float32)


def _clean_text(text: Any, where: str, audio: F32) -> str:
    """Validate one transcript against its audio; the collapsed text."""
    if not isinstance(text, str):
        raise AdaptDataError(f"{where}: the transcript must be a string, not {type(text).__name__}")
    clean = " ".join(text.split())
    if not any(ch.isalnum() for ch in clean):
        raise AdaptDataError(f"{where}: the transcript is empty; write what is said in the clip")
    words = len(clean.split())
    seconds = len(audio) / SAMPLE_RATE_HZ
    if words > MAX_WORDS_PER_S * seconds + 2:
        raise AdaptDataError(
            f"{where}: the transcript has {words} words for {seconds:.1f} s of audio (over "
            f"{MAX_WORDS_PER_S:.0f} words per second): check that it belongs to this clip"
        )
    return clean


def _read_text_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise AdaptDataError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from e
    except OSError as e:
        raise AdaptDataError(f"{path}: cannot read: {e.strerror or e}") from e


def _folder_files(folder: Path) -> list[Path]:
    """Every file under ``folder``, sorted; names starting with "." (and their contents) skipped."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def _from_folder(folder: Path) -> list[Pair]:
    files = _folder_files(folder)
    wavs = {p.with_suffix(""): p for p in files if p.suffix.lower() == ".wav"}
    texts = {p.with_suffix(""): p for p in files if p.suffix.lower() == ".txt"}
    for p in files:
        if p.suffix.lower() in _OTHER_AUDIO:
            raise AdaptDataError(f"{p}: only WAV audio is read; {_CONVERT_HINT}")
    for stem, txt in texts.items():
        if stem not in wavs:
            raise AdaptDataError(
                f"{txt}: a transcript without audio (no {stem.name}.wav beside it)"
            )
    pairs = []
    for stem, wav in sorted(wavs.items()):
        if stem not in texts:
            raise AdaptDataError(
                f"{wav}: audio without a transcript: write what is said in {stem.name}.txt "
                "beside it"
            )
        where = str(wav.relative_to(folder))
        audio = read_audio(wav, str(wav))
        text = _clean_text(_read_text_file(texts[stem]), str(texts[stem]), audio)
        pairs.append(Pair(audio, text, where))
    return pairs


def _row_audio(row: dict[str, Any], base: Path, where: str) -> F32:
    audio_field = next((k for k in ("audio", "file", "audio_filepath") if k in row), None)
    if audio_field is None:
        raise AdaptDataError(f"{where}: missing field 'audio' (the path of the clip)")
    name = row[audio_field]
    if not isinstance(name, str) or not name.strip():
        raise AdaptDataError(f"{where}: field '{audio_field}' must be a non-empty path")
    path = Path(name)
    return read_audio(path if path.is_absolute() else base / path, f"{where}: {name}")


def _row_pair(row: dict[str, Any], base: Path, where: str) -> Pair:
    if "text" not in row:
        raise AdaptDataError(f"{where}: missing field 'text' (the transcript)")
    audio = _row_audio(row, base, where)
    return Pair(audio, _clean_text(row["text"], where, audio), where)


def _jsonl_rows(manifest: Path) -> Iterator[tuple[dict[str, Any], str]]:
    for lineno, line in enumerate(_read_text_file(manifest).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{manifest.name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise AdaptDataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(row, dict):
            raise AdaptDataError(f'{where}: expected an object {{"audio": ..., "text": ...}}')
        yield row, where


def load_recordings(source: Path) -> list[tuple[F32, str]]:
    """Read untranscribed recordings: (audio, origin) for ``--replay-audio``.

    The same sources as :func:`load_pairs` (a folder of ``.wav`` files, or a ``.jsonl`` / ``.csv``
    manifest's audio column) and the same checks on every clip, but no transcript is needed
    (one that is there is not read): the base model writes the text these clips are held to.

    Raises:
        AdaptDataError: at the first unusable file or line, naming it.
    """

    def folder(path: Path) -> list[tuple[F32, str]]:
        wavs = [p for p in _folder_files(path) if p.suffix.lower() == ".wav"]
        return [(read_audio(p, str(p)), str(p.relative_to(path))) for p in wavs]

    return _read_source(
        source,
        folder=folder,
        row=lambda r, base, where: (_row_audio(r, base, where), where),
        text_column="",
        folder_kind="a folder of .wav files",
        nothing=".wav recordings",
    )


def _read_source(
    source: Path,
    *,
    folder: Callable[[Path], list[_T]],
    row: Callable[[dict[str, Any], Path, str], _T],
    text_column: str,
    folder_kind: str,
    nothing: str,
) -> list[_T]:
    """A folder, a ``.jsonl`` or a ``.csv`` manifest, read item by item (paths relative to it)."""
    if source.is_dir():
        items = folder(source)
    elif not source.exists():
        raise AdaptDataError(f"{source}: no such file or folder")
    elif source.suffix.lower() == ".jsonl":
        items = [row(r, source.parent, where) for r, where in _jsonl_rows(source)]
    elif source.suffix.lower() == ".csv":
        items = [row(r, source.parent, where) for r, where in _csv_rows(source, text_column)]
    else:
        raise AdaptDataError(f"{source}: expected {folder_kind} or a .jsonl or .csv manifest")
    if not items:
        raise AdaptDataError(f"{source}: holds no {nothing}")
    return items


def _csv_rows(manifest: Path, text_column: str) -> Iterator[tuple[dict[str, Any], str]]:
    reader = csv.DictReader(_read_text_file(manifest).splitlines())
    fields = set(reader.fieldnames or ())
    has_audio = bool(fields & {"audio", "file", "audio_filepath"})
    if not has_audio or (text_column and text_column not in fields):
        need = f"an 'audio' and a '{text_column}' column" if text_column else "an 'audio' column"
        raise AdaptDataError(
            f"{manifest.name}:1: the header must name {need} "
            f"(found {', '.join(sorted(fields)) or 'none'})"
        )
    for row in reader:
        where = f"{manifest.name}:{reader.line_num}"
        if None in row or any(v is None for v in row.values()):
            raise AdaptDataError(f"{where}: expected {len(fields)} columns as in the header")
        yield dict(row), where


def load_pairs(source: Path) -> list[Pair]:
    """Read (audio, transcript) pairs from a folder or a manifest, checking every one.

    Args:
        source: a folder of ``x.wav`` + ``x.txt`` (searched recursively; names starting with
            "." ignored), a ``.jsonl`` manifest (one ``{"audio": path, "text": ...}`` object per
            line; ``file`` or ``audio_filepath`` may stand for ``audio``) or a ``.csv`` with an
            ``audio`` and a ``text`` column. Paths in a manifest are relative to it.

    Returns:
        The pairs in folder or manifest order.

    Raises:
        AdaptDataError: at the first unusable file or line, naming it (see :func:`read_audio`).
    """
    return _read_source(
        source,
        folder=_from_folder,
        row=_row_pair,
        text_column="text",
        folder_kind="a folder of .wav + .txt files",
        nothing="(audio, transcript) pairs",
    )


def read_phrases(path: Path) -> list[str]:
    """Read a domain phrase list: one phrase per line; blank lines and ``#`` lines ignored.

    Raises:
        AdaptDataError: unreadable, a line too long or with nothing to say, or no phrases.
    """
    if not path.is_file():
        raise AdaptDataError(f"{path}: phrase file not found")
    phrases = []
    for lineno, line in enumerate(_read_text_file(path).splitlines(), start=1):
        text = " ".join(line.split())
        if not text or text.startswith("#"):
            continue
        if len(text) > _MAX_PHRASE_CHARS:
            raise AdaptDataError(
                f"{path.name}:{lineno}: {len(text)} characters is over {_MAX_PHRASE_CHARS}; "
                "split it into shorter phrases, one per line"
            )
        if not any(ch.isalpha() for ch in text):
            raise AdaptDataError(f"{path.name}:{lineno}: the phrase has no words to speak")
        phrases.append(text)
    if not phrases:
        raise AdaptDataError(f"{path}: holds no phrases (one per line; '#' starts a comment)")
    return phrases


#: General English sentences written for the replay set (``adapt/general_en.txt``).
GENERAL_SENTENCES = Path(__file__).with_name("general_en.txt")


def general_sentences(count: int, *, seed: int) -> list[str]:
    """``count`` of the bundled general sentences, for the replay set (see :mod:`.train`).

    A seeded choice, not the first ones, so a smaller replay set still spans the kinds of
    sentence (narrative, service calls, instructions) the file mixes. Speak them with
    :func:`synthesize_phrases` (``label="general"``) like the domain's phrases: the same voice,
    variation and phone-line share, so that only what is said tells the two sets apart and the
    training cannot learn "this voice means the domain's words".

    Raises:
        AdaptDataError: ``count`` beyond the bundled sentences (they are not repeated).
    """
    sentences = read_phrases(GENERAL_SENTENCES)
    if not 1 <= count <= len(sentences):
        raise AdaptDataError(
            f"--replay {count}: choose 1..{len(sentences)} general sentences (0 turns replay off)"
        )
    order = np.random.default_rng([seed, 7]).permutation(len(sentences))[:count]
    return [sentences[int(i)] for i in sorted(order)]


# -- augmentation -------------------------------------------------------------------------------


def _band_limit(x: F32, rate: int, low_hz: float, high_hz: float, edge_hz: float) -> F32:
    """Zero-phase band-pass by FFT with raised-cosine edges (whole clip: offline, no state)."""
    n = len(x)
    if n == 0:
        return x
    size = 1 << max(1, math.ceil(math.log2(n)))
    spec = np.fft.rfft(x, size)
    f = np.fft.rfftfreq(size, 1.0 / rate)
    gain = np.ones_like(f)
    lo = np.clip((f - (low_hz - edge_hz)) / edge_hz, 0.0, 1.0)
    hi = np.clip(((high_hz + edge_hz) - f) / edge_hz, 0.0, 1.0)
    gain *= 0.5 - 0.5 * np.cos(np.pi * lo)
    gain *= 0.5 - 0.5 * np.cos(np.pi * hi)
    return np.fft.irfft(spec * gain, size)[:n].astype(np.float32)


def _active_rms(x: F32, rate: int) -> float:
    """RMS over the loudest half of 20 ms frames: the speech level, not the pauses'."""
    hop = rate // 50
    n = len(x) // hop
    if n == 0:
        return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0
    e = np.mean(x[: n * hop].reshape(n, hop).astype(np.float64) ** 2, axis=1)
    top = np.sort(e)[n // 2 :]
    return float(np.sqrt(np.mean(top)))


def phone_line(
    audio: F32,
    rng: np.random.Generator,
    *,
    speed: tuple[float, float] = (0.9, 1.1),
    snr_db: tuple[float, float] = (12.0, 35.0),
    level_dbfs: tuple[float, float] = (-32.0, -16.0),
) -> F32:
    """Make a 16 kHz clip sound as it does at the far end of a phone call.

    In order: speed and pitch moved together by a factor drawn from ``speed`` (resampling, as
    Kaldi's speed perturbation); the speech level set to a value drawn from ``level_dbfs``;
    down to 8 kHz; white line noise at an SNR drawn from ``snr_db``; band-limited to 300-3400 Hz
    (the G.712 channel); G.711 mu-law encoded and decoded with ``voxgate.common.pcm``'s tables (the
    gateway's own codec); back up to 16 kHz as the gateway's edge does. The result depends only
    on the audio and the generator's state, so a seeded generator reproduces it exactly.

    Args:
        audio: 16 kHz mono float32.
        rng: the source of every random choice.
        speed: range of the speed/pitch factor (>1 is faster and higher).
        snr_db: range of the speech-to-noise ratio.
        level_dbfs: range of the speech level before the codec.

    Returns:
        16 kHz mono float32 in [-1, 1]; its length is the input's divided by the speed factor.
    """
    factor = float(rng.uniform(*speed))
    x = np.asarray(audio, dtype=np.float32)
    # Reading 16 kHz samples as if taken at 16 kHz * factor plays them `factor` times faster.
    x = soxr.resample(x, SAMPLE_RATE_HZ * factor, SAMPLE_RATE_HZ).astype(np.float32)
    rms = _active_rms(x, SAMPLE_RATE_HZ)
    if rms > 0.0:
        x = x * np.float32(10.0 ** (float(rng.uniform(*level_dbfs)) / 20.0) / rms)
    low = soxr.resample(x, SAMPLE_RATE_HZ, 8000).astype(np.float32)
    speech_rms = _active_rms(low, 8000)
    noise = rng.standard_normal(len(low)).astype(np.float32)
    noise *= np.float32(speech_rms / 10.0 ** (float(rng.uniform(*snr_db)) / 20.0))
    line = _band_limit(low + noise, 8000, 300.0, 3400.0, 100.0)
    pcm = float_to_pcm16(np.clip(line, -1.0, 1.0).astype(np.float32))
    codes = MULAW_ENCODE[pcm.astype(np.int64) + 32768]  # the table is indexed by pcm + 32768
    decoded = pcm16_to_float(MULAW_DECODE[codes])
    up = soxr.resample(decoded, 8000, SAMPLE_RATE_HZ).astype(np.float32)
    out: F32 = np.clip(up, -1.0, 1.0).astype(np.float32)
    return out


def synthesize_phrases(
    phrases: Sequence[str],
    *,
    variants: int,
    seed: int,
    phone_share: float = 0.75,
    label: str = "phrase",
) -> list[Pair]:
    """Speak each phrase ``variants`` times with the bundled Piper voice, as training audio.

    Each variant draws its own rate (``length_scale`` 0.85-1.2), expressiveness (``noise_scale``
    0.4-0.8, ``noise_w`` 0.5-1.0) and 0.1-0.5 s of silence either side (the segmenter's pre-roll
    and hangover); a ``phone_share`` of the variants then goes through :func:`phone_line`, since
    calls reach the gateway through phone codecs. Everything is fixed by ``seed``: the option
    draws, the augmentation and the voice's own sampling noise (ONNX Runtime's random nodes seed
    their generators from the process-wide seed when the voice is loaded, and that seed
    otherwise comes from the clock), so two runs with one seed train on bit-identical audio and
    differ only where they should.

    Args:
        phrases: the phrases (e.g. from :func:`read_phrases`).
        variants: renderings per phrase (>= 1).
        seed: seeds every random choice.
        phone_share: fraction of variants given the phone-line treatment.
        label: the origins' prefix (``"general"`` for :func:`general_pairs`).

    Returns:
        ``len(phrases) * variants`` pairs with origins ``"<label>:<n>#v<k>"`` (1-based n).

    Raises:
        AdaptDataError: a phrase the voice refuses (named by its number), or ``variants`` < 1.
    """
    if variants < 1:
        raise AdaptDataError(f"variants={variants}: need at least one rendering per phrase")
    # Before the load: the voice's random nodes take the process-wide seed when they are built.
    onnxruntime.set_seed(seed)
    streamer = VitsStreamer.load(TtsConfig())
    try:
        rate = streamer.sample_rate_hz
        pairs = []
        for i, phrase in enumerate(phrases, start=1):
            for v in range(variants):
                rng = np.random.default_rng([seed, i, v])
                options = SpeakOptions(
                    length_scale=float(rng.uniform(0.85, 1.2)),
                    noise_scale=float(rng.uniform(0.4, 0.8)),
                    noise_w=float(rng.uniform(0.5, 1.0)),
                )
                try:
                    chunk = streamer.synthesize_oneshot(phrase, options)
                except TtsInputError as e:
                    raise AdaptDataError(f"{label} {i}: the voice refuses it ({e})") from e
                speech = soxr.resample(chunk.samples, rate, SAMPLE_RATE_HZ).astype(np.float32)
                lead, tail = (
                    np.zeros(int(rng.uniform(0.1, 0.5) * SAMPLE_RATE_HZ), np.float32)
                    for _ in range(2)
                )
                audio = np.concatenate([lead, speech, tail])
                if rng.uniform() < phone_share:
                    audio = phone_line(audio, rng)
                if len(audio) / SAMPLE_RATE_HZ > MAX_CLIP_S:
                    raise AdaptDataError(
                        f"{label} {i}: spoken it lasts {len(audio) / SAMPLE_RATE_HZ:.1f} s, over "
                        f"the {MAX_CLIP_S:.0f} s window; split it"
                    )
                pairs.append(Pair(audio.astype(np.float32), phrase, f"{label}:{i}#v{v + 1}"))
        return pairs
    finally:
        streamer.close()


# -- held-out split -----------------------------------------------------------------------------


def split(pairs: Sequence[Pair], *, held_out: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """Split pairs into training and held-out sets, keeping a phrase's variants together.

    Variants of one phrase share their words, so splitting them across the sets would measure
    memorisation, not adaptation: the unit of the split is :attr:`Pair.group`.

    Args:
        pairs: all the pairs.
        held_out: fraction of groups to hold out, in [0, 0.5]; 0 holds nothing out.
        seed: seeds the shuffle.

    Returns:
        ``(train, held)`` with every pair in exactly one, each in the input order.

    Raises:
        AdaptDataError: ``held_out`` out of range, or too few pairs for either side to have
            :data:`MIN_SPLIT_PAIRS`.
    """
    if not 0.0 <= held_out <= 0.5:
        raise AdaptDataError(f"held-out fraction {held_out} must be within 0..0.5")
    if held_out == 0.0:
        return list(pairs), []
    groups = sorted({p.group for p in pairs})
    order = np.random.default_rng(seed).permutation(len(groups))
    n_held = min(len(groups) - 1, max(1, round(len(groups) * held_out)))
    held_groups = {groups[int(k)] for k in order[:n_held]}
    train = [p for p in pairs if p.group not in held_groups]
    held = [p for p in pairs if p.group in held_groups]
    if len(train) < MIN_SPLIT_PAIRS or len(held) < MIN_SPLIT_PAIRS:
        raise AdaptDataError(
            f"{len(pairs)} pairs ({len(groups)} distinct clips or phrases) are too few for a "
            f"{held_out:.0%} held-out split: each side needs at least {MIN_SPLIT_PAIRS} pairs "
            f"(got {len(train)} to train, {len(held)} held out); add data, raise the held-out "
            "fraction, or hold out nothing (held-out 0: no held-out scores in the report)"
        )
    return train, held


def summarize(pairs: Iterable[Pair]) -> dict[str, Any]:
    """Counts for ``voxgate-model.json`` and the report: pairs, seconds, words, sources."""
    items = list(pairs)
    return {
        "pairs": len(items),
        "audio_s": round(sum(p.duration_s for p in items), 1),
        "words": sum(len(p.text.split()) for p in items),
        "synthesized": sum(p.origin.startswith("phrase:") for p in items),
        "recorded": sum(not p.origin.startswith("phrase:") for p in items),
    }
