"""``voxgate adapt`` end to end: data in, a served model out.

The order is chosen so that everything that can be wrong with the input is found before the
first training step: the model name, the data (every clip and transcript,
:mod:`voxgate.adapt.data`), the held-out split, the tokenised transcripts, the settings. Then: score
the base on the held-out clips, train (:mod:`voxgate.adapt.train`), merge the adapters into the base
in NumPy, write the CTranslate2 directory into a hidden partial directory, verify it with the
serving engine, score it on the same clips, write the report beside it, and rename it into the
models directory (:mod:`voxgate.adapt.publish`). The checkpoints live in a work directory (by
default the hidden ``<models_dir>/.<name>.work``, which the server ignores) so that ``--resume``
finds them.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from voxgate.adapt.convert import read_base, write_ct2_dir
from voxgate.adapt.progress import Progress
from voxgate.adapt.publish import check_name, publish, sha256_file, verify_model_dir
from voxgate.adapt.train import TrainConfig, check_device, make_examples, merge, train

__all__ = ["AdaptRequest", "AdaptResult", "run"]


@dataclass(frozen=True)
class AdaptRequest:
    """Everything ``voxgate adapt`` was asked to do (the CLI's flags)."""

    name: str
    models_dir: Path
    data: Path | None = None
    phrases: Path | None = None
    terms: Path | None = None
    general: Path | None = None
    base_model: str = "base"
    variants: int = 4
    replay: int = 157
    replay_audio: Path | None = None
    held_out: float = 0.2
    work_dir: Path | None = None
    resume: bool = False
    evaluate: bool = True
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def resolved_work_dir(self) -> Path:
        """Where checkpoints go: ``--work-dir`` or ``<models_dir>/.<name>.work``."""
        if self.work_dir is not None:
            return self.work_dir
        return self.models_dir / f".{self.name}.work"


@dataclass
class AdaptResult:
    """What a finished run produced."""

    model_dir: Path
    report: Path | None
    meta: dict[str, Any]
    scores: dict[str, Any]


def _terms(req: AdaptRequest) -> list[str]:
    from voxgate.adapt.data import read_phrases

    return read_phrases(req.terms) if req.terms is not None else []


def _scores_dict(s: Any) -> dict[str, Any]:
    return {"wer": s.wer, "term_recall": s.term_recall, "n_words": s.n_words}


def _report_meta(req: AdaptRequest, meta: dict[str, Any]) -> dict[str, object]:
    """The run's facts as the report's flat table (no transcripts: only counts and settings)."""
    lora, tr, data = meta["lora"], meta["training"], meta["data"]
    sha = meta["base_model"]["model_bin_sha256"][:12]
    windows = ", ".join(f"{int(k) / 100:g} s x{v}" for k, v in tr["windows"].items())
    return {
        "name": req.name,
        "base model": f"{req.base_model} (model.bin sha256 {sha}...)",
        "adapters": f"LoRA r={lora['rank']} alpha={lora['alpha']} dropout={lora['dropout']} "
        f"on {lora['targets']}" + (" (QLoRA 4-bit base)" if lora["qlora"] else ""),
        "encoder windows": f"{lora['windows']} ({windows})",
        "steps": f"{tr['steps']} (batch {lora['batch_size']}, peak lr {lora['learning_rate']})",
        "training time": f"{tr['train_seconds']} s on {tr['device']}",
        "trainable parameters": f"{tr['trainable_parameters']:,} of {tr['total_parameters']:,}",
        "training data": f"{data['train']['pairs']} clips, {data['train']['audio_s']} s",
        "held-out data": f"{data['held_out']['pairs']} clips, {data['held_out']['audio_s']} s",
        "replay": f"{data['replay']['pairs']} general sentences, KL weight {lora['replay_weight']}"
        if data["replay"]["pairs"]
        else "off",
        "replay recordings": f"{data['replay_audio']['pairs']} of "
        f"{data['replay_audio']['recordings']} ({data['replay_audio']['audio_s']} s), held to "
        "the base's transcripts"
        if data["replay_audio"]["recordings"]
        else "none",
        "domain loss": "the terms' tokens; the words around them held to the base"
        if lora["focus"] == "terms"
        else "the whole text",
    }


def run(req: AdaptRequest, progress: Progress | None = None) -> AdaptResult:
    """Run the whole pipeline; see the module docstring for the order.

    Raises:
        voxgate.adapt.data.AdaptDataError: unusable data (before training).
        TrainError: unusable settings, a refused checkpoint.
        ModelNameError: the name is unusable or taken (checked first).
        PublishError: the written model failed to verify (nothing was published).
        voxgate.adapt.train.TrainingInterrupted: SIGINT/SIGTERM during training (checkpoint saved).
    """
    from voxgate.adapt import data as d
    from voxgate.engines.asr._model_files import resolve_model_dir

    prog = progress if progress is not None else Progress()
    t_start = time.monotonic()
    check_name(req.name, req.models_dir)
    req.train.check()
    check_device(req.train)
    if req.data is None and req.phrases is None:
        raise d.AdaptDataError("give --data (recordings) and/or --phrases (domain phrases)")
    terms = _terms(req)
    if req.train.focus == "terms" and not terms:
        raise d.AdaptDataError("--focus terms needs --terms (the words the phrases teach)")
    use_replay = req.replay != 0 and req.train.replay_weight > 0.0
    general_text = d.general_sentences(req.replay, seed=req.train.seed) if use_replay else []
    if req.replay_audio is not None and req.train.replay_weight <= 0.0:
        raise d.AdaptDataError("--replay-audio needs a --replay-weight above 0")

    prog.stage("load")
    pairs: list[d.Pair] = []
    if req.data is not None:
        pairs += d.load_pairs(req.data)
    if req.phrases is not None:
        phrases = d.read_phrases(req.phrases)
        prog.stage("synthesize", phrases=len(phrases), variants=req.variants)
        pairs += d.synthesize_phrases(phrases, variants=req.variants, seed=req.train.seed)
    train_pairs, held = d.split(pairs, held_out=req.held_out, seed=req.train.seed)
    general = d.load_pairs(req.general) if req.general is not None else []
    recordings = d.load_recordings(req.replay_audio) if req.replay_audio is not None else []

    base_dir = resolve_model_dir(req.base_model)
    base = read_base(base_dir)
    # Domain and replay clips become examples the same way (windows, encoder policy, prompt).
    examples_of = partial(
        make_examples,
        base,
        windows=req.train.windows,
        encoder=req.train.encoder,
        language=req.train.language,
        terms=terms,
    )
    examples = examples_of(train_pairs)
    replay: list[d.Pair] = []
    if general_text:
        prog.stage("synthesize-replay", sentences=len(general_text))
        replay = d.synthesize_phrases(
            general_text, variants=1, seed=req.train.seed + 1, label="general"
        )
        examples += examples_of(replay, replay=True)
    heard: list[d.Pair] = []
    if recordings:
        from voxgate.adapt.evaluate import load_engine, transcribe

        # The base's own transcript is what these clips are held to: the real line's audio
        # (not the bundled voice's) stays decoded as the base decodes it, with no transcripts
        # needed. A clip the base hears nothing in has nothing to hold.
        prog.stage("transcribe-replay", clips=len(recordings))
        engine = load_engine(base_dir)
        try:
            for audio, origin in recordings:
                text = " ".join(transcribe(engine, audio)[0].split())
                if any(ch.isalnum() for ch in text):
                    heard.append(d.Pair(audio, text, f"replay-audio:{origin}"))
        finally:
            engine.close()
        examples += examples_of(heard, replay=True, recorded=True)

    scores: dict[str, Any] = {}
    before: dict[str, Any] = {}
    sets = {k: v for k, v in (("held_out", held), ("general", general)) if v}
    if req.evaluate:
        from voxgate.adapt.evaluate import evaluate

        if sets:
            prog.stage("evaluate-base", clips=len(held) + len(general))
        before = {k: evaluate(base_dir, v, terms=terms) for k, v in sets.items()}

    result = train(
        base, examples, req.train, req.resolved_work_dir, resume=req.resume, progress=prog
    )
    prog.stage("merge", adapters=len(result.adapters))
    merged = merge(base.state, result.adapters)
    del result.adapters[:]

    meta: dict[str, Any] = {
        "base_model": {
            "name": req.base_model,
            "model_bin_sha256": sha256_file(base_dir / "model.bin"),
        },
        "lora": {
            "rank": req.train.rank,
            "alpha": req.train.alpha,
            "dropout": req.train.dropout,
            "targets": "decoder q_proj/v_proj"
            if req.train.decoder_only
            else "encoder+decoder q_proj/v_proj",
            "qlora": req.train.qlora,
            "learning_rate": req.train.learning_rate,
            "batch_size": req.train.batch_size,
            "replay_weight": req.train.replay_weight if replay or heard else 0.0,
            "focus": req.train.focus,
            "windows": req.train.windows,
            "seed": req.train.seed,
        },
        "training": result.summary(),
        "data": {
            "train": d.summarize(train_pairs),
            "held_out": d.summarize(held),
            "replay": d.summarize(replay),
            "replay_audio": d.summarize(heard) | {"recordings": len(recordings)},
            "phrases_file": req.phrases.name if req.phrases is not None else None,
            "variants": req.variants if req.phrases is not None else 0,
        },
    }
    report_path: list[Path] = []
    verify_audio = (held[0] if held else train_pairs[0]).audio.astype(np.float32)

    def check(partial: Path) -> None:
        if not req.evaluate or not before:
            prog.stage("verify")
            verify_model_dir(partial, verify_audio)
            return
        from voxgate.adapt.evaluate import evaluate
        from voxgate.adapt.report import write_report

        # Scoring loads the written model with the serving engine and decodes every held-out
        # clip: the verification, and the report, before the model becomes visible.
        prog.stage("evaluate-adapted", clips=len(held) + len(general))
        after: dict[str, Any] = {k: evaluate(partial, sets[k], terms=terms) for k in before}
        for k, was in before.items():
            scores[k] = {"before": _scores_dict(was), "after": _scores_dict(after[k])}
        report_path.append(
            write_report(
                partial,
                losses=result.losses,
                scores_before=before,
                scores_after=after,
                meta=_report_meta(req, meta),
            )
        )

    prog.stage("write", name=req.name)
    target = publish(
        req.models_dir,
        req.name,
        write=lambda out: write_ct2_dir(merged, base, out),
        meta=meta,
        check=check,
    )
    if req.work_dir is None:
        shutil.rmtree(req.resolved_work_dir, ignore_errors=True)
    prog.stage(
        "done",
        model=str(target),
        seconds=round(time.monotonic() - t_start, 1),
    )
    report = target / report_path[0].name if report_path else None
    return AdaptResult(target, report, meta, scores)
