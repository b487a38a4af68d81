"""The NumPy loop's logits processors as batched tensor operations with per-row parameters.

:mod:`voxgate.engines.asr._processors` and :mod:`voxgate.engines.asr._phrases` define each rule as a
small object applied to one item's rows between steps (a Python call per item per step). Here one
:class:`BatchedProcessors` holds, per decode row, every rule's parameters as tensors (vLLM's
``logits_processor`` design: one object per batch, per-request arguments as tensors, updated
when rows join or leave) and applies all of them to all live rows in a fixed number of tensor
operations, whatever the batch size. The per-item objects stay the specification: an item's
processors are *compiled* into its rows' parameters (:meth:`BatchedProcessors.set_rows`), and
tests check that both give the same logits on the same inputs.

The rules run in one order, the order the gateway builds them in
(``WhisperEngine._loop_processors``): repetition penalty, suppress lists, suppress blank,
phrase boost, silence-aware end, timestamp rules, then the no-speech-aware hallucination bias.
An item whose processors come in another order is refused (the masks commute, but the phrase
boost and the timestamp rule read the row's log-probabilities, which the earlier rules set).

Row state the rules read (tokens so far, last timestamp, text tokens seen, a phrase tail) is
kept on the device and updated from the chosen tokens (:meth:`advance`); beam search reorders
it with the cache (:meth:`copy_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from voxgate.engines.asr._phrases import PhraseBoost
from voxgate.engines.asr._processors import (
    TIMESTAMP_MS,
    HallucinationBias,
    RepetitionPenalty,
    SilenceAwareEnd,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
)

__all__ = ["CANONICAL_ORDER", "MAX_PHRASE_TOKENS", "BatchedProcessors"]

#: The order the batched rules run in (and the order an item's processors must follow).
CANONICAL_ORDER: tuple[type, ...] = (
    RepetitionPenalty,
    SuppressTokens,
    SuppressBlank,
    PhraseBoost,
    SilenceAwareEnd,
    TimestampRules,
    HallucinationBias,
)
#: Longest boosted phrase spelling, in tokens (a row's phrase tail has this width).
MAX_PHRASE_TOKENS = 32
_NEG_INF = float("-inf")


@dataclass(slots=True)
class _PhraseEntries:
    """One item's phrase tree as flat entries (see :meth:`BatchedProcessors._phrase_entries`)."""

    starts: list[tuple[int, float, int]]  # (token, value, phrase index)
    conts: list[tuple[tuple[int, ...], int, float]]  # (prefix, next token, value)
    fulls: list[tuple[tuple[int, ...], int]]  # (whole spelling, phrase index)
    phrases: int


class BatchedProcessors:
    """Every logits rule for every decode row, as tensors indexed by row slot.

    Threading: not thread-safe; owned by one decode loop.

    Args:
        vocab: logits width.
        eot / no_timestamps / begin: the model's special tokens (``begin`` = first timestamp).
        device: where the parameters live (the logits' device).
    """

    def __init__(
        self, vocab: int, *, eot: int, no_timestamps: int, begin: int, device: torch.device
    ) -> None:
        self.vocab, self.eot, self.no_timestamps, self.begin = vocab, eot, no_timestamps, begin
        self.device = device
        self.rows = 0
        self._cols = torch.arange(vocab, device=device)
        self._uid = np.full(0, -1, np.int64)
        #: host-side flags per row: which rules apply (so unused rules cost nothing).
        self._on: dict[str, np.ndarray] = {}
        self._phrases: dict[int, _PhraseEntries] = {}
        self._tables_dirty = True
        self._grow(8)

    # ------------------------------------------------------------------ storage

    def _grow(self, rows: int) -> None:
        old = self.rows
        if rows <= old:
            return
        new = max(rows, 2 * old)
        dev, v = self.device, self.vocab

        def grow(t: torch.Tensor | None, fill: float | bool | int, *shape: int) -> torch.Tensor:
            dtype = (
                torch.bool
                if isinstance(fill, bool)
                else torch.long
                if isinstance(fill, int)
                else torch.float32
            )
            out = torch.full((new, *shape), fill, dtype=dtype, device=dev)
            if t is not None:
                out[:old] = t
            return out

        g = getattr
        self.suppress = grow(g(self, "suppress", None), False, v)
        self.blank = grow(g(self, "blank", None), False, v)
        self.silence = grow(g(self, "silence", None), False, v)
        self.hall_mask = grow(g(self, "hall_mask", None), False, v)
        self.seen = grow(g(self, "seen", None), False, v)
        self.rep = grow(g(self, "rep", None), 1.0)
        self.sil_limit = grow(g(self, "sil_limit", None), 1 << 30)
        self.sil_pen = grow(g(self, "sil_pen", None), 0.0)
        self.sil_boost = grow(g(self, "sil_boost", None), 0.0)
        self.max_initial = grow(g(self, "max_initial", None), v)
        self.hall_bias = grow(g(self, "hall_bias", None), 0.0)
        self.floor = grow(g(self, "floor", None), 0.0)
        self.start_floor = grow(g(self, "start_floor", None), 0.0)
        self.n_tok = grow(g(self, "n_tok", None), 0)
        self.n_text = grow(g(self, "n_text", None), 0)
        self.last = grow(g(self, "last", None), -1)
        self.penult = grow(g(self, "penult", None), -1)
        self.last_ts = grow(g(self, "last_ts", None), -1)
        self.tail = grow(g(self, "tail", None), -1, MAX_PHRASE_TOKENS)
        self.tail_n = grow(g(self, "tail_n", None), 0)
        self.row_uid = grow(g(self, "row_uid", None), -1)
        width = g(self, "contained", None)
        self.contained = grow(width, False, 1 if width is None else int(width.shape[1]))
        uid = np.full(new, -1, np.int64)
        uid[:old] = self._uid
        self._uid = uid
        for k, a in list(self._on.items()):
            b = np.zeros(new, bool)
            b[:old] = a
            self._on[k] = b
        self.rows = new

    def _flag(self, name: str) -> np.ndarray:
        if name not in self._on:
            self._on[name] = np.zeros(self.rows, bool)
        return self._on[name]

    # ------------------------------------------------------------------ rows join and leave

    def set_rows(self, rows: Sequence[int], uid: int, procs: Sequence[object]) -> None:
        """Compile one item's processors into the parameters of its rows (fresh row state).

        Raises:
            ValueError: a processor out of the canonical order, twice, of an unknown kind, or
                with special tokens other than the model's.
        """
        self._grow(max(rows) + 1)
        self.clear_rows(rows)
        idx = torch.tensor(list(rows), device=self.device)
        self._uid[list(rows)] = uid
        self.row_uid[idx] = uid
        self.add_processors(rows, uid, procs, fresh=True)

    def add_processors(
        self, rows: Sequence[int], uid: int, procs: Sequence[object], *, fresh: bool = False
    ) -> None:
        """Add (late) processors to rows already set; they must come after the existing ones."""
        idx = torch.tensor(list(rows), device=self.device)
        r = list(rows)
        kinds = [type(p) for p in procs]
        rank = []
        for k in kinds:
            if k not in CANONICAL_ORDER:
                raise ValueError(f"no batched form of the logits processor {k.__name__}")
            rank.append(CANONICAL_ORDER.index(k))
        if rank != sorted(rank) or len(set(rank)) != len(rank):
            names = [k.__name__ for k in kinds]
            raise ValueError(f"processors {names} are not in the batched order {CANONICAL_ORDER}")
        if not fresh:
            have = [i for i, k in enumerate(CANONICAL_ORDER) if self._flag(k.__name__)[r[0]]]
            if have and rank and min(rank) <= max(have):
                raise ValueError("late processors must follow every processor already set")
        for p in procs:
            self._flag(type(p).__name__)[r] = True
            if isinstance(p, RepetitionPenalty):
                self.rep[idx] = float(p.penalty)
            elif isinstance(p, SuppressTokens):
                self.suppress[idx] = False
                if len(p.ids):
                    self.suppress[idx[:, None], torch.as_tensor(p.ids, device=self.device)] = True
            elif isinstance(p, SuppressBlank):
                self.blank[idx[:, None], torch.tensor(list(p.ids), device=self.device)] = True
            elif isinstance(p, PhraseBoost):
                self._check_special(p.text_limit, self.eot, "PhraseBoost.text_limit")
                self.floor[idx] = float(p.floor)
                self.start_floor[idx] = float(p.start_floor)
                self._phrases[uid] = self._phrase_entries(p)
                self._tables_dirty = True
            elif isinstance(p, SilenceAwareEnd):
                self._check_special(p.eot, self.eot, "SilenceAwareEnd.eot")
                self._check_special(p.begin, self.begin, "SilenceAwareEnd.begin")
                n_ts = self.vocab - self.begin
                for a, b in p.silences:
                    if b - a < p.min_silence_ms:
                        continue
                    lo = max(0, (a + p.edge_ms) // TIMESTAMP_MS + 1)
                    hi = min(n_ts, (b - p.edge_ms) // TIMESTAMP_MS)
                    if hi > lo:
                        self.silence[idx, self.begin + lo : self.begin + hi] = True
                self.sil_limit[idx] = (p.speech_end_ms + p.grace_ms) // TIMESTAMP_MS
                self.sil_pen[idx] = float(np.float32(p.content_penalty))
                self.sil_boost[idx] = float(np.float32(p.eot_boost))
            elif isinstance(p, TimestampRules):
                self._check_special(p.eot, self.eot, "TimestampRules.eot")
                self._check_special(p.no_timestamps, self.no_timestamps, "no_timestamps")
                self._check_special(p.begin, self.begin, "TimestampRules.begin")
                self._check_special(p.end, self.vocab - 1, "TimestampRules.end")
                self.max_initial[idx] = p.max_initial
            elif isinstance(p, HallucinationBias):
                self._check_special(p.begin, self.begin, "HallucinationBias.begin")
                if len(p.ids):
                    ids = torch.as_tensor(p.ids, device=self.device)
                    self.hall_mask[idx[:, None], ids] = True
                self.hall_bias[idx] = float(np.float32(p.bias))

    @staticmethod
    def _check_special(got: int, want: int, what: str) -> None:
        if got != want:
            raise ValueError(f"{what}={got} but the model's is {want}")

    def clear_rows(self, rows: Sequence[int]) -> None:
        """Forget rows (their item left): no rule applies to them any more."""
        r = list(rows)
        idx = torch.tensor(r, device=self.device)
        for name in ("suppress", "blank", "silence", "hall_mask", "seen", "contained"):
            getattr(self, name)[idx] = False
        self.rep[idx] = 1.0
        self.sil_limit[idx] = 1 << 30
        self.hall_bias[idx] = 0.0
        self.max_initial[idx] = self.vocab
        for name in ("n_tok", "n_text", "tail_n"):
            getattr(self, name)[idx] = 0
        for name in ("last", "penult", "last_ts", "row_uid"):
            getattr(self, name)[idx] = -1
        self.tail[idx] = -1
        for flags in self._on.values():
            flags[r] = False
        uids = {int(u) for u in self._uid[r] if u >= 0}
        self._uid[r] = -1
        for u in uids:
            if u in self._phrases and not (self._uid == u).any():
                del self._phrases[u]
                self._tables_dirty = True

    def copy_rows(self, dst: Sequence[int], src: Sequence[int]) -> None:
        """Row ``dst[i]`` takes row ``src[i]``'s state and parameters (beam reordering)."""
        d = torch.tensor(list(dst), device=self.device)
        s = torch.tensor(list(src), device=self.device)
        for name in (
            "suppress", "blank", "silence", "hall_mask", "seen", "rep", "sil_limit", "sil_pen",
            "sil_boost", "max_initial", "hall_bias", "floor", "start_floor", "n_tok", "n_text",
            "last", "penult", "last_ts", "tail", "tail_n", "row_uid", "contained",
        ):  # fmt: skip
            t = getattr(self, name)
            t[d] = t[s]
        self._uid[list(dst)] = self._uid[list(src)]
        for flags in self._on.values():
            flags[list(dst)] = flags[list(src)]

    # ------------------------------------------------------------------ phrase tables

    @staticmethod
    def _phrase_entries(p: PhraseBoost) -> _PhraseEntries:
        """The tree as flat entries.

        Each spelling's first token (a start, skipped once the phrase is in the text), each
        proper prefix with the token that continues it, and each whole spelling (which marks
        the phrase as said).
        """
        starts: list[tuple[int, float, int]] = []
        conts: list[tuple[tuple[int, ...], int, float]] = []
        fulls: list[tuple[tuple[int, ...], int]] = []
        frac = p.tree.start_fraction
        for k, (boost, seqs) in enumerate(p.tree.phrases):
            for q in seqs:
                if len(q) > MAX_PHRASE_TOKENS:
                    raise ValueError(
                        f"a boosted phrase of {len(q)} tokens is longer than {MAX_PHRASE_TOKENS}"
                    )
                starts.append((q[0], boost * frac, k))
                conts.extend((q[:n], q[n], boost) for n in range(1, len(q)))
                fulls.append((q, k))
        return _PhraseEntries(starts, conts, fulls, len(p.tree.phrases))

    def _tables(self) -> None:
        if not self._tables_dirty:
            return
        dev = self.device
        starts: list[tuple[int, float, int, int]] = []
        conts: list[tuple[tuple[int, ...], int, float, int]] = []
        fulls: list[tuple[tuple[int, ...], int, int]] = []
        width = 1
        for uid, e in self._phrases.items():
            starts += [(t, v, k, uid) for t, v, k in e.starts]
            conts += [(q, t, v, uid) for q, t, v in e.conts]
            fulls += [(q, k, uid) for q, k in e.fulls]
            width = max(width, e.phrases)
        if width > self.contained.shape[1]:
            grown = torch.zeros(self.rows, width, dtype=torch.bool, device=dev)
            grown[:, : self.contained.shape[1]] = self.contained
            self.contained = grown

        def pattern(seqs: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
            pat = torch.full((len(seqs), MAX_PHRASE_TOKENS), -2, dtype=torch.long)
            for i, q in enumerate(seqs):
                pat[i, MAX_PHRASE_TOKENS - len(q) :] = torch.tensor(q)
            lens = torch.tensor([len(q) for q in seqs], dtype=torch.long)
            return pat.to(dev), lens.to(dev)

        def col(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        self._st_tok = col([s[0] for s in starts], torch.long)
        self._st_val = col([s[1] for s in starts], torch.float32)
        self._st_k = col([s[2] for s in starts], torch.long)
        self._st_uid = col([s[3] for s in starts], torch.long)
        self._ct_pat, self._ct_len = pattern([c[0] for c in conts])
        self._ct_next = col([c[1] for c in conts], torch.long)
        self._ct_val = col([c[2] for c in conts], torch.float32)
        self._ct_uid = col([c[3] for c in conts], torch.long)
        self._fu_pat, self._fu_len = pattern([f[0] for f in fulls])
        self._fu_k = col([f[1] for f in fulls], torch.long)
        self._fu_uid = col([f[2] for f in fulls], torch.long)
        self._tables_dirty = False

    def _match(
        self, idx: torch.Tensor, pat: torch.Tensor, lens: torch.Tensor, uid: torch.Tensor
    ) -> torch.Tensor:
        """(rows, entries): the row's text ends with the entry's pattern and it is the row's."""
        tail = self.tail[idx]
        valid = self._pos_valid(lens)
        eq = (tail[:, None, :] == pat[None]) | ~valid[None]
        return (
            eq.all(-1)
            & (self.tail_n[idx][:, None] >= lens[None])
            & (self.row_uid[idx][:, None] == uid[None])
        )

    def _pos_valid(self, lens: torch.Tensor) -> torch.Tensor:
        ar = torch.arange(MAX_PHRASE_TOKENS, device=self.device)
        return ar[None, :] >= (MAX_PHRASE_TOKENS - lens)[:, None]

    # ------------------------------------------------------------------ apply

    def _any(self, name: str, live: np.ndarray) -> bool:
        flags = self._on.get(name)
        return flags is not None and bool(flags[live].any())

    def apply(self, live: Sequence[int], logits: torch.Tensor) -> None:
        """Apply every rule to ``logits`` (len(live), vocab) float32 of rows ``live``, in place."""
        rows = np.asarray(live, np.int64)
        idx = torch.as_tensor(rows, device=self.device)
        x = logits
        if self._any("RepetitionPenalty", rows):
            p = self.rep[idx][:, None]
            seen = self.seen[idx]
            x.copy_(torch.where(seen, torch.where(x < 0, x * p, x / p), x))
        if self._any("SuppressTokens", rows):
            x.masked_fill_(self.suppress[idx], _NEG_INF)
        n_tok = self.n_tok[idx]
        first = n_tok == 0
        if self._any("SuppressBlank", rows):
            x.masked_fill_(self.blank[idx] & first[:, None], _NEG_INF)
        if self._any("PhraseBoost", rows):
            self._apply_phrases(idx, x)
        if self._any("SilenceAwareEnd", rows):
            x.masked_fill_(self.silence[idx], _NEG_INF)
            last_ts = self.last_ts[idx]
            push = (last_ts >= 0) & (last_ts - self.begin >= self.sil_limit[idx])
            pen = torch.where(push, self.sil_pen[idx], 0.0)
            x[:, : self.eot] -= pen[:, None]
            x[:, self.eot] += torch.where(push, self.sil_boost[idx], 0.0)
        if self._any("TimestampRules", rows):
            self._apply_timestamps(rows, idx, x, first)
        if self._any("HallucinationBias", rows):
            bias = torch.where(self.n_text[idx] == 0, self.hall_bias[idx], 0.0)
            on = self.hall_mask[idx] & (bias != 0.0)[:, None]
            x.sub_(torch.where(on, bias[:, None], 0.0))

    def _apply_phrases(self, idx: torch.Tensor, x: torch.Tensor) -> None:
        self._tables()
        n = x.shape[0]
        boost = torch.zeros(n, self.vocab, device=self.device)
        cont = torch.zeros(n, self.vocab, dtype=torch.bool, device=self.device)
        if len(self._st_tok):
            own = self.row_uid[idx][:, None] == self._st_uid[None]
            said = self.contained[idx][:, self._st_k]
            val = torch.where(own & ~said, self._st_val[None], 0.0)
            boost.scatter_reduce_(1, self._st_tok[None].expand(n, -1), val, "amax")
        if len(self._ct_next):
            m = self._match(idx, self._ct_pat, self._ct_len, self._ct_uid)
            val = torch.where(m, self._ct_val[None], 0.0)
            nxt = self._ct_next[None].expand(n, -1)
            boost.scatter_reduce_(1, nxt, val, "amax")
            hit = torch.zeros(n, self.vocab, device=self.device)
            hit.scatter_reduce_(1, nxt, m.float(), "amax")
            cont = hit > 0
        floors = torch.where(cont, self.floor[idx][:, None], self.start_floor[idx][:, None])
        m = x.max(dim=-1, keepdim=True).values
        lse = m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))
        ok = (boost > 0) & ((x - lse) >= floors)
        x.add_(torch.where(ok, boost, 0.0))

    def _apply_timestamps(
        self, rows: np.ndarray, idx: torch.Tensor, x: torch.Tensor, first: torch.Tensor
    ) -> None:
        on = torch.as_tensor(self._on["TimestampRules"][rows], device=self.device)
        b = self.begin
        cols = self._cols
        x[:, self.no_timestamps] = torch.where(on, _NEG_INF, x[:, self.no_timestamps])
        start = on & first
        # Step 0: a timestamp first, no later than max_initial.
        early = (cols[None, :] < b) | (cols[None, :] > self.max_initial[idx][:, None])
        x.masked_fill_(start[:, None] & early, _NEG_INF)
        later = on & ~first
        last, penult = self.last[idx], self.penult[idx]
        last_is_ts = later & (last >= b)
        pair = last_is_ts & (penult >= b)
        x.masked_fill_(pair[:, None] & (cols[None, :] >= b), _NEG_INF)
        x.masked_fill_((last_is_ts & ~pair)[:, None] & (cols[None, :] < self.eot), _NEG_INF)
        last_ts = self.last_ts[idx]
        back = later & (last_ts >= 0)
        x.masked_fill_(
            back[:, None] & (cols[None, :] >= b) & (cols[None, :] < last_ts[:, None]), _NEG_INF
        )
        check = later & ~pair
        lp = torch.log_softmax(x, dim=-1)
        ts_mass = torch.logsumexp(lp[:, b:], dim=-1)
        text_max = lp[:, :b].max(dim=-1).values
        force = check & (ts_mass > text_max)
        x.masked_fill_(force[:, None] & (cols[None, :] < b), _NEG_INF)

    # ------------------------------------------------------------------ state

    def advance(self, live: Sequence[int], tokens: torch.Tensor) -> None:
        """Record each live row's chosen token (before any beam reordering of the rows)."""
        idx = torch.as_tensor(np.asarray(live, np.int64), device=self.device)
        tok = tokens.to(self.device)
        self.seen[idx, tok] = True
        had = self.n_tok[idx] > 0
        self.penult[idx] = torch.where(had, self.last[idx], tok)
        self.last[idx] = tok
        self.n_tok[idx] += 1
        is_ts = tok >= self.begin
        self.last_ts[idx] = torch.where(is_ts, tok, self.last_ts[idx])
        self.n_text[idx] += (~is_ts).long()
        if not self._phrases:
            return
        text = tok < self.eot
        tail = self.tail[idx]
        shifted = torch.cat([tail[:, 1:], tok[:, None]], dim=1)
        self.tail[idx] = torch.where(text[:, None], shifted, tail)
        self.tail_n[idx] += text.long()
        self._tables()
        if len(self._fu_k):
            m = self._match(idx, self._fu_pat, self._fu_len, self._fu_uid) & text[:, None]
            r, k = m.nonzero(as_tuple=True)
            if len(r):
                self.contained[idx[r], self._fu_k[k]] = True
