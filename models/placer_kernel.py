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

`features` returns None where the kernel does not apply (another forecaster, rho != 1, a level the table lacks) or
where a looked-up value is negative (the numpy path then takes its general branch, as it does itself); the caller
then runs the numpy path. Tests: tests/models/test_placer_kernel.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.compiled_rule import AGE_EDGE_ARRAY, NO_NOISE, REMAINING_EDGE_ARRAY, levels_last, table_cell
from sim.config import SimConfig
from sim.core import State
from sim.peak_forecast import RemainingPeakQuantiles


def level_rows(forecaster, levels) -> np.ndarray | None:
    """The table's level index of each of `levels`, or None where the kernel does not apply (module docstring)."""
    if type(forecaster) is not RemainingPeakQuantiles:
        return None
    fitted = forecaster.table.levels
    rows = []
    for lv in levels:
        hit = [i for i, f in enumerate(fitted) if abs(f - lv) < 1e-9]
        if not hit:
            return None  # the numpy path raises its own error
        rows.append(hit[0])
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
    prefix = jobs.observed_prefix[0]
    n_envs = state.batch_size
    n_m, n_d, n_levels = cfg.n_machines, cfg.n_resources, len(levels)
    n_x = n_levels * 5 + 6 * n_d + 5  # feature_names: 5 per level, six D-wide inputs and five single ones
    x = np.empty((n_envs, n_m, n_x), dtype=np.float32)
    g = np.empty((n_envs, 5), dtype=np.float32)
    labels = jobs.ec_label if state.obs_label is None else state.obs_label
    noise = state.noise
    ok = _kernel(
        state.t,
        state.next_job,
        state.n_arrived,
        state.is_terminated | state.is_truncated,
        state.job_machine,
        state.job_start,
        state.busy_until,
        state.timeline,
        NO_NOISE if noise is None else noise,
        noise is not None,
        state.past,
        jobs.duration,
        jobs.request,
        labels,
        prefix.peak,
        prefix.order,
        np.arange(n_envs, dtype=np.int64) if prefix.rows is None else prefix.rows,
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


@njit(cache=True, inline="always")
def _lookup(
    b, j, t, job_machine, job_start, duration, request, labels, peak, order, prefix_rows, values, level_rows,
    use_labels, use_remaining, age_edges, remaining_edges, out,
):  # fmt: skip
    """out (L, D): the levels of job j of env b (`RemainingPeakQuantiles.flat_levels`); False if one is negative."""
    start = job_start[b, j] if job_machine[b, j] >= 0 else t + 1
    n_obs = min(max(t - start + 1, 0), duration[b, j])
    ok = True
    for d in range(out.shape[1]):
        r, p, a, e, rem = table_cell(
            b, j, n_obs, d, duration, request, labels, peak, order, prefix_rows, values, use_labels,
            use_remaining, age_edges, remaining_edges,
        )  # fmt: skip
        for li in range(level_rows.shape[0]):
            v = values[d, r, p, a, e, rem, level_rows[li]]
            out[li, d] = v
            if v < 0:
                ok = False
    return ok


@njit(cache=True)
def _kernel(
    t_arr,
    next_job,
    n_arrived,
    is_done,
    job_machine,
    job_start,
    busy_until,
    timeline,
    noise,
    has_noise,
    past,
    duration,
    request,
    labels,
    peak,
    order,
    prefix_rows,
    values,
    level_rows,
    use_labels,
    use_remaining,
    age_edges,
    remaining_edges,
    cap,
    queue_size,
    horizon,
    use_durations,
    max_duration,
    base_actions,
    mask,
    skip_done,
    x,
    g,
):
    n_envs, n_j = job_machine.shape
    width, n_m, n_d = timeline.shape[1], timeline.shape[2], timeline.shape[3]
    n_levels = level_rows.shape[0]
    hist = past.shape[1]
    first = np.zeros((n_m, n_levels, n_d))
    total = np.zeros((n_m, n_levels, n_d))
    n_running = np.zeros(n_m, dtype=np.int64)
    requested = np.zeros((n_m, n_d), dtype=np.int64)
    vals = np.zeros((n_levels, n_d))
    head_first = np.zeros((n_levels, n_d))
    head_total = np.zeros((n_levels, n_d))
    for b in range(n_envs):
        if is_done[b] and skip_done:  # a finished env's row is not read: zeros
            x[b] = 0.0
            g[b] = 0.0
            continue
        t = t_arr[b]
        first[:] = 0.0
        total[:] = 0.0
        n_running[:] = 0
        requested[:] = 0
        for j in range(n_j):
            m = job_machine[b, j]
            if m < 0 or job_start[b, j] > t or job_start[b, j] + duration[b, j] <= t:
                continue
            if not _lookup(
                b, j, t, job_machine, job_start, duration, request, labels, peak, order, prefix_rows,
                values, level_rows, use_labels, use_remaining, age_edges, remaining_edges, vals,
            ):  # fmt: skip
                return False
            n_alive = horizon
            if use_durations:
                n_alive = min(max(job_start[b, j] + duration[b, j] - t - 1, 0), horizon)
            for li in range(n_levels):
                for d in range(n_d):
                    bound = max(vals[li, d], vals[0, d])
                    first[m, li, d] += bound * (1.0 if n_alive > 0 else 0.0)
                    total[m, li, d] += bound * np.float64(n_alive)
            n_running[m] += 1
            for d in range(n_d):
                requested[m, d] += np.int64(request[b, j, d])
        # the queue head (its row is counted only where a job waits)
        head = min(next_job[b], n_j - 1)
        has_job = n_arrived[b] > next_job[b] and not is_done[b]
        if not _lookup(
            b, head, t, job_machine, job_start, duration, request, labels, peak, order, prefix_rows,
            values, level_rows, use_labels, use_remaining, age_edges, remaining_edges, vals,
        ):  # fmt: skip
            return False
        n_alive = horizon
        if use_durations:
            start = job_start[b, head] if job_machine[b, head] >= 0 else t
            n_alive = min(max(start + duration[b, head] - t - 1, 0), horizon)
        if not has_job:
            n_alive = 0
        for li in range(n_levels):
            for d in range(n_d):
                bound = max(vals[li, d], vals[0, d])
                head_first[li, d] = bound * (1.0 if n_alive > 0 else 0.0)
                head_total[li, d] = bound * np.float64(n_alive)
        n_used = 0
        n_valid = 0
        for m in range(n_m):
            c = 0
            for li in range(n_levels):
                peak_without = -np.inf
                peak_with = -np.inf
                mean_without = 0.0
                mean_with = 0.0
                for d in range(n_d):
                    peak_without = max(peak_without, first[m, li, d] / cap[d])
                    peak_with = max(peak_with, (first[m, li, d] + head_first[li, d]) / cap[d])
                    mean_without += total[m, li, d] / cap[d]
                    mean_with += (total[m, li, d] + head_total[li, d]) / cap[d]
                x[b, m, c] = peak_without
                x[b, m, c + 1] = mean_without / np.float64(n_d * horizon)
                x[b, m, c + 2] = peak_with
                x[b, m, c + 3] = mean_with / np.float64(n_d * horizon)
                x[b, m, c + 4] = 1.0 if peak_with <= 1.0 + 1e-9 else 0.0
                c += 5
            slot = t % width
            for d in range(n_d):  # usage now (noise included)
                units = np.int64(timeline[b, slot, m, d])
                if has_noise:
                    units += np.int64(noise[b, min(t, noise.shape[1] - 1), m, d])
                x[b, m, c + d] = np.float64(units) / cap[d]
            c += n_d
            for d in range(n_d):  # the history's mean (a float32 sum in row order) and max
                acc = np.float32(0.0)
                top = past[b, 0, m, d]
                for r in range(hist):
                    acc += past[b, r, m, d]
                    top = max(top, past[b, r, m, d])
                x[b, m, c + d] = acc / np.float32(hist)
                x[b, m, c + n_d + d] = top
            c += 2 * n_d
            is_used = busy_until[b, m] > t
            n_used += 1 if is_used else 0
            x[b, m, c] = 1.0 if is_used else 0.0
            c += 1
            for d in range(n_d):
                x[b, m, c + d] = np.float64(np.int64(cap[d]) - requested[m, d]) / cap[d]
            c += n_d
            x[b, m, c] = np.float64(n_running[m]) / 10.0
            left = 0.0
            if use_durations:
                left = np.float64(max(busy_until[b, m] - t, 0)) / np.float64(max_duration)
            x[b, m, c + 1] = left
            c += 2
            for d in range(n_d):
                req = np.int64(request[b, head, d]) if has_job else 0
                x[b, m, c + d] = np.float64(req) / cap[d]
                x[b, m, c + n_d + d] = (head_total[0, d] / np.float64(horizon)) / cap[d]
            c += 2 * n_d
            x[b, m, c] = 1.0 if base_actions[b] == m else 0.0
            x[b, m, c + 1] = 1.0 if mask[b, m] else 0.0
            n_valid += 1 if mask[b, m] else 0
        g[b, 0] = min(np.float64(n_arrived[b] - next_job[b]) / np.float64(queue_size), 4.0)
        g[b, 1] = np.float64(n_used) / np.float64(n_m)
        g[b, 2] = np.float64(n_valid) / np.float64(n_m)
        g[b, 3] = 1.0 if has_job else 0.0
        g[b, 4] = 1.0 if base_actions[b] == n_m else 0.0
    return True
