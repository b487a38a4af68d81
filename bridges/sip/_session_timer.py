"""RFC 4028 session timers, the UAS side: what to answer an INVITE's Session-Expires with.

Pure: the bridge passes the request's header values and acts on the result (a 422, or the
interval and who refreshes). Why the bridge uses session timers at all: the RTP inactivity
timeout catches a caller that vanished while its media was flowing, but not a call whose media
is on hold (``a=inactive``, nothing flows either way); a negotiated session timer ends those
when the caller stops refreshing, and a UAC that asked for timers expects them honoured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "RFC_MIN_SE_S",
    "SessionIntervalTooSmall",
    "SessionTimer",
    "SessionTimerError",
    "negotiate_session_timer",
]

#: RFC 4028 4/5: the smallest Session-Expires/Min-SE a compliant peer may use on the wire.
RFC_MIN_SE_S = 90
_MAX_DELTA_S = 86_400 * 7  # anything longer is not a timer worth arming

Refresher = Literal["uac", "uas"]


class SessionTimerError(ValueError):
    """A Session-Expires or Min-SE header that is not delta-seconds (→ 400)."""


class SessionIntervalTooSmall(Exception):
    """The requested interval is below our minimum (→ 422 with ``Min-SE: min_se_s``)."""

    def __init__(self, min_se_s: int) -> None:
        super().__init__(f"session interval below {min_se_s} s")
        self.min_se_s = min_se_s


@dataclass(frozen=True, slots=True)
class SessionTimer:
    """A negotiated session timer.

    Attributes:
        interval_s: the session interval (Session-Expires of our 2xx).
        refresher: who refreshes: ``uac`` (the caller: we end the call if it stops) or ``uas``
            (the bridge refreshes with UPDATE or re-INVITE at half the interval).
        uac_supports: the caller listed ``timer`` in Supported/Require (our 2xx then says
            ``Require: timer`` when the caller refreshes).
    """

    interval_s: int
    refresher: Refresher
    uac_supports: bool

    @property
    def refresh_after_s(self) -> float:
        """When the refresher refreshes (RFC 4028 7.4 / 10: half the interval)."""
        return self.interval_s / 2

    @property
    def expire_after_s(self) -> float:
        """When the side that does not refresh gives up (RFC 4028 10).

        The interval minus min(32 s, a third of it): its BYE goes out before the session would
        expire anyway.
        """
        return self.interval_s - min(32.0, self.interval_s / 3)

    def header(self) -> str:
        """The Session-Expires value for our 2xx (or our own refresh request)."""
        return f"{self.interval_s};refresher={self.refresher}"

    def response_headers(self) -> list[tuple[str, str]]:
        """Headers of a 2xx that accepts this timer (RFC 4028 9)."""
        out = [("Session-Expires", self.header())]
        if self.refresher == "uac":
            out.append(("Require", "timer"))
        return out


def _delta(value: str, what: str) -> tuple[int, dict[str, str]]:
    head, *params = value.split(";")
    head = head.strip()
    if not head.isdigit() or len(head) > 10:
        raise SessionTimerError(f"{what} is not delta-seconds")
    out: dict[str, str] = {}
    for p in params:
        k, _, v = p.partition("=")
        out[k.strip().lower()] = v.strip().lower()
    return int(head), out


def negotiate_session_timer(
    session_expires: str | None,
    min_se: str | None,
    *,
    uac_supports: bool,
    default_s: int,
    min_se_s: int,
) -> SessionTimer | None:
    """The session timer to answer an INVITE (or a refresh) with, per RFC 4028 9.

    Args:
        session_expires: the request's Session-Expires value, or None.
        min_se: the request's Min-SE value, or None.
        uac_supports: ``timer`` in the request's Supported or Require.
        default_s: our preferred interval (0: add none when the request has none).
        min_se_s: our minimum: a shorter requested interval gets 422.

    Returns:
        None when no timer runs (the request had none and the caller cannot refresh, or
        ``default_s`` is 0), else the timer: the request's interval, lowered to ``default_s``
        but never below either minimum or above what was asked; the refresher the caller
        named, else the caller when it supports timers, else us (RFC 4028 table 2).

    Raises:
        SessionIntervalTooSmall: the requested interval is below ``min_se_s``.
        SessionTimerError: a header is not delta-seconds.
    """
    req_min = 0
    if min_se is not None:
        req_min, _ = _delta(min_se, "Min-SE")
    if session_expires is None:
        if not uac_supports or default_s <= 0:
            return None
        return SessionTimer(max(default_s, req_min, min_se_s), "uac", True)
    asked, params = _delta(session_expires, "Session-Expires")
    if asked < min_se_s:
        raise SessionIntervalTooSmall(max(min_se_s, req_min))
    interval = min(asked, _MAX_DELTA_S)
    if default_s > 0 and default_s < interval:
        interval = min(interval, max(default_s, req_min, min_se_s))
    refresher: Refresher
    if not uac_supports:
        refresher = "uas"  # a proxy asked for the timer; the caller cannot refresh
    else:
        named = params.get("refresher")
        refresher = "uas" if named == "uas" else "uac"
    return SessionTimer(interval, refresher, uac_supports)
