"""The one table printed at the end of a run."""

from __future__ import annotations

from typing import Any

__all__ = ["render_table"]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_table(report: dict[str, Any]) -> str:
    """The one table printed at the end."""
    env = report["environment"]
    model = report["asr_model"]
    gpus = env["nvidia_smi"].get("gpus", []) if env["nvidia_smi"].get("present") else []
    gpu = ", ".join(f"{g['name']} (MIG {g['mig_mode']})" for g in gpus) or "no nvidia-smi"
    header = (
        f"voxgate gpu_check: mode={report['mode']} device={report['device']} "
        f"compute={report['compute_type']} | ct2 {env['ctranslate2']} "
        f"(cuda devices {env['ct2_cuda_devices']}) | ort {env['onnxruntime']} | {gpu}\n"
        + (
            f"model: {model['dir']} (real weights, mels={model.get('n_mels')})"
            if model["source"] == "path"
            else f"model: {model['source']} d_model={model['shape']['d_model']} "
            f"layers={model['shape']['encoder_layers']}+{model['shape']['decoder_layers']} "
            f"mels={model['shape']['num_mel_bins']} vocab={model['shape']['vocab_size']} "
            f"(built in {_fmt(model.get('build_s'), 1)} s)"
        )
    )
    rows: list[tuple[str, str, str, str, str, str]] = []
    for b in report["asr_batches"]:
        if "error" in b:
            rows.append(("asr", f"batch {b['batch']}", "-", "-", "-", b["error"][:40]))
            continue
        rows.append(
            (
                "asr",
                f"batch {b['batch']} x 30 s",
                f"{b['utt_per_s']:.2f} utt/s",
                _fmt(b["p50_ms"]),
                _fmt(b["p95_ms"]),
                f"enc {b['encode_ms_p50']:.0f} + gen {b['generate_ms_p50']:.0f} ms, "
                f"{b['tokens_per_item']:.0f} tok",
            )
        )
    torch_part = report.get("torch")
    if torch_part:
        for r in torch_part["steps"]:
            if "error" in r:
                rows.append(("torch", f"batch {r['batch']}", "-", "-", "-", r["error"][:40]))
                continue
            graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:.2f}"
            rows.append(
                (
                    "torch",
                    f"step batch {r['batch']}",
                    f"{r['tokens_per_s_graph_or_eager']:.0f} tok/s",
                    "-",
                    "-",
                    f"eager {r['eager_ms']:.2f} / graph {graph} ms; loop "
                    f"{r['loop_off_ms']:.2f} -> {r['loop_on_ms']:.2f} ms with processors "
                    f"({r['processors_overhead_pct']:+.0f} %)",
                )
            )
        for e in torch_part["encoder"]:
            if "error" in e:
                continue
            rows.append(
                (
                    "torch",
                    f"encoder batch {e['batch']}",
                    "-",
                    "-",
                    "-",
                    f"{e['ms_per_window']:.1f} ms per 30 s window ({torch_part['dtype']})",
                )
            )
    for key in ("asr_capacity", "asr_capacity_torch"):
        _capacity_rows(rows, report.get(key))
    for t in report["tts"]:
        if "error" in t:
            rows.append(("tts", t["provider"], "-", "-", "-", t["error"][:60]))
            continue
        active = "+".join(p.removesuffix("ExecutionProvider") for p in t["active_providers"])
        rows.append(
            (
                "tts",
                t["provider"].removesuffix("ExecutionProvider"),
                f"RTF {t['rtf_p50']:.3f}",
                _fmt(t["first_audio_p50_ms"]),
                _fmt(t["first_audio_p95_ms"]),
                f"first audio; cold {t['first_audio_cold_max_ms']:.0f} ms; on {active}",
            )
        )
    titles = ("section", "case", "rate", "p50 ms", "p95 ms", "notes")
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]
    line = "  ".join("-" * w for w in widths)
    out = [header, line, "  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)), line]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    out.append(line)
    if report["errors"]:
        out.append("errors: " + "; ".join(report["errors"]))
    out.append(f"total {report['elapsed_s']:.1f} s")
    return "\n".join(out)


def _capacity_rows(rows: list[tuple[str, str, str, str, str, str]], cap: Any) -> None:
    """One row per capacity trial and the result (either engine)."""
    if not cap:
        return
    for t in cap["trials"]:
        rows.append(
            (
                "calls",
                f"K={t['calls']}",
                f"{t['utterances']} utt",
                _fmt(t["p50_ms"]),
                _fmt(t["p95_ms"]),
                f"batch~{t['mean_batch']:.1f} {'ok' if t['ok'] else 'OVER'}",
            )
        )
    rows.append(
        (
            "calls",
            f"max K @ p95<={cap['target_p95_ms']:.0f}ms",
            str(cap["max_calls"]),
            "-",
            "-",
            f"{cap['engine']}, batch<={cap['max_batch_size']}, "
            f"{cap['workers']} worker(s)" + ("" if cap["search_complete"] else ", budget cut"),
        )
    )
