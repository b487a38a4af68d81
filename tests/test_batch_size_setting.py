"""One batch size: batcher.max_batch_size is what the scheduler forms and what the engine is built
with; the engine's own asr.max_batch_size (a second setting the batcher never read) is refused.
"""

from __future__ import annotations

import pytest

from voxgate.gateway.config import ConfigError, load_config
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import EngineHubImpl


@pytest.mark.unit
def test_the_engine_batch_size_is_not_a_second_setting() -> None:
    with pytest.raises(ConfigError, match=r"batch size is batcher\.max_batch_size"):
        load_config(overrides={"asr": {"max_batch_size": 16}})
    assert load_config(overrides={"batcher": {"max_batch_size": 16}}).batcher.max_batch_size == 16


@pytest.mark.model
async def test_the_engine_is_built_with_the_batchers_batch_size() -> None:
    cfg = load_config(
        overrides={
            "engines": "asr",
            "batcher": {"max_batch_size": 3, "workers": 1},
            "admission": {"capacity_calls": 4},  # no calibration: not what this is about
        }
    )
    hub = EngineHubImpl(cfg)
    await hub.start(GatewayMetrics())
    try:
        assert hub._batcher is not None
        assert hub._batcher.policy.max_batch_size == 3
        assert [e.config.max_batch_size for e in hub._asr_engines] == [3]  # type: ignore[attr-defined]
    finally:
        await hub.aclose()
