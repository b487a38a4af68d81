"""What other processes keep busy, and a lone call's wide encode only on a quiet machine.

``voxgate.gateway.neighbours.Neighbours`` reads the busy time of this process's cores and its
own CPU time on the event loop every 0.5 s; the servicer's ``alone`` (a final that may encode
on every core) asks that the rest of the machine be quiet. The rule runs on a virtual clock
with FAKE readings; the reading itself on this machine's ``/proc/stat`` with a real busy
process beside it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from voxgate.gateway.config import load_config
from voxgate.gateway.neighbours import INTERVAL_S, QUIET_CORES, Neighbours, proc_busy_s
from voxgate.gateway.service import VoiceGatewayServicer
from voxgate.gateway.testing.fake_engines import FakeToneSynthesizer
from voxgate.gateway.testing.virtual_time import run_virtual


class _Machine:
    """FAKE machine: the busy seconds of the cores and this process's CPU seconds, as rates."""

    def __init__(self, others: float, own: float) -> None:
        self.others, self.own = others, own
        self.busy_s, self.own_s = 100.0, 10.0
        self.last = 0.0

    def advance(self) -> None:
        now = asyncio.get_running_loop().time()
        dt, self.last = now - self.last, now
        self.own_s += self.own * dt
        self.busy_s += (self.others + self.own) * dt

    def neighbours(self) -> Neighbours:
        def busy() -> float:
            self.advance()
            return self.busy_s

        return Neighbours(busy, lambda: self.own_s, lambda: asyncio.get_running_loop().time())


@pytest.mark.unit
@pytest.mark.parametrize(
    ("others", "quiet"), [(0.0, True), (0.1, True), (0.5, False), (1.0, False)]
)
def test_other_processes_use_is_read_without_this_ones(others: float, quiet: bool) -> None:
    """This process busy on both cores is not a neighbour; another process's use is."""

    async def main() -> tuple[float, bool]:
        machine = _Machine(others=others, own=2.0)
        machine.last = asyncio.get_running_loop().time()
        n = machine.neighbours()
        n.start()
        assert n.busy_cores() == 0.0 and n.quiet()  # one reading: nothing known yet
        await asyncio.sleep(3 * INTERVAL_S + 0.01)
        value = n.busy_cores(), n.quiet()
        n.stop()
        return value

    cores, is_quiet = run_virtual(main())
    assert cores == pytest.approx(others, abs=1e-9)
    assert is_quiet is quiet and (cores < QUIET_CORES) is quiet


@pytest.mark.unit
def test_a_busy_neighbour_that_stops_is_forgotten_within_two_readings() -> None:
    async def main() -> list[bool]:
        machine = _Machine(others=1.0, own=0.0)
        machine.last = asyncio.get_running_loop().time()
        n = machine.neighbours()
        n.start()
        await asyncio.sleep(3 * INTERVAL_S + 0.01)
        seen = [n.quiet()]
        machine.advance()
        machine.others = 0.0
        await asyncio.sleep(2 * INTERVAL_S + 0.01)
        seen.append(n.quiet())
        n.stop()
        return seen

    assert run_virtual(main()) == [False, True]


@pytest.mark.unit
def test_a_machine_that_cannot_be_read_is_taken_as_quiet() -> None:
    """Not Linux (no /proc/stat): no neighbours known, a lone call's encode as before."""

    async def main() -> bool:
        n = Neighbours(lambda: None, time.process_time)
        n.start()
        await asyncio.sleep(3 * INTERVAL_S)
        quiet = n.quiet()
        n.stop()
        return quiet

    assert run_virtual(main())


@pytest.mark.unit
def test_the_servicer_calls_a_call_alone_only_on_a_quiet_machine() -> None:
    async def main() -> list[bool]:
        servicer = VoiceGatewayServicer(load_config(None, {}), synthesizer=FakeToneSynthesizer())
        machine = _Machine(others=0.0, own=0.5)
        machine.last = asyncio.get_running_loop().time()
        servicer.neighbours = machine.neighbours()  # FAKE readings
        servicer.neighbours.start()
        servicer.calls.opened()
        await asyncio.sleep(3 * INTERVAL_S + 0.01)
        seen = [servicer.alone()]
        machine.advance()
        machine.others = 1.0  # another process keeps a core busy
        await asyncio.sleep(2 * INTERVAL_S + 0.01)
        seen.append(servicer.alone())
        servicer.neighbours.stop()
        return seen

    assert run_virtual(main()) == [True, False]


@pytest.mark.component
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_real_busy_process_beside_this_one_is_read_as_a_core() -> None:
    """On this machine's /proc/stat: a child's busy loop is at least half a core, however
    loaded the machine is otherwise (it is a core when a core is free)."""
    assert proc_busy_s() is not None

    async def main() -> float:
        n = Neighbours()
        n.start()
        await asyncio.sleep(3 * INTERVAL_S)
        value = n.busy_cores()
        n.stop()
        return value

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        beside = asyncio.run(main())
    finally:
        child.kill()
        child.wait()
    assert beside >= 0.5
