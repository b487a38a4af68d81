"""Silero VAD on ONNX Runtime: one shared session, per-call streaming state.

Facts about the shipped model (``faster_whisper/assets/silero_vad_v6.onnx``), read from its
graph: inputs ``input [seq, 576]`` float32, ``h`` and ``c`` ``[1, 1, 128]``; outputs one speech
probability per row and the new ``hn``/``cn``. It is a 16 kHz-only export: each row is a
512-sample (32 ms) window preceded by the last 64 samples of the window before it, and the
LSTM runs *along* ``seq`` with a batch of one. So the rows of one call can go in one run (the
state chains through them), but windows of different calls cannot share a run: the LSTM would
carry one call's state into the next (``h`` of batch 2 is rejected). 8 kHz calls reach the
segmenter upsampled to 16 kHz, so every call feeds the model at its native rate.

Cost measured on the shared 2-core machine: one window per run 184 µs; 8 windows per run 94 µs
each (the upper bound on what batching could save). One window per 32 ms is ~0.35 CPU s per
stream-minute; batching would save at most ~0.17 s of it, so windows are run as they complete.
"""

from __future__ import annotations

import math
import threading
from importlib import resources
from pathlib import Path
from typing import Self

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

__all__ = [
    "SILERO_CONTEXT",
    "SILERO_RATE_HZ",
    "SILERO_WINDOW",
    "SileroStream",
    "SileroVad",
    "silero_model_path",
]

#: The only rate the shipped export accepts.
SILERO_RATE_HZ = 16_000
#: Samples per model window (32 ms at 16 kHz).
SILERO_WINDOW = 512
#: Samples of the previous window prepended to each row.
SILERO_CONTEXT = 64
_STATE_SHAPE = (1, 1, 128)


def silero_model_path() -> Path:
    """The Silero ONNX file inside the installed ``faster_whisper`` package.

    Raises:
        FileNotFoundError: the package has no ``silero_vad*.onnx`` asset (an old or stripped
            install); the message says which versions ship it.
    """
    assets = resources.files("faster_whisper") / "assets"
    found = sorted(
        (Path(str(p)) for p in assets.iterdir() if p.name.startswith("silero_vad")),
        key=lambda p: p.name,
    )
    onnx = [p for p in found if p.suffix == ".onnx"]
    if not onnx:
        raise FileNotFoundError(
            f"no silero_vad*.onnx in {assets}; faster-whisper>=1.1 ships it "
            "(or set vad.model: webrtc)"
        )
    return onnx[-1]


class SileroVad:
    """The shared model: one ONNX Runtime session per process, used by every call.

    ``InferenceSession.run`` is thread-safe, so calls on the event loop and on worker threads
    may share it; the per-call state lives in :class:`SileroStream`, never here.
    """

    _shared: dict[Path, SileroVad] = {}
    _lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"Silero VAD model not found: {path}")
        opts = ort.SessionOptions()
        # One window is ~0.2 ms of work: threads would cost more in hand-offs than they save,
        # and the calls of a process already run in parallel on the event loop's core.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        self.path = path
        self._session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        shape = self._session.get_inputs()[0].shape
        if shape[-1] != SILERO_WINDOW + SILERO_CONTEXT:
            raise ValueError(
                f"{path.name}: input rows of {shape[-1]} samples, expected "
                f"{SILERO_WINDOW + SILERO_CONTEXT} (a 16 kHz Silero v5/v6 export)"
            )

    @classmethod
    def load(cls, path: Path | None = None) -> Self:
        """The process-wide instance for ``path`` (default: the faster-whisper asset)."""
        p = path or silero_model_path()
        with cls._lock:
            inst = cls._shared.get(p)
            if inst is None:
                inst = cls._shared[p] = cls(p)
                inst.warmup()
        return inst  # type: ignore[return-value]

    def warmup(self) -> None:
        """Run a few windows so that the first call does not pay ONNX Runtime's first runs."""
        self.stream(prime_windows=0).push(np.zeros(4 * SILERO_WINDOW, dtype=np.float32))

    def stream(self, prime_windows: int = 8) -> SileroStream:
        """A fresh per-call state over this model (see :class:`SileroStream` on priming)."""
        return SileroStream(self, prime_windows)

    def run(
        self,
        rows: npt.NDArray[np.float32],
        h: npt.NDArray[np.float32],
        c: npt.NDArray[np.float32],
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Probabilities for ``rows`` (``[n, 576]``) of one call, and its new LSTM state."""
        probs, hn, cn = self._session.run(None, {"input": rows, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), hn, cn


class SileroStream:
    """One call's Silero state: LSTM ``h``/``c``, the 64-sample context, a partial window.

    Feed 16 kHz samples of any length with :meth:`push`; :attr:`probability` is the speech
    probability of the latest complete 32 ms window (0.0 before the first). The segmenter's
    10/20/30 ms frames therefore see the model's answer at most one window late.

    Priming: from the all-zero state the LSTM answers the first windows of *any* sound with a
    burst of confidence (60 Hz hum at -20 dBFS: 0.40, 0.75, 0.67, 0.60 in its first four
    windows, then 0.01), which on a line that hums from the moment it is answered is a false
    SPEECH_BEGIN. So the first ``prime_windows`` windows (256 ms) are run once to settle the
    state, and then again from it, which brings that hum to 0.14 at most and raises real speech
    at the start of a call (a word at 0 s: 0.32 -> 0.57). The cost: the first 256 ms of a call
    are judged when they are complete. Until then :meth:`voice_confidence` answers NaN ("not
    judged yet", not "silence": a caller who speaks from the first sample must not be taken
    for the line's noise floor), and :meth:`late_confidence` answers for those frames once the
    windows that hold them have run.
    """

    def __init__(self, model: SileroVad, prime_windows: int = 8) -> None:
        self._model = model
        self._h = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(SILERO_CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._prime = prime_windows
        self.probability = 0.0
        #: Probabilities of the windows the latest push completed, oldest first.
        self.last_probabilities = np.zeros(0, dtype=np.float32)
        self.windows = 0
        # Probabilities of the windows the priming push ran (window 0 first), for the frames
        # that had to wait for them (late_confidence).
        self._early = np.zeros(0, dtype=np.float32)

    def push(self, samples: npt.NDArray[np.float32]) -> float:
        """Add samples; run every window they complete (in one model run); return the latest."""
        buf = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        n = len(buf) // SILERO_WINDOW
        if self._prime:
            if n < self._prime:
                self._pending = np.array(buf, dtype=np.float32, copy=True)
                return self.probability
            head = buf[: self._prime * SILERO_WINDOW].reshape(self._prime, SILERO_WINDOW)
            _, self._h, self._c = self._model.run(self._rows(head), self._h, self._c)
            self._prime = 0  # the context goes back to zeros: the real pass starts afresh
        if n == 0:
            self._pending = np.array(buf, dtype=np.float32, copy=True)
            self.last_probabilities = np.zeros(0, dtype=np.float32)
            return self.probability
        windows = buf[: n * SILERO_WINDOW].reshape(n, SILERO_WINDOW)
        probs, self._h, self._c = self._model.run(self._rows(windows), self._h, self._c)
        if self.windows == 0:
            self._early = probs
        self._context = windows[-1, -SILERO_CONTEXT:].copy()
        self._pending = np.array(buf[n * SILERO_WINDOW :], dtype=np.float32, copy=True)
        self.probability = float(probs[-1])
        self.last_probabilities = probs
        self.windows += n
        return self.probability

    def _rows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The model's input: each window after the last 64 samples of the one before it."""
        n = len(windows)
        rows = np.empty((n, SILERO_CONTEXT + SILERO_WINDOW), dtype=np.float32)
        rows[:, SILERO_CONTEXT:] = windows
        rows[0, :SILERO_CONTEXT] = self._context
        if n > 1:
            rows[1:, :SILERO_CONTEXT] = windows[:-1, -SILERO_CONTEXT:]
        return rows

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        """The ``VoiceDetector`` seam: one int16 frame in, the latest window's probability.

        NaN while the call's first windows are still priming: those frames are judged later,
        by :meth:`late_confidence`, once the windows that hold them have run.
        """
        p = self.push(frame.astype(np.float32) * np.float32(1.0 / 32768.0))
        return math.nan if self.windows == 0 else p

    def late_confidence(self, end_sample: int) -> float:
        """The probability of the window that holds sample ``end_sample - 1`` of the call.

        For the frames :meth:`voice_confidence` answered NaN: the windows of the priming
        stretch have run by the time a frame gets a number, and each earlier frame reads the
        window its last sample fell in (the model's answer with the frame fully heard).
        """
        w = max(0, end_sample - 1) // SILERO_WINDOW
        return float(self._early[w]) if w < len(self._early) else self.probability
