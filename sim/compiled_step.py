"""`sim.core.step` compiled (numba) for a state its caller owns: the same transition, written into the state's own
arrays instead of copies (issue 22, item 8: the first compiled piece of the training loop).

`core.step(..., in_place=True)` comes here when `supports(cfg, trace)`; every other call keeps the vectorised
numpy step. The kernel walks one env at a time through what `core.step` does for the batch: place the head
(`core._place`), then close steps (`core._advance_idle`: the held step, then idle windows of at most
`core._MAX_WINDOW` steps until a job arrives or the episode ends), crediting each closed step's penalties in step
order (`core._close_window`), shifting the history (`core._push_past`) and marking first overshoots
(`core._first_overshoots`). Its numbers are those of the numpy step to the bit, not just close:

- contention, overshoot and wait are one float product each, as there; the under-utilisation sum adds integers
  below 2^53 (`supports` requires an integer K_u in 1..8 with C_d^K_u < 2^53, or K_u = 0), so any order gives
  the same float;
- per env, the components are added to a zero row in step order, as `np.add.at` adds them; the charge for jobs left
  unplaced at truncation is computed by the numpy code itself (`core._unplaced_charges`, a pairwise sum over jobs)
  and added after the kernel, where the numpy step adds it too (to the zero "unplaced" entry of the env's row);
- the history holds float32(units) x float32(1 / C_d) clipped at 1, as there.

A `Trace` is filled as the numpy step fills it (the rows of closed steps below its length). Not supported (the
numpy step runs): a non-integer K_u. Purity is the caller's to give up:
the input state's arrays ARE the output's (`in_place`), so only a caller that keeps no earlier state may ask for
it (`models.forecast_placer.run_rollout` without a callback, the bare step rate). The JobBatch is only read.
tests/sim/test_rollout_equivalence.py steps random valid actions through both and compares every field after every call.

Envs share nothing, so a batch of at least `PARALLEL_MIN_ENVS` envs is stepped on numba's threads (`prange`, as
many spans as `numba.get_num_threads()`; `NUMBA_NUM_THREADS=1` turns it off); a smaller one in one span, where
starting threads would cost more than they save (`launch`). Each span is one call of `_env_steps`: the same
numbers either way.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from sim.config import SimConfig

NO_NOISE = np.zeros((1, 1, 1, 1), dtype=np.int16)
"""The noise argument of a kernel whose state has no noise (numba needs an array of the same type)."""

PARALLEL_MIN_ENVS = 64
"""Batches of at least this many envs run a kernel's per-env bodies on numba's threads (here and in
`sim.compiled_decision`)."""


def on_threads(n_envs: int) -> bool:
    """Whether a kernel over `n_envs` envs runs on numba's threads (`PARALLEL_MIN_ENVS`, more than one thread)."""
    return n_envs >= PARALLEL_MIN_ENVS and numba.get_num_threads() > 1


def launch(kernel, threaded: bool, *args):
    """`kernel(*args, n_spans)`: a prange kernel that runs its envs in `n_spans` contiguous spans, each with its
    scratch allocated once (11-16 % of the decision kernel's time at M = 10, B x N = 400): one span per numba
    thread where `threaded` (the caller's `on_threads` of its batch, as numba splits a prange), else one span. The
    count is passed in because a thread count read inside a kernel is a dynamic global, which numba does not
    cache. There is no serial twin: the same bodies compiled into a plain `njit` kernel ran 1.3-1.5x slower than
    one span of the prange kernel, with the same numbers (the README configuration's decision kernel: 4.8 against
    3.3 ms per 400 envs on one thread; its training rollout on one numba thread 52.9k against 72.3k decisions/s)."""
    return kernel(*args, numba.get_num_threads() if threaded else 1)


@njit(cache=True, inline="always")
def envs_of_span(c, n_envs, n_spans):
    """[lo, hi) envs of span c of n_spans (`launch`). `sim.compiled_decision` keeps its own copy (numba's cache
    notices a kernel's own file only)."""
    c = np.int64(c)
    return c * n_envs // n_spans, (c + 1) * n_envs // n_spans


_TRACE_ROWS = ("usage", "background", "is_active", "queue_length", "contention", "penalties")
"""The `sim.core.Trace` arrays the kernel fills, in its argument order."""
_NO_TRACE = (
    np.zeros((1, 1, 1, 1), dtype=np.int16),
    np.zeros((1, 1, 1, 1), dtype=np.int16),
    np.zeros((1, 1, 1), dtype=bool),
    np.zeros((1, 1), dtype=np.int64),
    np.zeros((1, 1), dtype=np.int64),
    np.zeros((1, 1, 1), dtype=np.float64),
)


def supports(cfg: SimConfig, trace) -> bool:
    """Whether the compiled step gives exactly the numpy step's numbers for this configuration (module docstring)."""
    k = float(cfg.k_underutil)
    if k == 0:
        return True
    return k.is_integer() and 1 <= k <= 8 and max(cfg.capacity_units) ** int(k) < 2**53


def step_in_place(
    cfg: SimConfig,
    fields: dict,
    actions: np.ndarray,
    is_placed: np.ndarray,
    is_hold: np.ndarray,
    pen: np.ndarray,
    max_window: int,
    trace=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel on a state's field dict (its arrays written in place); `pen` (B, C) zeros receives each env's
    penalty components, `trace` (a `sim.core.Trace` or None) the closed steps' rows. Returns (steps closed per env
    (B,), envs truncated by this call (B,) bool)."""
    jobs = fields["jobs"]
    noise = fields["noise"]
    n_envs = fields["t"].shape[0]
    n_closed = np.zeros(n_envs, dtype=np.int64)
    is_cut = np.zeros(n_envs, dtype=bool)
    cap = np.asarray(cfg.capacity_units, dtype=np.int64)
    inv_cap = (1.0 / cap.astype(np.float32)).astype(np.float32)
    past = fields["past"]
    if not past.flags.writeable or not past.flags.c_contiguous:
        fields["past"] = past = np.ascontiguousarray(past).copy()
    recorded = _NO_TRACE if trace is None else tuple(getattr(trace, name) for name in _TRACE_ROWS)
    if not fields["has_overshot"].flags.writeable:
        fields["has_overshot"] = fields["has_overshot"].copy()
    args = (
        fields["t"],
        fields["next_job"],
        fields["n_arrived"],
        fields["timeline"],
        fields["overlap"],
        past,
        fields["busy_until"],
        fields["job_machine"],
        fields["job_start"],
        fields["has_overshot"],
        fields["is_terminated"],
        fields["is_truncated"],
        jobs.usage,
        jobs.duration,
        jobs.arrival_step,
        jobs.n_jobs,
        NO_NOISE if noise is None else noise,
        noise is not None,
        actions,
        is_placed,
        is_hold,
        cap,
        inv_cap,
        float(cfg.k_contention),
        int(cfg.k_underutil),
        float(cfg.k_overshoot),
        float(cfg.k_wait),
        int(cfg.max_steps),
        int(max_window),
        pen,
        n_closed,
        is_cut,
        trace is not None,
        *recorded,
    )
    _, _, n_m, n_d = fields["timeline"].shape
    launch(_kernel_parallel, on_threads(n_envs), args, n_envs, n_m, n_d)
    return n_closed, is_cut


@njit(cache=True)
def _env_steps(
    lo,
    hi,
    is_short,
    t,
    next_job,
    n_arrived,
    timeline,
    overlap,
    past,
    busy_until,
    job_machine,
    job_start,
    has_overshot,
    is_terminated,
    is_truncated,
    usage,
    duration,
    arrival_step,
    n_jobs,
    noise,
    has_noise,
    actions,
    is_placed,
    is_hold,
    cap,
    inv_cap,
    k_c,
    k_u,
    k_o,
    k_w,
    max_steps,
    max_window,
    pen,
    n_closed,
    is_cut,
    has_trace,
    tr_usage,
    tr_background,
    tr_active,
    tr_queue,
    tr_contention,
    tr_penalties,
):
    """Envs lo .. hi - 1 stepped (the body `_kernel_parallel` runs per span of envs; envs share no state): one
    call per span, not per env, as a call's arguments cost about a microsecond per env; `is_short` (M, D) bool
    scratch, written before it is read."""
    width, n_m, n_d = timeline.shape[1], timeline.shape[2], timeline.shape[3]
    n_j = duration.shape[1]
    t_max = usage.shape[2]
    hist = past.shape[1]
    window_cap = min(width, max_window)
    n_recorded = tr_usage.shape[1] if has_trace else 0
    for b in range(lo, hi):
        if is_placed[b]:  # core._place
            j = next_job[b]
            t0 = t[b]
            m = actions[b]
            for k in range(t_max):
                slot = (t0 + k) % width
                pair = 0
                for d in range(n_d):
                    u = np.int64(usage[b, j, k, d])
                    c = np.int64(timeline[b, slot, m, d])
                    pair += u * c
                    timeline[b, slot, m, d] = c + u
                overlap[b, slot] += pair
            job_machine[b, j] = m
            job_start[b, j] = t0
            end = t0 + duration[b, j]
            if end > busy_until[b, m]:
                busy_until[b, m] = end
            next_job[b] = j + 1
        is_forced = is_hold[b]
        while True:  # core._advance_idle
            is_idle = n_arrived[b] == next_job[b] and not (is_terminated[b] or is_truncated[b])
            if not (is_idle or is_forced):
                break
            t0 = t[b]
            n_steps = 1
            if is_idle:  # core._idle_steps
                head = next_job[b]
                if head < n_jobs[b]:
                    end = arrival_step[b, min(head, n_j - 1)]
                else:
                    end = t0 + 1
                    for m in range(n_m):
                        end = max(end, busy_until[b, m])
                end = min(end, max_steps)
                n_steps = max(min(end - t0, window_cap), 1)
            # core._close_window and core._push_past: shift the history first, then write each closed step's row
            if n_steps < hist:
                for r in range(hist - n_steps):
                    # element by element: a row copy would compile numba's shape-error path
                    for m in range(n_m):
                        for d in range(n_d):
                            past[b, r, m, d] = past[b, r + n_steps, m, d]
            qlen = n_arrived[b] - next_job[b]
            for i in range(n_steps):
                ps = t0 + i
                slot = ps % width
                p_contention = -k_c * np.float64(overlap[b, slot])
                under = 0.0
                has_short = False
                row = hist - n_steps + i
                is_recorded = ps < n_recorded
                for m in range(n_m):
                    is_used = busy_until[b, m] > ps
                    if is_recorded:
                        tr_active[b, ps, m] = is_used
                    for d in range(n_d):
                        total = np.int64(timeline[b, slot, m, d])
                        if has_noise:
                            total += np.int64(noise[b, ps, m, d])
                        if is_recorded:
                            tr_usage[b, ps, m, d] = timeline[b, slot, m, d]
                            tr_background[b, ps, m, d] = total - np.int64(timeline[b, slot, m, d])
                        unused = cap[d] - total
                        if unused < 0:
                            unused = 0
                        is_short[m, d] = total > cap[d]
                        has_short = has_short or total > cap[d]
                        if is_used and k_u != 0:
                            base = np.float64(unused)
                            powered = base
                            for _ in range(k_u - 1):
                                powered = powered * base
                            under += powered
                        if row >= 0:
                            v = np.float32(total) * inv_cap[d]
                            past[b, row, m, d] = v if v < np.float32(1.0) else np.float32(1.0)
                        timeline[b, slot, m, d] = 0
                contention = overlap[b, slot]
                overlap[b, slot] = 0
                n_first = 0
                if has_short:  # core._first_overshoots
                    for j in range(min(next_job[b], n_j)):  # placed jobs: the prefix before the queue
                        m = job_machine[b, j]
                        if m >= 0 and job_start[b, j] <= ps and job_start[b, j] + duration[b, j] > ps:
                            for d in range(n_d):
                                if is_short[m, d] and not has_overshot[b, j, d]:
                                    has_overshot[b, j, d] = True
                                    n_first += 1
                p_under = 0.0 if k_u == 0 else -under
                p_overshoot = -k_o * np.float64(n_first)
                p_wait = -k_w * np.float64(qlen)
                pen[b, 0] += p_contention
                pen[b, 1] += p_under
                pen[b, 2] += p_overshoot
                pen[b, 3] += p_wait
                if is_recorded:
                    tr_queue[b, ps] = qlen
                    tr_contention[b, ps] = contention
                    tr_penalties[b, ps, 0] = p_contention
                    tr_penalties[b, ps, 1] = p_under
                    tr_penalties[b, ps, 2] = p_overshoot
                    tr_penalties[b, ps, 3] = p_wait
                    tr_penalties[b, ps, 4] = 0.0
            t_end = t0 + n_steps
            t[b] = t_end
            arrived = 0
            for j in range(n_j):
                if arrival_step[b, j] <= t_end:
                    arrived += 1
            n_arrived[b] = arrived
            last_end = 0
            for m in range(n_m):
                last_end = max(last_end, busy_until[b, m])
            is_finished = next_job[b] == n_jobs[b] and last_end <= t_end
            is_terminated[b] = is_finished
            is_truncated[b] = (not is_finished) and t_end >= max_steps
            if is_truncated[b]:
                is_cut[b] = True
            n_closed[b] += n_steps
            is_forced = False


@njit(cache=True)
def _span(lo, hi, args, n_m, n_d):
    """Envs lo .. hi - 1 stepped on one scratch (`is_short`, (M, D)): `_env_steps`' arguments after the span and
    the scratch ride in `args`. The body of `_kernel_parallel`."""
    _env_steps(lo, hi, np.zeros((n_m, n_d), dtype=np.bool_), *args)


@njit(cache=True, parallel=True)
def _kernel_parallel(args, n_envs, n_m, n_d, n_spans):
    n_c = max(min(n_spans, n_envs), 1)
    for c_ in prange(n_c):  # spans of envs, each with its scratch allocated once (envs_of_span)
        lo, hi = envs_of_span(c_, n_envs, n_c)
        _span(lo, hi, args, n_m, n_d)
