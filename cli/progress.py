"""Where a `tvw-run` is: a line per finished run and per finished layer, and on a terminal one status line,
redrawn every second, with runs done/total, the runs in flight with their age and latest log message, and an ETA.

The ETA adds, over the runs not finished, each run's expected time (its job's duration in the last run on this
warehouse, else the mean of this job's runs so far, else of every run so far), less what the running ones have
already spent, and divides by the runs that go at once.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli.plan import Plan, RunSpec

DEFAULT_RUN_S = 10.0


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Durations:
    """Seconds per job from earlier runs on this warehouse (`<warehouse>/.tvw-run/durations.json`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.last: dict[str, float] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.last = {}
        self.now: dict[str, list[float]] = {}

    def add(self, job: str, seconds: float) -> None:
        self.now.setdefault(job, []).append(seconds)

    def expected(self, job: str) -> float:
        if job in self.now:
            return sum(self.now[job]) / len(self.now[job])
        if job in self.last:
            return self.last[job]
        every = [s for runs in self.now.values() for s in runs]
        return sum(every) / len(every) if every else DEFAULT_RUN_S

    def save(self) -> None:
        merged = {**self.last, **{job: sum(s) / len(s) for job, s in self.now.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
        tmp.replace(self.path)


class Progress:
    """Prints the run's progress to `stream` (a status line only when it is a terminal)."""

    def __init__(
        self, plan: Plan, durations: Durations, concurrency: int, stream=None, skipped: int = 0
    ) -> None:
        self.plan, self.durations, self.concurrency = plan, durations, max(1, concurrency)
        self.stream = stream or sys.stdout
        self.is_tty = self.stream.isatty()
        self.done = skipped
        self.total = len(plan.runs)
        self.by_layer = {layer: [r for r in plan.runs if r.layer == layer] for layer in plan.layers()}
        self.finished_in_layer: dict[str, int] = {}
        self.layer_started: dict[str, float] = {}
        self._status_shown = False
        self.t0 = time.time()

    def _print(self, line: str) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[K")
            self._status_shown = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def started(self, spec: RunSpec) -> None:
        self.layer_started.setdefault(spec.layer, time.time())

    def finished(self, spec: RunSpec, ok: bool, seconds: float, note: str = "") -> None:
        self.done += 1
        self.durations.add(spec.job, seconds)
        status = "ok" if ok else "FAILED"
        self._print(f"  [{self.done}/{self.total}] {spec.label}: {status} ({seconds:.1f}s){note}")
        n = self.finished_in_layer[spec.layer] = self.finished_in_layer.get(spec.layer, 0) + 1
        if n == len(self.by_layer[spec.layer]):
            wall = time.time() - self.layer_started.get(spec.layer, self.t0)
            self._print(f"layer {spec.layer}: {n}/{n} run(s) finished in {clock(wall)}")

    def skipped_line(self, line: str) -> None:
        self._print(line)

    def eta(self, pending: list[RunSpec], running: list[tuple[RunSpec, float]]) -> float:
        now = time.time()
        left = sum(self.durations.expected(s.job) for s in pending)
        left += sum(max(0.0, self.durations.expected(s.job) - (now - since)) for s, since in running)
        return left / self.concurrency

    def status(
        self, pending: list[RunSpec], running: list[tuple[RunSpec, float]], note: Callable[[RunSpec], str]
    ):
        """Redraw the status line (terminal only)."""
        if not self.is_tty:
            return
        now = time.time()
        inflight = ", ".join(f"{s.label} {clock(now - since)}{note(s)}" for s, since in running) or "-"
        line = (
            f"[{self.done}/{self.total} runs, {clock(now - self.t0)} elapsed, ETA {clock(self.eta(pending, running))}]"
            f" running: {inflight}"
        )
        width = 200
        try:
            import shutil

            width = shutil.get_terminal_size((200, 20)).columns
        except OSError:
            pass
        self.stream.write("\r\x1b[K" + line[: max(20, width - 1)])
        self.stream.flush()
        self._status_shown = True

    def close(self) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._status_shown = False
