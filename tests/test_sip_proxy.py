"""Kamailio as a stateful dispatcher proxy in front of two real bridges, SIPp as the caller.

Everything runs on loopback on free ports: a real in-process gateway (VAD only), two bridges,
Kamailio with ``deploy/kamailio/kamailio.cfg`` (``record_route()``, ``loose_route()``,
round-robin dispatcher) and SIPp. The binaries come from Debian packages that CI installs
(``kamailio``, ``sip-tester``); a missing one fails the test with the package name.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from voxgate.bridges.bots import SilentBot
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip.testing import Kamailio, SippResult, run_sipp, running_kamailio
from voxgate.gateway.testing.server import running_server
from voxgate_client import Dtmf, ServerEvent, VoiceCall

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("sipp")]

SIPP_DIR = Path(__file__).parent / "sipp"


@dataclass
class Stack:
    proxy: Kamailio
    bridges: list[SipBridge]
    events: dict[str, list[ServerEvent]] = field(default_factory=lambda: defaultdict(list))

    def ended(self) -> list[tuple[str, str]]:
        return [e for b in self.bridges for e in b.ended]

    def live_calls(self) -> int:
        return sum(len(b.calls) for b in self.bridges)

    def call(self) -> tuple[SipBridge, str]:
        """The one live call: its bridge and Call-ID."""
        [(bridge, cid)] = [(b, c) for b in self.bridges for c in b.calls]
        return bridge, cid


@asynccontextmanager
async def proxy_stack(
    tmp_path: Path, bot: Any = None, n: int = 2, **cfg: Any
) -> AsyncIterator[Stack]:
    async with running_server() as srv:
        bridges: list[SipBridge] = []
        events: dict[str, list[ServerEvent]] = defaultdict(list)
        try:
            for i in range(n):
                bridge = SipBridge(
                    BridgeConfig(
                        listen_host="127.0.0.1",
                        listen_port=0,
                        gateway=srv.target,
                        rtp_port_min=30000 + 5000 * i,
                        rtp_port_max=34999 + 5000 * i,
                        **cfg,
                    ),
                    bot if bot is not None else SilentBot(),
                    on_event=lambda cid, ev: events[cid].append(ev),
                )
                await bridge.start()
                bridges.append(bridge)
            async with running_kamailio([b.address for b in bridges], tmp_path / "kamailio") as kam:
                yield Stack(kam, bridges, events)
        finally:
            for bridge in bridges:
                await bridge.aclose()


def ok(result: SippResult, stack: Stack) -> None:
    assert result.returncode == 0, result.explain() + "\n--- kamailio\n" + stack.proxy.log()[-3000:]


async def wait_for(pred: Callable[[], bool], what: str, limit: int = 400) -> None:
    """Poll a condition every 50 ms, at most ``limit`` times (a bound on waiting, not a timing)."""
    for _ in range(limit):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_sipp_builtin_uac_through_the_proxy_spreads_calls_over_both_bridges(
    tmp_path: Path,
) -> None:
    """SIPp's own ``uac`` ignores Record-Route: the proxy's Call-ID table routes its ACK and BYE."""
    async with proxy_stack(tmp_path) as stack:
        res = await run_sipp(
            "uac", stack.proxy.address, cwd=tmp_path, calls=4, rate=20, duration_ms=1000
        )
        ok(res, stack)
        await wait_for(lambda: stack.live_calls() == 0, "every call torn down")
        per_bridge = [b.stats["calls"] for b in stack.bridges]
        reasons = [r for _, r in stack.ended()]
    assert per_bridge == [2, 2], per_bridge  # round-robin
    assert reasons == ["caller hung up (BYE)"] * 4, reasons
    assert all(b.stats["ack_timeout"] == 0 for b in stack.bridges)


async def test_bridge_bye_and_info_dtmf_follow_the_route_set_through_the_proxy(
    tmp_path: Path,
) -> None:
    """The bridge hangs up (max call duration): its BYE carries Route and reaches the caller.

    Before route sets, Kamailio answered that BYE ``404 Not here`` and the caller was never hung
    up. The caller's two SIP INFO key presses on the way arrive as the gateway's Dtmf events.
    """
    async with proxy_stack(tmp_path, max_call_s=3.0) as stack:
        res = await run_sipp(
            SIPP_DIR / "uac_proxy_info_wait_bye.xml", stack.proxy.address, cwd=SIPP_DIR
        )
        ok(res, stack)
        await wait_for(lambda: stack.live_calls() == 0, "call torn down")
        [(call_id, reason)] = stack.ended()
        keys = [(e.digit, e.duration_ms) for e in stack.events[call_id] if isinstance(e, Dtmf)]
        byes = sum(b.stats["bye_sent"] for b in stack.bridges)
    assert reason == "maximum call duration (3 s)"
    assert byes == 1
    assert keys == [("5", 160), ("#", 100)]


@pytest.mark.parametrize(
    ("frag", "scenario", "expect_ok"),
    [
        ("200 OK", "uac_proxy_refer.xml", True),
        ("486 Busy Here", "uac_proxy_refer_fails.xml", False),
    ],
)
async def test_refer_through_the_proxy(
    tmp_path: Path, frag: str, scenario: str, expect_ok: bool
) -> None:
    """REFER → 202 → NOTIFY sipfrag; success ends the call with our BYE, failure leaves it up."""
    async with proxy_stack(tmp_path, n=1) as stack:
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / scenario,
                stack.proxy.address,
                cwd=SIPP_DIR,
                variables={"frag": frag},
            )
        )
        await wait_for(
            lambda: (
                sipp.done()
                or any(c.state == "confirmed" for b in stack.bridges for c in b.calls.values())
            ),
            "call confirmed",
        )
        assert not sipp.done(), (await sipp).explain()
        bridge, call_id = stack.call()
        result = await bridge.transfer(call_id, "sip:agent@127.0.0.1:5999")
        ok(await sipp, stack)
        await wait_for(lambda: stack.live_calls() == 0, "call torn down")
        [(_, reason)] = stack.ended()
    assert result.ok is expect_ok
    assert result.status == int(frag.split(maxsplit=1)[0])
    if expect_ok:
        assert reason == "transferred (200 OK)" and bridge.stats["bye_sent"] == 1
    else:
        assert reason == "caller hung up (BYE)" and bridge.stats["bye_sent"] == 0


async def test_a_bots_transfer_is_a_refer_through_the_proxy(tmp_path: Path) -> None:
    """The bot contract end to end: ``await call.transfer(uri)`` in a bot → REFER → NOTIFY 200."""
    outcomes: list[Any] = []

    async def transferring_bot(call: VoiceCall) -> None:
        assert call.info.channel == "sip" and call.info.transfer_supported
        outcomes.append(await call.transfer("sip:agent@127.0.0.1:5999"))
        async for _ in call:  # until the bridge ends the call
            pass

    async with proxy_stack(tmp_path, bot=transferring_bot, n=1) as stack:
        res = await run_sipp(
            SIPP_DIR / "uac_proxy_refer.xml",
            stack.proxy.address,
            cwd=SIPP_DIR,
            variables={"frag": "200 OK"},
        )
        ok(res, stack)
        await wait_for(lambda: stack.live_calls() == 0, "call torn down")
        [(_, reason)] = stack.ended()
        byes = stack.bridges[0].stats["bye_sent"]
    [result] = outcomes
    assert result.ok and result.sip_status == 200, result
    assert reason.startswith("transferred") and byes == 1
