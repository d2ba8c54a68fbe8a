"""How often this episode's jobs rise above their first step, against the training jobs: an online signal of
workload shift, and the remaining-peak rule whose quantile level follows it.

Why: the simulator admits a job on its first step's usage (`SimConfig.placement_check` "first_step"), so a
policy that packs on current usage (First-Fit on the mask) overshoots only when placed jobs later rise above that
step. `forecast_peak` packs at a level q of each job's remaining-peak quantile fitted on the training jobs, and so
assumes the training jobs' rate of rising. On the shared trace's 84 Bitbrains VMs that rate differs from split to
split: a job-step's chance of a first rise is 0.004-0.008 on the training splits of seeds 15-23, while the test
splits run at 0.13-1.9 times their own training rate (0.13 at seed 18, 0.33-0.41 at seeds 17, 20 and 21, 1.89 at
seed 23; 2026-12-05, `benchmarks/rule_generalisation.py`). Those quiet test sets are the ones where First-Fit beats
every rule fitted on the training jobs. The rate is observable online: every job placed so far in the episode
shows, step by step, whether it has risen yet.

The estimate (observed usage only): a job's first rise is the first step k >= 1 of its life at which its usage
exceeds its step-0 usage in some resource. A job with n observed steps has been at risk for min(first rise, n - 1)
steps, and has risen by now when its first rise is at most n - 1. The training rate h (`fit_rise_rate`) pools
events and exposure over the fit sequences' whole jobs; an episode's rate pools them over its jobs placed so far
(`episode_counts`). The ratio is the posterior mean of a Gamma prior worth `prior_events` first rises at the
training rate: (events + a) / (a + h x exposure), 1 before anything is observed, and the episode's own ratio once
its events outnumber a (`rate_ratio`). A rate that holds the whole episode keeps its mean; computed on a training
split's own sequences the ratio is 0.6-2.2 per sequence.

The level (`adapted_level`): if a shift scales every cell's chance of a rise by the ratio rho and leaves what a
rising job does unchanged (label shift in the rise), the chance that a job's remaining peak exceeds x (x at least
its peak so far) is rho x the training chance, so the training quantile at level 1 - (1 - q) / rho has tail 1 - q
under the shifted rate. The level used is the smallest level of the table at or above it (the cautious side),
within [the floor (0.5 by default, the median), the table's top]: rho < 1 packs tighter than q, rho > 1 more
cautiously.

At or below level 0 (rho at most 1 - q) the same argument says the level-q remaining peak of a job that has not
risen yet is its usage without a rise: for the arriving job, its first step, which the simulator's admission
mask checks on every machine. With `floor` 0 (`MASK_FLOOR`) such an env's arriving job is forecast at 0, leaving it
to the mask as First-Fit does (nothing of its usage is read: the mask is the environment's), and its running jobs
at the table's lowest level (`at_mask`). The default floor, 0.5, never goes there.

The amount (`RiseAmount`, optional: `forecast_peak_adaptive_amount`): a test set can also shift in how far its
jobs rise once they do, at the same rate. At 80 % seed 39 of the 84 VMs the test jobs rose 0.387 units on average
against the training's 0.253, at a rate ratio of 0.89-0.91, and `forecast_peak` overshot 0.834 % (2026-12-06,
`benchmarks/rule_generalisation.py`). Online, each env's jobs that have risen so far show their rise so far (their
observed peak above their first step, summed over resources, `rise_so_far`); its sum over the training mean rise so
far of a job risen by the same age is the episode's scale s of the rises, shrunk to 1 by a prior worth
`prior_jobs` risen jobs of the training mean rise. What a scale does to the rule's tail is measured on the training
cases at fit time (`fit_rise_amount`): the count of cases whose remaining peak, with its rise above its first step
scaled by s and rounded to whole units, exceeds the rule's level-q quantile, over the same count at s = 1. A job
that rises exceeds by its rise, so a shift in the rate and one in the amount multiply: the ratio the level follows
is the rate ratio times that tail factor at the episode's s (`ShiftAdaptedPeakForecaster.ratio`).

The exceedances (`fit_exceed_rate`, optional: `forecast_peak_adaptive_exceed`): the rate and the amount are two
causes of what the rule needs, its forecasts' tail. The direct signal is that tail: how often the episode's jobs
have exceeded their arrival forecast (the level-q whole-life peak quantile from the request and, where the table
uses it, the duration; the label-free cell), per observed job-step, against the training jobs' rate of the same,
with the same Gamma prior (worth 10 exceedances). Its ratio replaces the rise rate's in the level. It was built after
the amount's scaled-rise model overstated the tail at 80 % seed 61 (test jobs rising 1.6 times as far, by the
episode's scale, while `forecast_peak` at its fixed level overshot only 0.113 %: the bigger rises came with
requests whose quantiles already held them).

The guard (`raise_only`, `forecast_peak_exceed_guard`): every signal above, moved down, packed tighter than the
fitted level and overshot where `forecast_peak` did not. At 80 % seed 57 (test jobs rising half as often as the
training ones) the rate-adapted rule overshot 0.866 %, the amount's 0.821 % and the exceedances' 0.817 % (1.082 %
on its validation sequences), against `forecast_peak`'s 0.226 %: the level was fitted on validation for the
machines' joint outcome, and a lower level moves every job's forecast at once. With the guard the ratio is never
below 1: the rule is `forecast_peak` until its episode's jobs exceed their forecasts more often than the training
jobs did, and more cautious after. With the `MASK_FLOOR` floor (`forecast_peak_exceed_guard_mask`) it has one way
down: an env whose rise rate ratio is at most 1 - q (jobs rising so seldom that the level-q remaining peak of a job
that has not risen is its usage without a rise) leaves its arriving job to the admission mask, as `MASK_FLOOR`
does (`rows_and_mask`). That is the regime of the quiet test sets where First-Fit wins (80 % seed 66, ratio about
0.07), not that of seed 57 (0.41).

The overshoot guard (`fit_overshoot_rate`, `forecast_peak_overshoot_guard`): the exceedance guard paid where test
jobs exceeded their arrival forecasts more often without any more overshoot (80 % seeds 54 and 61: -0.600 and
-0.227 against `forecast_peak`, whose overshoot there was 0.110 and 0.113 %). What the bar bounds is the overshoot
itself, and the episode sees it as it happens: the jobs charged an overshoot so far (`State.has_overshot`, closed
steps), per observed job-step, against the same rate of the rule at its fitted level on its validation sequences,
with the same Gamma prior (worth 10 overshoots). With `raise_only` the level rises by the same formula once the
episode overshoots more often than validation did, and never falls. Against validation's own rate the guard paid
for test sets that overshot a little more than validation, well within the bar (80 % seed 54: -0.846); with a
budget (`forecast_peak_overshoot_budget`, 0.25 %, half the bar's allowance over Tetris) the reference rate is the
one the rule's jobs would be charged at were it to overshoot by the budget (validation's rate scaled by the budget
over validation's overshoot %, where that is lower), so the level moves only for an episode heading past it.

`ShiftAdaptedPeakForecaster` serves each env's adapted level of the remaining-peak table as a flat point forecast
(`sim.peak_forecast.PeakQuantileForecaster` at a level per env). Its value for a job depends on the episode's
other jobs, so it is never cached by (job, observed steps) (`sim.forecast.with_cache` leaves point forecasters
uncached). The compiled decision kernel (`sim.compiled_decision.risk_act`, and the placer's `decide` for an
advisor of this form) reads each env's table row from `adapted_level`, as `flat` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.config import SimConfig
from sim.core import State
from sim.forecast import levels_of, n_observed, spread_flat
from sim.jobs import JobBatch
from sim.peak_forecast import PeakQuantileTable, RemainingPeakQuantiles

NEVER = np.iinfo(np.int64).max // 4
"""First-rise step of a job that never rises within its life."""
MIN_LEVEL = 0.5
"""The lowest level the adapted rule packs at by default (the median remaining peak): `adapted_level`'s `floor`."""
MASK_FLOOR = 0.0
"""The floor that lets a quiet env's arriving job be left to the admission mask (module docstring, `at_mask`)."""


def first_rise_steps(jobs: JobBatch) -> np.ndarray:
    """(B, J) int64 the first step k >= 1 of each job's life at which its usage exceeds its step-0 usage in some
    resource; `NEVER` where it never does within its duration (and for padding rows). Computed from the whole
    usage once per batch and kept with it (`JobBatch.rider`: a queue reordering moves it with its jobs); readers
    reveal it only up to each job's observed steps (`episode_counts`), so nothing of the future leaks."""

    def make() -> np.ndarray:
        usage = jobs.usage
        alive = np.arange(usage.shape[2])[None, None, :] < jobs.duration[..., None]
        up = (usage > usage[:, :, :1, :]).any(axis=3) & alive
        up[:, :, 0] = False
        return np.where(up.any(axis=2), up.argmax(axis=2), NEVER).astype(np.int64)

    return jobs.rider("first_rise_steps", make)


@dataclass(frozen=True)
class RiseRate:
    """The training jobs' rate of first rises per job-step at risk, and the prior an episode's ratio starts from."""

    hazard: float
    """First rises per job-step at risk over the fit sequences' jobs."""
    events: int
    """Training jobs that rose (the numerator)."""
    exposure: int
    """Training job-steps at risk (the denominator)."""
    prior_events: float = 10.0
    """Weight of the prior (ratio 1) in first rises: an episode's ratio moves halfway to its own once it has shown
    this many."""

    def __post_init__(self) -> None:
        if not (np.isfinite(self.hazard) and self.hazard > 0):
            raise ValueError(
                f"RiseRate: the training jobs' rise rate must be > 0, got {self.hazard} ({self.events} rises in "
                f"{self.exposure} job-steps): a training split whose jobs never rise gives no rate to shift from"
            )
        if not self.prior_events > 0:
            raise ValueError(f"RiseRate.prior_events must be > 0, got {self.prior_events}")

    def ratio(self, events: np.ndarray, exposure: np.ndarray) -> np.ndarray:
        """(B,) the posterior mean of each env's rate over this one from its (B,) `events` in (B,) `exposure`
        (module docstring: a Gamma prior worth `prior_events` events at this rate; 1 before anything is seen)."""
        return (events + self.prior_events) / (self.prior_events + self.hazard * exposure)


def fit_rise_rate(jobs: JobBatch, prior_events: float = 10.0) -> RiseRate:
    """The `RiseRate` of every real job of `jobs` (training sequences) over its whole life. ValueError naming the
    batch when it has no job or its jobs never rise."""
    real = jobs.is_real
    if not real.any():
        raise ValueError("fit_rise_rate: the training batch holds no job")
    first = first_rise_steps(jobs)
    events = int((real & (first < jobs.duration)).sum())
    exposure = int(np.where(real, np.minimum(first, np.maximum(jobs.duration - 1, 0)), 0).sum())
    hazard = events / exposure if exposure else float("nan")
    return RiseRate(hazard=hazard, events=events, exposure=exposure, prior_events=prior_events)


def observed_steps(state: State) -> np.ndarray:
    """(B, J) int64 each job's observed steps now (`sim.forecast.n_observed`; 0 for a job not placed yet)."""
    n_envs, n_jobs = state.job_machine.shape
    env = np.repeat(np.arange(n_envs), n_jobs)
    job = np.tile(np.arange(n_jobs), n_envs)
    return n_observed(state, env, job).reshape(n_envs, n_jobs)


def episode_counts(state: State, n_obs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """((B,) first rises, (B,) job-steps at risk) over each env's jobs placed so far (finished ones included),
    from their observed steps only (`n_obs`: `observed_steps`, read here when None)."""
    n_obs = observed_steps(state) if n_obs is None else n_obs
    first = first_rise_steps(state.jobs)
    seen = np.maximum(n_obs - 1, 0)
    events = ((first <= seen) & (n_obs > 0)).sum(axis=1)
    exposure = np.minimum(first, seen).sum(axis=1)
    return events, exposure


def rate_ratio(rate: RiseRate, state: State, n_obs: np.ndarray | None = None) -> np.ndarray:
    """(B,) each env's posterior mean of its rise rate over the training rate (module docstring)."""
    return rate.ratio(*episode_counts(state, n_obs))


AMOUNT_SCALES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
"""The scales of the rises at which `fit_rise_amount` measures the training tail (interpolated between, held at
the ends)."""


def rise_so_far(jobs: JobBatch) -> np.ndarray:
    """(B, J, T + 1) float32: index n is how far each job's peak over its first n steps lies above its step-0 usage,
    summed over resources (0 for n <= 1 and for a job that has not risen). Kept with the batch (`JobBatch.rider`);
    readers take it at each job's observed steps only (`RiseAmount.scale`)."""

    def make() -> np.ndarray:
        usage = jobs.usage
        alive = np.arange(usage.shape[2])[None, None, :, None] < jobs.duration[..., None, None]
        u = np.where(alive, usage, 0).astype(np.float32)
        rise = np.maximum(np.maximum.accumulate(u, axis=2) - u[:, :, :1, :], 0.0).sum(axis=3)
        return np.concatenate([np.zeros((*rise.shape[:2], 1), dtype=np.float32), rise], axis=2)

    return jobs.rider("rise_so_far", make)


@dataclass(frozen=True)
class RiseAmount:
    """How far the training jobs rise once they do, and what a scaled rise does to the rule's tail: the second
    online signal of a shift (module docstring, "The amount")."""

    expected: tuple[float, ...]
    """Index n (observed steps): the training mean of `rise_so_far` at n over the jobs that have risen within their
    first n steps (n >= 2; carried forward past the last n with such a job)."""
    mean_rise: float
    """The training mean of a risen job's whole-life rise: the prior's unit."""
    tail_factors: tuple[float, ...]
    """At each of `scales`: the count of the training cases whose remaining peak, with its rise above the first
    step scaled (and rounded to whole units), exceeds the rule's level-`level` quantile, over that count unscaled
    (each plus 1)."""
    level: float
    scales: tuple[float, ...] = AMOUNT_SCALES
    prior_jobs: float = 10.0
    """The prior's weight (scale 1) in risen jobs of the training mean rise."""

    def __post_init__(self) -> None:
        if not (np.isfinite(self.mean_rise) and self.mean_rise > 0):
            raise ValueError(f"RiseAmount: the training jobs' mean rise must be > 0, got {self.mean_rise}")
        if not self.prior_jobs > 0:
            raise ValueError(f"RiseAmount.prior_jobs must be > 0, got {self.prior_jobs}")
        if len(self.tail_factors) != len(self.scales) or len(self.expected) < 2:
            raise ValueError(
                f"RiseAmount: {len(self.tail_factors)} tail factors for {len(self.scales)} scales, "
                f"{len(self.expected)} expected rises (at least 2)"
            )

    def scale(self, state: State, n_obs: np.ndarray | None = None) -> np.ndarray:
        """(B,) each env's observed-over-expected rise of its jobs risen so far, shrunk to 1 by the prior."""
        n_obs = observed_steps(state) if n_obs is None else n_obs
        risen = (n_obs > 0) & (first_rise_steps(state.jobs) <= n_obs - 1)
        rise = np.take_along_axis(rise_so_far(state.jobs), n_obs[..., None], axis=2)[..., 0]
        expected = np.asarray(self.expected)[np.minimum(n_obs, len(self.expected) - 1)]
        k = self.prior_jobs * self.mean_rise
        return (np.where(risen, rise, 0.0).sum(axis=1) + k) / (np.where(risen, expected, 0.0).sum(axis=1) + k)

    def tail_factor(self, scale: np.ndarray) -> np.ndarray:
        """(B,) the training tail at each scale over the tail at scale 1 (interpolated on `scales`)."""
        return np.interp(np.asarray(scale, dtype=np.float64), self.scales, self.tail_factors)


def fit_rise_amount(
    jobs: JobBatch,
    table: PeakQuantileTable,
    level: float,
    labels_by_age: np.ndarray | None = None,
    prior_jobs: float = 10.0,
) -> RiseAmount:
    """The `RiseAmount` of the training sequences `jobs` (the fit part `table` was fitted on; `labels_by_age` the
    labels it was keyed by), at the rule's `level`. ValueError naming the batch when none of its jobs rises."""
    from sim.peak_forecast import _level_index, peak_cases

    real = jobs.is_real & (jobs.duration > 0)
    first = first_rise_steps(jobs)
    rise = rise_so_far(jobs)
    ever = real & (first < jobs.duration)
    if not ever.any():
        raise ValueError("fit_rise_amount: no job of the training batch rises above its first step")
    mean_rise = float(
        np.take_along_axis(rise, jobs.duration[..., None].astype(np.int64), axis=2)[..., 0][ever].mean()
    )
    expected = np.zeros(rise.shape[2])
    last = mean_rise
    for n in range(2, rise.shape[2]):
        risen = real & (jobs.duration >= n) & (first <= n - 1)
        last = float(rise[..., n][risen].mean()) if risen.any() else last
        expected[n] = last
    cases = peak_cases(jobs, labels_by_age if table.use_labels else None)
    quantile = table.case_quantiles(cases)[_level_index(table.levels, level)]
    excess = (cases["target"] - cases["first"]).astype(np.float64)
    up, down = np.maximum(excess, 0.0), np.minimum(excess, 0.0)
    # a scaled rise in whole units (half up), as usage is: a tie at the quantile does not tip over at scale 1.01
    exceed = [int((cases["first"] + np.floor(s * up + 0.5) + down > quantile).sum()) for s in AMOUNT_SCALES]
    at_one = exceed[AMOUNT_SCALES.index(1.0)]
    return RiseAmount(
        expected=tuple(float(e) for e in expected),
        mean_rise=mean_rise,
        tail_factors=tuple((e + 1) / (at_one + 1) for e in exceed),
        level=float(level),
        prior_jobs=prior_jobs,
    )


def table_key(table: PeakQuantileTable) -> int:
    """A fingerprint of a table's values (what a per-batch cache of forecasts from it is keyed by)."""
    return hash(
        (table.values.shape, table.values.tobytes(), table.levels, table.use_remaining, table.use_at_peak)
    )


def arrival_exceed_steps(
    jobs: JobBatch, table: PeakQuantileTable, level: float, key: int | None = None
) -> np.ndarray:
    """(B, J) int64 the first step k >= 0 of each job's life at which its usage exceeds, in some resource, its
    arrival forecast: the level-`level` quantile of its whole-life peak from its request (and its duration where
    the table is keyed by remaining life), without its label (the table's label-free cell); `NEVER` where it never
    does (and for padding rows). Kept with the batch per (table, level) (`key`: the table's `table_key`, computed
    here when None); readers reveal it only up to each job's observed steps (`exceed_counts`)."""

    def make() -> np.ndarray:
        n = jobs.duration.size  # every (sequence, job) slot, padding included
        request = jobs.request.reshape(n, -1).astype(np.int64)
        forecast = table.lookup(
            level,
            request,
            np.full(request.shape, np.nan),
            np.zeros(n, dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
            jobs.duration.reshape(n).astype(np.int64) if table.use_remaining else None,
            np.zeros(request.shape, dtype=bool) if table.use_at_peak else None,
        ).reshape(*jobs.duration.shape, -1)  # (B, J, D)
        alive = np.arange(jobs.usage.shape[2])[None, None, :] < jobs.duration[..., None]
        over = (jobs.usage > forecast[:, :, None, :]).any(axis=3) & alive
        return np.where(over.any(axis=2), over.argmax(axis=2), NEVER).astype(np.int64)

    key = table_key(table) if key is None else key
    return jobs.rider(("arrival_exceed_steps", key, float(level)), make)


def exceed_counts(
    state: State,
    table: PeakQuantileTable,
    level: float,
    n_obs: np.ndarray | None = None,
    key: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """((B,) jobs that have exceeded their arrival forecast, (B,) observed job-steps up to and including each
    first exceedance) over each env's jobs placed so far, from their observed steps only."""
    n_obs = observed_steps(state) if n_obs is None else n_obs
    first = arrival_exceed_steps(state.jobs, table, level, key)
    events = ((first <= n_obs - 1) & (n_obs > 0)).sum(axis=1)
    exposure = np.minimum(first + 1, n_obs).sum(axis=1)
    return events, exposure


def fit_exceed_rate(
    jobs: JobBatch, table: PeakQuantileTable, level: float, prior_events: float = 10.0
) -> RiseRate:
    """The training jobs' (the fit part `table` was fitted on) rate of first exceedances of their arrival forecast
    per observed job-step, as a `RiseRate`. ValueError naming the batch when no job exceeds."""
    real = jobs.is_real & (jobs.duration > 0)
    first = arrival_exceed_steps(jobs, table, level)
    events = int((real & (first < jobs.duration)).sum())
    exposure = int(np.where(real, np.minimum(first + 1, jobs.duration), 0).sum())
    if events == 0:
        raise ValueError(
            f"fit_exceed_rate: no job of the training batch exceeds its level-{level} arrival forecast"
        )
    return RiseRate(hazard=events / exposure, events=events, exposure=exposure, prior_events=prior_events)


def overshoot_counts(state: State, n_obs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """((B,) placed jobs charged an overshoot so far (`State.has_overshot`, closed steps only), (B,) their observed
    job-steps) of each env."""
    n_obs = observed_steps(state) if n_obs is None else n_obs  # 0 for a job not placed yet
    events = (state.has_overshot.any(axis=2) & (state.job_machine >= 0)).sum(axis=1)
    return events, n_obs.sum(axis=1)


def fit_overshoot_rate(
    cfg: SimConfig,
    rule,
    jobs: JobBatch,
    seed: int,
    prior_events: float = 10.0,
    budget_pct: float | None = None,
) -> RiseRate:
    """The rate of jobs charged an overshoot per observed job-step when `rule` (at its fitted level) places the
    held-out sequences `jobs` (validation, never test) to their end, as a `RiseRate`; at least one event counted
    (a rule that never overshoots there has a rate of one event over its exposure). With `budget_pct`, the rate
    is scaled by budget_pct / the rule's mean overshoot % there where that is below the budget: the rate the
    rule's jobs would be charged at if it overshot by the budget (module docstring, "The overshoot guard").
    ValueError on a batch without jobs or a budget not above 0."""
    from sim import core
    from sim.metrics import overshoot_pct_per_episode
    from sim.policies import play

    if int(jobs.n_jobs.sum()) == 0:
        raise ValueError("fit_overshoot_rate: the validation sequences hold no job")
    if budget_pct is not None and not budget_pct > 0:
        raise ValueError(f"fit_overshoot_rate: budget_pct must be > 0, got {budget_pct}")
    trace = core.make_trace(cfg, jobs.batch_size)
    state = play(rule, cfg, jobs, seed, trace)
    events, exposure = (int(x.sum()) for x in overshoot_counts(state))
    if exposure == 0:
        raise ValueError("fit_overshoot_rate: no job-step was observed on the validation sequences")
    hazard = max(events, 1) / exposure
    if budget_pct is not None:
        pct = float(np.mean(overshoot_pct_per_episode(trace, state)))
        hazard *= max(1.0, budget_pct / max(pct, 1e-6))
    return RiseRate(hazard=hazard, events=events, exposure=exposure, prior_events=prior_events)


def target_level(level: float, ratio: np.ndarray) -> np.ndarray:
    """(B,) 1 - (1 - `level`) / ratio: the training level whose tail is 1 - `level` at the shifted rate."""
    return 1.0 - (1.0 - level) / np.maximum(np.asarray(ratio, dtype=np.float64), 1e-12)


def adapted_level(
    level: float, ratio: np.ndarray, levels: tuple[float, ...], floor: float = MIN_LEVEL
) -> np.ndarray:
    """(B,) indices into `levels` (ascending) of the level each env packs at: the smallest at or above
    1 - (1 - `level`) / ratio, within [`floor` (at least the lowest level), the top level]."""
    grid = np.asarray(levels, dtype=np.float64)
    target = np.clip(target_level(level, ratio), max(floor, grid[0]), grid[-1])
    return np.minimum(np.searchsorted(grid, target - 1e-9, side="left"), grid.size - 1)


def reads_rise_rate(exceed: bool, overshoot: bool, raise_only: bool, floor: float) -> bool:
    """Whether a `ShiftAdaptedPeakForecaster` with these signals reads the training rise rate: it sets the ratio
    unless the exceedances or the overshoot do, and a guard at the mask floor reads it to tell the quiet envs
    (`ShiftAdaptedPeakForecaster.rows_and_mask`)."""
    return not (exceed or overshoot) or (raise_only and floor <= MASK_FLOOR)


@dataclass(frozen=True)
class ShiftAdaptedPeakForecaster:
    """A point forecaster: each job's remaining-peak quantile (`PeakQuantileTable`) at its env's adapted level
    (`adapted_level` of `level` by the env's `rate_ratio`), held flat over steps t + 1 .. t + `horizon`."""

    table: PeakQuantileTable = field(repr=False)
    rate: RiseRate | None
    """The training rise rate; None only where `exceed` or `overshoot` sets the ratio and no `MASK_FLOOR` guard
    reads it (a training split whose jobs never rise has none)."""
    level: float = 0.9
    """The level fitted on validation (`forecast_peak`'s): the one used at ratio 1."""
    horizon: int = 24
    floor: float = MIN_LEVEL
    """The lowest level an env packs at however quiet its episode (`adapted_level`); `MASK_FLOOR` (0): below the
    table's lowest level, the arriving job left to the admission mask (`at_mask`)."""
    amount: RiseAmount | None = None
    """With it, the ratio is also scaled by how far the episode's risen jobs have risen (`RiseAmount`); None: the
    rate alone."""
    exceed: RiseRate | None = None
    """With it, the ratio is the episode's rate of exceeding the jobs' arrival forecasts at `level` over this
    training rate (`fit_exceed_rate`), in place of the rise rate's and the amount's (module docstring, "The
    exceedances")."""
    raise_only: bool = False
    """The ratio is never below 1: an env packs at `level` or more cautiously, never tighter (module docstring,
    "The guard")."""
    overshoot: RiseRate | None = None
    """With it, the ratio is the episode's rate of jobs charged an overshoot over this rate of the rule at its
    fitted level on the validation sequences (`fit_overshoot_rate`), in place of every other signal (module
    docstring, "The overshoot guard")."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", None if self.exceed is None else table_key(self.table))
        if self.rate is None and self.reads_rise_rate:
            raise ValueError(
                "ShiftAdaptedPeakForecaster: rate is None, but the rise rate sets its ratio or its mask floor's "
                "quiet envs"
            )
        if not 0.0 <= self.floor <= self.table.levels[-1]:
            raise ValueError(
                f"ShiftAdaptedPeakForecaster.floor must be in [0, {self.table.levels[-1]}], got {self.floor}"
            )

    @property
    def reads_rise_rate(self) -> bool:
        """The rise rate is read (`reads_rise_rate` of this forecaster's signals)."""
        return reads_rise_rate(
            self.exceed is not None, self.overshoot is not None, self.raise_only, self.floor
        )

    @property
    def levels(self) -> tuple[float, ...]:
        """The table's levels (a risk rule checks that its level is one of them; every level is this point)."""
        return self.table.levels

    @property
    def reads_labels(self) -> bool:
        return self.table.use_labels

    def env_levels(self, state: State) -> np.ndarray:
        """(B,) the level each env packs at now."""
        grid = np.asarray(self.table.levels)
        return grid[self.level_rows(state)]

    def level_rows(self, state: State) -> np.ndarray:
        """(B,) each env's row of the table's levels now (`adapted_level`)."""
        return self.rows_and_mask(state)[0]

    def at_mask(self, state: State) -> np.ndarray:
        """(B,) bool: envs whose adapted level is at or below 0 under a `MASK_FLOOR` floor, whose arriving job is
        forecast at 0 (left to the admission mask); all False at any other floor."""
        return self.rows_and_mask(state)[1]

    def ratio(self, state: State, n_obs: np.ndarray | None = None) -> np.ndarray:
        """(B,) each env's ratio of its tail to the training tail: the rate ratio, times the amount's tail factor
        where the forecaster has one; the exceedance ratio where it has that; at least 1 under `raise_only`."""
        n_obs = observed_steps(state) if n_obs is None else n_obs
        if self.overshoot is not None:
            ratio = self.overshoot.ratio(*overshoot_counts(state, n_obs))
        elif self.exceed is not None:
            ratio = self.exceed.ratio(*exceed_counts(state, self.table, self.level, n_obs, self._key))
        else:
            ratio = rate_ratio(self.rate, state, n_obs)
            if self.amount is not None:
                ratio = ratio * self.amount.tail_factor(self.amount.scale(state, n_obs))
        return np.maximum(ratio, 1.0) if self.raise_only else ratio

    def rows_and_mask(self, state: State) -> tuple[np.ndarray, np.ndarray]:
        """(`level_rows`, `at_mask`) from one reading of the episode's ratio. Under `raise_only` with a
        `MASK_FLOOR` floor, an env whose RISE rate ratio puts its target level at or below 0 is at the mask (its
        running jobs at the grid's lowest level) whatever its raised ratio: the one way down the guard allows."""
        n_obs = observed_steps(state)
        ratio = self.ratio(state, n_obs)
        rows = adapted_level(self.level, ratio, self.table.levels, self.floor)
        if self.floor > MASK_FLOOR:
            return rows, np.zeros(state.t.shape, dtype=bool)
        if self.raise_only:
            quiet = target_level(self.level, rate_ratio(self.rate, state, n_obs)) <= 0.0
            return np.where(quiet, 0, rows), quiet
        return rows, target_level(self.level, ratio) <= 0.0

    def flat(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, D) each job's quantile at its env's level, held at every step (`sim.forecast.flat_forecast`)."""
        env, job = np.asarray(env, dtype=np.int64), np.asarray(job, dtype=np.int64)
        rows, at_mask = self.rows_and_mask(state)
        every = RemainingPeakQuantiles(self.table, self.horizon).flat_levels(
            self.table.levels, cfg, state, env, job
        )  # (N, L, D)
        flat = every[np.arange(env.size), rows[env]]
        arriving_at_mask = at_mask[env] & (state.job_machine[env, job] < 0)
        flat[arriving_at_mask] = 0.0
        return flat

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) the quantile at every step."""
        return spread_flat(self.flat(cfg, state, env, job), self.horizon)

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.table.levels))
