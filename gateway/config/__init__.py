"""Typed, validated server configuration.

Static settings are frozen pydantic models, one per component, composed into
:class:`GatewayConfig`, loaded once at start-up from (lowest to highest precedence) defaults, a
YAML file, ``VOXGATE_*`` environment variables and command-line flags. Per-request options come
from the proto and are validated by the servicer against the limits here.

The sections live by concern: how each call runs (``_call``: VAD, DTMF, barge-in, language,
turns, session), what a replica takes on (``_capacity``: limits, batcher, admission,
degradation), the process (``_server``: ports, lifecycle, security), and the whole with its
loading (``_loading``). Import them from here.
"""

from __future__ import annotations

from voxgate.gateway.config._call import (
    BargeInConfig,
    DtmfConfig,
    LanguageConfig,
    SessionConfig,
    TurnsConfig,
    VadConfig,
)
from voxgate.gateway.config._capacity import (
    AdmissionConfig,
    BatcherConfig,
    DegradeConfig,
    LimitsConfig,
)
from voxgate.gateway.config._frozen import EchoCancellerName, EngineName
from voxgate.gateway.config._loading import ConfigError, GatewayConfig, load_config
from voxgate.gateway.config._server import SecurityConfig, ServerConfig

__all__ = [
    "AdmissionConfig",
    "BargeInConfig",
    "BatcherConfig",
    "DegradeConfig",
    "ConfigError",
    "DtmfConfig",
    "EchoCancellerName",
    "EngineName",
    "GatewayConfig",
    "LanguageConfig",
    "LimitsConfig",
    "SecurityConfig",
    "ServerConfig",
    "SessionConfig",
    "TurnsConfig",
    "VadConfig",
    "load_config",
]
