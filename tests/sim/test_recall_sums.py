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


@pytest.mark.parametrize(("use_durations", "min_observed"), [(True, 0), (False, 3)])
def test_the_compiled_rows_equal_the_numpy_rows(use_durations, min_observed, monkeypatch) -> None:
    """`sim.compiled_decision.recall_table_rows` (a table forecaster's rows and look-ups in one kernel) gives the
    numpy path's row arrays at every decision, for every env and for a subset."""
    from sim import compiled_decision

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
            fast = recall_sums.recall_rows(*args)
            monkeypatch.setattr(compiled_decision, "ENABLED", False)
            slow = recall_sums.recall_rows(*args)
            monkeypatch.setattr(compiled_decision, "ENABLED", True)
            assert np.array_equal(fast[0], slow[0])
            for a, b in zip(fast[1][:12], slow[1][:12], strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b)
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
