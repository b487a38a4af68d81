"""Whisper on PyTorch: the CUDA recognition engine (CPU too, for tests), behind ``AsrEngine``.

Nothing here is imported by the CPU server: :func:`engines.asr.load_asr_engine` imports
:mod:`engines.asr._torch.engine` only when ``asr.engine`` is ``torch``, and torch comes from the
``torch`` extra. Modules:

* :mod:`~engines.asr._torch.weights` - the model from a CTranslate2 ``model.bin`` (through the
  project's one reader, :func:`engines.asr._ct2_weights.read_variables`) or a Hugging Face
  checkpoint directory;
* :mod:`~engines.asr._torch.model` - encoder (SDPA) and decoder over a preallocated static KV
  cache with per-row positions; the decode step captured as a CUDA graph per batch bucket;
* :mod:`~engines.asr._torch.processors` - the NumPy loop's logits processors as batched tensor
  operations with per-row parameters;
* :mod:`~engines.asr._torch.loop` - greedy, sampling and beam search with iteration-level joins
  (add / step / abort);
* :mod:`~engines.asr._torch.engine` - :class:`TorchWhisperEngine`, the gateway's engine.
"""
