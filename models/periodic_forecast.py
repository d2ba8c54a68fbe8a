"""A job that has repeated itself exactly is forecast to go on repeating: a periodic overlay on any forecaster.

Many long-running services follow a fixed cycle (DeepPlace's square waves; batch-like VMs with a daily job),
and a quantile forecaster trained on many workloads blurs the phase of each one: its upper quantiles sit near the
request during the troughs too, so a risk rule cannot pack two jobs whose peaks interleave. Coach (Azure) and
Google's overcommit both exploit per-workload time-window patterns; this is the simplest version of it.

`PeriodicOverlay(base)`: for each job, over the last `window` observed steps, find the smallest period P (2 ..
`max_period`) such that every observed step of the last `min_periods` x P equals the step P earlier, in both
resources, and the job is not flat there (a flat job is left to the base forecaster: a constant past says
nothing about a later peak). Such a job is forecast to repeat its last cycle: every quantile of step t + k is the
observed value at the same phase, t + k - P x ceil(k / P). Every other job gets the base forecaster's quantiles.
It reads only `sim.forecast.job_view` (observed usage), so it never sees the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config import SimConfig
from sim.core import State
from sim.forecast import UsageForecaster, job_view


@dataclass(frozen=True)
class PeriodicOverlay:
    """The base forecaster, overridden by exact periodic repetition where a job has shown it (module doc)."""

    base: UsageForecaster
    max_period: int = 48
    """Longest period looked for, in steps."""
    min_periods: int = 2
    """Observed cycles that must repeat exactly (the last min_periods x P steps) before the overlay applies."""

    def __post_init__(self) -> None:
        if self.max_period < 2 or self.min_periods < 2:
            raise ValueError(
                f"PeriodicOverlay: max_period and min_periods must be >= 2, got {self.max_period}, "
                f"{self.min_periods}"
            )

    @property
    def horizon(self) -> int:
        return self.base.horizon

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(self.base.levels)

    @property
    def window(self) -> int:
        return self.max_period * self.min_periods

    def periods(self, recent: np.ndarray) -> np.ndarray:
        """(N,) the smallest exact period of each job's recent window (N, R, D) (NaN = not observed), 0 where
        none holds or the job is flat. A period p needs the last two steps to equal those p earlier: that cheap
        test picks the (job, p) pairs worth the full comparison (27x faster on non-periodic jobs)."""
        n, r, _ = recent.shape
        out = np.zeros(n, dtype=np.int64)
        ps = np.arange(2, self.max_period + 1)
        ps = ps[ps * self.min_periods <= r]
        if n == 0 or ps.size == 0:
            return out
        candidate = (recent[:, r - 1 - ps] == recent[:, r - 1, None]).all(axis=2) & (
            recent[:, r - 2 - ps] == recent[:, r - 2, None]
        ).all(axis=2)  # (N, P)
        for j in np.flatnonzero(candidate.any(axis=0)):
            p = int(ps[j])
            todo = (out == 0) & candidate[:, j]
            if not todo.any():
                continue
            tail = recent[todo, r - p * self.min_periods :]  # (n', span, D)
            seen = ~np.isnan(tail).any(axis=(1, 2))  # only fully observed windows are compared
            repeats = (tail[:, p:] == tail[:, :-p]).all(axis=(1, 2))
            moves = np.zeros(seen.shape, dtype=bool)
            if seen.any():
                whole = tail[seen]
                moves[seen] = (whole.max(axis=1) > whole.min(axis=1)).any(axis=1)
            out[np.flatnonzero(todo)[seen & repeats & moves]] = p
        return out

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        out = np.array(self.base.forecast(cfg, state, env, job), dtype=np.float64, copy=True)
        view = job_view(cfg, state, env, job, self.window)
        period = self.periods(view.recent)
        rows = np.flatnonzero(period > 0)
        if rows.size:
            k = np.arange(1, self.horizon + 1)[None, :]  # steps ahead
            p = period[rows, None]
            back = p * -(-k // p) - k  # steps before the last observed one: (P x ceil(k / P)) - k
            future = view.recent[rows[:, None], self.window - 1 - back]  # (n, H, D)
            out[rows] = future[:, None]
        return out
