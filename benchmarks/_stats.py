"""The one percentile definition every benchmark reports: nearest rank.

``percentile(values, q)`` is the smallest observation ``v`` such that at least ``q`` % of the
observations are ``<= v``: sort the ``n`` values and take the one at 1-based rank
``ceil(q / 100 * n)`` (rank 1 for ``q = 0``). This is NumPy's ``method="inverted_cdf"``.

Why this one:

* it is always an observed value, never an interpolation between two, so a missing result
  recorded as ``inf`` shows up in a tail percentile instead of being averaged away;
* "p95 <= budget" then means exactly "at least 95 % of the observations were within the
  budget", which is what a latency budget promises.

It is *not* NumPy's ``method="higher"`` (index ``ceil((n - 1) q / 100)``), which is one rank
more pessimistic for many ``n`` (for 20 values its p95 is the maximum; nearest rank's is the
19th), nor the default ``"linear"`` interpolation. ``median`` is ``percentile(values, 50)``,
the lower middle value of an even count, so a benchmark's "median" and "p50" are one number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

__all__ = ["median", "percentile"]


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile of ``values`` (``0 <= q <= 100``); NaN when empty.

    ``inf`` values sort last and are returned like any other observation.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} must be within [0, 100]")
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    if n == 0:
        return math.nan
    if any(math.isnan(v) for v in ordered):
        raise ValueError("percentile of values containing NaN is undefined")
    # Exact arithmetic: q * n / 100 computed in floats can land a hair above an integer.
    rank = math.ceil(Fraction(str(q)) * n / 100)
    return ordered[max(1, rank) - 1]


def median(values: Iterable[float]) -> float:
    """``percentile(values, 50)``: the lower of the two middle values for an even count."""
    return percentile(values, 50)
