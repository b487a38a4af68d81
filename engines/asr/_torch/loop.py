"""Greedy, sampling and beam search over :class:`WhisperTorchModel`, one step at a time.

The same contract and search as :class:`voxgate.engines.asr._decode.DecodeLoop` (CTranslate2 4.x's
search, so that with Whisper's own rules the tokens are ``generate``'s): ``add`` runs an
item's prompt into free row slots of the static cache and the item joins the next step;
``step`` decodes every live row of every item in one batched model call, applies every item's
logits processors in one batched pass (:class:`BatchedProcessors`) and chooses tokens; an item
leaves on the step it finishes (``result`` set) or when ``abort``-ed, and its slots are free for
the next joiner. The engine's scheduler (the gateway's batcher) decides who joins; the loop only
adds, steps and aborts.

Per step the host reads back the chosen tokens and their log-probabilities (one transfer for
greedy rows, one for the beam candidates): the host keeps each row's sequence, which results
and the finishing rules need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from voxgate.engines.asr._decode import (
    MAX_POSITIONS,
    DecodeItem,
    DecodeResult,
    LogitsProcessor,
    ranked_result,
    run_to_end,
)
from voxgate.engines.asr._torch.model import DeviceMemory, WhisperTorchModel
from voxgate.engines.asr._torch.processors import BatchedProcessors

__all__ = ["TorchDecodeLoop"]


@dataclass(slots=True)
class _Live:
    item: DecodeItem
    uid: int
    slots: list[int]  # reserved row slots; the first ``len(seqs)`` are live, in order
    seqs: list[list[int]]
    cum: list[float]
    no_speech: float
    pos: int  # position of the next input token (same for every row of the item)
    frames: int  # encoder positions of its memory
    late_done: bool
    gen: torch.Generator | None
    step: int = 0
    finished: list[tuple[float, list[int]]] = field(default_factory=list)

    @property
    def live_slots(self) -> list[int]:
        return self.slots[: len(self.seqs)]


def _ready(item: DecodeItem) -> bool:
    memory = item.memory
    return not isinstance(memory, DeviceMemory) or memory.is_ready()


class TorchDecodeLoop:
    """Iteration-level batched Whisper decoding on a static per-row cache.

    Threading: not thread-safe; one worker owns a loop (and its model's cache: two loops over
    one :class:`WhisperTorchModel` must not be open at once).

    Args:
        model: the model and its cache.
        sot / eot / no_timestamps / no_speech: special tokens; ``begin`` is the first
            timestamp token (``no_timestamps + 1``).
    """

    def __init__(
        self,
        model: WhisperTorchModel,
        *,
        sot: int,
        eot: int,
        no_timestamps: int,
        no_speech: int,
    ) -> None:
        self.model = model
        self.sot, self.eot, self.no_timestamps, self.no_speech = sot, eot, no_timestamps, no_speech
        self.procs = BatchedProcessors(
            model.vocab_size,
            eot=eot,
            no_timestamps=no_timestamps,
            begin=no_timestamps + 1,
            device=model.device,
        )
        self._live: list[_Live] = []
        #: Items whose encoder output is still being computed on the encoder stream.
        self._pending: list[DecodeItem] = []
        self._free: list[int] = []
        self._next_slot = 0
        self._uid = 0
        #: Decode steps run and rows stepped (for benchmarks).
        self.steps = 0
        self.rows = 0

    @property
    def active(self) -> int:
        """Items still decoding (or waiting for their encoder output to join)."""
        return len(self._live) + len(self._pending)

    # ------------------------------------------------------------------ slots

    def _take(self, n: int) -> list[int]:
        self._free.sort()
        out = self._free[:n]
        self._free = self._free[n:]
        while len(out) < n:
            out.append(self._next_slot)
            self._next_slot += 1
        return out

    def _release(self, lv: _Live) -> None:
        self.procs.clear_rows(lv.slots)
        self._free.extend(lv.slots)

    # ------------------------------------------------------------------ add / abort

    def _prompt_length(self, prompt: Sequence[int]) -> int:
        i = list(prompt).index(self.sot)
        while i < len(prompt) and self.sot <= prompt[i] <= self.no_timestamps:
            i += 1
        return i

    def add(self, item: DecodeItem) -> None:
        """Run ``item``'s prompt into free slots; it joins the next step.

        An item whose encoder output is still being computed (CUDA: the encoder runs on its
        own stream) waits beside the batch and joins the first step after its encode is done,
        so the steps of the rows already decoding do not queue behind that encode.
        """
        memory = item.memory
        if isinstance(memory, DeviceMemory) and self._live and not memory.is_ready():
            self._pending.append(item)
            return
        self._add_now(item)

    def _add_now(self, item: DecodeItem) -> None:
        prompt = list(item.prompt)
        if self.sot not in prompt:
            raise ValueError("the prompt has no <|startoftranscript|>")
        plen = self._prompt_length(prompt)
        if plen != len(prompt):
            raise ValueError("text after the task tokens (a forced prefix) is not supported")
        sot_index = prompt.index(self.sot)
        steps = max(1, min(item.max_length, MAX_POSITIONS - (plen - 1)))
        item.max_length = steps
        sampling = item.temperature > 0.0 and item.beam_size == 1
        rows = item.num_hypotheses if sampling else 1
        reserve = item.beam_size if item.beam_size > 1 else rows
        slots = self._take(reserve)
        m = self.model
        memory = item.memory
        if isinstance(memory, DeviceMemory):
            mem = memory.wait()
        elif isinstance(memory, torch.Tensor):
            mem = memory
        else:
            mem = torch.from_numpy(np.asarray(memory, dtype=np.float32))
        m.ensure(max(slots) + 1, int(mem.shape[0]))
        m.set_memory(slots[:1], mem)
        no_speech = float("nan")
        if plen > 1:
            at = sot_index if sot_index != plen - 1 else None
            logits = m.prefill(slots[0], prompt[: plen - 1], at)
            if logits is not None:
                no_speech = float(torch.softmax(logits, dim=-1)[0, self.no_speech])
        if reserve > 1:
            m.copy_memory(slots[1:], slots[0])
            m.copy_rows(slots[1:], [slots[0]] * (reserve - 1), plen - 1)
        self._uid += 1
        self.procs.set_rows(slots, self._uid, list(item.processors))
        gen = None
        if item.temperature > 0.0:
            gen = torch.Generator(device=m.device)
            gen.manual_seed(item.seed)
        lv = _Live(
            item,
            self._uid,
            slots,
            [[] for _ in range(rows)],
            [0.0] * rows,
            no_speech,
            plen - 1,
            int(mem.shape[0]),
            item.late_processors is None,
            gen,
        )
        idx = torch.tensor(lv.live_slots, device=m.device)
        m.tokens[idx] = prompt[plen - 1]
        m.positions[idx] = plen - 1
        if not lv.late_done and not np.isnan(no_speech):
            self._late(lv)
        self._live.append(lv)

    def _late(self, lv: _Live) -> None:
        assert lv.item.late_processors is not None
        late: Sequence[LogitsProcessor] = lv.item.late_processors(lv.no_speech)
        if late:
            self.procs.add_processors(lv.slots, lv.uid, list(late))
        lv.late_done = True

    def abort(self, item: DecodeItem) -> bool:
        """Take ``item`` out of the batch (its ``result`` stays None); False if not in it."""
        if any(it is item for it in self._pending):
            self._pending = [it for it in self._pending if it is not item]
            return True
        for lv in self._live:
            if lv.item is item:
                self._live = [x for x in self._live if x is not lv]
                self._release(lv)
                return True
        return False

    # ------------------------------------------------------------------ step

    def step(self) -> list[DecodeItem]:
        """One decode step for every live item; returns the items that finished on it."""
        if self._pending:
            ready = [it for it in self._pending if not self._live or _ready(it)]
            self._pending = [it for it in self._pending if not any(it is r for r in ready)]
            for it in ready:
                self._add_now(it)
        if not self._live:
            return []
        m = self.model
        live = [s for lv in self._live for s in lv.live_slots]
        hi = max(live) + 1
        longest = max(lv.pos for lv in self._live) + 1
        frames = max(lv.frames for lv in self._live)
        logits = m.step(hi, longest, frames)
        idx = torch.tensor(live, device=m.device)
        x = logits[idx]
        self.steps += 1
        self.rows += len(live)
        # The no-speech probability of items whose prompt was only <|sot|> (read at step 0).
        a = 0
        for lv in self._live:
            n = len(lv.seqs)
            if lv.step == 0 and np.isnan(lv.no_speech):
                lv.no_speech = float(torch.softmax(x[a : a + 1], dim=-1)[0, self.no_speech])
            if not lv.late_done:
                self._late(lv)
            a += n
        self.procs.apply(live, x)
        lp = torch.log_softmax(x, dim=-1)
        # Greedy and sampled rows: one choice per row; beams: 2 * beam candidates per item.
        choice = torch.argmax(lp, dim=-1)
        a = 0
        cand_parts: list[torch.Tensor] = []
        for lv in self._live:
            n = len(lv.seqs)
            if lv.gen is not None:
                probs = torch.softmax(lp[a : a + n] / float(np.float32(lv.item.temperature)), -1)
                choice[a : a + n] = torch.multinomial(probs, 1, generator=lv.gen)[:, 0]
            elif lv.item.beam_size > 1:
                cum = torch.tensor(lv.cum, dtype=torch.float32, device=m.device)
                total = (lp[a : a + n] + cum[:, None]).reshape(-1)
                val, pos = torch.topk(total, 2 * lv.item.beam_size)
                cand_parts += [val, pos.float()]
            a += n
        chosen_lp = lp.gather(1, choice[:, None])[:, 0]
        host = torch.cat([choice.float(), chosen_lp, *cand_parts]).cpu().numpy()
        nrows = len(live)
        toks = host[:nrows].astype(np.int64)
        tok_lp = host[nrows : 2 * nrows]
        cands = host[2 * nrows :]
        done: list[DecodeItem] = []
        keep: list[_Live] = []
        a = 0
        c = 0
        vocab = x.shape[1]
        for lv in self._live:
            n = len(lv.seqs)
            if lv.item.beam_size > 1:
                k = 2 * lv.item.beam_size
                scores = cands[c : c + k].tolist()
                flat = cands[c + k : c + 2 * k].astype(np.int64)
                c += 2 * k
                finished = self._beam(lv, scores, (flat % vocab).tolist(), (flat // vocab).tolist())
            else:
                finished = self._greedy(lv, toks[a : a + n].tolist(), tok_lp[a : a + n])
            lv.step += 1
            lv.pos += 1
            a += n
            if finished:
                done.append(lv.item)
                self._release(lv)
            else:
                keep.append(lv)
        self._live = keep
        return done

    def run(self, items: Sequence[DecodeItem]) -> list[DecodeResult]:
        """Decode ``items`` together to the end (all join at the first step)."""
        return run_to_end(self, items)

    # ------------------------------------------------------------------ search

    def _finish(self, lv: _Live, hyps: list[tuple[float, list[int]]], limit: int) -> None:
        lv.item.result = ranked_result(hyps, limit, lv.no_speech, lv.step + 1)

    def _set_inputs(self, slots: list[int], tokens: list[int], pos: int) -> None:
        m = self.model
        idx = torch.tensor(slots, device=m.device)
        m.tokens[idx] = torch.tensor(tokens, device=m.device)
        m.positions[idx] = pos

    def _greedy(self, lv: _Live, choice: list[int], lp: Any) -> bool:
        slots = lv.live_slots
        self.procs.advance(slots, torch.tensor(choice, device=self.model.device))
        last = lv.step + 1 >= lv.item.max_length
        alive = []
        for r, tok in enumerate(choice):
            lv.cum[r] += float(lp[r])
            if tok == self.eot or last:
                if tok != self.eot:
                    lv.seqs[r].append(tok)
                lv.finished.append((lv.cum[r], lv.seqs[r]))
            else:
                lv.seqs[r].append(tok)
                alive.append(r)
        if not alive:
            self._finish(lv, lv.finished, len(lv.finished))
            return True
        if len(alive) < len(choice):
            # Rows that ended free their slots (kept reserved for the item: it may not grow).
            kept = [slots[r] for r in alive]
            gone = [s for r, s in enumerate(slots) if r not in alive]
            self.procs.clear_rows(gone)
            lv.slots = kept + [s for s in lv.slots if s not in kept]
            lv.seqs = [lv.seqs[r] for r in alive]
            lv.cum = [lv.cum[r] for r in alive]
            choice = [choice[r] for r in alive]
        self._set_inputs(lv.live_slots, choice, lv.pos + 1)
        return False

    def _beam(self, lv: _Live, scores: list[float], toks: list[int], origins: list[int]) -> bool:
        beam = lv.item.beam_size
        ncand = 2 * beam
        last = lv.step + 1 >= lv.item.max_length
        active: list[int] = []
        secondary = beam
        for k in range(beam):
            chosen = k
            if toks[k] == self.eot or last:
                hyp = list(lv.seqs[origins[k]])
                if toks[k] != self.eot:
                    hyp.append(toks[k])
                lv.finished.append((scores[k], hyp))
                for j in range(secondary, ncand):
                    if toks[j] != self.eot:
                        chosen = j
                        secondary = j + 1
                        break
            active.append(chosen)
        if last or len(lv.finished) >= beam:
            self._finish(lv, lv.finished, lv.item.num_hypotheses)
            return True
        old = lv.live_slots
        src = [old[origins[j]] for j in active]
        dst = lv.slots[:beam]
        # Reorder the cache and the rule state by origin (gathered before written: no alias).
        self.model.copy_rows(dst, src, lv.pos + 1)
        if len(old) < beam:
            self.model.copy_memory(dst[len(old) :], old[0])
        self.procs.copy_rows(dst, src)
        new_toks = [toks[j] for j in active]
        self.procs.advance(dst, torch.tensor(new_toks, device=self.model.device))
        lv.seqs = [[*lv.seqs[origins[j]], toks[j]] for j in active]
        lv.cum = [scores[j] for j in active]
        self._set_inputs(dst, new_toks, lv.pos + 1)
        return False
