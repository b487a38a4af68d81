"""Smart Turn v3 (Pipecat's audio end-of-turn classifier, BSD-2-Clause) on ONNX Runtime.

The model reads the last 8 s of a caller's 16 kHz audio as Whisper log-mel features (80 bins,
800 frames, the waveform normalised to zero mean and unit variance, shorter audio padded with
zeros in front) and answers one probability that the speech so far completes a turn. About
8.7 MB of ONNX, run on one thread; measured here at ~25-40 ms per call on the shared 2-core
machine (benchmarks/turn_taking.py runs it once per utterance end).

Where the file comes from: it ships inside the ``pipecat-ai`` wheel on PyPI
(``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``), which the ``turn`` extra
installs (the server's stubs are protobuf 5.29 gencode, so they load on pipecat-ai's protobuf
< 7). The file is read, never imported, from one of:

* ``auto`` (the default): the installed ``pipecat-ai``'s copy where there is one, else no
  model (:func:`smart_turn_spec`);
* a path to the ``.onnx`` file;
* a path to a ``pipecat_ai-*.whl`` (``pip download pipecat-ai --no-deps``): the member is read
  out of the zip in memory, nothing is unpacked;
* ``pipecat``: the installed ``pipecat-ai`` distribution's copy, found through its metadata
  (``importlib.metadata``) without importing Pipecat (an environment that has it).

Nothing is downloaded at run time. Features come from faster-whisper's extractor (the same
Slaney mel filters and STFT as the model's training features; checked against Pipecat's own
NumPy extractor to 1e-4).
"""

from __future__ import annotations

import threading
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Self

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from faster_whisper.feature_extractor import FeatureExtractor

__all__ = [
    "SMART_TURN_FILE",
    "SMART_TURN_SECONDS",
    "SmartTurn",
    "smart_turn_source",
    "smart_turn_spec",
]

#: The model file's name inside the pipecat-ai wheel.
SMART_TURN_FILE = "smart-turn-v3.2-cpu.onnx"
_MEMBER = f"pipecat/audio/turn/smart_turn/data/{SMART_TURN_FILE}"
#: Audio the model reads, s (its features are 8 s of Whisper frames).
SMART_TURN_SECONDS = 8
_RATE_HZ = 16_000
_FRAMES = SMART_TURN_SECONDS * 100


def _installed_member() -> Path | None:
    """The installed pipecat-ai's model file, found through its metadata, or None."""
    try:
        dist = metadata.distribution("pipecat-ai")
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(_MEMBER)))
    return path if path.is_file() else None


def smart_turn_spec(spec: str) -> str:
    """What ``auto`` means here: ``pipecat`` where pipecat-ai's copy is installed, else ``""``.

    ``auto`` is the default so that a server installed with the ``turn`` extra consults the
    audio model without configuration, and one installed without it still starts (silence and
    the words decide its turns; ListModels says no audio model). Any other spec is returned
    as given: a configured path or ``pipecat`` that is missing stops start-up instead.
    """
    if spec != "auto":
        return spec
    return "pipecat" if _installed_member() is not None else ""


def smart_turn_source(spec: str) -> bytes:
    """The model's bytes from a ``.onnx`` path, a pipecat-ai wheel, or ``pipecat``.

    Raises:
        FileNotFoundError: the file, the wheel member or the distribution is not there; the
            message says how to get it.
    """
    if spec == "pipecat":
        try:
            metadata.distribution("pipecat-ai")
        except metadata.PackageNotFoundError:
            raise FileNotFoundError(
                "session.turns.smart_turn_model=pipecat, but pipecat-ai is not installed in "
                "this environment: install voxgate's turn extra (pip install 'voxgate[turn]'), "
                "or give the path of its wheel (pip download pipecat-ai==1.14.0 --no-deps) or "
                "of the .onnx file instead"
            ) from None
        member = _installed_member()
        if member is None:
            raise FileNotFoundError(f"the installed pipecat-ai has no {_MEMBER}")
        return member.read_bytes()
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"Smart Turn model not found: {spec}")
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            try:
                return wheel.read(_MEMBER)
            except KeyError:
                raise FileNotFoundError(f"{path.name} has no {_MEMBER}") from None
    return path.read_bytes()


class SmartTurn:
    """The shared model: one ONNX Runtime session, thread-safe ``run``; no per-call state.

    Attributes:
        name: the model's file name (``smart-turn-v3.2-cpu.onnx`` from a wheel or Pipecat,
            else the ``.onnx`` file's own), which ListModels and a call's effective config
            report, so a client can tell which model decides its turns.
    """

    def __init__(self, model: bytes, name: str = SMART_TURN_FILE) -> None:
        self.name = name
        so = ort.SessionOptions()
        so.inter_op_num_threads = 1
        so.intra_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(model, sess_options=so)
        self._features = FeatureExtractor(feature_size=80, chunk_length=SMART_TURN_SECONDS)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, spec: str) -> Self:
        """Load from a ``.onnx`` path, a pipecat-ai wheel or ``pipecat``."""
        path = Path(spec)
        name = path.name if path.suffix == ".onnx" else SMART_TURN_FILE
        return cls(smart_turn_source(spec), name)

    def features(self, audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The model's input for 16 kHz float audio: the last 8 s, shape (80, 800)."""
        n = SMART_TURN_SECONDS * _RATE_HZ
        x = np.asarray(audio, np.float32)[-n:]
        if len(x) < n:
            x = np.pad(x, (n - len(x), 0))
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        mel = self._features(x, padding=0)
        return np.ascontiguousarray(mel[:, :_FRAMES], dtype=np.float32)

    def probability(self, audio: npt.NDArray[np.float32]) -> float:
        """How likely the speech that ends ``audio`` completes the caller's turn (0..1)."""
        feats = self.features(audio)[None]
        out = self._session.run(None, {"input_features": feats})
        return float(np.asarray(out[0]).reshape(-1)[0])

    def warmup(self) -> None:
        """One run on silence (ONNX Runtime's first run allocates)."""
        self.probability(np.zeros(_RATE_HZ, np.float32))
