"""The whole configuration and how it is loaded.

Defaults < YAML file < environment < flags, validated once; every bad field is named by its
dotted path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from voxgate.engines.asr.config import WhisperConfig
from voxgate.engines.tts.config import TtsConfig
from voxgate.gateway.config._call import (
    DtmfConfig,
    SessionConfig,
    VadConfig,
)
from voxgate.gateway.config._capacity import (
    AdmissionConfig,
    BatcherConfig,
    DegradeConfig,
    LimitsConfig,
)
from voxgate.gateway.config._frozen import EngineName
from voxgate.gateway.config._server import SecurityConfig, ServerConfig

__all__ = ["ConfigError", "GatewayConfig", "load_config"]


class GatewayConfig(BaseSettings):
    """Everything ``voxgate serve`` needs, composed from the component configs.

    Environment variables use the ``VOXGATE_`` prefix and ``__`` for nesting, e.g.
    ``VOXGATE_SERVER__PORT=50052`` or ``VOXGATE_VAD__END_SILENCE_MS=800``.
    """

    model_config = SettingsConfigDict(
        env_prefix="VOXGATE_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    server: ServerConfig = Field(default_factory=ServerConfig)  # type: ignore[arg-type]
    vad: VadConfig = Field(default_factory=VadConfig)  # type: ignore[arg-type]
    dtmf: DtmfConfig = Field(default_factory=DtmfConfig)  # type: ignore[arg-type]
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # type: ignore[arg-type]
    batcher: BatcherConfig = Field(default_factory=BatcherConfig)  # type: ignore[arg-type]
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)  # type: ignore[arg-type]
    degrade: DegradeConfig = Field(default_factory=DegradeConfig)  # type: ignore[arg-type]
    session: SessionConfig = Field(default_factory=SessionConfig)  # type: ignore[arg-type]
    security: SecurityConfig = Field(default_factory=SecurityConfig)  # type: ignore[arg-type]
    asr: WhisperConfig = Field(
        default_factory=WhisperConfig,
        description="Whisper engine settings (voxgate.engines.asr.config.WhisperConfig).",
    )
    tts: TtsConfig = Field(
        default_factory=TtsConfig,
        description="Voice settings (voxgate.engines.tts.config.TtsConfig).",
    )
    engines: Annotated[frozenset[EngineName], NoDecode] = Field(
        frozenset({"asr", "tts"}),
        description="Engines to load: 'asr', 'tts', both ('asr,tts'), or 'none' (VAD only).",
    )

    @model_validator(mode="after")
    def _check_join_running(self) -> GatewayConfig:
        # Only a decode loop can take an utterance into a batch that has started (ours in
        # NumPy with decode_loop.always, or the torch engine's, always); with CTranslate2's
        # generate the setting would silently do nothing.
        loop = self.asr.decode_loop.always or self.asr.engine == "torch"
        if self.batcher.join_running and not loop:
            raise ValueError(
                "batcher.join_running needs asr.decode_loop.always: true or asr.engine: torch "
                "(only a decode loop can add an utterance to a running batch)"
            )
        return self

    @model_validator(mode="after")
    def _one_batch_size(self) -> GatewayConfig:
        # The engine's batch size used to be a second setting (asr.max_batch_size) that the
        # batcher did not read: the scheduler could form batches the engine then split, or
        # join fewer than it allowed. The runtime now builds the engine with the batcher's.
        if "max_batch_size" in self.asr.model_fields_set:
            raise ValueError(
                "asr.max_batch_size is not read: the batch size is batcher.max_batch_size, "
                "which the scheduler and the engine share"
            )
        return self

    @field_validator("engines", mode="before")
    @classmethod
    def _parse_engines(cls, value: Any) -> Any:
        """Accept the flag and environment form, "asr,tts" / "none", besides a list."""
        if isinstance(value, str):
            names = [n.strip() for n in value.split(",") if n.strip()]
            return frozenset() if names == ["none"] else frozenset(names)
        return value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


class ConfigError(ValueError):
    """An invalid configuration; the message names every bad field by its path and the fix."""


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            fix = "unknown field; remove it or check its spelling (see gateway/config/)"
        else:
            fix = err["msg"]
            if "input" in err and not isinstance(err["input"], dict | list):
                fix += f" (got {str(err['input'])[:64]!r})"
        lines.append(f"  {path}: {fix}")
    return "\n".join(lines)


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Build the config: defaults < YAML file < environment < ``overrides`` (from flags).

    Raises:
        ConfigError: the file cannot be read or parsed, or any field at any depth is invalid;
            the message lists each field by its dotted path with the fix.
    """
    file_data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            kind = type(loaded).__name__
            raise ConfigError(f"config file {path} must hold a mapping, not {kind}")
        file_data = loaded or {}
    # Environment beats the file: read the env-only view, then layer flags on top.
    try:
        env_only = GatewayConfig.model_validate({}).model_dump(exclude_defaults=True)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, "VOXGATE_* environment variables")) from None
    data = _merge(_merge(file_data, env_only), overrides or {})
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, str(path) if path else "flags and environment")) from None
