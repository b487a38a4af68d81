"""Structural split of VITS graphs: the bundled voice and a tiny multi-speaker VITS-shaped graph.

The tiny graph is built here with ``onnx.helper`` (names unlike Piper's, 16 latent channels, a
speaker embedding, hop 4), so the seam search is shown to rely on structure, not on one voice's
node names or its 192 channels.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from voxgate.engines.tts import (
    SpeakOptions,
    TtsConfig,
    TtsInputError,
    VitsStreamer,
    VoiceGraphError,
    split_vits_graph,
)
from voxgate.engines.tts._text import prepare_text
from voxgate.engines.tts._voice import phonemize_unit, resolve_voice

pytestmark = pytest.mark.model

TINY_CHANNELS = 16
TINY_SPEAKER_DIM = 4
TINY_HOP = 4


def build_tiny_vits(*, with_noise: bool = True) -> onnx.ModelProto:
    """A VITS-shaped graph: encoder, durations, length regulator, sampling, flow, decoder."""
    rng = np.random.default_rng(0)
    c, gdim = TINY_CHANNELS, TINY_SPEAKER_DIM

    def w(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    def i64(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, dtype=np.int64), name)

    inits = [
        w("emb", 256, c),
        w("spk", 2, gdim),
        w("wm", c, c, 1),
        w("wl", c, c, 1, scale=0.05),
        w("wd", 1, c, 1, scale=0.05),
        w("wdg", 1, gdim, 1, scale=0.05),
        w("wf", c, c, 3),
        w("wfg", c, gdim, 1),
        w("wt", c, 1, TINY_HOP),
        w("wo", 1, 1, 3),
        i64("k0", [0]),
        i64("k1", [1]),
        i64("k2", [2]),
        i64("ax2", [2]),
        i64("shape_row", [1, -1]),
        i64("shape_col", [-1, 1]),
        i64("shape_mask", [1, 1, -1]),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(2, dtype=np.int32), "axis_t"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "min_len"),
    ]
    n = helper.make_node
    nodes = [
        # Text encoder and speaker embedding.
        n("Gather", ["emb", "input"], ["tok"]),
        n("Transpose", ["tok"], ["x"], perm=[0, 2, 1]),
        n("Gather", ["spk", "sid"], ["spk_row"]),
        n("Unsqueeze", ["spk_row", "ax2"], ["g"]),
        n("Conv", ["x", "wm"], ["mean_p"]),
        n("Conv", ["x", "wl"], ["logstd_p"]),
        # Stochastic duration predictor (its own noise lies upstream of the durations).
        n("Conv", ["x", "wd"], ["logw0"]),
        n("Conv", ["g", "wdg"], ["logw_g"]),
        n("Add", ["logw0", "logw_g"], ["logw1"]),
        n("Gather", ["scales", "k2"], ["nw"]),
        n("RandomNormalLike", ["logw1"], ["dp_eps"], seed=1.0),
        n("Mul", ["dp_eps", "nw"], ["dp_noise"]),
        n("Add", ["logw1", "dp_noise"], ["logw"]),
        n("Gather", ["scales", "k1"], ["ls"]),
        n("Exp", ["logw"], ["wexp"]),
        n("Mul", ["wexp", "ls"], ["wscaled"]),
        n("Ceil", ["wscaled"], ["frames_per_id"]),
        # Length regulator: a hard alignment matrix from the cumulative durations.
        n("ReduceSum", ["frames_per_id"], ["total_f"], keepdims=0),
        n("Max", ["total_f", "min_len"], ["total_c"]),
        n("Cast", ["total_c"], ["total"], to=TensorProto.INT64),
        n("Range", ["zero", "total", "one"], ["t"]),
        n("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
        n("Reshape", ["tf", "shape_col"], ["tcol"]),
        n("CumSum", ["frames_per_id", "axis_t"], ["cum"]),
        n("Sub", ["cum", "frames_per_id"], ["cum_prev"]),
        n("Reshape", ["cum", "shape_row"], ["cum_row"]),
        n("Reshape", ["cum_prev", "shape_row"], ["prev_row"]),
        n("Less", ["tcol", "cum_row"], ["before_end"]),
        n("GreaterOrEqual", ["tcol", "prev_row"], ["after_start"]),
        n("And", ["before_end", "after_start"], ["align_b"]),
        n("Cast", ["align_b"], ["align_raw"], to=TensorProto.FLOAT),
        # As in VITS, the frame mask gates the alignment (so it is computed in the front end).
        n("Less", ["tf", "total_c"], ["valid"]),
        n("Cast", ["valid"], ["valid_f"], to=TensorProto.FLOAT),
        n("Reshape", ["valid_f", "shape_mask"], ["frame_mask"]),
        n("Reshape", ["frame_mask", "shape_col"], ["valid_col"]),
        n("Mul", ["align_raw", "valid_col"], ["align"]),
        n("Transpose", ["align"], ["align_t"], perm=[1, 0]),
        n("MatMul", ["mean_p", "align_t"], ["mean_f"]),
        n("MatMul", ["logstd_p", "align_t"], ["logstd_f"]),
        # Prior sampling: z_p = mean + eps * exp(logstd) * noise_scale.
        n("Gather", ["scales", "k0"], ["ns"]),
        n("RandomNormalLike" if with_noise else "Identity", ["mean_f"], ["eps"]),
        n("Exp", ["logstd_f"], ["std_f"]),
        n("Mul", ["eps", "std_f"], ["eps_std"]),
        n("Mul", ["eps_std", "ns"], ["eps_scaled"]),
        n("Add", ["mean_f", "eps_scaled"], ["z_prior"]),
        # Flow (speaker-conditioned residual coupling, receptive field +-1 frame).
        n("Mul", ["z_prior", "frame_mask"], ["zm"]),
        n("Conv", ["zm", "wf"], ["h0"], pads=[1, 1]),
        n("Conv", ["g", "wfg"], ["hg"]),
        n("Add", ["h0", "hg"], ["h1"]),
        n("Tanh", ["h1"], ["h2"]),
        n("Add", ["z_prior", "h2"], ["z1"]),
        n("Mul", ["z1", "frame_mask"], ["z"]),
        # Decoder: upsample by the hop, smooth, squash.
        n("ConvTranspose", ["z", "wt"], ["up"], strides=[TINY_HOP]),
        n("Conv", ["up", "wo"], ["post"], pads=[1, 1]),
        n("Tanh", ["post"], ["audio"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_vits",
        [
            helper.make_tensor_value_info("input", TensorProto.INT64, [1, "P"]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("sid", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, None])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def joe() -> onnx.ModelProto:
    return onnx.load(str(resolve_voice("joe").model_path))


@pytest.fixture(scope="module")
def tiny_voice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny graph as a Piper voice on disk (joe's phoneme map, two speakers, hop 4)."""
    root = tmp_path_factory.mktemp("voice")
    model_path = root / "xx_tiny-multi.onnx"
    onnx.save(build_tiny_vits(), str(model_path))
    config = json.loads(resolve_voice("joe").config_path.read_text())
    config.update(num_speakers=2, speaker_id_map={"a": 0, "b": 1}, hop_length=TINY_HOP)
    config["audio"]["sample_rate"] = 16000
    (root / "xx_tiny-multi.onnx.json").write_text(json.dumps(config))
    return model_path


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_bundled_voice_seam_is_latent_and_mask(joe: onnx.ModelProto) -> None:
    split = split_vits_graph(joe)
    shapes = {c.name: c.shape for c in split.crossing}
    assert split.crossing[0].name == split.latent
    assert split.latent_channels == 192
    assert len(split.crossing) == 2  # latent + frame mask, nothing else crosses
    mask = next(c for c in split.crossing if c.name != split.latent)
    assert mask.shape[1] == 1 and len(mask.shape) == 3 and mask.frame_indexed
    assert split.crossing[0].frame_indexed and len(shapes[split.latent]) == 3
    # The seam is downstream of the prior's random op and feeds no learned layer before it.
    producers = {o: node for node in joe.graph.node for o in node.output}
    assert producers[split.latent].op_type == "Add"
    assert producers[split.durations].op_type == "Ceil"
    assert [o.name for o in split.front_end.graph.output] == [
        *(c.name for c in split.crossing),
        split.durations,
    ]
    assert not any(n.op_type == "ConvTranspose" for n in split.front_end.graph.node)
    assert not any(n.op_type == "RandomNormalLike" for n in split.decoder.graph.node)


def test_bundled_voice_split_is_bit_identical_to_whole_graph(joe: onnx.ModelProto) -> None:
    split = split_vits_graph(joe)
    whole, front, decoder = session(joe), session(split.front_end), session(split.decoder)
    voice = VitsStreamer.load(TtsConfig(cache_bytes=0))
    text = "The quick brown fox jumps over the lazy dog. It was $3.50, wasn't it? Yes!"
    unit_list = prepare_text(text, max_chars=1000, max_unit_chars=300, first_unit_max_chars=0)
    assert len(unit_list) == 3
    for unit in unit_list:
        ids = phonemize_unit(unit, voice._voice).phoneme_ids
        feeds = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),  # noise off
        }
        expected = whole.run(None, feeds)[0]
        outs = front.run(None, feeds)
        names = [c.name for c in split.crossing]
        audio = decoder.run(None, dict(zip(names, outs[:-1], strict=True)))[0]
        assert audio.shape == expected.shape
        assert np.array_equal(audio, expected)
        # Durations: frames per id sum to the latent length.
        assert outs[-1].shape == (1, 1, len(ids))
        assert int(outs[-1].sum()) == outs[0].shape[-1]
    voice.close()


def test_tiny_graph_seam_found_by_structure() -> None:
    split = split_vits_graph(build_tiny_vits())
    assert split.latent == "z_prior"
    assert split.durations == "frames_per_id"
    by_name = {c.name: c for c in split.crossing}
    assert set(by_name) == {"z_prior", "frame_mask", "g"}
    assert by_name["z_prior"].frame_indexed and by_name["frame_mask"].frame_indexed
    assert not by_name["g"].frame_indexed  # speaker conditioning is passed whole
    assert split.latent_channels == TINY_CHANNELS
    assert by_name["g"].shape == (1, TINY_SPEAKER_DIM, 1)


def test_tiny_graph_split_matches_whole_graph() -> None:
    model = build_tiny_vits()
    split = split_vits_graph(model)
    whole, front, decoder = session(model), session(split.front_end), session(split.decoder)
    for sid in (0, 1):
        feeds = {
            "input": np.array([[1, 0, 20, 0, 59, 0, 24, 0, 2]], dtype=np.int64),
            "input_lengths": np.array([9], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
            "sid": np.array([sid], dtype=np.int64),
        }
        front_feeds = {i.name: feeds[i.name] for i in front.get_inputs()}
        outs = front.run(None, front_feeds)
        names = [c.name for c in split.crossing]
        audio = decoder.run(None, dict(zip(names, outs[:-1], strict=True)))[0]
        assert np.array_equal(audio, whole.run(None, feeds)[0])


def test_graph_without_prior_sampling_is_refused() -> None:
    with pytest.raises(VoiceGraphError, match="random op"):
        split_vits_graph(build_tiny_vits(with_noise=False))


def test_multi_speaker_voice_by_path_streams_and_validates(tiny_voice: Path) -> None:
    streamer = VitsStreamer.load(TtsConfig(voice=str(tiny_voice), context_frames=4))
    streamer.warmup()
    (info,) = streamer.voices()
    assert (info.name, info.num_speakers, info.sample_rate_hz) == ("xx_tiny-multi", 2, 16000)
    assert streamer.hop_length == TINY_HOP
    quiet = SpeakOptions(noise_scale=0.0, noise_w=0.0)
    text = "Hello there. This is speaker one."
    audio = {}
    for sid in (0, 1):
        options = SpeakOptions(noise_scale=0.0, noise_w=0.0, speaker_id=sid)
        chunks = list(streamer.stream(text, options))
        audio[sid] = np.concatenate([c.samples for c in chunks])
        reference = streamer.synthesize_oneshot(text, options).samples
        assert audio[sid].shape == reference.shape
        np.testing.assert_allclose(audio[sid], reference, atol=1e-5)
    assert not np.array_equal(audio[0], audio[1])  # the speaker embedding is used
    assert np.array_equal(
        np.concatenate([c.samples for c in streamer.stream(text, quiet)]), audio[0]
    )  # default speaker
    with pytest.raises(TtsInputError) as info_err:
        streamer.stream(text, SpeakOptions(speaker_id=2))
    assert info_err.value.field == "speaker_id"
    with pytest.raises(TtsInputError, match="voice"):
        streamer.stream(text, SpeakOptions(voice="en_US-joe-medium"))
    streamer.close()
