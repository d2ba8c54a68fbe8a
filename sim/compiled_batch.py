"""The simulator's per-decision bookkeeping compiled (numba; issue 22, item 8): the queue rotation of a job pick
(`sim.jobs.JobBatch.rotate_in_place`), the label check of `sim.core.relabel`, the job check of
`sim.core.validate_jobs`, and recall's views and overlay (`sim.forecast.recall_view`, `RecallOverlay`). Each
kernel does what the numpy code does, in one pass instead of a few whole-batch array operations; where a check
finds a bad entry, the numpy code runs instead and raises its own error, so the messages (and the rows they name)
are the numpy path's. Moves, copies and comparisons only: the results are the numpy path's exactly. Tests:
tests/sim/test_compiled_batch.py, tests/sim/test_recall.py.

The kernels are serial: the bookkeeping moves or reads a few bytes per job, below what starting numba's threads
costs; recall's view and overlay kernels (about 1.5 s each of DeepPlace's 40 s per 125k decisions) could take
threads. `best_runs` replaced a sort of every job of the rows per decision: 0.30-0.38 against 1.7-3.3 ms per call
(DeepPlace 50 %, 128 envs).
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


def recall_runs(
    usage: np.ndarray,
    duration: np.ndarray,
    env: np.ndarray,
    job: np.ndarray,
    best: np.ndarray,
    n_best: np.ndarray,
    n_own: np.ndarray,
    dest: np.ndarray,
    runs: np.ndarray,
    out: np.ndarray,
    n_runs: np.ndarray,
    complete: np.ndarray,
) -> None:
    """IN PLACE, the rest of `sim.forecast.recall_view` for the queries with an earlier run: query i (job job[i]
    of env env[i], row dest[i] of the outputs) recalls run best[i] where that run agrees with every step both
    have shown (n_own[i] and n_best[i] steps observed) and, when it has finished, the query has not outlived it:
    `out[dest[i]]` (T, D, NaN-filled) gets the run's observed usage, 0 after its end; `n_runs` the runs
    (`runs[i]`) or 0, `complete` whether the run has finished. Integer comparisons and copies: the numpy path's
    values."""
    _recall_runs(usage, duration, env, job, best, n_best, n_own, dest, runs, out, n_runs, complete)


@njit(cache=True)
def _recall_runs(usage, duration, env, job, best, n_best, n_own, dest, runs, out, n_runs, complete):
    n_t, n_d = out.shape[1], out.shape[2]
    for i in range(env.shape[0]):
        e, j, b = env[i], job[i], best[i]
        nb, no = n_best[i], n_own[i]
        agrees = True
        for a in range(min(no, nb, n_t)):
            for d in range(n_d):
                if usage[e, b, a, d] != usage[e, j, a, d]:
                    agrees = False
        done = nb >= duration[e, b]
        if done and no > duration[e, b]:
            agrees = False
        ok = nb > 0 and agrees
        n_runs[dest[i]] = runs[i] if ok else 0
        complete[dest[i]] = ok and done
        if not ok:
            continue
        for a in range(n_t):
            if done and a >= duration[e, b]:
                for d in range(n_d):
                    out[dest[i], a, d] = 0.0
            elif a < nb:
                for d in range(n_d):
                    out[dest[i], a, d] = np.float64(usage[e, b, a, d])


def best_runs(
    codes: np.ndarray, started: np.ndarray, n_obs: np.ndarray, n_codes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top1, top2, n_started) of `sim.forecast._best_runs`: per group r * n_codes + code of the rows of `codes`
    (R, J), the started job observed longest and the next (job index, -1 if none; ties: the earlier job) and how
    many started, in one pass over the jobs instead of a sort of every job of the rows."""
    size = codes.shape[0] * max(n_codes, 1)
    top1 = np.full(size, -1, dtype=np.int64)
    top2, n_started = top1.copy(), np.zeros(size, dtype=np.int64)
    _best_runs(codes, started, n_obs, max(n_codes, 1), top1, top2, n_started)
    return top1, top2, n_started


@njit(cache=True)
def _best_runs(codes, started, n_obs, n_codes, top1, top2, n_started):
    for r in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            if not started[r, j] or codes[r, j] < 0:
                continue
            g = r * n_codes + codes[r, j]
            n_started[g] += 1
            seen = n_obs[r, j]
            first = top1[g]
            if first < 0:
                top1[g] = j
            elif seen > n_obs[r, first]:  # jobs come in index order: a tie keeps the earlier job first
                top2[g] = first
                top1[g] = j
            elif top2[g] < 0 or seen > n_obs[r, top2[g]]:
                top2[g] = j
