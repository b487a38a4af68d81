"""Split a VITS voice graph into a text front end and a windowable flow + HiFi-GAN decoder.

The seam is found from the graph's structure, not from node names (exporters rename nodes):

1. **Durations**: the single non-constant ``Ceil`` (VITS ``w_ceil``, the frames per phoneme id;
   Piper's own alignment patch relies on the same fact).
2. **Prior sampling**: the one random op (``RandomNormalLike``) that lies downstream of the
   durations, i.e. that samples the frame-rate latent after the length regulator. (The
   stochastic duration predictor's noise lies upstream of the durations and is ignored.)
3. **Candidate cuts**: tensors that post-dominate that noise (every path from the noise to the
   audio passes through them) *before* the first learned layer (Conv/ConvTranspose/MatMul/Gemm)
   that consumes noise-derived data. The front end must not contain any frame-rate network, or it
   could not be windowed.
4. **Choice**: for each candidate, the front end is everything it and the durations depend on;
   the decoder is everything else the audio output needs; the *crossing set* is the non-constant
   tensors the decoder reads from the front end. The candidate with the smallest crossing set
   wins (earliest on a tie). On Piper voices that is the sampled latent ``z_p [1,192,T]`` plus
   the frame mask ``[1,1,T]`` (plus the speaker embedding ``g [1,C,1]`` on multi-speaker voices).

Crossing tensors that depend on the durations are frame-indexed (time on the last axis) and are
sliced per decoder window; the others (speaker conditioning) are passed whole.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import onnx
from onnx.utils import Extractor

from voxgate.engines.tts.base import VoiceGraphError

__all__ = ["CrossingTensor", "GraphSplit", "split_vits_graph"]

_RANDOM_OPS = frozenset({"RandomNormalLike", "RandomNormal", "RandomUniformLike", "RandomUniform"})
_LEARNED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


@dataclass(frozen=True, slots=True)
class CrossingTensor:
    """A tensor the decoder reads from the front end.

    Attributes:
        name: tensor name in both subgraphs.
        shape: static dims from shape inference (``None`` where symbolic).
        frame_indexed: True when it has one entry per latent frame on its last axis (sliced per
            window); False for per-utterance conditioning (passed whole).
    """

    name: str
    shape: tuple[int | None, ...]
    frame_indexed: bool


@dataclass(frozen=True, slots=True)
class GraphSplit:
    """The two halves of a voice graph and how they connect.

    Attributes:
        front_end: inputs = the voice's inputs it uses; outputs = ``crossing`` names, then
            ``durations``.
        decoder: inputs = ``crossing`` names (in order) plus ``decoder_graph_inputs``; output =
            ``audio_output``.
        crossing: the tensors passed from front end to decoder, latent first.
        latent: name of the sampled frame latent (the seam tensor).
        durations: name of the per-phoneme-id frame counts ``[1,1,P]`` (``w_ceil``).
        audio_output: name of the audio output.
        decoder_graph_inputs: voice inputs the decoder reads directly (rare; fed per request).
    """

    front_end: onnx.ModelProto
    decoder: onnx.ModelProto
    crossing: tuple[CrossingTensor, ...]
    latent: str
    durations: str
    audio_output: str
    decoder_graph_inputs: tuple[str, ...]

    @property
    def latent_channels(self) -> int | None:
        """Channels of the latent (192 on Piper voices), when shape inference knows them."""
        shape = next(c.shape for c in self.crossing if c.name == self.latent)
        return shape[1] if len(shape) == 3 else None


class _Graph:
    """Producer/consumer indexes over a topologically sorted ONNX graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.nodes = list(graph.node)
        self.inputs = [i.name for i in graph.input]
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for idx, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = idx
            for name in node.input:
                if name:
                    self.consumers[name].append(idx)
        self.const = self._constant_tensors(graph)

    def _constant_tensors(self, graph: onnx.GraphProto) -> set[str]:
        # A tensor computed only from initializers/Constant nodes can be duplicated into both
        # halves, so it never counts as crossing. Random ops are never constant.
        const = {init.name for init in graph.initializer}
        for node in self.nodes:
            inputs = [n for n in node.input if n]
            if node.op_type not in _RANDOM_OPS and all(n in const for n in inputs):
                const.update(n for n in node.output if n)
        return const

    def ancestors(self, tensors: list[str]) -> set[int]:
        """Indexes of the nodes needed to compute ``tensors`` from the graph inputs."""
        seen: set[int] = set()
        stack = [self.producer[t] for t in tensors if t in self.producer]
        while stack:
            idx = stack.pop()
            if idx in seen:
                continue
            seen.add(idx)
            stack.extend(self.producer[n] for n in self.nodes[idx].input if n in self.producer)
        return seen

    def descendants(self, tensor: str) -> set[str]:
        """Every tensor computed (directly or not) from ``tensor``, itself included."""
        seen = {tensor}
        stack = [tensor]
        while stack:
            for idx in self.consumers.get(stack.pop(), ()):
                for out in self.nodes[idx].output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
        return seen


def _single(items: list[str], what: str) -> str:
    if len(items) != 1:
        raise VoiceGraphError(f"expected exactly one {what}, found {len(items)}: {items[:5]}")
    return items[0]


def _post_dominators(g: _Graph, noise: str) -> list[str]:
    """Tensors every noise path passes through, in order, up to the first learned layer."""
    derived = {noise}
    remaining = {noise: len(g.consumers.get(noise, ()))}
    found: list[str] = []
    for node in g.nodes[g.producer[noise] + 1 :]:
        if not any(n in derived for n in node.input):
            continue
        if node.op_type in _LEARNED_OPS:
            break
        for name in node.input:
            if name in remaining:
                remaining[name] -= 1
                if remaining[name] == 0:
                    del remaining[name]
        for name in node.output:
            if name:
                derived.add(name)
                remaining[name] = len(g.consumers.get(name, ()))
        live = [n for n, count in remaining.items() if count > 0]
        if len(live) == 1:
            found.append(live[0])
    return found


def _shape(vi: onnx.ValueInfoProto | None) -> tuple[int | None, ...]:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return ()
    return tuple(
        d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim
    )


def split_vits_graph(model: onnx.ModelProto) -> GraphSplit:
    """Find the latent seam of a VITS voice graph and extract the two halves.

    Args:
        model: a Piper/VITS ONNX model (not modified).

    Returns:
        The front end and decoder models and the tensors that connect them.

    Raises:
        VoiceGraphError: the graph lacks the durations/sampling structure described above.
    """
    g = _Graph(model.graph)
    audio_output = model.graph.output[0].name
    ceils = [n.output[0] for n in g.nodes if n.op_type == "Ceil" and n.output[0] not in g.const]
    durations = _single(ceils, "Ceil (duration) op")
    after_durations = g.descendants(durations)
    noises = [
        n.output[0] for n in g.nodes if n.op_type in _RANDOM_OPS and n.output[0] in after_durations
    ]
    noise = _single(noises, "random op sampling the frame latent after the durations")
    candidates = _post_dominators(g, noise)
    if not candidates:
        raise VoiceGraphError(f"no single tensor carries the sampled latent from {noise!r}")

    needed_for_audio = g.ancestors([audio_output])
    best: tuple[int, str, list[str]] | None = None
    for cand in candidates:
        front = g.ancestors([cand, durations])
        reads: list[str] = []
        for idx in sorted(needed_for_audio - front):
            for name in g.nodes[idx].input:
                if (
                    name
                    and name not in g.const
                    and name not in reads
                    and (g.producer.get(name) in front or name in g.inputs)
                ):
                    reads.append(name)
        if best is None or len(reads) < best[0]:
            best = (len(reads), cand, reads)
    assert best is not None
    _, latent, crossing_names = best
    if latent not in crossing_names:
        raise VoiceGraphError(f"the decoder does not read the sampled latent {latent!r}")

    graph_inputs = tuple(n for n in crossing_names if n in g.inputs)
    crossing_names = [latent] + [n for n in crossing_names if n != latent and n not in g.inputs]
    # Shape inference gives every crossing tensor the type the extracted halves declare.
    extractor = Extractor(onnx.shape_inference.infer_shapes(model))
    value_info = extractor.value_infos
    crossing = tuple(
        CrossingTensor(name, _shape(value_info.get(name)), name in after_durations)
        for name in crossing_names
    )
    for tensor in crossing:
        if tensor.frame_indexed and len(tensor.shape) != 3:
            raise VoiceGraphError(
                f"frame tensor {tensor.name!r} is not [batch, C, T]: {tensor.shape}"
            )
    front_nodes = g.ancestors([latent, durations])
    front_inputs = [n for n in g.inputs if any(i in front_nodes for i in g.consumers.get(n, ()))]
    front_end = extractor.extract_model(front_inputs, [*crossing_names, durations])
    decoder = extractor.extract_model([*crossing_names, *graph_inputs], [audio_output])
    return GraphSplit(
        front_end=front_end,
        decoder=decoder,
        crossing=crossing,
        latent=latent,
        durations=durations,
        audio_output=audio_output,
        decoder_graph_inputs=graph_inputs,
    )
