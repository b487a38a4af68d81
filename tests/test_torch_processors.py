"""The batched logits processors (voxgate.engines.asr._torch.processors) against the NumPy ones.

Each rule of voxgate.engines.asr._processors / _phrases is the specification: on the same logits and
the same token histories, :class:`BatchedProcessors` (all items' rows in one pass, per-row
parameters) must leave exactly the logits the NumPy rules leave, item by item. A toy
vocabulary as in test_logits_processors.py: ids 0-9 text, 10 <|endoftext|>, 11
<|notimestamps|>, 12.. timestamps (20 ms each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from voxgate.engines.asr._phrases import PhraseBoost, PhraseTree
from voxgate.engines.asr._processors import (
    HallucinationBias,
    RepetitionPenalty,
    SilenceAwareEnd,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
)
from voxgate.engines.asr._torch.processors import BatchedProcessors

pytestmark = pytest.mark.unit

EOT, NO_TS, TS0 = 10, 11, 12
VOCAB = 12 + 200
#: Toy "BPE": each word of a phrase is its own token(s).
WORDS = {" vox": (3,), " gate": (4,), " Vox": (5,), " Ki": (6,), " ra": (7,), " K": (8,)}


def encode(text: str) -> list[int]:
    out: list[int] = []
    for w in text.split(" ")[1:]:
        out.extend(WORDS.get(" " + w, (9,)))
    return out


def tree(*phrases: tuple[str, float]) -> PhraseTree:
    return PhraseTree(list(phrases), encode)


#: Item builders: one item's processors from a seed (parameters differ per item).
Builder = Callable[[int], list[object]]
BUILDERS: dict[str, Builder] = {
    "repetition": lambda i: [RepetitionPenalty(1.0 + 0.5 * (i + 1))],
    "suppress": lambda i: [SuppressTokens.of([1 + i, 7, TS0 + 3 * i])],
    "blank": lambda i: [SuppressBlank((0, EOT) if i % 2 else (2, EOT))],
    "phrase": lambda i: [
        PhraseBoost(tree(("vox gate", 4.0 + i), ("Ki ra", 6.0)), EOT, floor=-8.0 - i)
    ],
    "silence": lambda i: [
        SilenceAwareEnd(EOT, TS0, 600 + 400 * i, ((0, 100), (1200, 2600), (3000, 4000)))
    ],
    "timestamps": lambda i: [TimestampRules(EOT, NO_TS, TS0, VOCAB - 1, TS0 + 20 + 10 * i)],
    "hallucination": lambda i: [HallucinationBias(np.array([2, 5 + i], np.int64), 3.0 * i, TS0)],
}


def histories(rng: np.random.Generator, rows: int, length: int) -> list[list[int]]:
    """Token histories that hit the rules: phrase prefixes, timestamp pairs, repeats."""
    pool = [3, 4, 5, 6, 7, 8, 1, 2, TS0, TS0 + 5, TS0 + 40, TS0 + 90, TS0 + 150]
    out = []
    for _ in range(rows):
        seq = [int(rng.choice(pool)) for _ in range(length)]
        out.append(seq)
    return out


def run_both(
    items: Sequence[tuple[list[object], list[list[int]]]],
    seed: int,
    late: dict[int, list[object]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply each item's rules with NumPy (per item) and batched (one pass).

    Returns the batched result, the NumPy result and the logits before either.
    """
    rng = np.random.default_rng(seed)
    total = sum(len(seqs) for _, seqs in items)
    logits = (rng.standard_normal((total, VOCAB)) * 3.0).astype(np.float32)
    ref = logits.copy()
    bp = BatchedProcessors(
        VOCAB, eot=EOT, no_timestamps=NO_TS, begin=TS0, device=torch.device("cpu")
    )
    # Slots deliberately not in item order, with a gap: rows live wherever they were put.
    order = rng.permutation(total + 3)[:total]
    live: list[int] = []
    a = 0
    for uid, (procs, seqs) in enumerate(items):
        n = len(seqs)
        slots = [int(s) for s in order[a : a + n]]
        bp.set_rows(slots, uid, procs)
        for t in range(len(seqs[0])):
            bp.advance(slots, torch.tensor([s[t] for s in seqs]))
        if late and uid in late:
            bp.add_processors(slots, uid, late[uid])
        part = ref[a : a + n]
        for p in [*procs, *(late or {}).get(uid, [])]:
            p.apply(len(seqs[0]), part, seqs)  # type: ignore[attr-defined]
        live += slots
        a += n
    got = torch.from_numpy(logits.copy())
    bp.apply(live, got)
    return got.numpy(), ref, logits


def assert_same(got: np.ndarray, ref: np.ndarray) -> None:
    assert np.array_equal(np.isneginf(got), np.isneginf(ref))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("length", [0, 1, 2, 5])
def test_each_rule_equals_the_numpy_rule(kind: str, length: int) -> None:
    rng = np.random.default_rng(length)
    items = [(BUILDERS[kind](i), histories(rng, 1 + i % 3, length)) for i in range(4)]
    got, ref, before = run_both(items, seed=17 + length)
    always = kind in ("suppress", "silence", "timestamps")
    if always or (kind == "blank" and length == 0) or (kind == "repetition" and length > 0):
        assert not np.array_equal(ref, before)  # the comparison is not vacuous
    assert_same(got, ref)


def test_the_whole_chain_with_a_late_rule_equals_numpy() -> None:
    """Every rule in the gateway's order, items of different ages and parameters in one pass."""
    rng = np.random.default_rng(3)
    items = []
    late: dict[int, list[object]] = {}
    for i in range(5):
        procs: list[object] = []
        for kind in ("repetition", "suppress", "blank", "phrase", "silence", "timestamps"):
            if (i + len(kind)) % 3:  # each item its own subset
                procs += BUILDERS[kind](i)
        items.append((procs, histories(rng, 1 + i % 2, i)))
        if i % 2:
            late[i] = BUILDERS["hallucination"](i)
    got, ref, before = run_both(items, seed=5, late=late)
    assert not np.array_equal(ref, before)
    assert_same(got, ref)


def test_a_rule_changes_the_logits_it_should() -> None:
    """The comparison is not vacuous: with a phrase in progress the boost moves its token."""
    got, ref, before = run_both([(BUILDERS["phrase"](0), [[1, 3]])], seed=1)
    assert got[0, 4] > before[0, 4]  # " gate" continues " vox"
    assert_same(got, ref)


def test_beam_reordering_moves_the_row_state() -> None:
    """After copy_rows each row applies the rules to its origin's history."""
    procs: list[object] = [
        RepetitionPenalty(2.0),
        *BUILDERS["phrase"](1),
        *BUILDERS["timestamps"](1),
    ]
    seqs = [[3, TS0 + 5], [6, 7], [1, TS0 + 40]]
    bp = BatchedProcessors(
        VOCAB, eot=EOT, no_timestamps=NO_TS, begin=TS0, device=torch.device("cpu")
    )
    bp.set_rows([0, 1, 2], 0, procs)
    for t in range(2):
        bp.advance([0, 1, 2], torch.tensor([s[t] for s in seqs]))
    bp.copy_rows([0, 1, 2], [2, 2, 0])  # rows become (origin 2, origin 2, origin 0)
    logits = (np.random.default_rng(9).standard_normal((3, VOCAB)) * 3).astype(np.float32)
    ref = logits.copy()
    reordered = [seqs[2], seqs[2], seqs[0]]
    for p in procs:
        p.apply(2, ref, reordered)  # type: ignore[attr-defined]
    got = torch.from_numpy(logits.copy())
    bp.apply([0, 1, 2], got)
    assert_same(got.numpy(), ref)


def test_rows_that_left_carry_no_rule() -> None:
    bp = BatchedProcessors(
        VOCAB, eot=EOT, no_timestamps=NO_TS, begin=TS0, device=torch.device("cpu")
    )
    bp.set_rows([0], 0, [SuppressTokens.of([1, 2]), *BUILDERS["phrase"](0)])
    bp.clear_rows([0])
    x = torch.zeros(1, VOCAB)
    bp.apply([0], x)
    assert bool((x == 0).all())


def test_processors_out_of_order_are_refused() -> None:
    bp = BatchedProcessors(
        VOCAB, eot=EOT, no_timestamps=NO_TS, begin=TS0, device=torch.device("cpu")
    )
    with pytest.raises(ValueError, match="order"):
        bp.set_rows([0], 0, [SuppressBlank((0,)), SuppressTokens.of([1])])
    with pytest.raises(ValueError, match="model's"):
        bp.set_rows([0], 0, [TimestampRules(EOT + 1, NO_TS, TS0, VOCAB - 1, TS0 + 50)])


@pytest.mark.parametrize("boost", [2.0, 6.0])
def test_phrase_starts_continuations_and_said_phrases_equal_numpy(boost: float) -> None:
    """Phrase tokens made plausible (so every branch of the boost acts): starts at the start
    fraction, continuations of both spellings, and no new start of a phrase already said."""
    proc = PhraseBoost(tree(("vox gate", boost), ("Ki ra", 4.0)), EOT)
    seqs = [[], [3], [3, 4], [5], [6], [3, 4, 1, 3], [TS0, 6, TS0 + 5]]
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((len(seqs), VOCAB)).astype(np.float32)
    logits[:, 3:9] += np.float32(8.0)
    bp = BatchedProcessors(
        VOCAB, eot=EOT, no_timestamps=NO_TS, begin=TS0, device=torch.device("cpu")
    )
    ref = logits.copy()
    got = torch.from_numpy(logits.copy())
    for slot, seq in enumerate(seqs):
        bp.set_rows([slot], slot, [proc])
        for t in seq:
            bp.advance([slot], torch.tensor([t]))
        proc.apply(len(seq), ref[slot : slot + 1], [seq])
    bp.apply(list(range(len(seqs))), got)
    assert not np.array_equal(ref, logits)
    assert ref[2, 3] == logits[2, 3]  # "vox gate" said: " vox" starts nothing any more
    assert_same(got.numpy(), ref)
