"""The per-decision work of the learned placer's training rollout as numba kernels over the envs (issue 22, item
8; the step itself is `sim.compiled_step`, the served labels `sim.compiled_labels`):

- `deeprm_pick`: `sim.policies._deeprm_pick` (the most preferred visible job that fits some machine by the
  simulator's placement rule and by requests; the head where none does) on a preference the caller computes;
  `packer_pick` and `sjf_pick`: the same with Packer's or SJF's preference computed in the kernel;
  `tetris_pick`: `sim.policies.Tetris.pick_job` (the same kernel).
- `risk_act`: `sim.risk.RiskAwarePacking.act` in "deviate" and "pack" modes for a flat remaining-peak quantile
  forecaster (`sim.peak_forecast.PeakQuantileForecaster`, `flat_head_share`'s shortcut; or its form with a level
  per env, `sim.rise_shift.ShiftAdaptedPeakForecaster`, whose rows `risk_act_args` computes; or a level per
  machine from the jobs running on it, `sim.charge_level.ChargeAwarePeakPacking`, whose levels share one table) or
  the hybrid's `PersistenceForecaster` (each job's peak so far) over a DeepRM fallback (SJF or Packer: Best-Fit by
  requests), Tetris (the first machine the head fits), `BestFit` (by usage now) or `FirstFit`, deviation rows,
  bounds and choice as there.
- `placer_features_kernel_parallel`: the learned placer's inputs (`models.placer_kernel` wraps and documents it).
- `decide_kernel_parallel`: the two bodies above and the mask between them, in three passes over a span of envs
  (`models.placer_kernel.decide`: a training rollout's decision on `forecast_peak`'s kind of rule or the hybrid,
  and an advisor's action by the rule body again where one is given); the bodies' arguments ride in tuples.
- `recall_table_rows`: the rows `sim.recall_sums` sums on the recall path (each env's running jobs and queue
  head, the run each recalls, steps alive) with their remaining-peak table look-ups (`_placer_lookup`): the walk
  (`_recall_structure_kernel`) memoised per state and queue order (`sim.core.memo_value`), the look-ups
  (`_recall_lookup_kernel`) per forecaster.
- `column_inputs`: the learned placer's inputs from level columns computed elsewhere (the recall path's), their
  per-machine part (`_machine_inputs`) and globals (`_global_inputs`) shared with `_placer_envs`.

Each runs one body per span of envs (`_pick_envs`, `_act_envs`, `_placer_envs`: one call per span, as a call's
arguments cost about a microsecond per env), on numba's threads for a large batch
(`sim.compiled_step.on_threads`), else in one span (`sim.compiled_step.launch`): the same numbers either way.
Each body walks an env through the numpy code's steps with the same float operations in the same order (the
per-machine sums in job order, as `np.bincount` adds them; maxima and comparisons as there; ties to the first
index, as `np.argmax`), so decisions are the numpy path's. They return None where they do not apply (another
fallback, forecaster or mode, a horizon past the forecaster's, a negative forecast) and the numpy path decides.
`job_cell` and `resource_cell` are the one look-up of a remaining-peak table cell; every kernel that inlines them
lives in this file, because numba's on-disk cache notices changes to a kernel's own file only. Tests:
tests/sim/test_compiled_decision.py, tests/models/test_placer_kernel.py, tests/sim/test_recall_sums.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from sim.compiled_step import NO_NOISE, launch, on_threads
from sim.config import SimConfig
from sim.core import State, jobs_per_machine, memo_value, observed_labels, placed_requests
from sim.forecast import find_level
from sim.jobs import JobBatch
from sim.peak_forecast import AGE_EDGES, REMAINING_EDGES, PeakQuantileForecaster
from sim.rise_shift import ShiftAdaptedPeakForecaster

AGE_EDGE_ARRAY = np.asarray(AGE_EDGES, dtype=np.int64)
REMAINING_EDGE_ARRAY = np.asarray(REMAINING_EDGES, dtype=np.int64)
_CHECKS = {"none": 0, "first_step": 1, "request": 2}

ENABLED = True
"""Whether the kernels decide where they apply (tests switch them off to compare with the numpy path)."""


def noise_args(state: State) -> tuple[np.ndarray, bool]:
    """(noise array, whether the state has noise) as the kernels take them."""
    return (NO_NOISE, False) if state.noise is None else (state.noise, True)


def prefix_args(jobs: JobBatch, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(peak cells, job order, row map) of the batch's running summaries (`ObservedPrefix`) as the kernels take
    them for a remaining-peak table's `values` in `levels_last` layout (`peak_cells`); the row map is the identity
    where the batch is not a selection."""
    prefix = jobs.observed_prefix[0]
    return peak_cells(prefix, values), prefix.order, prefix_rows(jobs)


def prefix_rows(jobs: JobBatch) -> np.ndarray:
    """(B,) int64 the row of the batch's running summaries (`ObservedPrefix`) each row reads: the identity where
    the batch is not a selection."""
    prefix = jobs.observed_prefix[0]
    return np.arange(jobs.batch_size, dtype=np.int64) if prefix.rows is None else prefix.rows


def peak_cells(prefix, values: np.ndarray) -> np.ndarray:
    """(B, J, T, D) int16 over the summaries' own rows and jobs: the index on a remaining-peak table's peak axis of
    each job at each age of its peak so far, as `PeakQuantileTable.lookup_levels` finds it (0 where nothing valid
    is observed, else peak so far + 1 capped at requests + 1; plus requests + 2 where the table is keyed by being at
    the peak now and the value at that age is the peak so far, `ObservedPrefix.at_peak`), for a table's values in
    the kernels' layout (`levels_last`: D, R, P, A, E, M, L). The kernels read one int16 per job and resource
    here, both resources in one cache line, instead of the float32 peak and the batch's profile (random reads that
    missed the cache: the placer's inputs kernel took about a third less time for it, item 8). Kept with the
    summaries per table shape (`ObservedPrefix.derived`), so every batch sharing them reads the same array."""
    n_r = values.shape[1]
    n_p = n_r + 1
    keyed = values.shape[2] > n_p
    key = ("peak_cells", n_r, keyed)
    cells = prefix.derived.get(key)
    if cells is None:
        if keyed and prefix.at_peak is None:
            raise ValueError(
                "peak_cells: the table is keyed by being at the peak now, the summaries lack at_peak"
            )
        peak = prefix.peak.astype(np.float64)
        valid = np.isfinite(peak) & (peak >= 0)
        cells = np.where(valid, np.minimum(np.where(valid, peak, 0.0), n_p - 2) + 1.0, 0.0).astype(np.int16)
        if keyed:
            cells += (valid & prefix.at_peak).astype(np.int16) * np.int16(n_p)
        prefix.derived[key] = cells
    return cells


_GIVEN, _TETRIS, _PACKER, _SJF = 0, 1, 2, 3
"""The pick kernel's kinds: DeepRM's pick on a given preference, Tetris' pick, DeepRM's pick on Packer's or SJF's
preference computed in the kernel."""


def deeprm_pick(cfg: SimConfig, state: State, preference: np.ndarray) -> np.ndarray | None:
    """(B,) slot of the most preferred visible job (preference (B, K) float64) that fits some machine now; 0
    where none does (`sim.policies._deeprm_pick`); None when switched off (`ENABLED`)."""
    return _pick(cfg, state, preference, _GIVEN)


def packer_pick(cfg: SimConfig, state: State) -> np.ndarray | None:
    """(B,) `sim.policies.DeepRMPacker.pick_job`'s slots, its preference (dot(request / total, free / total) on
    the cluster as one pool) computed in the kernel from the requests it sums anyway; None when switched off."""
    return _pick(cfg, state, None, _PACKER)


def sjf_pick(cfg: SimConfig, state: State) -> np.ndarray | None:
    """(B,) `sim.policies.DeepRMSJF.pick_job`'s slots (the shortest visible job that fits, ties to the earlier
    slot), its preference computed in the kernel; None when switched off."""
    return _pick(cfg, state, None, _SJF)


def tetris_pick(cfg: SimConfig, state: State, extra: np.ndarray) -> np.ndarray | None:
    """(B,) `sim.policies.Tetris.pick_job`'s slots: its alignment score plus `extra` (B, K) float64 per visible
    job (`Tetris.short_job_term`, zeros without it); None when switched off (`ENABLED`)."""
    return _pick(cfg, state, extra, _TETRIS)


SEQUENTIAL_SUM_MAX = 7
"""numpy adds up to this many elements of a float reduction one after another (from 8 on, in its pairwise
order): the kernels' sums over the resources are numpy's only up to this many resources."""


def _pick(cfg: SimConfig, state: State, preference: np.ndarray | None, kind: int) -> np.ndarray | None:
    if not ENABLED or (kind in (_TETRIS, _PACKER) and cfg.n_resources > SEQUENTIAL_SUM_MAX):
        return None  # (Tetris' and Packer's scores sum over the resources)
    if preference is None:  # computed in the kernel: only its width (K) is read
        preference = np.zeros((1, cfg.queue_size))
    elif preference.shape != (state.batch_size, cfg.queue_size):
        raise ValueError(
            f"job pick: a preference of shape {preference.shape} for {state.batch_size} envs and "
            f"{cfg.queue_size} visible slots"
        )
    noise, has_noise = noise_args(state)
    out = np.zeros(state.batch_size, dtype=np.int64)
    jobs = state.jobs
    args = (
        np.ascontiguousarray(preference, dtype=np.float64), state.t, state.next_job, state.n_arrived,
        state.is_done, state.job_machine, state.job_start, jobs.duration,
        jobs.usage, jobs.request, state.timeline, noise, has_noise, _CHECKS[cfg.placement_check],
        np.asarray(cfg.capacity_units, dtype=np.int64), kind, out,
    )  # fmt: skip
    _, _, n_m, n_d = state.timeline.shape
    launch(_pick_kernel_parallel, on_threads(state.batch_size), args, state.batch_size, n_m, n_d)
    return out


def risk_act(cfg: SimConfig, state: State, rule) -> np.ndarray | None:
    """(B,) `rule.act` (a `sim.risk.RiskAwarePacking`) where the kernel applies, else None (module docstring)."""
    out = np.zeros(state.batch_size, dtype=np.int64)
    args = risk_act_args(cfg, state, rule, out)
    if args is None:
        return None
    _, _, n_m, n_d = state.timeline.shape
    threaded = on_threads(state.batch_size)
    return out if launch(_act_kernel_parallel, threaded, args, state.batch_size, n_m, n_d) else None


def risk_act_args(cfg: SimConfig, state: State, rule, out: np.ndarray) -> tuple | None:
    """The arguments of `_act_envs` after its scratch and mask (the rule's actions go to `out` (B,) int64), or None
    where the kernel does not apply to `rule` (module docstring)."""
    from sim.forecast import uncached
    from sim.risk import PersistenceForecaster

    if not ENABLED:
        return None
    charge = _charge_parts(rule)
    if charge is _NOT_COMPILED:
        return None
    fallback = type(rule._fallback())
    if charge is not None:  # the rule at the fitted level: the other levels share its table, horizon, choices
        rule = charge[0]
    forecaster = PersistenceForecaster() if rule.forecaster is None else uncached(rule.forecaster)
    risk = rule.risk
    persist = type(forecaster) is PersistenceForecaster and forecaster.statistic == "peak"
    kind = _fallback_kind(fallback)
    adapted = type(forecaster) is ShiftAdaptedPeakForecaster  # a level per env (`sim.rise_shift`)
    if (
        not (persist or adapted or type(forecaster) is PeakQuantileForecaster)
        or kind is None
        or risk.mode not in ("deviate", "pack")
    ):
        return None
    horizon = forecaster.horizon if risk.horizon is None else risk.horizon
    if horizon > forecaster.horizon or any(
        find_level(forecaster.levels, lv) is None for lv in (0.5, risk.level)
    ):
        return None  # the numpy path raises its own error
    jobs = state.jobs
    prefix = jobs.observed_prefix[0]
    # with `persist` every quantile of a job is its peak so far: no table (the look-up's arrays are placeholders)
    if persist:
        values, level_row, use_labels, use_remaining = _NO_TABLE, 0, False, False
        cells, order, rows = _NO_CELLS, prefix.order, prefix_rows(jobs)
    else:
        table = forecaster.table
        level_row = find_level(table.levels, forecaster.level)
        if level_row is None:
            return None
        if adapted:
            level_row, at_mask = forecaster.rows_and_mask(state)
            if at_mask.any():
                return None  # an arriving job left to the mask: the numpy path (`sim.rise_shift.at_mask`)
        values, use_labels, use_remaining = levels_last(table.values), table.use_labels, table.use_remaining
        cells, order, rows = prefix_args(jobs, values)
    noise, has_noise = noise_args(state)
    return (
        state.t, state.next_job, state.n_arrived, state.is_done, state.job_machine,
        state.job_start, state.busy_until, jobs.duration, jobs.usage, jobs.request,
        observed_labels(state), state.timeline, noise, has_noise,
        _CHECKS[cfg.placement_check], np.asarray(cfg.capacity_units, dtype=np.int64), cells, order, rows,
        values, np.broadcast_to(np.asarray(level_row, dtype=np.int64), state.t.shape).copy(), use_labels,
        use_remaining, AGE_EDGE_ARRAY,
        REMAINING_EDGE_ARRAY, max(horizon, risk.extend_to or 0), bool(risk.use_durations),
        int(risk.min_observed), kind, risk.mode == "pack", out, persist, prefix.peak,
        *(_NO_CHARGE if charge is None else charge[1:]),
    )  # fmt: skip


_NOT_COMPILED = object()
_NO_CHARGE = (False, np.ones(1), np.zeros(1, dtype=np.int64), 0.9, 1.0, False)
"""`_act_envs`' charge arguments for a rule with one level per env (unread)."""


def _charge_parts(rule) -> tuple | None | object:
    """For a `sim.charge_level.ChargeAwarePeakPacking`: (the rule at its fitted level, True, its levels (K,)
    float64, each level's row in the shared table (K,) int64, the fitted level, n_ref, raise_only), the arguments
    that let `_act_envs` give each machine its own row as `ChargeAwarePeakPacking.level_index` does; None for any
    other rule (one level per env); `_NOT_COMPILED` where its rules are not one flat remaining-peak table at several
    levels (`shared_table_index`; no recall) in the rule's own mode, and the numpy path decides."""
    from sim.charge_level import ChargeAwarePeakPacking
    from sim.forecast import uncached

    if not isinstance(rule, ChargeAwarePeakPacking):
        return None
    at = rule.shared_table_index
    if at is None:
        return _NOT_COMPILED
    first = rule.rules[at]
    forecaster = uncached(first.forecaster)
    if type(forecaster) is not PeakQuantileForecaster or first.risk.mode != rule.mode:
        return _NOT_COMPILED
    rows = [find_level(forecaster.table.levels, lv) for lv in rule.levels]
    if any(row is None for row in rows):
        return _NOT_COMPILED
    return (
        first, True, np.asarray(rule.levels, dtype=np.float64), np.asarray(rows, dtype=np.int64),
        float(rule.level), float(rule.n_ref), bool(rule.raise_only),
    )  # fmt: skip


_BEST_FIT_REQUESTS, _FIRST_FIT_REQUESTS, _BEST_FIT_USAGE, _FIRST_VALID = 0, 1, 2, 3
"""The rule kernel's fallbacks: DeepRM's act (Best-Fit by requests: SJF, Packer), Tetris' act (the first machine
the head fits by requests), `BestFit` (fewest free units of the head's dominant resource by usage now, among the
valid machines) and `FirstFit` (the first valid machine)."""


def _fallback_kind(fallback: type) -> int | None:
    from sim.policies import BestFit, DeepRMPacker, DeepRMSJF, FirstFit, Tetris

    kinds = {
        DeepRMSJF: _BEST_FIT_REQUESTS,
        DeepRMPacker: _BEST_FIT_REQUESTS,
        Tetris: _FIRST_FIT_REQUESTS,
        BestFit: _BEST_FIT_USAGE,
        FirstFit: _FIRST_VALID,
    }
    return kinds.get(fallback)


_NO_TABLE = np.zeros((1, 1, 1, 1, 1, 1, 1))
_NO_CELLS = np.zeros((1, 1, 1, 1), dtype=np.int16)


@njit(cache=True, inline="always")
def envs_of_span(c, n_envs, n_spans):
    """[lo, hi) envs of span c of n_spans (`sim.compiled_step.launch`: each span allocates its scratch once). Its
    own copy here: numba's cache notices a kernel's own file only."""
    c = np.int64(c)
    return c * n_envs // n_spans, (c + 1) * n_envs // n_spans


@njit(cache=True, inline="always")
def bucket_of(edges, value):
    """searchsorted(edges, value, side="right") - 1."""
    i = 0
    while i < edges.shape[0] and edges[i] <= value:
        i += 1
    return i - 1


def levels_last(values: np.ndarray) -> np.ndarray:
    """A remaining-peak table's values (L, D, R, P, A, E, M) with the level axis last, contiguous: a job's levels
    then share a cache line (the look-ups are random reads into a table of megabytes). Kept per table array."""
    hit = _LEVELS_LAST.get(id(values))
    if hit is None or hit[0] is not values:
        if len(_LEVELS_LAST) >= 8:
            _LEVELS_LAST.clear()
        hit = _LEVELS_LAST[id(values)] = (values, np.ascontiguousarray(np.moveaxis(values, 0, -1)))
    return hit[1]


_LEVELS_LAST: dict[int, tuple[np.ndarray, np.ndarray]] = {}


@njit(cache=True, inline="always")
def job_cell(
    b, j, n_obs, duration, labels, order, prefix_rows, cells, values, use_labels, use_remaining, age_edges,
    remaining_edges,
):  # fmt: skip
    """The part of job j's remaining-peak table cell that every resource shares (age bucket, label, remaining
    life) with n_obs steps observed, as `PeakQuantileTable.lookup_levels` finds it, and where its peak so far is
    (row and job of the batch's `ObservedPrefix`, age; -1 where nothing is observed yet); `values` in
    `levels_last` layout. Found once per job, not once per resource (the placer's inputs kernel ran 15-30 %
    faster for it)."""
    n_e = values.shape[4]
    bucket = bucket_of(age_edges, n_obs)
    e = 0
    if use_labels:
        label = labels[b, j]
        e = label if (label >= 0 and label < n_e - 1) else n_e - 1
    rem = 0
    if use_remaining:
        rem = bucket_of(remaining_edges, max(duration[b, j] - n_obs, 1))
    last = min(max(n_obs - 1, 0), cells.shape[2] - 1) if n_obs > 0 else -1
    return bucket, e, rem, prefix_rows[b], order[b, j], last


@njit(cache=True, inline="always")
def resource_cell(b, j, d, request, cells, row, job_row, last, n_r):
    """The rest of the cell in resource d: (request, peak axis index), as `PeakQuantileTable.lookup_levels`, from
    `job_cell`'s row, job and age of the peak so far and the batch's `peak_cells` (the peak so far + 1, folded with
    being at the peak now where the table is keyed so); n_r the table's request values."""
    p_idx = np.int64(cells[row, job_row, last, d]) if last >= 0 else 0
    r_idx = min(max(np.int64(request[b, j, d]), 0), n_r - 1)
    return r_idx, p_idx


@njit(cache=True, inline="always")
def _running_jobs(b, t, n_placed, job_machine, job_start, duration, run):
    """run[:n] the jobs of env b running at t, in job order (placed jobs are the prefix before the queue, `n_placed`
    the env's next_job); returns n. Each body walks the placed jobs once per env and reads the running ones from
    this list, in the order the walk found them."""
    n = 0
    for j in range(min(n_placed, job_machine.shape[1])):
        m = job_machine[b, j]
        if m >= 0 and job_start[b, j] <= t and job_start[b, j] + duration[b, j] > t:
            run[n] = j
            n += 1
    return n


@njit(cache=True, inline="always")
def _machine_state(b, t, run, n_run, job_machine, request, timeline, noise, has_noise, placed, used_now):
    """placed (M, D) requests of the running jobs run[:n_run] (`_running_jobs`) on each machine, used_now (M, D)
    units in use (noise too)."""
    n_d = timeline.shape[3]
    placed[:] = 0
    for k in range(n_run):
        j = run[k]
        m = job_machine[b, j]
        for d in range(n_d):
            placed[m, d] += np.int64(request[b, j, d])
    _units_now(b, t, timeline, noise, has_noise, used_now)


@njit(cache=True, inline="always")
def _units_now(b, t, timeline, noise, has_noise, used_now):
    """used_now (M, D): the units in use on each machine at t, noise included."""
    width, n_m, n_d = timeline.shape[1], timeline.shape[2], timeline.shape[3]
    slot = t % width
    for m in range(n_m):
        for d in range(n_d):
            units = np.int64(timeline[b, slot, m, d])
            if has_noise:
                units += np.int64(noise[b, min(t, noise.shape[1] - 1), m, d])
            used_now[m, d] = units


@njit(cache=True, inline="always")
def _fits(b, j, m, check, usage, request, cap, placed, used_now):
    """The job fits machine m now: the simulator's placement rule (`check`) and its request within the free
    capacity by requests."""
    for d in range(cap.shape[0]):
        req = np.int64(request[b, j, d])
        if check == 1 and used_now[m, d] + np.int64(usage[b, j, 0, d]) > cap[d]:
            return False
        if check == 2 and used_now[m, d] + req > cap[d]:
            return False
        if cap[d] - placed[m, d] < req:
            return False
    return True


@njit(cache=True)
def _machine_scratch(n_m, n_d):
    """Per-env scratch of the pick (`_machine_state`'s placed and used-now units): allocated once per span of envs
    (`envs_of_span`)."""
    return np.zeros((n_m, n_d), dtype=np.int64), np.zeros((n_m, n_d), dtype=np.int64)


@njit(cache=True)
def _act_scratch(n_m, n_d):
    """Per-env scratch of the rule (as `_machine_scratch`, with validity, use, sums, values, and each machine's
    running jobs and table row)."""
    placed, used_now = _machine_scratch(n_m, n_d)
    return (
        placed, used_now, np.zeros(n_m, dtype=np.bool_), np.zeros(n_m, dtype=np.bool_), np.zeros((n_m, n_d)),
        np.zeros(n_d), np.zeros(n_d), np.zeros(n_m, dtype=np.int64), np.zeros(n_m, dtype=np.int64),
    )  # fmt: skip


@njit(cache=True)
def _placer_scratch(n_m, n_levels, n_d):
    """Per-env scratch of the placer's inputs (per-machine sums and counts, a job's and the head's levels)."""
    return (
        np.zeros((n_m, n_levels, n_d)), np.zeros((n_m, n_levels, n_d)), np.zeros(n_m, dtype=np.int64),
        np.zeros((n_m, n_d), dtype=np.int64), np.zeros((n_levels, n_d)), np.zeros((n_levels, n_d)),
        np.zeros((n_levels, n_d)),
    )  # fmt: skip


@njit(cache=True)
def _pick_envs(
    lo, hi, scratch, run, preference, t_arr, next_job, n_arrived, is_done, job_machine, job_start, duration, usage,
    request, timeline, noise, has_noise, check, cap, kind, out,
):  # fmt: skip
    """Envs lo .. hi - 1's part of `_pick_kernel_parallel` (its body per span of envs, one call per span);
    `scratch` from `_machine_scratch` and `run` (the jobs' width), written before they are read. `kind` (`_pick`'s): Tetris' pick
    (`_tetris_pick`), else DeepRM's on `preference` or on Packer's or SJF's preference (`_preference`)."""
    n_k = preference.shape[1]
    n_j = job_machine.shape[1]
    n_m = timeline.shape[2]
    placed, used_now = scratch
    for b in range(lo, hi):
        if is_done[b]:  # a finished env shows no waiting job: slot 0, as both picks give it, without the walk
            out[b] = 0
            continue
        t = t_arr[b]
        n_run = _running_jobs(b, t, next_job[b], job_machine, job_start, duration, run)
        _machine_state(b, t, run, n_run, job_machine, request, timeline, noise, has_noise, placed, used_now)
        if kind == _TETRIS:
            out[b] = _tetris_pick(
                b, preference, next_job, n_arrived, is_done, usage, request, check, cap, placed, used_now
            )
            continue
        best = -np.inf
        slot = -1
        for k in range(n_k):
            job = next_job[b] + k
            if job >= n_arrived[b] or is_done[b]:
                continue
            j = min(job, n_j - 1)
            pickable = False
            for m in range(n_m):
                if _fits(b, j, m, check, usage, request, cap, placed, used_now):
                    pickable = True
                    break
            if not pickable:
                continue
            value = (
                preference[b, k]
                if kind == _GIVEN
                else _preference(b, j, k, kind, duration, request, cap, placed)
            )
            if slot < 0 or value > best:
                best = value
                slot = k
        out[b] = slot if slot >= 0 else 0
    return True


@njit(cache=True, inline="always")
def _preference(b, j, k, kind, duration, request, cap, placed):
    """Visible slot k's (job j's) preference as `sim.policies` computes it: Packer's dot(request / total,
    free / total) with the cluster as one pool (total M * C, free the total less the running jobs' requests),
    summed over the resources in order as numpy does; SJF's -duration - 1e-3 * k (ties to the earlier slot)."""
    if kind == _SJF:
        return np.float64(-np.int64(duration[b, j])) - 1e-3 * np.float64(k)
    n_m, n_d = placed.shape
    value = 0.0
    for d in range(n_d):
        total = np.int64(n_m) * cap[d]
        running = np.int64(0)
        for m in range(n_m):
            running += placed[m, d]
        share = np.float64(np.int64(request[b, j, d])) / np.float64(total)
        value += share * (np.float64(total - running) / np.float64(total))
    return value


@njit(cache=True)
def _tetris_pick(b, extra, next_job, n_arrived, is_done, usage, request, check, cap, placed, used_now):
    """`sim.policies.Tetris.pick_job` for env b: the first machine some visible waiting job fits (the simulator's
    placement rule and requests), then the job there with the best alignment dot(request / C, free / C) plus
    `extra` (B, K) (its 1 / duration term), the first on ties; slot 0 where no job fits any machine."""
    n_k = extra.shape[1]
    n_j = request.shape[1]
    n_m, n_d = placed.shape
    machine = -1
    for m in range(n_m):
        for k in range(n_k):
            job = next_job[b] + k
            if job >= n_arrived[b] or is_done[b]:
                continue
            if _fits(b, min(job, n_j - 1), m, check, usage, request, cap, placed, used_now):
                machine = m
                break
        if machine >= 0:
            break
    if machine < 0:
        return 0
    best = -np.inf
    slot = -1
    for k in range(n_k):
        job = next_job[b] + k
        j = min(job, n_j - 1)
        if (
            job >= n_arrived[b]
            or is_done[b]
            or not _fits(b, j, machine, check, usage, request, cap, placed, used_now)
        ):
            continue
        score = 0.0  # numpy's sum over the resources, in order
        for d in range(n_d):
            score += (np.float64(np.int64(request[b, j, d])) / np.float64(cap[d])) * (
                np.float64(cap[d] - placed[machine, d]) / np.float64(cap[d])
            )
        score += extra[b, k]
        if slot < 0 or score > best:
            best = score
            slot = k
    return slot


@njit(cache=True)
def _pick_span(lo, hi, args, n_m, n_d):
    """`_pick_envs` for envs lo .. hi - 1 on one scratch (its arguments after the span and the scratch ride in
    `args`); False at the first env that fails. The body of `_pick_kernel_parallel`."""
    run = np.empty(args[5].shape[1], dtype=np.int64)  # job_machine's width
    return _pick_envs(lo, hi, _machine_scratch(n_m, n_d), run, *args)


@njit(cache=True, parallel=True)
def _pick_kernel_parallel(args, n_envs, n_m, n_d, n_spans):
    n_c = max(min(n_spans, n_envs), 1)
    ok = np.ones(n_c, dtype=np.bool_)
    for c_ in prange(n_c):  # spans of envs, each with its scratch allocated once (envs_of_span)
        lo, hi = envs_of_span(c_, n_envs, n_c)
        ok[np.int64(c_)] = _pick_span(lo, hi, args, n_m, n_d)
    return ok.all()


@njit(cache=True, inline="always")
def _rule_values(
    b, j, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows, values, row_at,
    use_labels, use_remaining, age_edges, remaining_edges, n_steps, use_durations, min_observed, counts, out,
    persist, peak,
):  # fmt: skip
    """out (D,): job j's quantile at the table's level row `row_at` (its request while young) where it lives
    past t and `counts`, else 0
    (`sim.risk.flat_values` times its being alive); False where a quantile is negative. With `persist` every
    quantile is the job's peak so far (`peak`, the batch's `ObservedPrefix.peak`), its request before anything is
    observed, as `models.forecast_placer.persistence_rule_act` reads it; False where that peak is NaN."""
    start = job_start[b, j] if job_machine[b, j] >= 0 else t + 1
    steps = n_steps
    if use_durations:
        steps = min(max(min(start, t) + duration[b, j] - t - 1, 0), n_steps)
    is_young = min_observed > 0 and t - start + 1 < min_observed
    n_obs = min(max(t - start + 1, 0), duration[b, j])
    alive = 1.0 if (steps > 0 and counts) else 0.0
    if persist:
        last = min(max(n_obs - 1, 0), peak.shape[2] - 1)
        for d in range(out.shape[0]):
            v = np.float64(request[b, j, d])
            if n_obs > 0 and not is_young:
                v = np.float64(peak[prefix_rows[b], order[b, j], last, d])
                if v != v:
                    return False
            out[d] = v * alive
        return True
    a, e, rem, row, job_row, last = job_cell(
        b, j, n_obs, duration, labels, order, prefix_rows, cells, values, use_labels, use_remaining, age_edges,
        remaining_edges,
    )  # fmt: skip
    for d in range(out.shape[0]):
        r, p = resource_cell(b, j, d, request, cells, row, job_row, last, values.shape[1])
        v = values[d, r, p, a, e, rem, row_at]
        if v < 0:
            return False
        if is_young:
            v = np.float64(request[b, j, d])
        out[d] = v * alive
    return True


@njit(cache=True, inline="always")
def _charge_index(levels, level, n_ref, n, raise_only):
    """`sim.charge_level.level_rows` for one machine: the index of the first of the ascending `levels` at or
    above 1 - (1 - level) x n_ref / max(n, 1) (and `level` where `raise_only`), the top one where none is."""
    target = 1.0 - (1.0 - level) * n_ref / max(np.float64(n), 1.0)
    if raise_only:
        target = max(target, level)
    i = 0
    while i < levels.shape[0] and levels[i] < target - 1e-9:
        i += 1
    return min(i, levels.shape[0] - 1)


@njit(cache=True)
def _act_envs(
    lo, hi, scratch, run, mask, write_mask, hold_always, skip_done, t_arr, next_job, n_arrived, is_done,
    job_machine, job_start, busy_until, duration, usage, request, labels, timeline, noise, has_noise, check, cap,
    cells, order, prefix_rows, values, level_row, use_labels, use_remaining, age_edges, remaining_edges, n_steps,
    use_durations, min_observed, fallback, pack, out, persist, peak, charge, charge_levels, charge_rows,
    charge_level, charge_n_ref, raise_only,
):  # fmt: skip
    """The rule's actions of envs lo .. hi - 1 into `out` (the body `_act_kernel_parallel` runs per span of envs,
    and `_decide_span` too); False at the first env where a looked-up quantile is negative. `scratch`
    from `_act_scratch` and `run` (the jobs' width) are written before they are read; `fallback` one of
    `_fallback_kind`'s kinds. With `charge` each machine's jobs and the head are read at the machine's own table
    row (`charge_rows` at `_charge_index`'s level for its running jobs + 1,
    `sim.charge_level.ChargeAwarePeakPacking`), else at the env's `level_row[b]`. With `write_mask` each env's
    valid actions go to mask[b] (`sim.core.action_mask`); with `skip_done` a finished env holds without the
    walk. One call per span, not per env: a call's arguments cost about a microsecond per env."""
    n_j = job_machine.shape[1]
    n_m, n_d = timeline.shape[2], timeline.shape[3]
    placed, used_now, valid, used, sums, head_value, job_value, n_on, m_row = scratch
    for b in range(lo, hi):
        t = t_arr[b]
        head = min(next_job[b], n_j - 1)
        has_job = n_arrived[b] > next_job[b] and not is_done[b]
        if is_done[b] and skip_done:  # a finished env: hold, its only valid action, without the walk
            out[b] = n_m
            if write_mask:
                mask[b, :n_m] = False
                mask[b, n_m] = True
            continue
        n_run = _running_jobs(b, t, next_job[b], job_machine, job_start, duration, run)
        _machine_state(b, t, run, n_run, job_machine, request, timeline, noise, has_noise, placed, used_now)
        # the fallback: Best-Fit by requests on the head's dominant resource (sim.policies._deeprm_act), the first
        # machine the head fits by requests (Tetris' act: its pick has chosen the job), Best-Fit by usage now on the
        # valid machines (BestFit) or the first valid machine (FirstFit)
        by_requests = fallback == _BEST_FIT_REQUESTS or fallback == _FIRST_FIT_REQUESTS
        dom = 0
        best_share = -np.inf
        for d in range(n_d):
            share = np.float64(np.int64(request[b, head, d]) if has_job else 0) / np.float64(cap[d])
            if share > best_share:
                best_share = share
                dom = d
        base = n_m
        best_score = -np.inf
        any_valid_used = False
        for m in range(n_m):
            ok = has_job
            if ok and check != 0:  # core.action_mask's placement check
                for d in range(n_d):
                    need = np.int64(usage[b, head, 0, d]) if check == 1 else np.int64(request[b, head, d])
                    if used_now[m, d] + need > cap[d]:
                        ok = False
            valid[m] = ok
            used[m] = busy_until[b, m] > t
            any_valid_used = any_valid_used or (ok and used[m])
            fits = ok
            for d in range(n_d):
                req = np.int64(request[b, head, d]) if has_job else 0
                if by_requests and cap[d] - placed[m, d] < req:
                    fits = False
            if fits:
                score = 0.0
                if fallback == _BEST_FIT_REQUESTS:
                    score = np.float64(-(cap[dom] - placed[m, dom]))
                elif fallback == _BEST_FIT_USAGE:
                    score = np.float64(-(cap[dom] - used_now[m, dom]))
                if base == n_m or score > best_score:
                    best_score = score
                    base = m
        out[b] = base
        # sim.core.action_mask: the machines the rule found valid, hold always or where none is
        if write_mask:
            any_valid = False
            for m in range(n_m):
                mask[b, m] = valid[m]
                any_valid = any_valid or valid[m]
            mask[b, n_m] = hold_always or not any_valid
        # sim.risk.deviation_rows ("deviate": only where the fallback holds or opens an empty machine)
        base_opens = base < n_m and not used[base]
        if not pack and not ((base == n_m or base_opens) and any_valid_used):
            continue
        # each machine's table row: the env's, or (charge-aware) its own from the jobs running on it (jobs_per_machine)
        if charge:
            n_on[:] = 0
            for k in range(n_run):
                n_on[job_machine[b, run[k]]] += 1
            for m in range(n_m):
                m_row[m] = charge_rows[
                    _charge_index(charge_levels, charge_level, charge_n_ref, n_on[m] + 1, raise_only)
                ]
        else:
            m_row[:] = level_row[b]
        # sim.risk.flat_head_share: each running job's quantile while it lives, the head's on top
        sums[:] = 0.0
        for k in range(n_run):
            j = run[k]
            m = job_machine[b, j]
            if not _rule_values(
                b, j, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows, values,
                m_row[m], use_labels, use_remaining, age_edges, remaining_edges, n_steps, use_durations,
                min_observed, True, job_value, persist, peak,
            ):  # fmt: skip
                return False
            for d in range(n_d):
                sums[m, d] += job_value[d]
        # sim.risk.deviate_or_pack: the tightest safe used machine (the head's values looked up again only where a
        # machine's row differs from the last one's)
        head_row = -1
        best = -1
        best_tight = -np.inf
        for m in range(n_m):
            if m_row[m] != head_row:
                head_row = m_row[m]
                if not _rule_values(
                    b, head, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows,
                    values, head_row, use_labels, use_remaining, age_edges, remaining_edges, n_steps,
                    use_durations, min_observed, has_job, head_value, persist, peak,
                ):  # fmt: skip
                    return False
            tight = -np.inf
            for d in range(n_d):
                tight = max(tight, (sums[m, d] + head_value[d]) / np.float64(cap[d]))
            if valid[m] and used[m] and tight <= 1.0 + 1e-9 and (best < 0 or tight > best_tight):
                best = m
                best_tight = tight
        if best >= 0 and (pack or base == n_m or base_opens):
            out[b] = best
    return True


@njit(cache=True)
def _act_span(lo, hi, args, n_m, n_d):
    """`_act_envs` for envs lo .. hi - 1 on one scratch (`risk_act_args` in `args`); False at the first env that
    fails. The body of `_act_kernel_parallel`."""
    scratch = _act_scratch(n_m, n_d)
    run = np.empty(args[4].shape[1], dtype=np.int64)  # job_machine's width
    no_mask = np.zeros((0, n_m + 1), dtype=np.bool_)
    return _act_envs(lo, hi, scratch, run, no_mask, False, False, False, *args)


@njit(cache=True, parallel=True)
def _act_kernel_parallel(args, n_envs, n_m, n_d, n_spans):
    n_c = max(min(n_spans, n_envs), 1)
    ok = np.ones(n_c, dtype=np.bool_)
    for c_ in prange(n_c):  # spans of envs, each with its scratch allocated once (envs_of_span)
        lo, hi = envs_of_span(c_, n_envs, n_c)
        ok[np.int64(c_)] = _act_span(lo, hi, args, n_m, n_d)
    return ok.all()


# the learned placer's inputs (`models.placer_kernel`: its wrapper and documentation)


@njit(cache=True, inline="always")
def _placer_lookup(
    b, j, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows, values, level_rows,
    use_labels, use_remaining, age_edges, remaining_edges, out,
):  # fmt: skip
    """out (L, D): the levels of job j of env b (`RemainingPeakQuantiles.flat_levels`); False if one is negative."""
    start = job_start[b, j] if job_machine[b, j] >= 0 else t + 1
    n_obs = min(max(t - start + 1, 0), duration[b, j])
    ok = True
    a, e, rem, row, job_row, last = job_cell(
        b, j, n_obs, duration, labels, order, prefix_rows, cells, values, use_labels, use_remaining, age_edges,
        remaining_edges,
    )  # fmt: skip
    for d in range(out.shape[1]):
        r, p = resource_cell(b, j, d, request, cells, row, job_row, last, values.shape[1])
        for li in range(level_rows.shape[0]):
            v = values[d, r, p, a, e, rem, level_rows[li]]
            out[li, d] = v
            if v < 0:
                ok = False
    return ok


@njit(cache=True, inline="always")
def _machine_inputs(
    b, m, c, t, timeline, noise, has_noise, past, busy_until, requested, n_running, cap, use_durations, max_duration,
    request, head, has_job, head_mean, base_actions, mask, x,
):  # fmt: skip
    """x[b, m, c:]: machine m's inputs after its level columns (`feature_names`, as `placement_features` computes
    them): usage now (noise included), the history's mean and max, in use, free by requests (`requested` (M, D) of
    its running jobs), running jobs (`n_running` (M,)) / 10, time left, the head's request and its mean median
    over the horizon (`head_mean` (D,), in units), the base action's flag and the mask's. Returns whether the
    machine is in use."""
    width, n_d = timeline.shape[1], timeline.shape[3]
    hist = past.shape[1]
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
        x[b, m, c + n_d + d] = head_mean[d] / cap[d]
    c += 2 * n_d
    x[b, m, c] = 1.0 if base_actions[b] == m else 0.0
    x[b, m, c + 1] = 1.0 if mask[b, m] else 0.0
    return is_used


@njit(cache=True, inline="always")
def _global_inputs(b, n_used, n_valid, n_m, n_arrived, next_job, queue_size, has_job, base_actions, g):
    """g[b]: the global inputs (`GLOBAL_FEATURES`): queue length / its size (at most 4), the shares of machines in
    use and valid, whether a job waits, whether the base action holds."""
    g[b, 0] = min(np.float64(n_arrived[b] - next_job[b]) / np.float64(queue_size), 4.0)
    g[b, 1] = np.float64(n_used) / np.float64(n_m)
    g[b, 2] = np.float64(n_valid) / np.float64(n_m)
    g[b, 3] = 1.0 if has_job else 0.0
    g[b, 4] = 1.0 if base_actions[b] == n_m else 0.0


@njit(cache=True)
def _placer_envs(
    lo,
    hi,
    scratch,
    run,
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
    cells,
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
    """The inputs of envs lo .. hi - 1 (the body `placer_features_kernel_parallel` runs per span of envs, and
    `_decide_span` too); False
    at the first env where a looked-up value is negative. `scratch` from `_placer_scratch` and `run` (the jobs'
    width) are written before they are read. One call per span, not per env (`_act_envs`)."""
    n_j = job_machine.shape[1]
    n_m, n_d = timeline.shape[2], timeline.shape[3]
    n_levels = level_rows.shape[0]
    first, total, n_running, requested, vals, head_first, head_total = scratch
    head_mean = np.empty(n_d)  # the head's mean median over the horizon (`_machine_inputs`)
    for b in range(lo, hi):
        if is_done[b] and skip_done:  # a finished env's row is not read: zeros
            x[b] = 0.0
            g[b] = 0.0
            continue
        first[:] = 0.0
        total[:] = 0.0
        n_running[:] = 0
        requested[:] = 0
        t = t_arr[b]
        n_run = _running_jobs(b, t, next_job[b], job_machine, job_start, duration, run)
        for k in range(n_run):  # in job order
            j = run[k]
            m = job_machine[b, j]
            if not _placer_lookup(
                b, j, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows,
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
        if not _placer_lookup(
            b, head, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows,
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
            for d in range(n_d):
                head_mean[d] = head_total[0, d] / np.float64(horizon)
            is_used = _machine_inputs(
                b, m, c, t, timeline, noise, has_noise, past, busy_until, requested, n_running, cap, use_durations,
                max_duration, request, head, has_job, head_mean, base_actions, mask, x,
            )  # fmt: skip
            n_used += 1 if is_used else 0
            n_valid += 1 if mask[b, m] else 0
        _global_inputs(b, n_used, n_valid, n_m, n_arrived, next_job, queue_size, has_job, base_actions, g)
    return True


@njit(cache=True)
def _placer_span(lo, hi, args, n_m, n_levels, n_d):
    """`_placer_envs` for envs lo .. hi - 1 on one scratch (`models.placer_kernel.feature_args` in `args`); False
    at the first env that fails. The body of `placer_features_kernel_parallel`."""
    scratch = _placer_scratch(n_m, n_levels, n_d)
    run = np.empty(args[4].shape[1], dtype=np.int64)  # job_machine's width
    return _placer_envs(lo, hi, scratch, run, *args)


@njit(cache=True, parallel=True)
def placer_features_kernel_parallel(args, n_envs, n_m, n_levels, n_d, n_spans):
    n_c = max(min(n_spans, n_envs), 1)
    ok = np.ones(n_c, dtype=np.bool_)
    for c_ in prange(n_c):  # spans of envs, each with its scratch allocated once (envs_of_span)
        lo, hi = envs_of_span(c_, n_envs, n_c)
        ok[np.int64(c_)] = _placer_span(lo, hi, args, n_m, n_levels, n_d)
    return ok.all()


# the learned placer's inputs from columns computed elsewhere (the recall path, `sim.recall_sums.recall_columns`)


@njit(cache=True)
def _column_inputs_span(
    lo, hi, cols, head_mean, requested, n_running, t_arr, next_job, n_arrived, is_done, job_machine, request,
    busy_until, timeline, noise, has_noise, past, cap, queue_size, use_durations, max_duration, base_actions, mask,
    x, g,
):  # fmt: skip
    """The inputs of envs lo .. hi - 1 from their level columns `cols` (5 L, B, M), the heads' mean medians
    `head_mean` (B, D) and the running jobs' requests (B, M, D) and counts (B, M) per machine (`_machine_inputs`,
    `_global_inputs`, as `_placer_envs` writes them after its columns)."""
    n_j, n_m = job_machine.shape[1], timeline.shape[2]
    n_c = cols.shape[0]
    for b in range(lo, hi):
        t = t_arr[b]
        head = min(next_job[b], n_j - 1)
        has_job = n_arrived[b] > next_job[b] and not is_done[b]
        n_used = 0
        n_valid = 0
        for m in range(n_m):
            for c in range(n_c):
                x[b, m, c] = cols[c, b, m]
            is_used = _machine_inputs(
                b, m, n_c, t, timeline, noise, has_noise, past, busy_until, requested[b], n_running[b], cap,
                use_durations, max_duration, request, head, has_job, head_mean[b], base_actions, mask, x,
            )  # fmt: skip
            n_used += 1 if is_used else 0
            n_valid += 1 if mask[b, m] else 0
        _global_inputs(b, n_used, n_valid, n_m, n_arrived, next_job, queue_size, has_job, base_actions, g)


@njit(cache=True, parallel=True)
def column_inputs_kernel_parallel(args, n_envs, n_spans):
    """`_column_inputs_span` over the envs in `n_spans` spans (`models.forecast_placer.placement_features` on the
    recall path)."""
    n_c = max(min(n_spans, n_envs), 1)
    for c_ in prange(n_c):
        lo, hi = envs_of_span(c_, n_envs, n_c)
        _column_inputs_span(lo, hi, *args)


def column_inputs(
    cfg, state: State, cols: np.ndarray, head_mean: np.ndarray, use_durations: bool, base_actions: np.ndarray,
    mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(x (B, M, F) float32, g (B, G) float32): `models.forecast_placer.placement_features`' inputs from its level
    columns `cols` (5 L, B, M) and the heads' mean medians (B, D) (the recall path's,
    `sim.recall_sums.recall_columns`), in one kernel over the envs instead of numpy's (B, M, D) temporaries: the
    same float operations, so the same numbers (every env, finished ones too). The running jobs' requests and
    counts per machine are the state's memoised ones (`sim.core.placed_requests`, `jobs_per_machine`)."""
    n_envs, n_m, n_d = state.batch_size, cfg.n_machines, cfg.n_resources
    jobs = state.jobs
    x = np.empty((n_envs, n_m, cols.shape[0] + 6 * n_d + 5), dtype=np.float32)
    g = np.empty((n_envs, 5), dtype=np.float32)
    args = (
        np.ascontiguousarray(cols), np.ascontiguousarray(head_mean), placed_requests(state), jobs_per_machine(state),
        state.t, state.next_job, state.n_arrived, state.is_done, state.job_machine, jobs.request, state.busy_until,
        state.timeline, *noise_args(state), state.past, np.asarray(cfg.capacity_units, dtype=np.float64),
        int(cfg.queue_size), bool(use_durations), int(max(jobs.max_duration, 1)),
        np.asarray(base_actions, dtype=np.int64), np.asarray(mask, dtype=np.bool_), x, g,
    )  # fmt: skip
    launch(column_inputs_kernel_parallel, on_threads(n_envs), args, n_envs)
    return x, g


# the rule, the mask and the placer's inputs of one decision in one pass over the envs (`models.placer_kernel.decide`)


@njit(cache=True)
def _decide_span(lo, hi, act_args, placer_args, advice_args, has_advice, n_d, n_levels, hold_always, mask):
    """The decision inputs of envs lo .. hi - 1 in three passes over them, each one call: the rule's actions and
    the valid actions (`_act_envs`: the machines the rule found valid, hold always or where none is), the
    advisor's actions (`_act_envs` on `advice_args`, where `has_advice`), and the placer's inputs
    (`_placer_envs`, which read both); False where a looked-up value is negative. A finished env is not walked:
    its action is hold, its only valid one, and its inputs are zeros, as the bodies give them (no job waits: no
    machine is valid or fits). The body of `decide_kernel_parallel`."""
    n_m = mask.shape[1] - 1
    skip_done = placer_args[30]  # `decide` passes it
    scratch = _act_scratch(n_m, n_d)
    run = np.empty(act_args[4].shape[1], dtype=np.int64)  # job_machine's width
    if not _act_envs(lo, hi, scratch, run, mask, True, hold_always, skip_done, *act_args):
        return False
    if has_advice and not _act_envs(lo, hi, scratch, run, mask, False, hold_always, skip_done, *advice_args):
        return False
    return _placer_envs(lo, hi, _placer_scratch(n_m, n_levels, n_d), run, *placer_args)


@njit(cache=True, parallel=True)
def decide_kernel_parallel(
    act_args, placer_args, advice_args, has_advice, n_d, n_levels, hold_always, mask, n_spans
):  # fmt: skip
    """`_decide_span` over the envs in `n_spans` spans, one per prange iteration (`envs_of_span`; `act_args`:
    `risk_act_args`; `placer_args`: `models.placer_kernel.feature_args`, whose base actions and mask are
    `act_args`' output and `mask` (B, M + 1); `advice_args`: the advisor's `risk_act_args`, read where
    `has_advice`; D resources, the placer's `n_levels`)."""
    n_b = mask.shape[0]
    n_c = max(min(n_spans, n_b), 1)
    ok = np.ones(n_c, dtype=np.bool_)
    for c_ in prange(n_c):  # spans of envs, each with its scratch allocated once (envs_of_span)
        lo, hi = envs_of_span(c_, n_b, n_c)
        ok[np.int64(c_)] = _decide_span(
            lo, hi, act_args, placer_args, advice_args, has_advice, n_d, n_levels, hold_always, mask
        )
    return ok.all()


# the recall path's rows (`sim.recall_sums`): each env's running jobs and queue head, their table values and runs


def recall_table_rows(
    state: State, table, level_rows: np.ndarray, envs: np.ndarray, horizon: int, use_durations: bool,
    min_observed: int,
) -> tuple[np.ndarray, tuple] | None:  # fmt: skip
    """`sim.recall_sums.recall_rows` for a remaining-peak table (`PeakQuantileForecaster`'s level or
    `RemainingPeakQuantiles`' levels, `level_rows` their indices in the table) under recall: (row_start (R + 1,),
    the row arrays env, job, machine, best, n_best, n_own, young, t, start, n_alive, values (N, L, D) and request
    (N, D)) in one kernel over the envs, without the numpy path's (B, J) masks, gathers and look-ups. None where a
    looked-up value is not a whole number of units >= 0 (the numpy path then refuses it too) or where switched
    off (`ENABLED`)."""
    if not ENABLED:
        return None
    jobs = state.jobs
    envs = np.asarray(envs, dtype=np.int64)
    threaded = on_threads(envs.size)

    def structure() -> tuple:
        n_codes = max(int(jobs.workload_code.max(initial=-1)) + 1, 1)
        return jobs, *launch(
            _recall_structure_kernel, threaded, envs, state.t, state.next_job, state.n_arrived, state.is_done,
            state.job_machine, state.job_start, jobs.duration, jobs.workload_code, n_codes,
        )  # fmt: skip

    # the rows and their runs read the jobs' places and order only (not labels, levels or horizon): one walk per
    # state and order of the queue, shared by every forecaster's rows at a decision (the placer's and a rule's)
    key = ("recall_structure", id(jobs), jobs.revision, envs.tobytes())
    held = memo_value(state, key, structure)
    if held[0] is not jobs:  # another batch under a reused id: walk again
        held = structure()
    row_start, env, job, machine, best, n_best, n_own, start, has_job = held[1:]
    values = levels_last(table.values)
    ok, young, t_row, n_alive, row_values, row_request = launch(
        _recall_lookup_kernel, threaded, row_start, env, job, start, has_job, state.t, state.job_machine,
        state.job_start, jobs.duration, jobs.request, observed_labels(state), *prefix_args(jobs, values), values,
        np.asarray(level_rows, dtype=np.int64), table.use_labels, table.use_remaining, AGE_EDGE_ARRAY,
        REMAINING_EDGE_ARRAY, int(horizon), bool(use_durations), int(min_observed),
    )  # fmt: skip
    rows = (env, job, machine, best, n_best, n_own, young, t_row, start, n_alive, row_values, row_request)
    return (row_start, rows) if ok else None


@njit(cache=True)
def _recall_structure_span(
    lo, hi, envs, t_arr, next_job, n_arrived, is_done, job_machine, job_start, duration, codes, n_codes, row_start,
    out,
):  # fmt: skip
    """The rows of envs lo .. hi - 1 of `_recall_structure_kernel`: each env's running jobs in job order, then (at
    row N + r) its queue head, with the run each recalls (`recall_view`: the started run of its workload observed
    longest, not itself) and its start (t for a job not placed)."""
    (env, job, machine, best, n_best, n_own, start, has_job) = out
    n_envs, n_j = envs.shape[0], job_machine.shape[1]
    n_rows = row_start[n_envs]
    top1, top2 = np.empty(n_codes, dtype=np.int64), np.empty(n_codes, dtype=np.int64)
    n_started, n_obs = np.empty(n_codes, dtype=np.int64), np.empty(n_j, dtype=np.int64)
    run = np.empty(n_j, dtype=np.int64)
    for r in range(lo, hi):
        b = envs[r]
        t = t_arr[b]
        head = min(next_job[b], n_j - 1)
        n_placed = min(next_job[b], n_j)  # placed jobs are the prefix before the queue
        for j in range(n_placed):  # only the placed jobs' workloads and the head's are read
            if codes[b, j] >= 0:
                top1[codes[b, j]], top2[codes[b, j]], n_started[codes[b, j]] = -1, -1, 0
        if codes[b, head] >= 0:
            top1[codes[b, head]], top2[codes[b, head]], n_started[codes[b, head]] = -1, -1, 0
        n_obs[head] = -1  # a queued head: nothing observed (a placed one is set below)
        # `sim.forecast._best_runs`: started runs by workload, the longest observed first
        for j in range(n_placed):
            is_started = job_machine[b, j] >= 0 and job_start[b, j] <= t
            n_obs[j] = min(max(t - job_start[b, j] + 1, 0), duration[b, j]) if is_started else -1
            g = codes[b, j]
            if not is_started or g < 0:
                continue
            n_started[g] += 1
            first = top1[g]
            if first < 0:
                top1[g] = j
            elif n_obs[j] > n_obs[first]:  # jobs in index order: a tie keeps the earlier job first
                top2[g] = first
                top1[g] = j
            elif top2[g] < 0 or n_obs[j] > n_obs[top2[g]]:
                top2[g] = j
        has_job[r] = n_arrived[b] > next_job[b] and not is_done[b]
        n_run = _running_jobs(b, t, next_job[b], job_machine, job_start, duration, run)
        for k in range(n_run + 1):
            i, j = (row_start[r] + k, run[k]) if k < n_run else (n_rows + r, head)
            placed = job_machine[b, j] >= 0
            env[i], job[i], machine[i] = b, j, job_machine[b, j] if k < n_run else -1
            own, chosen = codes[b, j], np.int64(-1)
            if own >= 0:
                chosen = top2[own] if top1[own] == j else top1[own]
                if n_started[own] - (1 if n_obs[j] >= 0 else 0) <= 0:
                    chosen = -1
            best[i] = chosen
            n_best[i] = max(n_obs[chosen], 0) if chosen >= 0 else 0
            n_own[i] = max(n_obs[j], 0)
            start[i] = job_start[b, j] if placed else t


@njit(cache=True, parallel=True)
def _recall_structure_kernel(
    envs, t_arr, next_job, n_arrived, is_done, job_machine, job_start, duration, codes, n_codes, n_spans
):  # fmt: skip
    n_envs, n_j = envs.shape[0], job_machine.shape[1]
    n_spans = max(min(n_spans, n_envs), 1)
    counts = np.zeros(n_envs, dtype=np.int64)
    for c in prange(n_spans):
        lo, hi = envs_of_span(c, n_envs, n_spans)
        run = np.empty(n_j, dtype=np.int64)
        for r in range(lo, hi):
            b = envs[r]
            counts[r] = _running_jobs(b, t_arr[b], next_job[b], job_machine, job_start, duration, run)
    row_start = np.zeros(n_envs + 1, dtype=np.int64)
    for r in range(n_envs):
        row_start[r + 1] = row_start[r] + counts[r]
    n_rows = row_start[n_envs] + n_envs  # the heads after the running jobs
    out = (
        np.empty(n_rows, dtype=np.int64), np.empty(n_rows, dtype=np.int64), np.empty(n_rows, dtype=np.int64),
        np.empty(n_rows, dtype=np.int64), np.empty(n_rows, dtype=np.int64), np.empty(n_rows, dtype=np.int64),
        np.empty(n_rows, dtype=np.int64), np.empty(n_envs, dtype=np.bool_),
    )  # fmt: skip
    for c in prange(n_spans):
        lo, hi = envs_of_span(c, n_envs, n_spans)
        _recall_structure_span(
            lo, hi, envs, t_arr, next_job, n_arrived, is_done, job_machine, job_start, duration, codes, n_codes,
            row_start, out,
        )  # fmt: skip
    return (row_start, *out)


@njit(cache=True)
def _recall_lookup_span(
    lo, hi, row_start, env, job, start, has_job, t_arr, job_machine, job_start, duration, request, labels, cells,
    order, prefix_rows, values, level_rows, use_labels, use_remaining, age_edges, remaining_edges, horizon,
    use_durations, min_observed, out,
):  # fmt: skip
    """The table's values and the steps alive of envs lo .. hi - 1's rows (`_recall_structure_span`'s), as
    `sim.recall_sums.recall_rows` fills them; False where a looked-up value is not a whole number of units >= 0."""
    (young, t_row, n_alive, row_values, row_request) = out
    n_envs = row_start.shape[0] - 1
    n_rows = row_start[n_envs]
    vals = np.empty((level_rows.shape[0], request.shape[2]))
    ok = True
    for r in range(lo, hi):
        n_run = row_start[r + 1] - row_start[r]
        for k in range(n_run + 1):
            i = row_start[r] + k if k < n_run else n_rows + r
            b, j = env[i], job[i]
            t = t_arr[b]
            _placer_lookup(
                b, j, t, job_machine, job_start, duration, request, labels, cells, order, prefix_rows, values,
                level_rows, use_labels, use_remaining, age_edges, remaining_edges, vals,
            )  # fmt: skip
            for li in range(vals.shape[0]):
                for d in range(vals.shape[1]):
                    v = vals[li, d]
                    if not (v >= 0.0 and v == np.floor(v) and v < np.inf):
                        ok = False
                    row_values[i, li, d] = v
            for d in range(row_request.shape[1]):
                row_request[i, d] = np.float64(request[b, j, d])
            t_row[i] = t
            alive = horizon
            if use_durations:
                alive = min(max(start[i] + duration[b, j] - t - 1, 0), horizon)
            n_alive[i] = alive if (has_job[r] or k < n_run) else 0
            placed = job_machine[b, j] >= 0
            young[i] = min_observed > 0 and t - (job_start[b, j] if placed else t + 1) + 1 < min_observed
    return ok


@njit(cache=True, parallel=True)
def _recall_lookup_kernel(
    row_start, env, job, start, has_job, t_arr, job_machine, job_start, duration, request, labels, cells, order,
    prefix_rows, values, level_rows, use_labels, use_remaining, age_edges, remaining_edges, horizon, use_durations,
    min_observed, n_spans,
):  # fmt: skip
    n_envs = row_start.shape[0] - 1
    n_spans = max(min(n_spans, n_envs), 1)
    n = env.shape[0]
    n_l, n_d = level_rows.shape[0], request.shape[2]
    out = (
        np.empty(n, dtype=np.bool_), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
        np.empty((n, n_l, n_d)), np.empty((n, n_d)),
    )  # fmt: skip
    ok = np.ones(n_spans, dtype=np.bool_)
    for c in prange(n_spans):
        lo, hi = envs_of_span(c, n_envs, n_spans)
        ok[np.int64(c)] = _recall_lookup_span(
            lo, hi, row_start, env, job, start, has_job, t_arr, job_machine, job_start, duration, request, labels,
            cells, order, prefix_rows, values, level_rows, use_labels, use_remaining, age_edges, remaining_edges,
            horizon, use_durations, min_observed, out,
        )  # fmt: skip
    return (ok.all(), *out)
