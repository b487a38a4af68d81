"""What the security layer costs a caller: plaintext vs token vs TLS + token vs mTLS + token.

Four real in-process gateways, one per setting, with the fake tone voice (FakeToneHub: the
engines are irrelevant here, the work measured is transport, handshake, interceptor and quota
bookkeeping). Three costs, measured in rounds that interleave the four settings in a rotating
order, so that load from the rest of the machine falls on all of them alike:

* ``unary``: one ``ListVoices`` on a warm channel (the interceptor's token check per RPC);
* ``call setup``: a ``Converse`` from the first write to ``SessionStarted`` on a warm channel,
  then a clean end (the per-call check plus the quota slot);
* ``connect``: a new channel's first ``ListVoices`` (TCP, the TLS handshake, the RPC).

Reports median and p95 (nearest rank, benchmarks/_stats.py) and each median's ratio to
plaintext without tokens, the setting a user compares against.

    python -m benchmarks.security_overhead [--rounds 7] [--unary 200] [--calls 30] [--connects 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchmarks._stats import median, percentile
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.pki import Pki, make_pki
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc
from voxgate_client import CallConfig, auth_metadata, tls_credentials

TOKEN = "bench-token-0123456789abcdef"
SETTINGS = ("plaintext", "token", "tls+token", "mtls+token")
KINDS = ("unary", "call setup", "connect")


@dataclass
class Setting:
    name: str
    target: str = ""
    creds: grpc.ChannelCredentials | None = None
    token: str | None = None
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def channel(self) -> grpc.aio.Channel:
        if self.creds is None:
            return grpc.aio.insecure_channel(self.target)
        return grpc.aio.secure_channel(self.target, self.creds)


def security_section(name: str, pki: Pki, tokens: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if name != "plaintext":
        out["tokens_file"] = str(tokens)
    if name in ("tls+token", "mtls+token"):
        out |= {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)}
    if name == "mtls+token":
        out["client_ca"] = str(pki.ca)
    return out


def credentials(name: str, pki: Pki) -> grpc.ChannelCredentials | None:
    if name == "tls+token":
        return tls_credentials(pki.ca)
    if name == "mtls+token":
        return tls_credentials(pki.ca, pki.client_cert, pki.client_key)
    return None


@asynccontextmanager
async def gateways(pki: Pki, tokens: Path) -> AsyncIterator[list[Setting]]:
    async with AsyncExitStack() as stack:
        settings = []
        for name in SETTINGS:
            srv: GatewayServer = await stack.enter_async_context(
                running_server(
                    hub=FakeToneHub(),
                    security=security_section(name, pki, tokens),
                    server={"host": "127.0.0.1", "port": 0, "grace_s": 1.0},
                )
            )
            settings.append(
                Setting(
                    name,
                    srv.target,
                    credentials(name, pki),
                    None if name == "plaintext" else TOKEN,
                )
            )
        yield settings


async def unary(s: Setting, ch: grpc.aio.Channel, n: int) -> None:
    stub = pb_grpc.VoiceGatewayStub(ch)
    md = auth_metadata(s.token)
    for _ in range(n):
        t0 = time.perf_counter()
        await stub.ListVoices(pb.ListVoicesRequest(), metadata=md, timeout=30)
        s.samples["unary"].append(time.perf_counter() - t0)


async def call_setup(s: Setting, ch: grpc.aio.Channel, n: int) -> None:
    stub = pb_grpc.VoiceGatewayStub(ch)
    md = auth_metadata(s.token)
    config = pb.ConverseRequest(config=CallConfig().to_proto())
    for _ in range(n):
        t0 = time.perf_counter()
        call = stub.Converse(metadata=md, timeout=30)
        await call.write(config)
        first = await call.read()
        s.samples["call setup"].append(time.perf_counter() - t0)
        assert first is not grpc.aio.EOF and first.WhichOneof("event") == "started", first
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass


async def connect(s: Setting, n: int) -> None:
    md = auth_metadata(s.token)
    for _ in range(n):
        t0 = time.perf_counter()
        async with s.channel() as ch:
            await pb_grpc.VoiceGatewayStub(ch).ListVoices(
                pb.ListVoicesRequest(), metadata=md, timeout=30
            )
            s.samples["connect"].append(time.perf_counter() - t0)


async def run(rounds: int, n_unary: int, n_calls: int, n_connects: int) -> list[Setting]:
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki")
        tokens = Path(tmp) / "tokens.yaml"
        tokens.write_text(f"- token: {TOKEN}\n  tenant: bench\n  max_calls: 1000\n")
        async with gateways(pki, tokens) as settings:
            channels = [s.channel() for s in settings]
            try:
                for s, ch in zip(settings, channels, strict=True):  # warm up: connect once
                    await unary(s, ch, 5)
                    await call_setup(s, ch, 2)
                    s.samples = {k: [] for k in KINDS}
                for r in range(rounds):
                    order = list(zip(settings, channels, strict=True))
                    order = order[r % len(order) :] + order[: r % len(order)]
                    for s, ch in order:
                        await unary(s, ch, n_unary)
                        await call_setup(s, ch, n_calls)
                        await connect(s, n_connects)
            finally:
                for ch in channels:
                    await ch.close()
    return settings


def table(settings: list[Setting]) -> str:
    base = {k: median(settings[0].samples[k]) for k in KINDS}
    head = f"{'setting':<12}" + "".join(f" | {k + ' p50/p95 ms':>24} {'x':>5}" for k in KINDS)
    lines = [head, "-" * len(head)]
    for s in settings:
        row = f"{s.name:<12}"
        for k in KINDS:
            xs = s.samples[k]
            p50, p95 = median(xs), percentile(xs, 95)
            row += f" | {p50 * 1000:>11.2f} /{p95 * 1000:>10.2f} {p50 / base[k]:>5.2f}"
        lines.append(row)
    n = {k: len(settings[0].samples[k]) for k in KINDS}
    lines.append(
        f"samples per setting: unary {n['unary']}, call setup {n['call setup']}, "
        f"connect {n['connect']}; x = median / plaintext median"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--unary", type=int, default=200, help="ListVoices per setting per round")
    parser.add_argument("--calls", type=int, default=30, help="Converse per setting per round")
    parser.add_argument("--connects", type=int, default=20, help="new channels per round")
    parser.add_argument("--json", action="store_true", help="also print the raw samples")
    args = parser.parse_args(argv)
    settings = asyncio.run(run(args.rounds, args.unary, args.calls, args.connects))
    print(table(settings))
    if args.json:
        print(json.dumps({s.name: s.samples for s in settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
