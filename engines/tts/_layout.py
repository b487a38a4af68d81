"""1-D convolutions rewritten as 2-D ones of height 1, for ONNX Runtime's blocked CPU kernels.

A VITS voice is almost all 1-D convolution: the flow's WaveNet layers and HiFi-GAN's
residual blocks in the decoder, the text encoder's feed-forward layers in the front end. On
x86, ONNX Runtime's graph optimiser moves 4-D convolutions to a channel-blocked layout
(``NchwcTransformer``, MLAS's NCHWc kernels) and leaves 3-D ones on im2col and a GEMM. The
same convolution written with a height of 1 is mathematically identical and runs faster on one
thread. Measured on the bundled voice (2-core development machine, 2026-12-05, one session at a
time, medians of 15): a decoder window of 36-248 input frames took 0.87-0.91 of its time on
one thread, the front end 0.88-0.93 on one or two; but a decoder on two intra-op threads took
1.14-1.26 of its time (the blocked kernels split a height-1 image poorly), so the streamer
rewrites its two-thread first-audio decoder not at all (:class:`~voxgate.engines.tts.VitsStreamer`).

The rewrite is local: each ``Conv`` whose weight is a 3-D initializer gets an ``Unsqueeze``
of its input at axis 2, a 4-D weight (``[out, in/group, 1, k]``), the 1-D attributes lifted
(``kernel_shape [1, k]``, ``pads [0, b, 0, e]``...) and a ``Squeeze`` of its output back to
the original tensor name, so every other node and every graph output keep their shapes. The
optimiser then fuses and re-lays-out what it can. Outputs differ from the original graph's by
float rounding only (about 110 dB below the signal on the bundled voice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["conv1d_as_conv2d"]

#: Attributes that hold one value per spatial axis (lifted with a leading 1).
_PER_AXIS = ("kernel_shape", "strides", "dilations")


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def conv1d_as_conv2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with its 1-D ``Conv`` nodes computed as 2-D ones of height 1.

    Convolutions whose weight is not a constant 3-D initializer (a computed weight, a 2-D
    convolution) are left as they are. Returns the copy; ``model`` is not modified.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {init.name: init for init in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    graph_inputs = {i.name for i in graph.input}
    taken = {i.name for i in graph.initializer} | graph_inputs
    for node in graph.node:
        taken.update(node.output)

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    new_axes_input = _opset(out) >= 13
    axes_name = fresh("conv1d_as_conv2d_axes")

    def axis_op(op: str, src: str, dst: str) -> onnx.NodeProto:
        if new_axes_input:
            return helper.make_node(op, [src, axes_name], [dst])
        return helper.make_node(op, [src], [dst], axes=[2])

    lifted_weights: dict[str, str] = {}
    lifted_inputs: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        is_conv = node.op_type == "Conv" and node.domain in ("", "ai.onnx")
        weight = inits.get(node.input[1]) if is_conv and len(node.input) > 1 else None
        if weight is None or len(weight.dims) != 3:
            nodes.append(node)
            continue
        known = lifted_weights.get(weight.name)
        if known is not None:
            name = known
        else:
            array = numpy_helper.to_array(weight)[:, :, None, :]
            if uses.get(weight.name, 0) == 1 and weight.name not in graph_inputs:
                name = weight.name
                weight.CopyFrom(numpy_helper.from_array(array, name))
            else:  # shared with another node or declared as an input: leave it 3-D
                name = fresh(f"{weight.name}_h1")
                graph.initializer.append(numpy_helper.from_array(array, name))
            lifted_weights[weight.name] = name
        source = node.input[0]
        lifted = lifted_inputs.get(source)
        if lifted is None:
            lifted = fresh(f"{source}_h1")
            nodes.append(axis_op("Unsqueeze", source, lifted))
            lifted_inputs[source] = lifted
        attrs: dict[str, Any] = {}
        for attr in node.attribute:
            value = helper.get_attribute_value(attr)
            if attr.name in _PER_AXIS:
                attrs[attr.name] = [1, *value]
            elif attr.name == "pads":
                attrs[attr.name] = [0, value[0], 0, value[1]]
            else:
                attrs[attr.name] = value
        result = fresh(f"{node.output[0]}_h1")
        nodes.append(
            helper.make_node(
                "Conv", [lifted, name, *node.input[2:]], [result], name=node.name, **attrs
            )
        )
        nodes.append(axis_op("Squeeze", result, node.output[0]))
    if not lifted_weights:
        return out
    if new_axes_input:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axes_name))
    del graph.node[:]
    graph.node.extend(nodes)
    # A weight shared by several convolutions was copied once; drop the 3-D original when
    # nothing reads it any more.
    read = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    stale = {old for old, new in lifted_weights.items() if old != new and old not in read}
    if stale:
        kept = [i for i in graph.initializer if i.name not in stale or i.name in graph_inputs]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return out
