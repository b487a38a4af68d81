"""The process: ports and lifecycle, and the port's security (TLS, mutual TLS, tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator

from voxgate.gateway.config._frozen import _Frozen

__all__ = ["SecurityConfig", "ServerConfig"]


class ServerConfig(_Frozen):
    """Process-level settings: ports, lifecycle."""

    host: str = Field("127.0.0.1", description="Address to bind the gRPC port to.")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Prometheus /metrics port on ``metrics_host``; 0 picks a free one (as "
        "``port`` does); unset (null) serves no metrics. The address is logged at start-up.",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Address to bind /metrics to, apart from ``host``: plain HTTP without "
        "authentication, so it stays on loopback unless a scraper on another host needs it "
        "(containers: 0.0.0.0 behind a network policy; see docs/security.md).",
    )
    grace_s: float = Field(
        10.0, ge=0.0, le=600.0, description="SIGTERM drain period for active calls, s."
    )
    flush_s: float = Field(
        5.0,
        ge=0.0,
        le=120.0,
        description="After the grace period, time that calls still open get to deliver the "
        "final of their in-progress utterance (then UNAVAILABLE) before they are cancelled, s.",
    )
    log_format: str = Field("text", pattern="^(text|json)$", description="Log line format.")
    log_level: str = Field("INFO", description="Python logging level name.")
    # HTTP/2 connection lifetime. A call is one stream that may last hours; these settings find
    # dead peers and let balancers spread new calls without ever cutting a call in progress.
    keepalive_time_s: float = Field(
        30.0,
        ge=1.0,
        le=7_200.0,
        description="Ping a connection after this long without traffic, s: finds peers that "
        "vanished (a dropped NAT mapping, a crashed client) without waiting for TCP.",
    )
    keepalive_timeout_s: float = Field(
        20.0,
        ge=1.0,
        le=600.0,
        description="A ping not answered within this closes the connection and cancels its "
        "calls, s.",
    )
    keepalive_permit_without_calls: bool = Field(
        True,
        description="Accept client keepalive pings (and ping) while a connection has no call; "
        "clients that keep a warm channel between calls need this, or they get GOAWAY.",
    )
    min_client_ping_interval_s: float = Field(
        10.0,
        ge=0.0,
        le=3_600.0,
        description="Clients that ping more often than this without data are sent GOAWAY "
        "(too_many_pings), s; gRPC's default of 5 min would refuse common client settings.",
    )
    max_connection_idle_s: float = Field(
        900.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="A connection with no call for this long is closed with GOAWAY, s (0 = "
        "never); clients reconnect on their next call, perhaps to another replica.",
    )
    max_connection_age_s: float = Field(
        1_800.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="After this long (gRPC adds +-10% jitter) a connection gets GOAWAY, so new "
        "calls open a new connection and spread over replicas added since, s (0 = never). "
        "Calls in progress go on, see max_connection_age_grace_s.",
    )
    max_connection_age_grace_s: float | None = Field(
        None,
        ge=0.0,
        le=24 * 86_400.0,
        description="How long calls may go on over a connection past its max age before it is "
        "closed, s. Unset (the default): longer than any call can last "
        "(limits.max_call_duration_s plus a minute; forever when calls have no limit), so "
        "connection age never cuts a call.",
    )


def _readable_file(path: Path | None) -> Path | None:
    """Fail at start-up, naming the file, rather than at the first TLS handshake."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


class SecurityConfig(_Frozen):
    """TLS, mutual TLS and bearer tokens on the gRPC port (see docs/security.md).

    Token values never appear in a config file, a log line or an error message: the file or
    environment variable named here holds them, and errors name the entry by its position.
    """

    tls_cert: Path | None = Field(
        None, description="PEM server certificate chain; with tls_key, the port speaks TLS."
    )
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert (unencrypted).")
    client_ca: Path | None = Field(
        None,
        description="PEM CA bundle for mutual TLS: when set, every client must present a "
        "certificate signed by it (the TLS handshake fails otherwise).",
    )
    tokens_file: Path | None = Field(
        None,
        description="YAML list of bearer tokens (each a string, or {token, tenant, max_calls}); "
        "re-read on SIGHUP. Setting it turns authentication on.",
    )
    tokens_env: str = Field(
        "VOXGATE_TOKENS",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable that may hold tokens in the same format (a plain "
        "comma-separated list works); when it is set, authentication is on.",
    )
    max_calls_per_token: int = Field(
        0,
        ge=0,
        description="Calls (Converse, StreamingRecognize, Synthesize) one token may have open "
        "at once on this replica, unless its entry sets max_calls; 0 = no per-token limit.",
    )
    open_health: bool = Field(
        True,
        description="grpc.health.v1 answers without a token (load balancers and kubelet "
        "probes carry none); false puts it behind the tokens too.",
    )
    reflection: bool = Field(
        True, description="Serve gRPC reflection (behind the tokens when they are on)."
    )

    _check_files = field_validator("tls_cert", "tls_key", "client_ca", "tokens_file")(
        _readable_file
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both for TLS, or neither")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("client_ca (mutual TLS) needs tls_cert and tls_key")
        return self
