"""Progress lines for long loops: items done / total, rate and time left, at most one line per interval.

A step that takes more than a few seconds wraps its loop in a `Progress` and calls `advance()` per item. The
line goes to the `log` callable it was given (an asset passes `context.log.info`, so the line lands in the
Dagster run log and in the terminal of the process running the step); without one, it goes to the `tvw`
logger. The first and the last item always log, items in between only when `every_s` has passed since the last
line, so a fast loop costs one clock read per item and a slow one writes a steady trickle.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_LOGGER = logging.getLogger("tvw")


def format_seconds(s: float) -> str:
    """12 s, 3 min 05 s, 2 h 07 min: the unit a reader wants for a time left."""
    if not math.isfinite(s):
        return "?"
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """Counts items of one loop and logs `label: done/total (pct), rate, time left`."""

    def __init__(
        self,
        total: int,
        label: str,
        log: Callable[[str], None] | None = None,
        every_s: float = 5.0,
        unit: str = "items",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if total < 0:
            raise ValueError(f"{label}: total must be >= 0, got {total}")
        self.total, self.label, self.unit, self.every_s = int(total), label, unit, every_s
        self.log = log if log is not None else _LOGGER.info
        self.clock = clock
        self.done = 0
        self.t0 = clock()
        self._last = -math.inf

    def line(self) -> str:
        """The progress line as it stands."""
        elapsed = self.clock() - self.t0
        rate = self.done / elapsed if elapsed > 0 else math.inf
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate_txt = f"{rate:,.1f} {self.unit}/s" if math.isfinite(rate) else f"- {self.unit}/s"
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit} ({pct:.0f} %), {rate_txt}, "
            f"{format_seconds(elapsed)} elapsed, {format_seconds(left)} left"
        )

    def advance(self, n: int = 1) -> None:
        """Count n more items done; log when it is the first, the last, or `every_s` has passed."""
        self.done += n
        now = self.clock()
        if self.done == n or self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            self.log(self.line())


def track(
    items: Iterable[T],
    label: str,
    total: int | None = None,
    log: Callable[[str], None] | None = None,
    every_s: float = 5.0,
    unit: str = "items",
) -> Iterator[T]:
    """Yield the items, logging progress after each one (total from len() when not given)."""
    if total is None:
        total = len(items)  # type: ignore[arg-type]
    progress = Progress(total, label, log=log, every_s=every_s, unit=unit)
    for item in items:
        yield item
        progress.advance()
