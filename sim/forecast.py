"""Usage forecasts as a scheduler may use them: the plug-in point between `sim/` and a forecaster in `models/`.

A scheduler that packs beyond requests needs, for the job it is placing and for the jobs already running on each
machine, quantiles of their usage over the next H steps. What a forecaster may read is fixed here, in one place:

- `JobView` is everything a real scheduler knows about a job at decision time: its request, its observed EC label,
  its meta information, how many steps of it have been observed, and its OBSERVED usage so far. For a running job
  the observed steps are ages 0 .. t - start (the current step t included: the simulator's mask and every
  heuristic already read the machines' usage at t); for a job not yet placed nothing has been observed (age 0).
- Forecasts are of the steps t + 1 .. t + H (for a job placed now, ages 1 .. H).
- `job_view` is the only function here that gives a forecaster `JobBatch.usage`, and only its observed steps, so
  a forecaster that builds its inputs from it cannot see the future (tests/sim/test_risk.py perturbs the future
  and checks every view, forecast and decision is unchanged). `ForecastCache` hashes the whole profile into its
  cache key only: a different future is a cache miss and the same forecast, never an input.

`UsageForecaster` is the Protocol a forecaster implements (`models.usage_forecast` has the learned one);
`ExactForecaster` reads the true future and is an oracle: a yardstick for tests and the information gap, never a
scheduler to report as a winner; `PartialTruthForecaster` and `TruthOverForecaster` read the true future of part
of the jobs (the running ones or the arriving one: the information gap's split) and are oracles too.
`ForecastCache` memoises a forecaster of observed usage by what it reads.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from sim.config import SimConfig
from sim.core import State, observed_labels
from sim.jobs import JobBatch
from sim.labelling import reads_labels

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
    recent_exact: np.ndarray | None = None
    """(N, R, D) float64 like `recent`, from the unquantised usage (`JobBatch.usage_exact`), with exactly the same
    observed-steps mask; None when the batch has no unquantised usage (NaN where a job has none)."""
    life_max_exact: np.ndarray | None = None
    """(N, D) float64 like `life_max`, from the unquantised usage; None as `recent_exact`."""
    life_mean_exact: np.ndarray | None = None
    """(N, D) float64 like `life_mean`, from the unquantised usage; None as `recent_exact`."""

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


def levels_of(point: np.ndarray, n_levels: int) -> np.ndarray:
    """(N, L, H, D) a point forecast (N, H, D) repeated at every level."""
    return np.ascontiguousarray(np.broadcast_to(point[:, None], (point.shape[0], n_levels, *point.shape[1:])))


def is_point_forecaster(forecaster) -> bool:
    """Whether every quantile level of `forecaster` is one value (persistence, the request, the true future, and
    recall over any of them): it then offers `point(cfg, state, env, job)` -> (N, H, D), the forecast without its
    level axis, and risk bounds skip the deviations (exactly 0)."""
    if isinstance(forecaster, RecallOverlay):
        return is_point_forecaster(forecaster.inner)
    return callable(getattr(forecaster, "point", None))


def point_forecast(
    forecaster, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
) -> np.ndarray | None:
    """(N, H, D) the forecast of a point forecaster (`is_point_forecaster`), else None."""
    if not is_point_forecaster(forecaster):
        return None
    return forecaster.point(cfg, state, np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64))


def is_flat_forecaster(forecaster) -> bool:
    """Whether `forecaster` holds one value per job at every step and level (persistence, the request, the
    remaining-peak quantile; never recall, which replays a profile): it then offers `flat(cfg, state, env, job)`
    -> (N, D), and a bound over the horizon needs no horizon axis (`sim.risk.flat_head_share`)."""
    return callable(getattr(forecaster, "flat", None)) and is_point_forecaster(forecaster)


def flat_forecast(
    forecaster, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
) -> np.ndarray | None:
    """(N, D) the value of a flat forecaster (`is_flat_forecaster`) for each job, else None."""
    if not is_flat_forecaster(forecaster):
        return None
    return forecaster.flat(cfg, state, np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64))


def flat_level_forecast(
    forecaster, levels, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
) -> np.ndarray | None:
    """(N, L, D) the quantiles of `levels` of a forecaster that holds each level at its own value per job over the
    horizon (one offering `flat_levels(levels, cfg, state, env, job)`, e.g.
    `sim.peak_forecast.RemainingPeakQuantiles`), else None (a flat point forecaster, one value at every level:
    `flat_forecast`)."""
    if not callable(getattr(forecaster, "flat_levels", None)):
        return None
    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    return forecaster.flat_levels(tuple(levels), cfg, state, env, job)


def forecast_at_levels(
    forecaster, levels, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
) -> np.ndarray:
    """(N, L, H, D) float64 the forecaster's quantiles at `levels` (each one of its levels) only: a forecaster with
    a value per level (`flat_levels`), or recall over one, spreads just those levels over the horizon; any other
    forecaster's `forecast` is sliced. The same numbers as `forecast(...)[:, index of each level]`."""
    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    levels = tuple(levels)
    inner = forecaster.inner if isinstance(forecaster, RecallOverlay) else forecaster
    if callable(getattr(inner, "flat_levels", None)):
        values = inner.flat_levels(levels, cfg, state, env, job)  # (N, L, D)
        out = np.ascontiguousarray(
            np.broadcast_to(
                values[:, :, None, :], (values.shape[0], len(levels), inner.horizon, values.shape[2])
            )
        ).astype(np.float64, copy=False)
        if inner is not forecaster:
            out = forecaster._overlay(cfg, state, env, job, out, level_axis=True)
        return out
    who = type(forecaster).__name__
    index = [level_index(forecaster.levels, lv, who) for lv in levels]
    return forecaster.forecast(cfg, state, env, job)[:, index]


def flat_planes(
    forecaster,
    levels,
    cfg: SimConfig,
    state: State,
    env: np.ndarray,
    job: np.ndarray,
    n_alive: np.ndarray,
    horizon: int,
    squares: bool,
) -> tuple[np.ndarray, np.ndarray] | None:
    """For a forecaster with a value per level (`flat_levels`), recall over one included, the planes of the jobs
    (env, job) over steps t + 1 .. t + `horizon` from one kernel (`sim.compiled_planes.flat_planes`): (N, P, H, D)
    the median, each upper level's deviation max(q - median, 0) and, with `squares`, their squares, times being
    alive (`n_alive` (N,) steps); and the medians (N, H, D). The numbers of `forecast_at_levels` followed by those
    operations, without its (N, L, H, D) array. None for any other forecaster or a horizon past its own."""
    inner = forecaster.inner if isinstance(forecaster, RecallOverlay) else forecaster
    if not callable(getattr(inner, "flat_levels", None)) or horizon > inner.horizon:
        return None
    from sim.compiled_planes import flat_planes as kernel  # loads numba: on first use

    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    values = inner.flat_levels(tuple(levels), cfg, state, env, job)  # (N, L, D)
    recalled = forecaster.recalled(cfg, state, env, job) if inner is not forecaster and env.size else None
    return kernel(values, recalled, np.asarray(n_alive), int(horizon), squares)


def find_level(levels, level: float) -> int | None:
    """Position of `level` among a forecaster's `levels` (to 1e-9), or None where it is not one."""
    for i, lv in enumerate(levels):
        if abs(lv - level) < 1e-9:
            return i
    return None


def level_index(levels, level: float, who: str) -> int:
    """Position of `level` among a forecaster's `levels` (to 1e-9); ValueError naming `who` where it is not one."""
    found = find_level(levels, level)
    if found is not None:
        return found
    raise ValueError(f"{who}: level {level} is not one of the forecaster's levels {tuple(levels)}")


def spread_flat(values: np.ndarray, horizon: int) -> np.ndarray:
    """(N, H, D) contiguous float64: the per-job values (N, D) held at each of `horizon` steps."""
    values = np.asarray(values, dtype=np.float64)
    return np.ascontiguousarray(
        np.broadcast_to(values[:, None, :], (values.shape[0], horizon, values.shape[1]))
    )


def n_observed(state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
    """(N,) int64 steps of each job's usage observed by t (0 for a job not placed yet; at most its duration)."""
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], state.t[env] + 1)
    return np.clip(state.t[env] - start + 1, 0, state.jobs.duration[env, job]).astype(np.int64)


def observed_peak(state: State, env: np.ndarray, job: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_observed (N,), life_max (N, D)) of `job_view`, without the rest of the view (flat forecasters read
    only these, the request and the label)."""
    n_obs = n_observed(state, env, job)
    return n_obs, state.jobs.observed_prefix[0].peak_at(env, job, n_obs)


def recent_usage(
    profiles: np.ndarray, env: np.ndarray, job: np.ndarray, n_obs: np.ndarray, n_recent: int
) -> np.ndarray:
    """(N, n_recent, D) float64: the last `n_recent` observed steps of each job's (B, J, T, D) `profiles`, oldest
    first, NaN before its first observed step (`job_view.recent`; `n_obs` from `n_observed`)."""
    recent_ages = n_obs[:, None] - n_recent + np.arange(n_recent)[None, :]  # (N, R)
    recent = profiles[env[:, None], job[:, None], np.clip(recent_ages, 0, profiles.shape[2] - 1)]
    recent = recent.astype(np.float64)
    recent[recent_ages < 0] = np.nan
    return recent


def job_view(cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, n_recent: int) -> JobView:
    """The `JobView` of jobs `job` (N,) of envs `env` (N,): observed usage only (see the module docstring); the
    unquantised usage (`JobBatch.usage_exact`), when the batch has it, through the same mask."""
    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    jobs = state.jobs
    n_obs = n_observed(state, env, job)
    prefix, prefix_exact = jobs.observed_prefix

    def observed(profiles: np.ndarray, summary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(recent, life_max, life_mean) of the (B, J, T, D) profiles over each job's observed ages only."""
        return recent_usage(profiles, env, job, n_obs, n_recent), *summary.at(env, job, n_obs)

    recent, life_max, life_mean = observed(jobs.usage, prefix)
    exact = (None, None, None) if jobs.usage_exact is None else observed(jobs.usage_exact, prefix_exact)
    meta = (
        jobs.meta[env, job].astype(np.float64)
        if jobs.meta is not None
        else np.full((env.size, 4), np.nan, dtype=np.float64)
    )
    return JobView(
        request=jobs.request[env, job].astype(np.int64),
        label=observed_labels(state)[env, job].astype(np.int64),
        meta=meta,
        n_observed=n_obs,
        recent=recent,
        life_max=life_max,
        life_mean=life_mean,
        capacity=np.asarray(cfg.capacity_units, dtype=np.int64),
        recent_exact=exact[0],
        life_max_exact=exact[1],
        life_mean_exact=exact[2],
    )


@dataclass(frozen=True)
class ExactForecaster:
    """ORACLE: every quantile is the job's true usage at t + 1 .. t + H (0 after it ends). For tests and for
    the information gap (the same rule on true usage); never reported as a scheduler of its own."""

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    is_oracle: bool = True

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.levels))

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) the true usage (every level's value)."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        jobs = state.jobs
        ages, alive = life_steps(state, env, job, self.horizon)
        units = jobs.usage[env[:, None], job[:, None], np.clip(ages, 0, jobs.max_duration - 1)]  # (N, H, D)
        return units.astype(np.float64) * alive[..., None]


def life_steps(state: State, env: np.ndarray, job: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(ages (N, H), alive (N, H)) of jobs `job` of envs `env` at steps t + 1 .. t + H: a placed job's age from
    its start, a job not placed yet as if placed now (started at t)."""
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], state.t[env])
    ages = state.t[env, None] + 1 + np.arange(horizon)[None, :] - start[:, None]
    return ages, (ages >= 0) & (ages < state.jobs.duration[env, job][:, None])


class OverInner:
    """The horizon, levels and label reading of a forecaster that wraps another (`inner`): the inner one's."""

    @property
    def horizon(self) -> int:
        return int(self.inner.horizon)

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(self.inner.levels)

    @property
    def reads_labels(self) -> bool:
        """The inner forecaster's (`sim.labelling.reads_labels`)."""
        return reads_labels(self.inner)


@dataclass(frozen=True)
class PartialTruthForecaster:
    """ORACLE, half of one: the true future (`ExactForecaster`) of one part of the jobs, every other job at its
    request over the steps it lives. `known="running"`: the jobs already placed are known, a job not placed yet
    is taken at its request (what a scheduler knows of it at arrival, nothing observed); `known="arriving"`: the
    reverse. The same rule on each splits the information gap: how much of what the true future gives comes from
    the running jobs' futures (what a forecaster of their observed usage could learn, at best) and how much needs
    the arriving job's own (`forecast_risk_truth_running`, `forecast_risk_truth_arriving` against
    `forecast_risk_truth`)."""

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    known: str = "running"
    is_oracle: bool = True

    def __post_init__(self) -> None:
        if self.known not in ("running", "arriving"):
            raise ValueError(
                f"PartialTruthForecaster.known must be 'running' or 'arriving', got {self.known!r}"
            )

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.levels))

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) the true usage of the known jobs, the request while alive of the others."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        exact = ExactForecaster(self.horizon, self.levels).point(cfg, state, env, job)
        _, alive = life_steps(state, env, job, self.horizon)
        request = state.jobs.request[env, job].astype(np.float64)[:, None, :] * alive[..., None]
        return np.where(known_part(self.known, state, env, job)[:, None, None], exact, request)


def known_part(known: str, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
    """(N,) bool: the jobs a half-oracle knows, the placed ones (`known="running"`) or the others ("arriving")."""
    is_placed = state.job_machine[env, job] >= 0
    return is_placed if known == "running" else ~is_placed


@dataclass(frozen=True)
class TruthOverForecaster(OverInner):
    """ORACLE, half of one: a point forecaster's forecast (`inner`, e.g. `forecast_peak`'s remaining-peak
    quantile) with the true future (`ExactForecaster`) in place of one part of the jobs: the jobs already placed
    (`known="running"`) or those not placed yet (`known="arriving"`). The fitted rule on it
    (`forecast_peak_truth_running`, `forecast_peak_truth_arriving`) says how much a perfect forecast of that part
    would add to the rule: which of the two a better forecaster should aim at."""

    inner: UsageForecaster
    known: str = "running"
    is_oracle: bool = True

    def __post_init__(self) -> None:
        if self.known not in ("running", "arriving"):
            raise ValueError(f"TruthOverForecaster.known must be 'running' or 'arriving', got {self.known!r}")
        if not is_point_forecaster(self.inner):
            raise ValueError(f"TruthOverForecaster: {type(self.inner).__name__} is not a point forecaster")

    def known_rows(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N,) bool: jobs whose future is known (the known part, and those `inner` knows, e.g. recalled in full),
        so a rule that takes young jobs at their request (`RiskConfig.min_observed`) does not for them."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        is_known = known_part(self.known, state, env, job)
        inner_known = getattr(self.inner, "known_rows", None)
        return is_known if inner_known is None else is_known | inner_known(cfg, state, env, job)

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.levels))

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) the true usage of the known jobs, `inner`'s forecast of the others."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        guess = point_forecast(self.inner, cfg, state, env, job).astype(np.float64, copy=False)
        exact = ExactForecaster(self.horizon, self.levels).point(cfg, state, env, job)
        return np.where(known_part(self.known, state, env, job)[:, None, None], exact, guess)


class ForecastCache(OverInner):
    """A `UsageForecaster` that memoises another one by what it reads: the job's content (usage profile, request,
    observed label, meta, duration: two random projections, seeded) and its observed steps (`job_view`'s
    n_observed). Exact: a cached row is the inner forecaster's own output for a job with the same view, as it
    came out of the batch in which it was first asked (a network's row may differ in its last float32 bits from
    batch to batch on some CPUs: seen on an AMD EPYC without AVX-512). Keeps at most `max_rows` rows (then
    computes the rest without storing them)."""

    def __init__(self, inner: UsageForecaster, max_rows: int = 200_000, seed: int = 0) -> None:
        if getattr(inner, "is_oracle", False):
            raise ValueError(
                f"{type(inner).__name__} reads the true future: the forecast placer never uses it as an input"
            )
        self.inner = inner
        self.max_rows = int(max_rows)
        self._rng = np.random.default_rng([seed, 7])
        self._proj: dict[int, np.ndarray] = {}
        self._token = object()  # names this cache's fingerprints among a batch's riders
        self._index = _KeyIndex()
        self._buf: np.ndarray | None = None
        self.n_hits = 0
        self.n_computed = 0

    def _fingerprint(self, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, 2) int64 hashes of what a forecaster reads about each job (integer arithmetic: the same job gives
        the same hash in any batch, whatever the batch size): a random projection of its usage profile, request,
        observed label, duration and meta. The projection is linear modulo 2^64, so the part that never changes
        (all but the label) is computed once per batch and rides with it (`JobBatch.rider`); each call adds the
        label's term."""
        jobs = state.jobs
        n_meta = 4 if jobs.meta is None else jobs.meta.shape[-1]
        n_usage = jobs.max_duration * jobs.n_resources
        width = n_usage + jobs.n_resources + 1 + 1 + n_meta
        if width not in self._proj:
            self._proj[width] = self._rng.integers(1, 2**61, size=(width, 2), dtype=np.int64)
        proj = self._proj[width]
        label_row = n_usage + jobs.n_resources
        fixed = jobs.rider(
            ("forecast_fingerprint", self._token, width), lambda: _fixed_hash(jobs, proj, label_row)
        )
        with np.errstate(over="ignore"):
            return fixed[env, job] + observed_labels(state)[env, job, None].astype(np.int64) * proj[label_row]

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        shape_tail = (len(self.levels), self.horizon, cfg.n_resources)
        if env.size == 0:
            return np.zeros((0, *shape_tail))
        n_obs = n_observed(state, env, job)
        keys = np.concatenate([self._fingerprint(state, env, job), n_obs[:, None].astype(np.int64)], axis=1)
        rows = self._index.find(keys)
        miss = np.flatnonzero(rows < 0)
        self.n_hits += int(env.size - miss.size)
        out = np.empty((env.size, *shape_tail))
        if miss.size:
            # one forecast per distinct missing key (a batch holds the same job many times over rollouts), asked
            # in the order of their first occurrence
            _, first, inverse = np.unique(keys[miss], axis=0, return_index=True, return_inverse=True)
            order = np.argsort(first)
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            uniq = miss[first[order]]
            fresh = self.inner.forecast(cfg, state, env[uniq], job[uniq])
            self.n_computed += int(uniq.size)
            out[miss] = fresh[rank[inverse.ravel()]]
            self._store(keys[uniq], fresh)
        hit = np.flatnonzero(rows >= 0)
        if hit.size:
            out[hit] = self._buf[rows[hit]]
        return out

    def _store(self, keys: np.ndarray, values: np.ndarray) -> None:
        n_have = self._index.size
        room = max(self.max_rows - n_have, 0)
        if room == 0:
            return
        keys, values = keys[:room], values[:room]
        need = n_have + len(keys)
        if self._buf is None or self._buf.shape[0] < need:
            size = min(max(need, 2 * (0 if self._buf is None else self._buf.shape[0]), 1024), self.max_rows)
            buf = np.empty((size, *values.shape[1:]))
            if self._buf is not None:
                buf[:n_have] = self._buf[:n_have]
            self._buf = buf
        self._buf[n_have:need] = values
        self._index.add(keys)


class _KeyIndex:
    """Rows 0, 1, ... of (N, 3) int64 keys (two hashes and the observed steps), found vectorised: one 64-bit mix
    of each key, kept sorted, binary-searched, and the whole key compared (a mix shared by two keys makes the
    later one a miss every time: computed again, never wrong)."""

    _MIX = np.array([-7046029254386353131, 1, -4658895280553007687], dtype=np.int64)

    def __init__(self) -> None:
        self.keys = np.zeros((0, 3), dtype=np.int64)
        self.size = 0
        self._mix = np.zeros(0, dtype=np.int64)  # sorted
        self._row = np.zeros(0, dtype=np.int64)  # the row of each sorted mix

    def _mixed(self, keys: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return keys @ self._MIX  # wraps modulo 2^64

    def find(self, keys: np.ndarray) -> np.ndarray:
        """(N,) the row of each key, -1 where it is not held."""
        if self.size == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        mix = self._mixed(keys)
        pos = np.minimum(np.searchsorted(self._mix, mix), self.size - 1)
        row = self._row[pos]
        found = (self._mix[pos] == mix) & (self.keys[row] == keys).all(axis=1)
        return np.where(found, row, -1)

    def add(self, keys: np.ndarray) -> None:
        """Hold `keys` (not held yet) as the next rows."""
        n = len(keys)
        if self.keys.shape[0] < self.size + n:
            grown = np.empty((max(self.size + n, 2 * self.keys.shape[0], 1024), 3), dtype=np.int64)
            grown[: self.size] = self.keys[: self.size]
            self.keys = grown
        self.keys[self.size : self.size + n] = keys
        mix = self._mixed(keys)
        order = np.argsort(mix, kind="stable")
        at = np.searchsorted(self._mix, mix[order], side="right")
        self._mix = np.insert(self._mix, at, mix[order])
        self._row = np.insert(self._row, at, self.size + order)
        self.size += n


def _fixed_hash(jobs: JobBatch, proj: np.ndarray, label_row: int) -> np.ndarray:
    """(B, J, 2) int64: `ForecastCache._fingerprint`'s projection of every job's usage profile, request, duration
    and meta, without the label's term (row `label_row` of `proj`), in chunks of jobs (bounded memory)."""
    n_env, n_job = jobs.batch_size, jobs.max_jobs
    keep = np.r_[0:label_row, label_row + 1 : proj.shape[0]]
    p = proj[keep]
    out = np.empty((n_env * n_job, 2), dtype=np.int64)
    meta = jobs.meta.reshape(n_env * n_job, -1) if jobs.meta is not None else None
    usage = jobs.usage.reshape(n_env * n_job, -1)
    step = max(1, 1_000_000 // max(p.shape[0], 1))
    for lo in range(0, n_env * n_job, step):
        hi = min(lo + step, n_env * n_job)
        m = np.full((hi - lo, 4), np.nan) if meta is None else meta[lo:hi]
        m = np.where(np.isfinite(m), np.round(m * 1e6), -7).astype(np.int64)
        x = np.concatenate(
            [
                usage[lo:hi].astype(np.int64),
                jobs.request.reshape(n_env * n_job, -1)[lo:hi].astype(np.int64),
                jobs.duration.reshape(-1)[lo:hi, None].astype(np.int64),
                m,
            ],
            axis=1,
        )
        with np.errstate(over="ignore"):
            out[lo:hi] = x @ p  # wraps modulo 2^64: deterministic
    return out.reshape(n_env, n_job, 2)


# --- recurring workloads: what earlier runs of the same workload showed ------------------------------------------


@dataclass(frozen=True)
class RecallView:
    """What earlier runs of the same workload in the same sequence showed, for N query jobs (`recall_view`)."""

    usage: np.ndarray
    """(N, T, D) float64 units at each age of the job's life as the best earlier run showed it: observed ages of
    that run, 0 from its end on when it has finished; NaN where that run shows nothing (or there is none)."""
    n_runs: np.ndarray
    """(N,) int64 earlier runs of the same workload that have started (0: nothing to recall)."""
    complete: np.ndarray
    """(N,) bool the recalled run has finished: every age of the job's life is recalled."""


def _best_runs(state: State, rows: np.ndarray, compiled: bool = True) -> tuple[np.ndarray, ...]:
    """Per (env of `rows`, workload code): the two started runs observed longest (job index, -1 if none; ties: the
    earlier job) and how many runs have started; and the observed steps of every job of those envs (-1 when not
    started). Groups are r * n_codes + code for env rows[r]. `compiled`: one pass over the jobs
    (`sim.compiled_batch.best_runs`) instead of the sort below, the same arrays."""
    jobs = state.jobs
    codes = jobs.workload_code[rows]  # (R, J)
    n_rows, n_jobs = codes.shape
    started = (state.job_machine[rows] >= 0) & (state.job_start[rows] <= state.t[rows, None])
    n_obs = np.where(
        started, np.clip(state.t[rows, None] - state.job_start[rows] + 1, 0, jobs.duration[rows]), -1
    )
    n_codes = int(codes.max(initial=-1)) + 1
    if compiled:
        from sim.compiled_batch import best_runs  # loads numba: on first use

        return (*best_runs(codes, started, n_obs, n_codes), n_codes, n_obs)
    group = np.where(started & (codes >= 0), np.arange(n_rows)[:, None] * n_codes + codes, -1).ravel()
    order = np.lexsort((-n_obs.ravel(), group))  # by group, then longest observed first (stable: earlier job)
    order = order[group[order] >= 0]
    g_sorted = group[order]
    heads = (
        np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]]) if order.size else np.zeros(0, np.int64)
    )
    counts = np.diff(np.r_[heads, g_sorted.size])
    top1 = np.full(n_rows * max(n_codes, 1), -1, dtype=np.int64)
    top2, n_started = top1.copy(), np.zeros_like(top1)
    top1[g_sorted[heads]] = order[heads] % n_jobs
    two = heads[counts > 1]
    top2[g_sorted[two]] = order[two + 1] % n_jobs
    n_started[g_sorted[heads]] = counts
    return top1, top2, n_started, n_codes, n_obs


def recall_choice(
    state: State, rows: np.ndarray, r: np.ndarray, env: np.ndarray, job: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run each query job (env, job) would recall (`recall_view`), its agreement not yet tested: (best (N,) the
    started run of its workload observed longest other than itself, -1 where there is none; runs (N,) how many
    other runs of its workload have started; n_obs (R, J) the observed steps of every job of the envs `rows`,
    -1 when not started), with r (N,) each query's position in `rows`."""
    top1, top2, n_started, n_codes, n_obs = _best_runs(state, rows)
    own = state.jobs.workload_code[env, job]
    group = r * max(n_codes, 1) + np.maximum(own, 0)
    best = np.where(top1[group] == job, top2[group], top1[group])
    runs = np.where(own >= 0, n_started[group] - (n_obs[r, job] >= 0), 0)
    return np.where((runs > 0) & (best >= 0), best, -1), runs, n_obs


def recall_view(cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> RecallView:
    """For each query job, the OBSERVED usage of the longest-observed other run of the same workload
    (`JobBatch.workload_code`) in its sequence, by age, provided that run agrees with every step observed of the
    query job so far (else nothing is recalled). Reads only steps up to t of runs that have started, so nothing of
    the future: the scheduler's memory of a service it has run before (recurring jobs)."""
    env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
    jobs = state.jobs
    n, t_max, d = env.size, jobs.max_duration, jobs.n_resources
    out = np.full((n, t_max, d), np.nan)
    n_runs, complete = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    if n == 0:
        return RecallView(out, n_runs, complete)
    rows, r = np.unique(env, return_inverse=True)
    best, runs, n_obs = recall_choice(state, rows, r, env, job)
    has = np.flatnonzero(best >= 0)
    if has.size == 0:
        return RecallView(out, n_runs, complete)
    e, j, b = env[has], job[has], best[has]
    n_best = np.maximum(n_obs[r[has], b], 0)
    n_own = np.maximum(n_obs[r[has], j], 0)
    if jobs.usage.dtype.kind in "iu":  # one kernel for the rest, the same copies and comparisons
        from sim.compiled_batch import recall_runs  # loads numba: on first use

        recall_runs(jobs.usage, jobs.duration, e, j, b, n_best, n_own, has, runs[has], out, n_runs, complete)
        return RecallView(out, n_runs, complete)
    ages = np.arange(t_max)
    prior = jobs.usage[e, b].astype(np.float64)  # (n, T, D); only its observed ages are kept below
    both = ages[None, :] < np.minimum(n_own, n_best)[:, None]
    agrees = ~((prior != jobs.usage[e, j]).any(axis=2) & both).any(axis=1)
    best_done = n_best >= jobs.duration[e, b]
    agrees &= ~(best_done & (n_own > jobs.duration[e, b]))
    ok = (n_best > 0) & agrees
    ended = best_done[:, None] & (ages[None, :] >= jobs.duration[e, b][:, None])
    prior[ended] = 0.0
    prior[~((ages[None, :] < n_best[:, None]) | ended)] = np.nan
    out[has[ok]] = prior[ok]
    n_runs[has] = np.where(ok, runs[has], 0)
    complete[has] = ok & best_done
    return RecallView(out, n_runs, complete)


def recall_reliability(jobs: JobBatch) -> dict:
    """How far a run of a workload repeats its previous run in the same sequence, on (training) sequences: the
    share of repeated runs whose whole usage profile equals the previous run's, and how many repeats there are.
    A recall forecast is worth trusting only where this share is high (synthetic re-submissions: 1.0; windows cut
    at random offsets of a real VM: about 0)."""
    n_repeat = n_equal = 0
    for b in range(jobs.batch_size):
        codes = jobs.workload_code[b, : int(jobs.n_jobs[b])]
        last: dict[int, int] = {}
        for j, c in enumerate(codes.tolist()):
            if c < 0:
                continue
            if c in last:
                k = last[c]
                n_repeat += 1
                n_equal += int(
                    jobs.duration[b, j] == jobs.duration[b, k]
                    and np.array_equal(jobs.usage[b, j], jobs.usage[b, k])
                )
            last[c] = j
    return {"n_repeats": n_repeat, "share_equal": n_equal / n_repeat if n_repeat else 0.0}


class RecallMemo:
    """The recall views of the last state asked about, shared by every `RecallOverlay` of a thread: within one
    decision a rule and the placer's features ask about overlapping jobs of the same state, and a job's view depends
    only on the state (its env's runs), not on who asks, so each is computed once. Holds the state weakly."""

    def __init__(self) -> None:
        self._state: weakref.ref | None = None
        self._index = np.zeros((0, 0), dtype=np.int64)
        self._view = _empty_view(0, 0)

    def rows(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
    ) -> tuple[RecallView, np.ndarray]:
        """(every view held, (N,) the row of each asked job in it): computed where not held yet (a rule and the
        placer's features ask about the same jobs of a state; with `sim.running_sums` only the jobs placed since
        and the queue heads)."""
        n_envs, n_jobs = state.batch_size, state.jobs.max_jobs
        if self._state is None or self._state() is not state:
            self._state = weakref.ref(state)
            self._index = np.full((n_envs, n_jobs), -1, dtype=np.int64)
            self._view = _empty_view(state.jobs.max_duration, state.jobs.n_resources)
        index = self._index
        missing = index[env, job] < 0
        e, j = env[missing], job[missing]
        if e.size:
            keep = index[e, j] < 0
            pair = np.unique(e[keep] * n_jobs + j[keep])
            e, j = pair // n_jobs, pair % n_jobs
            fresh = recall_view(cfg, state, e, j)
            held = self._view
            index[e, j] = held.n_runs.size + np.arange(e.size)
            self._view = RecallView(
                np.concatenate([held.usage, fresh.usage]),
                np.concatenate([held.n_runs, fresh.n_runs]),
                np.concatenate([held.complete, fresh.complete]),
            )
        return self._view, index[env, job]


def _empty_view(n_ages: int, n_resources: int) -> RecallView:
    return RecallView(
        np.zeros((0, n_ages, n_resources)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    )


_MEMOS = threading.local()


def _recall_memo() -> RecallMemo:
    """This thread's `RecallMemo` (ops of a threaded executor, e.g. Dask workers, never share one)."""
    memo = getattr(_MEMOS, "recall", None)
    if memo is None:
        memo = _MEMOS.recall = RecallMemo()
    return memo


class Recalled(NamedTuple):
    """The recalled jobs of a query (`RecallOverlay.recalled`): query row `dest[i]` recalls row `view_rows[i]` of
    `usage` (R, T, D); at horizon step h its age is t[i] + 1 + h - start[i] (0 past `max_duration`)."""

    usage: np.ndarray
    view_rows: np.ndarray
    dest: np.ndarray
    t: np.ndarray
    start: np.ndarray
    max_duration: int


@dataclass(frozen=True)
class RecallOverlay(OverInner):
    """A forecaster of observed usage, overridden by recall (`recall_view`): where an earlier run of the job's
    workload has shown the ages forecast, every quantile is that run's usage (0 after its end). Used only when
    the training sequences show that runs repeat (`fit_recall`); the inner forecaster answers everything else.
    Not cacheable by the job alone (a recall depends on the other runs observed so far): wrap the inner forecaster
    in `ForecastCache`, never this (`with_cache` does). Its labels are the inner forecaster's: recall reads
    workload runs, not labels."""

    inner: UsageForecaster
    reliability: float = 1.0
    """`recall_reliability`'s share_equal on the training sequences (recorded with the rule's choices)."""

    def _view(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
    ) -> tuple[RecallView, np.ndarray]:
        return _recall_memo().rows(cfg, state, env, job)

    def known_rows(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N,) bool: jobs whose whole life is recalled from a finished earlier run (a rule need not wait to
        observe them)."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        view, rows = self._view(cfg, state, env, job)
        return view.complete[rows]

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        return self._overlay(cfg, state, env, job, self.inner.forecast(cfg, state, env, job), level_axis=True)

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) of a point inner forecaster (`is_point_forecaster`), recall overlaid. A flat one's values are
        spread and overlaid by one kernel (`sim.compiled_planes.flat_planes`'s medians: the same numbers)."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        if is_flat_forecaster(self.inner) and env.size:
            from sim.compiled_planes import flat_planes as kernel  # loads numba: on first use

            values = flat_forecast(self.inner, cfg, state, env, job)[:, None, :]  # (N, 1, D): one level
            every = np.full(env.size, self.horizon, dtype=np.int64)  # times 1 at every step: the values
            return kernel(values, self.recalled(cfg, state, env, job), every, self.horizon, False)[1]
        inner = point_forecast(self.inner, cfg, state, env, job)
        if inner is None:
            raise TypeError(f"RecallOverlay.point: {type(self.inner).__name__} is not a point forecaster")
        return self._overlay(cfg, state, env, job, np.array(inner, dtype=np.float64), level_axis=False)

    def recalled(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> Recalled | None:
        """Which of the jobs (env, job) have a recalled run and where its usage is (`Recalled`), or None where
        none has."""
        view, rows = self._view(cfg, state, env, job)
        has = np.flatnonzero(view.n_runs[rows] > 0)
        if has.size == 0:
            return None
        e, j = env[has], job[has]
        start = np.where(state.job_machine[e, j] >= 0, state.job_start[e, j], state.t[e])
        return Recalled(view.usage, rows[has], has, state.t[e], start, int(state.jobs.max_duration))

    def _overlay(
        self,
        cfg: SimConfig,
        state: State,
        env: np.ndarray,
        job: np.ndarray,
        out: np.ndarray,
        level_axis: bool,
    ) -> np.ndarray:
        if env.size == 0:
            return out
        rec = self.recalled(cfg, state, env, job)
        if rec is None:
            return out
        jobs = state.jobs
        has, start = rec.dest, rec.start
        compiled = out.dtype == rec.usage.dtype == np.float64 and out.flags.c_contiguous
        if compiled and out.shape[-2] == self.horizon:
            from sim.compiled_batch import overlay_recall  # loads numba: on first use

            overlay_recall(out, rec.usage, rec.view_rows, has, rec.t, start, jobs.max_duration)
            return out
        ages = rec.t[:, None] + 1 + np.arange(self.horizon)[None, :] - start[:, None]  # (n, H)
        inside = ages < jobs.max_duration
        vals = rec.usage[rec.view_rows[:, None], np.clip(ages, 0, jobs.max_duration - 1)]  # (n, H, D)
        vals = np.where(inside[..., None], vals, 0.0)
        if has.size < env.size:
            full = np.full((env.size, *vals.shape[1:]), np.nan)
            full[has] = vals
            vals = full
        if level_axis:  # every level is the recalled value
            vals = vals[:, None]
        np.copyto(out, vals, where=np.isfinite(vals))
        return out


def fit_recall(
    inner: UsageForecaster, train: JobBatch, min_share: float = 0.95
) -> tuple[UsageForecaster, dict]:
    """`RecallOverlay(inner)` when at least `min_share` of the repeated runs in the training sequences repeat their
    previous run exactly, else `inner` unchanged; and what was measured (for the rule's choices)."""
    measured = measure_recall(train, min_share)
    return with_recall(inner, measured), measured


def measure_recall(train: JobBatch, min_share: float = 0.95) -> dict:
    """`recall_reliability` of the training sequences and whether recall is worth using ("recall_used": at least
    `min_share` of the repeated runs repeat their previous run exactly)."""
    rel = recall_reliability(train)
    return {**rel, "recall_used": bool(rel["n_repeats"] > 0 and rel["share_equal"] >= min_share)}


def with_recall(inner: UsageForecaster, measured: dict) -> UsageForecaster:
    """`RecallOverlay(inner)` where `measured` (`measure_recall`) says recall is used, else `inner`."""
    return RecallOverlay(inner, measured["share_equal"]) if measured["recall_used"] else inner


def with_cache(forecaster: UsageForecaster, max_rows: int = 200_000, seed: int = 0) -> UsageForecaster:
    """The forecaster memoised by what it reads: `ForecastCache` around it, or around a `RecallOverlay`'s inner
    forecaster (a recall depends on other runs, so the overlay itself is never cached); a cached one, and a point
    forecaster that reads no future (cheaper than its cache key), as it is."""
    if isinstance(forecaster, ForecastCache):
        return forecaster
    if isinstance(forecaster, RecallOverlay):
        return RecallOverlay(with_cache(forecaster.inner, max_rows, seed), forecaster.reliability)
    if is_point_forecaster(forecaster) and not getattr(forecaster, "is_oracle", False):
        return forecaster  # persistence, the request: computed faster than their cache keys
    if callable(getattr(forecaster, "flat_levels", None)):
        return forecaster  # a table look-up per job (remaining-peak quantiles): cheaper than its cache key
    return ForecastCache(forecaster, max_rows, seed)


def uncached(forecaster: UsageForecaster) -> UsageForecaster:
    """The forecaster `with_cache` wrapped (the same object where nothing was wrapped)."""
    if isinstance(forecaster, ForecastCache):
        return forecaster.inner
    if isinstance(forecaster, RecallOverlay):
        return RecallOverlay(uncached(forecaster.inner), forecaster.reliability)
    return forecaster
