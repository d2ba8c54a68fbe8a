"""A calibrated conditional usage forecaster (issue 22, item 1) and the baselines it is measured against.

For a job arriving or running at decision step t it gives quantiles (`ForecastConfig.levels`, at least 50/90/95/99 %)
of its CPU and memory units at steps t + 1 .. t + H, in the simulator's quantised units. Everything it reads comes
from `sim.forecast.job_view` (observed usage only), at serve time and at training time alike:

- Training examples are cut from the real jobs of a JobBatch of TRAINING sequences at several origins: every job at
  n_observed = 0 (not placed yet: forecast ages 1 .. H) and at `origins_per_job` ages drawn uniformly from
  1 .. duration - 1 (forecast ages n_observed .. n_observed + H - 1). `origin_state` builds a `sim.core.State` in
  which the chosen jobs have run exactly that long, and `job_view` of that state is the forecaster's input, so the
  features come from the same function and the same view at fit and at serve time. Targets are the true units at
  the target ages; ages past the job's end are masked out of the loss (not zero-filled).
- Features (`view_features`; all usage as a fraction of s = max(request, 1) per resource): request / C; log1p of
  n_observed, flags for "nothing observed" and "window not full"; the last observed value; mean, max and std of the
  last `n_short` observed steps; the least-squares slope over the recent window; life max and mean; seasonal values
  for every target step: the value at the most recent observed age of the same phase, for `period_steps` (a fixed
  period, e.g. a day) and for the job's own period (the lag of the largest autocorrelation of its recent window,
  with that autocorrelation and the period as inputs; the last observed value where no such age was observed);
  meta (NaN -> 0, plus is-known flags); optionally (`raw_window`) the recent window itself and its observed mask.
  EC inputs (dropped exactly, and only, when `use_ec=False`): the one-hot observed label and the EC per-age prior
  `sim.profiles.learn_profiles(train).predict(label, target ages)` (mean usage / request of the label at that age).
- Model: an MLP (torch, seeded). Its head gives per resource softmax weights over K "anchors", simple forecasts of
  every target step (the request, the last value, the life mean, the two seasonal values, the EC prior when EC
  inputs are on), whose mix is the centre of every level; and, per target step and resource, a base offset plus
  softplus increments accumulated over the levels, so the quantiles never cross. The anchors give the net an easy
  path to "repeat what the job did one period ago" that a plain MLP of a few dozen training workloads does not find.
  Loss: pinball in units / C over the alive target steps, all levels. Adam with early stopping on validation
  workloads.
- Calibration: split-conformal, CQR-style: on held-out calibration WORKLOADS (the split is by workload id, never by
  row), per level, horizon step and resource, the additive shift (in fractions of s) that makes the calibration
  coverage reach the nominal level (the k-th smallest score (y - q) / s, k = ceil((n + 1) tau)); with
  `calibrate_by_origin` (the default) separately for jobs at arrival (nothing observed) and running jobs
  (Mondrian conformal: each origin covered on its own, not only their mix; a step with no calibration example of
  an origin takes the pooled shift), unless one set for both is significantly better on the calibration
  workloads themselves, cross-fitted by workload (`choose_shifts`; `choose_calibration`). After the shift
  the quantiles are clipped to [0, C] (to [0, request] when no training step used more than its request, as with
  the peak requests of `sim__job_sequences`: capping then never uncovers a step) and made non-decreasing over the
  levels again. Usage is whole units, so coverage of a level cannot be tuned finer than the mass of a job's most
  common value: where most steps sit exactly at the request (Bitbrains), coverage lands above nominal.
- Inference is numpy on the exported weights (no torch at serve time).

Baselines (same `UsageForecaster` Protocol): `RequestForecaster`, `EcAgeQuantileForecaster`,
`SeasonalNaiveForecaster`, `LastPeriodMaxForecaster`. `forecast_table` scores any forecasters on test sequences
(pinball loss and coverage per horizon step, level and resource); `forecast_tables_by_source` does it per (source,
load) of a `sim__job_sequences` frame, fitting on its training split only.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
import polars as pl
import torch
from threadpoolctl import ThreadpoolController
from torch import nn

from models.forecaster import torch_threads
from models.training import init_parameters
from pipelines.synthetic import SYNTHETIC_WORKLOADS
from pipelines.workloads import workload_groups
from sim.config import SimConfig
from sim.core import State, relabel
from sim.forecast import DEFAULT_LEVELS, JobView, UsageForecaster, job_view
from sim.jobs import JobBatch
from sim.labelling import Labeller, labels_by_age
from sim.profiles import EcProfiles, learn_profiles
from sim.risk import RequestForecaster  # the request as every quantile: one class for the rules and the table

RESOURCES = ("cpu", "mem")
"""Resource names in the simulator's order (D = 2)."""

FORECAST_TABLE = {
    "forecaster": pl.String,
    "origin": pl.String,  # "arrival" (nothing observed, forecast as if placed now) or "running"
    "horizon_step": pl.Int32,  # h: the forecast of step t + h, 1..H
    "level": pl.Float64,
    "resource": pl.String,
    "n": pl.Int64,  # alive test target steps scored
    "pinball_units": pl.Float64,  # mean pinball loss, units of C_d
    "pinball_frac": pl.Float64,  # the same / C_d
    "coverage": pl.Float64,  # share of target steps with true units <= the quantile
}
"""One row per (forecaster, origin kind, horizon step, level, resource) of `forecast_table`."""

STANDARD_CLIP = 10.0
"""Standardised inputs are clipped to +- this many training standard deviations."""
_CHUNK = 4096
"""Jobs per job_view call while building examples and scoring (bounds the (N, T_max, D) copy job_view makes)."""


@dataclass(frozen=True)
class ForecastConfig:
    """The learned forecaster's inputs, size, training budget and calibration."""

    horizon: int = 24
    """H: steps t + 1 .. t + H are forecast (24 one-hour steps: a day)."""
    levels: tuple[float, ...] = DEFAULT_LEVELS
    """Quantile levels, ascending, within (0, 1)."""
    n_recent: int = 48
    """R: observed steps the forecaster reads (job_view's recent window); >= period_steps."""
    n_short: int = 6
    """Last observed steps summarised by mean, max and std (the level now)."""
    period_steps: int | None = 24
    """A fixed period of usage in steps (24: daily at one-hour steps) for the seasonal input; None: none."""
    use_ec: bool = True
    """Feed the EC inputs (observed label one-hot and the EC per-age prior); False drops exactly these."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the MLP (ReLU)."""
    epochs: int = 40
    """Most passes over the training examples."""
    patience: int = 4
    """Epochs without a better validation loss before training stops (the best epoch's weights are kept)."""
    batch_size: int = 256
    """Examples per Adam step."""
    lr: float = 2e-3
    """Adam learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    raw_window: bool = False
    """Feed the raw recent window and its observed mask (besides its summaries); off by default: on DeepPlace it
    gave no gain over the summaries and seasonal inputs."""
    origins_per_job: int = 3
    """Origins drawn per training job besides n_observed = 0 (ages uniform in 1 .. duration - 1)."""
    max_examples: int = 40_000
    """Examples kept (drawn without replacement) from all origins of all training jobs."""
    calibration_share: float = 0.25
    """Share of the training WORKLOADS held out for conformal calibration."""
    calibrate_by_origin: bool = True
    """Conformal shifts per origin (`ORIGINS`: at arrival, running) instead of one set for both: a single set
    covered the mix while over-covering arrivals (0.97-1.00 at 95 % on the sample's real sources) and
    under-covering running jobs (0.88-0.95)."""
    choose_calibration: bool = True
    """With `calibrate_by_origin`: keep the per-origin shifts unless they are significantly worse than the pooled
    ones on the calibration part itself, cross-fitted by workload (`choose_shifts`: shifts from half of the
    calibration workloads, pinball loss on each workload of the other half, both ways, over several deals; paired
    by workload). Per origin lowered pinball on the real sources and raised it 4-9 %
    on DeepPlace, whose arrivals are a dozen calibration templates unlike the test ones (0.90-0.93 covered at
    95 %)."""
    validation_share: float = 0.15
    """Share of the training workloads held out for early stopping."""
    n_threads: int | None = 1
    """torch intra-op threads while fitting (restored after); None leaves torch's setting."""
    seed: int = 0
    """Seeds origins, example draw, workload split, initialisation and shuffling."""

    def __post_init__(self) -> None:
        levels = np.asarray(self.levels, dtype=np.float64)
        if self.horizon < 1 or self.n_recent < 2 or not 1 <= self.n_short <= self.n_recent or not self.hidden:
            raise ValueError(
                f"ForecastConfig: need horizon >= 1, n_recent >= 2, 1 <= n_short <= n_recent and hidden layers; got "
                f"horizon={self.horizon}, n_recent={self.n_recent}, n_short={self.n_short}, hidden={self.hidden}"
            )
        if len(levels) == 0 or (levels <= 0).any() or (levels >= 1).any() or (np.diff(levels) <= 0).any():
            raise ValueError(f"ForecastConfig.levels must be ascending within (0, 1), got {self.levels}")
        if self.period_steps is not None and not 1 <= self.period_steps <= self.n_recent:
            raise ValueError(
                f"ForecastConfig.period_steps={self.period_steps} must be in 1..n_recent ({self.n_recent}) "
                "(the seasonal input reads the value one period back from the recent window)"
            )
        if not (0 < self.calibration_share < 1 and 0 < self.validation_share < 1):
            raise ValueError("ForecastConfig: calibration_share and validation_share must be within (0, 1)")


FORECAST_PRESETS = {
    "default": ForecastConfig(),
    "sample": ForecastConfig(hidden=(32, 32), epochs=20, max_examples=12_000, origins_per_job=2),
}
"""Named configurations: "sample" is small enough for tests and the sample run on 2 cores."""


# --- the view at chosen origins ------------------------------------------------------------------------------


def origin_state(sim_cfg: SimConfig, jobs: JobBatch, n_observed: np.ndarray) -> State:
    """A simulator State in which job (b, j) has run `n_observed[b, j]` steps (0 = not placed yet) at the current
    step t, for `job_view` and forecasters to read. Only the fields job_view and forecasters read (t, job_machine,
    job_start, the jobs) are meaningful; the cluster itself (timeline, penalties) is empty."""
    n_obs = np.clip(np.asarray(n_observed, dtype=np.int64), 0, jobs.duration)
    n_env, n_job, n_res = jobs.batch_size, jobs.max_jobs, jobs.n_resources
    t = np.full(n_env, max(jobs.max_duration, 1), dtype=np.int64)
    is_placed = n_obs > 0
    zeros = np.zeros(n_env, dtype=np.int64)
    return State(
        jobs=jobs,
        t=t,
        next_job=zeros,
        n_arrived=jobs.n_jobs.astype(np.int64),
        timeline=np.zeros((n_env, 1, sim_cfg.n_machines, n_res), dtype=np.int32),
        overlap=np.zeros((n_env, 1), dtype=np.int64),
        past=np.zeros((n_env, 0, sim_cfg.n_machines, n_res), dtype=np.float32),
        busy_until=np.zeros((n_env, sim_cfg.n_machines), dtype=np.int64),
        job_machine=np.where(is_placed, 0, -1).astype(np.int64),
        job_start=np.where(is_placed, t[:, None] - n_obs + 1, -1).astype(np.int64),
        has_overshot=np.zeros((n_env, n_job, n_res), dtype=bool),
        noise=None,
        is_terminated=np.zeros(n_env, dtype=bool),
        is_truncated=np.zeros(n_env, dtype=bool),
        penalty_totals=np.zeros((n_env, 4), dtype=np.float64),
        n_clipped=zeros,
    )


def served_origin_state(
    sim_cfg: SimConfig, jobs: JobBatch, n_observed: np.ndarray, labeller: Labeller | None
) -> State:
    """`origin_state`, relabelled with what `labeller` serves each job after its observed steps (every job of an
    origin state is one it labels: `sim.labelling.labelled_jobs`); None keeps the clustering labels."""
    state = origin_state(sim_cfg, jobs, n_observed)
    return state if labeller is None else relabel(sim_cfg, state, labeller.labels(sim_cfg, state))


def first_target_age(n_observed: np.ndarray) -> np.ndarray:
    """Age of step t + 1: n_observed for a running job, 1 for one not placed yet (forecast as if placed now)."""
    return np.maximum(np.asarray(n_observed, dtype=np.int64), 1)


def true_targets(jobs: JobBatch, env: np.ndarray, job: np.ndarray, n_observed: np.ndarray, horizon: int):
    """(units (N, H, D) float64, alive (N, H) bool): the jobs' TRUE usage at steps t + 1 .. t + H; for training
    targets and scoring only, never a forecaster input."""
    ages = first_target_age(n_observed)[:, None] + np.arange(horizon)[None, :]
    alive = ages < jobs.duration[env, job][:, None]
    units = jobs.usage[env[:, None], job[:, None], np.clip(ages, 0, jobs.max_duration - 1)].astype(np.float64)
    return units * alive[..., None], alive


def _origins(jobs: JobBatch, n_draws: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per round, (B, J) n_observed: round 0 is 0 everywhere (arrival); rounds 1..n_draws draw uniformly from
    1 .. duration - 1 (-1 marks a job too short to have a running origin with a future step)."""
    rounds = [np.zeros(jobs.duration.shape, dtype=np.int64)]
    for _ in range(n_draws):
        hi = np.maximum(jobs.duration, 2)
        draw = rng.integers(1, hi)
        rounds.append(np.where(jobs.duration >= 2, draw, -1))
    return rounds


# --- features -------------------------------------------------------------------------------------------------


def _masked_stats(x0: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mean, max, std, count) over axis 1 of x0 (N, K, D) where seen (N, K); 0 where nothing is seen."""
    w = seen[..., None].astype(np.float64)
    cnt = w.sum(axis=1)
    mean = (x0 * w).sum(axis=1) / np.maximum(cnt, 1.0)
    mx = np.where(seen[..., None], x0, -np.inf).max(axis=1)
    mx = np.where(cnt > 0, mx, 0.0)
    std = np.sqrt(((x0 - mean[:, None]) ** 2 * w).sum(axis=1) / np.maximum(cnt, 1.0))
    return mean, mx, std, cnt


def _slope(x0: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """(N, D) least-squares slope per step over the observed positions of the window (x0 is 0 elsewhere); 0 with
    fewer than 2 observed."""
    w = seen.astype(np.float64)
    pos = np.arange(x0.shape[1], dtype=np.float64)
    sw, sp, spp = w.sum(axis=1), w @ pos, w @ pos**2
    sx, spx = x0.sum(axis=1), np.einsum("nrd,r->nd", x0, pos)
    var = (sw * spp - sp**2)[:, None]
    cov = sw[:, None] * spx - sp[:, None] * sx
    return np.divide(cov, var, where=var > 1e-9, out=np.zeros_like(cov))


def estimated_period(x0: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(period (N, D) int64, strength (N, D) float64): the lag 2 .. R // 2 with the largest (biased)
    autocorrelation of the observed recent window, and that autocorrelation (0 and period 1 when the window is
    flat or too short)."""
    n, r, d = x0.shape
    w = seen[..., None].astype(np.float64)
    mean = (x0 * w).sum(axis=1, keepdims=True) / np.maximum(w.sum(axis=1, keepdims=True), 1.0)
    xc = (x0 - mean) * w
    # all lags at once: the autocovariance is the inverse FFT of the power spectrum (zero-padded to 2R: no wrap)
    spec = np.fft.rfft(xc, n=2 * r, axis=1)
    acov = np.fft.irfft(spec * spec.conj(), n=2 * r, axis=1)[:, : r // 2 + 1]  # (N, lags 0..R//2, D)
    denom = acov[:, :1]
    acf = np.divide(acov, denom, where=denom > 1e-12, out=np.zeros_like(acov))[:, 2:]
    if acf.shape[1] == 0:
        return np.ones((n, d), dtype=np.int64), np.zeros((n, d))
    best_lag = acf.argmax(axis=1)
    best = np.take_along_axis(acf, best_lag[:, None], axis=1)[:, 0]
    period = np.where(best > 0, best_lag + 2, 1).astype(np.int64)
    best = np.maximum(best, 0.0)
    return period, best


def seasonal_values(
    x0: np.ndarray, seen: np.ndarray, n_observed: np.ndarray, horizon: int, period: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values (N, H, D), valid (N, H, D)): for each target step t + 1 + h, the window's value at the most recent
    OBSERVED age of the same phase (age a - k * period, k >= 1 the smallest that reaches an observed age). `x0`
    (N, R, D) is the recent window (position i = age n_observed - R + i), `period` (N, D) >= 1."""
    n_obs = np.asarray(n_observed, dtype=np.int64)
    r = x0.shape[1]
    ages = (first_target_age(n_obs)[:, None] + np.arange(horizon)[None, :])[:, :, None]  # (N, H, 1)
    per = np.maximum(np.asarray(period, dtype=np.int64), 1)[:, None, :]  # (N, 1, D)
    last = (n_obs - 1)[:, None, None]
    k = -((last - ages) // per)  # ceil((a - last) / p) >= 1 since a > last
    src = ages - k * per
    pos = src - n_obs[:, None, None] + r
    valid = (src >= 0) & (pos >= 0)
    pos_c = np.clip(pos, 0, r - 1)
    rows = np.arange(x0.shape[0])[:, None, None]
    cols = np.arange(x0.shape[2])[None, None, :]
    values = x0[rows, pos_c, cols]
    valid &= seen[rows, pos_c]
    return np.where(valid, values, 0.0), valid


@dataclass(frozen=True)
class _EcInputs:
    """What the EC inputs need at serve time: the per-age prior and the number of labels."""

    profiles: EcProfiles
    n_labels: int


def view_features(view: JobView, cfg: ForecastConfig, ec: _EcInputs | None) -> tuple[np.ndarray, np.ndarray]:
    """(x (N, F), anchors (N, K, H, D)) float64 inputs of the learned forecaster from a JobView (see the module
    docstring). Anchors are simple forecasts of every target step as fractions of s, which the network mixes:
    the request (1), the last observed value, the life mean, the seasonal value at the estimated period, the
    seasonal value at `period_steps` (when set) and the EC per-age prior (with EC inputs). `ec` None drops the EC
    inputs (one-hot label, per-age prior feature and anchor)."""
    n_obs, n, h = view.n_observed, view.size, cfg.horizon
    scale = np.maximum(view.request.astype(np.float64), 1.0)  # (N, D)
    x = view.recent / scale[:, None, :]
    seen = ~np.isnan(x).any(axis=2)
    x0 = np.where(seen[..., None], x, 0.0)
    last = x0[:, -1]
    mean_s, max_s, std_s, _ = _masked_stats(x0[:, -cfg.n_short :], seen[:, -cfg.n_short :])
    life_mean = np.nan_to_num(view.life_mean / scale)
    period, strength = estimated_period(x0, seen)
    est, est_ok = seasonal_values(x0, seen, n_obs, h, period)
    anchors = [
        np.ones((n, h, scale.shape[1])),
        _steps(last, h),
        _steps(life_mean, h),
        np.where(est_ok, est, last[:, None]),
    ]
    parts = [
        view.request / view.capacity,
        np.log1p(n_obs)[:, None],
        (n_obs == 0)[:, None],
        (n_obs < cfg.n_recent)[:, None],
        last,
        mean_s,
        max_s,
        std_s,
        _slope(x0, seen),
        np.nan_to_num(view.life_max / scale),
        life_mean,
        strength,
        period / cfg.n_recent,
        anchors[-1],
        est_ok,
    ]
    if cfg.raw_window:
        parts += [x0, seen]
    if cfg.period_steps is not None:
        fixed = np.full(scale.shape, cfg.period_steps, dtype=np.int64)
        sea, sea_ok = seasonal_values(x0, seen, n_obs, h, fixed)
        anchors.append(np.where(sea_ok, sea, last[:, None]))
        parts += [anchors[-1], sea_ok]
    is_known = ~np.isnan(view.meta)
    parts += [np.where(is_known, view.meta, 0.0), is_known]
    if ec is not None:
        one_hot, prior = _ec_features(view, cfg, ec)
        parts += [one_hot, prior]
        anchors.append(prior)
    x_all = np.concatenate([np.asarray(p, dtype=np.float64).reshape(n, -1) for p in parts], axis=1)
    return x_all, np.stack(anchors, axis=1)


def _steps(value: np.ndarray, horizon: int) -> np.ndarray:
    """(N, D) -> (N, H, D): the same value at every target step."""
    return np.repeat(value[:, None], horizon, axis=1)


def n_anchors(cfg: ForecastConfig) -> int:
    """K: anchors `view_features` gives under `cfg`."""
    return 4 + (cfg.period_steps is not None) + cfg.use_ec


def _ec_features(view: JobView, cfg: ForecastConfig, ec: _EcInputs) -> list[np.ndarray]:
    """One-hot observed label and the EC per-age prior (mean usage / request of the label at each target age)."""
    label = view.label
    if ((label < 0) | (label >= ec.n_labels)).any():
        bad = int(label[(label < 0) | (label >= ec.n_labels)][0])
        raise ValueError(
            f"usage forecaster: EC label {bad} outside the 0..{ec.n_labels - 1} it was trained on"
        )
    one_hot = np.zeros((view.size, ec.n_labels))
    one_hot[np.arange(view.size), label] = 1.0
    ages = first_target_age(view.n_observed)[:, None] + np.arange(cfg.horizon)[None, :]
    prior = ec.profiles.predict(label[:, None], ages)  # (N, H, D) fraction of request
    return [one_hot, prior]


# --- the network ----------------------------------------------------------------------------------------------


class _QuantileNet(nn.Module):
    """MLP -> (N, L, H, D) quantiles as fractions of s. The head gives, per resource, softmax weights over the K
    anchors (their mix is the centre of every level) and, per step and resource, a base offset plus softplus
    increments over the levels, so the quantiles never cross."""

    def __init__(
        self, n_in: int, hidden: tuple[int, ...], shape: tuple[int, int, int], n_anchor: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_in
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.shape, self.n_anchor = shape, n_anchor
        self.head = nn.Linear(width, int(np.prod(shape)) + n_anchor * shape[2])

    def forward(self, x: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(x))
        n_q = int(np.prod(self.shape))
        raw = out[:, :n_q].view(-1, *self.shape)
        gate = torch.softmax(out[:, n_q:].view(-1, self.n_anchor, 1, self.shape[2]), dim=1)
        centre = (gate * anchors).sum(dim=1)  # (N, H, D)
        steps = nn.functional.softplus(raw[:, 1:])
        offsets = torch.cat([raw[:, :1], raw[:, :1] + torch.cumsum(steps, dim=1)], dim=1)
        return centre[:, None] + offsets


@cache
def _blas() -> ThreadpoolController:
    """The BLAS libraries loaded (found once, on the first forecast)."""
    return ThreadpoolController()


def _numpy_forward(
    weights: tuple[tuple[np.ndarray, np.ndarray], ...], x: np.ndarray, anchors: np.ndarray, shape
) -> np.ndarray:
    """The exported `_QuantileNet` in numpy (float32 matmuls): (N, L, H, D) fractions of s."""
    # one BLAS thread: products this small are slower threaded, and much slower beside torch's spinning threads
    with _blas().limit(limits=1, user_api="blas"):
        h = x.astype(np.float32)
        for w, b in weights[:-1]:
            h = np.maximum(h @ w + b, 0.0)
        w, b = weights[-1]
        out = h @ w + b
    n_q = int(np.prod(shape))
    raw = out[:, :n_q].reshape(-1, *shape)
    logits = out[:, n_q:].reshape(len(out), anchors.shape[1], 1, shape[2])
    gate = np.exp(logits - logits.max(axis=1, keepdims=True))
    centre = (gate * anchors).sum(axis=1) / gate.sum(axis=1)
    inc = raw[:, 1:]
    steps = np.maximum(inc, 0.0) + np.log1p(np.exp(-np.abs(inc)))  # softplus, stable
    offsets = np.concatenate([raw[:, :1], raw[:, :1] + np.cumsum(steps, axis=1)], axis=1)
    return (centre[:, None] + offsets).astype(np.float64)


def pinball_loss(q: torch.Tensor, y: torch.Tensor, alive: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Mean pinball loss of quantiles q (N, L, H, D) against y (N, H, D) over the alive (N, H) steps, all levels
    and resources (same units as y)."""
    err = y[:, None] - q
    tau = levels[None, :, None, None]
    loss = torch.maximum(tau * err, (tau - 1.0) * err)
    w = alive[:, None, :, None].to(loss.dtype)
    return (loss * w).sum() / (w.sum() * q.shape[1] * q.shape[3]).clamp(min=1.0)


# --- examples, split, training, calibration -------------------------------------------------------------------


@dataclass(frozen=True)
class _Examples:
    x: np.ndarray  # (n, F) float64 features
    anchors: np.ndarray  # (n, K, H, D) anchor forecasts, fractions of s
    y: np.ndarray  # (n, H, D) true units
    alive: np.ndarray  # (n, H) bool
    scale: np.ndarray  # (n, D) max(request, 1)
    request: np.ndarray  # (n, D) requested units
    workload: np.ndarray  # (n,) object: workload id (the split's group)
    origin: np.ndarray  # (n,) int64: index into ORIGINS (0 at arrival: nothing observed; 1 running)

    def take(self, idx: np.ndarray) -> _Examples:
        return _Examples(
            self.x[idx],
            self.anchors[idx],
            self.y[idx],
            self.alive[idx],
            self.scale[idx],
            self.request[idx],
            self.workload[idx],
            self.origin[idx],
        )


ORIGINS = ("arrival", "running")
"""The origins calibrated apart (`ForecastConfig.calibrate_by_origin`): a job with nothing observed yet, one that
has run at least a step."""


def origin_index(n_observed: np.ndarray) -> np.ndarray:
    """(N,) index into ORIGINS of jobs with `n_observed` steps observed."""
    return (np.asarray(n_observed) > 0).astype(np.int64)


def _workload_of(jobs: JobBatch, env: np.ndarray, job: np.ndarray) -> np.ndarray:
    if not jobs.workload_ids:
        return np.array([f"row{b}/job{j}" for b, j in zip(env, job, strict=True)], dtype=object)
    return np.array([jobs.workload_ids[b][j] for b, j in zip(env, job, strict=True)], dtype=object)


def build_examples(
    sim_cfg: SimConfig,
    jobs: JobBatch,
    cfg: ForecastConfig,
    ec: _EcInputs | None,
    who: str,
    labeller: Labeller | None = None,
) -> _Examples:
    """Training examples from every real job of `jobs` at the origins of `_origins`, at most `max_examples` (a
    seeded draw): features of `job_view` of an `origin_state`, true targets, alive mask, scale, workload. With a
    `labeller` the origin state shows the labels it serves (`served_origin_state`), as the rules' states do."""
    rng = np.random.default_rng([cfg.seed, 1])
    is_real = jobs.is_real
    if not is_real.any():
        raise ValueError(f"{who}: empty training split: the job batch has no jobs to learn from")
    rounds = _origins(jobs, cfg.origins_per_job, rng)
    cand = [(r, *np.nonzero(is_real & (n_obs >= 0))) for r, n_obs in enumerate(rounds)]
    which = np.concatenate([np.full(len(b), r) for r, b, _ in cand])
    env = np.concatenate([b for _, b, _ in cand])
    job = np.concatenate([j for _, _, j in cand])
    if len(env) > cfg.max_examples:
        keep = np.sort(rng.choice(len(env), cfg.max_examples, replace=False))
        which, env, job = which[keep], env[keep], job[keep]
    parts = []
    for r, n_obs in enumerate(rounds):
        sel = which == r
        if not sel.any():
            continue
        state = served_origin_state(sim_cfg, jobs, np.maximum(n_obs, 0), labeller)
        for lo in range(0, int(sel.sum()), _CHUNK):
            e, j = env[sel][lo : lo + _CHUNK], job[sel][lo : lo + _CHUNK]
            view = job_view(sim_cfg, state, e, j, cfg.n_recent)
            y, alive = true_targets(jobs, e, j, view.n_observed, cfg.horizon)
            scale = np.maximum(view.request.astype(np.float64), 1.0)
            x, anchors = view_features(view, cfg, ec)
            req = view.request.astype(np.float64)
            origin = origin_index(view.n_observed)
            parts.append(_Examples(x, anchors, y, alive, scale, req, _workload_of(jobs, e, j), origin))
    ex = _Examples(*(np.concatenate([getattr(p, f) for p in parts]) for f in _Examples.__dataclass_fields__))
    has_target = ex.alive.any(axis=1)
    if not has_target.any():
        raise ValueError(f"{who}: empty training split: no training job has a step after any origin")
    return ex.take(np.flatnonzero(has_target))


def split_workloads(
    jobs: JobBatch, cfg: ForecastConfig, who: str, report: dict | None = None
) -> dict[str, int]:
    """Workload id -> part (0 train, 1 validation, 2 calibration) for every workload of the real jobs of `jobs`:
    whole workload groups go to one part (seeded draw; the days of one Google job are one group,
    `pipelines.workloads.workload_groups`; elsewhere a workload is its own). With fewer than 3 groups but 3 or
    more workloads (a tiny source: a few jobs' days) the split is by workload, the parts then sharing jobs; the
    unit used goes into `report["split_unit"]`. ValueError naming the forecaster with fewer than 3 workloads."""
    is_real = jobs.is_real
    ids = sorted(set(_workload_of(jobs, *np.nonzero(is_real)).astype(str).tolist()))
    groups, group_of = np.unique(workload_groups(ids), return_inverse=True)
    unit = "workload group"
    if len(groups) < 3 <= len(ids):
        groups, group_of, unit = (
            np.asarray(ids),
            np.arange(len(ids)),
            "workload (fewer than 3 workload groups)",
        )
    if report is not None:
        report["split_unit"] = unit
    n = len(groups)
    n_cal = max(1, int(round(cfg.calibration_share * n)))
    n_val = max(1, int(round(cfg.validation_share * n)))
    if n - n_cal - n_val < 1:
        raise ValueError(
            f"{who}: {n} training workload(s) are too few for a train / validation / calibration split by "
            "workload (need at least 3)"
        )
    order = np.random.default_rng([cfg.seed, 2]).permutation(n)
    part = np.zeros(n, dtype=np.int64)
    part[order[:n_cal]] = 2
    part[order[n_cal : n_cal + n_val]] = 1
    return dict(zip(ids, part[group_of.reshape(-1)].tolist(), strict=True))


def profiles_of_part(
    jobs: JobBatch, parts: dict[str, int], n_labels: int, labels_by_age: np.ndarray | None = None
) -> EcProfiles:
    """EC per-age profiles learned from the jobs of the TRAIN part only (the calibration and validation
    workloads must not see their own usage through the prior); a label none of whose jobs is in that part uses
    the all-jobs profile, as `learn_profiles` does for a label without jobs. `labels_by_age`: the labels a
    labeller serves by age (`sim.profiles.learn_profiles`), None for the clustering labels."""
    is_real = jobs.is_real
    b, j = np.nonzero(is_real)
    in_part = np.zeros(jobs.duration.shape, dtype=bool)
    in_part[b, j] = np.array([parts[w] == 0 for w in _workload_of(jobs, b, j).astype(str)], dtype=bool)
    kept = replace(
        jobs, duration=np.where(in_part, jobs.duration, 0)
    )  # duration 0: no age is learned from it
    prof = learn_profiles(kept, n_labels, max(jobs.max_duration, 1), labels_by_age=labels_by_age)
    if labels_by_age is not None:  # n_jobs counts only the jobs shown each label while alive: kept's
        return prof
    unseen = np.bincount(jobs.ec_label[in_part], minlength=n_labels) == 0
    counts = prof.counts.sum(axis=0)
    sums = (prof.fraction * prof.counts).sum(axis=0)
    fraction = prof.fraction.copy()
    fraction[unseen] = np.divide(sums, counts, where=counts > 0, out=np.zeros(sums.shape))
    n_jobs = np.where(unseen, 0, prof.n_jobs)
    return replace(prof, fraction=fraction, n_jobs=n_jobs)


def _train_network(
    ex: _Examples, val: _Examples, cfg: ForecastConfig, capacity: np.ndarray, who: str
) -> tuple[_QuantileNet, dict]:
    """Adam on the pinball loss (units / C), early stopping on `val`; the best epoch's weights. ValueError naming
    the forecaster, epoch and iteration on a non-finite loss."""
    gen = torch.Generator().manual_seed(cfg.seed)
    shape = (len(cfg.levels), cfg.horizon, len(capacity))
    net = _QuantileNet(ex.x.shape[1], cfg.hidden, shape, ex.anchors.shape[1])
    init_parameters(net, gen)
    levels = torch.tensor(cfg.levels, dtype=torch.float32)

    def tensors(e: _Examples):
        cap = torch.tensor(capacity, dtype=torch.float32)
        return (
            torch.tensor(e.x, dtype=torch.float32),
            torch.tensor(e.anchors, dtype=torch.float32),
            torch.tensor(e.y, dtype=torch.float32) / cap,
            torch.tensor(e.alive),
            torch.tensor(e.scale, dtype=torch.float32)[:, None, None, :] / cap,
        )

    x, anc, y, alive, s = tensors(ex)
    vx, vanc, vy, valive, vs = tensors(val)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    best, best_state, bad, epoch = math.inf, None, 0, 0
    history = []
    for epoch in range(1, cfg.epochs + 1):
        # train
        net.train()
        order = torch.randperm(len(x), generator=gen)
        for it, lo in enumerate(range(0, len(order), cfg.batch_size), start=1):
            b = order[lo : lo + cfg.batch_size]
            loss = pinball_loss(net(x[b], anc[b]) * s[b], y[b], alive[b], levels)
            if not torch.isfinite(loss):
                raise ValueError(
                    f"{who}: training loss is {float(loss.detach())} at epoch {epoch}, iteration {it}"
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
        # validate
        net.eval()
        with torch.no_grad():
            vloss = float(pinball_loss(net(vx, vanc) * vs, vy, valive, levels))
        if not math.isfinite(vloss):
            raise ValueError(f"{who}: validation loss is {vloss} after epoch {epoch}")
        history.append(vloss)
        if vloss < best - 1e-7:
            best, bad = vloss, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    net.load_state_dict(best_state)
    return net, {"epochs_run": epoch, "best_val_pinball_frac": best, "val_history": history}


def conformal_shifts(
    q_frac: np.ndarray, ex: _Examples, levels: tuple[float, ...], by_origin: bool = False
) -> np.ndarray:
    """(L, H, D) additive shifts, fractions of s: per level tau, horizon step and resource, the k-th smallest
    score y / s - q over the n alive calibration steps, k = ceil((n + 1) tau) (the largest when k > n; 0 where
    n = 0): split-conformal, so at least a share tau of exchangeable new steps is covered. `by_origin`: (O, L, H,
    D), the same per origin (`ORIGINS`) over that origin's examples (Mondrian), the pooled shift where an origin
    has no alive example at a step."""
    pooled, per_origin = pooled_and_per_origin_shifts(q_frac, ex, levels, by_origin)
    return per_origin if by_origin else pooled


def pooled_and_per_origin_shifts(
    q_frac: np.ndarray, ex: _Examples, levels: tuple[float, ...], by_origin: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """(pooled (L, H, D), per origin (O, L, H, D), or None without `by_origin`): both kinds of `conformal_shifts`
    from one computation of the scores and of the pooled shifts (the per-origin ones fall back on them)."""
    score = ex.y[:, None] / ex.scale[:, None, None, :] - q_frac  # (n, L, H, D), once for every origin
    pooled = _shifts_over(score, ex.alive, levels, np.ones(len(score), dtype=bool), np.zeros(score.shape[1:]))
    if not by_origin:
        return pooled, None
    return pooled, np.stack(
        [_shifts_over(score, ex.alive, levels, ex.origin == o, pooled) for o in range(len(ORIGINS))]
    )


def _shifts_over(
    score: np.ndarray, alive: np.ndarray, levels: tuple[float, ...], among: np.ndarray, empty: np.ndarray
) -> np.ndarray:
    """`conformal_shifts` from the scores (n, L, H, D) of the alive (n, H) steps of the examples `among` (n,)
    bool; `empty`'s value (L, H, D) at a step with none."""
    shifts = empty.copy()
    for h in range(score.shape[2]):
        rows = alive[:, h] & among
        n = int(rows.sum())
        if n == 0:
            continue
        ordered = np.sort(score[rows, :, h], axis=0)  # (n, L, D)
        for li, tau in enumerate(levels):
            shifts[li, h] = ordered[min(math.ceil((n + 1) * tau), n) - 1, li]
    return shifts


def deal_halves(n_workloads: int, seed: int) -> np.ndarray:
    """(W,) 0 or 1 for each of `n_workloads` distinct workloads: a seeded deal into two halves of equal size
    (+-1)."""
    half = np.empty(n_workloads, dtype=np.int64)
    half[np.random.default_rng(seed).permutation(n_workloads)] = np.arange(n_workloads) % 2
    return half


CALIBRATION_DEALS = 5
"""Deals of the calibration workloads into halves that `choose_shifts` averages over."""


def choose_shifts(
    q_frac: np.ndarray,
    ex: _Examples,
    levels: tuple[float, ...],
    cap: np.ndarray,
    capacity: np.ndarray,
    seed: int,
    confidence: float = 0.95,
    n_deals: int = CALIBRATION_DEALS,
) -> tuple[bool, dict]:
    """(by_origin, facts): whether to keep the per-origin conformal shifts, from the calibration examples `ex`
    (raw quantiles `q_frac`, units capped at `cap` (n, D)) cross-fitted by workload. The workloads are dealt into
    two halves (`n_deals` seeded deals); in each deal each half's shifts, per origin and pooled, shift the other
    half's quantiles, scored by the pinball loss / C (`capacity`) per alive step (over levels and resources) of
    each held-out workload; a workload's difference (per origin - pooled) is its mean over the deals, every
    workload weighing the same. Per origin (Mondrian: each origin covered on its own) stays unless the
    `confidence` t-interval of the mean difference over workloads is above 0: the pooled shifts only where per
    origin is shown to carry worse to workloads it was not calibrated on. The workloads of one half share its
    shifts, so their differences are not independent and the interval is optimistic; averaging over deals
    keeps the choice from resting on one deal. The choice is made on the calibration examples the kept shifts
    are then computed on, so the split-conformal guarantee is for the choice's shifts given that choice. With
    fewer than 4 calibration workloads with alive steps there is nothing to cross-fit: per origin, as
    configured."""
    from scipy import stats

    names = ex.workload.astype(str)
    distinct, workload_of = np.unique(names, return_inverse=True)
    steps = np.bincount(workload_of, weights=ex.alive.sum(axis=1), minlength=distinct.size)
    scored = steps > 0
    if scored.sum() < 4:
        return True, {"calibration_choice": "per origin (too few calibration workloads to cross-fit)"}
    tau = np.asarray(levels, dtype=np.float64)[None, :, None, None]
    loss = {"pooled": np.zeros(distinct.size), "by_origin": np.zeros(distinct.size)}
    for deal in range(n_deals):
        fold = deal_halves(distinct.size, seed + deal)[workload_of]
        for f in (0, 1):
            fit, held = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            part = ex.take(held)
            pooled, per_origin = pooled_and_per_origin_shifts(q_frac[fit], ex.take(fit), levels)
            for key, shifts in (("pooled", pooled), ("by_origin", per_origin)):
                q = _to_units(q_frac[held] + shifts_for(shifts, part.origin), part.scale, cap[held])
                err = (part.y[:, None] - q) / capacity  # (n, L, H, D) in units / C
                per_example = (np.maximum(tau * err, (tau - 1.0) * err) * part.alive[:, None, :, None]).sum(
                    axis=(1, 2, 3)
                )
                loss[key] += np.bincount(workload_of[held], weights=per_example, minlength=distinct.size)
    per_step = {
        key: value[scored] / (n_deals * steps[scored] * len(levels) * len(capacity))
        for key, value in loss.items()
    }
    diff = per_step["by_origin"] - per_step["pooled"]
    half_width = stats.t.ppf(0.5 + confidence / 2, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
    by_origin = not diff.mean() - half_width > 0
    return by_origin, {
        "calibration_choice": "per origin" if by_origin else "pooled",
        "calibration_cross_fit": {
            "pinball_frac": {key: float(value.mean()) for key, value in per_step.items()},
            "by_origin_minus_pooled": [float(diff.mean() - half_width), float(diff.mean() + half_width)],
            "n_workloads": int(diff.size),
            "n_deals": n_deals,
        },
    }


def shifts_for(shifts: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """(N, L, H, D) (or (1, L, H, D)) conformal shifts of jobs of `origin` (N,) (`origin_index`): one set for
    all (L, H, D), or each job its origin's ((O, L, H, D), `ForecastConfig.calibrate_by_origin`)."""
    return shifts[None] if shifts.ndim == 3 else shifts[origin]


def _to_units(q_frac: np.ndarray, scale: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Fractions of s -> units, clipped to [0, cap] (cap (N, D) or (D,)), non-decreasing over the levels."""
    cap = np.asarray(cap, dtype=np.float64)
    cap = cap[:, None, None, :] if cap.ndim == 2 else cap
    units = q_frac * scale[:, None, None, :]
    np.minimum(units, cap, out=units)
    np.maximum(units, 0.0, out=units)
    for li in range(
        1, units.shape[1]
    ):  # running max over the levels (a few; faster than accumulate on axis 1)
        np.maximum(units[:, li], units[:, li - 1], out=units[:, li])
    return units


# --- the learned forecaster -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QuantileUsageForecaster:
    """The fitted, calibrated forecaster (`fit_usage_forecaster` makes one). Implements `UsageForecaster`."""

    cfg: ForecastConfig
    capacity: np.ndarray
    """(D,) C_d it was trained for."""
    weights: tuple[tuple[np.ndarray, np.ndarray], ...] = field(repr=False)
    """(W, b) per layer, float32, W of shape (in, out)."""
    x_mean: np.ndarray = field(repr=False)
    x_std: np.ndarray = field(repr=False)
    shifts: np.ndarray = field(repr=False)
    """Conformal shifts in fractions of max(request, 1): (O, L, H, D) per origin (`ORIGINS`), or (L, H, D) for
    every job (`ForecastConfig.calibrate_by_origin` off)."""
    ec: _EcInputs | None = field(repr=False)
    is_capped_at_request: bool = False
    """No training step used more than its job's request (peak requests), so quantiles are capped at the request."""
    report: dict = field(default_factory=dict, repr=False, compare=False)
    """Fit facts: examples per part, epochs run, validation loss, calibration coverage before/after, seconds."""

    @property
    def horizon(self) -> int:
        return self.cfg.horizon

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(self.cfg.levels)

    @property
    def name(self) -> str:
        return f"QuantileUsageForecaster(use_ec={self.cfg.use_ec}, horizon={self.cfg.horizon})"

    def forecast_fraction(self, view: JobView) -> np.ndarray:
        """(N, L, H, D) uncalibrated quantiles as fractions of max(request, 1)."""
        x, anchors = view_features(view, self.cfg, self.ec)
        x = _standardised(x, self.x_mean, self.x_std)
        return _numpy_forward(self.weights, x, anchors, (len(self.levels), self.horizon, len(self.capacity)))

    def forecast_view(self, view: JobView) -> np.ndarray:
        """(N, L, H, D) calibrated quantiles in units from a JobView."""
        scale = np.maximum(view.request.astype(np.float64), 1.0)
        shifted = self.forecast_fraction(view) + shifts_for(self.shifts, origin_index(view.n_observed))
        return _to_units(shifted, scale, self._cap(view.request))

    def _cap(self, request: np.ndarray) -> np.ndarray:
        """(N, D) largest units a quantile may take: C_d, or the request where training usage never exceeded it."""
        cap = np.broadcast_to(self.capacity.astype(np.float64), request.shape)
        return np.minimum(cap, request) if self.is_capped_at_request else cap

    def forecast(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        """(N, L, H, D) float64 units of steps t + 1 .. t + H (H = `horizon`, at most the trained one)."""
        h = self.horizon if horizon is None else int(horizon)
        if not 1 <= h <= self.horizon:
            raise ValueError(
                f"{self.name}: asked for a horizon of {h} steps; it was trained for 1..{self.horizon}"
            )
        if tuple(cfg.capacity_units) != tuple(self.capacity.tolist()):
            raise ValueError(
                f"{self.name}: trained for capacity {self.capacity.tolist()}, asked for {list(cfg.capacity_units)}"
            )
        view = job_view(cfg, state, env, job, self.cfg.n_recent)
        return self.forecast_view(view)[:, :, :h]


def fit_usage_forecaster(
    sim_cfg: SimConfig,
    train: JobBatch,
    cfg: ForecastConfig = ForecastConfig(),
    labeller: Labeller | None = None,
) -> QuantileUsageForecaster:
    """Fit and calibrate the learned forecaster on the TRAINING sequences `train` (see the module docstring).
    With `labeller`, the EC inputs (observed label and per-age prior) are fitted on the labels it serves at each
    age, the view `sim.labelling.ServedLabels` gives the forecaster at test time; None: the clustering labels.

    ValueError naming the forecaster on an empty training split, too few training workloads for the split by
    workload, or a non-finite loss (with its epoch and iteration)."""
    who = f"QuantileUsageForecaster(use_ec={cfg.use_ec}, horizon={cfg.horizon})"
    t0 = time.perf_counter()
    capacity = np.asarray(sim_cfg.capacity_units, dtype=np.int64)
    if not train.is_real.any():
        raise ValueError(f"{who}: empty training split: the job batch has no jobs to learn from")
    split: dict = {}
    parts = split_workloads(train, cfg, who, split)
    served = labels_by_age(labeller, sim_cfg, train) if cfg.use_ec else None
    ec = (
        _EcInputs(profiles_of_part(train, parts, sim_cfg.n_labels, served), sim_cfg.n_labels)
        if cfg.use_ec
        else None
    )
    ex = build_examples(sim_cfg, train, cfg, ec, who, labeller if cfg.use_ec else None)
    part = np.array([parts[w] for w in ex.workload.astype(str)])
    i_train, i_val, i_cal = (np.flatnonzero(part == k) for k in range(3))
    mean = ex.x[i_train].mean(axis=0)
    std = ex.x[i_train].std(axis=0)
    std = np.where(
        std > 1e-6, std, 1.0
    )  # constant in training (e.g. a label only other parts hold): not scaled up
    norm = replace(ex, x=_standardised(ex.x, mean, std))
    with torch_threads(cfg.n_threads):
        net, report = _train_network(norm.take(i_train), norm.take(i_val), cfg, capacity, who)
    weights = tuple(
        (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
        for m in net.modules()
        if isinstance(m, nn.Linear)
    )
    cal = norm.take(i_cal)
    shape = (len(cfg.levels), cfg.horizon, len(capacity))
    q_cal = _numpy_forward(weights, cal.x, cal.anchors, shape)
    is_capped = is_usage_within_request(train)
    cap = np.minimum(capacity, cal.request) if is_capped else np.broadcast_to(capacity, cal.request.shape)
    by_origin, choice = cfg.calibrate_by_origin, {}
    if by_origin and cfg.choose_calibration:
        by_origin, choice = choose_shifts(q_cal, cal, cfg.levels, cap, capacity, cfg.seed)
    shifts = conformal_shifts(q_cal, cal, cfg.levels, by_origin)
    q_shifted = q_cal + shifts_for(shifts, cal.origin)
    report |= split | {
        "n_examples": {"train": len(i_train), "validation": len(i_val), "calibration": len(i_cal)},
        "n_workloads": {
            part: len(set(ex.workload[i].tolist()))
            for part, i in (("train", i_train), ("calibration", i_cal))
        },
        "calibration_coverage_raw": _coverage(q_cal, cal, cfg.levels, cap),
        "calibration_coverage": _coverage(q_shifted, cal, cfg.levels, cap),
        "calibration_coverage_by_origin": {
            name: _coverage(q_shifted[i], cal.take(i), cfg.levels, cap[i])
            for o, name in enumerate(ORIGINS)
            if (i := np.flatnonzero(cal.origin == o)).size
        },
        "calibration_by_origin": bool(by_origin),
        **choice,
        "fit_s": time.perf_counter() - t0,
    }
    return QuantileUsageForecaster(cfg, capacity, weights, mean, std, shifts, ec, is_capped, report)


def _standardised(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x - mean) / std clipped to +-10: an input far outside training (an unseen label, a huge meta value) is
    bounded at serve time."""
    return np.clip((x - mean) / std, -STANDARD_CLIP, STANDARD_CLIP)


def is_usage_within_request(jobs: JobBatch) -> bool:
    """True when no step of any real job of `jobs` uses more units than the job's request (peak requests)."""
    is_real = jobs.is_real
    return bool((jobs.usage <= jobs.request[:, :, None, :])[is_real].all())


def _coverage(q_frac: np.ndarray, ex: _Examples, levels: tuple[float, ...], cap: np.ndarray) -> dict:
    """Share of alive steps (both resources) at or below each level's quantile, after the units conversion."""
    q = _to_units(q_frac, ex.scale, cap)
    hit = (ex.y[:, None] <= q + 1e-9) & ex.alive[:, None, :, None]
    n = max(int(ex.alive.sum()) * q.shape[3], 1)
    return {float(tau): float(hit[:, i].sum() / n) for i, tau in enumerate(levels)}


# --- baselines ------------------------------------------------------------------------------------------------


def _check_horizon(who: str, horizon: int | None, default: int) -> int:
    h = default if horizon is None else int(horizon)
    if h < 1:
        raise ValueError(f"{who}: horizon must be >= 1, got {h}")
    return h


def _repeat_levels(units: np.ndarray, n_levels: int) -> np.ndarray:
    """(N, H, D) -> (N, L, H, D): one value for every level."""
    return np.repeat(units[:, None], n_levels, axis=1)


@dataclass(frozen=True)
class SeasonalNaiveForecaster:
    """Each step's value one period earlier at the same phase (the most recent observed age a - k P); where that
    age was not observed, the last observed value; with nothing observed, the request. The same at every level."""

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    period_steps: int = 24
    """P: the season (24 one-hour steps: a day)."""

    def forecast(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        h = _check_horizon(type(self).__name__, horizon, self.horizon)
        view = job_view(cfg, state, env, job, max(self.period_steps, 1))
        seen = ~np.isnan(view.recent).any(axis=2)
        x0 = np.where(seen[..., None], view.recent, 0.0)
        period = np.full(view.request.shape, self.period_steps, dtype=np.int64)
        values, valid = seasonal_values(x0, seen, view.n_observed, h, period)
        fallback = np.where(view.n_observed[:, None] > 0, x0[:, -1], view.request.astype(np.float64))
        return _repeat_levels(np.where(valid, values, fallback[:, None, :]), len(self.levels))


@dataclass(frozen=True)
class LastPeriodMaxForecaster:
    """The largest units of the last P observed steps (fewer if fewer are observed) at every step and level;
    with nothing observed, the request."""

    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS
    period_steps: int = 24
    """P: steps looked back."""

    def forecast(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        h = _check_horizon(type(self).__name__, horizon, self.horizon)
        view = job_view(cfg, state, env, job, max(self.period_steps, 1))
        seen = ~np.isnan(view.recent).any(axis=2)
        peak = np.where(seen[..., None], view.recent, -np.inf).max(axis=1)
        value = np.where(view.n_observed[:, None] > 0, peak, view.request.astype(np.float64))
        return _repeat_levels(np.repeat(value[:, None], h, axis=1), len(self.levels))


@dataclass(frozen=True, eq=False)
class EcAgeQuantileForecaster:
    """Empirical quantiles of usage / request of the training jobs of the job's (observed) EC label at the target
    age, times the job's request. An (label, age) cell with fewer than `min_count` training values, and ages beyond
    the longest training job, use the label's quantiles over all ages; a label without training jobs uses all
    jobs'. `fit` learns it from TRAINING sequences."""

    table: np.ndarray = field(repr=False)
    """(G, A, L, D) quantile of usage / request per label, age, level and resource."""
    pooled: np.ndarray = field(repr=False)
    """(G, L, D) the label's quantiles over all ages."""
    horizon: int = 24
    levels: tuple[float, ...] = DEFAULT_LEVELS

    @staticmethod
    def fit(
        train: JobBatch,
        n_labels: int,
        horizon: int = 24,
        levels: tuple[float, ...] = DEFAULT_LEVELS,
        min_count: int = 20,
        labels_by_age: np.ndarray | None = None,
    ) -> EcAgeQuantileForecaster:
        """Learn the table from the real jobs of `train`; ValueError on an empty split or a label >= n_labels.
        `labels_by_age` (B, J, A): the label a labeller serves each job after a observed steps (ages past A - 1
        keep the last); a job's usage at age a then counts for the label it is served at that age. None: its
        clustering label at every age."""
        who = "EcAgeQuantileForecaster"
        is_real = train.is_real
        if not is_real.any():
            raise ValueError(f"{who}: empty training split: the job batch has no jobs to learn from")
        n_age = train.max_duration
        if labels_by_age is None:
            by_age = np.repeat(train.ec_label[is_real][:, None], n_age, axis=1)
        else:
            by_age = labels_by_age[is_real][:, np.minimum(np.arange(n_age), labels_by_age.shape[2] - 1)]
        labels = by_age[np.arange(n_age)[None, :] < train.duration[is_real][:, None]]
        if labels.size and (labels.max() >= n_labels or labels.min() < 0):
            raise ValueError(
                f"{who}: training labels span {labels.min()}..{labels.max()}, n_labels is {n_labels}"
            )
        req = train.request[is_real].astype(np.float64)[:, None, :]  # (n, 1, D)
        alive = np.arange(n_age)[None, :] < train.duration[is_real][:, None]
        ok = alive[..., None] & (req > 0)
        frac = np.where(ok, train.usage[is_real] / np.where(req > 0, req, 1.0), np.nan)  # (n, A, D)
        lv = np.asarray(levels, dtype=np.float64)
        with np.errstate(all="ignore"), warnings.catch_warnings(action="ignore", category=RuntimeWarning):
            overall = np.nanquantile(frac.reshape(-1, frac.shape[2]), lv, axis=0)
            pooled = np.repeat(np.nan_to_num(overall, nan=1.0)[None], n_labels, axis=0)
            table = np.repeat(pooled[:, None], n_age, axis=1)
            for g in np.unique(labels):
                fg = np.where(
                    (by_age == g)[..., None], frac, np.nan
                )  # (n, A, D): the label's (job, age) cells
                pooled[g] = np.nan_to_num(np.nanquantile(fg.reshape(-1, fg.shape[2]), lv, axis=0), nan=1.0)
                per_age = np.nanquantile(fg, lv, axis=0).transpose(1, 0, 2)  # (A, L, D)
                enough = (~np.isnan(fg)).sum(axis=0)[:, None, :] >= min_count  # (A, 1, D)
                table[g] = np.where(enough, per_age, pooled[g][None])
        return EcAgeQuantileForecaster(table=table, pooled=pooled, horizon=horizon, levels=tuple(levels))

    def forecast(
        self, cfg: SimConfig, state: State, env: np.ndarray, job: np.ndarray, horizon: int | None = None
    ) -> np.ndarray:
        who = type(self).__name__
        h = _check_horizon(who, horizon, self.horizon)
        view = job_view(cfg, state, env, job, 1)
        label = view.label
        if ((label < 0) | (label >= self.table.shape[0])).any():
            raise ValueError(f"{who}: EC label outside the 0..{self.table.shape[0] - 1} it was fitted on")
        ages = first_target_age(view.n_observed)[:, None] + np.arange(h)[None, :]  # (N, H)
        n_age = self.table.shape[1]
        frac = np.where(
            (ages < n_age)[..., None, None],
            self.table[label[:, None], np.clip(ages, 0, n_age - 1)],
            self.pooled[label][:, None],
        )  # (N, H, L, D)
        return frac.transpose(0, 2, 1, 3) * view.request.astype(np.float64)[:, None, None, :]


# --- scoring --------------------------------------------------------------------------------------------------


def fit_forecasters(
    sim_cfg: SimConfig,
    train: JobBatch,
    cfg: ForecastConfig = ForecastConfig(),
    baseline_period: int = 24,
    labeller: Labeller | None = None,
) -> dict[str, UsageForecaster]:
    """The learned forecaster with and without EC inputs, `forecast_peak`'s remaining-peak table with and without
    EC labels (`sim.peak_forecast.RemainingPeakQuantiles`) and the four baselines, fitted on `train` only; the
    ones with EC inputs on the labels `labeller` serves (None: the clustering labels)."""
    from sim.peak_forecast import RemainingPeakQuantiles, fit_peak_quantiles, remaining_key_choice
    from sim.tuning import TuningConfig, split_validation

    h, lv = cfg.horizon, tuple(cfg.levels)
    served = labels_by_age(labeller, sim_cfg, train)

    def peak(use_labels: bool) -> RemainingPeakQuantiles:
        """The remaining-life key kept where it lowers the pinball loss on validation sequences carved from
        `train` (`sim.tuning.split_validation`), as forecast_peak keeps it; the table then fitted on all of `train`,
        as every forecaster of the table is."""
        fit, validation = split_validation(train, TuningConfig.validation_share)

        def fitted(jobs: JobBatch, keyed: bool):
            labels = labels_by_age(labeller, sim_cfg, jobs) if use_labels else None
            return fit_peak_quantiles(
                jobs,
                sim_cfg,
                lv,
                use_labels,
                labels_by_age=labels,
                use_remaining=keyed,
                use_at_peak=TuningConfig.peak_at_peak_key,
            )

        held_out = labels_by_age(labeller, sim_cfg, validation) if use_labels else None
        keyed = remaining_key_choice(lambda k: fitted(fit, k), validation, held_out)["use_remaining"]
        return RemainingPeakQuantiles(fitted(train, keyed), h)

    return {
        "remaining_peak_with_ec": peak(True),
        "remaining_peak_without_ec": peak(False),
        "learned_with_ec": fit_usage_forecaster(sim_cfg, train, replace(cfg, use_ec=True), labeller),
        "learned_without_ec": fit_usage_forecaster(sim_cfg, train, replace(cfg, use_ec=False)),
        "request": RequestForecaster(h, lv),
        "ec_age_quantile": EcAgeQuantileForecaster.fit(train, sim_cfg.n_labels, h, lv, labels_by_age=served),
        "seasonal_naive": SeasonalNaiveForecaster(h, lv, baseline_period),
        "last_period_max": LastPeriodMaxForecaster(h, lv, baseline_period),
    }


def forecast_table(
    sim_cfg: SimConfig,
    test: JobBatch,
    forecasters: Mapping[str, UsageForecaster],
    *,
    horizon: int | None = None,
    origins_per_job: int = 3,
    seed: int = 0,
    labeller: Labeller | None = None,
) -> pl.DataFrame:
    """Pinball loss and coverage (FORECAST_TABLE rows) of fitted forecasters on the TEST sequences `test`: every
    real job at its arrival (nothing observed) and at `origins_per_job` running origins drawn (seeded) uniformly
    from ages 1 .. duration - 1, scored on the alive target steps t + 1 .. t + H. `horizon` defaults to the
    smallest of the forecasters'; a forecaster whose horizon is shorter is a ValueError naming it and both.
    `labeller`: the labels the forecasters see (`served_origin_state`); None: the clustering labels, which were
    computed from each workload's whole series."""
    if not forecasters:
        raise ValueError("forecast_table: no forecasters given")
    h = min(f.horizon for f in forecasters.values()) if horizon is None else int(horizon)
    for name, f in forecasters.items():
        if f.horizon < h:
            raise ValueError(
                f"forecast_table: forecaster {name!r} ({type(f).__name__}) forecasts {f.horizon} steps; the "
                f"table asks for a horizon of {h}"
            )
    n_res = test.n_resources
    acc = {
        name: {
            "loss": np.zeros((2, len(f.levels), h, n_res)),
            "hit": np.zeros((2, len(f.levels), h, n_res)),
            "n": np.zeros((2, h), dtype=np.int64),
        }
        for name, f in forecasters.items()
    }
    is_real = test.is_real
    for r, n_obs in enumerate(_origins(test, origins_per_job, np.random.default_rng([seed, 3]))):
        kind = 0 if r == 0 else 1
        env, job = np.nonzero(is_real & (n_obs >= 0))
        state = served_origin_state(sim_cfg, test, np.maximum(n_obs, 0), labeller)
        for lo in range(0, len(env), _CHUNK):
            e, j = env[lo : lo + _CHUNK], job[lo : lo + _CHUNK]
            y, alive = true_targets(test, e, j, n_obs[e, j], h)
            w = alive[:, None, :, None]
            for name, f in forecasters.items():
                q = np.asarray(f.forecast(sim_cfg, state, e, j), dtype=np.float64)[:, :, :h]
                if q.shape != (len(e), len(f.levels), h, n_res):
                    raise ValueError(f"forecast_table: forecaster {name!r} returned shape {q.shape}")
                tau = np.asarray(f.levels)[None, :, None, None]
                err = y[:, None] - q
                acc[name]["loss"][kind] += (np.maximum(tau * err, (tau - 1) * err) * w).sum(axis=0)
                acc[name]["hit"][kind] += ((y[:, None] <= q + 1e-9) & w).sum(axis=0)
                acc[name]["n"][kind] += alive.sum(axis=0)
    return _table_rows(acc, forecasters, np.asarray(sim_cfg.capacity_units, dtype=np.float64))


def _table_rows(acc: dict, forecasters: Mapping[str, UsageForecaster], capacity: np.ndarray) -> pl.DataFrame:
    rows = []
    for name, a in acc.items():
        for kind, origin in enumerate(("arrival", "running")):
            for li, tau in enumerate(forecasters[name].levels):
                for hi in range(a["n"].shape[1]):
                    n = int(a["n"][kind, hi])
                    for d in range(len(capacity)):
                        loss = a["loss"][kind, li, hi, d] / n if n else float("nan")
                        rows.append(
                            {
                                "forecaster": name,
                                "origin": origin,
                                "horizon_step": hi + 1,
                                "level": float(tau),
                                "resource": RESOURCES[d] if d < len(RESOURCES) else f"r{d}",
                                "n": n,
                                "pinball_units": loss,
                                "pinball_frac": loss / capacity[d],
                                "coverage": a["hit"][kind, li, hi, d] / n if n else float("nan"),
                            }
                        )
    return pl.DataFrame(rows, schema=FORECAST_TABLE)


def summarise_forecast_table(table: pl.DataFrame, by: tuple[str, ...] = ()) -> pl.DataFrame:
    """Per `by` columns and forecaster: the mean pinball loss / C over every level, step and resource
    (`pinball_frac`) and the coverage of each level (`coverage_<level %>`), weighted by the steps scored."""
    keys = [*by, "forecaster"]
    weighted = table.filter(pl.col("n") > 0).with_columns(
        (pl.col("pinball_frac") * pl.col("n")).alias("_loss"),
        (pl.col("coverage") * pl.col("n")).alias("_hit"),
    )
    loss = weighted.group_by(keys).agg((pl.col("_loss").sum() / pl.col("n").sum()).alias("pinball_frac"))
    cov = (
        weighted.group_by([*keys, "level"])
        .agg((pl.col("_hit").sum() / pl.col("n").sum()).alias("coverage"))
        .with_columns(
            ("coverage_" + (pl.col("level") * 100).round(0).cast(pl.Int32).cast(pl.String)).alias("col")
        )
        .pivot(on="col", index=keys, values="coverage")
    )
    levels = sorted(c for c in cov.columns if c.startswith("coverage_"))
    levels.sort(key=lambda c: int(c.removeprefix("coverage_")))
    return loss.join(cov, on=keys).select(*keys, "pinball_frac", *levels).sort([*by, "pinball_frac"])


def forecast_tables_by_source(
    sequences: pl.DataFrame,
    sim_cfg: SimConfig,
    cfg: ForecastConfig = ForecastConfig(),
    *,
    baseline_period: int = 24,
    origins_per_job: int = 3,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    labeller_of: Callable[[str], Labeller | None] | None = None,
) -> tuple[pl.DataFrame, dict]:
    """`forecast_table` per (source, load_pct) of a `sim__job_sequences`-shaped frame: every forecaster of
    `fit_forecasters` fitted on the rows with split == "train", scored on split == "test", fitted and scored on
    the labels `labeller_of(source)` serves (None, or no labeller: the clustering labels). Returns the table
    (with source and load_pct columns first) and the learned forecasters' fit reports per (source, load, name)."""
    frames, reports = [], {}
    for (source, load), part in sequences.group_by(["source", "load_pct"], maintain_order=True):
        train = part.filter(pl.col("split") == "train")
        test = part.filter(pl.col("split") == "test")
        if train.height == 0:
            raise ValueError(f"forecast_tables_by_source: {source}/{load}: empty training split")
        if test.height == 0:
            raise ValueError(f"forecast_tables_by_source: {source}/{load}: empty test split")
        labeller = None if labeller_of is None else labeller_of(source)
        forecasters = fit_forecasters(sim_cfg, JobBatch.from_frame(train), cfg, baseline_period, labeller)
        for name, f in forecasters.items():
            if isinstance(f, QuantileUsageForecaster):
                reports[(source, load, name)] = f.report
                if log:
                    log(
                        f"{source}/{load} {name}: fit {f.report['fit_s']:.1f} s, {f.report['epochs_run']} epochs, "
                        f"conformal shifts {shifts_kept(f.report)}"
                    )
        table = forecast_table(
            sim_cfg,
            JobBatch.from_frame(test),
            forecasters,
            origins_per_job=origins_per_job,
            seed=seed,
            labeller=labeller,
        )
        frames.append(
            table.select(pl.lit(source).alias("source"), pl.lit(load, pl.Int32).alias("load_pct"), pl.all())
        )
    return pl.concat(frames), reports


def shifts_kept(report: dict) -> str:
    """Which conformal shifts a learned forecaster's fit `report` kept: "per origin" or "pooled" (with why, where
    `choose_shifts` did not cross-fit)."""
    return report.get("calibration_choice", "per origin" if report.get("calibration_by_origin") else "pooled")


def fit_facts(reports: dict) -> dict:
    """Per learned forecaster of `forecast_tables_by_source`'s `reports` ("source load% name"): its fit seconds
    and the conformal shifts it kept (`choose_shifts`)."""
    return {
        f"{source} {load}% {name}": {
            "fit_s": round(report["fit_s"], 1),
            "conformal_shifts": shifts_kept(report),
        }
        for (source, load, name), report in reports.items()
    }


@dataclass(frozen=True)
class ForecastTableSettings:
    """How the forecasters are scored on the test sequences' jobs (`forecast_evaluation`)."""

    preset: str = "sample"
    """FORECAST_PRESETS name of the learned forecaster ("default", "sample")."""
    origins_per_job: int = 2
    """Running origins scored per test job (besides arrival)."""
    seed: int = 0
    """Seed of the scored origins."""

    def __post_init__(self) -> None:
        if self.preset not in FORECAST_PRESETS:
            raise ValueError(f"unknown forecaster preset {self.preset!r}; known: {sorted(FORECAST_PRESETS)}")


def forecast_evaluation(
    sequences: pl.DataFrame,
    settings: ForecastTableSettings,
    log: Callable[[str], None] | None = None,
    labeller_of: Callable[[str], Labeller | None] | None = None,
) -> tuple[pl.DataFrame, dict, pl.DataFrame]:
    """(`forecast_tables_by_source` table, its fit reports, its summary per (source, load)) of a
    `sim__job_sequences` frame: every (source, load) with both training and test sequences, but the synthetic
    workloads without a usage shape (`SyntheticWorkload.has_usage_shape`: flat blocks, nothing to forecast)."""
    sim = SimConfig(n_labels=max(SimConfig().n_labels, int(sequences["ec_label"].max() or 0) + 1))
    cells = sequences.group_by("source", "load_pct").agg(
        has_train=(pl.col("split") == "train").any(), has_test=(pl.col("split") == "test").any()
    )
    usable = cells.filter(pl.col("has_train") & pl.col("has_test")).select("source", "load_pct")
    flat = [source for source, w in SYNTHETIC_WORKLOADS.items() if not w.has_usage_shape]
    jobs = sequences.join(usable, on=["source", "load_pct"], how="semi").filter(~pl.col("source").is_in(flat))
    table, reports = forecast_tables_by_source(
        jobs,
        sim,
        FORECAST_PRESETS[settings.preset],
        origins_per_job=settings.origins_per_job,
        seed=settings.seed,
        log=log,
        labeller_of=labeller_of,
    )
    summary = summarise_forecast_table(table, by=("source", "load_pct"))
    return table, reports, with_test_workloads(summary, jobs)


def with_test_workloads(summary: pl.DataFrame, sequences: pl.DataFrame) -> pl.DataFrame:
    """`summary` with `n_test_workloads` per (source, load): the distinct workloads of the test sequences. Steps of
    one workload are not independent: coverage measured on about ten workloads (the sample's Bitbrains) can miss
    93-97 % by chance although the calibration is sound."""
    counts = (
        sequences.filter(pl.col("split") == "test")
        .group_by("source", "load_pct")
        .agg(pl.col("workload_id").n_unique().cast(pl.Int64).alias("n_test_workloads"))
    )
    return summary.join(counts, on=["source", "load_pct"], how="left")


COVERAGE_CHECK_DOCS = {
    "q95_covers_93_to_97_pct": "The learned forecaster's 95 % quantile (with EC inputs) covers 93-97 % of the "
    "test steps of every (source, load) (WARN: usage in whole units can leave coverage above nominal, and a cell "
    "of few test workloads, `n_test_workloads` in the summary, can miss the band by chance: on the embedded "
    "sample's 11 Bitbrains test VMs it covered 0.89-0.94 with one calibration for every origin, 0.945-0.955 with "
    "one per origin, `ForecastConfig.calibrate_by_origin`).",
}
"""The check of `coverage_check`: name -> what passing means."""


def coverage_check(summary: pl.DataFrame, low: float = 0.93, high: float = 0.97) -> tuple[bool, dict]:
    """(passed, metadata): the learned forecaster with EC inputs covers `low`..`high` of the test steps with its
    95 % quantile at every (source, load) of a `forecast_evaluation` summary."""
    q95 = summary.filter(pl.col("forecaster") == "learned_with_ec")
    col = "coverage_95" if "coverage_95" in q95.columns else None
    bad = q95.filter((pl.col(col) < low) | (pl.col(col) > high)) if col else q95
    passed = col is not None and bad.height == 0 and q95.height > 0
    return passed, {"outside": bad.to_dicts() if col else [], "coverage_column": str(col)}


EC_CHOICES = ("validation", "on", "off")
"""How a forecaster factory sets the EC inputs: chosen per fit by validation loss, always on, or off."""


def fit_choosing_ec(
    sim_cfg: SimConfig,
    train: JobBatch,
    cfg: ForecastConfig,
    labeller: Labeller | None = None,
    ec: str = "validation",
) -> QuantileUsageForecaster:
    """The learned forecaster with EC inputs ("on"), without ("off"), or ("validation") both fitted and the one with
    the lower pinball loss on its own validation workloads kept (training workloads, the same examples for both;
    never the test split): ECs are used where they prove their worth. The choice goes into the kept forecaster's
    report (`ec_choice`). ValueError on an unknown `ec`."""
    if ec not in EC_CHOICES:
        raise ValueError(f"forecaster EC inputs must be one of {EC_CHOICES}; got {ec!r}")
    if ec != "validation":
        return fit_usage_forecaster(sim_cfg, train, replace(cfg, use_ec=ec == "on"), labeller)
    with_ec = fit_usage_forecaster(sim_cfg, train, replace(cfg, use_ec=True), labeller)
    without = fit_usage_forecaster(sim_cfg, train, replace(cfg, use_ec=False))
    loss = {
        "with_ec": with_ec.report["best_val_pinball_frac"],
        "without_ec": without.report["best_val_pinball_frac"],
    }
    kept = with_ec if loss["with_ec"] < loss["without_ec"] else without
    kept.report["ec_choice"] = {
        "kept": "with_ec" if kept is with_ec else "without_ec",
        "val_pinball_frac": loss,
    }
    return kept


def forecaster_factory(
    preset: str = "sample", periodic: bool = True, ec: str = "validation"
) -> Callable[..., UsageForecaster]:
    """(training sequences, simulator, labeller=None) -> the learned forecaster fitted on them with the named
    preset, its EC inputs per `ec` (`fit_choosing_ec`: by default kept only where they lower the validation
    loss) on the labels `labeller` serves, under the periodic overlay (`models.periodic_forecast`: a job that has
    repeated an exact cycle is forecast to go on repeating it) unless `periodic` is False: what
    `sim.tuning.FitContext` calls once per (source, load) for the forecast-driven rules and the placer. KeyError
    naming the presets on an unknown name, ValueError on an unknown `ec`."""
    from models.periodic_forecast import PeriodicOverlay

    if preset not in FORECAST_PRESETS:
        raise KeyError(f"unknown forecaster preset {preset!r}; known: {sorted(FORECAST_PRESETS)}")
    if ec not in EC_CHOICES:
        raise ValueError(f"forecaster EC inputs must be one of {EC_CHOICES}; got {ec!r}")
    cfg = FORECAST_PRESETS[preset]

    def fit(train: JobBatch, sim_cfg: SimConfig, labeller: Labeller | None = None) -> UsageForecaster:
        learned = fit_choosing_ec(sim_cfg, train, cfg, labeller, ec)
        return PeriodicOverlay(learned) if periodic else learned

    fit.identity = f"usage_forecast preset={preset} periodic={periodic} ec={ec}"  # sim.tuning's memo key
    return fit
