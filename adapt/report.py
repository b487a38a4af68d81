"""The adaptation report: what was trained, the loss curve, and before/after scores per set.

``write_report`` writes three files into the output directory:

- ``report.md``: the run's facts, a before/after table per evaluation set (WER, domain-term
  recall), per-term recall, the clips whose WER moved most, and the loss curve;
- ``loss.png``: training (and held-out) loss per step, drawn with matplotlib's Agg canvas
  (no display, no pyplot global state, so it is safe from any thread);
- ``report.json``: the same numbers for scripts and CI.

Transcripts are not written: the held-out clips are the user's own calls, and a report gets
passed around. Clips are named by their origin (file, manifest line or phrase number) only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from voxgate.adapt.evaluate import Scores

__all__ = ["write_report"]

#: Clips listed under "largest changes".
_TOP_CHANGES = 10


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f} %"


def _points(before: float, after: float) -> str:
    if math.isnan(before) or math.isnan(after):
        return "n/a"
    return f"{100 * (after - before):+.1f}"


def _plot(
    path: Path, losses: Sequence[tuple[int, float]], held: Sequence[tuple[int, float]]
) -> None:
    fig = Figure(figsize=(7.0, 3.6), dpi=110)
    ax = fig.subplots()
    ax.plot([s for s, _ in losses], [v for _, v in losses], lw=1.2, label="training")
    if held:
        ax.plot([s for s, _ in held], [v for _, v in held], "o-", lw=1.2, label="held out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def _summary(s: Scores) -> dict[str, Any]:
    return {
        "clips": len(s.per_item),
        "words": s.n_words,
        "wer": s.wer,
        "term_recall": None if math.isnan(s.term_recall) else s.term_recall,
        "terms_said": s.n_terms,
        "by_term": {t: list(v) for t, v in sorted(s.recall_by_term().items())},
    }


def write_report(
    out_dir: Path,
    *,
    losses: Sequence[tuple[int, float]],
    scores_before: Mapping[str, Scores],
    scores_after: Mapping[str, Scores],
    meta: Mapping[str, object],
    held_out_losses: Sequence[tuple[int, float]] = (),
) -> Path:
    """Write ``report.md``, ``loss.png`` and ``report.json`` into ``out_dir``.

    Args:
        out_dir: where to write (created if missing).
        losses: (step, training loss) in step order.
        scores_before: the base model's scores per evaluation set name.
        scores_after: the adapted model's scores, with the same set names.
        meta: facts of the run shown as a table (name, base, steps, rank, data, timing ...).
        held_out_losses: (step, held-out loss) where measured.

    Returns:
        The path of ``report.md``.

    Raises:
        ValueError: the two score mappings name different sets, or a set's clips differ.
    """
    if list(scores_before) != list(scores_after):
        raise ValueError(
            f"before/after sets differ: {sorted(scores_before)} vs {sorted(scores_after)}"
        )
    for name, before in scores_before.items():
        after = scores_after[name]
        if [i.origin for i in before.per_item] != [i.origin for i in after.per_item]:
            raise ValueError(f"set {name!r}: before and after scored different clips")
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# Adaptation report: {meta.get('name', 'model')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta.items()]
    lines += ["", "## Before and after", ""]
    lines += [
        "WER in percent of reference words after normalisation; a domain term counts when its "
        "words appear in the transcript. Transcribed by the serving engine with the gateway's "
        "default decoding.",
        "",
        "| set | clips | words | WER before | WER after | change (points) "
        "| term recall before | term recall after | terms said |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, b in scores_before.items():
        a = scores_after[name]
        lines.append(
            f"| {name} | {len(b.per_item)} | {b.n_words} | {_pct(b.wer)} | {_pct(a.wer)} "
            f"| {_points(b.wer, a.wer)} | {_pct(b.term_recall)} | {_pct(a.term_recall)} "
            f"| {b.n_terms} |"
        )
    for name, b in scores_before.items():
        a = scores_after[name]
        if not b.n_terms:
            continue
        before_terms, after_terms = b.recall_by_term(), a.recall_by_term()
        lines += ["", f"### Domain terms: {name}", "", "| term | said | before | after |"]
        lines.append("|---|---:|---:|---:|")
        for term, (hit, said) in sorted(before_terms.items()):
            lines.append(f"| {term} | {said} | {hit} | {after_terms.get(term, (0, said))[0]} |")
    lines += ["", "## Largest changes per clip", ""]
    lines += ["| set | clip | WER before | WER after |", "|---|---|---:|---:|"]
    changes = [
        (abs(ai.wer - bi.wer), name, bi.origin, bi.wer, ai.wer)
        for name, b in scores_before.items()
        for bi, ai in zip(b.per_item, scores_after[name].per_item, strict=True)
        if ai.edits != bi.edits
    ]
    changes.sort(key=lambda c: (-c[0], c[1], c[2]))
    if not changes:
        lines.append("| (no clip changed) | | | |")
    for _, name, origin, wb, wa in changes[:_TOP_CHANGES]:
        lines.append(f"| {name} | {origin} | {_pct(wb)} | {_pct(wa)} |")
    lines += ["", "## Training loss", ""]
    if losses:
        _plot(out_dir / "loss.png", losses, held_out_losses)
        first, last = losses[0], losses[-1]
        lines.append(
            f"Step {first[0]}: {first[1]:.3f}; step {last[0]}: {last[1]:.3f}"
            + (f"; held out at step {held_out_losses[-1][0]}: {held_out_losses[-1][1]:.3f}"
               if held_out_losses else "")
            + "."
        )  # fmt: skip
        lines += ["", "![loss per step](loss.png)"]
    else:
        lines.append("No training steps were recorded.")
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    numbers = {
        "meta": {
            k: v if isinstance(v, str | int | float | bool) else str(v) for k, v in meta.items()
        },
        "losses": [list(x) for x in losses],
        "held_out_losses": [list(x) for x in held_out_losses],
        "before": {k: _summary(v) for k, v in scores_before.items()},
        "after": {k: _summary(v) for k, v in scores_after.items()},
    }
    (out_dir / "report.json").write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    return path
