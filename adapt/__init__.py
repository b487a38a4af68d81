"""Domain adaptation: fine-tune the served Whisper model and write it back as a named model.

``voxgate adapt`` (the ``adapt`` extra: torch, transformers, peft) reads the CTranslate2 model the
gateway serves back into ``transformers`` exactly (:mod:`voxgate.adapt.convert`), trains LoRA
adapters on the user's recordings and synthesized domain phrases (:mod:`voxgate.adapt.data`,
:mod:`voxgate.adapt.train`), merges them, and writes a CTranslate2 directory into a models directory
atomically (:mod:`voxgate.adapt.publish`), where ``voxgate serve --models-dir`` serves it per call
by name.

Nothing in ``gateway``, ``engines`` or ``clients`` imports this package (an import-linter
contract), so serving never loads torch.
"""
