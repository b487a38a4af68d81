"""Whisper on PyTorch: the CUDA recognition engine (CPU too, for tests), behind ``AsrEngine``.

Nothing here is imported by the CPU server: :func:`voxgate.engines.asr.load_asr_engine` imports
:mod:`voxgate.engines.asr._torch.engine` only when ``asr.engine`` is ``torch``, and torch comes from
the
``torch`` extra. Modules:

* :mod:`~voxgate.engines.asr._torch.weights` - the model from a CTranslate2 ``model.bin`` (through
the
  project's one reader, :func:`voxgate.engines.asr._ct2_weights.read_variables`) or a Hugging Face
  checkpoint directory;
* :mod:`~voxgate.engines.asr._torch.model` - encoder (SDPA) and decoder over a preallocated static
KV
  cache with per-row positions; the decode step captured as a CUDA graph per batch bucket;
* :mod:`~voxgate.engines.asr._torch.processors` - the NumPy loop's logits processors as batched
tensor
  operations with per-row parameters;
* :mod:`~voxgate.engines.asr._torch.loop` - greedy, sampling and beam search with iteration-level
joins
  (add / step / abort);
* :mod:`~voxgate.engines.asr._torch.engine` - :class:`TorchWhisperEngine`, the gateway's engine.
"""
