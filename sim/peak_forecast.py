"""The quantile of a job's peak usage over the rest of its life, from what is observed of it: its request, the
peak it has shown so far, how long it has run, and (optionally) its equivalence class.

Why a peak and not a per-step path: a risk rule needs each machine's summed usage to stay within capacity at
every step of the horizon; a flat bound at each job's remaining peak covers every step at once whatever the
phases, so no co-peaking correction (and no inflation of per-step quantiles) is needed. Why conditioned on
the request and the peak so far: when the request is the trace's own (a VM's provisioned capacity, a Google
task's limit) a job typically uses half of it or less, and, once it has run for a while, its peak so far says
most of what it will do; when the request is the window's peak (TVW-RL's setting) a job that has not reached
its request yet is certain to, and the table learns exactly that.

The table (`fit_peak_quantiles`, training sequences only): every real job of the fit sequences contributes one
case per age a of `AGE_GRID` below its duration, per resource d:
- request r (units), the peak over its first a steps (none at a = 0, the job not placed yet), age bucket
  (`AGE_EDGES`), EC label (the scheduler sees `sim.core.observed_labels`: on a real source the EC classifier's
  guess at that age, `sim.labelling.ServedLabels`, so the table is fitted on those guesses by age when the fit
  has the labeller, `sim.tuning.FitContext.labeller`; else on the batch's clustering labels);
- target: its peak over steps a .. end (for a = 0 its whole life; steps beyond the job's end use 0).
Quantiles are the empirical "higher" quantile of each cell with at least `min_count` cases; a thinner cell
backs off to the cell without its label, then without its age bucket, then to (request, peak so far), then to
(request); a cell with none of those is forecast at max(request, peak so far) (request-based packing).

With `use_at_peak` (the peak rules' default, `sim.tuning.TuningConfig.peak_at_peak_key`) every cell, down to the
coarsest, is also keyed by whether the job's usage at its last observed step equals its peak so far, so the two
halves never pool. Why: with the window's peak as the request, a job that has reached its request either touched
it once (a spike; it will use less for a while) or sits at it (it will stay there), and the peak so far cannot
tell them apart. On the sample's Bitbrains, seed 2, 80 %, the training VMs with a 2-unit CPU request mostly touched
it and went back to 1, so the cells (request 2, peak so far 2, long remaining life) had a 0.99 quantile of 1 unit,
while one test VM sat at 2 units for the whole of every job: at 50 and 80 % load 2.1 and 3.2 % of the test CPU
cases were forecast below the request at the 0.99 level and every one of them was exceeded. Keyed, none were; in
seeds 0 and 1 the key adds up to 0.012 unit of slack and 0.0014 of exceedances, and with the traces' requests it
moves the slack by at most 0.18 unit and the exceedances by at most 0.0033 (`benchmarks/at_peak_key.py`; benchmarks/RESULTS.md,
"At its peak now").

With `use_remaining` (a rule that knows each job's end time: `forecast_peak`, not `_nodur`) every cell is also
keyed by the job's remaining life in steps (`REMAINING_EDGES`): a peak over the next 3 steps is smaller than one
over the next 60, and the known end says which. Cells back off to (request, remaining life), then (request).
Whether the key pays depends on the workloads, so the rule fits both tables and keeps the one with the lower
pinball loss on its validation sequences (`PeakQuantileTable.pinball_loss`, `sim.risk.fit_peak_rule`):
measured without labels with the traces' requests (seed 0; fitted on 70 training sequences, scored on the jobs
of 30 validation and 30 test sequences; 2026-11-27), the summed pinball loss of the 50-99 % quantiles falls 6-7 %
on validation and 14-16 % on test at every load on the sample's Bitbrains, 6-7 % and 4-6 % on the shared trace's
84 VMs, at the same coverage; Google-derived's windows gain 0-2 %; on DeepPlace, whose validation and test
templates are not the training ones, the finer cells describe training templates and the loss rises from 0.05
to 0.08-0.13 (validation keeps the table without the key there).

`PeakQuantileForecaster` serves one level as a point forecast (`sim.forecast.is_point_forecaster`): the job's
quantile held flat over the horizon (0 after its end when the rule knows durations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.config import SimConfig
from sim.core import State, observed_labels
from sim.forecast import DEFAULT_LEVELS, levels_of, observed_peak, spread_flat
from sim.jobs import JobBatch

AGE_GRID = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Ages (observed steps) at which each training job contributes a case (log-spaced: long jobs do not swamp)."""
AGE_EDGES = (0, 1, 2, 4, 8, 16, 32, 64)
"""Age buckets: bucket b holds ages in [AGE_EDGES[b], AGE_EDGES[b + 1]) (the last one open-ended)."""
REMAINING_EDGES = (1, 2, 3, 5, 9, 17, 33, 65)
"""Remaining-life buckets (steps from now to the job's end, `use_remaining`), as `AGE_EDGES`."""


@dataclass(frozen=True)
class PeakQuantileTable:
    """Quantiles of a job's remaining peak per (level, resource, request, peak so far + 1 and whether the job is at
    it now, age bucket, label, remaining life)."""

    values: np.ndarray = field(repr=False)
    """(L, D, C + 1, F x (C + 2), len(AGE_EDGES), E, M) float64 units; peak-so-far index 0 = nothing observed yet,
    plus C + 2 where the job's usage at its last observed step is its peak so far (F = 2 with `use_at_peak`, else
    F = 1); label index E - 1 = unknown (E = 1 when labels are not used); M = len(REMAINING_EDGES) with
    `use_remaining`, else 1."""
    levels: tuple[float, ...]
    use_labels: bool
    n_cases: int
    """Training cases (job, age, resource) the table was fitted on."""
    share_own_cell: float
    """Share of the training cases whose finest cell had at least `min_count` cases (the rest backed off)."""
    use_remaining: bool = False
    """Whether cells are keyed by the job's remaining life too (its end time known)."""
    use_at_peak: bool = False
    """Whether cells are keyed by whether the job's usage at its last observed step equals its peak so far (module
    docstring: a job sitting at its peak against one that touched it once)."""

    def __post_init__(self) -> None:
        if self.values.ndim == 6:  # a table saved before the remaining-life axis: one remaining-life cell
            object.__setattr__(self, "values", self.values[..., None])
        n_f = 2 if self.use_at_peak else 1
        if self.values.ndim != 7 or self.values.shape[3] != n_f * (self.values.shape[2] + 1):
            raise ValueError(
                f"PeakQuantileTable: values of shape {self.values.shape} do not fit use_at_peak={self.use_at_peak} "
                f"(the fourth axis must be {n_f} x (requests + 1))"
            )

    def lookup(
        self,
        level: float,
        request: np.ndarray,
        peak: np.ndarray,
        age: np.ndarray,
        label: np.ndarray,
        remaining: np.ndarray | None = None,
        at_peak: np.ndarray | None = None,
    ):
        """(N, D) the level's quantile for N jobs: request (N, D) units, peak so far (N, D) units (NaN or < 0 when
        nothing is observed), age (N,) observed steps, label (N,) EC label (any value: out of range = unknown),
        remaining (N,) steps to each job's end (needed exactly when the table `use_remaining`: ValueError),
        at_peak (N, D) whether the usage at the last observed step is the peak so far (needed exactly when the
        table `use_at_peak`, `observed_at_peak`: ValueError)."""
        return self.lookup_levels((level,), request, peak, age, label, remaining, at_peak)[:, 0]

    def lookup_levels(
        self,
        levels,
        request: np.ndarray,
        peak: np.ndarray,
        age: np.ndarray,
        label: np.ndarray,
        remaining: np.ndarray | None = None,
        at_peak: np.ndarray | None = None,
    ) -> np.ndarray:
        """(N, L, D) the quantiles of `levels` (each a fitted level) for N jobs, from one cell look-up (`lookup`'s
        arguments)."""
        i_levels = np.array([_level_index(self.levels, lv) for lv in levels], dtype=np.int64)
        if self.use_remaining and remaining is None:
            raise ValueError("PeakQuantileTable.lookup: the table is keyed by remaining life; pass remaining")
        if self.use_at_peak and at_peak is None:
            raise ValueError(
                "PeakQuantileTable.lookup: the table is keyed by whether each job is at its peak now; pass at_peak"
            )
        n_d, n_p = self.values.shape[1], self.n_peak
        peak = np.asarray(peak, dtype=np.float64)
        p_idx = np.where(np.isfinite(peak) & (peak >= 0), np.clip(np.nan_to_num(peak), 0, n_p - 2) + 1, 0)
        cell = self._cell(
            np.asarray(request, dtype=np.int64),
            p_idx.astype(np.int64),
            age_bucket(np.asarray(age))[:, None],
            np.asarray(label, dtype=np.int64)[:, None],
            None if remaining is None else np.asarray(remaining)[:, None],
            None if at_peak is None else np.asarray(at_peak, dtype=bool),
        )
        return self.values[
            (i_levels[None, :, None], np.arange(n_d)[None, None, :], *(c[:, None] for c in cell))
        ]

    def pinball_loss(self, jobs: JobBatch, labels_by_age: np.ndarray | None = None) -> float:
        """Mean over levels of the pinball loss (units) of this table's quantiles on the cases (`peak_cases`) of
        the jobs of `jobs` (held-out sequences: validation, never test), keyed as the table is (the labels
        `labels_by_age` serves where it uses labels)."""
        cases = peak_cases(jobs, labels_by_age if self.use_labels else None)
        err = cases["target"][None, :] - self.case_quantiles(cases)
        tau = np.asarray(self.levels)[:, None]
        return float(np.maximum(tau * err, (tau - 1) * err).mean())

    def case_quantiles(self, cases: dict[str, np.ndarray]) -> np.ndarray:
        """(L, N) every level's quantile for N cases of `peak_cases` (each case's cell, keyed as the table is)."""
        cell = self._cell(
            cases["request"],
            cases["peak_idx"],
            cases["bucket"],
            cases["label"],
            cases["remaining"],
            cases["at_peak"],
        )
        return self.values[(slice(None), cases["resource"], *cell)]

    @property
    def n_peak(self) -> int:
        """C + 2: the peak-so-far indices of one at-peak half of the values' fourth axis."""
        return self.values.shape[2] + 1

    def _cell(self, request, peak_idx, bucket, label, remaining, at_peak=None) -> tuple[np.ndarray, ...]:
        """The (request, peak so far and at peak now, age bucket, label, remaining life) indices of `values` for
        jobs or cases, in their shapes: request and peak-so-far index clipped, an unknown or out-of-range label
        to the unknown cell, label, remaining life and at-peak index 0 where the table is not keyed by them (a
        job with nothing observed is never at its peak)."""
        n_r, _, _, n_e, _ = self.values.shape[2:]
        n_p = self.n_peak
        e_idx = np.where((label >= 0) & (label < n_e - 1), label, n_e - 1) if self.use_labels else 0 * label
        m_idx = remaining_bucket(remaining) if self.use_remaining else 0 * bucket
        p_idx = np.clip(peak_idx, 0, n_p - 1)
        if self.use_at_peak:
            p_idx = p_idx + n_p * ((p_idx > 0) & np.asarray(at_peak, dtype=bool))
        return np.clip(request, 0, n_r - 1), p_idx, bucket, e_idx, m_idx

    def forecaster(self, level: float, horizon: int) -> PeakQuantileForecaster:
        _level_index(self.levels, level)
        return PeakQuantileForecaster(table=self, level=level, horizon=int(horizon), levels=self.levels)


def _level_index(levels: tuple[float, ...], level: float) -> int:
    for i, lv in enumerate(levels):
        if abs(lv - level) < 1e-9:
            return i
    raise ValueError(f"PeakQuantileTable: level {level} was not fitted (fitted: {levels})")


def age_bucket(age: np.ndarray) -> np.ndarray:
    """Bucket index (`AGE_EDGES`) of each age in observed steps."""
    return np.searchsorted(np.asarray(AGE_EDGES), np.asarray(age, dtype=np.int64), side="right") - 1


def remaining_bucket(remaining: np.ndarray) -> np.ndarray:
    """Bucket index (`REMAINING_EDGES`) of each remaining life in steps (below 1 counts as 1)."""
    r = np.maximum(np.asarray(remaining, dtype=np.int64), 1)
    return np.searchsorted(np.asarray(REMAINING_EDGES), r, side="right") - 1


def peak_cases(train: JobBatch, labels_by_age: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The training cases (module docstring) of every real job of `train`: columns resource, request, peak_idx
    (0 = nothing observed, else peak so far + 1), bucket, label, target (remaining peak), remaining (steps left
    to the job's end), each (n_cases,).
    `labels_by_age` (B, J, A), when given, is the label a labeller serves each job after a = 0 .. A - 1 observed
    steps in its own count (`models.ec_labeller.ClassifierLabeller.label_table`; ages past A - 1 keep the last):
    a case takes the label the scheduler sees beside that case's peak so far, so the table is fitted on the view
    it is served. The two counts differ by one: a forecast reads steps start .. t (`sim.forecast.n_observed`),
    the labeller steps start .. t - 1 (`sim.labelling.observed_steps`), so a case at age a >= 1 takes the label
    of age a - 1 (at a = 0, arrival, the meta-only label). None: every case takes the job's clustering label.
    Column at_peak: 1 where the job's usage at its last observed step (age a - 1) is its peak so far (0 at a = 0);
    column first: the job's usage at its first step (`sim.rise_shift.fit_rise_amount` scales the rise above it)."""
    is_real = train.is_real
    b_idx, j_idx = np.nonzero(is_real & (train.duration > 0))
    if b_idx.size == 0:
        raise ValueError("fit_peak_quantiles: the training sequences hold no real job (empty training split)")
    u = train.usage[b_idx, j_idx].astype(np.int64)  # (N, T, D)
    prefix = np.maximum.accumulate(u, axis=1)
    suffix = np.maximum.accumulate(u[:, ::-1], axis=1)[:, ::-1]
    dur = train.duration[b_idx, j_idx]
    request = train.request[b_idx, j_idx].astype(np.int64)
    if labels_by_age is not None and labels_by_age.shape[:2] != train.ec_label.shape:
        raise ValueError(
            f"peak_cases: labels_by_age has shape {labels_by_age.shape}, the batch's jobs are {train.ec_label.shape}"
        )
    served = None if labels_by_age is None else labels_by_age[b_idx, j_idx].astype(np.int64)  # (N, A)
    label = train.ec_label[b_idx, j_idx].astype(np.int64)
    cols: dict[str, list] = {
        k: []
        for k in (
            "resource",
            "request",
            "peak_idx",
            "bucket",
            "label",
            "target",
            "remaining",
            "at_peak",
            "first",
        )
    }
    n_d = u.shape[2]
    for a in AGE_GRID:
        rows = np.flatnonzero(dur > a)
        if rows.size == 0:
            break
        target = suffix[rows, a]  # (n, D)
        peak_idx = prefix[rows, a - 1] + 1 if a > 0 else np.zeros_like(target)
        at_peak = u[rows, a - 1] >= prefix[rows, a - 1] if a > 0 else np.zeros(target.shape, dtype=bool)
        bucket = int(age_bucket(np.array([a]))[0])
        for d in range(n_d):
            cols["resource"].append(np.full(rows.size, d))
            cols["request"].append(request[rows, d])
            cols["peak_idx"].append(peak_idx[:, d])
            cols["bucket"].append(np.full(rows.size, bucket))
            label_age = min(max(a - 1, 0), served.shape[1] - 1) if served is not None else 0
            cols["label"].append(label[rows] if served is None else served[rows, label_age])
            cols["target"].append(target[:, d])
            cols["remaining"].append(dur[rows] - a)
            cols["at_peak"].append(at_peak[:, d])
            cols["first"].append(u[rows, 0, d])
    return {k: np.concatenate(v).astype(np.int64) for k, v in cols.items()}


def _group_quantiles(keys: np.ndarray, target: np.ndarray, levels):
    """(unique keys, counts, (L, G) "higher" quantiles of `target` per key group); keys (N,) int64."""
    order = np.lexsort((target, keys))
    k_sorted, t_sorted = keys[order], target[order]
    starts = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
    counts = np.diff(np.r_[starts, k_sorted.size])
    quant = np.stack(
        [
            t_sorted[starts + np.clip(np.ceil(lv * counts).astype(np.int64) - 1, 0, counts - 1)]
            for lv in levels
        ]
    )
    return k_sorted[starts], counts, quant.astype(np.float64)


def fit_peak_quantiles(
    train: JobBatch,
    cfg: SimConfig,
    levels: tuple[float, ...] = DEFAULT_LEVELS,
    use_labels: bool = True,
    min_count: int = 30,
    labels_by_age: np.ndarray | None = None,
    use_remaining: bool = False,
    use_at_peak: bool = False,
) -> PeakQuantileTable:
    """The table of remaining-peak quantiles (module docstring) fitted on the sequences `train` (TRAINING ones:
    nothing of a test sequence may reach it), keyed by the clustering labels or, given `labels_by_age`, by the
    labels a labeller serves at each age (`peak_cases`); with `use_remaining`, by each case's remaining life too
    (module docstring); with `use_at_peak`, by whether the job is at its peak so far now, at every level of the
    back-off (module docstring). ValueError on an empty split, a level outside (0, 1] or
    min_count below 1."""
    if any(not 0.0 < lv <= 1.0 for lv in levels):
        raise ValueError(f"fit_peak_quantiles: levels must be in (0, 1], got {levels}")
    if min_count < 1:
        raise ValueError(f"fit_peak_quantiles: min_count must be >= 1, got {min_count}")
    cases = peak_cases(train, labels_by_age if use_labels else None)
    n_d = len(cfg.capacity_units)
    cap = int(max(cfg.capacity_units))
    n_r, n_p, n_b = cap + 1, cap + 2, len(AGE_EDGES)
    n_e = (int(cfg.n_labels) + 1) if use_labels else 1
    n_m = len(REMAINING_EDGES) if use_remaining else 1
    n_f = 2 if use_at_peak else 1
    shape = (n_d, n_r, n_p, n_f, n_b, n_e, n_m)
    r = np.clip(cases["request"], 0, n_r - 1)
    p = np.clip(cases["peak_idx"], 0, n_p - 1)
    e = np.clip(cases["label"], 0, n_e - 1) if use_labels else np.zeros_like(r)
    m = remaining_bucket(cases["remaining"]) if use_remaining else np.zeros_like(r)
    f = (cases["at_peak"] > 0).astype(np.int64) if use_at_peak else np.zeros_like(r)
    idx = {"d": cases["resource"], "r": r, "p": p, "f": f, "b": cases["bucket"], "e": e, "m": m}
    dims = {"d": n_d, "r": n_r, "p": n_p, "f": n_f, "b": n_b, "e": n_e, "m": n_m}
    # the prior of an empty cell: max(request, peak so far), i.e. request-based packing
    req_grid = np.arange(n_r)[:, None]
    peak_grid = np.r_[0, np.arange(n_p - 1)][None, :]  # index 0 (none) -> 0, index i -> i - 1
    prior = np.maximum(req_grid, peak_grid).astype(np.float64)  # (R, P)
    values = np.broadcast_to(prior[None, None, :, :, None, None, None, None], (len(levels), *shape)).copy()
    hierarchy = [("d", "r"), ("d", "r", "p"), ("d", "r", "p", "b")]
    if use_remaining:  # every cell but the coarsest knows how long the job has left
        hierarchy = [("d", "r"), ("d", "r", "m"), ("d", "r", "p", "m"), ("d", "r", "p", "b", "m")]
    if use_labels:
        hierarchy.append((*hierarchy[-1], "e"))
    if use_at_peak:  # never pooled with the other half: a thin cell backs off within its own half
        hierarchy = [(*names, "f") for names in hierarchy]
    own_cell = np.zeros(r.size, dtype=bool)
    for names in hierarchy:
        names = tuple(n for n in "drpfbem" if n in names)  # the values' axis order
        sub_shape = tuple(dims[n] for n in names)
        keys = np.ravel_multi_index(tuple(idx[n] for n in names), sub_shape)
        uniq, counts, quant = _group_quantiles(keys, cases["target"], levels)
        ok = counts >= min_count
        dense = np.full((len(levels), int(np.prod(sub_shape))), np.nan)
        dense[:, uniq[ok]] = quant[:, ok]
        expand = [slice(None)] + [slice(None) if n in names else None for n in "drpfbem"]
        dense = dense.reshape(len(levels), *sub_shape)[tuple(expand)]
        values = np.where(np.isnan(dense), values, dense)
        own_cell = np.isin(keys, uniq[ok])
    # the at-peak axis folded into the peak-so-far axis: index f x (C + 2) + peak index (the kernels' layout)
    folded = np.moveaxis(values, 4, 3).reshape(len(levels), n_d, n_r, n_f * n_p, n_b, n_e, n_m)
    return PeakQuantileTable(
        values=np.ascontiguousarray(folded),
        levels=tuple(float(lv) for lv in levels),
        use_labels=use_labels,
        n_cases=int(r.size),
        share_own_cell=float(own_cell.mean()),
        use_remaining=use_remaining,
        use_at_peak=use_at_peak,
    )


def remaining_key_choice(table_of, validation: JobBatch, labels_by_age: np.ndarray | None = None) -> dict:
    """Whether a table keyed by remaining life pays (module docstring): {"use_remaining": the keyed table's pinball
    loss on the held-out sequences `validation` is the lower, "validation_pinball": {False: ..., True: ...}}, where
    `table_of(keyed)` gives each table fitted on the fit part (labels of `validation`: `labels_by_age`)."""
    loss = {keyed: table_of(keyed).pinball_loss(validation, labels_by_age) for keyed in (False, True)}
    return {"use_remaining": loss[True] < loss[False], "validation_pinball": loss}


@dataclass(frozen=True)
class PeakQuantileForecaster:
    """A point forecaster (`sim.forecast.is_point_forecaster`): each job's level-`level` remaining-peak quantile
    (`PeakQuantileTable`) held flat over steps t + 1 .. t + `horizon`, from its request, observed peak, age and
    observed label only."""

    table: PeakQuantileTable = field(repr=False)
    level: float = 0.95
    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    """The table's levels (a risk rule checks that its level is one of them; every level is this point)."""

    @property
    def reads_labels(self) -> bool:
        """Whether the forecast reads EC labels (`sim.labelling.reads_labels`): when the table is keyed by them."""
        return self.table.use_labels

    def point(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, H, D) the quantile at every step."""
        return spread_flat(self.flat(cfg, state, env, job), self.horizon)

    def flat(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, D) the quantile held at every step (`sim.forecast.flat_forecast`)."""
        n_obs, peak = observed_peak(state, env, job)  # NaN where nothing is observed (as job_view's life_max)
        request = state.jobs.request[env, job].astype(np.int64)
        labels = observed_labels(state)[env, job]
        return self.table.lookup(
            self.level,
            request,
            peak,
            n_obs,
            labels,
            _remaining(self.table, state, env, job, n_obs),
            observed_at_peak(self.table, state, env, job, n_obs, peak),
        )

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        return levels_of(self.point(cfg, state, env, job), len(self.levels))


@dataclass(frozen=True)
class RemainingPeakQuantiles:
    """Every level of a `PeakQuantileTable` as a `sim.forecast.UsageForecaster`: each level's remaining-peak
    quantile held flat over steps t + 1 .. t + `horizon`. What `forecast_peak` packs on, in the shape the forecast
    table scores (`models.usage_forecast.forecast_table`), with and without EC labels: the measured value of ECs
    to the rule's own forecaster. Scored per step it is an upper envelope (a bound for the rest of the job's life),
    so its coverage sits above nominal by design."""

    table: PeakQuantileTable = field(repr=False)
    horizon: int = 24

    @property
    def levels(self) -> tuple[float, ...]:
        return self.table.levels

    @property
    def reads_labels(self) -> bool:
        return self.table.use_labels

    def flat_levels(
        self, levels, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray
    ) -> np.ndarray:
        """(N, L, D) float64 the quantiles of `levels` held at every step (`sim.forecast.flat_level_forecast`):
        no horizon axis."""
        n_obs, peak = observed_peak(state, env, job)
        request = state.jobs.request[env, job].astype(np.int64)
        labels = observed_labels(state)[env, job]
        remaining = _remaining(self.table, state, env, job, n_obs)
        at_peak = observed_at_peak(self.table, state, env, job, n_obs, peak)
        return self.table.lookup_levels(levels, request, peak, n_obs, labels, remaining, at_peak).astype(
            np.float64
        )

    def forecast(self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N, L, H, D) each level's quantile at every step."""
        flat = self.flat_levels(self.levels, cfg, state, env, job)
        return np.ascontiguousarray(
            np.broadcast_to(flat[:, :, None, :], (flat.shape[0], flat.shape[1], self.horizon, flat.shape[2]))
        ).astype(np.float64)


def _remaining(table: PeakQuantileTable, state: State, env: np.ndarray, job: np.ndarray, n_obs: np.ndarray):
    """(N,) steps from now to each job's known end (its duration less its `n_obs` observed steps; a queued job's
    whole duration) where the table is keyed by remaining life, else None (the duration is not read)."""
    if not table.use_remaining:
        return None
    return state.jobs.duration[env, job].astype(np.int64) - n_obs


def observed_at_peak(
    table: PeakQuantileTable,
    state: State,
    env: np.ndarray,
    job: np.ndarray,
    n_obs: np.ndarray,
    peak: np.ndarray,
) -> np.ndarray | None:
    """(N, D) whether each job's usage at its last observed step is its peak so far (`peak`, NaN where nothing is
    observed: False there), for a table keyed by it; None for one that is not (observed usage only: step n_obs - 1
    of the job's life, as the peak so far reads)."""
    if not table.use_at_peak:
        return None
    last = np.clip(n_obs - 1, 0, state.jobs.usage.shape[2] - 1)
    now = state.jobs.usage[env, job, last].astype(np.float64)  # (N, D)
    with np.errstate(invalid="ignore"):
        return (n_obs[:, None] > 0) & (now >= peak)
