"""Pure parts of the TTS engine: provider choice, the byte-bounded cache, the limiter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from voxgate.engines.tts import TtsConfig, select_providers, soft_limit
from voxgate.engines.tts._cache import ByteLruCache

pytestmark = pytest.mark.unit

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


def names(providers: Sequence[str | tuple[str, dict[str, str]]]) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers]


def test_cpu_only_runtime_gets_cpu() -> None:
    assert select_providers([CPU]) == [CPU]
    assert select_providers(["AzureExecutionProvider", CPU]) == [CPU]


def test_gpu_runtime_prefers_tensorrt_fp16_then_cuda() -> None:
    chosen = select_providers([TRT, CUDA, CPU], trt_cache_dir="cache/trt")
    assert names(chosen) == [TRT, CUDA, CPU]
    trt = chosen[0]
    assert isinstance(trt, tuple)
    assert trt[1]["trt_fp16_enable"] == "True"
    assert trt[1]["trt_engine_cache_enable"] == "True"
    assert trt[1]["trt_engine_cache_path"] == "cache/trt"
    assert names(select_providers([CUDA, CPU])) == [CUDA, CPU]


def test_requested_providers_are_filtered_and_end_with_cpu() -> None:
    assert names(select_providers([CUDA, CPU], requested=[TRT, CUDA])) == [CUDA, CPU]
    assert names(select_providers([TRT, CUDA, CPU], requested=[CPU])) == [CPU]
    assert names(select_providers([TRT, CUDA, CPU], requested=[CUDA, TRT])) == [CUDA, TRT, CPU]


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    cache: ByteLruCache[str] = ByteLruCache(100)
    assert cache.put("a", "A", 40) and cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recent
    assert cache.put("c", "C", 40)  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.nbytes == 80 and len(cache) == 2
    assert not cache.put("huge", "H", 101)
    assert cache.get("huge") is None and cache.nbytes == 80
    assert cache.put("a", "A2", 10)  # replacing frees the old size
    assert cache.nbytes == 50 and cache.get("a") == "A2"
    assert (cache.hits, cache.misses) == (4, 2)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 60)), max_size=40))
def test_cache_never_exceeds_its_bound(ops: list[tuple[int, int]]) -> None:
    cache: ByteLruCache[int] = ByteLruCache(100)
    for key, size in ops:
        cache.put(key, size, size)
        assert cache.nbytes <= 100
        assert cache.nbytes == sum(v for k in range(6) if (v := cache._items.get(k, (0, 0))[1]))


@given(
    arrays(np.float32, st.integers(1, 200), elements=st.floats(-50, 50, width=32)),
    st.floats(0.1, 0.99),
)
def test_limiter_bounds_and_passes_quiet_samples(x: np.ndarray, threshold: float) -> None:
    y = soft_limit(x, 1.0, threshold)
    assert np.all(np.abs(y) < 1.0)
    quiet = np.abs(x) <= threshold
    np.testing.assert_array_equal(y[quiet], x[quiet])
    assert np.all(np.sign(y) == np.sign(x))
    # Monotonic: a louder input is never a quieter output.
    order = np.argsort(x)
    assert np.all(np.diff(y[order]) >= 0)


def test_limiter_applies_fixed_gain_below_knee() -> None:
    x = np.array([0.1, -0.2], dtype=np.float32)
    np.testing.assert_allclose(soft_limit(x, 2.0, 0.9), [0.2, -0.4], rtol=1e-6)


def test_config_rejects_inconsistent_windows() -> None:
    with pytest.raises(ValueError, match="window_frames"):
        TtsConfig(first_window_frames=64, window_frames=32)
    with pytest.raises(ValueError):
        TtsConfig(context_frames=-1)
    with pytest.raises(ValueError):
        TtsConfig(unknown_field=1)  # type: ignore[call-arg]
    config = TtsConfig()
    assert (config.voice, config.context_frames) == ("joe", 28)
    with pytest.raises(ValueError):
        config.context_frames = 4


def test_the_voice_can_be_pinned_to_another_gpu_than_whisper() -> None:
    chosen = select_providers([TRT, CUDA, CPU], trt_cache_dir="cache/trt", device_id=1)
    assert [p[1]["device_id"] for p in chosen if isinstance(p, tuple)] == ["1", "1"]
