"""The PyTorch decoder's tokens equal CTranslate2 float32 ``generate`` on all 40 shared clips.

The torch side runs its own encoder on the clip's features and decodes in
:class:`TorchDecodeLoop` with Whisper's own rules only (suppress list, suppress blank), float32;
CTranslate2 encodes the same features and runs ``generate``. Greedy: all 40 clips share one
loop (rows of different encoder lengths in one step); beam 5: eight clips per loop (each clip
holds five rows of a 1,500-frame cross cache, float32 on CPU). Each clip is encoded on the
window the CPU engine would choose for it (the smallest of 10/15/20/30 s leaving 2 s after the
speech, ``EncoderWindowConfig``'s defaults), which is also what keeps this module to about two
minutes on two cores. The model is loaded once for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import read_wav_int16
from voxgate.engines.asr._decode import DecodeItem
from voxgate.engines.asr._model_files import resolve_model_dir
from voxgate.engines.asr._processors import SuppressBlank, SuppressTokens
from voxgate.engines.asr._torch.loop import TorchDecodeLoop
from voxgate.engines.asr._torch.model import WhisperTorchModel
from voxgate.engines.asr._torch.weights import load_tensors
from voxgate.engines.asr._whisper import WhisperEngine

pytestmark = pytest.mark.model

#: Encoder windows (mel frames) the CPU engine picks from, and the margin it leaves.
WINDOWS = (1000, 1500, 2000, 3000)
MARGIN_FRAMES = 200


@dataclass
class Clip:
    name: str
    ct2: Any  # CTranslate2 encoder output (StorageView)
    memory: torch.Tensor  # the torch encoder's output


class Setup:
    def __init__(self) -> None:
        torch.set_num_threads(2)
        self.engine = WhisperEngine.load({"compute_type": "float32", "intra_threads": 2})
        self.engine._calibrate_max_length()
        model_dir = resolve_model_dir("base", None)
        self.cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        self.model = WhisperTorchModel(load_tensors(model_dir), "cpu", torch.float32, 8)
        self.tok = self.engine._tokenizer("en", "transcribe")
        self.prompt = [*self.tok.sot_sequence, self.tok.no_timestamps]
        self.suppress = self.engine._suppress_tokens(self.tok)
        ids: list[int] = []
        for t in self.suppress:
            ids.extend(self.cfg["suppress_ids"] if t == -1 else [t])
        self.ids = ids

    def loop(self) -> TorchDecodeLoop:
        t = self.tok
        return TorchDecodeLoop(
            self.model, sot=t.sot, eot=t.eot, no_timestamps=t.no_timestamps, no_speech=t.no_speech
        )

    def item(self, memory: torch.Tensor, beam: int) -> DecodeItem:
        procs = [SuppressTokens.of(self.ids), SuppressBlank(tuple(self.cfg["suppress_ids_begin"]))]
        return DecodeItem(memory, self.prompt, max_length=224, beam_size=beam, processors=procs)  # type: ignore[arg-type]

    def generate(self, clips: list[Clip], beam: int) -> list[Any]:
        max_len = self.engine.max_length(len(self.prompt), 224)
        out = []
        for c in clips:  # one at a time: a batch would pad the shorter windows
            out += self.engine._model.generate(
                c.ct2,
                [self.prompt],
                beam_size=beam,
                max_length=max_len,
                suppress_blank=True,
                suppress_tokens=self.suppress,
                return_scores=True,
                return_no_speech_prob=True,
            )
        return out


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    s = Setup()
    yield s
    s.engine.close()


@pytest.fixture(scope="module")
def clips(setup: Setup, manifest: list[dict[str, Any]], speech_dir: Path) -> list[Clip]:
    out = []
    for row in manifest:
        pcm, _ = read_wav_int16(speech_dir / row["file"])
        audio = pcm.astype(np.float32) / 32768.0
        need = len(audio) // 160 + MARGIN_FRAMES
        frames = next(w for w in WINDOWS if w >= min(need, WINDOWS[-1]))
        feat = setup.engine._feature(audio, frames)
        ct2 = setup.engine._model.encode(setup.engine._storage([feat]))
        memory = setup.model.encode(torch.from_numpy(feat)[None])[0]
        out.append(Clip(row["file"], ct2, memory))
    assert len(out) == 40
    return out


def check(setup: Setup, clips: list[Clip], got: list[Any], beam: int) -> None:
    refs = setup.generate(clips, beam)
    same = [
        c.name
        for c, g, r in zip(clips, got, refs, strict=True)
        if g.sequences_ids[0] == r.sequences_ids[0]
    ]
    assert len(same) == len(clips), (
        f"tokens differ on {sorted({c.name for c in clips} - set(same))}"
    )
    for g, r in zip(got, refs, strict=True):
        assert g.scores[0] == pytest.approx(r.scores[0], abs=2e-3)
        assert g.no_speech_prob == pytest.approx(r.no_speech_prob, abs=1e-3)


def test_greedy_tokens_equal_generate_on_40_clips(setup: Setup, clips: list[Clip]) -> None:
    got = setup.loop().run([setup.item(c.memory, 1) for c in clips])
    check(setup, clips, got, 1)


def test_beam5_tokens_equal_generate_on_40_clips(setup: Setup, clips: list[Clip]) -> None:
    got = []
    for i in range(0, len(clips), 8):
        got += setup.loop().run([setup.item(c.memory, 5) for c in clips[i : i + 8]])
    check(setup, clips, got, 5)
