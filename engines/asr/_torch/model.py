"""Whisper's encoder and a static-cache decoder in plain PyTorch (no ``transformers``).

The decoder keeps every row's attention state in preallocated tensors indexed by row slot:
self-attention K/V ``(layers, rows, heads, 448, d_head)`` and cross-attention K/V
``(layers, rows, heads, frames, d_head)`` (computed once when a row joins, from its encoder
output). Each row carries its own position, so rows of any age share one decode step: the
step writes each row's new K/V at its own position and masks the positions it has not reached
(and, for cross-attention, the encoder frames past its own window). Slots that hold no row
are computed and ignored; that keeps every shape fixed, which is what lets the step be
captured once per batch-size bucket as a CUDA graph (vLLM's ``cudagraph_capture_sizes``):
replaying a graph costs one launch where the eager step costs hundreds (the H200 measurement
in issue 39: 11-23 ms eager, 2.8 ms captured at batch 1).

On CPU (tests, float32) there are no graphs, the buffers grow with the rows and frames in use,
and the attention is sliced to the longest live row instead of the full 448 positions.
The encoder runs on its own CUDA stream so an arriving utterance's encode is queued beside the
decode steps instead of in front of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from voxgate.engines.asr._torch.weights import WhisperTensors

__all__ = ["GRAPH_BUCKETS", "MAX_POSITIONS", "DeviceMemory", "WhisperTorchModel"]

#: Whisper's decoder holds at most 448 positions.
MAX_POSITIONS = 448
#: Batch sizes a decode step is captured for (a step runs on the smallest bucket that holds
#: its highest live slot).
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One utterance's encoder output on the device, and when the encoder stream produced it.

    Attributes:
        tensor: (frames, d_model) in the model's dtype.
        ready: an event on the encoder stream (CUDA), None when already computed (CPU).
    """

    tensor: torch.Tensor
    ready: torch.cuda.Event | None = None

    def is_ready(self) -> bool:
        """Whether reading the tensor would not wait for the encoder."""
        return self.ready is None or bool(self.ready.query())  # type: ignore[no-untyped-call]

    def wait(self) -> torch.Tensor:
        """The tensor, with the current stream ordered after the encoder's work."""
        if self.ready is not None:
            torch.cuda.current_stream(self.tensor.device).wait_event(self.ready)
        return self.tensor


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class WhisperTorchModel:
    """Encoder, prefill and batched decode step over a static per-row cache.

    Threading: not thread-safe; one engine thread drives it (sibling engines share the weights
    read-only but each needs its own cache: :meth:`clone_cache`).

    Args:
        weights: the model's tensors (any device / dtype; moved here).
        device: ``cpu`` or ``cuda[:i]``.
        dtype: float32 on CPU; float16 or bfloat16 on CUDA.
        max_rows: decode rows the cache holds (CUDA: allocated up front; CPU: grown on demand).
        graphs: capture the decode step per bucket (CUDA only).
    """

    self_k: torch.Tensor
    self_v: torch.Tensor
    cross_k: torch.Tensor
    cross_v: torch.Tensor
    cross_len: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    _graph_pool: Any

    def twin(self) -> WhisperTorchModel:
        """Another model over the same weight tensors with its own cache (another worker)."""
        twin = object.__new__(WhisperTorchModel)
        for name in (
            "device", "dtype", "meta", "w", "heads", "d_model", "d_head", "n_mels",
            "is_multilingual", "vocab_size", "layers", "max_frames", "max_rows", "on_cuda",
            "graphs_enabled",
        ):  # fmt: skip
            setattr(twin, name, getattr(self, name))
        twin.encode_stream = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.on_cuda
            else None
        )
        twin._graphs = {}
        twin._graph_pool = None
        twin._allocated = False
        twin._alloc(self.max_rows if self.on_cuda else 1, self.max_frames if self.on_cuda else 1)
        return twin

    def release(self) -> None:
        """Drop the cache and captured graphs (the weights go with the last reference)."""
        self._graphs.clear()
        self._graph_pool = None
        self._allocated = False
        for name in ("self_k", "self_v", "cross_k", "cross_v"):
            setattr(self, name, torch.empty(0))
        if self.on_cuda:
            torch.cuda.empty_cache()

    def __init__(
        self,
        weights: WhisperTensors,
        device: torch.device | str,
        dtype: torch.dtype,
        max_rows: int,
        *,
        graphs: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.meta = weights
        self.w = weights.to(self.device, dtype).tensors
        self.heads = weights.heads
        self.d_model = weights.d_model
        self.d_head = self.d_model // self.heads
        self.n_mels = weights.n_mels
        self.is_multilingual = weights.is_multilingual
        self.vocab_size = weights.vocab_size
        self.layers = weights.decoder_layers
        self.max_frames = int(self.w["enc.pos"].shape[0])
        self.max_rows = max_rows
        self.on_cuda = self.device.type == "cuda"
        self.graphs_enabled = graphs and self.on_cuda
        self.encode_stream = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.on_cuda
            else None
        )
        self._graphs: dict[int, _Graph] = {}
        self._graph_pool = None
        self._allocated = False
        self._alloc(max_rows if self.on_cuda else 1, self.max_frames if self.on_cuda else 1)

    # ------------------------------------------------------------------ cache

    def _alloc(self, rows: int, frames: int) -> None:
        """(Re)allocate the cache for ``rows`` slots and ``frames`` positions, keeping its data."""
        lay, h, dh = self.layers, self.heads, self.d_head
        dev, dt = self.device, self.dtype
        old = self._allocated
        if old:
            prev = (self.self_k, self.self_v, self.cross_k, self.cross_v)
            prev_small = (self.cross_len, self.tokens, self.positions)
        self.self_k = torch.zeros(lay, rows, h, MAX_POSITIONS, dh, device=dev, dtype=dt)
        self.self_v = torch.zeros_like(self.self_k)
        self.cross_k = torch.zeros(lay, rows, h, frames, dh, device=dev, dtype=dt)
        self.cross_v = torch.zeros_like(self.cross_k)
        self.cross_len = torch.ones(rows, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        if old:
            r, f = prev[0].shape[1], prev[2].shape[3]
            self.self_k[:, :r] = prev[0]
            self.self_v[:, :r] = prev[1]
            self.cross_k[:, :r, :, :f] = prev[2]
            self.cross_v[:, :r, :, :f] = prev[3]
            self.cross_len[:r] = prev_small[0]
            self.tokens[:r] = prev_small[1]
            self.positions[:r] = prev_small[2]
        self._allocated = True

    def ensure(self, rows: int, frames: int) -> None:
        """Make room for ``rows`` row slots and ``frames`` encoder positions.

        The CUDA cache starts at ``max_rows`` rows of the full window and grows only when a
        batch needs more rows than that (beams, samples); the CPU cache grows as used.
        """
        have_rows, have_frames = self.self_k.shape[1], self.cross_k.shape[3]
        if rows <= have_rows and frames <= have_frames:
            return
        if self.on_cuda:
            # Captured graphs point at the old buffers: they are captured again when used.
            self._graphs.clear()
            self._graph_pool = None
        grown = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        self._alloc(grown, max(frames, have_frames))

    # ------------------------------------------------------------------ maths

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (self.d_model,), self.w[name + ".g"], self.w[name + ".b"], 1e-5)

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".w"], self.w.get(name + ".b"))

    def _ffn(self, x: torch.Tensor, p: str) -> torch.Tensor:
        y = self._ln(x, p + ".ln_ffn")
        return x + self._lin(F.gelu(self._lin(y, p + ".fc1")), p + ".fc2")

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(..., T, n * d) -> (..., n * heads, T, d_head) (fused projections chunk on dim -3)."""
        return x.reshape(*x.shape[:-1], -1, self.d_head).transpose(-3, -2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-3, -2).flatten(-2)

    # ------------------------------------------------------------------ encoder

    @torch.no_grad()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """(batch, n_mels, frames) log-mel -> (batch, frames // 2, d_model) encoder output.

        On CUDA the work is queued on the encoder stream; the caller orders its own stream
        after :meth:`encode_event` (:class:`DeviceMemory`) before reading the result.
        """
        mel = mel.to(self.device, self.dtype)
        if self.encode_stream is not None:
            consumer = torch.cuda.current_stream(self.device)
            self.encode_stream.wait_stream(consumer)  # the features' copy to the device
            with torch.cuda.stream(self.encode_stream):
                out = self._encode(mel)
            # The decode stream reads it: the allocator must not reuse it before that work.
            out.record_stream(consumer)
            return out
        return self._encode(mel)

    def encode_event(self) -> torch.cuda.Event | None:
        """An event recorded on the encoder stream after the work queued so far (CUDA)."""
        if self.encode_stream is None:
            return None
        ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record(self.encode_stream)
        return ev

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        w = self.w
        x = F.gelu(F.conv1d(mel, w["enc.conv1.w"], w["enc.conv1.b"], padding=1))
        x = F.gelu(F.conv1d(x, w["enc.conv2.w"], w["enc.conv2.b"], stride=2, padding=1))
        x = x.transpose(1, 2) + w["enc.pos"][: x.shape[2]]
        for i in range(self.meta.encoder_layers):
            p = f"enc.{i}"
            y = self._ln(x, p + ".ln_self")
            q, k, v = self._split(self._lin(y, p + ".qkv")).chunk(3, dim=-3)
            o = F.scaled_dot_product_attention(q, k, v)
            x = x + self._lin(self._merge(o), p + ".out_self")
            x = self._ffn(x, p)
        return self._ln(x, "enc.ln")

    # ------------------------------------------------------------------ decoder

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._ln(x, "dec.ln"), self.w["dec.emb"]).float()

    @torch.no_grad()
    def set_memory(self, rows: list[int], memory: torch.Tensor) -> None:
        """Cross-attention K/V of one encoder output (frames, d) into every row of ``rows``."""
        s = int(memory.shape[0])
        self.ensure(max(rows) + 1, s)
        mem = memory.to(self.device, self.dtype)
        idx = torch.tensor(rows, device=self.device)
        for li in range(self.layers):
            k, v = self._split(self._lin(mem, f"dec.{li}.kv_cross")).chunk(2, dim=-3)
            self.cross_k[li, idx, :, :s] = k
            self.cross_v[li, idx, :, :s] = v
        self.cross_len[idx] = s

    @torch.no_grad()
    def prefill(self, row: int, tokens: list[int], logits_at: int | None) -> torch.Tensor | None:
        """Run ``tokens`` (positions 0..T-1) into row ``row``'s self cache; logits at one index.

        The row's cross K/V must be set (:meth:`set_memory`).
        """
        t = len(tokens)
        w = self.w
        ids = torch.tensor(tokens, device=self.device)
        x = (w["dec.emb"][ids] + w["dec.pos"][:t])[None]  # (1, T, d)
        s = int(self.cross_len[row])
        for li in range(self.layers):
            p = f"dec.{li}"
            y = self._ln(x, p + ".ln_self")
            q, k, v = self._split(self._lin(y, p + ".qkv")).chunk(3, dim=-3)
            self.self_k[li, row, :, :t] = k[0]
            self.self_v[li, row, :, :t] = v[0]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self._lin(self._merge(o), p + ".out_self")
            y = self._ln(x, p + ".ln_cross")
            q = self._split(self._lin(y, p + ".q_cross"))
            ck = self.cross_k[li, row : row + 1, :, :s]
            cv = self.cross_v[li, row : row + 1, :, :s]
            o = F.scaled_dot_product_attention(q, ck, cv)
            x = x + self._lin(self._merge(o), p + ".out_cross")
            x = self._ffn(x, p)
        if logits_at is None:
            return None
        return self._logits(x[0, logits_at : logits_at + 1])

    @torch.no_grad()
    def copy_rows(self, dst: list[int], src: list[int], length: int) -> None:
        """Copy rows' self cache (first ``length`` positions) and cross K/V (beam origins)."""
        d = torch.tensor(dst, device=self.device)
        s = torch.tensor(src, device=self.device)
        self.self_k[:, d, :, :length] = self.self_k[:, s, :, :length]
        self.self_v[:, d, :, :length] = self.self_v[:, s, :, :length]

    @torch.no_grad()
    def copy_memory(self, dst: list[int], src: int) -> None:
        """Give rows ``dst`` the cross K/V of row ``src`` (the rows of one utterance)."""
        d = torch.tensor(dst, device=self.device)
        self.cross_k[:, d] = self.cross_k[:, src : src + 1]
        self.cross_v[:, d] = self.cross_v[:, src : src + 1]
        self.cross_len[d] = int(self.cross_len[src])

    def _step(self, b: int, t_max: int, s_max: int) -> torch.Tensor:
        """One decode step over slots [0, b): ``tokens``/``positions`` in, (b, vocab) out."""
        w = self.w
        tok, pos = self.tokens[:b], self.positions[:b]
        rows = torch.arange(b, device=self.device)
        x = w["dec.emb"][tok] + w["dec.pos"][pos]  # (b, d)
        ar_t = torch.arange(t_max, device=self.device)
        self_mask = (ar_t[None, :] <= pos[:, None])[:, None, None, :]
        ar_s = torch.arange(s_max, device=self.device)
        cross_mask = (ar_s[None, :] < self.cross_len[:b, None])[:, None, None, :]
        for li in range(self.layers):
            p = f"dec.{li}"
            y = self._ln(x, p + ".ln_self")
            q, k, v = self._lin(y, p + ".qkv").reshape(b, 3, self.heads, self.d_head).unbind(1)
            self.self_k[li, rows, :, pos] = k
            self.self_v[li, rows, :, pos] = v
            o = F.scaled_dot_product_attention(
                q[:, :, None],
                self.self_k[li, :b, :, :t_max],
                self.self_v[li, :b, :, :t_max],
                attn_mask=self_mask,
            )
            x = x + self._lin(o.flatten(1), p + ".out_self")
            y = self._ln(x, p + ".ln_cross")
            q = self._lin(y, p + ".q_cross").reshape(b, self.heads, 1, self.d_head)
            o = F.scaled_dot_product_attention(
                q,
                self.cross_k[li, :b, :, :s_max],
                self.cross_v[li, :b, :, :s_max],
                attn_mask=cross_mask,
            )
            x = x + self._lin(o.flatten(1), p + ".out_cross")
            x = self._ffn(x, p)
        return self._logits(x)

    def bucket(self, live_slots: int) -> int:
        """The batch a step over slots [0, live_slots) runs at (a graph bucket on CUDA)."""
        if not self.graphs_enabled:
            return live_slots
        for b in GRAPH_BUCKETS:
            if b >= live_slots and b <= self.max_rows:
                return b
        return live_slots

    @torch.no_grad()
    def step(self, live_slots: int, longest: int, frames: int) -> torch.Tensor:
        """One decode step for slots [0, live_slots); returns (live_slots, vocab) float32 logits.

        ``tokens`` and ``positions`` hold each slot's input token and position. ``longest`` is
        the largest position + 1 and ``frames`` the longest cross length among live rows; eager
        steps attend only that far, a captured graph always attends the full cache.
        """
        b = self.bucket(live_slots)
        if self.graphs_enabled and b in GRAPH_BUCKETS:
            g = self._graphs.get(b)
            if g is None:
                g = self._capture(b)
            g.graph.replay()
            return g.logits[:live_slots]
        return self._step(b, min(MAX_POSITIONS, longest), frames)[:live_slots]

    def _capture(self, b: int) -> _Graph:
        """Capture the full-size step at bucket ``b`` (after a warm-up run on a side stream)."""
        t, s = MAX_POSITIONS, int(self.cross_k.shape[3])
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        # Warm-up writes K/V at the slots' current positions; a slot in use is rewritten
        # with the same values by the replay that follows, an unused one is never read.
        with torch.cuda.stream(side):
            self._step(b, t, s)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            logits = self._step(b, t, s)
        self._graph_pool = graph.pool()
        out = _Graph(graph, logits)
        self._graphs[b] = out
        return out

    @torch.no_grad()
    def detect_language(self, memory: torch.Tensor, sot: int, lang_ids: list[int]) -> torch.Tensor:
        """Language probabilities (batch, len(lang_ids)) from one step after ``<|sot|>``.

        Softmax over the language tokens only (CTranslate2's and Whisper's rule).
        """
        w = self.w
        mem = memory.to(self.device, self.dtype)
        x = (w["dec.emb"][sot] + w["dec.pos"][0])[None, None].expand(mem.shape[0], 1, -1)
        for li in range(self.layers):
            p = f"dec.{li}"
            y = self._ln(x, p + ".ln_self")
            _, _, v = self._split(self._lin(y, p + ".qkv")).chunk(3, dim=-3)
            x = x + self._lin(self._merge(v), p + ".out_self")  # one position: softmax = 1
            y = self._ln(x, p + ".ln_cross")
            q = self._split(self._lin(y, p + ".q_cross"))
            k, v2 = self._split(self._lin(mem, p + ".kv_cross")).chunk(2, dim=-3)
            x = x + self._lin(
                self._merge(F.scaled_dot_product_attention(q, k, v2)), p + ".out_cross"
            )
            x = self._ffn(x, p)
        logits = self._logits(x[:, 0])[:, lang_ids]
        return torch.softmax(logits, dim=-1)

    @torch.no_grad()
    def cross_attention(
        self, memory: torch.Tensor, tokens: list[int], heads: list[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced decoder pass: (logits (T, vocab), cross-attention scores of ``heads``).

        The scores are the pre-softmax ``q.k / sqrt(d_head)`` (len(heads), T, frames) of the
        alignment heads, for word timing.
        """
        w = self.w
        t = len(tokens)
        mem = memory.to(self.device, self.dtype)[None]
        ids = torch.tensor(tokens, device=self.device)
        x = (w["dec.emb"][ids] + w["dec.pos"][:t])[None]
        scores: dict[tuple[int, int], torch.Tensor] = {}
        wanted = {layer for layer, _ in heads}
        for li in range(self.layers):
            p = f"dec.{li}"
            y = self._ln(x, p + ".ln_self")
            q, k, v = self._split(self._lin(y, p + ".qkv")).chunk(3, dim=-3)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self._lin(self._merge(o), p + ".out_self")
            y = self._ln(x, p + ".ln_cross")
            q = self._split(self._lin(y, p + ".q_cross"))
            k, v = self._split(self._lin(mem, p + ".kv_cross")).chunk(2, dim=-3)
            if li in wanted:
                qk = (q.float() @ k.float().transpose(-1, -2)) / (self.d_head**0.5)
                for layer, head in heads:
                    if layer == li:
                        scores[(layer, head)] = qk[0, head]
            o = F.scaled_dot_product_attention(q, k, v)
            x = x + self._lin(self._merge(o), p + ".out_cross")
            x = self._ffn(x, p)
        return self._logits(x[0]), torch.stack([scores[h] for h in heads])
