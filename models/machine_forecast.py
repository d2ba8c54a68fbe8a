"""A forecast of each machine's summed usage as a whole: the quantile of the SUM's peak, learned and calibrated on
the sum itself, for `sim.risk.MachinePeakPacking` (registered as `forecast_machine_peak`, `_noec` without EC
labels).

Why: the per-job forecasts and their co-peaking-aware sum (`sim.risk.RiskAwarePacking`) calibrate each job, then
correct the sum by one inflation for all machines (kappa 2.4 on Bitbrains), which packs no further than requests
do. The information split (benchmarks/RESULTS.md "Where the headroom lies") says that with TVW-RL's requests most of the headroom
is in the running jobs' futures as they add up on one machine. This model reads, for one machine and the job about
to be placed, what a scheduler observes of the jobs running there (their requests, usage now, recent mean, peak
so far, largest usage over the last period, the same hours one period ago, how long each still runs, which ones
have not reached their request yet) and of the job (its request, duration, EC label), and predicts the quantiles
of the machine's largest share of capacity over the steps t .. t + H that those jobs will take together.

Fitting (`fit_machine_peak`, training sequences only):
- cases: at every decision of rollouts on the fit sequences, every machine in use that the mask lets take the
  queue head, with its features and, for calibration and training only, the realised largest share of the running
  jobs' usage plus the head's own (`machine_targets`, read from the batch's true usage; never a scheduler input);
- only the cases where the requests do not fit are kept (`MachinePeakConfig.fit_cases`): only there does the
  rule ask the model whether a machine is safe (it still orders the allowed machines by min(bound, the requests'
  share), a request-fit machine's bound an extrapolation), and with the window's peak as the request the others
  never exceed;
- round 0 rolls the fallback heuristic; each later round rolls the rule on the model so far (its own states: it
  packs tighter than any heuristic) and adds its cases;
- one gradient-boosted quantile regressor per level (scikit-learn's `HistGradientBoostingRegressor`, pinball loss:
  fast on a few hundred thousand rows, monotone-free, handles the label as a category), fitted on the sequences of
  the fit part, then shifted split-conformally on the same rounds' cases on the validation sequences (cut from
  training workloads the fit part never uses; `MachinePeakConfig.calibrate_on`) so that the bound covers the
  realised peak of EVERY resource of a case at least at its level (the score is the case's largest excess over
  its resources); the classifier of the chance of exceeding is calibrated there too (isotonic). Calibrated on
  the fit part's own last sequences instead, which share its workloads, the chance was 2-40x optimistic on
  unseen VMs (benchmarks/RESULTS.md "Each machine's summed peak").
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.core import State, jobs_running, machines_used, observed_labels, queue_head, relabel, sum_by_cell
from sim.forecast import n_observed, recent_usage
from sim.jobs import JobBatch

PER_JOB = (
    "request",
    "usage_now",
    "recent_mean",
    "peak_so_far",
    "last_period_max",
    "period_ago_max",
    "request_not_reached",
    "request_young",
    "request_ending",
    "request_x_remaining",
)
"""Per-job values (units of one resource) a machine sums over its running jobs (`machine_features`)."""
FEATURES = (
    "resource",
    "n_jobs",
    *(f"sum_{name}" for name in PER_JOB),
    "min_remaining",
    "max_remaining",
    "head_request",
    "head_duration",
    "sum_request_with_head",
    "other_usage_now",
    "seasonal_sum_max",
    "seasonal_sum_max_unreached_at_request",
    "exceed_probability_step",
    "exceed_probability_life",
    "exceed_probability_step_unreached_at_request",
    "exceed_probability_life_unreached_at_request",
    "head_label",
)
"""Columns of a case, per (machine, resource): shares of C_d; remaining lives in units of the horizon (not capped:
a job may outlive it) and the head's duration as a share of the horizon (capped at 1); `head_label` only with EC
labels (the last column, categorical)."""

FIT_CASES = ("beyond_requests", "all")
CALIBRATE_ON = ("validation", "fit")


@dataclass(frozen=True)
class MachinePeakConfig:
    levels: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99)
    """Quantile levels fitted (ascending); the rule's level is chosen among them on validation."""
    period_steps: int = 48
    """A period of usage in steps (48: a day of the sample profile's 30-minute steps) for the last-period and
    period-ago features."""
    n_recent: int = 6
    """Steps of the recent mean, and of the window one period ago ("the same hours yesterday")."""
    young_steps: int = 4
    """A running job observed for fewer steps counts as young (its request summed apart)."""
    ending_steps: int = 2
    """A running job with at most this many steps left counts as ending (its request summed apart)."""
    epsilons: tuple[float, ...] = (0.01, 0.03, 0.1, 0.2)
    """Chances of exceeding capacity the probability rule may accept (chosen on validation)."""
    cost_scales: tuple[float, ...] = (0.5, 1.0, 2.0)
    """Weights of the saved under-utilisation against the expected overshoot charge that the expected-value rule
    may use (`sim.risk.MachinePeakPacking.cost_scale`; 1: the reward's own break-even; chosen on validation)."""
    fit_cases: str = "beyond_requests"
    """The cases the regressors, their conformal shifts and the classifier are fitted and calibrated on:
    "beyond_requests", only those where the machine's requests with the head's exceed C_d in some resource (the
    only ones where the rule asks the model whether a machine is safe: a machine whose requests fit is always
    allowed), or "all". With the window's peak as the request, a case whose requests fit can never exceed, and
    mixed in they make the chance look small exactly where the rule acts (benchmarks/RESULTS.md "Each machine's summed peak":
    2.6-43x optimistic)."""
    calibrate_on: str = "validation"
    """Where the conformal shifts and the classifier's isotonic map are calibrated: "validation", on cases of
    the same rollouts on the fitting context's validation sequences (cut from training workloads the fit part
    never uses, so calibrated for workloads the model has not seen, as test workloads are), the regressors and
    the classifier then fitted on every fit-part case; or "fit", on the last `calibration_share` of the fit
    sequences, which share the fit part's workloads (measured: calibrated there, 2-40x optimistic on unseen
    VMs). With a single training sequence (the validation part is the fit part) "fit" is used, which needs two
    sequences: the rule is then its fallback, with a warning. The validation part is workload-disjoint where the
    sequence builders cut it so (`validation_workload_disjoint` in the choice)."""
    rounds: int = 2
    """Rollouts to collect cases: the fallback's, then the rule's on the model so far."""
    round_level: float = 0.95
    """The quantile level of the rule ("pack" mode) that rolls the rounds after the first: a lower level packs
    further, so the cases cover more of the states a rule that packs beyond requests leads to (the nearest
    fitted level is used)."""
    calibration_share: float = 0.25
    """Share of the fit sequences (the last ones) held out of the regressors for the conformal shift where
    `calibrate_on` is "fit" or no calibration sequences are given."""
    max_cases: int = 400_000
    """Cases kept per round at most (evenly spaced): bounds the fit's time and memory."""
    max_iter: int = 150
    learning_rate: float = 0.1
    max_leaf_nodes: int = 31
    min_samples_leaf: int = 40
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.levels or any(not 0.0 < q < 1.0 for q in self.levels):
            raise ValueError(f"MachinePeakConfig.levels must be in (0, 1), got {self.levels}")
        if tuple(sorted(self.levels)) != tuple(self.levels):
            raise ValueError(f"MachinePeakConfig.levels must be ascending, got {self.levels}")
        if self.period_steps < self.n_recent or self.n_recent < 1:
            raise ValueError(
                f"MachinePeakConfig: need 1 <= n_recent ({self.n_recent}) <= period_steps ({self.period_steps})"
            )
        if not 0.0 < self.calibration_share < 1.0:
            raise ValueError(
                f"MachinePeakConfig.calibration_share must be in (0, 1), got {self.calibration_share}"
            )
        if not 0.0 < self.round_level < 1.0:
            raise ValueError(f"MachinePeakConfig.round_level must be in (0, 1), got {self.round_level}")
        if self.rounds < 1:
            raise ValueError(f"MachinePeakConfig.rounds must be >= 1, got {self.rounds}")
        if self.calibrate_on not in CALIBRATE_ON:
            raise ValueError(
                f"MachinePeakConfig.calibrate_on must be one of {CALIBRATE_ON}, got {self.calibrate_on!r}"
            )
        if self.fit_cases not in FIT_CASES:
            raise ValueError(
                f"MachinePeakConfig.fit_cases must be one of {FIT_CASES}, got {self.fit_cases!r}"
            )
        if any(not c > 0.0 for c in self.cost_scales):
            raise ValueError(f"MachinePeakConfig.cost_scales must be positive, got {self.cost_scales}")


def machine_features(
    cfg: SimConfig, state: State, rows: np.ndarray, horizon: int, mcfg: MachinePeakConfig, use_labels: bool
) -> np.ndarray:
    """(len(rows), M, D, F) float64 features of every machine of envs `rows` with each env's queue head placed
    there (`FEATURES`, without `head_label` unless `use_labels`). Observed usage only: each running job's usage
    up to t (`sim.forecast.n_observed`), requests, durations and the labels the state shows."""
    rows = np.asarray(rows, dtype=np.int64)
    jobs = state.jobs
    n_r, n_m, n_d = rows.size, cfg.n_machines, cfg.n_resources
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    position = np.full(state.batch_size, -1, dtype=np.int64)
    position[rows] = np.arange(n_r)
    bi, ji = np.nonzero(jobs_running(state) & (position >= 0)[:, None])
    n_obs = n_observed(state, bi, ji)
    request = jobs.request[bi, ji].astype(np.float64)  # (N, D)
    window = recent_usage(jobs.usage, bi, ji, n_obs, mcfg.period_steps)  # (N, P, D), NaN before the start
    seen = ~np.isnan(window)
    filled = np.where(seen, window, -np.inf)
    usage_now = np.where(seen[:, -1], window[:, -1], 0.0)
    recent = window[:, -mcfg.n_recent :]
    recent_seen = seen[:, -mcfg.n_recent :]
    recent_mean = np.where(recent_seen, recent, 0.0).sum(axis=1) / np.maximum(recent_seen.sum(axis=1), 1)
    last_period_max = np.maximum(filled.max(axis=1), 0.0)
    peak = np.maximum(jobs.observed_prefix[0].peak_at(bi, ji, n_obs), last_period_max)
    # ages a - P .. a - P + n_recent - 1: the next hours, one period ago
    ago = filled[:, : mcfg.n_recent].max(axis=1)
    period_ago_max = np.where(n_obs[:, None] >= mcfg.period_steps, ago, last_period_max)
    remaining = (state.job_start[bi, ji] + jobs.duration[bi, ji] - state.t[bi]).astype(np.float64)
    young = (n_obs < mcfg.young_steps)[:, None]
    ending = (remaining <= mcfg.ending_steps)[:, None]
    per_job = np.stack(
        [
            request,
            usage_now,
            recent_mean,
            peak,
            last_period_max,
            period_ago_max,
            request * (peak < request),
            request * young,
            request * ending,
            request * (np.minimum(remaining, horizon) / horizon)[:, None],
        ],
        axis=1,
    )  # (N, len(PER_JOB), D)
    cell = position[bi] * n_m + state.job_machine[bi, ji]
    n_cells = n_r * n_m
    sums = sum_by_cell(per_job.reshape(bi.size, -1), cell, n_cells).reshape(n_r, n_m, len(PER_JOB), n_d)
    n_jobs = np.bincount(cell, minlength=n_cells).reshape(n_r, n_m).astype(np.float64)
    rem = remaining / horizon
    min_rem = np.full(n_cells, np.inf)
    max_rem = np.zeros(n_cells)
    np.minimum.at(min_rem, cell, rem)
    np.maximum.at(max_rem, cell, rem)
    min_rem = np.where(np.isfinite(min_rem), min_rem, 0.0).reshape(n_r, n_m)
    max_rem = max_rem.reshape(n_r, n_m)
    head = queue_head(state)
    head_request = head.request[rows].astype(np.float64)  # (R, D), 0 without a head
    head_duration = np.minimum(head.duration[rows], horizon) / horizon
    shares = sums / cap  # (R, M, PER_JOB, D)
    columns = [
        np.broadcast_to(np.arange(n_d, dtype=np.float64), (n_r, n_m, n_d)),
        np.broadcast_to(n_jobs[:, :, None], (n_r, n_m, n_d)),
        *(shares[:, :, k, :] for k in range(len(PER_JOB))),
        np.broadcast_to(min_rem[:, :, None], (n_r, n_m, n_d)),
        np.broadcast_to(max_rem[:, :, None], (n_r, n_m, n_d)),
        np.broadcast_to((head_request / cap)[:, None, :], (n_r, n_m, n_d)),
        np.broadcast_to(head_duration[:, None, None], (n_r, n_m, n_d)),
        shares[:, :, 0, :] + (head_request / cap)[:, None, :],
        # the other resources' usage now (D = 2: the other one; summed where D > 2)
        shares[:, :, 1, :].sum(axis=2, keepdims=True) - shares[:, :, 1, :],
    ]
    # seasonal naive, per machine: each running job repeats its last observed period (its peak so far where a
    # phase was not observed), summed over the machine's jobs phase by phase; its largest share, and the same
    # with every job that has not reached its request yet at its request (it will reach it at a phase unknown)
    season = np.where(seen, window, peak[:, None, :])  # (N, P, D)
    unreached = (peak < request)[:, None, :]
    per_phase = np.stack([season, np.where(unreached, request[:, None, :], season)], axis=1)  # (N, 2, P, D)
    phase_sums = sum_by_cell(per_phase.reshape(bi.size, -1), cell, n_cells).reshape(n_r, n_m, 2, -1, n_d)
    seasonal = phase_sums.max(axis=3) / cap  # (R, M, 2, D)
    columns += [seasonal[:, :, 0, :], seasonal[:, :, 1, :]]
    # the chance that the machine exceeds C_d at one step, each running job drawing its usage independently from
    # its observed window and the head at its request; over the steps they share (at most the horizon); and the
    # same with every job that has not reached its request yet at its request
    start = np.repeat(head.request[rows], n_m, axis=0).astype(np.int64)  # (R * M, D)
    shared = np.minimum(max_rem * horizon, np.minimum(head.duration[rows], horizon)[:, None])  # (R, M) steps
    for view in (window, np.where(unreached, request[:, None, :], window)):
        p_step = exceed_probability(view, seen, cell, n_cells, start, cfg.capacity_units)
        p_step = np.clip(p_step, 0.0, 1.0).reshape(n_r, n_m, n_d)
        columns += [p_step, 1.0 - (1.0 - p_step) ** np.maximum(shared, 1.0)[:, :, None]]
    if use_labels:
        idx = np.minimum(state.next_job[rows], jobs.max_jobs - 1)
        label = observed_labels(state)[rows, idx].astype(np.float64)
        columns.append(np.broadcast_to(label[:, None, None], (n_r, n_m, n_d)))
    return np.stack(columns, axis=3)


def exceed_probability(
    window: np.ndarray,
    seen: np.ndarray,
    cell: np.ndarray,
    n_cells: int,
    start: np.ndarray,
    capacity_units,
) -> np.ndarray:
    """(n_cells, D) float64: P(the units of a cell's jobs at one step sum above C_d), `start` (n_cells, D) units
    there for sure (the head at its request) and each job i (cell `cell[i]`) drawing its units independently
    from its observed `window` (N, P, D) where `seen`: the exact distribution of the sum (a convolution of the
    jobs' histograms, sums above C_d pooled in one bin), job by job within each cell."""
    n_jobs, _, n_d = window.shape
    out = np.zeros((n_cells, n_d))
    order = np.argsort(cell, kind="stable")
    first = np.searchsorted(cell[order], cell[order], side="left")
    rank = np.empty(n_jobs, dtype=np.int64)
    rank[order] = np.arange(n_jobs) - first
    n_seen = np.maximum(seen.sum(axis=1), 1)  # (N, D)
    for d in range(n_d):
        over = int(capacity_units[d]) + 1  # the bin of every sum above C_d
        values = np.clip(np.where(seen[:, :, d], window[:, :, d], -1), -1, over).astype(np.int64)
        pmf = np.stack([(values == u).sum(axis=1) for u in range(over + 1)], axis=1) / n_seen[:, d, None]
        dist = np.zeros((n_cells, over + 1))
        dist[np.arange(n_cells), np.clip(start[:, d], 0, over)] = 1.0
        for r in range(int(rank.max(initial=-1)) + 1):
            at = rank == r  # one job per cell: no two rows below write the same cell
            cur, p = dist[cell[at]], pmf[at]
            new = np.zeros_like(cur)
            for u in range(over + 1):
                pu = p[:, u : u + 1]
                if not pu.any():
                    continue
                new[:, u:over] += cur[:, : over - u] * pu
                new[:, over] += cur[:, over - u :].sum(axis=1) * pu[:, 0]
            dist[cell[at]] = new
        out[:, d] = dist[:, over]
    return out


def machine_targets(cfg: SimConfig, state: State, rows: np.ndarray, horizon: int) -> np.ndarray:
    """(len(rows), M, D) float64 TRAINING TARGET, never a scheduler input: the largest share of C_d that each
    machine's running jobs and env `rows[i]`'s queue head, placed there now, take together at steps t .. t + H
    (their true usage)."""
    rows = np.asarray(rows, dtype=np.int64)
    jobs = state.jobs
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    committed = core.committed_future_usage(state, horizon + 1)[rows].astype(np.float64)  # (R, M, D, H + 1)
    head = queue_head(state)
    idx = np.minimum(state.next_job[rows], jobs.max_jobs - 1)
    ages = np.arange(horizon + 1)
    alive = (ages[None, :] < jobs.duration[rows, idx][:, None]) & head.has_job[rows][:, None]
    usage = jobs.usage[rows[:, None], idx[:, None], np.minimum(ages, jobs.max_duration - 1)[None, :]]
    usage = usage.astype(np.float64) * alive[..., None]  # (R, H + 1, D)
    total = committed + usage.transpose(0, 2, 1)[:, None]
    return total.max(axis=3) / cap


class TooFewCases(ValueError):
    """The training sequences give too few cases to fit and calibrate the model (named in the message)."""


@dataclass
class Cases:
    """Cases of `collect_cases`: features (N, D, F), targets (N, D), the sequence of each case (N,)."""

    x: np.ndarray
    y: np.ndarray
    sequence: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @staticmethod
    def join(parts: list[Cases]) -> Cases:
        return Cases(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("x", "y", "sequence")))

    def beyond_requests(self) -> Cases:
        """The cases whose running jobs' requests and the head's exceed C_d in some resource."""
        keep = (self.x[:, :, FEATURES.index("sum_request_with_head")] > 1.0 + 1e-9).any(axis=1)
        return Cases(self.x[keep], self.y[keep], self.sequence[keep])

    def thinned(self, max_cases: int) -> Cases:
        if len(self) <= max_cases:
            return self
        keep = np.unique(np.linspace(0, len(self) - 1, max_cases).round().astype(np.int64))
        return Cases(self.x[keep], self.y[keep], self.sequence[keep])


def collect_cases(
    cfg: SimConfig,
    jobs: JobBatch,
    policy,
    horizon: int,
    mcfg: MachinePeakConfig,
    use_labels: bool,
    labeller=None,
    seed: int = 0,
) -> Cases:
    """Every (decision, machine in use the mask lets take the head) of one rollout of `policy` on `jobs`, the head
    being the job the policy places (a job picker's choice), with `machine_features` and the realised
    `machine_targets` (TRAINING sequences only). `labeller`: the labels the rule is served
    (`sim.labelling.ServedLabels`), so the features see what they will see at test."""
    from sim.labelling import ServedLabels
    from sim.policies import own_jobs, pick, place, valid_machines

    if labeller is not None:
        policy = ServedLabels(policy, labeller)
    rng = np.random.default_rng(seed)
    state = own_jobs(core.reset(cfg, jobs, seed))
    parts: list[Cases] = []
    n_d = cfg.n_resources
    while not state.is_done.all():
        # the cases are of the job the policy places: a job picker (DeepRM's SJF, Packer) moves it to the head
        state = pick(policy, cfg, state, rng, in_place=True)
        candidate = valid_machines(cfg, state) & machines_used(state)
        rows = np.flatnonzero(queue_head(state).has_job & candidate.any(axis=1))
        if rows.size:
            view = (
                state
                if labeller is None or not use_labels
                else relabel(cfg, state, labeller.labels(cfg, state))
            )
            x = machine_features(cfg, view, rows, horizon, mcfg, use_labels)
            y = machine_targets(cfg, state, rows, horizon)
            r, m = np.nonzero(candidate[rows])
            parts.append(Cases(x[r, m], y[r, m], rows[r]))
        state, *_ = core.step(cfg, state, place(policy, cfg, state, rng), in_place=True)
    if not parts:
        n_f = len(FEATURES) - (0 if use_labels else 1)
        return Cases(np.zeros((0, n_d, n_f)), np.zeros((0, n_d)), np.zeros(0, dtype=np.int64))
    return Cases.join(parts)


def pinball(y: np.ndarray, pred: np.ndarray, level: float) -> float:
    diff = y - pred
    return float(np.mean(np.maximum(level * diff, (level - 1.0) * diff)))


@dataclass
class MachinePeakModel:
    """Fitted quantile regressors of a machine's peak share (one per level) with their split-conformal shifts,
    and a classifier of the chance that the machine exceeds capacity (isotonic-calibrated on the same held-out
    sequences); `assess` is `sim.risk.MachinePeakBound`'s."""

    regressors: dict[float, object]
    shift: dict[float, float]
    horizon: int
    config: MachinePeakConfig
    use_labels: bool
    classifier: object | None = None
    """P(the machine's peak with the job exceeds C_d for some d) from a case's features (both resources' side by
    side); None where the fit or the calibration cases all had one outcome: then `exceed` is the fit cases'
    exceed rate for every case."""
    isotonic: object | None = None
    exceed_rate: float = 0.0
    """The share of fit cases that exceeded (what `exceed` gives without a classifier)."""
    report: dict = field(default_factory=dict)

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(sorted(self.regressors))

    @property
    def reads_labels(self) -> bool:
        return self.use_labels

    def predict(self, x: np.ndarray, level: float) -> np.ndarray:
        """(...) calibrated level-`level` bound of cases x (..., F)."""
        flat = x.reshape(-1, x.shape[-1])
        if not flat.shape[0]:
            return np.zeros(x.shape[:-1])
        # a decision's few hundred rows: OpenMP's threads cost more than they save (100x on a loaded machine)
        with _one_thread():
            out = self.regressors[level].predict(flat) + self.shift[level]
        return out.reshape(x.shape[:-1])

    def exceed(self, x: np.ndarray) -> np.ndarray:
        """(...) calibrated chance that cases x (..., D, F) exceed capacity (without a classifier, the fit
        cases' exceed rate for every case)."""
        flat = x.reshape(-1, x.shape[-2] * x.shape[-1])
        if self.classifier is None or not flat.shape[0]:
            return np.full(x.shape[:-2], self.exceed_rate)
        with _one_thread():
            raw = self.classifier.predict_proba(flat)[:, 1]
        return self.isotonic.predict(raw).reshape(x.shape[:-2])

    def assess(
        self, cfg: SimConfig, state: State, rows: np.ndarray, level: float, with_exceed: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if level not in self.regressors:
            raise ValueError(f"MachinePeakModel: level {level} not fitted (levels {self.levels})")
        x = machine_features(cfg, state, rows, self.horizon, self.config, self.use_labels)
        return self.predict(x, level), (self.exceed(x) if with_exceed else None)


@functools.cache
def _threadpools():
    """scikit-learn's thread pools, found once: `threadpoolctl.threadpool_limits` looks them up anew at every
    call (4 ms here), which `MachinePeakModel.assess` would pay at every decision."""
    import sklearn.ensemble  # noqa: F401  (loads the OpenMP runtime the controller must find)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_thread():
    """A context in which scikit-learn's OpenMP runs on one thread."""
    return _threadpools().limit(limits=1, user_api="openmp")


def _regressor(mcfg: MachinePeakConfig, level: float, use_labels: bool, n_features: int):
    from sklearn.ensemble import HistGradientBoostingRegressor

    categorical = np.zeros(n_features, dtype=bool)
    categorical[0] = True  # the resource
    if use_labels:
        categorical[-1] = True
    return HistGradientBoostingRegressor(
        loss="quantile", quantile=level, categorical_features=categorical, **_boosting(mcfg)
    )


def _boosting(mcfg: MachinePeakConfig) -> dict:
    """The boosted trees' settings the regressors and the classifier share."""
    return {
        "max_iter": mcfg.max_iter,
        "learning_rate": mcfg.learning_rate,
        "max_leaf_nodes": mcfg.max_leaf_nodes,
        "min_samples_leaf": mcfg.min_samples_leaf,
        "early_stopping": False,
        "random_state": mcfg.seed,
    }


def fit_model(
    cases: Cases, horizon: int, mcfg: MachinePeakConfig, use_labels: bool, calibration: Cases | None = None
) -> MachinePeakModel:
    """Regressors on `cases`, each shifted split-conformally on the `calibration` cases (the ceil((n + 1) q)-th
    smallest case score, a case's score its largest excess over the resources); without `calibration`, on the
    cases of the last `calibration_share` of the sequences, the regressors on the others. A report of coverage
    and pinball loss before and after the shift."""
    if len(cases) == 0:
        raise TooFewCases("fit_machine_peak: no cases (no decision with a machine in use): nothing to fit")
    if calibration is not None:
        if len(calibration) == 0:
            raise TooFewCases("fit_machine_peak: no calibration cases (no decision with a machine in use)")
        n_cal = int(np.unique(calibration.sequence).size)
        is_cal = np.repeat([False, True], [len(cases), len(calibration)])
        cases = Cases.join([cases, calibration])
    else:
        sequences = np.unique(cases.sequence)
        n_cal = max(1, int(round(mcfg.calibration_share * sequences.size)))
        if sequences.size < 2:
            raise TooFewCases(
                f"fit_machine_peak: cases from {sequences.size} sequence(s); calibration needs at least 2"
            )
        is_cal = np.isin(cases.sequence, sequences[-n_cal:])
    n_f = cases.x.shape[2]
    x_fit, y_fit = cases.x[~is_cal].reshape(-1, n_f), cases.y[~is_cal].reshape(-1)
    x_cal, y_cal = cases.x[is_cal], cases.y[is_cal]
    regressors, shift, per_level = {}, {}, {}
    for level in mcfg.levels:
        t0 = time.perf_counter()
        with _one_thread():  # see MachinePeakModel.predict
            reg = _regressor(mcfg, level, use_labels, n_f).fit(x_fit, y_fit)
            pred = reg.predict(x_cal.reshape(-1, n_f)).reshape(y_cal.shape)
        score = np.sort((y_cal - pred).max(axis=1))
        # too few calibration cases for the level (ceil((n + 1) q) > n): no finite shift covers, so the bound is
        # infinite and the rule never packs beyond requests at that level
        k = int(np.ceil((score.size + 1) * level))
        shift[level] = float(score[k - 1]) if k <= score.size else float("inf")
        regressors[level] = reg
        per_level[f"{level:g}"] = {
            "coverage_before": float((y_cal <= pred + 1e-9).all(axis=1).mean()),
            "shift": shift[level],
            "pinball_before": pinball(y_cal, pred, level),
            "pinball_after": pinball(y_cal, pred + shift[level], level),
            "seconds": time.perf_counter() - t0,
        }
    classifier, isotonic, exceed_report = _fit_exceed(cases, is_cal, mcfg, use_labels)
    report = {
        "exceed": exceed_report,
        "n_cases": len(cases),
        "n_fit_cases": int((~is_cal).sum()),
        "n_calibration_cases": int(is_cal.sum()),
        "n_calibration_sequences": int(n_cal),
        "calibration": "held-out sequences" if calibration is not None else "last fit sequences",
        "levels": per_level,
    }
    rate = exceed_report["exceed_rate_fit"]
    return MachinePeakModel(regressors, shift, horizon, mcfg, use_labels, classifier, isotonic, rate, report)


def _fit_exceed(cases: Cases, is_cal: np.ndarray, mcfg: MachinePeakConfig, use_labels: bool):
    """(classifier, isotonic calibration, report): P(a case's peak exceeds C_d for some d), fitted on the fit
    sequences' cases, calibrated isotonically on the calibration sequences'; (None, None, report) where either
    part has one outcome only."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.isotonic import IsotonicRegression

    n, n_d, n_f = cases.x.shape
    flat = cases.x.reshape(n, n_d * n_f)
    exceeded = (cases.y > 1.0 + 1e-9).any(axis=1)
    report = {
        "exceed_rate_fit": float(exceeded[~is_cal].mean()),
        "exceed_rate_calibration": float(exceeded[is_cal].mean()),
    }
    if np.unique(exceeded[~is_cal]).size < 2 or np.unique(exceeded[is_cal]).size < 2:
        return None, None, {**report, "fitted": False}
    categorical = np.zeros(n_d * n_f, dtype=bool)
    if use_labels:
        categorical[n_f - 1 :: n_f] = True
    clf = HistGradientBoostingClassifier(categorical_features=categorical, **_boosting(mcfg))
    with _one_thread():
        clf.fit(flat[~is_cal], exceeded[~is_cal])
        raw = clf.predict_proba(flat[is_cal])[:, 1]
    isotonic = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(raw, exceeded[is_cal])
    calibrated = isotonic.predict(raw)
    outcome = exceeded[is_cal].astype(np.float64)
    report.update(
        {
            "fitted": True,
            "brier_raw": float(np.mean((raw - outcome) ** 2)),
            "brier_calibrated": float(np.mean((calibrated - outcome) ** 2)),
            "brier_base_rate": float(np.mean((outcome.mean() - outcome) ** 2)),
        }
    )
    return clf, isotonic, report


def fit_machine_peak(
    cfg: SimConfig,
    jobs: JobBatch,
    fallback,
    horizon: int,
    mcfg: MachinePeakConfig = MachinePeakConfig(),
    use_labels: bool = True,
    labeller=None,
    seed: int = 0,
    log=None,
    calibration_jobs: JobBatch | None = None,
) -> MachinePeakModel:
    """The model fitted on training sequences `jobs` in `mcfg.rounds` rounds of cases (module docstring), each
    round's cases those `mcfg.fit_cases` names, and calibrated on the same rounds' cases on `calibration_jobs`
    (training sequences of other workloads) where `MachinePeakConfig.calibrate_on` is "validation", or on the
    last fit sequences without them, with "fit", or where they are `jobs` itself (a single training sequence is
    both parts: the fit part's own split then needs two sequences, so the caller's rule is its fallback); each
    round's report in `report["rounds"]`."""
    from sim.risk import MachinePeakPacking

    if mcfg.calibrate_on == "fit" or calibration_jobs is jobs:
        calibration_jobs = None

    def cases_of(batch: JobBatch, policy, r: int) -> tuple[Cases, int]:
        collected = collect_cases(cfg, batch, policy, horizon, mcfg, use_labels, labeller, seed + r)
        kept = collected.beyond_requests() if mcfg.fit_cases == "beyond_requests" else collected
        return kept.thinned(mcfg.max_cases), len(collected)

    parts: list[Cases] = []
    cal_parts: list[Cases] = []
    rounds = []
    model = None
    for r in range(mcfg.rounds):
        t0 = time.perf_counter()
        policy = (
            fallback
            if model is None
            else MachinePeakPacking(model, fallback, level=_nearest(model.levels, mcfg.round_level))
        )
        kept, n_collected = cases_of(jobs, policy, r)
        parts.append(kept)
        if calibration_jobs is not None:
            cal_parts.append(cases_of(calibration_jobs, policy, r)[0])
        t1 = time.perf_counter()
        calibration = Cases.join(cal_parts) if cal_parts else None
        model = fit_model(Cases.join(parts), horizon, mcfg, use_labels, calibration)
        rounds.append(
            {
                "round": r,
                "policy": getattr(policy, "name", type(policy).__name__),
                "rule_level": None if policy is fallback else policy.level,
                "cases": len(kept),
                "cases_collected": n_collected,
                "calibration_cases": len(cal_parts[-1]) if cal_parts else None,
                "collect_seconds": t1 - t0,
                "fit_seconds": time.perf_counter() - t1,
                "levels": model.report["levels"],
            }
        )
        if log is not None:
            log(
                f"machine peak round {r}: {len(kept)} cases in {t1 - t0:.1f} s, fitted in "
                f"{time.perf_counter() - t1:.1f} s"
            )
    model.report["rounds"] = rounds
    return model


def _nearest(levels: tuple[float, ...], level: float) -> float:
    return min(levels, key=lambda q: (abs(q - level), -q))


def fit_machine_peak_rule(ctx, name: str, use_labels: bool = True, mcfg: MachinePeakConfig | None = None):
    """`sim.risk.MachinePeakPacking` fitted in a `sim.tuning.FitContext`: the model on the context's fit part (on
    the labels its labeller serves), calibrated on its validation part (`MachinePeakConfig.calibrate_on`), then
    the level and the mode chosen on validation among the candidates with the best fallback heuristic
    (`FitContext.choose`): the quantile bound at each level >= 0.8 and, where the classifier was fitted, the
    chance of exceeding at each of `MachinePeakConfig.epsilons` and the expected-value rule at each of
    `MachinePeakConfig.cost_scales`, in "deviate" and "pack" modes; the model's report joins the choice (the
    validation return of a candidate is in-sample for the calibration). Where the fit part gives too few cases to
    fit and calibrate (`TooFewCases`), the rule is its fallback heuristic, with a warning and the reason in the
    choice."""
    from sim.risk import MachinePeakPacking

    mcfg = mcfg or MachinePeakConfig(seed=ctx.tuning.seed)
    fallback = ctx.best_fallback()

    def fitted():
        fit, validation = ctx.split()
        try:
            return fit_machine_peak(
                ctx.cfg,
                fit,
                fallback,
                ctx.horizon(),
                mcfg,
                use_labels,
                ctx.labeller if use_labels else None,
                ctx.tuning.seed,
                calibration_jobs=validation,
            )
        except TooFewCases as err:
            return err

    model = ctx.cached(("machine_peak", use_labels, mcfg), fitted)
    if isinstance(model, TooFewCases):  # nothing to learn from: the rule is its fallback, and says so
        warnings.warn(f"{name} ({ctx.where}): {model}: the rule is its fallback heuristic", stacklevel=2)
        ctx.choices[name] = {"model": None, "reason": str(model), **ctx.fallback_choice()}
        return MachinePeakPacking(None, fallback, name=name)
    modes = ("deviate", "pack")  # "guard" is "pack" here: a request fit is always safe
    candidates = [
        (
            {"rule": "quantile", "level": level, "mode": mode, "use_labels": use_labels},
            MachinePeakPacking(model, fallback, level, mode, name),
        )
        for level in model.levels
        if level >= 0.8
        for mode in modes
    ]
    if model.classifier is not None:
        order_by = 0.5 if 0.5 in model.levels else model.levels[0]
        candidates += [
            (
                {"rule": "exceed", "epsilon": eps, "level": order_by, "mode": mode, "use_labels": use_labels},
                MachinePeakPacking(model, fallback, order_by, mode, name, epsilon=eps),
            )
            for eps in mcfg.epsilons
            for mode in modes
        ]
        candidates += [
            (
                {
                    "rule": "expected_cost",
                    "cost_scale": c,
                    "level": order_by,
                    "mode": mode,
                    "use_labels": use_labels,
                },
                MachinePeakPacking(model, fallback, order_by, mode, name, cost_scale=c),
            )
            for c in mcfg.cost_scales
            for mode in modes
        ]
    policy = ctx.choose(name, candidates)
    ctx.choices[name]["machine_peak_model"] = model.report
    return policy
