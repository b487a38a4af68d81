"""Per-call timers: maximum duration, RTP inactivity and the session timer's expiry.

Each ends the call with BYE (the call's supervisor tears it down): ``max_call_s`` after the
answer; no RTP accepted from the caller for ``rtp_timeout_s`` (counted from the ACK or the
last new media, suspended while the media is on hold); no session refresh from the caller in
time (RFC 4028, when the caller is the refresher). When we are the refresher, the timer
hands the refresh to the dialog layer (the ``refresh`` function the bridge passes in).

A call's timers live in its ``timers`` dict, by name, so teardown cancels them all.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from voxgate.bridges.sip._call import SipCall
from voxgate.bridges.sip._config import BridgeConfig

__all__ = ["HOLD_KEEPALIVE_S", "CallTimers"]

#: While the media is on hold, a silent frame goes to the gateway this often (its idle timeout).
HOLD_KEEPALIVE_S = 10.0


class CallTimers:
    """Arms, re-arms and fires the lifetime timers of every call of one bridge.

    Args:
        config: the bridge's settings (``max_call_s``, ``rtp_timeout_s``).
        stats: the bridge's counters (``max_duration``, ``rtp_timeout``, ``session_expired``).
        refresh: sends our session refresh when it is due (we are the refresher).
        keepalive: tells the gateway the held call is still there (a silent frame).
    """

    def __init__(
        self,
        config: BridgeConfig,
        stats: Counter[str],
        *,
        refresh: Callable[[SipCall], None],
        keepalive: Callable[[SipCall], None],
    ) -> None:
        self._config = config
        self._stats = stats
        self._refresh = refresh
        self._keepalive = keepalive

    def arm(self, call: SipCall, name: str, delay_s: float, fn: Callable[[], None]) -> None:
        """(Re)arm the call's named timer; teardown cancels them all."""
        old = call.timers.pop(name, None)
        if old is not None:
            old.cancel()
        if call.state != "ended":
            call.timers[name] = asyncio.get_running_loop().call_later(delay_s, fn)

    def cancel_all(self, call: SipCall) -> None:
        """Stop every timer of the call (teardown)."""
        for handle in call.timers.values():
            handle.cancel()
        call.timers.clear()

    def answered(self, call: SipCall) -> None:
        """The call was answered (200 OK sent): start its maximum duration and session timer."""
        max_s = self._config.max_call_s
        self.arm(call, "max_call", max_s, lambda: self._max_duration(call))
        self.arm_session(call)

    def _max_duration(self, call: SipCall) -> None:
        self._stats["max_duration"] += 1
        call.end(f"maximum call duration ({self._config.max_call_s:g} s)", bye=True)

    # -- RTP inactivity ---------------------------------------------------------------------------

    @staticmethod
    def on_hold(call: SipCall) -> bool:
        """Whether the media is inactive (``a=inactive`` or the old ``c=0.0.0.0`` hold)."""
        return call.choice.direction == "inactive" or call.choice.remote[0] == "0.0.0.0"

    def arm_rtp_check(self, call: SipCall) -> None:
        """The next RTP check: a full timeout from now, or the keep-alive period on hold."""
        timeout = self._config.rtp_timeout_s
        delay = min(timeout, HOLD_KEEPALIVE_S) if self.on_hold(call) else timeout
        self.arm(call, "rtp", delay, lambda: self._check_rtp(call))

    def _check_rtp(self, call: SipCall) -> None:
        """The RTP inactivity timeout: end the call when nothing came back for too long.

        Only packets the latch accepted count (a stranger's packets must not keep a dead call
        alive). While the media is inactive (``a=inactive`` or the old ``c=0.0.0.0`` hold)
        nothing is expected, so the clock restarts instead.
        """
        if call.ended.is_set() or call.media is None:
            return
        timeout = self._config.rtp_timeout_s
        now = asyncio.get_running_loop().time()
        if self.on_hold(call):
            # On hold: nothing flows, yet the gateway ends a stream that sends no audio for its
            # idle timeout (the client would be gone). 20 ms of silence now and then says "still
            # here" without moving its audio clock much.
            call.rtp_since = now
            self._keepalive(call)
            delay = min(timeout, HOLD_KEEPALIVE_S)
            self.arm(call, "rtp", delay, lambda: self._check_rtp(call))
            return
        idle = now - max(call.rtp_since, call.media.last_rx or 0.0)
        if idle >= timeout - 1e-3:
            self._stats["rtp_timeout"] += 1
            call.end(f"no RTP for {timeout:g} s", bye=True)
            return
        self.arm(call, "rtp", timeout - idle, lambda: self._check_rtp(call))

    # -- session timer (RFC 4028) -----------------------------------------------------------------

    def arm_session(self, call: SipCall) -> None:
        """(Re)arm the session timer as negotiated: expiry (the caller refreshes) or our refresh."""
        st = call.session_timer
        if st is None:
            old = call.timers.pop("session", None)
            if old is not None:
                old.cancel()
        elif st.refresher == "uac":
            self.arm(call, "session", st.expire_after_s, lambda: self._session_expired(call))
        else:
            self.arm(call, "session", st.refresh_after_s, lambda: self._refresh(call))

    def _session_expired(self, call: SipCall) -> None:
        self._stats["session_expired"] += 1
        call.end("session timer expired (no refresh)", bye=True)
