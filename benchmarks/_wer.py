"""WER helpers for the ASR benchmarks and tests: the normaliser and scorer of
``voxgate.adapt.scoring``.

One implementation serves the benchmarks, the tests and the ``voxgate adapt`` report, so the
three score a transcript alike; see ``adapt/scoring.py`` for what the normaliser does.
"""

from __future__ import annotations

from voxgate.adapt.scoring import corpus_wer, normalize, number_to_words, wer

__all__ = ["corpus_wer", "normalize", "number_to_words", "wer"]
