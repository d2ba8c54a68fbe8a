"""Horizon planes (per job and per machine, over the forecast horizon) compiled with numba (issue 22, item 8): the
general path of the learned placer's features (`models.forecast_placer._level_columns` and `_planes`) and the
per-machine sums of wide rows (`sim.core.sum_by_cell`) that it and the forecast rule's bounds use, the running
jobs' requests and counts per machine (`sim.core.placed_requests`, `jobs_per_machine`: `running_requests`), and
the recall path's kernels (`_recall_columns_kernel`, `_recall_share_kernel`: each env's machines summed straight
from its jobs' rows, `sim.recall_sums`). Each kernel does the numpy
expressions' float operations per element in their order, so the numbers are the numpy path's to the bit;
where numpy reduces (a sum of rows, a mean over a contiguous block), the kernels reproduce its order: the pairwise
sum of its loops (`_pairwise_block`, `_pairwise_sum`). Every kernel that inlines the pairwise sum lives in this
file, because numba's on-disk cache notices changes to a kernel's own file only (and cannot hold a recursive
function: `_pairwise_sum` walks numpy's recursion with a stack). The sums, the planes and the columns run one body
per run of rows, job row or env, on numba's threads for a large batch (`sim.compiled_step.on_threads`): the same
numbers. Tests: tests/sim/test_compiled_batch.py (sums), tests/models/test_placer_kernel.py and
tests/models/test_forecast_placer.py (planes and columns), tests/sim/test_recall.py (the rule's moments),
tests/sim/test_recall_sums.py (the recall path)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from sim.compiled_step import on_threads


def sum_rows(values: np.ndarray, cell: np.ndarray, n_cells: int) -> np.ndarray | None:
    """(n_cells, ...) float64: the rows of `values` (N, ...) summed per `cell` (N,) in the rows' own dtype and
    order, cells without rows 0: exactly `np.add.reduceat` over the rows sorted stably by cell
    (`sim.core.sum_by_cell`'s wide path), whose segment sum is the first row plus numpy's pairwise sum of the
    others, without copying the sorted rows. None where a cell lies outside 0 .. n_cells - 1 (the numpy path then
    raises) or a cell has more than `PAIRWISE_BLOCK` + 1 rows (numpy then splits the sum in halves; a machine
    rarely runs that many jobs)."""
    cell = np.asarray(cell, dtype=np.int64)
    width = int(np.prod(values.shape[1:], dtype=np.int64))  # -1 cannot stand for it when there are no rows
    flat = np.ascontiguousarray(values).reshape(values.shape[0], width)
    acc = np.zeros((n_cells, width), dtype=flat.dtype)
    if cell.size:
        if cell.min() < 0 or cell.max() >= n_cells:
            return None
        order = np.argsort(cell, kind="stable")
        sorted_cell = cell[order]
        # each cell's run of rows in `order`: starts[r] .. ends[r] - 1
        starts = np.flatnonzero(np.r_[True, sorted_cell[1:] != sorted_cell[:-1]])
        ends = np.r_[starts[1:], order.size]
        if (ends - starts - 1).max() > PAIRWISE_BLOCK:
            return None
        kernel = _sum_rows_parallel if on_threads(starts.size) else _sum_rows
        kernel(flat, sorted_cell, order, starts, ends, acc, flat.dtype.type(0))
    return acc.astype(np.float64, copy=False).reshape(n_cells, *values.shape[1:])


def output_array(shape: tuple[int, ...]) -> np.ndarray:
    """A kernel's float64 output, every element of which the kernel writes (so not cleared first). Tests swap in
    a NaN-filled one: a row a kernel skipped then shows, instead of whatever an earlier array left there."""
    return np.empty(shape)


PAIRWISE_BLOCK = 128
"""numpy's pairwise-sum block (`PW_BLOCKSIZE`): up to this many terms it sums with 8 partial sums."""


@njit(cache=True)
def _sum_run(r, values, sorted_cell, order, starts, ends, acc, column, zero):
    """Run r of equal cells in `order` (rows starts[r] .. ends[r] - 1): the first row plus the pairwise sum of the
    rest (numpy's reduce: the output starts as the first element and adds the pairwise sum of the others), each
    column's rest gathered into `column` (at least PAIRWISE_BLOCK long)."""
    lo, c = starts[r], sorted_cell[starts[r]]
    n_rest = ends[r] - lo - 1
    for k in range(values.shape[1]):
        first = values[order[lo], k]
        if n_rest == 0:
            acc[c, k] = first
            continue
        for i in range(n_rest):
            column[i] = values[order[lo + 1 + i], k]
        acc[c, k] = first + _pairwise_block(column, 0, n_rest, zero)


@njit(cache=True)
def _sum_rows(values, sorted_cell, order, starts, ends, acc, zero):
    column = np.empty(PAIRWISE_BLOCK, dtype=values.dtype)
    for r in range(starts.shape[0]):
        _sum_run(r, values, sorted_cell, order, starts, ends, acc, column, zero)


@njit(cache=True, parallel=True)
def _sum_rows_parallel(values, sorted_cell, order, starts, ends, acc, zero):
    for r_ in prange(starts.shape[0]):
        r = np.int64(r_)  # prange's index is uint64; as int64 the body is the serial kernel's code
        column = np.empty(PAIRWISE_BLOCK, dtype=values.dtype)
        _sum_run(r, values, sorted_cell, order, starts, ends, acc, column, zero)


def running_requests(
    t: np.ndarray,
    job_machine: np.ndarray,
    job_start: np.ndarray,
    duration: np.ndarray,
    request: np.ndarray,
    n_machines: int,
) -> tuple[np.ndarray, np.ndarray]:
    """((B, M, D) int64 the requests of the jobs running at t (placed, started, not ended) summed per machine,
    (B, M) int64 how many run there): `sim.core.placed_requests` and `jobs_per_machine` (integer sums, so equal
    to numpy's float64 bincount of them in any order). One pass over each env's job rows, without the (B, J)
    masks and gathers numpy builds (kube's and Dejavu's scores, the request-fit masks and the learned placer's
    inputs ask for them at every decision)."""
    out = np.zeros((t.shape[0], n_machines, request.shape[2]), dtype=np.int64)
    counts = np.zeros((t.shape[0], n_machines), dtype=np.int64)
    kernel = _running_requests_parallel if on_threads(t.shape[0]) else _running_requests
    kernel(t, job_machine, job_start, duration, request, out, counts)
    return out, counts


@njit(cache=True)
def _running_requests_env(b, t, job_machine, job_start, duration, request, out, counts):
    for j in range(job_machine.shape[1]):
        m = job_machine[b, j]
        if m < 0 or job_start[b, j] > t[b] or job_start[b, j] + duration[b, j] <= t[b]:
            continue
        counts[b, m] += 1
        for d in range(request.shape[2]):
            out[b, m, d] += np.int64(request[b, j, d])


@njit(cache=True)
def _running_requests(t, job_machine, job_start, duration, request, out, counts):
    for b in range(t.shape[0]):
        _running_requests_env(b, t, job_machine, job_start, duration, request, out, counts)


@njit(cache=True, parallel=True)
def _running_requests_parallel(t, job_machine, job_start, duration, request, out, counts):
    for b_ in prange(t.shape[0]):
        b = np.int64(b_)  # prange's index is uint64; as int64 the body is the serial kernel's code
        _running_requests_env(b, t, job_machine, job_start, duration, request, out, counts)


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
    planes = output_array((n, n_p, horizon, n_d))
    mu = output_array((n, horizon, n_d))
    source = np.full(n, -1, dtype=np.int64)  # each row's recalled run (its index in `recalled`), -1 for none
    if recalled is None:  # no run is read: empty stand-ins of the right types
        none = source[:0]
        usage, view_rows, t, start, max_duration = np.zeros((1, 1, n_d)), none, none, none, 1
    else:
        usage, view_rows, t, start = recalled.usage, recalled.view_rows, recalled.t, recalled.start
        max_duration = recalled.max_duration
        source[recalled.dest] = np.arange(recalled.dest.size)
    kernel = _flat_planes_parallel if on_threads(n) else _flat_planes
    kernel(
        np.ascontiguousarray(values, dtype=np.float64), source, usage, view_rows, t, start, int(max_duration),
        n_alive.astype(np.int64), squares, planes, mu,
    )  # fmt: skip
    return planes, mu


@njit(cache=True)
def _flat_planes_row(
    i, values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu
):
    """Job row i's planes and medians (the body both kernels run per row)."""
    n_l, n_d = values.shape[1], values.shape[2]
    r = source[i]
    for h in range(planes.shape[2]):
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


@njit(cache=True)
def _flat_planes(values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu):
    for i in range(values.shape[0]):
        _flat_planes_row(
            i, values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu
        )


@njit(cache=True, parallel=True)
def _flat_planes_parallel(
    values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu
):
    for i_ in prange(values.shape[0]):
        i = np.int64(i_)  # prange's index is uint64; as int64 the body is the serial kernel's code
        _flat_planes_row(
            i, values, source, usage, view_rows, t, start, max_duration, n_alive, squares, planes, mu
        )


def level_columns(
    acc: np.ndarray,
    per_head: np.ndarray,
    n_levels: int,
    rho: float,
    cap: np.ndarray,
    skip: np.ndarray | None = None,
) -> np.ndarray:
    """(5 L, B, M) `models.forecast_placer._level_columns`' LEVEL_FEATURES columns from the per-machine sums
    `acc` (B, M, P, H, D) and the heads' planes `per_head` (B, P, H, D), in its order (per level: peak and mean
    share without the head, with it, and whether the peak with it fits), without its (B, M, H, D) arrays: the
    same float operations per element, the maximum as numpy's (NaN kept) and the mean as numpy sums a
    contiguous block (its pairwise sum, `_pairwise_sum`, over the H x D shares, divided by H x D). `skip` (B,)
    bool: envs whose columns are zeros, not computed (a rollout's finished episodes, which no decision reads)."""
    n_envs, n_m = acc.shape[0], acc.shape[1]
    out = output_array((5 * n_levels, n_envs, n_m))
    skip = np.zeros(n_envs, dtype=np.bool_) if skip is None else np.asarray(skip, dtype=np.bool_)
    kernel = _level_columns_parallel if on_threads(n_envs) else _level_columns
    kernel(
        np.ascontiguousarray(acc, dtype=np.float64), np.ascontiguousarray(per_head, dtype=np.float64),
        int(n_levels), float(rho), rho != 1.0, np.asarray(cap, dtype=np.float64), skip, out,
    )  # fmt: skip
    return out


@njit(cache=True)
def _pairwise_block(a, lo, n, zero):
    """numpy's pairwise sum (`pairwise_sum` in its loops) of a[lo : lo + n] for n <= 128, in a's dtype (`zero`
    its 0): one running sum below 8 terms, else 8 interleaved partial sums combined as a tree, then the rest."""
    if n < 8:
        res = zero
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True)
def _pairwise_sum(a, lo, n, frames, values):
    """numpy's pairwise sum of float64 a[lo : lo + n]: blocks of at most 128 terms (`_pairwise_block`), halves cut at a
    multiple of 8 above, each sum the left half's plus the right half's. numpy recurses; numba's cache cannot
    hold a recursive function, so an explicit stack walks the same tree: `frames` (K, 3) int64 rows (lo, n,
    children pushed) and `values` (K,) float64, K > 2 log2(n) (made once by the caller)."""
    if n <= PAIRWISE_BLOCK:
        return _pairwise_block(a, lo, n, 0.0)
    top, n_values = 0, 0
    frames[0, 0], frames[0, 1], frames[0, 2] = lo, n, 0
    while top >= 0:
        f_lo, f_n = frames[top, 0], frames[top, 1]
        if f_n <= PAIRWISE_BLOCK:
            values[n_values] = _pairwise_block(a, f_lo, f_n, 0.0)
            n_values += 1
            top -= 1
        elif frames[top, 2] == 0:
            frames[top, 2] = 1
            half = f_n // 2
            half -= half % 8
            frames[top + 1, 0], frames[top + 1, 1], frames[top + 1, 2] = f_lo + half, f_n - half, 0  # right
            frames[top + 2, 0], frames[top + 2, 1], frames[top + 2, 2] = f_lo, half, 0  # left, on top: first
            top += 2
        else:
            values[n_values - 2] = values[n_values - 2] + values[n_values - 1]  # left + right
            n_values -= 1
            top -= 1
    return values[0]


@njit(cache=True)
def _level_columns_env(b, acc, head, n_levels, rho, squares, cap, skip, share, frames, values, out):
    """Env b's columns (the body both kernels run per env; zeros where `skip[b]`); `share`, `frames` and
    `values` its scratch."""
    if skip[b]:
        for c in range(out.shape[0]):
            for m in range(acc.shape[1]):
                out[c, b, m] = 0.0
        return
    _machine_columns(b, acc[b], head[b], n_levels, rho, squares, cap, share, frames, values, out)


@njit(cache=True)
def _machine_columns(b, acc, head, n_levels, rho, squares, cap, share, frames, values, out):
    """out[:, b, :]: the columns of one env from its machines' sums `acc` (M, P, H, D) and its head's planes
    `head` (P, H, D)."""
    n_m, n_h, n_d = acc.shape[0], acc.shape[2], acc.shape[3]
    p2_base = n_levels - 1  # plane of level li's squared deviation: p2_base + li
    for m in range(n_m):
        for li in range(n_levels):
            for w in range(2):  # the machine's sums without the head, then with it (acc + head)
                k = 0
                for h in range(n_h):
                    for d in range(n_d):
                        s0 = acc[m, 0, h, d]
                        if w == 1:
                            s0 = s0 + head[0, h, d]
                        bound = s0
                        if li > 0:
                            s_d = acc[m, li, h, d]
                            if w == 1:
                                s_d = s_d + head[li, h, d]
                            if not squares:
                                bound = s0 + s_d
                            else:
                                s_d2 = acc[m, p2_base + li, h, d]
                                if w == 1:
                                    s_d2 = s_d2 + head[p2_base + li, h, d]
                                bound = s0 + np.sqrt(rho * (s_d * s_d) + (1.0 - rho) * s_d2)
                        share[k] = bound / cap[d]
                        k += 1
                top = share[0]
                for i in range(1, k):  # numpy's maximum: a NaN wins, ties keep the first
                    if not (top >= share[i] or np.isnan(top)):
                        top = share[i]
                col = li * 5 + w * 2
                out[col, b, m] = top
                out[col + 1, b, m] = (0.0 + _pairwise_sum(share, 0, k, frames, values)) / np.float64(k)
        for li in range(n_levels):
            out[li * 5 + 4, b, m] = 1.0 if out[li * 5 + 2, b, m] <= 1.0 + 1e-9 else 0.0


@njit(cache=True)
def _level_columns(acc, head, n_levels, rho, squares, cap, skip, out):
    share = np.empty(acc.shape[3] * acc.shape[4])
    frames, values = np.empty((128, 3), dtype=np.int64), np.empty(128)  # `_pairwise_sum`'s stack
    for b in range(acc.shape[0]):
        _level_columns_env(b, acc, head, n_levels, rho, squares, cap, skip, share, frames, values, out)


@njit(cache=True, parallel=True)
def _level_columns_parallel(acc, head, n_levels, rho, squares, cap, skip, out):
    for b_ in prange(acc.shape[0]):
        b = np.int64(b_)  # prange's index is uint64; as int64 the body is the serial kernel's code
        share = np.empty(acc.shape[3] * acc.shape[4])
        frames, values = np.empty((128, 3), dtype=np.int64), np.empty(128)
        _level_columns_env(b, acc, head, n_levels, rho, squares, cap, skip, share, frames, values, out)


# --- the recall path without per-job planes: each env's machines summed straight from its jobs ----------------


@njit(cache=True, inline="always")
def _envs_of_span(c, n_envs, n_spans):
    """[lo, hi) envs of span c of n_spans (`sim.compiled_step.launch`; a copy of `envs_of_span`, as numba's cache
    notices a kernel's own file only)."""
    c = np.int64(c)
    return c * n_envs // n_spans, (c + 1) * n_envs // n_spans


@njit(cache=True, inline="always")
def _recall_agrees(i, env, job, best, n_best, n_own, usage, duration, ok, done):
    """Row i's recall (`sim.compiled_batch._recall_runs`' test): ok[i] where its run best[i] (-1: none) has shown
    a step and agrees with every step both have shown, and, if that run has finished, the job has not outlived
    it; done[i] where that run has finished."""
    b = best[i]
    ok[i], done[i] = False, False
    if b < 0 or n_best[i] <= 0:
        return
    e, j = env[i], job[i]
    for a in range(min(n_own[i], n_best[i], usage.shape[2])):
        for d in range(usage.shape[3]):
            if usage[e, b, a, d] != usage[e, j, a, d]:
                return
    finished = n_best[i] >= duration[e, b]
    if finished and n_own[i] > duration[e, b]:
        return
    ok[i], done[i] = True, finished


@njit(cache=True, inline="always")
def _row_runs(i, env, best, n_best, ok, done, young, t, start, n_alive, duration, max_duration, n_h_max):
    """(n_h, first, flat_from, flat_to, at_request) of row i (`_add_row`): it is alive at horizon steps 0 .. n_h - 1,
    at age `first` at step 0 (>= 1: a row starts at t at the latest); where `at_request` (young, its run not
    finished) it takes its request at every level over those steps; else its recalled run shows steps
    0 .. flat_from - 1, its flat values hold over flat_from .. flat_to - 1 and zeros follow."""
    e, b = env[i], best[i]
    n_h = min(n_alive[i], n_h_max)
    first = t[i] + 1 - start[i]
    if young[i] and not (ok[i] and done[i]):
        return n_h, first, 0, 0, True
    flat_from, flat_to = 0, n_h
    if ok[i]:
        # recalled: ages below the run's observed count, or its duration where it has finished (0 after)
        shown = min(duration[e, b] if done[i] else n_best[i], max_duration)
        flat_from = min(max(shown - first, 0), n_h)
        # then the flat values up to the last age (none where the run has finished: zeros)
        flat_to = flat_from if done[i] else min(max(max_duration - first, flat_from), n_h)
    return n_h, first, flat_from, flat_to, False


@njit(cache=True, inline="always")
def _add_row(i, tgt, m, env, best, n_best, ok, done, young, t, start, n_alive, values, request, usage, duration,
             max_duration, squares):  # fmt: skip
    """Adds row i's planes to `tgt[m]` (of (M, P, H, D)): `_flat_planes_row`'s median, deviations and squares over the
    steps it is alive, its recalled run (`RecallOverlay`) over its flat `values` (L, D) where that run shows the
    age, and, where `young[i]` and the run has not finished, its request at every level
    (`sim.risk.job_moments`' `min_observed`). A recalled step is one value at every level, so its deviations are
    0 and are not added (x + 0 is x for the sums here, which are >= 0); nor are the zeros past a finished run's
    end or past the last age. The steps fall into three runs (`_row_runs`): recalled ages, then flat values, then
    zeros."""
    n_d = values.shape[2]
    e, b = env[i], best[i]
    n_h, first, flat_from, flat_to, at_request = _row_runs(
        i, env, best, n_best, ok, done, young, t, start, n_alive, duration, max_duration, tgt.shape[2]
    )
    if at_request:
        for h in range(n_h):
            for d in range(n_d):
                tgt[m, 0, h, d] += request[i, d]
        return
    for h in range(flat_from):
        for d in range(n_d):
            tgt[m, 0, h, d] += np.float64(usage[e, b, first + h, d])
    for d in range(n_d):
        q0 = values[i, 0, d]
        for h in range(flat_from, flat_to):
            tgt[m, 0, h, d] += q0
        for li in range(1, values.shape[1]):
            x = values[i, li, d] - q0
            if x > 0.0:  # np.maximum(x, 0.0), whose 0 adds nothing
                for h in range(flat_from, flat_to):
                    tgt[m, li, h, d] += x
                    if squares:
                        tgt[m, values.shape[1] - 1 + li, h, d] += x * x


@njit(cache=True, inline="always")
def _add_median(i, tgt, m, env, best, n_best, ok, done, young, t, start, n_alive, values, request, usage, duration,
                max_duration, flat):  # fmt: skip
    """`_add_row`'s median plane only, into `tgt[m]` of (M, H, D); row i's flat steps (`_row_runs`) into
    flat[i] = (flat_from, flat_to), over which its deviations hold (none where it is at its request)."""
    n_d = values.shape[2]
    e, b = env[i], best[i]
    n_h, first, flat_from, flat_to, at_request = _row_runs(
        i, env, best, n_best, ok, done, young, t, start, n_alive, duration, max_duration, tgt.shape[1]
    )
    flat[i, 0], flat[i, 1] = flat_from, flat_to
    if at_request:
        for h in range(n_h):
            for d in range(n_d):
                tgt[m, h, d] += request[i, d]
        return
    for h in range(flat_from):
        for d in range(n_d):
            tgt[m, h, d] += np.float64(usage[e, b, first + h, d])
    for h in range(flat_from, flat_to):
        for d in range(n_d):
            tgt[m, h, d] += values[i, 0, d]


@njit(cache=True)
def _clear(planes, until):
    """planes[:, :until] = 0 for a (P, H, D) array, each plane's steps one contiguous run (numba's slice assignment
    walks a strided view element by element, with index arithmetic at each)."""
    n_run = until * planes.shape[2]
    for p in range(planes.shape[0]):
        flat = planes[p].reshape(-1)
        for k in range(n_run):
            flat[k] = 0.0


@njit(cache=True, inline="always")
def _reach_and_clear(r, row_start, n_rows, machine, n_alive, acc, reach, full):
    """`reach` (M + 1,): the steps env r's rows on each machine (the head's at M) are alive, beyond which its sums
    are 0; clears only the steps of `acc` (M + 1, P, H, D) a reader may touch: each machine's up to its reach or
    the head's, whichever is later, the head's up to the latest of those; every step where `full`."""
    n_m, n_h = acc.shape[0] - 1, acc.shape[2]
    reach[:] = 0
    for i in range(row_start[r], row_start[r + 1]):
        reach[machine[i]] = max(reach[machine[i]], min(n_alive[i], n_h))
    reach[n_m] = min(n_alive[n_rows + r], n_h)
    latest = reach[n_m]
    for m in range(n_m):
        until = n_h if full else max(reach[m], reach[n_m])
        _clear(acc[m], until)
        latest = max(latest, until)
    _clear(acc[n_m], n_h if full else latest)


@njit(cache=True)
def _sum_env(r, row_start, n_rows, rows, acc, reach, full):
    """Env r's machines' sums `acc[:M]` (of (M + 1, P, H, D)) over its running rows row_start[r] ..
    row_start[r + 1] - 1 and its head's planes `acc[M]` from row n_rows + r; `rows` the row arrays (see
    `recall_sums`); `reach` and the steps cleared as `_reach_and_clear` sets them."""
    (env, job, machine, best, n_best, n_own, young, t, start, n_alive, values, request, usage, duration,
     max_duration, squares, ok, done) = rows  # fmt: skip
    _reach_and_clear(r, row_start, n_rows, machine, n_alive, acc, reach, full)
    n_m = acc.shape[0] - 1
    # each row added at its machine's index (a view per row would cost a reference count)
    for i in range(row_start[r], row_start[r + 1]):
        _recall_agrees(i, env, job, best, n_best, n_own, usage, duration, ok, done)
        _add_row(i, acc, machine[i], env, best, n_best, ok, done, young, t, start, n_alive, values, request,
                 usage, duration, max_duration, squares)  # fmt: skip
    i = n_rows + r
    _recall_agrees(i, env, job, best, n_best, n_own, usage, duration, ok, done)
    _add_row(i, acc, n_m, env, best, n_best, ok, done, young, t, start, n_alive, values, request, usage, duration,
             max_duration, squares)  # fmt: skip


@njit(cache=True)
def _sum_env_median(r, row_start, n_rows, rows, acc0, reach, flat):
    """`_sum_env`'s median plane only: env r's machines' sums `acc0[:M]` (of (M + 1, H, D)) and its head's
    `acc0[M]`, each row's flat steps into `flat` (`_add_median`); `reach` and the steps cleared as
    `_reach_and_clear` sets them."""
    (env, job, machine, best, n_best, n_own, young, t, start, n_alive, values, request, usage, duration,
     max_duration, squares, ok, done) = rows  # fmt: skip
    n_m, n_h, n_d = acc0.shape[0] - 1, acc0.shape[1], acc0.shape[2]
    _reach_and_clear(
        r, row_start, n_rows, machine, n_alive, acc0.reshape((n_m + 1, 1, n_h, n_d)), reach, False
    )
    for i in range(row_start[r], row_start[r + 1]):
        _recall_agrees(i, env, job, best, n_best, n_own, usage, duration, ok, done)
        _add_median(i, acc0, machine[i], env, best, n_best, ok, done, young, t, start, n_alive, values, request,
                    usage, duration, max_duration, flat)  # fmt: skip
    i = n_rows + r
    _recall_agrees(i, env, job, best, n_best, n_own, usage, duration, ok, done)
    _add_median(i, acc0, n_m, env, best, n_best, ok, done, young, t, start, n_alive, values, request, usage,
                duration, max_duration, flat)  # fmt: skip


@njit(cache=True, inline="always")
def _covers(i, lo, hi, flat):
    """Whether row i's flat steps cover the segment lo .. hi - 1 (a segment between the rows' flat-step edges lies
    wholly inside or outside them)."""
    return flat[i, 0] <= lo and hi <= flat[i, 1]


@njit(cache=True, inline="always")
def _add_deviations(i, lo, hi, flat, values, dev):
    """dev (L, D) += row i's deviations (`_add_row`: each level's value above the median, 0 where below) where its
    flat steps cover the segment lo .. hi - 1 (`_covers`)."""
    if not _covers(i, lo, hi, flat):
        return
    for li in range(1, values.shape[1]):
        for d in range(values.shape[2]):
            x = values[i, li, d] - values[i, 0, d]
            if x > 0.0:
                dev[li, d] += x


@njit(cache=True)
def _machine_columns_linear(
    r, row_start, n_rows, rows, acc0, reach, flat, n_levels, cap, scratch, out, has_adv, adv, adv_share
):
    """`_machine_columns` without squares (rho = 1: each bound is the median's sum plus a deviation's) and with
    every capacity a power of two, from the median plane `acc0` (M + 1, H, D) (`_sum_env_median`, the head's at
    row M) and each row's flat steps: a peak share is the peak bound over the horizon divided by C_d (division by
    C_d > 0 keeps the order), and a mean share the bound's sum over the horizon per resource divided by C_d,
    summed and divided by H x D. The planes are integer units >= 0, so each share is a multiple of 1 / C_d and
    every sum of them is exact in any order: the same numbers. A deviation holds over its row's flat steps only,
    so on each segment between the machine's rows' (and the head's) flat-step edges every level's deviation sum is
    one constant: each level's peak there is the median's peak on the segment plus it, and each deviation's sum
    over the horizon its value times its row's flat steps, in O(M H D + rows L D) rather than O(M L H D). Steps
    past a machine's `reach` and the head's hold 0 and are not read; the machines without a running job share
    one set of columns (the head alone).

    Where `has_adv`, also a point rule's peak share of placing the head on each machine (`_recall_share_kernel`'s
    `share`) into adv_share[r], for the same rows with the point values `adv` (N, D) in place of the medians over
    their flat steps (the same flat steps: the same horizon, durations and young rows): on each segment its sums
    are the medians' plus one constant, the rows' differences adv - median where their flat steps cover it."""
    by_m, m_start, edges, dev, hdev, seg, total, tops = scratch
    machine, values = rows[2], rows[10]
    n_m, n_h, n_d = acc0.shape[0] - 1, acc0.shape[1], acc0.shape[2]
    lo_row, hi_row, head_row = row_start[r], row_start[r + 1], n_rows + r
    m_start[:] = 0  # the env's rows by machine (a counting sort in row order)
    for i in range(lo_row, hi_row):
        m_start[machine[i] + 1] += 1
    for m in range(n_m):
        m_start[m + 1] += m_start[m]
    for i in range(lo_row, hi_row):
        by_m[m_start[machine[i]]] = i
        m_start[machine[i]] += 1
    for m in range(n_m, 0, -1):  # back to each machine's first position
        m_start[m] = m_start[m - 1]
    m_start[0] = 0
    for m in range(n_m + 1):  # each plane's sum over the horizon
        for d in range(n_d):
            s = 0.0
            for h in range(reach[m]):
                s += acc0[m, h, d]
            total[m, 0, d] = s
            for li in range(1, n_levels):
                total[m, li, d] = 0.0
    for m in range(n_m + 1):
        k_lo, k_hi = (m_start[m], m_start[m + 1]) if m < n_m else (0, 1)
        for k in range(k_lo, k_hi):
            i = by_m[k] if m < n_m else head_row
            n_flat = np.float64(flat[i, 1] - flat[i, 0])
            for li in range(1, n_levels):
                for d in range(n_d):
                    x = values[i, li, d] - values[i, 0, d]
                    if x > 0.0:
                        total[m, li, d] += x * n_flat
    k_steps = np.float64(n_h * n_d)
    first_empty = -1
    for m in range(n_m):
        if reach[m] == 0 and first_empty >= 0:  # the same columns as the first machine without a job
            for c in range(out.shape[0]):
                out[c, r, m] = out[c, r, first_empty]
            if has_adv:
                adv_share[r, m] = adv_share[r, first_empty]
            continue
        if reach[m] == 0:
            first_empty = m
        end = max(reach[m], reach[n_m])  # past its own reach the machine's sums are 0
        edges[0], edges[1] = 0, end
        n_e = 2
        for k in range(m_start[m], m_start[m + 1] + 1):
            i = by_m[k] if k < m_start[m + 1] else head_row
            if flat[i, 1] > flat[i, 0]:
                edges[n_e], edges[n_e + 1] = flat[i, 0], flat[i, 1]
                n_e += 2
        for a in range(1, n_e):  # insertion sort: a handful of edges
            v = edges[a]
            c = a - 1
            while c >= 0 and edges[c] > v:
                edges[c + 1] = edges[c]
                c -= 1
            edges[c + 1] = v
        tops[:] = 0.0  # every bound is >= 0, and 0 where nothing is alive
        adv_top = 0.0
        for e in range(n_e - 1):
            lo, hi = edges[e], edges[e + 1]
            if lo >= hi:
                continue
            for d in range(n_d):  # the median's peak on the segment without and with the head
                sa, sw = acc0[m, lo, d], acc0[m, lo, d] + acc0[n_m, lo, d]
                for h in range(lo + 1, hi):
                    sa = max(sa, acc0[m, h, d])
                    sw = max(sw, acc0[m, h, d] + acc0[n_m, h, d])
                seg[0, d], seg[1, d] = sa, sw
            dev[:] = 0.0
            hdev[:] = 0.0
            for k in range(m_start[m], m_start[m + 1]):
                _add_deviations(by_m[k], lo, hi, flat, values, dev)
            _add_deviations(head_row, lo, hi, flat, values, hdev)
            for d in range(n_d):
                tops[0, d] = max(tops[0, d], seg[0, d])
                tops[1, d] = max(tops[1, d], seg[1, d])
                for li in range(1, n_levels):
                    tops[2 * li, d] = max(tops[2 * li, d], seg[0, d] + dev[li, d])
                    tops[2 * li + 1, d] = max(tops[2 * li + 1, d], seg[1, d] + (dev[li, d] + hdev[li, d]))
            if has_adv:  # the point rule's sums with the head: the medians' plus the rows' differences here
                for d in range(n_d):
                    diff = 0.0
                    for k in range(m_start[m], m_start[m + 1] + 1):
                        i = by_m[k] if k < m_start[m + 1] else head_row
                        if _covers(i, lo, hi, flat):
                            diff += adv[i, d] - values[i, 0, d]
                    x = (seg[1, d] + diff) / cap[d]
                    if x > adv_top:
                        adv_top = x
        if has_adv:
            adv_share[r, m] = adv_top
        for li in range(n_levels):
            for w in range(2):  # the machine's sums without the head, then with it
                top_share, mean = 0.0, 0.0
                for d in range(n_d):
                    top_share = max(top_share, tops[2 * li + w, d] / cap[d])
                    s = total[m, 0, d] + total[n_m, 0, d] if w == 1 else total[m, 0, d]
                    if li > 0:
                        s = s + (total[m, li, d] + total[n_m, li, d] if w == 1 else total[m, li, d])
                    mean += s / cap[d]
                col = li * 5 + w * 2
                out[col, r, m] = top_share
                out[col + 1, r, m] = mean / k_steps
        for li in range(n_levels):
            out[li * 5 + 4, r, m] = 1.0 if out[li * 5 + 2, r, m] <= 1.0 + 1e-9 else 0.0


@njit(cache=True, parallel=True)
def _recall_columns_kernel(
    row_start, rows, n_m, n_p, n_h, n_levels, rho, cap, skip, out, head_mean, has_adv, adv, adv_share, n_spans
):  # fmt: skip
    """The placer's columns `out` and the heads' mean medians `head_mean` (`recall_columns`); where `has_adv`
    (the linear columns only), a point rule's peak shares `adv_share` (B, M) from its values `adv` (N, D) for the
    same rows (`_machine_columns_linear`), every env's, finished ones too."""
    n_envs = row_start.shape[0] - 1
    n_rows, n_d = row_start[n_envs], rows[10].shape[2]
    squares = rows[15]
    linear = not squares
    for d in range(n_d):  # a power of two: every share exact (`_machine_columns_linear`)
        linear = linear and cap[d] > 0 and (cap[d] == 2.0 ** np.round(np.log2(cap[d])))
    most = 0  # the most running rows of one env
    for r in range(n_envs):
        most = max(most, row_start[r + 1] - row_start[r])
    flat = np.zeros((n_rows + n_envs, 2), dtype=np.int64)  # each row's flat steps (the linear path's)
    for c in prange(n_spans):
        lo, hi = _envs_of_span(c, n_envs, n_spans)
        # the machines' sums, then the head's planes: every plane, or the median's only on the linear path
        acc = np.empty((n_m + 1, n_p, n_h, n_d) if not linear else (1, 1, 1, 1))
        acc0 = np.empty((n_m + 1, n_h, n_d) if linear else (1, 1, 1))
        head = acc[acc.shape[0] - 1]
        share = np.empty(n_h * n_d)
        frames, values = np.empty((128, 3), dtype=np.int64), np.empty(128)  # `_pairwise_sum`'s stack
        scratch = (
            np.empty(max(most, 1), dtype=np.int64), np.empty(n_m + 2, dtype=np.int64),
            np.empty(2 * most + 4, dtype=np.int64), np.empty((n_levels, n_d)), np.empty((n_levels, n_d)),
            np.empty((2, n_d)), np.empty((n_m + 1, n_levels, n_d)), np.empty((2 * n_levels, n_d)),
        )  # fmt: skip
        reach = np.empty(n_m + 1, dtype=np.int64)
        for r in range(lo, hi):
            if linear:
                _sum_env_median(r, row_start, n_rows, rows, acc0, reach, flat)
            else:
                _sum_env(r, row_start, n_rows, rows, acc, reach, True)
            for d in range(n_d):
                s = 0.0
                for h in range(reach[n_m]):  # past the head's reach its planes are 0
                    s += acc0[n_m, h, d] if linear else head[0, h, d]
                head_mean[r, d] = s / n_h
            if linear and (has_adv or not skip[r]):
                _machine_columns_linear(
                    r, row_start, n_rows, rows, acc0, reach, flat, n_levels, cap, scratch, out, has_adv, adv,
                    adv_share,
                )  # fmt: skip
            if skip[r]:  # a finished env's columns are zeros (its rule's shares above are still every env's)
                for k in range(out.shape[0]):
                    for m in range(n_m):
                        out[k, r, m] = 0.0
            elif not linear:
                _machine_columns(r, acc[:n_m], head, n_levels, rho, squares, cap, share, frames, values, out)
    return linear  # whether `adv_share` was written (where `has_adv`)


@njit(cache=True, parallel=True)
def _recall_share_kernel(row_start, rows, n_m, n_p, n_h, rho, inflation, cap, share, n_spans):
    n_envs = row_start.shape[0] - 1
    n_rows, n_d = row_start[n_envs], rows[10].shape[2]
    for c in prange(n_spans):
        lo, hi = _envs_of_span(c, n_envs, n_spans)
        acc = np.empty((n_m + 1, n_p, n_h, n_d))  # the machines' sums, then the head's planes
        head = acc[n_m]
        reach = np.empty(n_m + 1, dtype=np.int64)
        for r in range(lo, hi):
            _sum_env(r, row_start, n_rows, rows, acc, reach, False)
            for m in range(n_m):
                # past both reaches every sum is 0 and so is the bound (sqrt(0) = 0): the peak is over the rest,
                # and 0 where nothing is alive (every bound is >= 0)
                top = 0.0
                for h in range(max(reach[m], reach[n_m])):
                    for d in range(n_d):
                        s_mu = acc[m, 0, h, d] + head[0, h, d]
                        s_d, s_d2 = 0.0, 0.0
                        if n_p > 1:  # a forecaster with a deviation: `head_bounds`' sums, the head's added
                            s_d = acc[m, 1, h, d] + head[1, h, d]
                            s_d2 = acc[m, 2, h, d] + head[1, h, d] * head[1, h, d]
                        bound = s_mu + inflation * np.sqrt(rho * (s_d * s_d) + (1.0 - rho) * s_d2)
                        x = bound / cap[d]
                        if x > top:
                            top = x
                share[r, m] = top
