"""Progress of a long ``voxgate adapt`` run: a bar with ETA on a terminal, JSON lines otherwise.

A person at a terminal wants one redrawn line; a CI log or a job runner wants one parseable
object per line that it can graph or alert on. Both get the same fields (stage, step, steps,
loss, elapsed and ETA in seconds). Lines go to the given stream (stderr in the CLI), so stdout
stays free for the final summary.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

__all__ = ["Progress"]

_BAR_WIDTH = 28
#: Without a terminal, at most one step line per this many seconds (plus the first and last).
_JSON_INTERVAL_S = 5.0


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class Progress:
    """Reports stages and training steps.

    Args:
        stream: where to write; None = ``sys.stderr``.
        tty: draw a bar (True) or write JSON lines (False); None = ask the stream.
        interval_s: least time between two JSON step lines.
    """

    def __init__(
        self, stream: TextIO | None = None, tty: bool | None = None, interval_s: float = -1.0
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._interval = _JSON_INTERVAL_S if interval_s < 0 else interval_s
        self._t0 = time.monotonic()
        self._last_json = -1e9
        self._step0: int | None = None
        self._t_step0 = 0.0
        self._bar_open = False

    def _emit(self, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps(record) + "\n")
        self._stream.flush()

    def stage(self, name: str, /, **fields: Any) -> None:
        """A pipeline stage begins (``load``, ``synthesize``, ``train``, ``write``, ...)."""
        if self._tty:
            if self._bar_open:
                self._stream.write("\n")
                self._bar_open = False
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            self._stream.write(f"voxgate adapt: {name}{' ' + extra if extra else ''}\n")
            self._stream.flush()
        else:
            self._emit(
                {"event": "stage", "stage": name, "elapsed_s": round(self.elapsed, 1), **fields}
            )

    @property
    def elapsed(self) -> float:
        """Seconds since this reporter was made."""
        return time.monotonic() - self._t0

    def step(self, step: int, steps: int, loss: float) -> None:
        """Training reached ``step`` of ``steps`` with this (smoothed) loss.

        The ETA is measured from the first step this process saw, so a resumed run does not
        count the steps an earlier process did as instant.
        """
        now = time.monotonic()
        if self._step0 is None:
            # The clock starts at the first step reported: how long that step itself took is
            # not known here, so the rate counts only the steps after it.
            self._step0, self._t_step0 = step, now
        done = step - self._step0
        # The first step this process sees has no measured rate yet: its ETA is unknown (None),
        # not zero.
        rate = (now - self._t_step0) / done if done > 0 and now > self._t_step0 else 0.0
        eta: float | None = rate * (steps - step) if rate > 0 or step >= steps else None
        if self._tty:
            filled = round(_BAR_WIDTH * step / max(1, steps))
            bar = "#" * filled + "." * (_BAR_WIDTH - filled)
            self._stream.write(
                f"\r[{bar}] {step}/{steps} loss {loss:.3f} {rate:.2f} s/step "
                f"ETA {'--:--' if eta is None else _clock(eta)}   "
            )
            self._bar_open = True
            if step >= steps:
                self._stream.write("\n")
                self._bar_open = False
            self._stream.flush()
            return
        if step >= steps or step == self._step0 or now - self._last_json >= self._interval:
            self._last_json = now
            self._emit(
                {
                    "event": "step",
                    "step": step,
                    "steps": steps,
                    "loss": round(loss, 4),
                    "s_per_step": round(rate, 3),
                    "elapsed_s": round(self.elapsed, 1),
                    "eta_s": None if eta is None else round(eta, 1),
                }
            )

    def note(self, message: str, /, **fields: Any) -> None:
        """A one-off message (checkpoint saved, resumed from step N, ...)."""
        if self._tty:
            if self._bar_open:
                self._stream.write("\n")
                self._bar_open = False
            self._stream.write(f"voxgate adapt: {message}\n")
            self._stream.flush()
        else:
            self._emit({"event": "note", "message": message, **fields})
