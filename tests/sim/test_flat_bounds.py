"""The horizon-free shortcut for flat forecasters (`sim.risk.flat_head_share`, the placer's flat feature columns):
the same decisions and inputs as the full (N, H, D) bounds, on states a rollout visits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from models.forecast_placer import PlacerConfig, placement_features
from sim import core
from sim.config import SimConfig
from sim.forecast import is_flat_forecaster
from sim.jobs import JobBatch
from sim.peak_forecast import fit_peak_quantiles
from sim.policies import Tetris, action_mask
from sim.risk import (
    PersistenceForecaster,
    RequestForecaster,
    RiskConfig,
    flat_head_share,
    head_bounds,
    head_share,
    safe_and_tightness,
)

CFG = SimConfig(n_machines=4, max_steps=400, n_labels=4)


def _jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Jobs of 1-30 steps whose usage rises and falls (peaks at random ages), requests at or above their peak."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 2))
            dur = int(rng.integers(1, 30))
            usage = rng.integers(0, 6, size=(dur, 2)).tolist()
            request = (np.max(usage, axis=0) + rng.integers(0, 2, size=2)).tolist()
            seq.append(
                {"arrival_step": t, "usage": usage, "ec_label": int(rng.integers(0, 3)), "request": request}
            )
        rows.append(seq)
    return JobBatch.from_jobs(rows)


@dataclass(frozen=True)
class NotFlat:
    """The same forecaster without its `flat` and `flat_levels` methods (its `point` where it has one): the general
    (N, H, D) path runs."""

    inner: object

    @property
    def horizon(self) -> int:
        return self.inner.horizon

    @property
    def levels(self) -> tuple[float, ...]:
        return self.inner.levels

    def __getattr__(self, name: str):
        if name == "point":
            return self.inner.point  # AttributeError where the inner forecaster is not a point one
        raise AttributeError(name)

    def forecast(self, cfg, state, env, job):
        return self.inner.forecast(cfg, state, env, job)


def _states(jobs: JobBatch, n: int = 40):
    """States (after the job pick) along a Tetris rollout."""
    rng = np.random.default_rng(0)
    state = core.reset(CFG, jobs, 0)
    tetris = Tetris()
    out = []
    for _ in range(n):
        if state.is_done.all():
            break
        out.append(state)
        state, *_ = core.step(CFG, state, tetris.act(CFG, state, rng), mask=action_mask(CFG, state))
    return out


def _forecasters(train: JobBatch):
    horizon = int(train.max_duration)
    table = fit_peak_quantiles(train, CFG, levels=(0.5, 0.9, 0.95, 0.99), use_labels=True, min_count=5)
    return [
        table.forecaster(0.9, horizon),
        PersistenceForecaster(horizon=horizon),
        RequestForecaster(horizon=horizon),
    ]


@pytest.mark.parametrize(
    "rcfg",
    [
        RiskConfig(mode="pack"),
        RiskConfig(mode="pack", use_durations=False),
        RiskConfig(mode="guard", min_observed=3),
        RiskConfig(mode="deviate", horizon=5, extend_to=40),
    ],
)
def test_flat_head_share_equals_the_full_bounds(rcfg: RiskConfig) -> None:
    train, test = _jobs(6, 40, seed=1), _jobs(5, 40, seed=2)
    n_checked = 0
    for forecaster in _forecasters(train):
        assert is_flat_forecaster(forecaster) and not is_flat_forecaster(NotFlat(forecaster))
        for state in _states(test):
            fast = flat_head_share(CFG, state, forecaster, rcfg)
            full = safe_and_tightness(head_bounds(CFG, state, forecaster, rcfg), CFG)
            assert fast is not None
            np.testing.assert_array_equal(fast[0], full[0])
            np.testing.assert_array_equal(fast[1], full[1])
            rows = np.array([0, 3])
            part = head_share(CFG, state, forecaster, rcfg, rows)
            np.testing.assert_array_equal(part[1], full[1][rows])
            n_checked += 1
    assert n_checked >= 60
    # a non-flat forecaster takes the general path
    assert flat_head_share(CFG, state, NotFlat(forecaster), rcfg) is None


def _fast_features_equal_full(state, forecaster, pcfg: PlacerConfig, rng) -> np.ndarray:
    """The placer's inputs of `state` (Tetris's action as the base) from `forecaster` as it is and behind `NotFlat`
    (the general path): asserted equal; the former's per-machine inputs returned."""
    base = np.asarray(Tetris().act(CFG, state, rng), dtype=np.int64)
    mask = action_mask(CFG, state)
    x_fast, g_fast = placement_features(CFG, state, forecaster, pcfg, base, mask)
    x_full, g_full = placement_features(CFG, state, NotFlat(forecaster), pcfg, base, mask)
    np.testing.assert_allclose(x_fast, x_full, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(g_fast, g_full)
    return x_fast


@pytest.mark.parametrize("use_durations", [True, False])
def test_flat_placer_features_equal_the_full_ones(use_durations: bool) -> None:
    train, test = _jobs(6, 40, seed=3), _jobs(5, 40, seed=4)
    pcfg = PlacerConfig(levels=(0.5, 0.9, 0.99), use_durations=use_durations)
    forecaster = _forecasters(train)[0]
    rng = np.random.default_rng(0)
    moved = 0
    for state in _states(test):
        x_fast = _fast_features_equal_full(state, forecaster, pcfg, rng)
        moved += int((x_fast[..., 0] > 0).sum())
    assert moved > 0  # machines were loaded: the comparison saw non-zero bounds


@pytest.mark.parametrize("use_remaining", [False, True])
@pytest.mark.parametrize("use_durations", [True, False])
def test_per_level_flat_placer_features_equal_the_full_ones(use_durations: bool, use_remaining: bool) -> None:
    """The base rule's own remaining-peak quantiles (a value per level, `RemainingPeakQuantiles.flat_levels`) as the
    placer's inputs: the horizon-free columns equal the (N, L, H, D) ones at rho = 1, and differ between levels."""
    from sim.forecast import flat_level_forecast, with_cache
    from sim.peak_forecast import RemainingPeakQuantiles

    train, test = _jobs(6, 40, seed=5), _jobs(5, 40, seed=6)
    table = fit_peak_quantiles(
        train, CFG, levels=(0.5, 0.9, 0.99), use_labels=True, min_count=5, use_remaining=use_remaining
    )
    forecaster = RemainingPeakQuantiles(table, int(train.max_duration))
    assert with_cache(forecaster) is forecaster  # a table look-up: never behind a cache
    pcfg = PlacerConfig(levels=(0.5, 0.9, 0.99), use_durations=use_durations)
    rng = np.random.default_rng(0)
    differ = loaded = 0
    for state in _states(test):
        env, job = np.nonzero(core.jobs_running(state))
        if env.size:
            values = flat_level_forecast(forecaster, pcfg.levels, CFG, state, env, job)
            full = forecaster.forecast(CFG, state, env, job)
            np.testing.assert_array_equal(values, full[:, :, 0])  # held over the horizon
            differ += int((values[:, 2] != values[:, 0]).sum())
        x_fast = _fast_features_equal_full(state, forecaster, pcfg, rng)
        loaded += int((x_fast[..., 0] > 0).sum())
    assert differ > 0  # the 0.99 level's quantile is not the median's somewhere: the levels differ
    assert loaded > 0  # machines were loaded: the comparison saw non-zero bounds
    # at rho < 1 the mean of a per-level bound is not linear in the steps alive: the general path computes it
    rho = PlacerConfig(levels=(0.5, 0.9, 0.99), rho=0.5, use_durations=use_durations)
    _fast_features_equal_full(_states(test)[-1], forecaster, rho, rng)


@pytest.mark.parametrize(
    "rcfg",
    [
        RiskConfig(level=0.9, rho=1.0, mode="pack"),
        RiskConfig(level=0.9, rho=0.0, mode="pack", inflation=1.5),
        RiskConfig(level=0.99, rho=0.5, mode="guard", min_observed=3),
        RiskConfig(level=0.99, rho=0.0, mode="deviate", use_durations=False),
        RiskConfig(level=0.9, rho=0.3, mode="deviate", horizon=5, extend_to=40),
    ],
)
def test_per_level_flat_head_share_equals_the_full_bounds(rcfg: RiskConfig) -> None:
    """A forecaster with a value per level held over the horizon (`RemainingPeakQuantiles`): the risk rule's
    horizon-free bound (median sums plus the co-peaking deviation term) equals the (N, H, D) one at every rho."""
    from sim.peak_forecast import RemainingPeakQuantiles

    train, test = _jobs(6, 40, seed=7), _jobs(5, 40, seed=8)
    table = fit_peak_quantiles(train, CFG, levels=(0.5, 0.9, 0.99), use_labels=True, min_count=5)
    forecaster = RemainingPeakQuantiles(table, int(train.max_duration))
    n_checked = n_loaded = 0
    for state in _states(test):
        fast = flat_head_share(CFG, state, forecaster, rcfg)
        full = safe_and_tightness(head_bounds(CFG, state, NotFlat(forecaster), rcfg), CFG)
        assert fast is not None
        np.testing.assert_allclose(fast[1], full[1], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(fast[0], full[0])
        assert flat_head_share(CFG, state, NotFlat(forecaster), rcfg) is None
        n_checked += 1
        n_loaded += int((fast[1] > 0).sum())
    assert n_checked >= 30 and n_loaded > 0


def test_per_level_flat_sums_carried_between_decisions_equal_a_full_recount() -> None:
    """The placer's per-level flat columns with `RunningSums` (only the jobs placed since and the heads looked up)
    equal a full recount at every decision of an episode whose waiting jobs a job picker reorders in place."""
    from sim.peak_forecast import RemainingPeakQuantiles
    from sim.policies import make_policy, own_jobs, promote_queued_job
    from sim.running_sums import RunningSums

    train, test = _jobs(6, 40, seed=9), _jobs(4, 40, seed=10)
    table = fit_peak_quantiles(train, CFG, levels=(0.5, 0.9, 0.99), use_labels=True, min_count=5)
    forecaster = RemainingPeakQuantiles(table, int(train.max_duration))
    pcfg, memo, rng = PlacerConfig(levels=(0.5, 0.9, 0.99)), RunningSums(), np.random.default_rng(0)
    picker = make_policy("deeprm_sjf")
    state = own_jobs(core.reset(CFG, test, 0))
    n_decisions = 0
    while not state.is_done.all() and n_decisions < 400:
        state = promote_queued_job(state, np.where(state.is_done, 0, picker.pick_job(CFG, state, rng)), True)
        base = picker.act(CFG, state, rng)
        mask = action_mask(CFG, state)
        # the numpy path (the compiled one, models.placer_kernel, recounts every decision)
        x1, g1 = placement_features(CFG, state, forecaster, pcfg, base, mask, memo, compiled=False)
        x2, g2 = placement_features(CFG, state, forecaster, pcfg, base, mask, compiled=False)
        np.testing.assert_allclose(x1, x2, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(g1, g2)
        state, *_ = core.step(CFG, state, base, mask=mask)
        n_decisions += 1
    assert memo.n_carried > 100  # most decisions reused the earlier sums
