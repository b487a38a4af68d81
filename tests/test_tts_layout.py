"""1-D convolutions as 2-D ones of height 1 (``engines/tts/_layout.py``): same numbers, new layout.

Hand-built graphs cover the attribute cases (padding, stride, dilation, groups, a bias, a
weight shared by two convolutions, the opset-11 ``Unsqueeze`` that takes its axes as an
attribute); the bundled voice's two halves show the rewrite on the graphs the streamer serves.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from voxgate.engines.tts._graph import split_vits_graph
from voxgate.engines.tts._layout import conv1d_as_conv2d
from voxgate.engines.tts._voice import resolve_voice


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return [np.asarray(o) for o in session.run(None, feeds)]


def convs_by_rank(model: onnx.ModelProto) -> dict[int, int]:
    """How many ``Conv`` nodes have a weight initializer of each rank."""
    inits = {i.name: len(i.dims) for i in model.graph.initializer}
    ranks: dict[int, int] = {}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[1] in inits:
            rank = inits[node.input[1]]
            ranks[rank] = ranks.get(rank, 0) + 1
    return ranks


def conv_chain(opset: int) -> onnx.ModelProto:
    """x -> conv a (pads, dilation, bias) -> conv b (stride, groups) -> conv c (a's weight)."""
    rng = np.random.default_rng(7)
    w_a = rng.standard_normal((8, 4, 5)).astype(np.float32)
    b_a = rng.standard_normal(8).astype(np.float32)
    w_b = rng.standard_normal((8, 4, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w_a", "b_a"], ["a"], pads=[4, 4], dilations=[2]),
        helper.make_node("LeakyRelu", ["a"], ["a_act"], alpha=0.1),
        helper.make_node("Conv", ["a_act", "w_b"], ["b"], strides=[2], group=2, pads=[1, 1]),
        # The same weight a second time: both convolutions must see it (a shared initializer).
        helper.make_node("Conv", ["x", "w_a"], ["c"], kernel_shape=[5], pads=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "t"])],
        [
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, None]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, "t"]),
        ],
        [
            numpy_helper.from_array(w_a, "w_a"),
            numpy_helper.from_array(b_a, "b_a"),
            numpy_helper.from_array(w_b, "w_b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.unit
@pytest.mark.parametrize("opset", [11, 15])
def test_every_1d_conv_becomes_2d_and_computes_the_same(opset: int) -> None:
    model = conv_chain(opset)
    lifted = conv1d_as_conv2d(model)
    onnx.checker.check_model(lifted, full_check=True)
    assert convs_by_rank(model) == {3: 3}
    assert convs_by_rank(lifted) == {4: 3}
    # The shared weight: lifted once, and the original graph is left as it was.
    assert sum(i.name.startswith("w_a") for i in lifted.graph.initializer) == 1
    assert [len(i.dims) for i in model.graph.initializer if i.name == "w_a"] == [3]
    x = np.random.default_rng(1).standard_normal((1, 4, 37)).astype(np.float32)
    before, after = run(model, {"x": x}), run(lifted, {"x": x})
    assert [a.shape for a in after] == [b.shape for b in before] == [(1, 8, 19), (1, 8, 37)]
    for a, b in zip(after, before, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_a_graph_without_1d_convs_is_returned_unchanged() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
    )
    model = helper.make_model(graph)
    assert conv1d_as_conv2d(model) == model


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    noise = float(np.sum((ref - test) ** 2))
    return float(10 * np.log10(float(np.sum(ref**2)) / max(noise, 1e-30)))


@pytest.mark.model
def test_the_bundled_voice_halves_keep_their_outputs() -> None:
    split = split_vits_graph(onnx.load(str(resolve_voice("joe").model_path)))
    decoder = conv1d_as_conv2d(split.decoder)
    front = conv1d_as_conv2d(split.front_end)
    assert 3 not in convs_by_rank(decoder) and convs_by_rank(decoder)[4] >= 50
    assert 3 not in convs_by_rank(front)
    rng = np.random.default_rng(0)
    latent, mask = (i.name for i in split.decoder.graph.input)
    feeds = {
        latent: (0.7 * rng.standard_normal((1, 192, 84))).astype(np.float32),
        mask: np.ones((1, 1, 84), np.float32),
    }
    (ref,), (out,) = run(split.decoder, feeds), run(decoder, feeds)
    assert out.shape == ref.shape
    assert snr_db(ref.reshape(-1), out.reshape(-1)) > 90.0  # float rounding only
    # The front end: its noise is sampled, so compare with both noise scales at 0.
    ids = rng.integers(1, 120, (1, 40)).astype(np.int64)
    front_feeds = {
        "input": ids,
        "input_lengths": np.array([40], np.int64),
        "scales": np.array([0.0, 1.0, 0.0], np.float32),
    }
    names = {i.name for i in split.front_end.graph.input}
    front_feeds = {k: v for k, v in front_feeds.items() if k in names}
    for a, b in zip(run(front, front_feeds), run(split.front_end, front_feeds), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
