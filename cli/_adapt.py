"""``voxgate adapt``: fine-tune the served Whisper model on a domain and write a named model.

The flags and the error handling live here; the work is :func:`voxgate.adapt.pipeline.run`, imported
only when the command runs, so ``voxgate serve`` (and ``voxgate --help``) never load torch.
Without the ``adapt`` extra the command says so in one line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from pathlib import Path
from typing import Literal

__all__ = ["EXTRA_MISSING", "add_adapt_arguments", "run_adapt"]

#: What the command prints when torch, transformers or peft is not installed.
EXTRA_MISSING = "voxgate adapt needs the adapt extra: pip install 'voxgate[adapt]'"
_EXTRA_MODULES = ("torch", "transformers", "peft")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1), got {value}")
    return value


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def add_adapt_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``voxgate adapt``."""
    p.add_argument(
        "--data",
        type=Path,
        help="recordings: a folder of x.wav + x.txt, or a .jsonl/.csv manifest (audio, text)",
    )
    p.add_argument(
        "--phrases",
        type=Path,
        help="domain phrases, one per line ('#' comments); spoken by the bundled voice and "
        "passed through a simulated phone line",
    )
    p.add_argument("--name", required=True, help="the new model's name (what config.model says)")
    p.add_argument(
        "--models-dir", type=Path, required=True, help="the models directory voxgate serve reads"
    )
    p.add_argument("--steps", type=_positive_int, default=200, help="training steps (200)")
    p.add_argument("--rank", type=_positive_int, default=8, help="LoRA rank (8; 8-16 typical)")
    p.add_argument(
        "--held-out", type=_fraction, default=0.2, help="fraction kept out for scoring (0.2)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of synthesis, split and batches")
    p.add_argument(
        "--qlora",
        action="store_true",
        help="4-bit frozen base (bitsandbytes, the qlora extra; on a CUDA GPU, or slower on a CPU)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--work-dir",
        type=Path,
        help="checkpoints (default: <models-dir>/.<name>.work, removed after success)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads for training (0 = all)")
    p.add_argument("--variants", type=_positive_int, default=4, help="renderings per phrase (4)")
    p.add_argument("--terms", type=Path, help="domain terms whose recall the report shows")
    p.add_argument(
        "--general", type=Path, help="a manifest of general speech scored before and after"
    )
    p.add_argument(
        "--base-model", default="base", help="model to adapt: 'base' or a CTranslate2 directory"
    )
    p.add_argument(
        "--decoder-only",
        action="store_true",
        help="adapters on the decoder only, encoder outputs computed once (about 7x faster "
        "per step; right when the domain is vocabulary rather than acoustics)",
    )
    p.add_argument(
        "--windows",
        choices=("served", "full", "utterance"),
        default="served",
        help="encoder windows: served (the gateway's buckets; default), full (30 s) or "
        "utterance (the clip plus 0.5 s)",
    )
    p.add_argument(
        "--replay",
        type=int,
        default=157,
        help="general sentences (bundled, spoken by the same voice) whose decoding is held to "
        "the base model's while training, so general speech stays as accurate (157 = all; 0 off)",
    )
    p.add_argument(
        "--replay-audio",
        type=Path,
        help="untranscribed recordings from your own calls (a folder of .wav or a manifest's "
        "audio column): the base model transcribes them and training holds them to that, "
        "beside the --replay sentences",
    )
    p.add_argument(
        "--replay-weight",
        type=float,
        default=6.0,
        help="weight of the replay's KL divergence from the base beside the domain loss (6.0)",
    )
    p.add_argument(
        "--focus",
        choices=("auto", "terms", "text"),
        default="auto",
        help="what a phrase or clip with a domain term teaches: only the term's tokens, the "
        "words around it held to the base model like the replay (terms), or its whole text "
        "(text); auto = terms when --terms is given, else text",
    )
    p.add_argument("--learning-rate", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--batch-size", type=_positive_int, default=4, help="clips per step (4)")
    p.add_argument(
        "--checkpoint-every", type=_positive_int, default=50, help="steps between checkpoints"
    )
    p.add_argument(
        "--no-evaluate",
        action="store_true",
        help="skip scoring before/after and the report (the model is still verified)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "json"),
        default="auto",
        help="progress on stderr: a bar on a terminal, JSON lines otherwise (auto)",
    )


def _focus(choice: str, terms: Path | None) -> Literal["terms", "text"]:
    """``--focus auto``: the terms when there are terms (measured: less general-WER loss)."""
    if choice == "auto":
        return "terms" if terms is not None else "text"
    return "terms" if choice == "terms" else "text"


def run_adapt(args: argparse.Namespace) -> int:
    """Run ``voxgate adapt``; the exit status (0 ok, 2 bad input, 130 interrupted)."""
    from voxgate.adapt._offline import import_bitsandbytes

    import_bitsandbytes()  # before peft imports it with a hub lookup (adapt/_offline.py)
    try:
        for module in _EXTRA_MODULES:
            importlib.import_module(module)
    except ImportError:
        print(EXTRA_MISSING, file=sys.stderr)
        return 2
    from voxgate.adapt.data import AdaptDataError
    from voxgate.adapt.pipeline import AdaptRequest, run
    from voxgate.adapt.progress import Progress
    from voxgate.adapt.publish import ModelNameError, PublishError
    from voxgate.adapt.train import TrainConfig, TrainError, TrainingInterrupted
    from voxgate.engines.asr._model_files import ModelFilesError

    tty = {"auto": None, "bar": True, "json": False}[args.progress]
    req = AdaptRequest(
        name=args.name,
        models_dir=args.models_dir,
        data=args.data,
        phrases=args.phrases,
        terms=args.terms,
        general=args.general,
        base_model=args.base_model,
        variants=args.variants,
        replay=args.replay,
        replay_audio=args.replay_audio,
        held_out=args.held_out,
        work_dir=args.work_dir,
        resume=args.resume,
        evaluate=not args.no_evaluate,
        train=TrainConfig(
            steps=args.steps,
            rank=args.rank,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            decoder_only=args.decoder_only,
            windows=args.windows,
            checkpoint_every=args.checkpoint_every,
            seed=args.seed,
            threads=args.threads,
            qlora=args.qlora,
            replay_weight=args.replay_weight,
            focus=_focus(args.focus, args.terms),
        ),
    )
    # Outside the training loop (which checkpoints first), SIGTERM unwinds like Ctrl-C, so a
    # partial model directory being written is removed rather than left behind.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = run(req, Progress(tty=tty))
    except TrainingInterrupted as exc:
        print(f"voxgate adapt: {exc}; rerun with --resume to continue", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("voxgate adapt: interrupted; no model was written", file=sys.stderr)
        return 130
    except (AdaptDataError, TrainError, ModelFilesError, ModelNameError) as exc:
        print(f"voxgate adapt: {exc}", file=sys.stderr)
        return 2
    except PublishError as exc:
        print(f"voxgate adapt: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = {
        "model": str(result.model_dir),
        "name": args.name,
        "report": str(result.report) if result.report is not None else None,
        "scores": result.scores,
    }
    print(json.dumps(summary, indent=2, default=float))
    return 0
