"""The PyTorch engine stays optional: the server imports torch only when asr.engine is torch.

``voxgate.engines.asr.load_asr_engine`` is the one place the serving path reaches
``voxgate.engines.asr._torch`` (import-linter's protected contract checks that statically); this
checks it at run time: importing the whole server and loading its configuration leaves torch
out of ``sys.modules``. Also the configuration's refusals for the torch engine.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from voxgate.engines.asr.config import WhisperConfig
from voxgate.gateway.config import GatewayConfig

SERVER_IMPORT = """
import sys
import voxgate.gateway.runtime, voxgate.gateway.server, voxgate.gateway.service, voxgate.cli
from voxgate.engines.asr import load_asr_engine, WhisperEngine
assert callable(load_asr_engine)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


@pytest.mark.component
def test_the_server_imports_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SERVER_IMPORT], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.unit
def test_ctranslate2_stays_the_default_engine_on_both_devices() -> None:
    assert WhisperConfig().engine == "ctranslate2"
    assert WhisperConfig(device="cuda").engine == "ctranslate2"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"engine": "torch", "compute_type": "int8"}, "int8"),
        ({"engine": "torch", "device": "cuda", "compute_type": "int8_float16"}, "int8"),
        ({"engine": "torch", "compute_type": "float16"}, "float16"),
        ({"engine": "torch", "policy": {"no_repeat_ngram_size": 3}}, "no_repeat_ngram_size"),
    ],
)
def test_the_torch_engine_refuses_what_it_does_not_run(fields: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WhisperConfig.model_validate(fields)


@pytest.mark.unit
def test_join_running_is_allowed_with_the_torch_engine() -> None:
    cfg = GatewayConfig.model_validate(
        {"asr": {"engine": "torch"}, "batcher": {"join_running": True}}
    )
    assert cfg.batcher.join_running
    with pytest.raises(ValueError, match="join_running needs"):
        GatewayConfig.model_validate({"batcher": {"join_running": True}})
