"""The learned placer's inputs (`models.forecast_placer.placement_features`) as one numba kernel over the envs, for
the inputs training uses by default: a remaining-peak quantile table (`sim.peak_forecast.RemainingPeakQuantiles`,
`PlacerTrainConfig.inputs = "rule"`) at rho = 1 (issue 22, item 8: the second compiled piece of the training
loop, after `sim.compiled_step`).

Per env the kernel walks the jobs in index order: a running job's levels are looked up in the table from its
request, its peak so far (the batch's `ObservedPrefix`), its age bucket, the label the state shows and, where the
table is keyed by it, its remaining life, exactly as `RemainingPeakQuantiles.flat_levels` looks them up; each level's
bound (the level's value, at least the median) is added to its machine's sums at t + 1 and over the steps it is
alive, in job order (the order `np.bincount` adds them in); then the queue head's row, the other per-machine inputs
(usage now, the history's mean and max, requests, time left, the head's request and median) and the global ones,
in `feature_names` order. Every number is the one the numpy path computes from a fresh count (the same float
operations in the same order; the float32 history mean is a float32 sum in row order over h, as numpy reduces a
non-innermost axis), so the features are equal to the bit; from a count carried between decisions
(`sim.running_sums`) the numpy sums may differ from these in the last bit.

Each env's inputs are one body (`_placer_env`), run on numba's threads for a large batch
(`sim.compiled_step.on_threads`): the same numbers either way.

`features` returns None where the kernel does not apply (another forecaster, rho != 1, a level the table lacks) or
where a looked-up value is negative (the numpy path then takes its general branch, as it does itself); the caller
then runs the numpy path. The kernel itself is `sim.compiled_decision.placer_features_kernel`, in the file of the
table look-up it inlines (numba's cache notices changes to its own file only). Tests:
tests/models/test_placer_kernel.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.compiled_decision import (
    AGE_EDGE_ARRAY,
    REMAINING_EDGE_ARRAY,
    levels_last,
    noise_args,
    placer_features_kernel,
    placer_features_kernel_parallel,
    prefix_args,
)
from sim.compiled_step import on_threads
from sim.config import SimConfig
from sim.core import State, observed_labels
from sim.forecast import find_level
from sim.peak_forecast import RemainingPeakQuantiles


def level_rows(forecaster, levels) -> np.ndarray | None:
    """The table's level index of each of `levels`, or None where the kernel does not apply (module docstring)."""
    if type(forecaster) is not RemainingPeakQuantiles:
        return None
    rows = [find_level(forecaster.table.levels, lv) for lv in levels]
    if any(row is None for row in rows):
        return None  # the numpy path raises its own error
    return np.asarray(rows, dtype=np.int64)


def features(
    cfg: SimConfig,
    state: State,
    forecaster,
    levels: tuple[float, ...],
    rho: float,
    use_durations: bool,
    horizon: int,
    base_actions: np.ndarray,
    mask: np.ndarray,
    skip_done: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(x (B, M, F) float32, g (B, G) float32) as `placement_features` gives them, or None (module docstring);
    `skip_done`: the rows of envs whose episode has ended are zeros (a rollout reads only the others)."""
    rows = level_rows(forecaster, levels) if rho == 1.0 else None
    if rows is None:
        return None
    table = forecaster.table
    jobs = state.jobs
    n_envs = state.batch_size
    n_m, n_d, n_levels = cfg.n_machines, cfg.n_resources, len(levels)
    n_x = n_levels * 5 + 6 * n_d + 5  # feature_names: 5 per level, six D-wide inputs and five single ones
    x = np.empty((n_envs, n_m, n_x), dtype=np.float32)
    g = np.empty((n_envs, 5), dtype=np.float32)
    kernel = placer_features_kernel_parallel if on_threads(n_envs) else placer_features_kernel
    ok = kernel(
        state.t,
        state.next_job,
        state.n_arrived,
        state.is_done,
        state.job_machine,
        state.job_start,
        state.busy_until,
        state.timeline,
        *noise_args(state),
        state.past,
        jobs.duration,
        jobs.request,
        observed_labels(state),
        *prefix_args(jobs),
        levels_last(table.values),
        rows,
        table.use_labels,
        table.use_remaining,
        AGE_EDGE_ARRAY,
        REMAINING_EDGE_ARRAY,
        np.asarray(cfg.capacity_units, dtype=np.float64),
        int(cfg.queue_size),
        int(horizon),
        bool(use_durations),
        int(max(jobs.max_duration, 1)),
        np.asarray(base_actions, dtype=np.int64),
        mask,
        skip_done,
        x,
        g,
    )
    return (x, g) if ok else None


def flat_planes(
    values: np.ndarray, recalled, n_alive: np.ndarray, horizon: int, squares: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`models.forecast_placer._planes` for a forecaster with a value per level (`flat_levels`: `values` (N, L, D)
    float64, level 0 the median), recall over it where `recalled` (`sim.forecast.Recalled`, or None) says so:
    (planes (N, P, H, D): the median, each upper level's deviation and, with `squares`, their squares, over the
    steps each job is alive (`n_alive` (N,)); the medians (N, H, D)). One pass, without the (N, L, H, D)
    quantiles the numpy path spreads, overlays and slices; the same float operations per element, so the same
    numbers."""
    n, n_l, n_d = values.shape
    n_p = 1 + (n_l - 1) * (2 if squares else 1)
    planes = np.empty((n, n_p, horizon, n_d))
    mu = np.empty((n, horizon, n_d))
    source = np.full(n, -1, dtype=np.int64)  # each row's recalled run (its index in `recalled`), -1 for none
    if recalled is None:
        usage, view_rows, t, start, max_duration = (
            np.zeros((1, 1, n_d)),
            source[:0],
            source[:0],
            source[:0],
            1,
        )
    else:
        usage, view_rows, t, start = recalled.usage, recalled.view_rows, recalled.t, recalled.start
        max_duration = recalled.max_duration
        source[recalled.dest] = np.arange(recalled.dest.size)
    _flat_planes(
        np.ascontiguousarray(values, dtype=np.float64), source, usage, view_rows, t, start, int(max_duration),
        n_alive.astype(np.int64), squares, planes, mu,
    )  # fmt: skip
    return planes, mu


@njit(cache=True)
def _flat_planes(values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu):
    n_l, n_d = values.shape[1], values.shape[2]
    horizon = planes.shape[2]
    for i in range(values.shape[0]):
        r = source[i]
        for h in range(horizon):
            alive = 1.0 if h < n_alive[i] else 0.0
            for d in range(n_d):
                recalled = False
                v = 0.0
                if r >= 0:  # RecallOverlay._overlay: every level is the recalled value where it is finite
                    age = t[r] + 1 + h - start[r]
                    if age < max_duration:
                        v = usage[view_rows[r], max(age, 0), d]
                    recalled = np.isfinite(v)
                q0 = v if recalled else values[i, 0, d]
                m = q0 * alive
                mu[i, h, d] = m
                planes[i, 0, h, d] = m
                for li in range(1, n_l):
                    x = (v if recalled else values[i, li, d]) - q0
                    dev = (x if (x >= 0.0 or np.isnan(x)) else 0.0) * alive  # np.maximum(x, 0.0)
                    planes[i, li, h, d] = dev
                    if squares:
                        planes[i, n_l - 1 + li, h, d] = dev * dev
