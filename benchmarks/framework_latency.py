"""What the Pipecat service and the LiveKit plugin add to voxgate's latency.

    .venv/bin/python -m benchmarks.framework_latency [--clips 6]

One real server (bundled models) from this environment; then, in each framework's own
environment (clients/setup-venvs.sh), a worker streams the same recorded clips at ``--speed``
x real time through voxgate's own client and through the framework adapter, alternating clip
by clip, and synthesises the same sentences both ways. Per utterance it records, on the audio
clock (latency = arrival - the moment the covered audio was sent):

- first: the utterance's first transcript (interim or final);
- final: its final transcript;
- adapter: for the framework path, the final's arrival at the end of the framework's
  pipeline/stream minus its arrival in the client library underneath (the adapter's and the
  framework's own share, free of the server's noise; the issue asks < 10 ms at p95).

TTS: request -> first audio, directly (Synthesize) and inside the framework (TTSSpeakFrame ->
first TTSAudioRawFrame at the pipeline's end; TTS.stream() -> first SynthesizedAudio), and the
framework path's own share (its first frame minus the first chunk's arrival in the client
library underneath). The server's phrase cache is off, so neither path replays the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._stats import median, percentile
from voxgate_client.testing import SERVER_ENV, TARGET_ENV, LocalServer

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT.parent / "shared" / "data" / "speech"
WORKERS = {
    "pipecat": (".venv-pipecat", "framework_latency_pipecat.py"),
    "livekit": (".venv-livekit", "framework_latency_livekit.py"),
}
#: The default configuration with the TTS phrase cache off: the
#: two paths synthesise the same sentences, and the second must not be a cache hit.
BENCH_CONFIG_YAML = "tts:\n  cache_bytes: 0\n"
TEXTS = [
    "Sure, your table for two is booked at seven tonight.",
    "I can help with that. What is the order number?",
    "Thanks for waiting. Your parcel left the depot this morning.",
    "Got it. I have moved your appointment to Thursday at ten.",
    "Please hold on while I check the opening hours for you.",
    "Your balance is forty two dollars and seventeen cents.",
]


def clips(n: int) -> list[str]:
    rows = [
        json.loads(line) for line in (SPEECH / "manifest.jsonl").read_text().splitlines() if line
    ]
    names = sorted(r["file"] if "file" in r else r["path"] for r in rows)
    fleurs = [x for x in names if "fleurs" in x] or names
    return [str(SPEECH / Path(x).name) for x in fleurs[:n]]


@contextmanager
def server(target: str | None, config_yaml: str = BENCH_CONFIG_YAML) -> Iterator[str]:
    """``target``, or a server started from this environment with ``config_yaml``."""
    if target:
        yield target
        return
    os.environ.setdefault(SERVER_ENV, str(Path(sys.executable).parent / "voxgate"))
    os.environ.pop(TARGET_ENV, None)
    with LocalServer(config_yaml=config_yaml) as srv:
        yield srv.target


def run_venv_script(venv: str, script: str, args: list[str], timeout: int = 3600) -> list[str]:
    """Run ``benchmarks/script`` with ``venv``'s python from ``clients/``; its stdout lines.

    The working directory is ``clients/`` and no ``VOXGATE_*`` or ``PYTHONPATH`` goes with it,
    so nothing of the server is importable by accident: the framework's environment has only
    the client library and the adapters.
    """
    py = ROOT / venv / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{venv} is missing: run clients/setup-venvs.sh first")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_") and k != "PYTHONPATH"
    }
    out = subprocess.run(
        [str(py), str(ROOT / "benchmarks" / script), *args],
        check=False,  # the return code is checked below, with the worker's stderr
        cwd=ROOT / "clients",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise SystemExit(f"{script} failed:\n{out.stderr[-4000:]}")
    return out.stdout.splitlines()


def run_worker(
    framework: str, target: str, clip_paths: list[str], texts: list[str], speed: float, repeats: int
) -> list[dict[str, Any]]:
    venv, script = WORKERS[framework]
    args = ["--target", target, "--speed", str(speed), "--repeats", str(repeats)]
    lines = run_venv_script(venv, script, [*args, "--clips", *clip_paths, "--texts", *texts])
    return [json.loads(line) for line in lines if line.startswith("{")]


def _fmt(values: list[float]) -> str:
    if not values:
        return "       -        -"
    return f"{median(values):8.1f} {percentile(values, 95):8.1f}"


def table(rows: list[dict[str, Any]], framework: str) -> str:
    stt = [r for r in rows if r["kind"] == "stt"]
    tts = [r for r in rows if r["kind"] == "tts"]
    lines = [
        f"{framework}: STT on the audio clock, ms (p50 p95)",
        f"  {'path':<10} {'utts':>5}  {'first p50':>9} {'p95':>8}  {'final p50':>9} {'p95':>8}",
    ]
    for path in ("client", framework):
        sel = [r for r in stt if r["path"] == path]
        first = [r["first_ms"] for r in sel]
        final = [r["final_ms"] for r in sel]
        lines.append(f"  {path:<10} {len(sel):>5}  {_fmt(first)}  {_fmt(final)}")
    adapter = [r["adapter_ms"] for r in stt if r["path"] == framework]
    if adapter:
        lines.append(
            f"  adapter added to each final (framework arrival - client-library arrival): "
            f"p50 {median(adapter):.2f}  p95 {percentile(adapter, 95):.2f}  "
            f"max {max(adapter):.2f} ms over {len(adapter)}"
        )
    lines.append(f"{framework}: TTS request -> first audio, ms")
    lines.append(f"  {'path':<10} {'n':>5}  {'p50':>8} {'p95':>8}")
    for path in ("client", framework):
        sel = [r["ttfa_ms"] for r in tts if r["path"] == path]
        lines.append(f"  {path:<10} {len(sel):>5}  {_fmt(sel)}")
    direct = [r["ttfa_ms"] for r in tts if r["path"] == "client"]
    via = [r["ttfa_ms"] for r in tts if r["path"] == framework]
    if direct and via:
        added = median(via) - median(direct)
        lines.append(f"  difference of the medians (server noise included): {added:+.1f} ms")
    share = [r["adapter_ms"] for r in tts if r["path"] == framework]
    if share:
        lines.append(
            f"  adapter added to the first audio (framework's first frame - client library's "
            f"first chunk): p50 {median(share):.2f}  p95 {percentile(share, 95):.2f}  "
            f"max {max(share):.2f} ms over {len(share)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=6, help="FLEURS clips from the shared set")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--speed", type=float, default=2.0, help="x real time (the server caps 4x)")
    ap.add_argument("--frameworks", default="pipecat,livekit")
    ap.add_argument("--target", help="a running server (default: start one)")
    ap.add_argument("--tiny", action="store_true", help="one clip, two sentences (a smoke run)")
    args = ap.parse_args(argv)
    clip_paths = clips(1 if args.tiny else args.clips)
    texts = TEXTS[:2] if args.tiny else TEXTS
    with server(args.target) as target:
        for framework in args.frameworks.split(","):
            rows = run_worker(framework, target, clip_paths, texts, args.speed, args.repeats)
            print(table(rows, framework), flush=True)


if __name__ == "__main__":
    main()
