"""The base every section model shares, and the names several sections use."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["EchoCancellerName", "EngineName"]


#: An engine a server can load.
EngineName = Literal["asr", "tts"]

#: How a call keeps the echo of its replies out (gateway/echo.py, docs/barge-in.md).
EchoCancellerName = Literal["gate", "gate_aec3", "aec3"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
