"""The SIP bridge's static settings (one bridge process): :class:`BridgeConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from voxgate_client import EchoHandlingName, TurnDetectionName

__all__ = ["BridgeConfig"]


class BridgeConfig(BaseModel):
    """Static settings of one bridge process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    listen_host: str = Field(
        default="0.0.0.0", description="Address for SIP (UDP) and RTP sockets."
    )
    listen_port: int = Field(default=5060, ge=0, le=65535, description="SIP UDP port; 0 picks one.")
    gateway: str = Field(default="127.0.0.1:50051", description="Gateway gRPC target host:port.")
    gateway_tls: bool = Field(
        default=False, description="TLS to the gateway (system roots unless gateway_tls_ca)."
    )
    gateway_tls_ca: Path | None = Field(
        default=None, description="PEM CA the gateway's certificate chains to (implies TLS)."
    )
    gateway_tls_cert: Path | None = Field(
        default=None, description="PEM client certificate, for a gateway with mutual TLS."
    )
    gateway_tls_key: Path | None = Field(default=None, description="Its private key.")
    gateway_token: SecretStr | None = Field(
        default=None, description="Bearer token sent on every gateway RPC (never logged)."
    )
    advertise_host: str | None = Field(
        default=None,
        description="Address written in Contact and SDP; default: the listen address, "
        "or the local address that routes to the caller when listening on 0.0.0.0.",
    )
    rtp_port_min: int = Field(default=10000, ge=1024, le=65535, description="Lowest RTP port.")
    rtp_port_max: int = Field(default=20000, ge=1024, le=65535, description="Highest RTP port.")
    max_calls: int = Field(
        default=100, ge=1, description="Concurrent calls; more get 486 Busy Here."
    )
    ring_ms: int = Field(
        default=0, ge=0, le=60_000, description="Send 180 Ringing and wait this long."
    )
    jitter_ms: int = Field(default=60, ge=20, le=200, description="Receive jitter buffer delay.")
    symmetric_rtp: bool = Field(
        default=True, description="Send RTP to where the caller's RTP comes from."
    )
    language: str = Field(
        default="", description="Caller language hint for the gateway ('' = detect)."
    )
    voice: str = Field(default="", description="Gateway voice ('' = the gateway's default).")
    echo_handling: EchoHandlingName | Literal[""] = Field(
        default="",
        description="How the gateway keeps this trunk's echo of the bot from barging in: "
        "'gate' (one delay and gain: four-wire and digital lines), 'gate_aec3' (the gate, "
        "with WebRTC's echo canceller filling its echo blocks: a soft caller over a loud flat "
        "echo is heard sooner), 'aec3' (WebRTC's echo canceller alone: trunks that echo "
        "through an analogue hybrid); '' = the gateway's default.",
    )
    turns: TurnDetectionName | Literal[""] = Field(
        default="",
        description="End-of-turn detection on each call: 'off', 'silence' (every utterance is "
        "a turn) or 'smart' (silence, the words so far and the gateway's audio model, if it has "
        "one); with it on, the bot answers each EndOfTurn rather than each final; '' = the "
        "gateway's default (session.turns.mode).",
    )
    turn_eagerness: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="'smart' turns: how readily a turn ends, higher sooner (0 = the gateway's).",
    )
    t1_ms: int = Field(default=500, ge=10, le=10_000, description="RFC 3261 T1 (RTT estimate).")
    t2_ms: int = Field(default=4000, ge=10, le=60_000, description="RFC 3261 T2 (retransmit cap).")
    gateway_timeout_s: float = Field(
        default=5.0, gt=0, description="Wait for the gateway's `started`."
    )
    retry_after_s: int = Field(default=5, ge=0, description="Retry-After on 486/503.")
    grace_s: float = Field(
        default=3.0, ge=0, description="Shutdown: wait this long for BYE answers."
    )
    log_content: bool = Field(
        default=False,
        description="Log what callers say, what the bot replies and the keys pressed (a "
        "debugging aid: transcripts and digits are personal data, so they are never logged "
        "otherwise).",
    )
    rtp_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="End a call (BYE) when no RTP has come from the caller for this long, "
        "counted from the ACK (suspended while the media is on hold, a=inactive).",
    )
    max_call_s: float = Field(
        default=3600.0,
        gt=0,
        le=172_800,
        description="End any call (BYE) this long after it was answered.",
    )
    session_expires_s: int = Field(
        default=1800,
        ge=0,
        le=86_400,
        description="RFC 4028 session interval: the most we accept, and what we ask of a "
        "caller that supports timers but asked none (0: only honour the caller's).",
    )
    min_se_s: int = Field(
        default=90,
        ge=1,
        le=86_400,
        description="Shortest session interval accepted; shorter gets 422 (RFC 4028 says "
        "at least 90 on a network; lower values are for tests).",
    )
    latch_probation: int = Field(
        default=4,
        ge=1,
        le=50,
        description="RTP packets in a row (one SSRC, consecutive sequence numbers) that a "
        "source other than the SDP or signalling address needs before the call latches to it.",
    )

    @model_validator(mode="after")
    def _ports(self) -> BridgeConfig:
        if self.rtp_port_min > self.rtp_port_max:
            raise ValueError(
                f"rtp_port_min={self.rtp_port_min} > rtp_port_max={self.rtp_port_max}; swap them"
            )
        if 0 < self.session_expires_s < self.min_se_s:
            raise ValueError(
                f"session_expires_s={self.session_expires_s} < min_se_s={self.min_se_s}"
            )
        if self.turn_eagerness and self.turns in ("off", "silence"):
            raise ValueError(
                f"turn_eagerness={self.turn_eagerness:g} applies to turns='smart', not "
                f"turns={self.turns!r}"
            )
        return self
