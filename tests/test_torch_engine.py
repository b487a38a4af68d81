"""The PyTorch engine on the bundled base model: joins, aborts, the engine contract, HF weights.

* A join mid-decode (and a slot reused after an abort) gives each item the tokens it gets
  alone; an item leaves on the step of its end of text.
* ``TorchWhisperEngine`` (chosen by ``asr.engine='torch'``) returns the CTranslate2 engine's
  results with every logits processor on (its NumPy loop in float32), words included, and
  joins utterances between its steps (``add`` / ``step``).
* A Hugging Face checkpoint and its CTranslate2 conversion load to the same tensors and
  decode to ``generate``'s tokens (a tiny random Whisper built by transformers).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import read_wav_int16
from voxgate.engines.asr import load_asr_engine
from voxgate.engines.asr._decode import DecodeItem
from voxgate.engines.asr._model_files import resolve_model_dir
from voxgate.engines.asr._processors import SuppressBlank, SuppressTokens
from voxgate.engines.asr._torch.engine import TorchWhisperEngine
from voxgate.engines.asr._torch.loop import TorchDecodeLoop
from voxgate.engines.asr._torch.model import WhisperTorchModel
from voxgate.engines.asr._torch.weights import load_tensors
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.asr.config import WhisperConfig
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

CLIPS = ("jfk_inaugural_1961.wav", "ljspeech_LJ001-0004.wav", "cmu_goforward.wav")
#: Every processor on: silence-aware end (timestamp rules), hallucination bias, a boost.
LOOP_CFG: dict[str, Any] = {
    "compute_type": "float32",
    "intra_threads": 1,
    "decode_loop": {"weights": "float32", "silence_end": True, "hallucination_bias": 4.0},
}


class Loops:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.ct2 = WhisperEngine.load({"compute_type": "float32", "intra_threads": 1})
        model_dir = resolve_model_dir("base", None)
        self.cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        self.model = WhisperTorchModel(load_tensors(model_dir), "cpu", torch.float32, 4)
        self.tok = self.ct2._tokenizer("en", "transcribe")
        self.prompt = [*self.tok.sot_sequence, self.tok.no_timestamps]
        ids: list[int] = []
        for t in self.ct2._suppress_tokens(self.tok):
            ids.extend(self.cfg["suppress_ids"] if t == -1 else [t])
        self.ids = ids

    def loop(self) -> TorchDecodeLoop:
        t = self.tok
        return TorchDecodeLoop(
            self.model, sot=t.sot, eot=t.eot, no_timestamps=t.no_timestamps, no_speech=t.no_speech
        )

    def item(self, memory: torch.Tensor, beam: int = 1) -> DecodeItem:
        procs = [SuppressTokens.of(self.ids), SuppressBlank(tuple(self.cfg["suppress_ids_begin"]))]
        return DecodeItem(memory, self.prompt, max_length=224, beam_size=beam, processors=procs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def audio(speech_dir: Path) -> list[np.ndarray]:
    out = []
    for name in CLIPS:
        pcm, _ = read_wav_int16(speech_dir / name)
        out.append(pcm.astype(np.float32) / 32768.0)
    return out


@pytest.fixture(scope="module")
def loops() -> Iterator[Loops]:
    s = Loops()
    yield s
    s.ct2.close()


@pytest.fixture(scope="module")
def memories(loops: Loops, audio: list[np.ndarray]) -> list[torch.Tensor]:
    return [
        loops.model.encode(torch.from_numpy(loops.ct2._feature(a, 1500))[None])[0] for a in audio
    ]


def tokens(item: DecodeItem) -> list[int]:
    assert item.result is not None
    return item.result.sequences_ids[0]


@pytest.mark.parametrize("beam", [1, 5])
def test_a_join_mid_decode_gives_each_item_its_tokens_alone(
    loops: Loops, memories: list[torch.Tensor], beam: int
) -> None:
    a, b, _ = memories
    alone = [tokens_of(loops, m, beam) for m in (a, b)]
    loop = loops.loop()
    first, second = loops.item(a, beam), loops.item(b, beam)
    loop.add(first)
    for _ in range(6):
        loop.step()
    loop.add(second)  # joins at step 7 of the first, at its own position 3
    assert loop.active == 2
    left_at: dict[int, int] = {}
    while loop.active:
        for it in loop.step():
            left_at[id(it)] = loop.steps
    assert tokens(first) == alone[0]
    assert tokens(second) == alone[1]
    if beam == 1:  # each left on the step of its <|endoftext|>, not when the batch ended
        assert left_at[id(first)] == len(alone[0]) + 1
        assert left_at[id(second)] == 6 + len(alone[1]) + 1


def tokens_of(loops: Loops, memory: torch.Tensor, beam: int) -> list[int]:
    return loops.loop().run([loops.item(memory, beam)])[0].sequences_ids[0]


def test_an_aborted_item_leaves_and_its_slot_serves_the_next(
    loops: Loops, memories: list[torch.Tensor]
) -> None:
    a, b, c = memories
    alone = [tokens_of(loops, m, 1) for m in (a, c)]
    loop = loops.loop()
    first, doomed, third = loops.item(a), loops.item(b), loops.item(c)
    loop.add(first)
    loop.add(doomed)
    for _ in range(4):
        loop.step()
    assert loop.abort(doomed) and not loop.abort(doomed)
    loop.add(third)  # takes the aborted item's slot, whose cache holds the old rows
    while loop.active:
        loop.step()
    assert doomed.result is None
    assert tokens(first) == alone[0] and tokens(third) == alone[1]


@pytest.fixture(scope="module")
def engines_pair() -> Iterator[tuple[WhisperEngine, WhisperEngine]]:
    ct2 = WhisperEngine.load(LOOP_CFG)
    ct2.warmup()
    tor = load_asr_engine(WhisperConfig.model_validate({**LOOP_CFG, "engine": "torch"}))
    tor.warmup()
    yield ct2, tor
    ct2.close()
    tor.close()


def requests(audio: list[np.ndarray]) -> list[AsrRequest]:
    opts = AsrOptions(hotwords=("voxgate^6", "Americans^3"))
    return [AsrRequest(a, stats_for(a), opts) for a in audio]


def same(a: AsrResult, b: AsrResult) -> None:
    assert (a.text, a.dropped_reason, a.fallbacks) == (b.text, b.dropped_reason, b.fallbacks)
    assert [(w.text, w.start_ms, w.end_ms) for w in a.words] == [
        (w.text, w.start_ms, w.end_ms) for w in b.words
    ]
    assert a.no_speech_prob == pytest.approx(b.no_speech_prob, abs=1e-3)
    assert a.avg_logprob == pytest.approx(b.avg_logprob, abs=2e-3)


def test_engine_equals_the_ctranslate2_engine_with_every_processor(
    engines_pair: tuple[WhisperEngine, WhisperEngine], audio: list[np.ndarray]
) -> None:
    ct2, tor = engines_pair
    assert isinstance(tor, TorchWhisperEngine) and tor.continuous
    reqs = requests(audio)
    want = ct2.infer_batch(reqs)
    assert all(r.text and r.words for r in want)
    for a, b in zip(want, tor.infer_batch(reqs), strict=True):
        same(a, b)


def test_engine_joins_an_utterance_in_run_continuous(
    engines_pair: tuple[WhisperEngine, WhisperEngine], audio: list[np.ndarray]
) -> None:
    ct2, tor = engines_pair
    reqs = requests(audio)
    want = {id(r): res for r, res in zip(reqs, ct2.infer_batch(reqs), strict=True)}
    assert isinstance(tor, TorchWhisperEngine)
    # As the batcher's step loop drives it: add, then before every step add what joins.
    tor.add([(id(reqs[0]), reqs[0])])
    got: dict[Hashable, AsrResult] = {}
    calls = 0
    while True:
        calls += 1
        if calls == 5:  # two join after four steps
            tor.add([(id(r), r) for r in reqs[1:]])
        if not tor.has_unfinished():
            break
        got.update(tor.step())
    tor.abort(())
    assert tor.counters.loop_joined == 2
    assert set(got) == set(want)
    for k, res in got.items():
        same(want[k], res)


def test_a_huggingface_checkpoint_loads_as_its_ctranslate2_conversion(tmp_path: Path) -> None:
    """A random tiny Whisper saved by transformers and converted by CTranslate2: the two
    directories give the same tensors; the encoder output is CTranslate2's and the decoder's
    logits are transformers' own on the same features and tokens."""
    import ctranslate2
    import transformers

    from benchmarks.gpu_check.models import (
        TINY,
        TokenizerFiles,
        convert_hf,
        hf_whisper_config,
        save_hf_model,
    )

    files = TokenizerFiles.bundled()
    torch.manual_seed(0)
    hf = transformers.WhisperForConditionalGeneration(hf_whisper_config(TINY, files)).eval()
    save_hf_model(hf, TINY, files, tmp_path / "hf")
    convert_hf(tmp_path / "hf", tmp_path / "ct2", "float32", False)
    a, b = load_tensors(tmp_path / "hf"), load_tensors(tmp_path / "ct2")
    assert set(a.tensors) == set(b.tensors)
    for name, t in a.tensors.items():
        torch.testing.assert_close(t, b.tensors[name], rtol=0, atol=1e-6, msg=name)
    assert a.config["alignment_heads"] and a.config["suppress_ids"] == b.config["suppress_ids"]

    ct2 = ctranslate2.models.Whisper(str(tmp_path / "ct2"), compute_type="float32")
    model = WhisperTorchModel(a, "cpu", torch.float32, 2)
    rng = np.random.default_rng(0)
    mel = rng.standard_normal((1, TINY.num_mel_bins, 3000)).astype(np.float32)
    memory = model.encode(torch.from_numpy(mel))
    ref_mem = np.array(ct2.encode(ctranslate2.StorageView.from_array(mel)))
    np.testing.assert_allclose(memory.numpy(), ref_mem, atol=1e-4)
    vocab = files.vocabulary
    names = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
    tokens = [vocab.index(n) for n in names] + [400, 1012, 291]
    logits, _ = model.cross_attention(memory[0], tokens, [(1, 0)])
    with torch.no_grad():
        want = hf(
            input_features=torch.from_numpy(mel), decoder_input_ids=torch.tensor([tokens])
        ).logits[0]
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-4)
