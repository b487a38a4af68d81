"""Admission's start-up calibration prices work on the CPU by the CPU it used (issue 38).

A replica started on a busy machine waits for the cores: its wall clock priced the reference
decode at 8.3 s where the decode used 0.54 s of CPU, so the replica held "about 1 real-time
call" and refused the second caller (tests/test_shutdown.py's four callers, beside two busy
processes). The cost of a run on the CPU is now the smaller of its wall-clock and CPU time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.runtime._hub import EngineHubImpl, _fastest_of_two


class FakeClocks:
    """FAKE wall and CPU clocks that a scripted run advances (no real time passes)."""

    def __init__(self, runs: list[tuple[float, float]]) -> None:
        self.runs = runs  # (wall seconds, CPU seconds) each run takes
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def work(self, i: int) -> None:
        wall, cpu = self.runs[i]
        self.wall_s += wall
        self.cpu_s += cpu

    def wall(self) -> float:
        return self.wall_s

    def cpu(self) -> float:
        return self.cpu_s


@pytest.mark.unit
def test_a_run_that_waited_for_the_cores_costs_the_cpu_it_used() -> None:
    clocks = FakeClocks([(8.37, 0.55), (8.32, 0.54)])
    assert _fastest_of_two(clocks.work, cpu_clock=clocks.cpu, wall_clock=clocks.wall) == (
        pytest.approx(0.54)
    )


@pytest.mark.unit
def test_work_on_several_threads_costs_its_wall_clock() -> None:
    clocks = FakeClocks([(0.79, 0.49), (0.58, 0.90)])  # the second run on two threads
    assert _fastest_of_two(clocks.work, cpu_clock=clocks.cpu, wall_clock=clocks.wall) == (
        pytest.approx(0.49)
    )


@pytest.mark.unit
def test_without_a_cpu_clock_the_wall_clock_is_the_cost() -> None:
    """A GPU's work: the host may sleep while the device computes."""
    clocks = FakeClocks([(0.30, 0.01), (0.25, 0.01)])
    assert _fastest_of_two(clocks.work, wall_clock=clocks.wall) == pytest.approx(0.25)


@pytest.fixture(scope="module")
def hub() -> Iterator[EngineHubImpl]:
    """The default server's recogniser, loaded as its hub loads it (no batcher started)."""
    built = build_hub(load_config(None, {"engines": "asr"}))
    assert isinstance(built, EngineHubImpl)
    built._load_asr()
    yield built
    built._asr_engines[0].close()


@pytest.mark.model
def test_a_replica_waiting_for_busy_cores_calibrates_as_on_an_idle_machine(
    hub: EngineHubImpl,
) -> None:
    """The bundled model, the default configuration: each reference decode followed by 1 s
    of waiting without CPU (what other processes holding the cores cost a decode) leaves the
    calibrated capacity where it is; priced by the wall clock it fell about threefold."""
    idle = hub._calibrate()
    engine = hub._asr_engines[0]
    decode = engine.infer_batch

    def waited(requests):  # type: ignore[no-untyped-def]
        results = decode(requests)
        time.sleep(1.0)
        return results

    engine.infer_batch = waited  # type: ignore[method-assign]
    try:
        busy = hub._calibrate()
    finally:
        del engine.infer_batch
    assert idle >= 2
    assert busy >= 0.8 * idle, (busy, idle)
