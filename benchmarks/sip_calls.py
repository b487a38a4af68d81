"""SIP bridge load: N concurrent SIPp calls → RTP send jitter and bridge CPU per call.

The bridge runs as its own process (``python -m clients.sip``) so its CPU time can be read from
/proc; the gateway runs in this process with a tone voice (a stand-in for VITS: this measures
the bridge's pacing, not synthesis) and the bridge greets every caller for ~5 s. SIPp streams
silence as the caller, so nothing interrupts the greeting.

Jitter is what the bridge's sender measured on its own packets (logged per call at hang-up):
the worst and 99th-percentile deviation of the interval between consecutive packets from 20 ms,
and the worst lateness against the absolute 20 ms schedule.

    python benchmarks/sip_calls.py --calls 1 5 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "protos")]

from clients.sip.testing import free_udp_port, run_sipp  # noqa: E402
from gateway.testing.fake_engines import FakeToneHub  # noqa: E402
from gateway.testing.server import running_server  # noqa: E402

SCENARIO = REPO / "tests" / "sipp" / "uac_stream.xml"
_RTP_LINE = re.compile(
    r"RTP: sent=(\d+) spurts=(\d+) max_lateness_ms=([\d.]+) max_interval_dev_ms=([\d.]+) "
    r"p99_interval_dev_ms=([\d.]+)"
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(n: int, call_ms: int, work: Path) -> dict[str, float]:
    port = free_udp_port()
    async with running_server(hub=FakeToneHub()) as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.sip",
            "--listen", f"127.0.0.1:{port}", "--gateway", srv.target,
            "--bot", str(work / "bot.yaml"), "--rtp-ports", "40000-49999",
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'protos'}"},
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"sip listening" in line, line
        cpu0 = cpu_s(proc.pid)
        res = await run_sipp(
            SCENARIO, ("127.0.0.1", port), cwd=work, calls=n, rate=50, duration_ms=call_ms,
            timeout_s=60,
        )  # fmt: skip
        await asyncio.sleep(0.5)
        cpu1 = cpu_s(proc.pid)
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    if res.returncode != 0:
        raise RuntimeError(res.explain())
    stats = [m.groups() for m in _RTP_LINE.finditer(err.decode())]
    if len(stats) != n:
        raise RuntimeError(f"{len(stats)} RTP stat lines for {n} calls:\n{err.decode()[-2000:]}")
    return {
        "packets": sum(int(s[0]) for s in stats) / n,
        "max_dev_ms": max(float(s[3]) for s in stats),
        "p99_dev_ms": max(float(s[4]) for s in stats),
        "max_late_ms": max(float(s[2]) for s in stats),
        "cpu_pct_per_call": 100 * (cpu1 - cpu0) / n / (call_ms / 1000),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--call-ms", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "caller.ulaw").write_bytes(b"\xff" * 8000 * (args.call_ms // 1000 + 1))
        (work / "bot.yaml").write_text(f"greeting: {'x' * 50}\n")  # 5 s of tone
        print(
            f"{'calls':>5} {'pkts/call':>9} {'max dev ms':>10} {'p99 dev ms':>10} "
            f"{'max late ms':>11} {'CPU %/call':>10}"
        )
        for n in args.calls:
            runs = [await one_run(n, args.call_ms, work) for _ in range(args.repeats)]
            best = {k: min(r[k] for r in runs) for k in runs[0]}  # min of repeats
            print(
                f"{n:>5} {best['packets']:>9.0f} {best['max_dev_ms']:>10.1f} "
                f"{best['p99_dev_ms']:>10.1f} {best['max_late_ms']:>11.1f} "
                f"{best['cpu_pct_per_call']:>10.2f}",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
