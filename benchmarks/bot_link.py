"""What the bot contract costs: a bot's action-to-event round trip, by door, side by side.

A bot handler plays mark ping-pong with a real gateway (grpc.aio on loopback, VAD only, so
nothing but the transport is measured): it sends ``mark("p<k>")`` and waits for
``MarkReached("p<k>")``, ``--rounds`` times per call, with ``--calls`` calls at once. The round
trip is what every bot action pays before the gateway's answer comes back. Doors, interleaved
in each repeat (the order alternates, since the machine is noisy):

* ``direct``: the handler on the ``Call`` that ``converse()`` returns (the baseline: a bot
  that dials Converse itself);
* ``link (in-process)``: a bridge's ``BotLink`` with the handler in-process (the built-in bots);
* ``link (gRPC bot)``: a ``BotLink`` dialling the handler served by ``serve_bot`` on loopback,
  in this same process (a bot in its own process adds only its own scheduling).

Run: ``python -m benchmarks.bot_link --calls 1,10,50 --rounds 50 --repeats 3``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks._stats import percentile
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    BotLink,
    CallConfig,
    CallInfo,
    MarkReached,
    VoiceCall,
    VoxgateClient,
    serve_bot,
)

DOORS = ("direct", "link (in-process)", "link (gRPC bot)")
CONFIG = CallConfig(encoding="mulaw", sample_rate_hz=8000)


def pinger(rounds: int, out: list[float]) -> Callable[[VoiceCall], Awaitable[None]]:
    """A bot that measures ``rounds`` mark round trips, then hangs up."""

    async def bot(call: VoiceCall) -> None:
        loop = asyncio.get_running_loop()
        for k in range(rounds):
            name = f"p{k}"
            t0 = loop.time()
            await call.mark(name)
            async for ev in call:
                if isinstance(ev, MarkReached) and ev.name == name:
                    break
            out.append(1000.0 * (loop.time() - t0))
        await call.hangup()
        async for _ in call:
            pass

    return bot


async def one_call(client: VoxgateClient, door: str, bot_address: str, handler: Any) -> None:
    call = await client.converse(CONFIG)
    async with call:
        if door == "direct":
            await handler(call)
            return
        target = bot_address if door == "link (gRPC bot)" else handler
        outcome = await BotLink(call, target, CallInfo(channel="sip")).run()
        if outcome.bot_fault is not None:
            raise RuntimeError(f"{door}: {outcome.reason}")


async def run(calls: int, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Round trips (ms) per door, ``repeats`` interleaved passes of ``calls`` concurrent calls."""
    rtts: dict[str, list[float]] = {d: [] for d in DOORS}
    current: list[list[float]] = [[]]

    async def served(call: VoiceCall) -> None:
        await pinger(rounds, current[0])(call)

    async with (
        running_server(limits={"max_concurrent_calls": max(100, calls)}) as srv,
        VoxgateClient(srv.target) as client,
        await serve_bot(served) as bot,
    ):
        for rep in range(repeats):
            order = DOORS if rep % 2 == 0 else DOORS[::-1]
            for door in order:
                out: list[float] = []
                current[0] = out
                handler = pinger(rounds, out)
                await asyncio.gather(
                    *(one_call(client, door, bot.address, handler) for _ in range(calls))
                )
                if len(out) != calls * rounds:
                    raise RuntimeError(f"{door}: {len(out)} of {calls * rounds} round trips")
                rtts[door] += out
    return rtts


async def main(argv: list[str] | None = None) -> dict[int, dict[str, dict[str, float]]]:
    """Print the table; returns ``{calls: {door: {p50, p95, n}}}``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", default="1,10,50", help="concurrent calls, comma-separated")
    ap.add_argument("--rounds", type=int, default=50, help="round trips per call")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved passes per door")
    args = ap.parse_args(argv)
    results: dict[int, dict[str, dict[str, float]]] = {}
    print(f"{'calls':>5}  {'door':<18} {'n':>6} {'p50 ms':>8} {'p95 ms':>8} {'p50 vs direct':>14}")
    for n in (int(x) for x in args.calls.split(",")):
        rtts = await run(n, args.rounds, args.repeats)
        base = percentile(rtts["direct"], 50)
        results[n] = {}
        for door in DOORS:
            p50, p95 = percentile(rtts[door], 50), percentile(rtts[door], 95)
            results[n][door] = {"p50": p50, "p95": p95, "n": float(len(rtts[door]))}
            print(
                f"{n:>5}  {door:<18} {len(rtts[door]):>6} {p50:>8.2f} {p95:>8.2f} "
                f"{p50 / base:>13.2f}x"
            )
    return results


if __name__ == "__main__":
    asyncio.run(main())
