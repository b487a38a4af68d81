"""The text a Pipecat bot's LLM reads for each user turn, with voxgate's smart turns.

    .venv/bin/python -m benchmarks.pipecat_turns [--clips 40] [--sets real,pauses] [--target T]

One real server on the default configuration (bundled models) from this environment; then,
in the Pipecat environment (clients/setup-venvs.sh), a worker plays each clip of
benchmarks/turn_taking's sets (the shared clips, and the same clips with a 0.3-1.5 s pause
spliced into a sentence) at real time through the voxgate STT service with
``turn_detection="smart"`` and Pipecat's own ``LLMUserAggregator``. Per set, the mean word
error rate of each call's text, read three ways from the same calls:

- ``llm``: the user messages the aggregator wrote to the LLM context, joined;
- ``end_of_turn``: the server's EndOfTurn texts, joined (the service's ``on_end_of_turn``);
- ``finals``: the turns' finals, joined: what the aggregator got before 2026-12-06, when the
  service pushed each final as a ``TranscriptionFrame``.

Also the user messages per call against the EndOfTurn events (one message per turn).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import wave
from pathlib import Path
from typing import Any

from benchmarks._wer import wer
from benchmarks.framework_latency import SPEECH, run_venv_script, server
from benchmarks.turn_taking import RATE_HZ, load_items


def run_worker(target: str, paths: list[str]) -> list[dict[str, Any]]:
    args = ["--target", target, "--clips", *paths]
    lines = run_venv_script(".venv-pipecat", "pipecat_turns_worker.py", args, timeout=7200)
    return [json.loads(line) for line in lines if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=40, help="shared clips (JFK first)")
    ap.add_argument("--sets", default="real,pauses", help="real, pauses or both")
    ap.add_argument("--json", type=Path, help="write the per-call rows here")
    ap.add_argument("--target", help="a running server (default: start one, default config)")
    args = ap.parse_args()
    real, paused = load_items(SPEECH, args.clips)
    sets = {"real": real, "pauses": paused}
    chosen = [s for s in args.sets.split(",") if s]
    rows: list[dict[str, Any]] = []
    # The default configuration (config_yaml ""): the text a user's bot gets.
    with tempfile.TemporaryDirectory() as tmp, server(args.target, config_yaml="") as target:
        for name in chosen:
            items = sets[name]
            paths = []
            for i, item in enumerate(items):
                path = Path(tmp) / f"{name}-{i:03d}.wav"
                with wave.open(str(path), "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(RATE_HZ)
                    w.writeframes(item.pcm.tobytes())
                paths.append(str(path))
            for item, row in zip(items, run_worker(target, paths), strict=True):
                rows.append(
                    {
                        "set": name,
                        "name": item.name,
                        **row,
                        "wer_llm": wer(item.text, " ".join(row["messages"])),
                        "wer_end_of_turn": wer(item.text, " ".join(row["turn_texts"])),
                        "wer_finals": wer(item.text, " ".join(row["finals"])),
                    }
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("set      calls   WER llm  end_of_turn   finals   messages/turns")
    for name in chosen:
        sel = [r for r in rows if r["set"] == name]
        n = len(sel)
        mean = {k: sum(r[k] for r in sel) / n for k in ("wer_llm", "wer_end_of_turn", "wer_finals")}
        msgs = sum(len(r["messages"]) for r in sel)
        turns = sum(len(r["turn_texts"]) for r in sel)
        print(
            f"{name:<8} {n:>5}   {mean['wer_llm']:.4f}   {mean['wer_end_of_turn']:.4f}"
            f"     {mean['wer_finals']:.4f}   {msgs}/{turns}"
        )


if __name__ == "__main__":
    main()
