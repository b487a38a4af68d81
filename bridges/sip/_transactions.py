"""SIP transactions (RFC 3261 17): responses, their retransmission, ACK matching, our requests.

Server transactions are matched by the top Via branch and method; a retransmitted request is
answered from the cached response, kept for 64*T1. INVITE final responses are retransmitted
(T1 doubling to T2) until the ACK; a 2xx never ACKed within 64*T1 ends the call with BYE.
Client transactions (our BYE, REFER, session refreshes) are resent the same way until a final
response, 408 after 64*T1; a 2xx to our INVITE is ACKed, and the ACK resent to its
retransmissions.

Nothing here knows dialogs or media: datagrams leave through the ``send`` function the bridge
passes in (its transport).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from voxgate.bridges.sip._call import USER_AGENT, SipCall
from voxgate.bridges.sip._config import BridgeConfig
from voxgate.bridges.sip._message import (
    SipMessage,
    SipParseError,
    header_tag,
    make_response,
    new_branch,
    new_tag,
    reply_address,
)

__all__ = ["Retransmit", "ServerTx", "Transactions"]

#: Where a datagram goes: (data, (host, port)).
Send = Callable[[bytes, tuple[str, int]], None]


class Retransmit:
    """Resend a message at T1, 2*T1, ... capped at T2 until stopped or ``deadline_s`` passes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[], None],
        *,
        t1_s: float,
        t2_s: float,
        deadline_s: float,
        on_timeout: Callable[[], None] | None = None,
        on_resend: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._send = send
        self._interval = t1_s
        self._t2 = t2_s
        self._deadline = loop.time() + deadline_s
        self._on_timeout = on_timeout
        self._on_resend = on_resend
        self._handle: asyncio.TimerHandle | None = loop.call_later(t1_s, self._fire)

    def _fire(self) -> None:
        # A millisecond of slack: the last timer is set to the deadline itself, and float
        # rounding must not turn it into a burst of resends just before it.
        if self._loop.time() >= self._deadline - 0.001:
            self._handle = None
            if self._on_timeout is not None:
                self._on_timeout()
            return
        self._send()
        if self._on_resend is not None:
            self._on_resend()
        self._interval = min(2 * self._interval, self._t2)
        delay = min(self._interval, max(0.0, self._deadline - self._loop.time()))
        self._handle = self._loop.call_later(delay, self._fire)

    def cancel(self) -> None:
        """Stop resending (the answer came, or the call is gone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass(slots=True)
class ServerTx:
    """A server transaction: the last response sent, for answering retransmissions."""

    last: bytes | None
    dest: tuple[str, int]
    call: SipCall | None = None


class Transactions:
    """The bridge's transaction layer: every response it sends and every request it makes.

    Args:
        config: the bridge's settings (T1, T2).
        stats: the bridge's counters (``retransmission_in``, ``retransmitted``,
            ``ack_timeout``); shared, so the bridge's ``stats`` shows them.
        send: sends one datagram (the bridge's transport; a no-op once it is closed).
    """

    def __init__(self, config: BridgeConfig, stats: Counter[str], send: Send) -> None:
        self._config = config
        self._stats = stats
        self._send = send
        self._server_tx: dict[str, ServerTx] = {}
        self._await_ack: dict[tuple[str, int], Retransmit] = {}
        self._client_tx: dict[str, asyncio.Future[int]] = {}
        self._acks: dict[str, tuple[bytes, tuple[str, int]]] = {}
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def _t1_s(self) -> float:
        return self._config.t1_ms / 1000

    def close(self) -> None:
        """Stop every retransmission and forget every transaction (shutdown)."""
        for r in self._await_ack.values():
            r.cancel()
        self._await_ack.clear()
        for h in self._timers:
            h.cancel()
        self._timers.clear()

    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def run() -> None:
            self._timers.discard(handle)
            fn()

        handle = loop.call_later(delay_s, run)
        self._timers.add(handle)

    # -- server transactions ----------------------------------------------------------------------

    @staticmethod
    def key(msg: SipMessage, method: str) -> str:
        """The server transaction a request belongs to (RFC 3261 17.2.3)."""
        top = msg.vias()[0]
        branch = top.branch or ""
        if branch.startswith("z9hG4bK"):
            return f"{branch}|{top.host}:{top.port}|{method}"
        # RFC 2543 peers: no usable branch, so match on the dialog-identifying fields.
        num, _ = msg.cseq()
        return f"{msg.call_id}|{header_tag(msg.get('From') or '')}|{num}|{top.host}|{method}"

    def answer_retransmission(self, key: str) -> bool:
        """Whether ``key`` is a known transaction (its request retransmitted): resend its answer."""
        tx = self._server_tx.get(key)
        if tx is None:
            return False
        self._stats["retransmission_in"] += 1
        if tx.last is not None:
            self._send(tx.last, tx.dest)
        return True

    def on_cancel(self, req: SipMessage, source: tuple[str, int]) -> None:
        """CANCEL (RFC 3261 9.2), matched to its INVITE's transaction: ends an unanswered call."""
        inv = self._server_tx.get(self.key(req, "INVITE"))
        if inv is None:
            self.respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        call = inv.call
        self.respond(req, source, 200, "OK", to_tag=call.local_tag if call else None)
        if call is not None and call.state in ("setup", "ringing"):
            call.end("caller cancelled (CANCEL)", bye=False)

    def bind_call(self, key: str, call: SipCall | None) -> None:
        """Attach the INVITE's call to its transaction (a CANCEL then finds it)."""
        self._server_tx[key].call = call

    def reply_bare(
        self, req: SipMessage, source: tuple[str, int], status: int, reason: str
    ) -> None:
        """A stateless reply (400 to a malformed request)."""
        try:
            resp = make_response(req, status, reason, source=source, to_tag=new_tag())
            self._send(resp.encode(), reply_address(req, source))
        except SipParseError:
            pass

    def respond(
        self,
        req: SipMessage,
        source: tuple[str, int],
        status: int,
        reason: str,
        *,
        to_tag: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> bytes:
        """Send a response and cache it in the request's server transaction."""
        resp = make_response(
            req,
            status,
            reason,
            source=source,
            to_tag=to_tag,
            headers=[("Server", USER_AGENT), *(headers or [])],
            body=body,
        )
        data = resp.encode()
        dest = reply_address(req, source)
        key = self.key(req, req.method or "")
        tx = self._server_tx.get(key)
        if tx is None:
            tx = ServerTx(data, dest)
            self._server_tx[key] = tx
            # Keep the transaction for 64*T1 to absorb retransmissions (Timer J / H).
            self._later(64 * self._t1_s, lambda: self._forget_tx(key))
        tx.last, tx.dest = data, dest
        self._send(data, dest)
        return data

    def _forget_tx(self, key: str) -> None:
        self._server_tx.pop(key, None)

    def final(  # noqa: PLR0917  # the response's (request, source, status, reason, tag)
        self,
        req: SipMessage,
        source: tuple[str, int],
        status: int,
        reason: str,
        local_tag: str,
        headers: list[tuple[str, str]] | None = None,
        *,
        body: bytes = b"",
        call: SipCall | None = None,
    ) -> None:
        """A final response to an INVITE, retransmitted until its ACK (Timers G/H, 13.3.1.4).

        ``call``: the call a 2xx answers; it ends with BYE when no ACK comes within 64*T1.
        """
        data = self.respond(
            req, source, status, reason, to_tag=local_tag, headers=headers, body=body
        )
        dest = reply_address(req, source)
        num, _ = req.cseq()
        ack_key = (req.call_id, num)
        old = self._await_ack.pop(ack_key, None)
        if old is not None:
            old.cancel()

        def timeout() -> None:
            self._await_ack.pop(ack_key, None)
            if call is not None and status < 300 and call.state == "answered":
                self._stats["ack_timeout"] += 1
                call.end("no ACK within 64*T1", bye=True)

        def resent() -> None:
            self._stats["retransmitted"] += 1

        self._await_ack[ack_key] = Retransmit(
            asyncio.get_running_loop(),
            lambda: self._send(data, dest),
            t1_s=self._t1_s,
            t2_s=self._config.t2_ms / 1000,
            deadline_s=64 * self._t1_s,
            on_timeout=timeout,
            on_resend=resent,
        )

    def ack(self, call_id: str, cseq: int) -> None:
        """The ACK of an INVITE's final response came (or we gave up on it): stop resending."""
        retrans = self._await_ack.pop((call_id, cseq), None)
        if retrans is not None:
            retrans.cancel()

    def awaiting_ack(self, call: SipCall) -> bool:
        """Whether the call's 200 OK is still being resent (no ACK yet)."""
        return (call.call_id, call.invite.cseq()[0]) in self._await_ack

    # -- client transactions ----------------------------------------------------------------------

    def on_response(self, resp: SipMessage) -> None:
        """A response to one of our requests: complete its transaction (or re-ACK a 2xx)."""
        branch = resp.vias()[0].branch or ""
        ack = self._acks.get(branch)
        if ack is not None and resp.status is not None and 200 <= resp.status < 300:
            self._send(*ack)  # a 2xx to our re-INVITE retransmitted: our ACK was lost
            return
        fut = self._client_tx.get(branch)
        if fut is not None and resp.status is not None and resp.status >= 200 and not fut.done():
            fut.set_result(resp.status)

    async def request(
        self, req: SipMessage, branch: str, dest: tuple[str, int], *, via: str
    ) -> int:
        """Send a request to ``dest`` until its final response (408 after 64*T1); the status.

        A 2xx to our INVITE is ACKed (``via``: our host:port for the ACK's Via), and the ACK
        resent to any retransmission of that 2xx.
        """
        data = req.encode()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._client_tx[branch] = fut
        self._send(data, dest)
        r = Retransmit(
            asyncio.get_running_loop(),
            lambda: self._send(data, dest),
            t1_s=self._t1_s,
            t2_s=self._config.t2_ms / 1000,
            deadline_s=64 * self._t1_s,
            on_timeout=lambda: _resolve(fut, 408),
        )
        try:
            status = await fut
        finally:
            r.cancel()
            self._client_tx.pop(branch, None)
        if req.method == "INVITE" and 200 <= status < 300:
            ack = SipMessage(method="ACK", uri=req.uri)
            ack.add("Via", f"SIP/2.0/UDP {via};branch={new_branch()}")
            for name in ("Max-Forwards", "From", "To", "Call-ID"):
                ack.add(name, req.get(name) or "")
            for route in req.get_all("Route"):  # the ACK of a 2xx follows the route set too
                ack.add("Route", route)
            ack.add("CSeq", f"{req.cseq()[0]} ACK")
            ack_data = ack.encode()
            self._send(ack_data, dest)
            self._acks[branch] = (ack_data, dest)
            self._later(64 * self._t1_s, lambda: self._forget_ack(branch))
        return status

    def _forget_ack(self, branch: str) -> None:
        self._acks.pop(branch, None)


def _resolve(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)
