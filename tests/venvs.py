"""The side environments clients/setup-venvs.sh creates (CI's .ci/run runs it): where tests
that need another protobuf or a framework find their interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = "clients/setup-venvs.sh"


def venv_python(name: str) -> Path:
    """``name``'s interpreter (e.g. ``.venv-client-pb5``); fails the test when it is missing."""
    py = ROOT / name / "bin" / "python"
    if not py.exists():
        pytest.fail(f"{name} is missing: run {SETUP} (CI's .ci/run does) to create it")
    return py
