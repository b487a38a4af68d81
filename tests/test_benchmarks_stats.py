"""benchmarks/_stats.py: the nearest-rank percentile every benchmark reports."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks._stats import median, percentile

pytestmark = pytest.mark.unit


def test_nearest_rank_on_twenty_values() -> None:
    values = list(range(1, 21))  # 1..20
    assert percentile(values, 95) == 19  # rank ceil(0.95 * 20) = 19, not the maximum
    assert percentile(values, 50) == 10
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 20
    assert percentile(values, 96) == 20


def test_order_does_not_matter_and_inf_is_an_observation() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    lat = [0.5] * 18 + [math.inf, math.inf]  # two missing finals of 20
    assert percentile(lat, 90) == 0.5
    assert percentile(lat, 95) == math.inf


def test_median_is_the_p50() -> None:
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.0  # the lower middle value
    assert median([5.0]) == 5.0


def test_empty_is_nan_and_bad_input_raises() -> None:
    assert math.isnan(percentile([], 95))
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="NaN"):
        percentile([1.0, math.nan], 50)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from([0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100]),
)
def test_matches_numpy_inverted_cdf(values: list[float], q: float) -> None:
    expected = float(np.percentile(np.asarray(values), q, method="inverted_cdf"))
    assert percentile(values, q) == expected
    # At least q % of the values are within the percentile, and it is one of them.
    p = percentile(values, q)
    assert p in values
    assert sum(v <= p for v in values) >= q / 100 * len(values)
