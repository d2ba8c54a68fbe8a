"""Per-machine sums over each env's running jobs, carried from one decision of a rollout to the next.

A rule that bounds a machine's summed forecast (`sim.risk.head_bounds`) and the learned placer's features
(`models.forecast_placer`) sum, at every decision, one array per running job (its forecast over the horizon, its
flat quantiles) per machine. Between two decisions at the same step t the running jobs of an env only gain the
jobs placed since: a job leaves only as time advances, a job pick reorders only waiting jobs, and a running job's
forecast reads only its own view at t. So the sums of such an env are the previous sums plus the new jobs' values,
and only those are computed. Each env's placements at the last count (machine and start of every job placed
then) must be unchanged, so a state from another branch of the same episode (the same batch and t, other
placements) is recounted, not mistaken for a continuation. A forecaster that reads other runs of the job's
workload (recall, `sim.forecast.RecallOverlay`) adds one case: a run started at t shows only its first step, which
no earlier job's forecast reads (it forecasts ages from its own observed count on), unless that run has ended
already (a one-step job), and then an earlier job of its workload may recall its end; an env where such a job was
placed since is counted anew. Anything else (another batch, t advanced, a job gone, another key) recounts the
env.

Exact up to the order of float additions (integer units sum exactly; `tests/sim/test_running_sums.py` checks
the sums and the decisions against a recount on every state of rollouts).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable

import numpy as np

from sim.core import State, jobs_running, sum_by_cell
from sim.forecast import RecallOverlay


def reads_other_runs(forecaster) -> bool:
    """Whether a forecaster's value for a job may read other runs of its workload (recall at any layer)."""
    seen = 0
    while forecaster is not None and seen < 8:
        if isinstance(forecaster, RecallOverlay):
            return True
        forecaster, seen = getattr(forecaster, "inner", None), seen + 1
    return False


class RunningSums:
    """One key's per-machine sums over each env's running jobs (module docstring), per env: the step they were
    counted at and the running jobs in them. Not thread-safe: one per rollout or per thread (`for_thread`)."""

    def __init__(self) -> None:
        self._jobs: weakref.ref | None = None
        self._key: Hashable = None
        self._t = np.zeros(0, dtype=np.int64)
        self._counted = np.zeros((0, 0), dtype=bool)
        self._machine = np.zeros((0, 0), dtype=np.int64)
        self._start = np.zeros((0, 0), dtype=np.int64)
        self._acc: np.ndarray | None = None
        self.n_carried = 0
        """Running jobs whose values were carried (not computed) so far, over every call."""
        self.n_computed = 0
        """Running jobs whose values were computed so far."""

    def per_machine(
        self,
        state: State,
        n_machines: int,
        key: Hashable,
        compute: Callable[[np.ndarray, np.ndarray], np.ndarray],
        rows: np.ndarray | None = None,
        reads_runs: bool = False,
        extra: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(sums (R, M, ...) over the running jobs of envs `rows` (all when None), in that order (for every env in
        order, the memo's own array: read it before the next call, never write it); the values of
        the `extra` (env, job) queries (e.g. the queue heads) or None; how many running jobs were computed).
        `compute(env, job)` gives one array per job (N, ...), the same trailing shape for one `key`; it is
        called once per decision, with the running jobs to add and then the extra queries. `reads_runs`: the
        values may read other runs of a job's workload (`reads_other_runs`)."""
        n_envs = state.batch_size
        rows = np.arange(n_envs) if rows is None else np.asarray(rows, dtype=np.int64)
        running = jobs_running(state)
        same = (
            self._acc is not None
            and self._jobs is not None
            and self._jobs() is state.jobs
            and self._key == key
            and self._counted.shape == running.shape
        )
        if not same:
            self._jobs, self._key, self._acc = weakref.ref(state.jobs), key, None
            self._t = np.full(n_envs, -1, dtype=np.int64)
            self._counted = np.zeros(running.shape, dtype=bool)
            self._machine = np.full(running.shape, -1, dtype=np.int64)
            self._start = np.zeros(running.shape, dtype=np.int64)
        now, before = running[rows], self._counted[rows]
        machine, start = state.job_machine[rows], state.job_start[rows]
        was = self._machine[rows]
        moved = (was >= 0) & ((machine != was) | (start != self._start[rows]))
        kept = (self._t[rows] == state.t[rows]) & ~((before & ~now) | moved).any(axis=1)
        if reads_runs and kept.any():  # a new one-step run an earlier job of its workload may recall
            one_step = now & ~before & (state.jobs.duration[rows] <= 1)
            kept &= ~_new_run_of_a_started_workload(state, rows, one_step)
        need = now & ~(before & kept[:, None])
        ri, ji = np.nonzero(need)
        n_run = ri.size
        env, job = rows[ri], ji
        if extra is not None:
            env, job = np.concatenate([env, extra[0]]), np.concatenate([job, extra[1]])
        values = compute(env, job)
        if self._acc is None:
            self._acc = np.zeros((n_envs, n_machines, *values.shape[1:]))
        added = sum_by_cell(
            values[:n_run], ri * n_machines + state.job_machine[env[:n_run], ji], rows.size * n_machines
        )
        every = rows.size == n_envs and bool((rows == np.arange(n_envs)).all())
        # every env in order (a rollout's features): the sums in place; else a copy (fancy index) written back
        acc = self._acc if every else self._acc[rows]
        acc[~kept] = 0.0
        acc += added.reshape(acc.shape)
        if not every:
            self._acc[rows] = acc
        self.n_computed += n_run
        self.n_carried += int(now.sum()) - n_run
        self._counted[rows] = now
        self._machine[rows], self._start[rows] = machine, start
        self._t[rows] = state.t[rows]
        return acc, (values[n_run:] if extra is not None else None), n_run

    def __getstate__(self) -> dict:  # a copied or pickled owner starts with no sums (and no weakref)
        return {}

    def __setstate__(self, _state: dict) -> None:
        self.__init__()


def _new_run_of_a_started_workload(state: State, rows: np.ndarray, new: np.ndarray) -> np.ndarray:
    """(R,) bool: envs `rows` where a job of `new` (R, J) shares its workload code with another job that has
    started (placed, running or finished)."""
    out = np.zeros(rows.size, dtype=bool)
    has_new = new.any(axis=1)
    if not has_new.any():
        return out
    sub = rows[has_new]
    codes = state.jobs.workload_code[sub]  # (S, J), -1 = unknown
    started = state.job_machine[sub] >= 0
    n_codes = int(codes.max(initial=-1)) + 2
    key = np.arange(sub.size)[:, None] * n_codes + (codes + 1)
    count = np.bincount(key[started & (codes >= 0)], minlength=sub.size * n_codes)
    # a new job's code counted more than once: another started job has it (the new job is started itself)
    shared = (new[has_new] & (codes >= 0) & (count[key] > 1)).any(axis=1)
    out[has_new] = shared
    return out


_THREAD = threading.local()


def for_thread(key: Hashable, owner: object) -> RunningSums:
    """This thread's `RunningSums` for `owner` (held weakly: gone with it) and `key`; a few kept at once."""
    held: dict = getattr(_THREAD, "held", None) or {}
    _THREAD.held = held
    for k in [k for k, (ref, _) in held.items() if ref() is None]:
        del held[k]
    full = (id(owner), key)
    hit = held.get(full)
    if hit is None or hit[0]() is not owner:
        if len(held) >= 4:
            del held[next(iter(held))]
        hit = held[full] = (weakref.ref(owner), RunningSums())
    return hit[1]
