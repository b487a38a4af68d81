"""CTranslate2 <-> transformers for the bundled Whisper base: exact in both directions.

The real bundled model, real torch/transformers and a real CTranslate2 load: the round trip
through a ``WhisperForConditionalGeneration`` must give back ``model.bin`` byte for byte (every
variable, in order, with its dtype), the small files must be carried over unchanged, the HF
model must decode one shared clip to the same greedy tokens as CTranslate2, and the encoder
forward that training uses on a served bucket must match CTranslate2's encoder on that bucket.
"""

from __future__ import annotations

import filecmp
import wave
from pathlib import Path

import numpy as np
import pytest

from voxgate.adapt.convert import CARRIED_FILES, hf_model, read_base, state_dict_of, write_ct2_dir
from voxgate.engines.asr import resolve_model_dir
from voxgate.engines.asr._ct2_weights import WeightFileError, read_variables

pytestmark = [pytest.mark.model, pytest.mark.component]

CLIP = "jfk_inaugural_1961.wav"


@pytest.fixture(scope="module")
def base_dir() -> Path:
    return resolve_model_dir("base")


@pytest.fixture(scope="module")
def base(base_dir: Path):
    return read_base(base_dir)


@pytest.fixture(scope="module")
def model(base):
    return hf_model(base)


def clip(speech_dir: Path) -> np.ndarray:
    with wave.open(str(speech_dir / CLIP), "rb") as w:
        assert w.getframerate() == 16000
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return (pcm / 32768.0).astype(np.float32)


def mel(audio: np.ndarray, frames: int) -> np.ndarray:
    from voxgate.adapt.train import _Features

    return _Features(80)(audio, frames)


def test_the_base_reads_into_every_transformers_parameter(base, model) -> None:
    assert base.dims.d_model == 512 and base.dims.encoder_layers == 6
    assert base.dtype == np.float16
    # hf_model loads strictly: no missing or unexpected key; the projection is tied.
    names = set(model.state_dict())
    assert names - {"proj_out.weight"} == set(base.state)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_round_trip_through_transformers_is_bit_identical(
    base, model, base_dir: Path, tmp_path: Path
) -> None:
    out = write_ct2_dir(state_dict_of(model), base, tmp_path / "rt")
    assert filecmp.cmp(out / "model.bin", base_dir / "model.bin", shallow=False)
    # Byte equality covers every variable; check the reader agrees, dtype by dtype.
    a, b = read_variables(base_dir / "model.bin"), read_variables(out / "model.bin")
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    for name in CARRIED_FILES:
        if (base_dir / name).is_file():
            assert filecmp.cmp(out / name, base_dir / name, shallow=False), name


def test_a_changed_weight_is_written_and_only_that_one(base, tmp_path: Path) -> None:
    state = dict(base.state)
    key = "model.decoder.layers.0.self_attn.q_proj.weight"
    state[key] = state[key] + np.float32(0.5)
    out = write_ct2_dir(state, base, tmp_path / "changed")
    a = read_variables(base.model_dir / "model.bin")
    b = read_variables(out / "model.bin")
    differ = [n for n in a if not np.array_equal(a[n], b[n])]
    assert differ == ["decoder/layer_0/self_attention/linear_0/weight"]
    fused = b["decoder/layer_0/self_attention/linear_0/weight"]
    assert np.array_equal(fused[:512], (base.state[key] + np.float32(0.5)).astype(np.float16))


def test_transformers_greedy_tokens_equal_ctranslate2s(
    model, base_dir: Path, speech_dir: Path
) -> None:
    import ctranslate2
    import torch

    feats = mel(clip(speech_dir), 3000)
    prompt = [
        50258,
        50259,
        50359,
        50363,
    ]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
    ct2 = ctranslate2.models.Whisper(str(base_dir), compute_type="float32", intra_threads=2)
    res = ct2.generate(
        ctranslate2.StorageView.from_array(feats[None]),
        [prompt],
        beam_size=1,
        max_length=120,
        suppress_blank=False,
        suppress_tokens=[],
    )
    want = res[0].sequences_ids[0]
    assert len(want) > 15  # the clip says a whole sentence

    ids, step, cache = list(prompt), list(prompt), None
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(feats[None])).last_hidden_state
        for _ in range(len(want) + 1):
            out = model.model.decoder(
                input_ids=torch.tensor([step]),
                encoder_hidden_states=enc,
                cache=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            nxt = int(model.proj_out(out.last_hidden_state[0, -1]).argmax())
            if nxt == 50257:
                break
            ids.append(nxt)
            step = [nxt]
    assert ids[len(prompt) :] == want


def test_training_encoder_on_a_served_bucket_matches_ctranslate2(
    model, base_dir: Path, speech_dir: Path
) -> None:
    import ctranslate2
    import torch

    from voxgate.adapt.train import _encoder_forward

    feats = mel(clip(speech_dir), 1500)  # the 15 s bucket an 11 s clip is served on
    ct2 = ctranslate2.models.Whisper(str(base_dir), compute_type="float32", intra_threads=2)
    want = np.array(ct2.encode(ctranslate2.StorageView.from_array(feats[None])))
    with torch.no_grad():
        got = _encoder_forward(model, torch.from_numpy(feats[None])).numpy()
    assert got.shape == want.shape == (1, 750, 512)
    assert float(np.max(np.abs(got - want))) < 2e-3


def test_an_int8_model_cannot_be_trained(tmp_path: Path, base, base_dir: Path) -> None:
    import ctranslate2

    spec_dir = tmp_path / "int8"
    from voxgate.adapt.convert import build_spec

    spec = build_spec(base.state, base)
    spec.validate()
    spec.optimize(quantization="int8")
    spec_dir.mkdir()
    spec.save(str(spec_dir))
    assert ctranslate2.models.Whisper(str(spec_dir)).is_multilingual
    with pytest.raises(WeightFileError, match="int8.*float16 or float32"):
        read_base(spec_dir)
