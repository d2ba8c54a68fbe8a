"""Usage forecasts as a scheduler may use them: the plug-in point between `sim/` and a forecaster in `models/`.

A scheduler that packs beyond requests needs, for the job it is placing and for the jobs already running on each
machine, quantiles of their usage over the next H steps. What a forecaster may read is fixed here, in one place:

- `JobView` is everything a real scheduler knows about a job at decision time: its request, its observed EC label,
  its meta information, how many steps of it have been observed, and its OBSERVED usage so far. For a running job
  the observed steps are ages 0 .. t - start (the current step t included: the simulator's mask and every
  heuristic already read the machines' usage at t); for a job not yet placed nothing has been observed (age 0).
- Forecasts are of the steps t + 1 .. t + H (for a job placed now, ages 1 .. H).
- `job_view` is the only function here that reads `JobBatch.usage`, and it reads only observed steps, so a
  forecaster that builds its inputs from it cannot see the future (tests/sim/test_forecast.py perturbs the future
  and checks every view, forecast and decision is unchanged).

`UsageForecaster` is the Protocol a forecaster implements (`models.usage_forecast` has the learned one);
`ExactForecaster` reads the true future and is an oracle: a yardstick for tests and the information gap, never a
scheduler to report as a winner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sim.config import SimConfig
from sim.core import State, observed_labels

DEFAULT_LEVELS = (0.5, 0.9, 0.95, 0.99)
"""Quantile levels every forecaster gives at least (ascending)."""


@dataclass(frozen=True)
class JobView:
    """What is known at decision time about N jobs (job `job[i]` of env `env[i]`); D resources."""

    request: np.ndarray
    """(N, D) int64 requested units (the peak-based request the heuristics use)."""
    label: np.ndarray
    """(N,) int64 EC label as the scheduler sees it (`sim.core.observed_labels`)."""
    meta: np.ndarray
    """(N, 4) float64 meta information (`sim.jobs.JOB_META_COLUMNS`), NaN where unknown."""
    n_observed: np.ndarray
    """(N,) int64 usage steps observed so far: t - start + 1 for a running job, 0 for one not placed."""
    recent: np.ndarray
    """(N, R, D) float64 observed units of the last R observed steps, oldest first; NaN where not observed
    (before the job's start)."""
    life_max: np.ndarray
    """(N, D) float64 largest observed units so far (NaN when nothing is observed)."""
    life_mean: np.ndarray
    """(N, D) float64 mean observed units so far (NaN when nothing is observed)."""
    capacity: np.ndarray
    """(D,) int64 C_d."""

    @property
    def size(self) -> int:
        return int(self.request.shape[0])


@runtime_checkable
class UsageForecaster(Protocol):
    """Quantiles of jobs' usage over the next `horizon` steps, from what `job_view` shows."""

    horizon: int
    """H: steps t + 1 .. t + H are forecast."""
    levels: tuple[float, ...]
    """Quantile levels, ascending (at least `DEFAULT_LEVELS`)."""

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, L, H, D) float64 units: quantile `levels[l]` of job `job[i]` of env `env[i]` at step t + 1 + h,
        non-decreasing along L. A job not placed yet is forecast as if placed now (ages 1 .. H); a job that ends
        before t + 1 + h (when the forecaster knows it) may be forecast as 0 there."""
        ...


def job_view(cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, n_recent: int) -> JobView:
    """The `JobView` of jobs `job` (N,) of envs `env` (N,): observed usage only (see the module docstring)."""
    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    jobs = state.jobs
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], state.t[env] + 1)
    n_obs = np.clip(state.t[env] - start + 1, 0, jobs.duration[env, job])
    ages = np.arange(jobs.max_duration)
    is_seen = ages[None, :] < n_obs[:, None]  # (N, T)
    usage = jobs.usage[env, job].astype(np.float64)  # (N, T, D): masked to the observed ages right away
    usage[~is_seen] = np.nan
    with np.errstate(all="ignore"), _quiet_nan():
        life_max = np.nanmax(usage, axis=1)
        life_mean = np.nanmean(usage, axis=1)
    recent_ages = n_obs[:, None] - n_recent + np.arange(n_recent)[None, :]  # (N, R)
    is_recent = recent_ages >= 0
    recent = usage[np.arange(env.size)[:, None], np.clip(recent_ages, 0, jobs.max_duration - 1)]
    recent[~is_recent] = np.nan
    meta = (
        jobs.meta[env, job].astype(np.float64)
        if jobs.meta is not None
        else np.full((env.size, 4), np.nan, dtype=np.float64)
    )
    return JobView(
        request=jobs.request[env, job].astype(np.int64),
        label=observed_labels(state)[env, job].astype(np.int64),
        meta=meta,
        n_observed=n_obs.astype(np.int64),
        recent=recent,
        life_max=life_max,
        life_mean=life_mean,
        capacity=np.asarray(cfg.capacity_units, dtype=np.int64),
    )


class _quiet_nan:
    """Silence numpy's all-NaN slice warnings (a job with nothing observed has NaN summaries by design)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


@dataclass(frozen=True)
class ExactForecaster:
    """ORACLE: every quantile is the job's true usage at t + 1 .. t + H (0 after it ends). For tests and for
    the information gap (the same rule on true usage); never reported as a scheduler of its own."""

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    is_oracle: bool = True

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        jobs = state.jobs
        is_placed = state.job_machine[env, job] >= 0
        start = np.where(is_placed, state.job_start[env, job], state.t[env])
        ages = state.t[env, None] + 1 + np.arange(self.horizon)[None, :] - start[:, None]  # (N, H)
        alive = (ages >= 0) & (ages < jobs.duration[env, job][:, None])
        units = jobs.usage[env[:, None], job[:, None], np.clip(ages, 0, jobs.max_duration - 1)]  # (N, H, D)
        units = units.astype(np.float64) * alive[..., None]
        return np.repeat(units[:, None], len(self.levels), axis=1)


class CachedForecaster:
    """Memoises another forecaster's forecasts, which depend only on the job and on how many of its steps have been
    observed (`job_view` reads nothing else): the key is (the row's sequence key, workload id, arrival, duration,
    request, steps observed), which names one job of one sequence whatever its index (DeepRM's pickers reorder
    waiting jobs). So within and across rollouts of the same sequences (validation candidates, seeds) a job is
    forecast once per step of its life. Holds at most `max_entries` forecasts (then starts over). Only for
    forecasters of observed usage: `ExactForecaster`'s answer depends on the current step, not on the age."""

    def __init__(self, base: UsageForecaster, max_entries: int = 200_000) -> None:
        self.base = base
        self.horizon = base.horizon
        self.levels = tuple(base.levels)
        self.is_oracle = bool(getattr(base, "is_oracle", False))
        self.max_entries = max_entries
        self._cache: dict[tuple, np.ndarray] = {}
        self.n_hits = 0
        self.n_misses = 0

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        jobs = state.jobs
        is_placed = state.job_machine[env, job] >= 0
        n_obs = np.where(is_placed, state.t[env] - state.job_start[env, job] + 1, 0)
        seq, wids = jobs.sequence_keys, jobs.workload_ids
        request = jobs.request[env, job].tolist()
        keys = [
            (
                seq[b] if b < len(seq) else b,
                wids[b][j] if b < len(wids) and j < len(wids[b]) else j,
                a,
                d,
                tuple(r),
                n,
            )
            for b, j, a, d, r, n in zip(
                env.tolist(),
                job.tolist(),
                jobs.arrival_step[env, job].tolist(),
                jobs.duration[env, job].tolist(),
                request,
                n_obs.tolist(),
                strict=True,
            )
        ]
        found = [self._cache.get(k) for k in keys]
        miss = np.array([f is None for f in found], dtype=bool)
        out = np.empty((env.size, len(self.levels), self.horizon, cfg.n_resources))
        if miss.any():
            fresh = self.base.forecast(cfg, state, env[miss], job[miss])
            out[miss] = fresh
            if len(self._cache) > self.max_entries:
                self._cache.clear()
            for i, f in zip(np.flatnonzero(miss).tolist(), fresh, strict=True):
                self._cache[keys[i]] = f
        hit = np.flatnonzero(~miss)
        if hit.size:
            out[hit] = np.stack([found[i] for i in hit.tolist()])
        self.n_hits += int(hit.size)
        self.n_misses += int(miss.sum())
        return out
