"""SIP bridge load: N concurrent SIPp calls, direct and through Kamailio → jitter, setup, CPU.

The bridge runs as its own process (``python -m voxgate.bridges.sip``) so its CPU time can be read
from /proc; the gateway runs in this process with a tone voice (a stand-in for VITS: this measures
the bridge's pacing, not synthesis) and the bridge greets every caller for ~5 s. SIPp streams
silence as the caller, so nothing interrupts the greeting.

Each row is one path: ``direct`` (SIPp → bridge) or ``proxy`` (SIPp → Kamailio with
``deploy/kamailio/kamailio.cfg`` → bridge; ACK and BYE follow the route set). The two paths run
interleaved for every call count and repeat, so machine noise hits both alike.

Jitter is what the bridge's sender measured on its own packets (logged per call at hang-up):
the worst and 99th-percentile deviation of the interval between consecutive packets from 20 ms,
and the worst lateness against the absolute 20 ms schedule. Setup is what the caller saw: INVITE
sent to 200 received (SIPp's response time, every call), median and p95. CPU is the bridge
process's user+system time per call per second of call; proxy CPU is the same for Kamailio's
processes (its main process and the workers it forks).

    python -m benchmarks.sip_calls --calls 1 10 25 --paths direct proxy
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "protos")]

from voxgate.bridges.sip.testing import free_udp_port, run_sipp, running_kamailio  # noqa: E402
from voxgate.gateway.testing.fake_engines import FakeToneHub  # noqa: E402
from voxgate.gateway.testing.server import running_server  # noqa: E402

SCENARIO = REPO / "tests" / "sipp" / "uac_stream_routes.xml"
PATHS = ("direct", "proxy")
_RTP_LINE = re.compile(
    r"RTP: sent=(\d+) spurts=(\d+) max_lateness_ms=([\d.]+) max_interval_dev_ms=([\d.]+) "
    r"p99_interval_dev_ms=([\d.]+)"
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (Kamailio forks its workers)."""
    total = cpu_s(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank; the maximum below 20 samples)."""
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def setup_times_ms(work: Path) -> list[float]:
    """Every call's INVITE → 200 time from SIPp's ``-trace_rtt`` files, then remove them.

    SIPp reads its clock in whole milliseconds: a call answered within the millisecond (a
    direct call on a fast machine) reads 0.
    """
    out: list[float] = []
    for f in work.glob("*_rtt.csv"):
        for line in f.read_text().splitlines()[1:]:
            cols = line.split(";")
            if len(cols) >= 2 and cols[1].strip():
                out.append(float(cols[1]))
        f.unlink()
    return out


@contextlib.asynccontextmanager
async def target(
    path: str, bridge: tuple[str, int], work: Path
) -> AsyncIterator[tuple[tuple[str, int], int | None]]:
    """Where SIPp calls (the bridge, or a Kamailio started in front of it), and Kamailio's pid."""
    if path == "direct":
        yield bridge, None
        return
    async with running_kamailio([bridge], work / "kamailio") as kam:
        yield kam.address, kam.process.pid


async def one_run(n: int, call_ms: int, work: Path, path: str = "direct") -> dict[str, float]:
    port = free_udp_port()
    async with running_server(hub=FakeToneHub()) as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voxgate.bridges.sip",
            "--listen", f"127.0.0.1:{port}", "--gateway", srv.target,
            "--bot", str(work / "bot.yaml"), "--rtp-ports", "40000-49999",
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'protos'}"},
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"sip listening" in line, line
        setup_times_ms(work)  # nothing left from an earlier run
        async with target(path, ("127.0.0.1", port), work) as (dest, proxy_pid):
            cpu0 = cpu_s(proc.pid)
            proxy0 = tree_cpu_s(proxy_pid) if proxy_pid else 0.0
            res = await run_sipp(
                SCENARIO, dest, cwd=work, calls=n, rate=50, duration_ms=call_ms,
                timeout_s=60, extra=["-trace_rtt", "-rtt_freq", "1"],
            )  # fmt: skip
            await asyncio.sleep(0.5)
            cpu1 = cpu_s(proc.pid)
            proxy1 = tree_cpu_s(proxy_pid) if proxy_pid else 0.0
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    if res.returncode != 0:
        raise RuntimeError(res.explain())
    stats = [m.groups() for m in _RTP_LINE.finditer(err.decode())]
    if len(stats) != n:
        raise RuntimeError(f"{len(stats)} RTP stat lines for {n} calls:\n{err.decode()[-2000:]}")
    setup = setup_times_ms(work)
    if len(setup) != n:
        raise RuntimeError(f"{len(setup)} setup times for {n} calls")
    return {
        "setup_p50_ms": statistics.median(setup),
        "setup_p95_ms": p95(setup),
        "packets": sum(int(s[0]) for s in stats) / n,
        "max_dev_ms": max(float(s[3]) for s in stats),
        "p99_dev_ms": max(float(s[4]) for s in stats),
        "max_late_ms": max(float(s[2]) for s in stats),
        "cpu_pct_per_call": 100 * (cpu1 - cpu0) / n / (call_ms / 1000),
        "proxy_cpu_pct_per_call": 100 * (proxy1 - proxy0) / n / (call_ms / 1000),
    }


async def main(argv: list[str] | None = None) -> dict[tuple[str, int], dict[str, float]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--calls", type=int, nargs="+", default=[1, 10, 25])
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--call-ms", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    table: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "caller.ulaw").write_bytes(b"\xff" * 8000 * (args.call_ms // 1000 + 1))
        (work / "bot.yaml").write_text(f"greeting: {'x' * 50}\n")  # 5 s of tone
        print(
            f"{'path':>6} {'calls':>5} {'pkts/call':>9} {'max dev ms':>10} {'p99 dev ms':>10} "
            f"{'max late ms':>11} {'setup p50 ms':>12} {'setup p95 ms':>12} {'CPU %/call':>10} "
            f"{'proxy CPU %/call':>16}"
        )
        for n in args.calls:
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in args.paths}
            for _ in range(args.repeats):
                for path in args.paths:  # interleaved: both paths see the same machine
                    runs[path].append(await one_run(n, args.call_ms, work, path))
            for path in args.paths:
                # The median of the repeats for every column.
                row = {k: statistics.median(r[k] for r in runs[path]) for k in runs[path][0]}
                table[path, n] = row
                proxy_cpu = row["proxy_cpu_pct_per_call"]
                proxy_col = f"{proxy_cpu:>16.2f}" if path == "proxy" else f"{'-':>16}"
                print(
                    f"{path:>6} {n:>5} {row['packets']:>9.0f} {row['max_dev_ms']:>10.1f} "
                    f"{row['p99_dev_ms']:>10.1f} {row['max_late_ms']:>11.1f} "
                    f"{row['setup_p50_ms']:>12.1f} {row['setup_p95_ms']:>12.1f} "
                    f"{row['cpu_pct_per_call']:>10.2f} {proxy_col}",
                    flush=True,
                )
    return table


if __name__ == "__main__":
    asyncio.run(main())
