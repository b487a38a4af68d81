"""CPU priority of the engines' threads below the event loop's (Linux nice values).

The event loop paces every call's reply frames, reads and writes every stream, dispatches every
synthesis step and runs each call's ear (decoder, echo canceller, DTMF, VAD) on every inbound
frame: a fraction of a core, all of it due within milliseconds. The engines' threads do the bulk
work (a decoder window, a recognition batch), due hundreds of milliseconds later. The kernel
shares oversubscribed cores fairly between runnable threads, so with eight replies and their
callers' recognition on two cores the loop waited for a core about as long as it ran, and the
synthesis workers got a third of a core each while the recogniser's threads took the rest
(``benchmarks/calls/replies.py``; docs/tts-scheduling.md, "On the call path"). A few nice levels
let the loop take a core the moment it needs one, a reply's audio come before a caller's final,
and still give the engines every cycle nobody more urgent wants.

NumPy's BLAS is the other thread that competes for the cores unasked (:func:`limit_blas_threads`).

Linux only: there the nice value is per thread (``setpriority(PRIO_PROCESS, tid, ...)``, see
``man 2 setpriority``, NOTES) and a new thread inherits its creator's, so an engine loaded on a
lowered thread runs its own worker threads lowered too. Elsewhere, or where the kernel refuses,
nothing changes. Raising a nice value needs no privilege but lowering it back does, so only
threads made for the purpose are lowered, never the loop's default executor.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["call_lowered", "limit_blas_threads", "lower_current_thread", "thread_nice"]

log = logging.getLogger("voxgate.priority")

T = TypeVar("T")

#: The largest nice value (the lowest priority) Linux has.
MAX_NICE = 19


def thread_nice() -> int | None:
    """The calling thread's nice value; None where threads have no nice value of their own."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except OSError:
        return None


def lower_current_thread(by: int) -> bool:
    """Raise the calling thread's nice value by ``by`` (capped at 19); whether it changed.

    Only for a thread made for engine work: it cannot be raised back without privilege.
    """
    if by <= 0:
        return False
    current = thread_nice()
    if current is None:
        return False
    target = min(MAX_NICE, current + by)
    if target == current:
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), target)
    except OSError as exc:  # a seccomp profile or an LSM may refuse it: run as before
        log.warning("cannot lower an engine thread's CPU priority: %s", exc)
        return False
    return True


def call_lowered(by: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a new thread lowered by ``by`` nice levels; blocks until it returns.

    Threads that ``fn`` starts (an engine's worker pool, created when it loads) inherit the
    lowered priority. Returns ``fn``'s result or raises its exception.
    """
    if by <= 0:
        return fn(*args)
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        lower_current_thread(by)
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            error.append(exc)

    thread = threading.Thread(target=run, name="lowered-load", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def limit_blas_threads(threads: int) -> int | None:
    """Cap the thread pool of NumPy's BLAS at ``threads`` for the whole process.

    Returns the largest pool a BLAS library had before, or None where nothing changed
    (``threads`` 0, or no BLAS library with a pool of its own is loaded).

    Why: NumPy's OpenBLAS starts a helper thread per core when it loads, at the importing
    thread's priority (the loop's), and after each call big enough to split (the mel
    features of every decode, the audio end-of-turn model's features) the helpers spin,
    yielding but runnable, for about 0.1 s before they sleep. On 2 cores that spin took as
    much CPU as the recogniser's work (a ``perf`` profile of ``voxgate serve`` under one
    real-time caller: 4.3 % of the machine in OpenBLAS's ``blas_thread_server`` against
    5.1 % in CTranslate2), at a priority above the engine threads' (``engine_nice``), right
    when a final decode starts. The calls are small (a 10 s window's features take a few
    milliseconds on one thread), so one thread loses nothing. Measured through ``Converse``,
    the same tree as two servers, clip by clip: 35 of 36 finals came sooner with one BLAS
    thread, by 15 ms at the median (docs/turns.md, "NumPy's BLAS threads").
    """
    if threads <= 0:
        return None
    before = [int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    if not before:
        return None
    threadpool_limits(limits=threads, user_api="blas")
    return max(before)
