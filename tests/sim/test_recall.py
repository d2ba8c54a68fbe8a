"""Recall of recurring workloads (`sim.forecast.recall_view`, `RecallOverlay`, `fit_recall`): earlier runs of the
same workload in a sequence, observed steps only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.forecast import (
    ExactForecaster,
    RecallMemo,
    RecallOverlay,
    fit_recall,
    is_point_forecaster,
    point_forecast,
    recall_reliability,
    recall_view,
)
from sim.jobs import JobBatch
from sim.policies import decide, make_policy, policy_kind
from sim.risk import PersistenceForecaster, RequestForecaster, RiskAwarePacking, RiskConfig, head_bounds
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400)


def _templates(n: int, rng: np.random.Generator) -> list[list[list[int]]]:
    out = []
    for _ in range(n):
        dur, period, phase, hi = (int(rng.integers(a, b)) for a, b in ((8, 25), (4, 9), (0, 8), (3, 5)))
        out.append([[hi if (a + phase) % period < max(period // 4, 1) else 1] * 2 for a in range(dur)])
    return out


def _recurring_jobs(n_rows: int, n_jobs: int, seed: int, exact: bool = True) -> JobBatch:
    """Jobs drawn with replacement from 4 square-wave templates; `exact=False` gives each run its own phase (a
    window of a real VM at another offset)."""
    rng = np.random.default_rng(seed)
    templates = _templates(4, rng)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 3))
            k = int(rng.integers(0, 4))
            usage = templates[k]
            if not exact:
                usage = np.roll(usage, int(rng.integers(1, len(usage))), axis=0).tolist()
            seq.append({"arrival_step": t, "usage": usage, "ec_label": k, "workload_id": f"template-{k}"})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def _advance(jobs: JobBatch, n_steps: int):
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    tetris = make_policy("tetris")
    for _ in range(n_steps):
        state, act = decide(tetris, CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    return state


def _all_jobs(jobs: JobBatch) -> tuple[np.ndarray, np.ndarray]:
    return np.nonzero(jobs.is_real)


def test_workload_code_is_equal_exactly_where_ids_are() -> None:
    jobs = _recurring_jobs(2, 12, seed=0)
    codes = jobs.workload_code
    for b in range(jobs.batch_size):
        ids = jobs.workload_ids[b]
        for i in range(len(ids)):
            for j in range(len(ids)):
                assert (codes[b, i] == codes[b, j]) == (ids[i] == ids[j])
    padded = JobBatch.from_jobs([[{"arrival_step": 0, "usage": [[1, 1]], "ec_label": 0}], []])
    assert padded.workload_code[1].tolist() == [-1]


def test_recall_never_reads_the_future() -> None:
    jobs = _recurring_jobs(2, 30, seed=1)
    state = _advance(jobs, 30)
    jobs = state.jobs
    usage = jobs.usage
    is_placed = state.job_machine >= 0
    n_obs = np.where(is_placed, np.clip(state.t[:, None] - state.job_start + 1, 0, None), 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    noise = np.random.default_rng(2).integers(0, 9, size=usage.shape).astype(np.int16)
    other = replace(state, jobs=replace(jobs, usage=np.where(future[..., None], noise, usage)))
    env, job = _all_jobs(jobs)
    a, b = recall_view(CFG, state, env, job), recall_view(CFG, other, env, job)
    assert a.n_runs.sum() > 0  # something is recalled, so the comparison means something
    assert np.array_equal(a.n_runs, b.n_runs)
    assert np.array_equal(a.usage, b.usage, equal_nan=True)


def test_recall_of_an_exact_repeat_is_the_true_future() -> None:
    """Once an earlier run has finished, every quantile of a repeat equals the repeat's true usage."""
    jobs = _recurring_jobs(1, 40, seed=3)
    state = _advance(jobs, 60)
    env, job = _all_jobs(jobs)
    view = recall_view(CFG, state, env, job)
    overlay = RecallOverlay(PersistenceForecaster(horizon=jobs.max_duration))
    got = overlay.forecast(CFG, state, env, job)
    truth = ExactForecaster(horizon=jobs.max_duration).forecast(CFG, state, env, job)
    # a repeat of a workload with an earlier run that has finished: its whole future is recalled
    finished = (state.job_machine[0] >= 0) & (state.job_start[0] + jobs.duration[0] <= state.t[0])
    codes = jobs.workload_code[0]
    full = np.array([(finished & (codes == codes[j]) & (np.arange(codes.size) != j)).any() for j in job])
    full &= view.n_runs > 0
    assert full.sum() >= 5
    assert np.array_equal(got[full], truth[full])


def test_a_run_that_disagrees_with_what_is_observed_is_not_recalled() -> None:
    """Runs of one workload at different phases: the earlier run contradicts the observed prefix, nothing is
    recalled once the job has shown a step that differs."""
    jobs = _recurring_jobs(1, 40, seed=4, exact=False)
    state = _advance(jobs, 60)
    env, job = _all_jobs(jobs)
    view = recall_view(CFG, state, env, job)
    running = (state.job_machine[env, job] >= 0) & (view.n_runs > 0)
    for i in np.flatnonzero(running):
        n_obs = min(int(state.t[0] - state.job_start[0, job[i]] + 1), int(jobs.duration[0, job[i]]))
        seen = view.usage[i, :n_obs]
        known = np.isfinite(seen).all(axis=1)
        assert np.array_equal(seen[known], jobs.usage[0, job[i], :n_obs][known].astype(float))


def test_recall_is_used_only_where_training_runs_repeat() -> None:
    exact, shifted = _recurring_jobs(3, 30, seed=5), _recurring_jobs(3, 30, seed=5, exact=False)
    assert recall_reliability(exact)["share_equal"] == 1.0
    assert recall_reliability(shifted)["share_equal"] < 0.5
    inner = PersistenceForecaster(horizon=10)
    assert isinstance(fit_recall(inner, exact)[0], RecallOverlay)
    used, info = fit_recall(inner, shifted)
    assert used is inner and info["recall_used"] is False


def test_recall_rules_are_forecast_rules_that_pack_recurring_jobs_without_overshoot() -> None:
    """On exact repeats the recall hybrid packs beyond requests (it knows each repeat's future) and never
    overshoots where every run but the first of each workload is recalled."""
    assert (
        policy_kind("forecast_recall_hybrid") == "forecast"
        and policy_kind("forecast_risk_recall") == "forecast"
    )
    jobs = _recurring_jobs(2, 60, seed=6)
    rule = RiskAwarePacking(
        RecallOverlay(PersistenceForecaster(horizon=jobs.max_duration)),
        risk=RiskConfig(mode="pack", min_observed=10_000),
        name="r",
    )
    tetris = make_policy("tetris")
    out = {}
    for name, policy in (("rule", rule), ("tetris", tetris)):
        state, rng = core.reset(CFG, jobs, 0), np.random.default_rng(0)
        while not state.is_done.all():
            state, act = decide(policy, CFG, state, rng)
            state, *_ = core.step(CFG, state, act)
        out[name] = state
    assert (out["rule"].penalty_totals[:, 2] == 0).all()  # overshoot: recalled futures are exact
    assert out["rule"].penalty_totals[:, 1].sum() > out["tetris"].penalty_totals[:, 1].sum()  # less idle


def test_fitted_recall_rule_records_what_recall_measured() -> None:
    jobs = _recurring_jobs(4, 30, seed=7)
    ctx = FitContext(CFG, jobs, TuningConfig(min_observed=(0,), modes=("deviate",), validation_share=0.5))
    policy = make_policy("forecast_recall_hybrid").__class__  # the registry entry builds a RiskAwarePacking
    from sim.policies import POLICIES

    fitted = POLICIES["forecast_recall_hybrid"].fit(ctx)
    assert isinstance(fitted, policy)
    choice = ctx.choices["forecast_recall_hybrid"]
    assert choice["recall_used"] is True and choice["share_equal"] == 1.0
    assert {t["min_observed"] for t in choice["tried"]} == {0, jobs.max_duration + 1}


def test_shared_recall_views_equal_fresh_ones_whatever_is_asked_first() -> None:
    jobs = _recurring_jobs(3, 30, seed=4)
    state = _advance(jobs, 25)
    env, job = _all_jobs(jobs)
    fresh = recall_view(CFG, state, env, job)
    memo = RecallMemo()
    order = np.random.default_rng(0).permutation(env.size)
    for part in (
        order[: env.size // 3],
        order[env.size // 3 :],
        order,
    ):  # a subset first, then the rest, then all
        view, rows = memo.rows(CFG, state, env[part], job[part])
        np.testing.assert_array_equal(view.usage[rows], fresh.usage[part])
        np.testing.assert_array_equal(view.n_runs[rows], fresh.n_runs[part])
        np.testing.assert_array_equal(view.complete[rows], fresh.complete[part])
    later = _advance(jobs, 26)  # another state: nothing of the first is reused
    view, rows = memo.rows(CFG, later, env, job)
    np.testing.assert_array_equal(view.n_runs[rows], recall_view(CFG, later, env, job).n_runs)


class _Levels:
    """A forecaster hiding its inner point forecaster's `point` (the general path of the risk bounds)."""

    def __init__(self, inner) -> None:
        self.inner, self.horizon, self.levels = inner, inner.horizon, inner.levels

    def forecast(self, cfg, state, env, job):
        return self.inner.forecast(cfg, state, env, job)

    def __getattr__(self, name):  # known_rows and the rest, not `point`
        if name == "point":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_point_forecasts_are_every_level_and_give_the_general_bounds() -> None:
    jobs = _recurring_jobs(3, 30, seed=5)
    state = _advance(jobs, 20)
    env, job = _all_jobs(jobs)
    risk = RiskConfig(level=0.95, min_observed=3)
    for fc in (
        PersistenceForecaster(horizon=12),
        RequestForecaster(horizon=12),
        ExactForecaster(horizon=12),
        RecallOverlay(PersistenceForecaster(horizon=12)),
    ):
        assert is_point_forecaster(fc)
        point = point_forecast(fc, CFG, state, env, job)
        levels = fc.forecast(CFG, state, env, job)
        assert point.shape == (env.size, 12, 2)
        for li in range(len(fc.levels)):
            np.testing.assert_array_equal(levels[:, li], point)
        fast = head_bounds(CFG, state, fc, risk)
        general = head_bounds(CFG, state, _Levels(fc), risk)
        np.testing.assert_array_equal(fast, general)
    assert not is_point_forecaster(_Levels(PersistenceForecaster()))
    assert not is_point_forecaster(RecallOverlay(_Levels(PersistenceForecaster())))
    with pytest.raises(TypeError, match="_Levels is not a point forecaster"):
        RecallOverlay(_Levels(PersistenceForecaster(horizon=12))).point(CFG, state, env, job)


@pytest.mark.parametrize("level_axis", [True, False])
def test_the_compiled_overlay_copies_what_the_numpy_overlay_copies(level_axis) -> None:
    """`RecallOverlay._overlay` writes the recalled usage with one kernel where `out` is contiguous float64; a
    strided `out` takes the numpy path: both give the same array, NaNs (steps not recalled) included."""
    jobs = _recurring_jobs(3, 40, seed=5)
    state = _advance(jobs, 45)
    env, job = _all_jobs(jobs)
    horizon = 12
    overlay = RecallOverlay(PersistenceForecaster(horizon=horizon))
    rng = np.random.default_rng(6)
    shape = (env.size, 3, horizon, 2) if level_axis else (env.size, horizon, 2)
    base = rng.random(shape)
    compiled = base.copy()
    strided = np.repeat(base, 2, axis=-1)[..., ::2]  # the same values, not contiguous
    assert not strided.flags.c_contiguous
    overlay._overlay(CFG, state, env, job, compiled, level_axis)
    overlay._overlay(CFG, state, env, job, strided, level_axis)
    assert not np.array_equal(compiled, base)  # something was recalled
    assert np.array_equal(compiled, strided, equal_nan=True)


@pytest.mark.parametrize(
    "rcfg", [RiskConfig(level=0.9), RiskConfig(level=0.75, use_durations=True, min_observed=3, extend_to=40)]
)
def test_the_rules_moments_from_one_kernel_equal_the_numpy_moments(rcfg, monkeypatch) -> None:
    """`job_moments` for a forecaster with a value per level under recall takes `sim.forecast.flat_planes`; it
    gives the numpy path's medians and deviations to the bit (young jobs, known ends and an extended tail too)."""
    from sim import risk
    from sim.peak_forecast import RemainingPeakQuantiles, fit_peak_quantiles

    jobs = _recurring_jobs(3, 40, seed=9)
    state = _advance(jobs, 45)
    table = fit_peak_quantiles(_recurring_jobs(4, 30, seed=10), CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    forecaster = RecallOverlay(RemainingPeakQuantiles(table, horizon=30), 1.0)
    env, job = _all_jobs(jobs)
    assert forecaster.recalled(CFG, state, env, job).dest.size > 10
    fast = risk.job_moments(CFG, state, forecaster, env, job, rcfg)
    monkeypatch.setattr(risk, "flat_planes", lambda *args: None)
    slow = risk.job_moments(CFG, state, forecaster, env, job, rcfg)
    for a, b in zip(fast, slow, strict=True):
        assert a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("exact", [True, False])
def test_compiled_recall_views_equal_the_numpy_views(exact) -> None:
    """`recall_view` finishes integer usage with one kernel (`sim.compiled_batch.recall_runs`); float usage (the
    same values) takes the numpy path: the views, run counts and completeness agree, whether runs repeat exactly
    (recalled) or disagree (refused)."""
    jobs = _recurring_jobs(3, 40, seed=11, exact=exact)
    state = _advance(jobs, 50)
    env, job = _all_jobs(jobs)
    as_float = replace(state, jobs=replace(state.jobs, usage=state.jobs.usage.astype(np.float64)))
    fast, slow = recall_view(CFG, state, env, job), recall_view(CFG, as_float, env, job)
    assert (fast.n_runs > 0).sum() > (10 if exact else -1)
    assert np.array_equal(fast.usage, slow.usage, equal_nan=True)
    assert np.array_equal(fast.n_runs, slow.n_runs) and np.array_equal(fast.complete, slow.complete)


@pytest.mark.parametrize("n_steps", [0, 20, 60, 150])
def test_the_compiled_best_runs_equal_the_sorted_ones(n_steps) -> None:
    """`sim.forecast._best_runs`: one pass over the jobs (`sim.compiled_batch.best_runs`) gives the two longest-
    observed started runs per (env, workload) (ties: the earlier job) and the started counts the sort gives, at
    every stage of the episodes (none started, some running, some finished), for some of the envs or all."""
    from sim.forecast import _best_runs

    state = _advance(_recurring_jobs(4, 40, seed=12), n_steps)
    for rows in (np.arange(4), np.array([2, 0])):
        fast, slow = _best_runs(state, rows), _best_runs(state, rows, compiled=False)
        for a, b in zip(fast, slow, strict=True):
            assert np.array_equal(a, b)
    if n_steps >= 20:
        assert (fast[1] >= 0).any()  # a second run to fall back on somewhere


def test_a_flat_forecasters_recalled_point_forecast_is_its_spread_values_overlaid() -> None:
    """`RecallOverlay.point` over a flat forecaster comes from one kernel: the inner forecast spread over the
    horizon with the recalled usage written over it, as the numpy overlay of the spread values gives."""
    from sim.forecast import spread_flat

    jobs = _recurring_jobs(3, 40, seed=12)
    state = _advance(jobs, 45)
    env, job = _all_jobs(jobs)
    for inner in (PersistenceForecaster(horizon=15), RequestForecaster(horizon=15)):
        overlay = RecallOverlay(inner)
        spread = spread_flat(inner.flat(CFG, state, env, job), 15)
        want = overlay._overlay(
            CFG, state, env, job, np.repeat(spread, 2, axis=-1)[..., ::2], False
        )  # numpy path
        got = overlay.point(CFG, state, env, job)
        assert overlay.recalled(CFG, state, env, job).dest.size > 10
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
