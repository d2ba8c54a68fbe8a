"""Risk-aware packing beyond requests: schedulers that place a job on a machine only while the forecast chance
that the machine's summed usage exceeds capacity over the horizon stays small, and otherwise follow a
request-based heuristic.

Why: every request-based heuristic (Tetris, Best-Fit, DeepRM's SJF and Packer) never overshoots, and it leaves
machines as empty as the sum of peak requests says. A foresight oracle shows 14-84 % headroom in return, almost all
of it from packing beyond requests; each wrong guess costs K_o on every co-located job. So a rule may pack
beyond requests only as far as the forecast's uncertainty allows.

The machine's joint forecast (TVW-RL's machines run several workloads that can peak together):
for the jobs i on machine m (the placed ones, plus the candidate job), with per-job median mu_i(k) and upper
quantile q_i(k) at level p for step t + k, the level-p bound of the SUM is

    S(k) = sum_i mu_i(k) + sqrt(rho * (sum_i delta_i(k))^2 + (1 - rho) * sum_i delta_i(k)^2),  delta = q - mu

rho = 1 is the sum of quantiles (jobs peak together: comonotone, the most cautious), rho = 0 adds independent
deviations (the N-sigma of a sum of independent jobs). `fit_rho` calibrates rho on training sequences so that the
bound of the sum covers the realised sum at the nominal level: the quantile of the sum, not the sum of quantiles.
Covering every step of the horizon at once asks more than per-step quantiles give: where even rho = 1 covers too
few cases, the deviation term is multiplied by kappa >= 1 (`RiskConfig.inflation`), the level-p quantile of each
case's score max_k,d (realised sum - sum of medians) / deviation (split-conformal on the fit sequences).
A machine is safe for the job when S(k) <= C_d at every step k = 1..H and resource d (step t itself is the
simulator's mask: the machine's usage now plus the job's first step fit).

With durations known (the simulator's `duration`, as DeepRM's SJF also reads it), a job's forecast is 0 after it
ends; with durations unknown every running job is assumed to run through the horizon.

Decision modes:
- "deviate": follow the fallback heuristic; only where it would hold or open an empty machine, take instead the
  tightest safe machine already in use. The fallback's own choice is safe by requests, so this rule never does
  worse than the heuristic by construction of a single decision; it differs only by packing more.
- "pack": always take the tightest safe machine in use (highest bound peak); where none is safe, the fallback.
- "guard": as "pack", but never onto a machine the bound calls unsafe: where no used machine is safe, the
  fallback's choice if it is safe, else an empty machine, else hold (where the simulator lets it; else the
  fallback). Where requests understate usage (a trace's own requests) the fallback's choice can overshoot.

The rules of this module (all deployable: they read only `sim.forecast.job_view`'s observed usage, requests and,
where said, durations):
- `RiskAwarePacking` with a learned forecaster (`models.usage_forecast`): registry names contain "forecast".
- `RiskAwarePacking` with `PersistenceForecaster` (each running job keeps its usage observed now; the job placed
  uses its request): the "hybrid" rule, the best heuristic deviating only to use a machine that is safe by
  observed usage now and known end times.
- `PeakPredictorPacking`: Google's production peak predictors (Bashir et al., EuroSys 2021, "Take it to the
  limit"): a machine's future peak is predicted from the summed observed usage of the workloads running on it over
  a trailing window, as N-sigma (mean + N x std) or max(percentile p, N-sigma); the job fits when that peak plus
  its request is within capacity.
Every tunable knob (level, rho, N, mode, the fallback heuristic itself) is chosen per (source, load) on validation
sequences carved from the TRAINING split (`sim.tuning`), never on test sequences.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from typing import Protocol, runtime_checkable

import numpy as np

from sim import running_sums
from sim.config import SimConfig
from sim.core import (
    State,
    action_mask,
    current_usage,
    jobs_per_machine,
    jobs_running,
    machines_used,
    queue_head,
    sum_by_cell,
)
from sim.forecast import (
    DEFAULT_LEVELS,
    RecallOverlay,
    UsageForecaster,
    fit_recall,
    flat_forecast,
    flat_level_forecast,
    flat_planes,
    forecast_at_levels,
    is_flat_forecaster,
    is_point_forecaster,
    job_view,
    level_index,
    levels_of,
    measure_recall,
    n_observed,
    observed_peak,
    point_forecast,
    recent_usage,
    spread_flat,
    uncached,
    with_cache,
    with_recall,
)
from sim.labelling import reads_labels
from sim.recall_sums import recall_head_share
from sim.running_sums import RunningSums, reads_other_runs

MODES = ("deviate", "pack", "guard")


@dataclass(frozen=True)
class RiskConfig:
    """Knobs of `RiskAwarePacking` (chosen on validation sequences, `sim.tuning`)."""

    level: float = 0.95
    """p: quantile level of the machine's summed usage that must stay within C_d (nominal risk 1 - p per step)."""
    rho: float = 1.0
    """Co-peaking of co-located jobs in the sum's bound: 1 = sum of quantiles, 0 = independent deviations."""
    inflation: float = 1.0
    """kappa >= 1, the factor on the bound's deviation term: fitted (`sim.tuning.fit_rho`) where even the sum of
    quantiles covers the realised sum over the horizon in fewer than a `level` share of training cases."""
    mode: str = "deviate"
    """"deviate" (follow the fallback unless it holds or opens an empty machine), "pack" or "guard" (module
    doc)."""
    use_durations: bool = True
    """Known end times: a job's forecast is 0 after it ends. False: running jobs run through the horizon."""
    horizon: int | None = None
    """Steps t + 1 .. t + H checked; None = the forecaster's whole horizon."""
    extend_to: int | None = None
    """Steps checked in all: beyond the forecaster's horizon each job is held at its forecast's peak (the largest
    median and deviation over the horizon) up to step t + extend_to, so a long job's later peaks still count;
    None checks the forecast horizon only."""
    min_observed: int = 0
    """A job observed for fewer steps than this is taken at its request (every quantile = request): the forecast
    is trusted only once the job has shown some of its pattern. 0 trusts it from arrival; a value above every
    job's duration gives request-based packing, i.e. the fallback heuristic itself."""

    def __post_init__(self) -> None:
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"RiskConfig.level must be in (0, 1), got {self.level}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"RiskConfig.rho must be in [0, 1], got {self.rho}")
        if not self.inflation >= 1.0:
            raise ValueError(f"RiskConfig.inflation must be >= 1, got {self.inflation}")
        if self.mode not in MODES:
            raise ValueError(f"RiskConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.min_observed < 0:
            raise ValueError(f"RiskConfig.min_observed must be >= 0, got {self.min_observed}")
        if self.horizon is not None and self.horizon < 1:
            raise ValueError(f"RiskConfig.horizon must be >= 1 or None, got {self.horizon}")


# --- the joint bound -----------------------------------------------------------------------------


def job_moments(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    env: np.ndarray,
    job: np.ndarray,
    rcfg: RiskConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """(mu, delta) (N, H, D) of jobs `job` of envs `env` at steps t + 1 .. t + H: median and level-p quantile minus
    the median, zero after the job's end when durations are known (a point forecaster's delta: a read-only view
    of 0)."""
    horizon = forecaster.horizon if rcfg.horizon is None else rcfg.horizon
    if horizon > forecaster.horizon:
        raise ValueError(
            f"RiskConfig.horizon {horizon} exceeds the forecaster's horizon {forecaster.horizon} "
            f"({type(forecaster).__name__})"
        )
    who = type(forecaster).__name__
    for level in (0.5, rcfg.level):  # the rule's error for a level the forecaster lacks
        level_index(forecaster.levels, level, who)
    if env.size == 0:
        n_steps = max(horizon, rcfg.extend_to or 0)
        empty = np.zeros((0, n_steps, cfg.n_resources))
        return empty, empty
    point = point_forecast(forecaster, cfg, state, env, job)
    if point is not None:  # every level is one value: the deviation is exactly 0 (computed with none below)
        mu, delta = point[:, :horizon], None
    else:
        every = np.full(env.size, horizon, dtype=np.int64)  # alive at every step: times 1, the same numbers
        fast = flat_planes(forecaster, (0.5, rcfg.level), cfg, state, env, job, every, horizon, False)
        if (
            fast is not None
        ):  # a value per level (recall over it included): one kernel, no (N, 2, H, D) quantiles
            mu, delta = fast[0][:, 0], fast[0][:, 1]
        else:
            quant = forecast_at_levels(forecaster, (0.5, rcfg.level), cfg, state, env, job)[:, :, :horizon]
            mu, up = quant[:, 0], quant[:, 1]
            delta = np.maximum(up - mu, 0.0)
    if rcfg.extend_to is not None and rcfg.extend_to > horizon:
        tail = rcfg.extend_to - horizon
        mu = np.concatenate([mu, np.repeat(mu.max(axis=1, keepdims=True), tail, axis=1)], axis=1)
        if delta is not None:
            delta = np.concatenate([delta, np.repeat(delta.max(axis=1, keepdims=True), tail, axis=1)], axis=1)
        horizon = rcfg.extend_to
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], state.t[env] + 1)
    if rcfg.min_observed > 0:
        is_young = state.t[env] - start + 1 < rcfg.min_observed
        # a forecaster that knows some jobs before they are observed (recall) says which
        known_rows = getattr(forecaster, "known_rows", None)
        if known_rows is not None:
            is_young &= ~known_rows(cfg, state, env, job)
        is_young = is_young[:, None, None]
        request = state.jobs.request[env, job].astype(np.float64)[:, None, :]
        mu = np.where(is_young, request, mu)
        delta = None if delta is None else np.where(is_young, 0.0, delta)
    if rcfg.use_durations:
        start = np.minimum(start, state.t[env])  # a job placed now starts at t
        end = start + state.jobs.duration[env, job]  # exclusive
        steps = state.t[env, None] + 1 + np.arange(horizon)[None, :]
        alive = (steps < end[:, None])[..., None]
        mu = mu * alive
        delta = None if delta is None else delta * alive
    return mu, (np.broadcast_to(0.0, mu.shape) if delta is None else delta)


def machine_sums(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    rcfg: RiskConfig,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per machine, over the jobs running now: (sum mu, sum delta, sum delta^2), each (B, M, H, D); only of the
    envs `rows` (then (len(rows), M, H, D), in that order) when given. (`head_bounds` carries them between a
    rollout's decisions: `sim.running_sums`.)"""
    is_run = jobs_running(state)
    n_envs = state.batch_size
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        position = np.full(n_envs, -1, dtype=np.int64)
        position[rows] = np.arange(rows.size)
        is_run = is_run & (position >= 0)[:, None]
        n_envs = rows.size
    bi, ji = np.nonzero(is_run)
    mu, delta = job_moments(cfg, state, forecaster, bi, ji, rcfg)
    n_m = cfg.n_machines
    cell = (bi if rows is None else position[bi]) * n_m + state.job_machine[bi, ji]
    point = is_point_forecaster(forecaster)
    planes = _moment_planes(mu, delta, point)
    sums = sum_by_cell(planes, cell, n_envs * n_m).reshape(n_envs, n_m, *planes.shape[1:])
    return _split_planes(sums, point)


def _moment_planes(mu: np.ndarray, delta: np.ndarray, point: bool) -> np.ndarray:
    """(N, P, H, D) what a machine sums per job: (mu, delta, delta^2), or mu alone for a point forecaster (its
    deviations are all 0)."""
    return mu[:, None] if point else np.stack([mu, delta, delta * delta], axis=1)


def _split_planes(sums: np.ndarray, point: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sum mu, sum delta, sum delta^2) of summed `_moment_planes` (..., P, H, D)."""
    s_mu = sums[..., 0, :, :]
    if point:
        zero = np.zeros_like(s_mu)
        return s_mu, zero, zero
    return s_mu, sums[..., 1, :, :], sums[..., 2, :, :]


def sum_bound(
    sum_mu: np.ndarray, sum_delta: np.ndarray, sum_delta2: np.ndarray, rho: float, inflation: float = 1.0
) -> np.ndarray:
    """The level-p bound of a sum of jobs (module docstring), elementwise, its deviation term times `inflation`."""
    return sum_mu + inflation * np.sqrt(rho * sum_delta**2 + (1.0 - rho) * sum_delta2)


def head_bounds(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    rcfg: RiskConfig,
    rows: np.ndarray | None = None,
    memo: RunningSums | None = None,
) -> np.ndarray:
    """(B, M, H, D) level-p bound of each machine's summed usage if the queue head is placed there now (only of
    the envs `rows` when given: (len(rows), M, H, D)). With `memo` (`sim.running_sums.RunningSums`), the running
    jobs' sums are carried from the rollout's previous decision wherever that is exact, and only the jobs placed
    since and the heads are forecast (one call)."""
    head = queue_head(state)
    rows = np.arange(state.batch_size) if rows is None else np.asarray(rows, dtype=np.int64)
    idx = np.minimum(state.next_job[rows], state.jobs.max_jobs - 1)
    if memo is None:
        mu_h, delta_h = job_moments(cfg, state, forecaster, rows, idx, rcfg)  # (R, H, D)
        s_mu, s_delta, s_delta2 = machine_sums(cfg, state, forecaster, rcfg, rows)
    else:
        point = is_point_forecaster(forecaster)

        def moments(env: np.ndarray, job: np.ndarray) -> np.ndarray:
            return _moment_planes(*job_moments(cfg, state, forecaster, env, job, rcfg), point)

        key = ("head_bounds", cfg, rcfg, point)  # what the moments read besides the forecaster
        sums, heads, _ = memo.per_machine(
            state, cfg.n_machines, key, moments, rows, reads_other_runs(forecaster), (rows, idx)
        )
        mu_h, delta_h, _ = _split_planes(heads, point)
        s_mu, s_delta, s_delta2 = _split_planes(sums, point)
    has_job = head.has_job[rows][:, None, None]
    mu_h, delta_h = mu_h * has_job, delta_h * has_job
    return sum_bound(
        s_mu + mu_h[:, None],
        s_delta + delta_h[:, None],
        s_delta2 + (delta_h**2)[:, None],
        rcfg.rho,
        rcfg.inflation,
    )


def flat_values(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    env: np.ndarray,
    job: np.ndarray,
    rcfg: RiskConfig,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray] | None:
    """For a forecaster flat over the horizon, what `job_moments` gives without its horizon axis: (value (N, D),
    delta (N, D) or None, steps (N,)) with mu[i, k] = value[i] and delta[i, k] = delta[i] for k < steps[i] and 0
    after. A flat point forecaster (`sim.forecast.is_flat_forecaster`) has no deviation (None); one with a value
    per level (`flat_levels`, e.g. `sim.peak_forecast.RemainingPeakQuantiles`) has the level's quantile minus
    the median. None for any other forecaster, or where a value is negative (the shortcuts below need every sum
    non-increasing in k)."""
    horizon = forecaster.horizon if rcfg.horizon is None else rcfg.horizon
    if horizon > forecaster.horizon:
        return None  # job_moments raises the error
    who = type(forecaster).__name__
    for level in (0.5, rcfg.level):  # the same error as job_moments for a level the forecaster lacks
        level_index(forecaster.levels, level, who)
    value, delta = flat_forecast(forecaster, cfg, state, env, job), None
    both = (
        None
        if value is not None
        else flat_level_forecast(forecaster, (0.5, rcfg.level), cfg, state, env, job)
    )
    if both is not None:
        value, delta = both[:, 0], np.maximum(both[:, 1] - both[:, 0], 0.0)
    if value is None or (value < 0).any():
        return None
    n_steps = max(horizon, rcfg.extend_to or 0)  # extend_to repeats each job's max: still flat
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], state.t[env] + 1)
    if rcfg.min_observed > 0:
        is_young = (state.t[env] - start + 1 < rcfg.min_observed)[:, None]
        value = np.where(is_young, state.jobs.request[env, job].astype(np.float64), value)
        delta = None if delta is None else np.where(is_young, 0.0, delta)
    if rcfg.use_durations:
        end = np.minimum(start, state.t[env]) + state.jobs.duration[env, job]  # exclusive, as job_moments
        steps = np.clip(end - state.t[env] - 1, 0, n_steps)
    else:
        steps = np.full(env.size, n_steps, dtype=np.int64)
    return value, delta, steps


def flat_head_share(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    rcfg: RiskConfig,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """`safe_and_tightness(head_bounds(...))` for a forecaster flat over the horizon (`flat_values`), without the
    horizon axis: every job's median and deviation hold until it ends and are 0 after, so a machine's sums of
    medians, deviations and squared deviations never rise over the horizon, nor does its bound (`sum_bound`,
    increasing in each), whose peak is at the first step (t + 1). O(jobs x D) instead of O(jobs x H x D); the same
    numbers (sums of the same values). None where `flat_values` is None (then the general path runs), at once
    where the forecaster is neither flat nor flat per level (recall: no running-job lists built for nothing)."""
    if not (is_flat_forecaster(forecaster) or callable(getattr(forecaster, "flat_levels", None))):
        return None
    head = queue_head(state)
    rows = np.arange(state.batch_size) if rows is None else np.asarray(rows, dtype=np.int64)
    idx = np.minimum(state.next_job[rows], state.jobs.max_jobs - 1)
    position = np.full(state.batch_size, -1, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    bi, ji = np.nonzero(jobs_running(state) & (position >= 0)[:, None])
    got_head = flat_values(cfg, state, forecaster, rows, idx, rcfg)
    got_run = flat_values(cfg, state, forecaster, bi, ji, rcfg)
    if got_head is None or got_run is None:
        return None
    n_m, n_d = cfg.n_machines, cfg.n_resources
    value, delta, steps = got_run
    alive = (steps > 0)[:, None]
    cell = position[bi] * n_m + state.job_machine[bi, ji]

    def per_machine(v: np.ndarray) -> np.ndarray:
        return sum_by_cell(v, cell, rows.size * n_m).reshape(rows.size, n_m, n_d)

    sums = per_machine(value * alive)  # each machine's medians at t + 1
    h_value, h_delta, h_steps = got_head
    h_alive = ((h_steps > 0) & head.has_job[rows])[:, None]
    with_head = sums + (h_value * h_alive)[:, None, :]
    if delta is not None:  # the level's deviations, co-peaking `rho` (as `head_bounds`)
        d, h_d = delta * alive, (h_delta * h_alive)[:, None, :]
        with_head = sum_bound(
            with_head, per_machine(d) + h_d, per_machine(d * d) + h_d**2, rcfg.rho, rcfg.inflation
        )
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    share = reduce(np.maximum, (with_head[:, :, d] / cap[d] for d in range(cap.size)))  # (B, M)
    return share <= 1.0 + 1e-9, share


def head_share(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    rcfg: RiskConfig,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(is_safe, tightness) (B, M) (or of the envs `rows`) of placing the queue head on each machine: the flat
    shortcut where it applies, else from the full bounds, the machines' sums carried between this thread's
    decisions of a rollout (`head_bounds` with `sim.running_sums.for_thread`'s memo for the forecaster and rcfg)."""
    flat = flat_head_share(cfg, state, forecaster, rcfg, rows)
    if flat is not None:
        return flat
    fused = recall_head_share(cfg, state, forecaster, rcfg, rows)  # recall: from each env's jobs, no planes
    if fused is not None:
        return fused
    memo = running_sums.for_thread(("head_bounds", rcfg), forecaster)  # one per rule setting: no thrashing
    return safe_and_tightness(head_bounds(cfg, state, forecaster, rcfg, rows, memo), cfg)


def deviation_rows(cfg: SimConfig, state: State, base: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Envs where "deviate" mode may leave the fallback's action: it holds or opens an empty machine while a valid
    machine in use exists (elsewhere no bound needs computing)."""
    n_m = cfg.n_machines
    used = machines_used(state)
    opens = (base < n_m) & ~used[np.arange(state.batch_size), np.minimum(base, n_m - 1)]
    return np.flatnonzero(((base == n_m) | opens) & (valid & used).any(axis=1))


def safe_and_tightness(bound: np.ndarray, cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """(B, M) whether a machine's bound stays within C_d at every step and resource, and its peak share."""
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    share = (bound / cap).max(axis=(2, 3)) if bound.shape[2] else np.zeros(bound.shape[:2])
    return share <= 1.0 + 1e-9, share


def deviate_or_pack(
    cfg: SimConfig,
    state: State,
    base: np.ndarray,
    is_safe: np.ndarray,
    tightness: np.ndarray,
    valid: np.ndarray,
    mode: str,
) -> np.ndarray:
    """(B,) actions: the tightest safe used machine where the mode says to deviate from `base`, else `base`."""
    n_m = cfg.n_machines
    used = machines_used(state)
    candidate = valid & is_safe & used
    best = np.argmax(np.where(candidate, tightness, -np.inf), axis=1)
    has_candidate = candidate.any(axis=1)
    if mode == "pack":
        return np.where(has_candidate, best, base)
    if mode == "guard":
        rows = np.arange(state.batch_size)
        safe_empty = valid & is_safe & ~used
        base_safe = (base < n_m) & (valid & is_safe)[rows, np.minimum(base, n_m - 1)]
        can_hold = action_mask(cfg, state)[:, n_m]
        otherwise = np.where(
            safe_empty.any(axis=1), np.argmax(safe_empty, axis=1), np.where(can_hold, n_m, base)
        )
        return np.where(has_candidate, best, np.where(base_safe | (base == n_m), base, otherwise))
    base_opens = (base < n_m) & ~used[np.arange(state.batch_size), np.minimum(base, n_m - 1)]
    deviate = has_candidate & ((base == n_m) | base_opens)
    return np.where(deviate, best, base)


def bounded_action(
    cfg: SimConfig,
    state: State,
    base: np.ndarray,
    valid: np.ndarray,
    mode: str,
    bounds,
) -> np.ndarray:
    """(B,) actions of a risk rule in `mode` (`deviate_or_pack`) from `bounds(rows)`, the (is_safe, tightness)
    of placing the queue head on each machine of the envs `rows` (None: every env). "pack" and "guard" bound every
    env; "deviate" only the envs where the fallback's `base` holds or opens an empty machine (most decisions keep
    it and need no bound)."""
    if mode in ("pack", "guard"):
        is_safe, tightness = bounds(None)
        return deviate_or_pack(cfg, state, base, is_safe, tightness, valid, mode)
    rows = deviation_rows(cfg, state, base, valid)
    if rows.size == 0:
        return base
    is_safe = np.zeros(valid.shape, dtype=bool)
    tightness = np.zeros(valid.shape)
    is_safe[rows], tightness[rows] = bounds(rows)
    return deviate_or_pack(cfg, state, base, is_safe, tightness, valid, "deviate")


# --- forecasters that need no training -----------------------------------------------------------


@dataclass(frozen=True)
class PersistenceForecaster:
    """Every quantile of a running job is its observed usage (`statistic`); a job not placed yet
    is forecast at its request. The "hybrid" rule's view: observed usage now and, with durations, end times."""

    reads_labels = False  # (sim.labelling.reads_labels)

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    statistic: str = "peak"
    """"peak": the largest usage observed so far (a job that has shown its peak keeps it); "now": the usage
    observed at the current step only."""

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.levels))

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) every level's value (`sim.forecast.point_forecast`)."""
        return spread_flat(self.flat(cfg, state, env, job), self.horizon)

    def flat(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, D) the value held at every step and level (`sim.forecast.flat_forecast`)."""
        if self.statistic == "peak":
            n_obs, seen = observed_peak(state, env, job)
        else:
            view = job_view(cfg, state, env, job, n_recent=1)
            n_obs, seen = view.n_observed, view.recent[:, -1]
        last = np.where(n_obs[:, None] > 0, seen, state.jobs.request[env, job])
        return np.nan_to_num(last, nan=0.0).astype(np.float64)


@dataclass(frozen=True)
class RequestForecaster:
    """Every quantile is the job's request: with it a risk-aware rule packs exactly like request-based packing."""

    reads_labels = False  # (sim.labelling.reads_labels)

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS

    def forecast(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        """(N, L, H, D) the request at every level and step; H = `horizon` (default: the configured one)."""
        return levels_of(self.point(cfg, state, env, job, horizon), len(self.levels))

    def point(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        """(N, H, D) every level's value (`sim.forecast.point_forecast`)."""
        h = self.horizon if horizon is None else int(horizon)
        if h < 1:
            raise ValueError(f"RequestForecaster: horizon must be >= 1, got {h}")
        return spread_flat(self.flat(cfg, state, env, job), h)

    def flat(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, D) the request (`sim.forecast.flat_forecast`)."""
        return state.jobs.request[env, job].astype(np.float64)


# --- the rules -------------------------------------------------------------------------------------


class _FollowsFallback:
    """The fallback heuristic (`fallback`, Tetris when None) decides which queued job goes next (DeepRM's SJF and
    Packer pick one; the others keep FIFO order) and whatever the rule itself does not."""

    fallback: object | None

    def _fallback(self):
        if self.fallback is None:
            from sim.policies import Tetris  # policies registers this module's rules: import here, not at top

            return Tetris()
        return self.fallback

    @property
    def reads_labels(self) -> bool:
        """Whether the rule may read EC labels (`sim.labelling.reads_labels`): its forecaster's or fallback's."""
        forecaster = getattr(self, "forecaster", None)
        return (forecaster is not None and reads_labels(forecaster)) or reads_labels(self._fallback())

    @property
    def picks_by_labels(self) -> bool:
        """Whether the job pick may read EC labels (`sim.labelling.picks_by_labels`): the fallback picks."""
        return reads_labels(self._fallback())

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        base = self._fallback()
        if hasattr(base, "pick_job"):
            return base.pick_job(cfg, state, rng)
        return np.zeros(state.batch_size, dtype=np.int64)


@dataclass(frozen=True)
class RiskAwarePacking(_FollowsFallback):
    """Place where the machine's forecast summed usage stays within capacity at level `risk.level` over the
    horizon (module docstring); the fallback heuristic decides whatever the rule does not (and which job is next,
    when it is a job picker such as DeepRM's SJF)."""

    forecaster: UsageForecaster | None = field(default=None, repr=False, compare=False)
    """Per-job quantile forecasts; None = `PersistenceForecaster()` (the hybrid rule's view)."""
    fallback: object | None = field(default=None, repr=False, compare=False)
    """A request-based `sim.policies.Policy`; None = Tetris."""
    risk: RiskConfig = RiskConfig()
    name: str = "forecast_risk"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim import compiled_decision  # loads numba: on first use
        from sim.policies import valid_machines

        decided = compiled_decision.risk_act(cfg, state, self)  # the same decisions, where its kernel applies
        if decided is not None:
            return decided
        base = np.asarray(self._fallback().act(cfg, state, rng), dtype=np.int64)
        forecaster = self.forecaster or PersistenceForecaster()
        valid = valid_machines(cfg, state)
        bounds = partial(head_share, cfg, state, forecaster, self.risk)
        return bounded_action(cfg, state, base, valid, self.risk.mode, bounds)


@runtime_checkable
class MachinePeakBound(Protocol):
    """A forecast of each machine's summed usage as a whole (`MachinePeakPacking`'s input; the learned one is
    `models.machine_forecast.MachinePeakModel`): the quantile of the SUM's peak, not a sum of per-job quantiles,
    and the chance that the sum exceeds capacity."""

    levels: tuple[float, ...]
    """Quantile levels it gives, ascending."""

    def assess(
        self, cfg: SimConfig, state: State, rows: np.ndarray, level: float, with_exceed: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """((len(rows), M, D) float64 the level-`level` quantile of the largest share of C_d that machine m's
        summed usage takes at steps t .. t + H if env `rows[i]`'s queue head is placed there now (its running jobs
        and the head; observed usage only), (len(rows), M) the chance that it exceeds C_d for some d over those
        steps, or None unless `with_exceed`)."""
        ...


@dataclass(frozen=True)
class MachinePeakPacking(_FollowsFallback):
    """Place where the level-`level` quantile of the machine's summed peak WITH the job stays within capacity
    (`bound`, one forecast per machine, calibrated on the sum), or where the requests fit (the fallback's own
    test), in `mode` (module docstring); the fallback heuristic decides whatever the rule does not. Without a
    bound (the registry's default build) it is the fallback."""

    bound: MachinePeakBound | None = field(default=None, repr=False, compare=False)
    fallback: object | None = field(default=None, repr=False, compare=False)
    level: float = 0.95
    mode: str = "pack"
    name: str = "forecast_machine_peak"
    epsilon: float | None = None
    """Where given, a machine in use is safe when the chance that it exceeds capacity with the job stays at most
    epsilon (the bound at `level` then only orders the safe machines); None: when the bound is within capacity.
    Either way a machine whose requests fit with the job's is safe."""
    cost_scale: float | None = None
    """Where given (instead of `epsilon`), a machine in use is safe when the expected overshoot charge of placing
    the job there, P(exceed) x K_o x (its running jobs + 1), is at most cost_scale x the under-utilisation it
    saves (`packing_gain`): the expected-value rule of the paper's reward, whose threshold on P(exceed) falls
    with the jobs a wrong guess would charge and rises with the waste an empty machine would cost."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"{self.name}: mode must be one of {MODES}, got {self.mode!r}")
        if self.bound is not None:
            level_index(self.bound.levels, self.level, type(self.bound).__name__)
        if self.epsilon is not None and not 0.0 <= self.epsilon < 1.0:
            raise ValueError(f"{self.name}: epsilon must be in [0, 1), got {self.epsilon}")
        if self.cost_scale is not None and not (np.isfinite(self.cost_scale) and self.cost_scale > 0.0):
            raise ValueError(f"{self.name}: cost_scale must be a positive number, got {self.cost_scale}")
        if self.cost_scale is not None and self.epsilon is not None:
            raise ValueError(f"{self.name}: give epsilon or cost_scale, not both")

    @property
    def reads_labels(self) -> bool:
        """Whether the rule may read EC labels: its bound's (`sim.labelling.reads_labels`) or its fallback's."""
        return (self.bound is not None and reads_labels(self.bound)) or reads_labels(self._fallback())

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim.policies import free_by_requests, valid_machines

        base = np.asarray(self._fallback().act(cfg, state, rng), dtype=np.int64)
        if self.bound is None:
            return base
        valid = valid_machines(cfg, state)
        used = machines_used(state)
        head = queue_head(state)
        if self.mode == "deviate":
            rows = deviation_rows(cfg, state, base, valid)
        else:
            rows = np.flatnonzero(head.has_job & (valid & used).any(axis=1))
        if rows.size == 0:
            return base
        # a machine is safe where the bound says so or the requests fit (the fallback's own test: the bound adds
        # machines, it takes none away); an empty one takes the job alone (the mask fits it); the bound is capped
        # at the requests' share, a bound in itself wherever requests are peaks
        cap = np.asarray(cfg.capacity_units, dtype=np.float64)
        request = head.request[rows].astype(np.float64)
        by_requests = ((cap - free_by_requests(cfg, state)[rows] + request[:, None, :]) / cap).max(axis=2)
        by_chance = self.epsilon is not None or self.cost_scale is not None
        bound, exceed = self.bound.assess(cfg, state, rows, self.level, by_chance)
        share = np.minimum(bound.max(axis=2), by_requests)  # (R, M)
        if self.epsilon is not None:
            within = (exceed <= self.epsilon) | (by_requests <= 1.0)
        elif self.cost_scale is not None:
            charge = exceed * cfg.k_overshoot * (jobs_per_machine(state)[rows] + 1)
            within = (charge <= self.cost_scale * packing_gain(cfg, state, rows)) | (by_requests <= 1.0)
        else:
            within = share <= 1.0 + 1e-9
        is_safe = ~used
        tightness = np.zeros(valid.shape)
        is_safe[rows] = ~used[rows] | within
        tightness[rows] = share
        return deviate_or_pack(cfg, state, base, is_safe, tightness, valid, self.mode)


def packing_gain(cfg: SimConfig, state: State, rows: np.ndarray) -> np.ndarray:
    """(len(rows), M) float64 the under-utilisation charge (P_U, K_u > 0) that placing env `rows[i]`'s queue head
    on machine m in use saves against opening an empty machine for it, estimated from what is known now: per step
    sum_d (C_d - r_d)^K_u + U_d^K_u - max(U_d - r_d, 0)^K_u, with r the head's request (its usage is not
    observed yet; a request at or above its usage makes this an underestimate) and U the machine's unused units
    now, over the steps that the head and the machine's jobs still share (the head's duration, capped at the
    machine's last known end: after it the head would be alone either way). 0 on an idle machine and with
    K_u = 0 (no packing pressure). What deviating from an empty machine to m gains; where the fallback would
    instead hold the job, it gains the wait as well, which this leaves out. Measured on Bitbrains (benchmarks/RESULTS.md, "Each
    machine's summed peak"), the realised saving per placement beyond requests is about a third of this: a
    machine opened now fills with the next arrivals."""
    rows = np.asarray(rows, dtype=np.int64)
    k_u = float(cfg.k_underutil)
    if k_u == 0.0 or not rows.size:
        return np.zeros((rows.size, cfg.n_machines))
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    head = queue_head(state)
    request = np.minimum(head.request[rows].astype(np.float64), cap)[:, None, :]  # (R, 1, D)
    unused = np.maximum(cap - current_usage(cfg, state)[rows], 0.0)  # (R, M, D)
    saved = (cap - request) ** k_u + unused**k_u - np.maximum(unused - request, 0.0) ** k_u  # (R, M, D)
    per_step = saved.sum(axis=2)
    left = np.maximum(state.busy_until[rows] - state.t[rows, None], 0)
    shared = np.minimum(head.duration[rows, None], left)
    return np.where(machines_used(state)[rows], per_step * shared, 0.0)


PREDICTORS = ("n_sigma", "max_pct_n_sigma")


@dataclass(frozen=True)
class PeakPredictorPacking(_FollowsFallback):
    """Google's production peak predictors (Bashir et al., EuroSys 2021) as an admission rule: a machine's peak is
    predicted from the summed observed usage of the jobs running on it now over the last `window` steps, as
    mean + n_sigma x std ("n_sigma") or max(percentile, that) ("max_pct_n_sigma"); the head fits where the peak
    plus its request stays within C_d. The fallback heuristic decides where the rule does not, in `mode`
    ("deviate" or "pack", as `RiskAwarePacking`). Durations are not read."""

    predictor: str = "n_sigma"
    n_sigma: float = 3.0
    percentile: float = 99.0
    window: int = 24
    mode: str = "deviate"
    fallback: object | None = field(default=None, repr=False, compare=False)
    name: str = "n_sigma_observed"

    def __post_init__(self) -> None:
        if self.predictor not in PREDICTORS:
            raise ValueError(f"{self.name}: predictor must be one of {PREDICTORS}, got {self.predictor!r}")
        if self.mode not in MODES:
            raise ValueError(f"{self.name}: mode must be one of {MODES}, got {self.mode!r}")

    def predicted_peak(self, cfg: SimConfig, state: State) -> np.ndarray:
        """(B, M, D) predicted peak units of the jobs running on each machine (0 on an idle machine)."""
        bi, ji = np.nonzero(jobs_running(state))
        recent = recent_usage(state.jobs.usage, bi, ji, n_observed(state, bi, ji), self.window)  # job_view's
        n_envs, n_m = state.batch_size, cfg.n_machines
        totals = sum_by_cell(
            np.nan_to_num(recent, nan=0.0), bi * n_m + state.job_machine[bi, ji], n_envs * n_m
        )
        # steps before the first running job's start on that machine are all-zero rows: leave them out
        seen = np.zeros((n_envs * n_m, self.window), dtype=bool)
        np.logical_or.at(seen, bi * n_m + state.job_machine[bi, ji], np.isfinite(recent).all(axis=2))
        masked = np.where(seen[..., None], totals, np.nan)
        with np.errstate(all="ignore"), warnings.catch_warnings(action="ignore", category=RuntimeWarning):
            peak = np.nanmean(masked, axis=1) + self.n_sigma * np.nanstd(masked, axis=1)
            if self.predictor == "max_pct_n_sigma":
                peak = np.maximum(peak, np.nanpercentile(masked, self.percentile, axis=1))
        return np.nan_to_num(peak, nan=0.0).reshape(n_envs, n_m, cfg.n_resources)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim.policies import valid_machines

        base = np.asarray(self._fallback().act(cfg, state, rng), dtype=np.int64)
        cap = np.asarray(cfg.capacity_units, dtype=np.float64)
        total = self.predicted_peak(cfg, state) + queue_head(state).request[:, None, :]
        is_safe = (total <= cap + 1e-9).all(axis=2)
        tightness = (total / cap).max(axis=2)
        return deviate_or_pack(cfg, state, base, is_safe, tightness, valid_machines(cfg, state), self.mode)


# --- fitting to a (source, load) from its training sequences (`sim.tuning.FitContext`) --------------


def fit_hybrid(ctx, use_durations: bool, name: str, forecaster=None, min_observed=None) -> RiskAwarePacking:
    """The hybrid rule: the best request-based heuristic on validation, deviating only to a used machine that is
    safe by observed usage (each running job's observed peak so far, once it has run `min_observed` steps; its
    request before) and, when `use_durations`, known end times. `min_observed` is chosen on validation."""
    candidates = [
        (
            {"mode": "deviate", "use_durations": use_durations, "min_observed": m},
            RiskAwarePacking(
                forecaster=forecaster
                if forecaster is not None
                else PersistenceForecaster(horizon=ctx.horizon()),
                fallback=ctx.best_fallback(),
                risk=RiskConfig(mode="deviate", use_durations=use_durations, min_observed=max(m, 1)),
                name=name,
            ),
        )
        for m in (ctx.tuning.min_observed if min_observed is None else min_observed)
    ]
    return ctx.choose(name, candidates)


def fit_forecast_risk(
    ctx, use_durations: bool, name: str, forecaster=None, min_observed=None
) -> RiskAwarePacking | None:
    """`RiskAwarePacking` on the context's learned forecaster (or `forecaster`): rho calibrated per level on the
    fit sequences (`sim.tuning.fit_rho`), then level x mode chosen on validation. None without a forecaster."""
    from sim.tuning import fit_rho

    forecaster = forecaster if forecaster is not None else ctx.forecaster()
    if forecaster is None:
        return None
    forecaster = with_cache(forecaster)
    fallback = ctx.best_fallback()
    fit_part = ctx.split()[0]
    candidates = []
    levels = [lv for lv in ctx.tuning.levels if any(abs(lv - x) < 1e-9 for x in forecaster.levels)]
    for level in levels:
        rho, inflation, coverage, covered = fit_rho(
            ctx.cfg, fit_part, forecaster, RiskConfig(level=level), ctx.tuning.rhos, fallback, ctx.tuning.seed
        )
        for mode in ctx.tuning.modes:
            for m in ctx.tuning.min_observed if min_observed is None else min_observed:
                risk = RiskConfig(
                    level=level,
                    rho=rho,
                    inflation=inflation,
                    mode=mode,
                    use_durations=use_durations,
                    min_observed=m,
                    extend_to=ctx.horizon(),
                )
                knobs = {
                    "level": level,
                    "rho": rho,
                    "mode": mode,
                    "use_durations": use_durations,
                    "min_observed": m,
                    "inflation": inflation,
                    "sum_coverage_fit": covered,
                    "sum_coverage_fit_per_rho": {f"{r:g}": c for r, c in coverage.items()},
                }
                candidates.append((knobs, RiskAwarePacking(forecaster, fallback, risk, name)))
    return ctx.choose(name, candidates)


def fit_recall_rule(ctx, base: str, name: str, use_durations: bool = True) -> RiskAwarePacking | None:
    """The hybrid (`base` "hybrid") or forecast rule (`base` "forecast") on a forecaster that recalls earlier runs
    of a recurring workload (`sim.forecast.fit_recall`, measured on the fit part of the training sequences); the
    recall measurements join the rule's choices. None when the forecast rule has no learned forecaster. With
    durations unknown a recalled job still ends where its earlier run ended (recall gives 0 from there on)."""
    if base == "hybrid":
        inner = PersistenceForecaster(horizon=ctx.horizon())
    else:
        inner = ctx.forecaster()
        if inner is None:
            return None
    forecaster, measured = fit_recall(inner, ctx.split()[0])
    # one more candidate: trust nothing but recall (every other job at its request until it has lived longer than
    # any job: the fallback heuristic itself where nothing recurs)
    waits = (*ctx.tuning.min_observed, ctx.horizon() + 1)
    if base == "hybrid":
        policy = fit_hybrid(ctx, use_durations, name, forecaster=forecaster, min_observed=waits)
    else:
        policy = fit_forecast_risk(ctx, use_durations, name, forecaster=forecaster, min_observed=waits)
    ctx.choices[name].update(measured)
    return policy


PEAK_RULES = {
    "forecast_peak": {"use_durations": True, "use_labels": True},
    "forecast_peak_nodur": {"use_durations": False, "use_labels": True},
    "forecast_peak_noec": {"use_durations": True, "use_labels": False},
}
"""The registered rules on the remaining-peak table (`fit_peak_rule`'s keywords of each)."""


def peak_rule_inputs(ctx, name: str, levels: tuple[float, ...]):
    """The forecaster the rule `name` (PEAK_RULES) packs on, at every level of `levels` as well:
    `sim.peak_forecast.RemainingPeakQuantiles` over a table fitted on the context's fit part with the rule's
    labels and the remaining-life structure its validation chose (`_peak_table`), at the rule's levels and
    `levels`; recall over it where the rule's measurements use recall. For a learned scheduler whose inputs are
    the base rule's own forecasts. KeyError for a rule not on the table."""
    from sim.peak_forecast import RemainingPeakQuantiles

    keys = PEAK_RULES[name]
    rule_table, measured = _peak_table(ctx, keys["use_labels"], keys["use_durations"])
    wanted = tuple(sorted({*rule_table.levels, *levels}))
    table = _fit_part_table(ctx, keys["use_labels"], rule_table.use_remaining, wanted)
    return with_recall(RemainingPeakQuantiles(table, ctx.horizon()), measured)


def fit_peak_rule(ctx, name: str, use_durations: bool = True, use_labels: bool = True) -> RiskAwarePacking:
    """`RiskAwarePacking` on each job's remaining-peak quantile (`sim.peak_forecast`, fitted on the fit part of the
    training sequences, with or without EC labels, keyed by each job's remaining life where the rule knows end
    times: `use_durations`), recall of recurring workloads over it where the training
    sequences show repeats (`sim.forecast.fit_recall`); the quantile level and the mode chosen on validation,
    where the hybrid's candidates (observed peaks, `fit_hybrid`) compete too: validation may keep the hybrid.
    With `TuningConfig.cross_fit` the table and recall are refitted on the validation part for the swapped fold
    (`FitContext.choose`'s `build`); with `TuningConfig.refit` the kept rule's table and recall are refitted on the
    whole training split once the knobs are chosen (`FitContext.refit_choice`)."""
    build = partial(_peak_candidates, name=name, use_durations=use_durations, use_labels=use_labels)
    policy = ctx.choose(name, build(ctx), build=build)
    refitted, fitted_in = ctx.refit_choice(name, build)
    policy = policy if refitted is None else refitted
    table, measured = _peak_table(fitted_in, use_labels, use_durations)
    structure = ctx.structure_choice(("peak_table", use_labels, use_durations), dict)
    ctx.choices[name].update(
        {
            **measured,
            "refitted_on_all_training": refitted is not None,
            "peak_table_cases": table.n_cases,
            "peak_table_share_own_cell": table.share_own_cell,
            "peak_table_remaining_life": table.use_remaining,
            "peak_table_at_peak_key": table.use_at_peak,
            "peak_table_validation_pinball": {
                ("remaining_life" if k else "without"): v
                for k, v in structure.get("validation_pinball", {}).items()
            },
        }
    )
    return policy


def _peak_table(ctx, use_labels: bool, know_ends: bool):
    """(the remaining-peak quantile table, the recall measurements) of the context's fit part (cached). Where the
    rule knows end times (`know_ends`) the table keyed by each job's remaining life competes with the one without
    it, and the one with the lower pinball loss on the validation part is kept (`structure_choice`: chosen once,
    and carried to `FitContext.refitted`, whose validation part is inside its fit part)."""
    from sim.peak_forecast import remaining_key_choice

    fit_part, validation = ctx.split()
    table = partial(_fit_part_table, ctx, use_labels)

    def choose_structure() -> dict:
        if not know_ends:
            return {"use_remaining": False}
        return remaining_key_choice(table, validation, ctx.labels_by_age(validation) if use_labels else None)

    structure = ctx.structure_choice(("peak_table", use_labels, know_ends), choose_structure)
    return table(structure["use_remaining"]), ctx.cached("recall_measured", lambda: measure_recall(fit_part))


def _fit_part_table(ctx, use_labels: bool, use_remaining: bool, levels: tuple[float, ...] | None = None):
    """The remaining-peak quantile table fitted on the context's fit part (cached), on the labels the context
    serves where `use_labels`, keyed by remaining life where `use_remaining` and by being at the peak now where
    `TuningConfig.peak_at_peak_key`, at `levels` (None: the rule's, 0.5 and the tuning grid's peak levels)."""
    from sim.peak_forecast import fit_peak_quantiles

    fit_part = ctx.split()[0]
    rule_levels = tuple(sorted({0.5, *ctx.tuning.peak_levels}))
    other = () if levels is None or tuple(levels) == rule_levels else (tuple(levels),)
    return ctx.cached(
        ("peak_table", use_labels, use_remaining, *other),
        lambda: fit_peak_quantiles(
            fit_part,
            ctx.cfg,
            levels=other[0] if other else rule_levels,
            use_labels=use_labels,
            labels_by_age=ctx.labels_by_age(fit_part) if use_labels else None,
            use_remaining=use_remaining,
            use_at_peak=ctx.tuning.peak_at_peak_key,
        ),
    )


def _peak_candidates(ctx, name: str, use_durations: bool, use_labels: bool) -> list[tuple[dict, object]]:
    """`fit_peak_rule`'s (knobs, policy) candidates fitted on the context's fit part."""
    from sim.peak_forecast import RemainingPeakQuantiles
    from sim.tuning import fit_rho

    table, measured = _peak_table(ctx, use_labels, use_durations)
    fallback = ctx.best_fallback()
    candidates = []
    for level in ctx.tuning.peak_levels:
        forecaster = with_recall(table.forecaster(level, ctx.horizon()), measured)
        joint = None  # the co-peaking calibration of the level (`TuningConfig.peak_calibrated`)
        if ctx.tuning.peak_calibrated:
            joint = with_recall(RemainingPeakQuantiles(table, ctx.horizon()), measured)
            rho, kappa = ctx.cached(
                ("peak_co_peaking", use_labels, use_durations, table.use_remaining, level),
                lambda joint=joint, level=level: fit_rho(
                    ctx.cfg,
                    ctx.split()[0],
                    joint,
                    RiskConfig(level=level),
                    ctx.tuning.rhos,
                    fallback,
                    ctx.tuning.seed,
                )[:2],
            )
        for mode in ctx.tuning.peak_modes:
            risk = RiskConfig(level=level, mode=mode, use_durations=use_durations)
            knobs = {
                "forecaster": "peak_quantile",
                "level": level,
                "mode": mode,
                "use_durations": use_durations,
                "use_labels": use_labels,
            }
            candidates.append((knobs, RiskAwarePacking(forecaster, fallback, risk, name)))
            if joint is not None and (rho, kappa) != (1.0, 1.0):
                risk = replace(risk, rho=rho, inflation=kappa)
                knobs = {**knobs, "forecaster": "peak_quantiles_joint", "rho": rho, "inflation": kappa}
                candidates.append((knobs, RiskAwarePacking(joint, fallback, risk, name)))
    # the hybrid's own candidates (each job at its observed peak, recall over it where recall is on): on workloads
    # whose remaining peaks the training ones do not predict, validation keeps the rule at the hybrid
    persistence = with_recall(PersistenceForecaster(horizon=ctx.horizon()), measured)
    for m in ctx.tuning.min_observed:
        risk = RiskConfig(mode="deviate", use_durations=use_durations, min_observed=max(m, 1))
        knobs = {
            "forecaster": "persistence",
            "mode": "deviate",
            "use_durations": use_durations,
            "min_observed": m,
        }
        candidates.append((knobs, RiskAwarePacking(persistence, fallback, risk, name)))
    return candidates


def fit_forecast_truth(ctx, name: str, known: str | None = None) -> RiskAwarePacking:
    """ORACLE: the forecast rule on the true future usage (`sim.forecast.ExactForecaster`), the mode chosen on
    validation among every mode (`MODES`: the forecast rules' modes, whatever the tuning grid): the information
    gap of the forecast rule. `known` ("running" or "arriving"): the true future of that part of the jobs only,
    the others at their requests (`sim.forecast.PartialTruthForecaster`: that part's share of the gap)."""
    from sim.forecast import ExactForecaster, PartialTruthForecaster

    horizon = ctx.horizon()
    forecaster = (
        ExactForecaster(horizon=horizon)
        if known is None
        else PartialTruthForecaster(horizon=horizon, known=known)
    )
    fallback = ctx.best_fallback()
    candidates = [
        (
            {"mode": mode},
            RiskAwarePacking(forecaster, fallback, RiskConfig(level=0.95, rho=1.0, mode=mode), name),
        )
        for mode in MODES
    ]
    return ctx.choose(name, candidates)


def fitted_once(ctx, key, name: str, fit) -> tuple[object, dict | None]:
    """(`fit()`, the choices it recorded under `name`), computed once per context under `key` for the rules built
    on a registered rule; the registered rule's own entry `ctx.choices[name]` is left as it was."""

    def fitted():
        before = ctx.choices.get(name)
        rule = fit()
        choice = copy.deepcopy(ctx.choices.get(name))
        if before is None:
            ctx.choices.pop(name, None)
        else:
            ctx.choices[name] = before
        return rule, choice

    return ctx.cached(key, fitted)


def _peak_rule_once(ctx) -> tuple[RiskAwarePacking | None, dict | None]:
    """(`forecast_peak` as validation fits it, its choices), fitted once per context for the rules built on it
    (`fit_peak_truth`, `fit_peak_adaptive`, `sim.replay_select`); `forecast_peak`'s own entry in `ctx.choices` is
    left as it was (`fitted_once`)."""
    return fitted_once(
        ctx,
        ("forecast_peak_truth", "rule"),
        "forecast_peak",
        lambda: fit_peak_rule(ctx, "forecast_peak", **PEAK_RULES["forecast_peak"]),
    )


def peak_forecasters(rule: RiskAwarePacking) -> tuple[object, object]:
    """(outer, inner) of a fitted peak rule's forecaster: the forecaster without its cache, and the one a
    `RecallOverlay` lays recall over (the same where there is no recall)."""
    outer = uncached(rule.forecaster)
    return outer, (outer.inner if isinstance(outer, RecallOverlay) else outer)


def peak_rule_at_level(rule: RiskAwarePacking, table, level: float, name: str) -> RiskAwarePacking:
    """`rule` (`forecast_peak` as fitted, on a `PeakQuantileForecaster`) packing at `level` of `table` (its own
    table or one refitted at more levels), with recall over it where the rule has recall."""
    outer, inner = peak_forecasters(rule)
    at_level = table.forecaster(level, inner.horizon)
    if isinstance(outer, RecallOverlay):
        at_level = RecallOverlay(at_level, outer.reliability)
    return replace(rule, forecaster=at_level, risk=replace(rule.risk, level=level), name=name)


def adapted_levels_table(ctx, choice: dict, table):
    """`forecast_peak`'s remaining-peak table at the finer grid `ADAPTED_LEVELS` as well as its own levels, refitted
    on the fit part (cached), for the rules that move its level; as it is where validation refitted it on every
    training sequence (`choice["refitted_on_all_training"]`)."""
    if choice.get("refitted_on_all_training"):
        return table
    wanted = tuple(sorted({*table.levels, *ADAPTED_LEVELS}))
    return _fit_part_table(ctx, table.use_labels, table.use_remaining, wanted)


def fit_peak_adaptive(
    ctx,
    name: str,
    prior_events: float = 10.0,
    floor: float | None = None,
    amount: bool = False,
    exceed: bool = False,
    raise_only: bool = False,
    overshoot: bool = False,
    overshoot_budget_pct: float | None = None,
) -> RiskAwarePacking | None:
    """`forecast_peak` as validation fits it (fallback, level q, mode, table, recall), with each env's level
    following its episode's rate of rising jobs (`sim.rise_shift`: the training fit part's rate, a Gamma prior
    worth `prior_events` rises, the level 1 - (1 - q) / ratio rounded up to `ADAPTED_LEVELS`, never below
    `floor`: None for `sim.rise_shift.MIN_LEVEL`; 0 lets a quiet env's arriving job be left to the admission mask,
    `sim.rise_shift.MASK_FLOOR`). Where validation kept the hybrid for `forecast_peak` (no level to adapt) it is
    that rule under this name; None where `forecast_peak` cannot be fitted or keeps a forecaster with a value per
    level. With `amount`, the ratio is also scaled by how far the episode's risen jobs rise against the fit part's
    (`sim.rise_shift.RiseAmount`, a prior worth `prior_events` risen jobs). With `exceed`, the ratio is the
    episode's rate of exceeding the jobs' arrival forecasts over the fit part's (`sim.rise_shift.fit_exceed_rate`)
    instead; with `overshoot`, the episode's rate of jobs charged an overshoot over the rule's on the validation
    sequences (`sim.rise_shift.fit_overshoot_rate`, scaled to `overshoot_budget_pct` where given). With
    `raise_only`, an env's ratio is never below 1 (never tighter than `forecast_peak`). ValueError naming the rule
    for a floor neither 0 nor within `ADAPTED_LEVELS`."""
    from sim.peak_forecast import PeakQuantileForecaster
    from sim.rise_shift import (
        MIN_LEVEL,
        ShiftAdaptedPeakForecaster,
        fit_exceed_rate,
        fit_overshoot_rate,
        fit_rise_amount,
        fit_rise_rate,
        reads_rise_rate,
    )

    floor = MIN_LEVEL if floor is None else float(floor)
    if not (floor == 0.0 or ADAPTED_LEVELS[0] <= floor <= ADAPTED_LEVELS[-1]):
        raise ValueError(f"{name}: floor {floor} is neither 0 nor within the adapted levels {ADAPTED_LEVELS}")
    rule, choice = _peak_rule_once(ctx)
    outer, inner = (
        (None, None) if rule is None else peak_forecasters(rule)
    )  # recall over it: kept as it is below
    if rule is None or not is_point_forecaster(inner):
        warnings.warn(
            f"{name}: forecast_peak kept no point forecaster at {ctx.where}: not fitted", stacklevel=2
        )
        return None
    if not isinstance(inner, PeakQuantileForecaster):  # the hybrid's observed peaks: nothing to adapt
        ctx.choices[name] = {**copy.deepcopy(choice), "rise_adapted": False}
        return replace(rule, name=name)

    def as_fitted(err: ValueError) -> RiskAwarePacking:  # no rate to shift from: the rule as fitted, and why
        warnings.warn(f"{name} at {ctx.where}: {err}; kept at forecast_peak's level", stacklevel=3)
        ctx.choices[name] = {**copy.deepcopy(choice), "rise_adapted": False, "rise_not_adapted_why": str(err)}
        return replace(rule, name=name)

    fit_part = ctx.split()[0]
    try:
        rate = ctx.cached(("rise_rate", prior_events), lambda: fit_rise_rate(fit_part, prior_events))
    except ValueError as err:  # no training job ever rises
        if reads_rise_rate(exceed, overshoot, raise_only, floor):
            return as_fitted(err)
        rate = None
    table = adapted_levels_table(ctx, choice, inner.table)
    rise_amount = None
    if amount:
        rise_amount = fit_rise_amount(
            fit_part,
            table,
            rule.risk.level,
            ctx.labels_by_age(fit_part) if table.use_labels else None,
            prior_jobs=prior_events,
        )
    exceed_rate = None
    if exceed:
        try:
            exceed_rate = fit_exceed_rate(fit_part, table, rule.risk.level, prior_events)
        except ValueError as err:  # no training job exceeds its arrival forecast
            return as_fitted(err)
    overshoot_rate = None
    if overshoot:  # the rule as validation fitted it (at its level), rolled on the validation sequences
        overshoot_rate = ctx.cached(
            ("overshoot_rate", rule.name, prior_events, overshoot_budget_pct),
            lambda: fit_overshoot_rate(
                ctx.cfg,
                rule,
                ctx.split()[1],
                ctx.tuning.seed,
                prior_events=prior_events,
                budget_pct=overshoot_budget_pct,
            ),
        )
    adapted = ShiftAdaptedPeakForecaster(
        table,
        rate,
        level=rule.risk.level,
        horizon=inner.horizon,
        floor=floor,
        amount=rise_amount,
        exceed=exceed_rate,
        raise_only=raise_only,
        overshoot=overshoot_rate,
    )
    ctx.choices[name] = {
        **copy.deepcopy(choice),
        "rise_adapted": True,
        "rise_rate_train": None if rate is None else rate.hazard,
        "rise_prior_events": prior_events,
        "rise_floor": floor,
        "adapted_levels": list(table.levels),
        "rise_raise_only": raise_only,
    }
    if overshoot_rate is not None:
        ctx.choices[name]["overshoot_rate_validation"] = overshoot_rate.hazard
        ctx.choices[name]["overshoot_events_validation"] = overshoot_rate.events
    if exceed_rate is not None:
        ctx.choices[name]["exceed_rate_train"] = exceed_rate.hazard
    if rise_amount is not None:
        ctx.choices[name]["rise_amount_train"] = rise_amount.mean_rise
        ctx.choices[name]["rise_tail_factors"] = dict(
            zip(rise_amount.scales, rise_amount.tail_factors, strict=True)
        )
    if isinstance(outer, RecallOverlay):
        adapted = RecallOverlay(adapted, outer.reliability)
    return replace(rule, forecaster=adapted, name=name)


OVERSHOOT_GUARD_BUDGET_PCT = 0.25
"""`forecast_peak_overshoot_budget`'s budget (overshoot %): half the bar's allowance over Tetris (0.5 point)."""

ADAPTED_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99)
"""The levels `fit_peak_adaptive`'s table has: the grid an env's adapted level is rounded up to (the levels
below its floor are never used; the levels above 0.5 decide alone at the default floor)."""


def fit_peak_truth(ctx, name: str, known: str) -> RiskAwarePacking | None:
    """ORACLE: `forecast_peak` as validation fits it, with the true future in place of its forecast of one part
    of the jobs (`sim.forecast.TruthOverForecaster`, `known` "running" or "arriving"); every other choice (level,
    mode, fallback, the young jobs it takes at their request) is the rule's own. The rule is fitted once per
    context for both parts, and `forecast_peak`'s own entry in `ctx.choices` is left as it was. None where the
    rule cannot be fitted or keeps a forecaster with a value per level (`TuningConfig.peak_calibrated`'s
    candidate), which this split does not cover."""
    from sim.forecast import TruthOverForecaster

    rule, choice = _peak_rule_once(ctx)
    inner = None if rule is None else uncached(rule.forecaster)
    if inner is None or not is_point_forecaster(inner):
        warnings.warn(
            f"{name}: forecast_peak kept no point forecaster at {ctx.where}: not fitted", stacklevel=2
        )
        return None
    ctx.choices[name] = {**copy.deepcopy(choice), "truth_for": known}
    return replace(rule, forecaster=TruthOverForecaster(inner, known=known), name=name)


def fit_peak_predictor(ctx, predictor: str, name: str) -> PeakPredictorPacking:
    """Google's peak predictor with N (and the mode) chosen on validation, on the best request-based fallback."""
    fallback = ctx.best_fallback()
    candidates = [
        (
            {"predictor": predictor, "n_sigma": n, "mode": mode},
            PeakPredictorPacking(predictor=predictor, n_sigma=n, mode=mode, fallback=fallback, name=name),
        )
        for n in ctx.tuning.n_sigmas
        for mode in ctx.tuning.modes
    ]
    return ctx.choose(name, candidates)
