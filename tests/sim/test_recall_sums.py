"""The recall path summed straight from each env's jobs (`sim.recall_sums`): the learned placer's features and a
forecast rule's bounds equal the general path's (per-job planes, summed per machine) to the bit at every decision of
episodes with recurring jobs, and it steps aside where its sums would not be exact."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from models.forecast_placer import PlacerConfig, placement_features
from sim import core, recall_sums
from sim.config import SimConfig
from sim.forecast import RecallOverlay
from sim.jobs import JobBatch
from sim.peak_forecast import PeakQuantileForecaster, RemainingPeakQuantiles, fit_peak_quantiles
from sim.policies import make_policy, own_jobs, promote_queued_job
from sim.risk import PersistenceForecaster, RiskConfig, head_bounds, safe_and_tightness

CFG = SimConfig(n_machines=4, max_steps=400)
LEVELS = (0.5, 0.75, 0.9)


def _recurring_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Jobs re-submitted from 5 templates of varying usage (recall finds earlier runs), arriving 0-2 steps apart;
    one template is a one-step job."""
    rng = np.random.default_rng(seed)
    templates = []
    for k in range(5):
        dur = 1 if k == 0 else int(rng.integers(5, 30))
        templates.append(rng.integers(0, 4, (dur, 2)).tolist())

    def job(t: int, k: int) -> dict:
        return {"arrival_step": t, "usage": templates[k], "ec_label": k % 3, "workload_id": f"w{k}"}

    arrivals = np.cumsum(rng.integers(0, 3, (n_rows, n_jobs)), axis=1)
    kinds = rng.integers(0, 5, (n_rows, n_jobs))
    return JobBatch.from_jobs(
        [
            [job(int(t), int(k)) for t, k in zip(a, w, strict=True)]
            for a, w in zip(arrivals, kinds, strict=True)
        ]
    )


def _states(cfg: SimConfig, n_decisions: int = 120, seed: int = 1):
    """The states an episode's decisions see (SJF picks and places; the queue head promoted first)."""
    rng, picker = np.random.default_rng(seed), make_policy("deeprm_sjf")
    state = own_jobs(core.reset(cfg, _recurring_jobs(5, 40, seed=seed), 0))
    for _ in range(n_decisions):
        if state.is_done.all():
            break
        state = promote_queued_job(state, np.where(state.is_done, 0, picker.pick_job(cfg, state, rng)), True)
        yield state
        state, *_ = core.step(cfg, state, picker.act(cfg, state, rng))


def _table(cfg: SimConfig):
    return fit_peak_quantiles(_recurring_jobs(6, 40, seed=20), cfg, levels=LEVELS, min_count=5)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _general(monkeypatch, call, *args, **kwargs):
    """`call(*args, **kwargs)` on the general path (the recall path switched off)."""
    monkeypatch.setattr(recall_sums, "ENABLED", False)
    try:
        return call(*args, **kwargs)
    finally:
        monkeypatch.setattr(recall_sums, "ENABLED", True)


@pytest.mark.parametrize("kind", ["point", "levels", "persistence"])
@pytest.mark.parametrize(
    "rcfg",
    [
        RiskConfig(level=0.9),
        RiskConfig(level=0.75, rho=0.5, inflation=1.5, min_observed=3),
        RiskConfig(level=0.9, use_durations=False, horizon=12),
    ],
)
def test_a_rules_bounds_equal_the_general_paths_at_every_decision(kind, rcfg, monkeypatch) -> None:
    """A table's level (its rows from the compiled look-up), every level, and each job's peak so far (a
    forecaster the rows kernel does not know: the numpy rows)."""
    table = _table(CFG)
    forecaster = RecallOverlay(
        {
            "point": PeakQuantileForecaster(table, level=rcfg.level, horizon=30, levels=LEVELS),
            "levels": RemainingPeakQuantiles(table, horizon=30),
            "persistence": PersistenceForecaster(horizon=30),
        }[kind]
    )
    if rcfg.level not in forecaster.levels:  # persistence's levels: 0.5, 0.9, 0.95, 0.99
        rcfg = replace(rcfg, level=0.9)
    n_recalled = n_decisions = 0
    rng = np.random.default_rng(3)
    for state in _states(CFG):
        rows = None if n_decisions % 2 else np.flatnonzero(rng.random(state.batch_size) < 0.6)
        fused = recall_sums.recall_head_share(CFG, state, forecaster, rcfg, rows)
        assert fused is not None
        general = safe_and_tightness(head_bounds(CFG, state, forecaster, rcfg, rows), CFG)
        assert _same_bits(fused[0], general[0]) and _same_bits(fused[1], general[1])
        env, job = np.nonzero(core.jobs_running(state))
        recalled = forecaster.recalled(CFG, state, env, job)
        n_recalled += 0 if recalled is None else recalled.dest.size
        n_decisions += 1
    assert n_decisions > 60 and n_recalled > 200  # recall was exercised, not only the flat values


@pytest.mark.parametrize(("rho", "capacity"), [(1.0, (8, 8)), (0.5, (8, 8)), (1.0, (6, 8)), (0.5, (6, 10))])
def test_the_placers_inputs_equal_the_general_paths_at_every_decision(rho, capacity, monkeypatch) -> None:
    """The float64 columns (before the inputs' float32) and the inputs themselves; rho = 1 with power-of-two
    capacities takes the linear columns, the rest the pairwise ones: both exact."""
    from sim import compiled_planes

    cfg = replace(CFG, capacity_units=capacity)
    forecaster = RecallOverlay(RemainingPeakQuantiles(_table(cfg), horizon=30))
    pcfg = PlacerConfig(levels=LEVELS, rho=rho)
    fused_cols, general_cols = [], []
    real_fused, real_general = recall_sums.recall_columns, compiled_planes.level_columns

    def fused_recorded(*args, **kwargs):
        out = real_fused(*args, **kwargs)
        if out is not None:
            fused_cols.append(out[0])
        return out

    def general_recorded(*args, **kwargs):
        general_cols.append(real_general(*args, **kwargs))
        return general_cols[-1]

    monkeypatch.setattr("models.forecast_placer.recall_columns", fused_recorded)
    monkeypatch.setattr(compiled_planes, "level_columns", general_recorded)
    n = 0
    for state in _states(cfg, 80):
        base = np.zeros(state.batch_size, dtype=np.int64)
        args = (cfg, state, forecaster, pcfg, base, core.action_mask(cfg, state))
        fused = placement_features(*args, skip_done=True)
        general = _general(monkeypatch, placement_features, *args, skip_done=True)
        assert _same_bits(fused[0], general[0]) and _same_bits(fused[1], general[1])
        assert len(fused_cols) == len(general_cols) == n + 1  # one of each
        assert _same_bits(fused_cols[-1], general_cols[-1])
        n += 1
    assert n > 40


def _rows_equal_the_numpy_rows(monkeypatch, args: tuple):
    """`recall_sums.recall_rows(*args)` from the compiled rows, asserted equal (values and dtypes) to the numpy
    rows; returns them."""
    from sim import compiled_decision

    fast = recall_sums.recall_rows(*args)
    monkeypatch.setattr(compiled_decision, "ENABLED", False)
    slow = recall_sums.recall_rows(*args)
    monkeypatch.setattr(compiled_decision, "ENABLED", True)
    assert np.array_equal(fast[0], slow[0])
    for a, b in zip(fast[1][:12], slow[1][:12], strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    return fast


@pytest.mark.parametrize(("use_durations", "min_observed"), [(True, 0), (False, 3)])
def test_the_compiled_rows_equal_the_numpy_rows(use_durations, min_observed, monkeypatch) -> None:
    """`sim.compiled_decision.recall_table_rows` (a table forecaster's rows and look-ups in one kernel) gives the
    numpy path's row arrays at every decision, for every env and for a subset."""

    table = _table(CFG)
    cases = [
        (RecallOverlay(PeakQuantileForecaster(table, level=0.9, horizon=30, levels=LEVELS)), None),
        (RecallOverlay(RemainingPeakQuantiles(table, horizon=30)), LEVELS),
    ]
    n = 0
    for k, state in enumerate(_states(CFG, 60)):
        envs = np.arange(state.batch_size) if k % 2 else np.array([3, 0, 4])
        for forecaster, levels in cases:
            args = (CFG, state, forecaster, levels, envs, 30, use_durations, min_observed, False)
            fast = _rows_equal_the_numpy_rows(monkeypatch, args)
            n += int((fast[1][3] >= 0).sum())  # rows with a run to recall
    assert n > 200


def test_it_steps_aside_where_a_sum_would_not_be_exact() -> None:
    """Non-integer values (a table quantile between units) or float usage: None, so the general path runs; a
    forecaster without recall is not its business either."""
    state = next(iter(_states(CFG, 30)))
    table = _table(CFG)
    forecaster = RecallOverlay(RemainingPeakQuantiles(table, horizon=30))
    rcfg = RiskConfig(level=0.9)
    assert recall_sums.recall_head_share(CFG, state, forecaster, rcfg) is not None
    halves = replace(table, values=table.values + 0.5)
    assert (
        recall_sums.recall_head_share(CFG, state, RecallOverlay(RemainingPeakQuantiles(halves, 30)), rcfg)
        is None
    )
    as_float = replace(state, jobs=replace(state.jobs, usage=state.jobs.usage.astype(np.float64)))
    assert recall_sums.recall_head_share(CFG, as_float, forecaster, rcfg) is None
    assert recall_sums.recall_head_share(CFG, state, RemainingPeakQuantiles(table, horizon=30), rcfg) is None
    assert recall_sums.recall_columns(CFG, state, forecaster, LEVELS, 1.0, 31, True, None) is None  # past H


def test_a_rule_on_recall_decides_the_same_episodes(monkeypatch) -> None:
    from sim.risk import RiskAwarePacking
    from sim.tuning import sequence_returns

    forecaster = RecallOverlay(PeakQuantileForecaster(_table(CFG), level=0.9, horizon=30, levels=LEVELS))
    rule = RiskAwarePacking(forecaster, make_policy("deeprm_sjf"), RiskConfig(level=0.9, mode="pack"))
    jobs = _recurring_jobs(6, 40, seed=3)
    calls = []
    real = recall_sums.recall_head_share
    monkeypatch.setattr("sim.risk.recall_head_share", lambda *a: calls.append(1) or real(*a))
    fused = sequence_returns(rule, CFG, jobs, 0)
    assert calls
    general = _general(monkeypatch, sequence_returns, rule, CFG, jobs, 0)
    np.testing.assert_array_equal(fused, general)


def _random_rows(rng: np.random.Generator, n_envs: int, n_m: int, n_levels: int, n_h: int):
    """(row_start, rows) of random envs for the recall kernels: running rows on random machines and one queue head
    per env, each recalling a random earlier job that agrees with it or not, young or not, its levels above or
    below its median, alive for a random part of the horizon."""
    n_j, n_t, n_d = 16, 24, 2
    usage = rng.integers(0, 4, (n_envs, n_j, n_t, n_d)).astype(np.int16)
    duration = rng.integers(1, n_t + 1, (n_envs, n_j)).astype(np.int64)
    counts = rng.integers(0, 12, n_envs)
    row_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    env = np.concatenate([np.repeat(np.arange(n_envs), counts), np.arange(n_envs)]).astype(np.int64)
    n = env.size
    job = rng.integers(0, n_j, n).astype(np.int64)
    best = np.where(rng.random(n) < 0.8, rng.integers(0, n_j, n), -1).astype(np.int64)
    for i in np.flatnonzero(best >= 0):
        if rng.random() < 0.7:  # the job repeats its run (recall applies), else they differ somewhere
            usage[env[i], job[i]] = usage[env[i], best[i]]
    n_best = np.where(best >= 0, rng.integers(0, n_t + 1, n) % (duration[env, np.maximum(best, 0)] + 1), 0)
    n_own = np.minimum(rng.integers(1, n_t + 1, n), duration[env, job])
    n_own[row_start[-1] :] = 0  # the heads: nothing observed
    t = np.full(n, 40, dtype=np.int64)
    start = t - n_own + 1
    machine = np.concatenate([rng.integers(0, n_m, row_start[-1]), np.full(n_envs, -1)]).astype(np.int64)
    median = rng.integers(0, 4, (n, 1, n_d)).astype(np.float64)
    values = (
        median
        + np.cumsum(rng.integers(-1, 3, (n, n_levels, n_d)), axis=1) * (np.arange(n_levels) > 0)[:, None]
    )
    values = np.maximum(values, 0.0)
    values[:, 0] = median[:, 0]
    rows = (
        env, job, machine, best, n_best.astype(np.int64), n_own.astype(np.int64), rng.random(n) < 0.15, t,
        start.astype(np.int64), rng.integers(0, n_h + 3, n).astype(np.int64), values,
        rng.integers(0, 5, (n, n_d)).astype(np.float64), usage, duration, int(n_t), False,
        np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_),
    )  # fmt: skip
    return row_start, rows


def test_the_linear_columns_equal_the_pairwise_columns_on_random_rows() -> None:
    """`_machine_columns_linear` (the median summed per step, each deviation per segment of the rows' flat steps)
    gives `_machine_columns`' numbers (every plane summed per step, pairwise means) to the bit, with the head's
    recalled steps, flat steps and deviations, rows recalled or not, young rows and levels below the median."""
    from sim import compiled_planes as cp

    rng = np.random.default_rng(7)
    n_m, n_levels, n_h, n_d = 4, 3, 20, 2
    cap = np.array([8.0, 16.0])
    n_checked = 0
    for _ in range(30):
        row_start, rows = _random_rows(rng, 5, n_m, n_levels, n_h)
        n_envs, n_rows = row_start.size - 1, row_start[-1]
        linear = np.zeros((5 * n_levels, n_envs, n_m))
        pairwise = np.zeros_like(linear)
        acc = np.empty((n_m + 1, n_levels, n_h, n_d))
        acc0 = np.empty((n_m + 1, n_h, n_d))
        reach = np.empty(n_m + 1, dtype=np.int64)
        flat = np.zeros((rows[0].size, 2), dtype=np.int64)
        most = int(np.diff(row_start).max(initial=0))
        scratch = (
            np.empty(max(most, 1), dtype=np.int64), np.empty(n_m + 2, dtype=np.int64),
            np.empty(2 * most + 4, dtype=np.int64), np.empty((n_levels, n_d)), np.empty((n_levels, n_d)),
            np.empty((2, n_d)), np.empty((n_m + 1, n_levels, n_d)), np.empty((2 * n_levels, n_d)),
        )  # fmt: skip
        share, frames, values = np.empty(n_h * n_d), np.empty((128, 3), dtype=np.int64), np.empty(128)
        for r in range(n_envs):
            cp._sum_env(r, row_start, n_rows, rows, acc, reach, True)
            cp._machine_columns(
                r, acc[:n_m], acc[n_m], n_levels, 1.0, False, cap, share, frames, values, pairwise
            )
            cp._sum_env_median(r, row_start, n_rows, rows, acc0, reach, flat)
            cp._machine_columns_linear(
                r, row_start, n_rows, rows, acc0, reach, flat, n_levels, cap, scratch, linear, False,
                np.zeros((1, n_d)), np.zeros((1, n_m)),
            )  # fmt: skip
        assert _same_bits(linear, pairwise)
        ok, has_flat = rows[16], flat[:, 1] > flat[:, 0]
        n_checked += int((ok & has_flat)[n_rows:].sum())  # heads recalled with flat steps after their run
        # a point rule's shares from the same pass (its values over the rows' flat steps) equal its own kernel's
        adv = np.maximum(rows[10][:, 0] + rng.integers(-1, 4, rows[11].shape), 0.0)
        point_rows = (
            *rows[:10],
            adv[:, None, :],
            *rows[11:16],
            np.zeros_like(rows[16]),
            np.zeros_like(rows[17]),
        )
        own = np.zeros((n_envs, n_m))
        cp._recall_share_kernel(row_start, point_rows, n_m, 1, n_h, 1.0, 1.5, cap, own, 1)
        fused = np.full((n_envs, n_m), -1.0)
        skip = rng.random(n_envs) < 0.3  # finished envs: no columns, their rule's shares all the same
        cols, head_mean = np.zeros((5 * n_levels, n_envs, n_m)), np.zeros((n_envs, n_d))
        wrote = cp._recall_columns_kernel(
            row_start,
            rows,
            n_m,
            n_levels,
            n_h,
            n_levels,
            1.0,
            cap,
            skip,
            cols,
            head_mean,
            True,
            adv,
            fused,
            1,
        )
        assert wrote and _same_bits(fused, own)
        assert not cols[:, skip].any() and _same_bits(cols[:, ~skip], linear[:, ~skip])
    assert n_checked > 20


def test_the_rows_walk_is_shared_within_a_state_and_not_across_a_reordered_queue(monkeypatch) -> None:
    """The rows' walk (running jobs, runs recalled) is computed once per state and queue order
    (`sim.core.memo_value`) and shared by forecasters of other tables or levels; a job pick that reorders the
    queue in place (the same batch, another order) walks again: the rows still equal the numpy rows."""
    from sim import compiled_decision

    table = _table(CFG)
    point = RecallOverlay(PeakQuantileForecaster(table, level=0.9, horizon=30, levels=LEVELS))
    levels = RecallOverlay(RemainingPeakQuantiles(table, horizon=30))
    walks = []
    real = compiled_decision._recall_structure_kernel
    monkeypatch.setattr(compiled_decision, "_recall_structure_kernel", lambda *a: walks.append(1) or real(*a))

    def same_as_numpy(state, forecaster, lv) -> None:
        args = (CFG, state, forecaster, lv, np.arange(state.batch_size), 30, True, 0, False)
        _rows_equal_the_numpy_rows(monkeypatch, args)

    n_reordered = 0
    for state in _states(CFG, 40):
        n_walks = len(walks)
        same_as_numpy(state, levels, LEVELS)
        same_as_numpy(state, point, None)
        assert len(walks) == n_walks + 1  # one walk for both forecasters
        waiting = state.n_arrived - state.next_job
        slot = np.where((waiting > 1) & ~state.is_done, 1, 0)
        if slot.any():  # the second waiting job to the head, in place: the memo's batch, reordered
            moved = promote_queued_job(state, slot, True)
            same_as_numpy(moved, point, None)
            assert len(walks) == n_walks + 2
            n_reordered += 1
    assert n_reordered > 10


@pytest.mark.parametrize("capacity", [(8, 8), (6, 8)])
def test_an_advisors_bounds_from_the_placers_pass_equal_the_general_paths(capacity, monkeypatch) -> None:
    """`recall_columns(advisor=rule)` computes a point rule's bounds in the placer's pass (the linear columns:
    power-of-two capacities) and leaves them for the rule's `recall_head_share` on the same state, whose own
    kernel then does not run; they equal the general path's at every decision, finished envs included. With other
    capacities, another horizon or a subset of envs, the rule computes its own."""
    from sim import compiled_planes
    from sim.risk import RiskAwarePacking

    cfg = replace(CFG, capacity_units=capacity)
    table = _table(cfg)
    placer = RecallOverlay(RemainingPeakQuantiles(table, horizon=30))
    point = RecallOverlay(PeakQuantileForecaster(_table(replace(cfg, max_steps=399)), 0.9, 30, LEVELS))
    rule = RiskAwarePacking(point, make_policy("deeprm_sjf"), RiskConfig(level=0.9, mode="pack"))
    own = []
    real = compiled_planes._recall_share_kernel
    monkeypatch.setattr(compiled_planes, "_recall_share_kernel", lambda *a: own.append(1) or real(*a))
    n_decisions = n_done = 0
    for k, state in enumerate(_states(cfg, 80)):
        horizon = 30 if k % 5 else 20  # every fifth decision: not the rule's horizon
        skip = state.is_done.copy()
        recall_sums.recall_columns(cfg, state, placer, LEVELS, 1.0, horizon, True, skip, advisor=rule)
        n_own = len(own)
        rows = None if k % 3 else np.flatnonzero(~state.is_done)
        fused = recall_sums.recall_head_share(cfg, state, point, rule.risk, rows)
        general = safe_and_tightness(head_bounds(cfg, state, point, rule.risk, rows), cfg)
        assert _same_bits(fused[0], general[0]) and _same_bits(fused[1], general[1])
        from_pass = capacity == (8, 8) and horizon == 30 and rows is None
        assert len(own) == n_own + (0 if from_pass else 1)
        n_decisions += int(from_pass)
        n_done += int(from_pass and skip.any())
    assert (n_decisions > 30 and n_done > 0) if capacity == (8, 8) else n_decisions == 0


@pytest.mark.parametrize("advisor_table", ["agreeing", "other"])
def test_an_advisor_on_an_agreeing_table_reads_the_placers_look_ups(advisor_table, monkeypatch) -> None:
    """Where the advisor's point forecaster is a table that agrees with the placer's at the advisor's level (the same
    keys and values: `forecast_peak`'s table and the placer's, fitted on the same cases), the placer's pass takes
    the advisor's values from its own rows (one table look-up per decision); a table that does not agree is looked
    up on its own (two). Either way the advisor's bounds equal the general path's."""
    from sim import compiled_decision
    from sim.risk import RiskAwarePacking

    table = _table(CFG)
    other = (
        _table(replace(CFG, max_steps=399))  # fitted again: another object, the same values
        if advisor_table == "agreeing"
        else fit_peak_quantiles(_recurring_jobs(6, 40, seed=21), CFG, levels=LEVELS, min_count=5)
    )
    assert other is not table
    placer = RecallOverlay(RemainingPeakQuantiles(table, horizon=30))
    point = RecallOverlay(PeakQuantileForecaster(other, 0.75, 30, LEVELS))
    agree = recall_sums._shared_level(placer, LEVELS, point)
    assert agree == (1 if advisor_table == "agreeing" else None)
    rule = RiskAwarePacking(point, make_policy("deeprm_sjf"), RiskConfig(level=0.75, mode="pack"))
    look_ups = []
    real = compiled_decision.recall_table_rows
    monkeypatch.setattr(compiled_decision, "recall_table_rows", lambda *a: look_ups.append(a[1]) or real(*a))
    n_decisions = 0
    for state in _states(CFG, 60):
        before = len(look_ups)
        recall_sums.recall_columns(
            CFG, state, placer, LEVELS, 1.0, 30, True, state.is_done.copy(), advisor=rule
        )
        tables = look_ups[before:]
        assert tables[0] is table and len(tables) == (1 if advisor_table == "agreeing" else 2)
        fused = recall_sums.recall_head_share(CFG, state, point, rule.risk)
        general = safe_and_tightness(head_bounds(CFG, state, point, rule.risk), CFG)
        assert _same_bits(fused[0], general[0]) and _same_bits(fused[1], general[1])
        n_decisions += 1
    assert n_decisions > 30


def test_tables_agree_only_with_the_same_keys_and_values_at_the_level() -> None:
    table = _table(CFG)
    placer = RecallOverlay(RemainingPeakQuantiles(table, horizon=30))

    def point(t, level=0.9):
        return RecallOverlay(PeakQuantileForecaster(t, level, 30, LEVELS))

    assert recall_sums._shared_level(placer, LEVELS, point(table)) == 2
    assert recall_sums._shared_level(placer, (0.5, 0.9), point(table)) == 1  # its position among the placer's
    assert (
        recall_sums._shared_level(placer, (0.5, 0.75), point(table)) is None
    )  # the placer did not look it up
    no_labels = fit_peak_quantiles(
        _recurring_jobs(6, 40, seed=20), CFG, levels=LEVELS, min_count=5, use_labels=False
    )
    assert recall_sums._shared_level(placer, LEVELS, point(no_labels)) is None
    changed = replace(table, values=table.values.copy())
    changed.values[2, 0, 1, 1, 0, 0, 0] += 1.0  # one cell at the 0.9 level
    assert recall_sums._shared_level(placer, LEVELS, point(changed)) is None
    assert (
        recall_sums._shared_level(placer, LEVELS, point(changed, 0.75)) == 1
    )  # the other levels still agree
    assert recall_sums._shared_level(None, LEVELS, point(table)) is None
