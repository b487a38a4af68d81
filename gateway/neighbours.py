"""How many cores processes other than the gateway keep busy (Linux ``/proc/stat``).

A call that has the server to itself encodes its finals on every core (``AsrRequest.alone``,
``asr.lone_encode_threads``): CTranslate2 then runs one OpenMP team over the cores, and each
step of the encoder waits for the slowest thread. A core that another process keeps busy gives
that thread a slice of it, at ``batcher.engine_nice`` below a process at the loop's priority a
fifteenth, and the whole encode runs at that thread's pace. Beside one busy process on the
2-vCPU machine, a lone caller's finals came 631-1,539 ms after its speech with the wide encode
and 165-420 ms with it off (docs/turns.md, "A busy neighbour and the lone call's wide encode").
So "alone" also asks that the rest of the machine be quiet.

The reading: every ``INTERVAL_S`` the event loop reads the busy time of the cores this process
may run on (``/proc/stat``) and this process's own CPU time (``time.process_time``), and keeps
what the others used over the last two intervals, in cores. Starting it is idempotent; it stops with
its loop (or :meth:`Neighbours.stop`). Where ``/proc/stat`` cannot be read (not Linux) it
reads 0: no neighbours known, the behaviour unchanged.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable

__all__ = ["INTERVAL_S", "QUIET_CORES", "Neighbours", "proc_busy_s"]

#: Seconds between two readings.
INTERVAL_S = 0.5
#: Other processes' use, in cores, under which the machine counts as quiet: a caller's client
#: or a bot on the same machine uses a few hundredths of a core; a busy process one.
QUIET_CORES = 0.25
#: /proc/stat's busy columns after the name: user, nice, system, (idle, iowait,) irq, softirq,
#: steal. Guest time is inside user already.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def proc_busy_s(cpus: frozenset[int] | None = None) -> float | None:
    """Busy seconds of ``cpus`` (default: those this process may run on) since boot, or None."""
    if cpus is None:
        try:
            cpus = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if int(name[3:]) in cpus:
            fields = rest.split()
            total += sum(int(fields[k]) for k in _BUSY_COLUMNS if k < len(fields))
    return total / tick


class Neighbours:
    """What the rest of the machine keeps busy, read on the event loop every ``INTERVAL_S``.

    Args:
        busy_s: busy seconds of this process's cores so far (None: unknown).
        own_s: this process's CPU seconds so far, every thread of it (``time.process_time``,
            as the admission calibration prices CPU work).
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        busy_s: Callable[[], float | None] = proc_busy_s,
        own_s: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._busy_s = busy_s
        self._own_s = own_s
        self._clock = clock
        # The last three readings (t, busy, own): two intervals.
        self._readings: deque[tuple[float, float, float]] = deque(maxlen=3)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Read every ``INTERVAL_S`` on the running loop from now on (once started, a no-op)."""
        if self._timer is None:
            self.read()

    def stop(self) -> None:
        """Stop reading (a later :meth:`start` begins again)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def read(self) -> None:
        """Take a reading, and schedule the next one on the running loop."""
        busy = self._busy_s()
        if busy is not None:
            self._readings.append((self._clock(), busy, self._own_s()))
        self._timer = asyncio.get_running_loop().call_later(INTERVAL_S, self.read)

    def busy_cores(self) -> float:
        """Cores that other processes kept busy over the last readings (0.0 before two)."""
        if len(self._readings) < 2:
            return 0.0
        (t0, busy0, own0), (t1, busy1, own1) = self._readings[0], self._readings[-1]
        if t1 <= t0:
            return 0.0
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)

    def quiet(self) -> bool:
        """Whether other processes keep less than ``QUIET_CORES`` busy."""
        return self.busy_cores() < QUIET_CORES
