"""LoRA training: windows as served, the prompt as served, checkpoints, interrupt and resume.

The unit tests check the pieces that need no model (window sizes, the merge arithmetic, the
progress output, settings refused up front). The component tests train the real bundled base
with real torch and peft for a few decoder-only steps on two short real clips: an interrupt
(a real SIGINT to this process) saves a checkpoint after the step in flight, and resuming from
it gives the very losses and adapters of a run that was never interrupted.
"""

from __future__ import annotations

import io
import json
import os
import signal
import wave
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voxgate.adapt.data import Pair
from voxgate.adapt.progress import Progress
from voxgate.adapt.train import (
    Adapter,
    Example,
    TrainConfig,
    TrainError,
    TrainingInterrupted,
    _token_batch,
    make_examples,
    merge,
    train,
    window_frames,
)
from voxgate.engines.asr._policy import choose_encoder_frames
from voxgate.engines.asr.config import EncoderWindowConfig

CLIPS = ("vctk_p238_165.wav", "ljspeech_LJ001-0004.wav")


def quiet() -> Progress:
    return Progress(io.StringIO(), tty=False)


# -- units ------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("seconds", [0.5, 4.7, 8.0, 8.1, 12.9, 17.5, 27.0, 29.9])
def test_served_windows_are_the_gateways_buckets(seconds: float) -> None:
    n = int(seconds * 16000)
    cfg = EncoderWindowConfig()
    assert window_frames(n, "served", cfg) == choose_encoder_frames(n // 160, cfg)
    assert window_frames(n, "full", cfg) == 3000
    want = min(3000, -(-(n // 160 + 50) // 100) * 100)  # clip + 0.5 s, up to a whole second
    assert window_frames(n, "utterance", cfg) == want


@pytest.mark.unit
def test_served_windows_follow_a_custom_bucket_policy() -> None:
    cfg = EncoderWindowConfig(buckets_s=(5.0, 30.0), margin_ms=500)
    assert window_frames(4 * 16000, "served", cfg) == 500
    assert window_frames(5 * 16000, "served", cfg) == 3000


@pytest.mark.unit
def test_merge_adds_the_scaled_low_rank_product_to_the_named_weight_only() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    other = rng.standard_normal((3,)).astype(np.float32)
    a = rng.standard_normal((2, 4)).astype(np.float32)
    b = rng.standard_normal((6, 2)).astype(np.float32)
    state = {"x.q_proj.weight": w, "x.bias": other}
    out = merge(state, [Adapter("x.q_proj.weight", a, b, 4.0)])
    np.testing.assert_allclose(out["x.q_proj.weight"], w + 4.0 * b @ a, rtol=1e-6)
    assert out["x.bias"] is other and state["x.q_proj.weight"] is w  # the base is not touched
    with pytest.raises(TrainError, match="unknown weight"):
        merge(state, [Adapter("y.weight", a, b, 1.0)])
    with pytest.raises(TrainError, match="shape"):
        merge(state, [Adapter("x.q_proj.weight", a.T, b, 1.0)])


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "--steps"),
        ({"rank": 0}, "--rank"),
        ({"learning_rate": 0.0}, "learning rate"),
        ({"batch_size": 0}, "batch size"),
        ({"checkpoint_every": 0}, "checkpoint"),
    ],
)
def test_bad_settings_are_refused_before_anything_loads(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainError, match=message):
        TrainConfig(**change).check()


@pytest.mark.unit
def test_progress_without_a_terminal_is_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import voxgate.adapt.progress

    clock = types.SimpleNamespace(now=0.0)  # a fake clock: steps reported 1 s apart
    monkeypatch.setattr(
        voxgate.adapt.progress, "time", types.SimpleNamespace(monotonic=lambda: clock.now)
    )
    out = io.StringIO()
    p = Progress(out, tty=False, interval_s=0.0)
    p.stage("train", steps=3)
    for s in (1, 2, 3):
        clock.now += 1.0
        p.step(s, 3, 1.0 / s)
    p.note("checkpoint at step 3", step=3)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["stage", "step", "step", "step", "note"]
    assert lines[0]["stage"] == "train" and lines[0]["steps"] == 3
    assert [x["step"] for x in lines[1:4]] == [1, 2, 3]
    assert lines[1]["eta_s"] is None  # no rate measured yet: unknown, not zero
    assert [x["eta_s"] for x in lines[2:4]] == [1.0, 0.0]  # 1 s/step, then none left
    assert [x["s_per_step"] for x in lines[2:4]] == [1.0, 1.0]
    assert [x["loss"] for x in lines[1:4]] == [1.0, 0.5, pytest.approx(1 / 3, abs=1e-3)]
    assert [x["elapsed_s"] for x in lines[1:4]] == [1.0, 2.0, 3.0]


@pytest.mark.unit
def test_progress_rate_and_eta_count_the_steps_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps reported 2 s apart (a fake clock): 2 s per step from the second report on, and
    the ETA is that rate times the steps left, also for a resumed run starting at step 41."""
    import types

    import voxgate.adapt.progress

    clock = types.SimpleNamespace(now=0.0)
    fake_time = types.SimpleNamespace(monotonic=lambda: clock.now)
    monkeypatch.setattr(voxgate.adapt.progress, "time", fake_time)
    for first in (1, 41):
        out = io.StringIO()
        p = Progress(out, tty=False, interval_s=0.0)
        for s in range(first, first + 4):
            clock.now += 2.0
            p.step(s, first + 9, 1.0)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [x["step"] for x in lines] == list(range(first, first + 4))
        assert lines[0]["eta_s"] is None
        assert [x["s_per_step"] for x in lines[1:]] == [2.0, 2.0, 2.0]
        assert [x["eta_s"] for x in lines[1:]] == [16.0, 14.0, 12.0]


@pytest.mark.unit
def test_progress_on_a_terminal_is_one_redrawn_bar_with_an_eta() -> None:
    out = io.StringIO()
    p = Progress(out, tty=True)
    p.step(1, 10, 2.0)
    p.step(2, 10, 1.5)
    text = out.getvalue()
    assert text.count("\r") == 2 and "\n" not in text
    assert "2/10" in text and "ETA" in text and "loss 1.500" in text


# -- with the real model ----------------------------------------------------------------------


def _example(tokens: tuple[int, ...], terms: tuple[int, ...] = (), replay: bool = False) -> Example:
    return Example(np.zeros((80, 8), np.float32), tokens, 3, "t", replay, None, terms)


@pytest.mark.unit
def test_focus_on_terms_fits_only_the_term_tokens_and_holds_the_rest_to_the_base() -> None:
    #            prompt     text: 10 [11 12 = a term] 13, then EOT 99
    ex = [_example((1, 2, 3, 10, 11, 12, 13, 99), terms=(4, 5)), _example((1, 2, 3, 20, 99))]
    ex.append(_example((1, 2, 3, 30, 31, 99), replay=True))
    # Column j predicts token j + 1; the text starts at column prompt_len - 1 = 2.
    ids, labels, held = _token_batch(ex, [0, 1, 2], "terms")
    assert ids.tolist() == [
        [1, 2, 3, 10, 11, 12, 13],
        [1, 2, 3, 20, 99, 99, 99],
        [1, 2, 3, 30, 31, 99, 99],
    ]
    assert labels.tolist() == [
        [-100, -100, -100, 11, 12, -100, -100],  # the term only
        [-100, -100, 20, 99, -100, -100, -100],  # no term in it: its whole text, as "text"
        [-100] * 7,  # replay: never fitted to its text
    ]
    assert held.int().tolist() == [
        [0, 0, 1, 0, 0, 1, 1],  # the words around the term and the end token
        [0] * 7,
        [0, 0, 1, 1, 1, 0, 0],
    ]
    _, labels, held = _token_batch(ex, [0, 1, 2], "text")
    assert labels.tolist()[0] == [-100, -100, 10, 11, 12, 13, 99]
    assert held.int().tolist()[:2] == [[0] * 7, [0] * 7]  # only the replay row is held


def read_clip(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return (pcm / 32768.0).astype(np.float32)


@pytest.fixture(scope="module")
def base():
    from voxgate.adapt.convert import read_base
    from voxgate.engines.asr import resolve_model_dir

    return read_base(resolve_model_dir("base"))


@pytest.fixture(scope="module")
def pairs(speech_dir: Path, manifest: list[dict[str, Any]]) -> list[Pair]:
    text = {row["file"]: row["text"] for row in manifest}
    return [Pair(read_clip(speech_dir / f), text[f], f) for f in CLIPS]


CFG = TrainConfig(
    steps=3, decoder_only=True, learning_rate=3e-3, batch_size=2, checkpoint_every=2, threads=2
)


@pytest.mark.model
@pytest.mark.component
def test_examples_carry_the_served_prompt_and_windows(base, pairs: list[Pair]) -> None:
    ex = make_examples(base, pairs)
    assert [e.features.shape for e in ex] == [(80, 1000), (80, 1000)]  # 4.7 s, 5.1 s -> 10 s
    for e in ex:
        # <|startoftranscript|><|en|><|transcribe|><|notimestamps|> ... <|endoftext|>
        assert e.tokens[: e.prompt_len] == (50258, 50259, 50359, 50363)
        assert e.tokens[-1] == 50257 and len(e.tokens) > e.prompt_len + 5
    full = make_examples(base, pairs, windows="full")
    assert [e.features.shape[1] for e in full] == [3000, 3000]
    # The same mel frames, then padding: a bucket is the 30 s window cut short.
    np.testing.assert_array_equal(full[0].features[:, :1000], ex[0].features)


@pytest.mark.model
@pytest.mark.component
def test_interrupt_saves_a_checkpoint_and_resume_matches_an_uninterrupted_run(
    base, pairs: list[Pair], tmp_path: Path
) -> None:
    ex = make_examples(base, pairs)
    whole = train(base, ex, CFG, tmp_path / "whole", progress=quiet())
    assert [s for s, _ in whole.losses] == [1, 2, 3]
    assert whole.resumed_from == 0 and len(whole.adapters) == 24  # 6 layers x 2 attn x q, v
    assert all(a.weight.startswith("model.decoder.") for a in whole.adapters)

    def interrupt(step: int, _loss: float) -> None:
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, seen after this step

    work = tmp_path / "cut"
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(base, ex, CFG, work, progress=quiet(), on_step=interrupt)
    assert stopped.value.step == 1 and stopped.value.checkpoint.is_file()
    assert signal.getsignal(signal.SIGINT) is handler  # the handler is put back

    resumed = train(base, ex, CFG, work, resume=True, progress=quiet())
    assert resumed.resumed_from == 1
    assert [s for s, _ in resumed.losses] == [1, 2, 3]
    np.testing.assert_allclose(
        [v for _, v in resumed.losses], [v for _, v in whole.losses], rtol=1e-5
    )
    for a, b in zip(resumed.adapters, whole.adapters, strict=True):
        assert a.weight == b.weight
        np.testing.assert_allclose(a.b, b.b, rtol=1e-4, atol=1e-7)

    # A checkpoint of other data is refused rather than mixed in.
    with pytest.raises(TrainError, match="other data or settings"):
        train(base, ex[:1], CFG, work, resume=True, progress=quiet())
    with pytest.raises(TrainError, match="no checkpoint"):
        train(base, ex, CFG, tmp_path / "empty", resume=True, progress=quiet())


@pytest.mark.model
@pytest.mark.component
def test_replay_holds_general_speech_to_the_base_not_to_its_text(
    base, pairs: list[Pair], tmp_path: Path
) -> None:
    domain = make_examples(base, pairs[:1])
    general = make_examples(base, pairs[1:], replay=True)
    assert [e.replay for e in domain + general] == [False, True]
    cfg = replace(CFG, batch_size=1, replay_weight=5.0, checkpoint_every=10)
    held = train(base, domain + general, cfg, tmp_path / "replay", progress=quiet())
    free = train(
        base, domain + general, replace(cfg, replay_weight=0.0), tmp_path / "free", progress=quiet()
    )
    # Step 1 starts from a zero update: the adapted model is the base, so its divergence from
    # the base is 0 (a loss on the replay clip's text would not be), then it is not.
    assert [s for s, _ in held.replay_kl] == [1, 2, 3]
    assert held.replay_kl[0][1] == pytest.approx(0.0, abs=1e-5)
    assert held.replay_kl[-1][1] > 1e-5
    assert free.replay_kl == [] and free.windows == held.windows == {1000: 1}
    # The same domain batch and loss at step 1; the replay term then changes the update.
    assert held.losses[0][1] == pytest.approx(free.losses[0][1], rel=1e-5)
    pairs_ab = zip(held.adapters, free.adapters, strict=True)
    moved = max(float(np.abs(a.b - b.b).max()) for a, b in pairs_ab)
    assert moved > 1e-6
    assert all(e.teacher_features is None for e in domain + general)  # served: one window
    with pytest.raises(TrainError, match="besides the replay set"):
        train(base, general, cfg, tmp_path / "only", progress=quiet())
    with pytest.raises(TrainError, match="--replay-weight"):
        train(base, domain, replace(cfg, replay_weight=-1.0), tmp_path / "bad", progress=quiet())


@pytest.mark.model
@pytest.mark.component
def test_recorded_replay_takes_turns_with_the_bundled_sentences(
    base, pairs: list[Pair], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from voxgate.adapt import train as train_mod

    domain = make_examples(base, pairs[:1])
    sentences = make_examples(base, pairs[1:], replay=True)
    recorded = make_examples(base, pairs[:1], replay=True, recorded=True)
    assert [(e.replay, e.recorded) for e in sentences + recorded] == [(True, False), (True, True)]
    assert make_examples(base, pairs[:1], recorded=True)[0].recorded is False  # replay only
    drawn: list[list[int]] = []
    real_draw = train_mod._Pool.draw

    def draw(self: Any, rng: np.random.Generator, size: int) -> list[int]:
        got = real_draw(self, rng, size)
        drawn.append(got)
        return got

    monkeypatch.setattr(train_mod._Pool, "draw", draw)
    cfg = replace(CFG, steps=4, batch_size=1, checkpoint_every=10)
    result = train(base, domain + sentences + recorded, cfg, tmp_path, progress=quiet())
    # Each step draws the domain batch (index 0), then a replay batch: the recording (2) on
    # odd steps, the sentence (1) on even ones, though each pool holds one clip.
    assert drawn == [[0], [2], [0], [1], [0], [2], [0], [1]]
    assert [s for s, _ in result.replay_kl] == [1, 2, 3, 4]


@pytest.mark.model
@pytest.mark.component
def test_replay_under_utterance_windows_is_held_to_the_base_as_served(
    base, pairs: list[Pair], tmp_path: Path
) -> None:
    # Audio-context fine-tuning: the model learns on windows sized to the clip, but what replay
    # keeps is the base as the gateway serves it, on its own bucket (10 s here).
    domain = make_examples(base, pairs[:1], windows="utterance")
    general = make_examples(base, pairs[1:], windows="utterance", replay=True)
    teacher = general[0].teacher_features
    assert teacher is not None and teacher.shape == (80, 1000)
    assert general[0].features.shape == (80, 600)  # 5.1 s + 0.5 s, rounded up to 6 s
    np.testing.assert_array_equal(teacher[:, :600], general[0].features)  # same mel, cut
    assert domain[0].teacher_features is None
    cfg = replace(CFG, steps=1, batch_size=1, decoder_only=False, checkpoint_every=10)
    result = train(
        base, domain + general, replace(cfg, windows="utterance"), tmp_path, progress=quiet()
    )
    # Before any update the adapted model is the base, yet on a 6 s window it does not decode
    # as the base does on 10 s: the divergence is what the training then reduces.
    assert result.replay_kl[0][1] > 1e-3
    assert result.windows == {600: 1}


@pytest.mark.component
def test_qlora_where_bitsandbytes_has_no_4bit_kernels_is_a_clear_error_before_training(
    base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bitsandbytes build without 4-bit kernels for the device (a fake layer that raises, as
    an old release does on a CPU) is refused in one line before any data is touched."""
    import bitsandbytes
    import torch

    class NoKernel(torch.nn.Linear):
        def __init__(self, n_in: int, n_out: int, **_kw: object) -> None:
            super().__init__(n_in, n_out)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise NotImplementedError("no 4-bit kernel for this device")

    monkeypatch.setattr(bitsandbytes.nn, "Linear4bit", NoKernel)
    ex = [Example(np.zeros((80, 1000), np.float32), (50258, 1, 50257), 1, "x")]
    with pytest.raises(
        TrainError, match=r"no 4-bit kernels for (cpu|cuda) \(NotImplementedError\)"
    ):
        train(base, ex, TrainConfig(qlora=True), tmp_path, progress=quiet())
    assert not (tmp_path / "checkpoint.pt").exists()


@pytest.mark.component
def test_bitsandbytes_is_imported_without_the_hub_lookup_and_transformers_still_sees_kernels() -> (
    None
):
    """In a fresh process (this one may have imported everything already): bitsandbytes comes
    in without ``kernels`` (its hub lookup is skipped, so no request and no warning), and
    transformers, asked afterwards, still finds ``kernels`` installed. Hiding ``kernels`` while
    transformers first asked once poisoned its cached answer for the whole process, and a later
    ``from_pretrained`` failed with "Kernels are not available"."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from voxgate.adapt._offline import import_bitsandbytes\n"
        "bnb = import_bitsandbytes()\n"
        "assert bnb is not None and 'kernels' not in sys.modules, sorted(sys.modules)[:5]\n"
        "import peft, transformers\n"
        "from transformers.utils.import_utils import is_kernels_available\n"
        "assert is_kernels_available()\n"
        "assert sys.modules['bitsandbytes'] is bnb\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kernels-community" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.model
@pytest.mark.component
def test_terms_are_found_as_whole_words_in_any_case_and_focus_changes_the_loss(
    base, pairs: list[Pair], tmp_path: Path
) -> None:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(base.model_dir / "tokenizer.json"))
    terms = ["Predecessors", "conflicts of interest", "book"]  # "books" is not "book"
    ex = make_examples(base, pairs, terms=terms)
    spelled = [tok.decode([e.tokens[p] for p in e.term_positions]) for e in ex]
    assert spelled == [" conflicts of interest", " predecessors book"]
    assert make_examples(base, pairs, replay=True, terms=terms)[0].term_positions == ()
    cfg = replace(CFG, batch_size=1, steps=2, checkpoint_every=10)
    focused = train(base, ex[:1], replace(cfg, focus="terms"), tmp_path / "t", progress=quiet())
    whole = train(base, ex[:1], cfg, tmp_path / "w", progress=quiet())
    # Step 1: the loss on the term's tokens alone, not the mean over the whole sentence.
    assert focused.losses[0][1] != pytest.approx(whole.losses[0][1], rel=1e-3)
    moved = max(
        float(np.abs(a.b - b.b).max())
        for a, b in zip(focused.adapters, whole.adapters, strict=True)
    )
    assert moved > 1e-6
    with pytest.raises(TrainError, match="--focus"):
        train(base, ex, replace(cfg, focus="words"), tmp_path / "bad", progress=quiet())  # type: ignore[arg-type]
