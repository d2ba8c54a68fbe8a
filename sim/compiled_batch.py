"""The simulator's per-decision bookkeeping compiled (numba; issue 22, item 8): the queue rotation of a job pick
(`sim.jobs.JobBatch.rotate_in_place`), the label check of `sim.core.relabel`, the job check of
`sim.core.validate_jobs`, the per-machine sums of wide rows (`sim.core.sum_by_cell`) and the recall overlay
(`sim.forecast.RecallOverlay`). Each kernel does what the numpy code does, in one pass over the envs instead of a few
whole-batch array operations (the sums without sorting and copying the rows first); where a check finds a bad entry, the numpy code runs instead and raises its own
error, so the messages (and the rows they name) are the numpy path's. Integer moves and comparisons only: the
results are the numpy path's exactly. Tests: tests/sim/test_compiled_batch.py.

The kernels are small and serial: they move or read a few bytes per job, far below what starting numba's threads
costs.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def rotate_rows(values: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """IN PLACE: entries lo[i] .. hi[i] of row rows[i] of `values` (B, J, ...) rotate right by one (entry hi[i]
    lands on lo[i]), as `values[r, to] = values[r, frm]` with `sim.jobs.rotation_index` does. False (nothing
    moved) where `values` is not C-contiguous or holds other than bools, integers or floats: the caller then moves
    it with numpy."""
    if not values.flags.c_contiguous or values.ndim < 2 or values.dtype.kind not in "biuf":
        return False
    flat = values.reshape(values.shape[0], values.shape[1], -1)
    _rotate(flat, rows, lo, hi)
    return True


@njit(cache=True)
def _rotate(values, rows, lo, hi):
    width = values.shape[2]
    held = np.empty(width, dtype=values.dtype)
    for i in range(rows.shape[0]):
        r, a, b = rows[i], lo[i], hi[i]
        for k in range(width):
            held[k] = values[r, b, k]
        for j in range(b, a, -1):
            for k in range(width):
                values[r, j, k] = values[r, j - 1, k]
        for k in range(width):
            values[r, a, k] = held[k]


def clean_labels(labels: np.ndarray, n_jobs: np.ndarray, n_labels: int) -> np.ndarray | None:
    """(B, J) int64: `labels` where a job is real, 0 on padding, as `sim.core.relabel` stores them; None where a
    real job's label lies outside 0 .. n_labels - 1 (relabel then names it)."""
    out = np.empty(labels.shape, dtype=np.int64)
    if not _clean_labels(labels, n_jobs.astype(np.int64, copy=False), int(n_labels), out):
        return None
    return out


@njit(cache=True)
def _clean_labels(labels, n_jobs, n_labels, out):
    ok = True
    for b in range(labels.shape[0]):
        for j in range(labels.shape[1]):
            if j < n_jobs[b]:
                v = np.int64(labels[b, j])
                if v < 0 or v >= n_labels:
                    ok = False
                out[b, j] = v
            else:
                out[b, j] = 0
    return ok


def jobs_fit(
    usage: np.ndarray,
    request: np.ndarray,
    ec_label: np.ndarray,
    n_jobs: np.ndarray,
    cap: np.ndarray,
    n_labels: int,
) -> bool:
    """Whether every real job of the batch has a label in 0 .. n_labels - 1 and usage (B, J, T, D) and request
    (B, J, D) within `cap` (D,) in every step: what `sim.core.validate_jobs` checks, in one pass."""
    return bool(
        _jobs_fit(
            usage, request, ec_label, n_jobs.astype(np.int64, copy=False), cap.astype(np.int64), int(n_labels)
        )
    )


@njit(cache=True)
def _jobs_fit(usage, request, ec_label, n_jobs, cap, n_labels):
    n_t, n_d = usage.shape[2], usage.shape[3]
    for b in range(usage.shape[0]):
        for j in range(min(n_jobs[b], usage.shape[1])):
            if ec_label[b, j] < 0 or ec_label[b, j] >= n_labels:
                return False
            for d in range(n_d):
                if request[b, j, d] > cap[d]:
                    return False
            for s in range(n_t):
                for d in range(n_d):
                    if usage[b, j, s, d] > cap[d]:
                        return False
    return True


def sum_rows(values: np.ndarray, cell: np.ndarray, n_cells: int) -> np.ndarray | None:
    """(n_cells, ...) float64: the rows of `values` (N, ...) summed per `cell` (N,) in the rows' own dtype and
    order, cells without rows 0: exactly `np.add.reduceat` over the rows sorted stably by cell
    (`sim.core.sum_by_cell`'s wide path), whose segment sum is the first row plus numpy's pairwise sum of the
    others (`_pairwise`), without copying the sorted rows. None where a cell lies outside 0 .. n_cells - 1 (the
    numpy path then raises) or a cell has more than `PAIRWISE_BLOCK` + 1 rows (numpy then splits the sum in
    halves; a machine rarely runs that many jobs)."""
    cell = np.asarray(cell, dtype=np.int64)
    width = int(np.prod(values.shape[1:], dtype=np.int64))  # -1 cannot stand for it when there are no rows
    flat = np.ascontiguousarray(values).reshape(values.shape[0], width)
    acc = np.zeros((n_cells, width), dtype=flat.dtype)
    if cell.size:
        if cell.min() < 0 or cell.max() >= n_cells:
            return None
        order = np.argsort(cell, kind="stable")
        if not _sum_rows(flat, cell, order, acc, flat.dtype.type(0)):
            return None
    return acc.astype(np.float64, copy=False).reshape(n_cells, *values.shape[1:])


PAIRWISE_BLOCK = 128
"""numpy's pairwise-sum block (`PW_BLOCKSIZE`): up to this many terms it sums with 8 partial sums."""


@njit(cache=True, inline="always")
def _pairwise(values, order, lo, n, k, zero):
    """numpy's pairwise sum (`pairwise_sum` in its loops, n <= PAIRWISE_BLOCK) of values[order[lo + i], k] over
    i < n: one running sum below 8 terms, else 8 interleaved partial sums combined as a tree, then the rest."""
    if n < 8:
        res = zero
        for i in range(n):
            res += values[order[lo + i], k]
        return res
    r0, r1 = values[order[lo], k], values[order[lo + 1], k]
    r2, r3 = values[order[lo + 2], k], values[order[lo + 3], k]
    r4, r5 = values[order[lo + 4], k], values[order[lo + 5], k]
    r6, r7 = values[order[lo + 6], k], values[order[lo + 7], k]
    i = 8
    while i < n - (n % 8):
        r0 += values[order[lo + i], k]
        r1 += values[order[lo + i + 1], k]
        r2 += values[order[lo + i + 2], k]
        r3 += values[order[lo + i + 3], k]
        r4 += values[order[lo + i + 4], k]
        r5 += values[order[lo + i + 5], k]
        r6 += values[order[lo + i + 6], k]
        r7 += values[order[lo + i + 7], k]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += values[order[lo + i], k]
        i += 1
    return res


@njit(cache=True)
def _sum_rows(values, cell, order, acc, zero):
    """Per run of equal cells in `order`: the first row plus the pairwise sum of the rest (numpy's reduce: the
    output starts as the first element and adds the pairwise sum of the others). False where a run is longer
    than PAIRWISE_BLOCK + 1 rows."""
    n = order.shape[0]
    lo = 0
    while lo < n:
        c = cell[order[lo]]
        hi = lo + 1
        while hi < n and cell[order[hi]] == c:
            hi += 1
        if hi - lo - 1 > PAIRWISE_BLOCK:
            return False
        for k in range(values.shape[1]):
            first = values[order[lo], k]
            acc[c, k] = (
                first if hi - lo == 1 else first + _pairwise(values, order, lo + 1, hi - lo - 1, k, zero)
            )
        lo = hi
    return True


def overlay_recall(
    out: np.ndarray,
    usage: np.ndarray,
    view_rows: np.ndarray,
    dest: np.ndarray,
    t: np.ndarray,
    start: np.ndarray,
    max_duration: int,
) -> None:
    """IN PLACE: for each recalled job i, `out[dest[i]]`'s every level (out (N, L, H, D), or (N, H, D)) at
    horizon step h takes the recalled usage `usage[view_rows[i], age, :]` at its age t[i] + 1 + h - start[i]
    where that is finite, and 0 past the last age (`RecallOverlay._overlay`: the same copies, without its
    (n, H, D) temporaries)."""
    out4 = out if out.ndim == 4 else out.reshape(out.shape[0], 1, *out.shape[1:])
    _overlay_recall(out4, usage, view_rows, dest, t, start, int(max_duration))


@njit(cache=True)
def _overlay_recall(out, usage, view_rows, dest, t, start, max_duration):
    n_l, n_h, n_d = out.shape[1], out.shape[2], out.shape[3]
    for i in range(dest.shape[0]):
        for h in range(n_h):
            age = t[i] + 1 + h - start[i]
            for d in range(n_d):
                v = 0.0
                if age < max_duration:
                    v = usage[view_rows[i], max(age, 0), d]
                if np.isfinite(v):
                    for li in range(n_l):
                        out[dest[i], li, h, d] = v
