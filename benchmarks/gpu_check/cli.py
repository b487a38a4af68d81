"""The command line: resolve settings, run every section in order, print, write the JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import ctranslate2

from benchmarks.gpu_check.audio import load_streamer, speech_utterances, utterance_stats
from benchmarks.gpu_check.capacity import find_capacity, make_sim_engines
from benchmarks.gpu_check.common import (
    ASR_RATE,
    CPU,
    CUDA,
    SCHEMA_VERSION,
    TRT,
    Budget,
    cpu_count,
    log,
)
from benchmarks.gpu_check.environment import environment
from benchmarks.gpu_check.models import (
    LARGE_V3,
    TINY,
    build_random_spec,
    build_random_transformers,
    resolve_builder,
)
from benchmarks.gpu_check.report import render_table
from benchmarks.gpu_check.tts import tts_first_audio, tts_in_subprocess, tts_worker
from benchmarks.gpu_check.whisper_timing import (
    Prompt,
    bench_batches,
    engine_max_length,
    load_ct2,
    log_mel,
)

__all__ = ["Settings", "main", "parse_args", "resolve_device", "settings_for"]


@dataclass(slots=True)
class Settings:
    """Resolved run parameters (defaults depend on --tiny and the device)."""

    batches: list[int]
    repeats: int
    max_new_tokens: int
    sim_seconds: float
    period_s: float
    max_calls: int
    tts_reps: int
    tts_providers: list[str]
    torch_batches: list[int]
    torch_encoder_batches: list[int]
    torch_steps: int
    torch_sim_batch: int


def _engines(requested: str | None) -> list[str]:
    """The engines to measure: both when torch is importable, unless named."""
    import importlib.util

    if requested:
        names = [e.strip() for e in requested.split(",") if e.strip()]
        unknown = set(names) - {"ctranslate2", "torch"}
        if unknown:
            raise SystemExit(f"--engines: unknown {sorted(unknown)}; use ctranslate2,torch")
        return names
    have_torch = importlib.util.find_spec("torch") is not None
    return ["ctranslate2", "torch"] if have_torch else ["ctranslate2"]


def resolve_device(requested: str) -> Literal["cpu", "cuda"]:
    """``auto`` is CUDA when CTranslate2 sees a device, else CPU."""
    count = int(ctranslate2.get_cuda_device_count())
    if requested == "cuda" and count == 0:
        raise SystemExit("--device cuda: CTranslate2 sees no CUDA device (is this the GPU wheel?)")
    if requested == "auto":
        return "cuda" if count else "cpu"
    return "cuda" if requested == "cuda" else "cpu"


def settings_for(args: argparse.Namespace, device: str, ort_providers: Sequence[str]) -> Settings:
    """Mode- and device-dependent defaults, overridden by explicit flags."""
    if args.tiny:
        base = Settings([1, 2], 3, 16, 3.0, 1.5, 4, 3, [CPU], [1, 2], [1, 2], 3, 4)
    elif device == "cuda":
        # CUDA before TensorRT: a cold TensorRT build may use up the rest of the budget.
        accel = [p for p in (CUDA, TRT) if p in ort_providers]
        base = Settings(
            [1, 4, 16, 32],
            3,
            64,
            10.0,
            3.0,
            512,
            10,
            [*accel, CPU],
            [1, 8, 32, 64, 128, 256],
            [1, 8, 32],
            20,
            256,
        )
    else:
        log("full-size model on CPU: expect minutes per batch; consider --tiny or --batches 1")
        base = Settings([1, 2], 2, 64, 15.0, 3.0, 8, 5, [CPU], [1, 2], [1], 3, 8)
    if args.batches:
        base.batches = [int(b) for b in args.batches.split(",")]
    if args.max_new_tokens:
        base.max_new_tokens = args.max_new_tokens
    if args.repeats:
        base.repeats = args.repeats
    if args.sim_seconds:
        base.sim_seconds = args.sim_seconds
    if args.period_s:
        base.period_s = args.period_s
    if args.max_calls:
        base.max_calls = args.max_calls
    if args.tts_reps:
        base.tts_reps = args.tts_reps
    if args.torch_batches:
        base.torch_batches = [int(b) for b in args.torch_batches.split(",")]
    if args.torch_steps:
        base.torch_steps = args.torch_steps
    if args.torch_sim_batch:
        base.torch_sim_batch = args.torch_sim_batch
    if args.tts_providers:
        base.tts_providers = [
            p if p.endswith("Provider") else f"{p}ExecutionProvider"
            for p in args.tts_providers.split(",")
        ]
    return base


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    from benchmarks import gpu_check

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=(gpu_check.__doc__ or "").splitlines()[0],
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--model", help="CTranslate2 Whisper dir (real weights); default: random")
    p.add_argument("--tiny", action="store_true", help="tiny shapes for a CPU smoke run")
    p.add_argument("--builder", choices=("auto", "spec", "transformers"), default="auto")
    p.add_argument("--compute-type", help="default float16 on cuda, int8 on cpu")
    p.add_argument("--flash-attention", action="store_true", help="CTranslate2 flash attention")
    p.add_argument("--out", default="gpu_check.json", help="JSON report path")
    p.add_argument("--keep-model", help="save the random model here instead of a temp dir")
    p.add_argument("--budget-s", type=float, default=450.0, help="soft limit for the whole run")
    p.add_argument("--batches", help="comma-separated batch sizes, e.g. 1,4,16,32")
    p.add_argument("--max-new-tokens", type=int, help="tokens decoded per item in the batches")
    p.add_argument("--repeats", type=int, help="timed runs per batch size")
    p.add_argument("--target-p95-ms", type=float, default=500.0)
    p.add_argument("--period-s", type=float, help="seconds between a caller's utterances")
    p.add_argument("--sim-seconds", type=float, help="length of one capacity trial")
    p.add_argument("--max-calls", type=int, help="upper bound of the capacity search")
    p.add_argument("--sim-batch", type=int, help="batcher max_batch_size (default: plan)")
    p.add_argument("--sim-workers", type=int, help="engine workers (default: plan)")
    p.add_argument("--tts-providers", help="e.g. Tensorrt,CUDA,CPU (default: all available)")
    p.add_argument("--tts-reps", type=int, help="warm first-audio measurements per provider")
    p.add_argument("--trt-cache", help="TensorRT engine cache dir (default: a temp dir)")
    p.add_argument("--tts-timeout-s", type=float, default=240.0)
    p.add_argument("--skip", default="", help="comma list of sections: asr,capacity,tts")
    p.add_argument(
        "--engines",
        help="recognition engines measured side by side: ctranslate2,torch (default: both "
        "when torch is importable)",
    )
    p.add_argument("--torch-batches", help="torch decode-step batch sizes, e.g. 1,8,64,256")
    p.add_argument("--torch-steps", type=int, help="timed decode steps per torch batch size")
    p.add_argument("--torch-sim-batch", type=int, help="batcher max_batch_size for torch")
    p.add_argument(
        "--write-bundle",
        metavar="DIR",
        help="write a self-contained folder for a GPU host without network and exit",
    )
    p.add_argument("--tts-worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every section, print the table, write the JSON; exit 1 if a section failed."""
    args = parse_args(argv)
    if args.write_bundle:
        from benchmarks.gpu_check.bundle import write_bundle

        return write_bundle(Path(args.write_bundle))
    if args.tts_worker:
        result = tts_worker(args.tts_worker, args.tts_reps or 5, args.trt_cache)
        print(json.dumps(result))
        return 0

    budget = Budget(args.budget_s)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    device = resolve_device(args.device)
    engines = _engines(args.engines)
    compute_type = args.compute_type or ("float16" if device == "cuda" else "int8")
    if args.flash_attention and device != "cuda":
        raise SystemExit("--flash-attention needs --device cuda")
    log(f"device {device}, compute type {compute_type}")
    env = environment()
    settings = settings_for(args, device, env["ort_providers"])
    errors: list[str] = []
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "mode": "tiny" if args.tiny else "full",
        "device": device,
        "compute_type": compute_type,
        "flash_attention": bool(args.flash_attention),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(settings),
        "environment": env,
        "asr_model": {},
        "asr_batches": [],
        "asr_capacity": None,
        "engines": engines,
        "torch": None,
        "asr_capacity_torch": None,
        "tts": [],
        "errors": errors,
    }

    with contextlib.ExitStack() as stack:
        # CPU voice: speech for the capacity test and the CPU first-audio row.
        cpu_streamer = None
        cpu_load_s = 0.0
        try:
            t0 = time.perf_counter()
            cpu_streamer = load_streamer([CPU], None)
            cpu_load_s = time.perf_counter() - t0
            stack.callback(cpu_streamer.close)
        except Exception as error:  # noqa: BLE001 - e.g. piper-tts missing: noise utterances
            if "tts" not in skip:  # with TTS skipped (the offline bundle) it only means noise
                errors.append(f"tts cpu load: {error!r}")
            log(f"CPU voice unavailable: {error!r}; the calls trial uses modulated noise")
        utterances = speech_utterances(cpu_streamer)

        # -- model
        if args.model:
            model_dir = Path(args.model).expanduser()
            shape_info: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                cfg = json.loads((model_dir / "config.json").read_text())
                shape_info = {"alignment_heads": len(cfg.get("alignment_heads") or [])}
            report["asr_model"] = {"source": "path", "dir": str(model_dir), "shape": shape_info}
            random_model = False
        else:
            shape = TINY if args.tiny else LARGE_V3
            builder = resolve_builder(args.builder)
            root = (
                Path(args.keep_model)
                if args.keep_model
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check_")))
            )
            model_dir = root / "whisper-ct2"
            log(f"building random {shape} with {builder} ({compute_type})")
            t0 = time.perf_counter()
            try:
                if builder == "transformers":
                    build_random_transformers(shape, model_dir, compute_type)
                else:
                    build_random_spec(shape, model_dir, compute_type)
            except Exception as error:
                if builder != "transformers" or args.builder != "auto":
                    raise
                # auto: a broken torch/transformers install must not sink the whole check.
                errors.append(f"transformers builder: {error!r}; used the spec builder")
                log(errors[-1])
                builder = "spec"
                build_random_spec(shape, model_dir, compute_type)
            report["asr_model"] = {
                "source": f"random-{builder}",
                "dir": str(model_dir) if args.keep_model else None,
                "shape": {**asdict(shape), "parameters": shape.parameters},
                "build_s": time.perf_counter() - t0,
            }
            random_model = True
        prompt = Prompt.from_model_dir(model_dir)

        # -- batches
        threads = cpu_count()
        model = load_ct2(model_dir, device, compute_type, threads, args.flash_attention)
        n_mels = int(model.n_mels)
        report["asr_model"]["n_mels"] = n_mels
        report["asr_model"]["multilingual"] = bool(model.is_multilingual)
        features = log_mel(utterances[0], n_mels)
        # The engine's own max_length rule (it measures how CTranslate2 reads max_length).
        calibration = engine_max_length(
            model,
            model_dir,
            device,
            compute_type,
            features,
            prompt,
            settings.max_new_tokens,
            random_model,
        )
        report["asr_model"]["ct2_max_length"] = calibration
        max_length = calibration["max_length_used"]
        if calibration["tokens_at_used"] != settings.max_new_tokens:
            errors.append(
                f"max_length {max_length} decodes {calibration['tokens_at_used']} tokens, "
                f"not {settings.max_new_tokens}: WhisperEngine's max_length rule is off"
            )
            log(errors[-1])
        if "asr" not in skip:
            report["asr_batches"] = bench_batches(
                model,
                features,
                prompt,
                settings.batches,
                max_length,
                settings.repeats,
                budget,
                reserve_s=120.0 if not args.tiny else 0.0,
            )
        model.unload_model()
        del model

        # -- the PyTorch engine: decode steps (eager / graphs), processors on vs off, encoder
        if "torch" in engines and "asr" not in skip:
            from benchmarks.gpu_check.torch_engine import bench_torch

            try:
                report["torch"] = bench_torch(
                    model_dir,
                    device,
                    settings.torch_batches,
                    settings.torch_encoder_batches,
                    settings.torch_steps,
                    budget,
                    reserve_s=200.0 if not args.tiny else 0.0,
                )
                errors.extend(report["torch"]["errors"])
            except Exception as error:  # noqa: BLE001 - reported; the other sections still run
                errors.append(f"torch engine: {error!r}")
                log(errors[-1])

        # -- capacity
        if "capacity" not in skip:
            from voxgate.engines.asr.base import AsrOptions, AsrRequest
            from voxgate.gateway.scheduling import default_plan

            plan = default_plan(device, threads)
            workers = args.sim_workers or plan.workers
            batch = args.sim_batch or plan.max_batch_size
            setup = make_sim_engines(
                model_dir,
                device,
                compute_type,
                workers,
                batch,
                random_model,
                max_length,
                args.flash_attention,
            )
            for close in setup.close:
                stack.callback(close)
            # Random weights: no policy gates, so every item is aligned like real text is.
            options = AsrOptions(language="en", silence_aware=not random_model)
            requests = [AsrRequest(u, utterance_stats(u), options) for u in utterances]
            # Start near half the calls the measured throughput could serve at this batch size.
            rates = [
                r["utt_per_s"]
                for r in report["asr_batches"]
                if "error" not in r and r["batch"] <= batch
            ]
            start_calls = max(1, int(max(rates, default=0.0) * settings.period_s / 2))
            report["asr_capacity"] = find_capacity(
                setup,
                requests,
                target_ms=args.target_p95_ms,
                period_s=settings.period_s,
                duration_s=settings.sim_seconds,
                max_calls=settings.max_calls,
                budget=budget,
                reserve_s=(90.0 if (device == "cuda" and "tts" not in skip) else 0.0)
                + (150.0 if "torch" in engines and not args.tiny else 0.0),
                start_calls=1 if args.tiny else start_calls,
            )
            report["asr_capacity"]["utterance_s"] = [len(u) / ASR_RATE for u in utterances]
            if "torch" in engines:
                tsetup = make_sim_engines(
                    model_dir,
                    device,
                    compute_type,
                    workers,
                    settings.torch_sim_batch,
                    random_model,
                    max_length,
                    engine="torch",
                )
                for close in tsetup.close:
                    stack.callback(close)
                if not tsetup.workers:
                    errors.append(f"torch capacity: {tsetup.engine_error}")
                else:
                    report["asr_capacity_torch"] = find_capacity(
                        tsetup,
                        requests,
                        target_ms=args.target_p95_ms,
                        period_s=settings.period_s,
                        duration_s=settings.sim_seconds,
                        max_calls=settings.max_calls,
                        budget=budget,
                        reserve_s=90.0 if (device == "cuda" and "tts" not in skip) else 0.0,
                        start_calls=1 if args.tiny else max(1, report["asr_capacity"]["max_calls"]),
                    )

        # -- TTS
        if "tts" not in skip:
            for provider in settings.tts_providers:
                if provider == CPU:
                    if cpu_streamer is None:
                        report["tts"].append({"provider": CPU, "error": "voice did not load"})
                        continue
                    report["tts"].append(
                        tts_first_audio(cpu_streamer, settings.tts_reps, CPU, cpu_load_s)
                    )
                elif provider not in env["ort_providers"]:
                    report["tts"].append(
                        {"provider": provider, "error": "not offered by this onnxruntime"}
                    )
                else:
                    timeout = min(args.tts_timeout_s, max(30.0, budget.left))
                    if provider == CUDA:
                        timeout = min(timeout, 120.0)
                    trt_cache = args.trt_cache or stack.enter_context(
                        tempfile.TemporaryDirectory(prefix="gpu_check_trt_")
                    )
                    log(f"TTS on {provider} (timeout {timeout:.0f} s)")
                    report["tts"].append(
                        tts_in_subprocess(provider, settings.tts_reps, trt_cache, timeout)
                    )
            errors.extend(
                f"tts {t['provider']}: {t['error']}" for t in report["tts"] if "error" in t
            )

    errors.extend(
        f"asr batch {b['batch']}: {b['error']}" for b in report["asr_batches"] if "error" in b
    )
    report["elapsed_s"] = budget.elapsed
    print(render_table(report))
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=2, allow_nan=False))
    log(f"wrote {out}")
    return 1 if errors else 0
