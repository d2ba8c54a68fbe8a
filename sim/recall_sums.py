"""Per-machine sums over the horizon on the recall path, straight from each env's jobs (issue 22, item 8).

Where a forecaster recalls earlier runs of a job's workload (`sim.forecast.RecallOverlay` over a forecaster with a
value per level), each job's forecast varies along the horizon, and the learned placer's features
(`models.forecast_placer._level_columns`) and a forecast rule's bounds (`sim.risk.head_bounds`) sum per machine
the planes of every running job over the H steps. The general path builds every job's (P, H, D) planes
(`sim.compiled_planes.flat_planes`), sorts and sums them per machine (`sum_rows`), carries the sums between
decisions at the same step (`sim.running_sums`) and reads the columns from them (`level_columns`): on DeepPlace,
whose jobs run for up to 99 steps, the planes alone are tens of megabytes per decision, and the time moves on
between most decisions, so little is carried.

Here one kernel per call walks each env: it sums the planes of the env's running jobs into one machine buffer
(M, P, H, D) that stays in cache, the recalled run read in place from `JobBatch.usage` instead of copied into a
view, and reads the columns or the bounds from it; nothing per job is stored. The values are the general path's:
every plane is an integer number of units (a "higher" table quantile, a recalled observed step, a request, and
their differences and squares), so every sum is exact in any order, and the columns and bounds do the same float
operations on the same sums (`recall_columns` and `recall_head_share` return None, and the general path runs,
where a value is not a whole number of units >= 0, the usage is not integer units, or the forecaster is of another
kind). The rows the kernels read (each env's running jobs and queue head, the run each recalls, its steps alive)
come, for a remaining-peak table forecaster, from two more kernels (`sim.compiled_decision.recall_table_rows`):
the walk of each env's jobs, memoised per state and queue order and so shared by every forecaster asked about
the state, and that forecaster's table look-ups; else from numpy (`recall_rows`). At rho = 1 the columns read
each level's peak per segment of the rows' flat steps, and a point rule's bounds on the same rows (the learned
placer's advisor) come from the same pass (`recall_columns(advisor=...)`), left in the state's memo for its
`recall_head_share`; where the advisor's table agrees with the placer's at its level (`_shared_level`), its values
are the placer's rows' and its table is not looked up again. On DeepPlace 50 % the training rollout went from 3.2k
to 23.2k decisions/s with the same decisions in the twenty-fourth session, to 41-42k in the twenty-fifth and to
46-48k in the twenty-sixth (benchmarks/RESULTS.md, "DeepPlace's recall path summed from each env's jobs",
"DeepPlace's recall path: one walk per decision, the advisor in the placer's pass", and the twenty-sixth
session's section). Tests: tests/sim/test_recall_sums.py.
"""

from __future__ import annotations

import weakref

import numpy as np

from sim.config import SimConfig
from sim.core import State, jobs_running, memo_peek, memo_value, observed_labels, queue_head
from sim.forecast import (
    RecallOverlay,
    find_level,
    flat_forecast,
    is_flat_forecaster,
    is_point_forecaster,
    level_index,
    recall_choice,
)
from sim.peak_forecast import PeakQuantileForecaster, RemainingPeakQuantiles

ENABLED = True
"""Whether the recall path runs here (tests switch it off to compare with the general path)."""


def applies(forecaster) -> bool:
    """Whether `forecaster` is recall over a forecaster with one value per job and level over the horizon (a flat
    point forecaster's one value, or `flat_levels`)."""
    if not (ENABLED and isinstance(forecaster, RecallOverlay)):
        return False
    inner = forecaster.inner
    return callable(getattr(inner, "flat_levels", None)) or is_flat_forecaster(inner)


def _is_units(a: np.ndarray) -> bool:
    """Whether every value is a whole number of units >= 0: sums exact in any order, and a machine's sums 0
    wherever none of its jobs is alive (the kernels read no further; `JobBatch` refuses negative usage)."""
    return bool(np.isfinite(a).all() and (a == np.rint(a)).all() and (a >= 0).all())


def recall_rows(
    cfg: SimConfig,
    state: State,
    forecaster: RecallOverlay,
    levels: tuple[float, ...] | None,
    envs: np.ndarray,
    horizon: int,
    use_durations: bool,
    min_observed: int,
    squares: bool,
) -> tuple[np.ndarray, tuple] | None:
    """(row_start (R + 1,), the kernels' row tuple) for the envs `envs`: rows 0 .. N - 1 the running jobs of each
    env in turn (env r's rows row_start[r] .. row_start[r + 1] - 1), rows N + r the queue heads. `levels` None: the
    inner forecaster's point value (one level). None where the values are not integer units."""
    jobs = state.jobs
    if jobs.usage.dtype.kind not in "iu":
        return None
    tail = (jobs.usage, jobs.duration.astype(np.int64, copy=False), int(jobs.max_duration), bool(squares))
    level_rows = _table_level_rows(forecaster.inner, levels)
    if level_rows is not None:  # a remaining-peak table: the rows and their look-ups in one kernel
        from sim.compiled_decision import recall_table_rows  # loads numba: on first use

        got = recall_table_rows(
            state, forecaster.inner.table, level_rows, envs, horizon, use_durations, min_observed
        )
        if got is not None:
            row_start, found = got
            return row_start, (*found, *tail, *_recall_scratch(found[0].size))
    n_envs = envs.size
    ri, ji = np.nonzero(jobs_running(state)[envs])
    head_job = np.minimum(state.next_job[envs], jobs.max_jobs - 1)
    pos = np.concatenate([ri, np.arange(n_envs)])
    env = envs[pos]
    job = np.concatenate([ji, head_job])
    row_start = np.zeros(n_envs + 1, dtype=np.int64)
    np.cumsum(np.bincount(ri, minlength=n_envs), out=row_start[1:])
    inner = forecaster.inner
    if levels is None:
        values = flat_forecast(inner, cfg, state, env, job)[:, None, :]
    else:
        values = inner.flat_levels(tuple(levels), cfg, state, env, job)
    values = np.ascontiguousarray(values, dtype=np.float64)
    request = jobs.request[env, job].astype(np.float64)
    if not (_is_units(values) and _is_units(request)):
        return None
    # the run each job recalls (`sim.forecast.recall_view`'s choice; its agreement test runs in the kernel)
    best, _, n_obs = recall_choice(state, envs, pos, env, job)
    n_best = np.where(best >= 0, np.maximum(n_obs[pos, np.maximum(best, 0)], 0), 0)
    n_own = np.maximum(n_obs[pos, job], 0)
    # steps alive (`steps_alive`, `job_moments`: a job not placed yet starts at t; the heads 0 where none waits)
    t = state.t[env]
    is_placed = state.job_machine[env, job] >= 0
    start = np.where(is_placed, state.job_start[env, job], t)
    if use_durations:
        n_alive = np.clip(start + jobs.duration[env, job] - t - 1, 0, horizon)
    else:
        n_alive = np.full(env.size, horizon, dtype=np.int64)
    n_alive[ri.size :] *= queue_head(state).has_job[envs]
    young = np.zeros(env.size, dtype=bool)
    if min_observed > 0:  # `job_moments`: a job not placed yet counts from t + 1
        young = t - np.where(is_placed, state.job_start[env, job], t + 1) + 1 < min_observed
    rows = (
        env, job, np.concatenate([state.job_machine[envs[ri], ji], np.full(n_envs, -1)]).astype(np.int64),
        best.astype(np.int64), n_best.astype(np.int64), n_own.astype(np.int64), young, t.astype(np.int64),
        start.astype(np.int64), n_alive.astype(np.int64), values, request, *tail, *_recall_scratch(env.size),
    )  # fmt: skip
    return row_start, rows


def _recall_scratch(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' per-row recall flags (ok, done), written before they are read."""
    return np.zeros(n_rows, dtype=np.bool_), np.zeros(n_rows, dtype=np.bool_)


def _table_level_rows(inner, levels: tuple[float, ...] | None) -> np.ndarray | None:
    """The remaining-peak table's level indices the rows read (`levels`, or a point forecaster's own level where
    None), or None where `inner` is not a table forecaster of exactly those kinds or lacks a level."""
    if type(inner) is RemainingPeakQuantiles and levels is not None:
        wanted = levels
    elif type(inner) is PeakQuantileForecaster and levels is None:
        wanted = (inner.level,)
    else:
        return None
    rows = [find_level(inner.table.levels, lv) for lv in wanted]
    return None if any(r is None for r in rows) else np.asarray(rows, dtype=np.int64)


def recall_columns(
    cfg: SimConfig,
    state: State,
    forecaster,
    levels: tuple[float, ...],
    rho: float,
    horizon: int,
    use_durations: bool,
    skip: np.ndarray | None,
    advisor=None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(columns (5 L, B, M), the heads' mean median (B, D)) of `models.forecast_placer._level_columns` on the recall
    path (module docstring): the same numbers. None where it does not apply. `advisor`: a rule (`forecaster`,
    `risk`, e.g. a `sim.risk.RiskAwarePacking`) that will ask `recall_head_share` about the same state: where its
    bounds come from the same rows (`_advisor_values`), the same kernel computes them and leaves them for that
    call (under `_share_key`), instead of a second pass over every env's jobs."""
    if not applies(forecaster) or not callable(getattr(forecaster.inner, "flat_levels", None)):
        return None
    if horizon < 1 or horizon > forecaster.inner.horizon:
        return None
    for lv in levels:
        level_index(forecaster.levels, lv, "forecast placer")
    squares = rho != 1.0
    envs = np.arange(state.batch_size)
    got = recall_rows(cfg, state, forecaster, levels, envs, horizon, use_durations, 0, squares)
    if got is None:
        return None
    from sim import compiled_planes  # loads numba: on first use
    from sim.compiled_step import launch, on_threads

    row_start, rows = got
    n_l, n_m, n_d = len(levels), cfg.n_machines, cfg.n_resources
    n_p = 1 + (n_l - 1) * (2 if squares else 1)
    out = compiled_planes.output_array((5 * n_l, envs.size, n_m))
    head_mean = compiled_planes.output_array((envs.size, n_d))
    skip = np.zeros(envs.size, dtype=np.bool_) if skip is None else np.asarray(skip, dtype=np.bool_)
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    adv = (
        None
        if advisor is None or squares
        else _advisor_values(cfg, state, advisor, rows, horizon, use_durations, forecaster, levels)
    )
    adv_share = compiled_planes.output_array((envs.size, n_m) if adv is not None else (1, 1))
    wrote = launch(
        compiled_planes._recall_columns_kernel, on_threads(envs.size), row_start, rows, n_m, n_p, int(horizon),
        n_l, float(rho), cap, skip, out, head_mean, adv is not None, adv if adv is not None else np.zeros((1, n_d)),
        adv_share,
    )  # fmt: skip
    if adv is not None and wrote:
        key = _share_key(cfg, state, advisor.forecaster, advisor.risk)
        memo_value(
            state, key, lambda: (observed_labels(state), state.jobs, adv_share <= 1.0 + 1e-9, adv_share)
        )
    return out, head_mean


def _share_key(cfg: SimConfig, state: State, forecaster, rcfg) -> tuple:
    """The memo key of a rule's bounds for every env of a state (`recall_columns`' advisor): the simulator's
    settings, the forecaster, the rule's settings, and the batch and its order (a job pick reorders the queue in
    place), which the memo's states may differ in; the labels, which they may differ in too, are held in the value
    and compared."""
    return ("recall_head_share", cfg, id(forecaster), rcfg, id(state.jobs), state.jobs.revision)


def _advisor_values(
    cfg: SimConfig,
    state: State,
    advisor,
    rows: tuple,
    horizon: int,
    use_durations: bool,
    placer=None,
    levels: tuple[float, ...] = (),
):
    """(N, D) the point values of `advisor`'s forecaster for `rows` (the placer's: the same jobs, runs, steps
    alive and young rows), or None where its bounds would not come from those rows the way `recall_head_share`
    computes them: not recall over a flat point forecaster, another horizon, durations or `min_observed`, an
    `extend_to`, an infinite inflation, or rows walked apart. Where the placer's forecaster `placer` looked up
    the advisor's level at the same cells of an equal table (`_shared_level`), its rows' values at that level
    are the advisor's: no second look-up."""
    forecaster, rcfg = getattr(advisor, "forecaster", None), getattr(advisor, "risk", None)
    if forecaster is None or rcfg is None or not applies(forecaster) or not is_point_forecaster(forecaster):
        return None
    if not is_flat_forecaster(forecaster.inner):
        return None
    own = forecaster.horizon if rcfg.horizon is None else rcfg.horizon
    if own != horizon or own > forecaster.inner.horizon or rcfg.use_durations != use_durations:
        return None
    if rcfg.min_observed != 0 or rcfg.extend_to is not None or not np.isfinite(rcfg.inflation):
        return None
    for level in (0.5, rcfg.level):  # `job_moments`' error for a level the forecaster lacks
        level_index(forecaster.levels, level, type(forecaster).__name__)
    shared = _shared_level(placer, levels, forecaster)
    if shared is not None:
        return np.ascontiguousarray(rows[10][:, shared, :])
    envs = np.arange(state.batch_size)
    got = recall_rows(cfg, state, forecaster, None, envs, horizon, use_durations, 0, False)
    if got is None or got[1][0] is not rows[0]:  # not the memoised walk both read: the rule asks for itself
        return None
    return np.ascontiguousarray(got[1][10][:, 0, :])


_AGREEING_TABLES: dict[tuple[int, int, float], tuple] = {}
"""`_shared_level`'s comparisons, keyed by the two tables' ids and the level, each with weak references to both
tables (an id is reused only once its object is gone, and the entry is then stale) and the outcome."""


def _shared_level(placer, levels: tuple[float, ...], forecaster) -> int | None:
    """The position among the placer's `levels` of the point forecaster `forecaster`'s level where both recall over
    remaining-peak tables whose look-ups at that level agree at every cell: the same keys (labels, remaining
    life, at-peak), the same cells, and the same values at that level (quantiles per cell do not depend on the
    other levels fitted, so `forecast_peak`'s table and the placer's, fitted on the same cases, agree); else
    None. The tables are compared once per pair."""
    if placer is None or not applies(placer) or type(placer.inner) is not RemainingPeakQuantiles:
        return None
    inner = forecaster.inner
    if type(inner) is not PeakQuantileForecaster:
        return None
    placer_rows = _table_level_rows(placer.inner, tuple(levels))  # the placer's levels' rows in its table
    k = find_level(levels, inner.level)
    a, b = placer.inner.table, inner.table
    j = find_level(b.levels, inner.level)
    if placer_rows is None or k is None or j is None:
        return None
    if a is b:
        return k
    key = (id(a), id(b), float(inner.level))
    held = _AGREEING_TABLES.get(key)
    if held is None or held[0]() is not a or held[1]() is not b:
        same = (
            (a.use_labels, a.use_remaining, a.use_at_peak) == (b.use_labels, b.use_remaining, b.use_at_peak)
            and a.values.shape[1:] == b.values.shape[1:]
            and bool(np.array_equal(a.values[placer_rows[k]], b.values[j]))
        )
        if len(_AGREEING_TABLES) >= 64:
            _AGREEING_TABLES.clear()
        held = _AGREEING_TABLES[key] = (weakref.ref(a), weakref.ref(b), same)
    return k if held[2] else None


def recall_head_share(
    cfg: SimConfig, state: State, forecaster, rcfg, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """`sim.risk.safe_and_tightness(sim.risk.head_bounds(...))` on the recall path (module docstring): (is_safe,
    peak share) (R, M) of placing each env's queue head on each machine. None where it does not apply (or where
    `rcfg.extend_to` holds jobs beyond the horizon)."""
    if not applies(forecaster):
        return None
    if rows is None:  # left by the placer's columns at this decision (`recall_columns`' advisor)
        held = memo_peek(state, _share_key(cfg, state, forecaster, rcfg))
        if held is not None and held[0] is observed_labels(state) and held[1] is state.jobs:
            return held[2], held[3]
    horizon = forecaster.horizon if rcfg.horizon is None else rcfg.horizon
    if horizon < 1 or horizon > forecaster.horizon or horizon > forecaster.inner.horizon:
        return None
    if rcfg.extend_to is not None and rcfg.extend_to > horizon:
        return None
    point = is_point_forecaster(forecaster)  # `job_moments`: one value, no deviation
    inner = forecaster.inner
    if not (is_flat_forecaster(inner) if point else callable(getattr(inner, "flat_levels", None))):
        return None
    for level in (0.5, rcfg.level):  # `job_moments`' error for a level the forecaster lacks
        level_index(forecaster.levels, level, type(forecaster).__name__)
    envs = np.arange(state.batch_size) if rows is None else np.asarray(rows, dtype=np.int64)
    levels = None if point else (0.5, rcfg.level)
    got = recall_rows(
        cfg, state, forecaster, levels, envs, horizon, rcfg.use_durations, rcfg.min_observed, not point
    )
    if got is None:
        return None
    from sim import compiled_planes  # loads numba: on first use
    from sim.compiled_step import launch, on_threads

    row_start, rows_ = got
    share = compiled_planes.output_array((envs.size, cfg.n_machines))
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    launch(
        compiled_planes._recall_share_kernel, on_threads(envs.size), row_start, rows_, cfg.n_machines,
        1 if point else 3, int(horizon), float(rcfg.rho), float(rcfg.inflation), cap, share,
    )  # fmt: skip
    return share <= 1.0 + 1e-9, share
