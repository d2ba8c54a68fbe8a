"""The labels an age-table labeller serves (`sim.labelling.AgeTableLabeller.labels`) gathered by one numba kernel
over the envs (issue 22, item 8): for each job the observation shows (waiting, or placed and running or still in
the image's h-step history), its stored label at its observed age; every other job keeps the label the state shows.
Integer gathers only, so the labels are the numpy path's exactly. It returns None where a (job, age) has not been
predicted yet: the numpy path then predicts it and fills the store. One body per env (`_env`), on numba's threads
for a large batch (`sim.compiled_step.on_threads`). Tests: tests/models/test_sim_labeller.py."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from sim.compiled_step import on_threads


def served_labels(
    shown: np.ndarray,
    t: np.ndarray,
    next_job: np.ndarray,
    n_arrived: np.ndarray,
    job_machine: np.ndarray,
    job_start: np.ndarray,
    duration: np.ndarray,
    n_jobs: np.ndarray,
    history_steps: int,
    ids: np.ndarray,
    store: np.ndarray,
    n_ages: int,
) -> np.ndarray | None:
    """(B, J) int64 labels (module docstring) or None; `shown` the state's observed labels, `ids` each job's row of
    `store` (rows, ages) int16 (-1 = not predicted), ages past `n_ages` - 1 read the last."""
    out = np.empty(shown.shape, dtype=np.int64)
    kernel = _kernel_parallel if on_threads(shown.shape[0]) else _kernel
    ok = kernel(
        shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, int(history_steps), ids, store,
        int(n_ages), out,
    )  # fmt: skip
    return out if ok else None


@njit(cache=True)
def _env(
    b, shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, history_steps, ids, store, n_ages,
    out,
):  # fmt: skip
    """Env b's labels (the body both kernels run per env); False where one is not predicted yet."""
    first_row = t[b] - history_steps + 1
    for j in range(shown.shape[1]):
        out[b, j] = shown[b, j]
        if j >= n_jobs[b]:
            continue
        is_placed = job_machine[b, j] >= 0
        is_waiting = j >= next_job[b] and j < n_arrived[b]
        if not (is_waiting or (is_placed and job_start[b, j] + duration[b, j] > first_row)):
            continue
        age = 0
        if is_placed:
            age = min(max(t[b] - job_start[b, j], 0), duration[b, j])
        label = store[ids[b, j], min(age, n_ages - 1)]
        if label < 0:
            return False
        out[b, j] = label
    return True


@njit(cache=True)
def _kernel(
    shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, history_steps, ids, store, n_ages, out
):  # fmt: skip
    for b in range(shown.shape[0]):
        if not _env(
            b, shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, history_steps, ids, store,
            n_ages, out,
        ):  # fmt: skip
            return False
    return True


@njit(cache=True, parallel=True)
def _kernel_parallel(
    shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, history_steps, ids, store, n_ages, out
):  # fmt: skip
    ok = np.ones(shown.shape[0], dtype=np.bool_)
    for b_ in prange(shown.shape[0]):
        b = np.int64(b_)  # prange's index is uint64; as int64 the body is the serial kernel's code
        ok[b] = _env(
            b, shown, t, next_job, n_arrived, job_machine, job_start, duration, n_jobs, history_steps, ids, store,
            n_ages, out,
        )  # fmt: skip
    return ok.all()
