"""The periodic overlay: a job that repeated an exact cycle is forecast to repeat it; nothing else changes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from models.periodic_forecast import PeriodicOverlay
from sim import core
from sim.config import SimConfig
from sim.forecast import ExactForecaster
from sim.jobs import JobBatch
from sim.risk import RequestForecaster

CFG = SimConfig(n_machines=2, max_steps=300)


def _state(usages: list[list[list[int]]], steps: int):
    """Every job of `usages` placed on machine 0 at t = 0; then one empty filler job arrives per step and goes to
    machine 1 (an empty queue would let time jump ahead), until t = steps."""
    jobs = [{"arrival_step": 0, "usage": u, "ec_label": 0} for u in usages]
    jobs += [{"arrival_step": t, "usage": [[0, 0]], "ec_label": 0} for t in range(1, steps + 2)]
    batch = JobBatch.from_jobs([jobs])
    state = core.reset(CFG, batch)
    for _ in usages:
        state, *_ = core.step(CFG, state, np.array([0]))
    while int(state.t[0]) < steps:
        state, *_ = core.step(CFG, state, np.array([1]))
    assert int(state.t[0]) == steps
    return state


def test_a_repeating_job_is_forecast_exactly_and_a_flat_one_is_left_to_the_base() -> None:
    wave = [[4 if a % 6 < 2 else 1, 2 if a % 6 < 2 else 1] for a in range(80)]
    flat = [[2, 2]] * 80
    state = _state([wave, flat], steps=20)
    env, job = np.array([0, 0]), np.array([0, 1])
    overlay = PeriodicOverlay(RequestForecaster(horizon=15), max_period=8)
    got = overlay.forecast(CFG, state, env, job)
    truth = ExactForecaster(horizon=15).forecast(CFG, state, env, job)
    assert np.array_equal(got[0], truth[0])  # every level: the cycle continued
    assert (got[1] == 2).all()  # the flat job keeps the base forecaster's (its request)
    assert overlay.periods(np.array([[[1.0, 1.0], [4.0, 2.0]] * 10])).tolist() == [2]


def test_too_short_a_history_or_a_broken_cycle_falls_back() -> None:
    wave = [[4 if a % 6 < 2 else 1, 1] for a in range(80)]
    broken = [[4 if (a % 6 < 2 or a == 17) else 1, 1] for a in range(80)]
    state = _state([wave, broken], steps=8)  # 9 steps observed < 2 cycles of 6
    env, job = np.array([0, 0]), np.array([0, 1])
    overlay = PeriodicOverlay(RequestForecaster(horizon=6), max_period=8)
    assert (overlay.forecast(CFG, state, env, job)[:, :, :, 0] == 4).all()
    later = _state(
        [wave, broken], steps=19
    )  # 20 steps observed; the broken job's step 17 spoils its last cycles
    got = overlay.forecast(CFG, later, env, job)
    assert got[0, 0, :, 0].min() == 1 and (got[1, :, :, 0] == 4).all()


def test_the_overlay_never_reads_the_future() -> None:
    wave = [[4 if a % 5 < 2 else 1, 1] for a in range(60)]
    state = _state([wave], steps=15)
    rng = np.random.default_rng(0)
    usage = state.jobs.usage.copy()
    usage[0, 0, 16:] = rng.integers(0, 9, size=usage[0, 0, 16:].shape)
    other = replace(state, jobs=replace(state.jobs, usage=usage))
    overlay = PeriodicOverlay(RequestForecaster(horizon=10), max_period=8)
    assert np.array_equal(
        overlay.forecast(CFG, state, np.array([0]), np.array([0])),
        overlay.forecast(CFG, other, np.array([0]), np.array([0])),
    )


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="max_period"):
        PeriodicOverlay(RequestForecaster(), max_period=1)


def _reference_periods(overlay, recent):
    """The definition, step by step: the smallest p whose last min_periods x p observed steps repeat exactly
    and move (not flat), 0 where none."""
    out = []
    n, r, _ = recent.shape
    for i in range(n):
        found = 0
        for p in range(2, overlay.max_period + 1):
            span = p * overlay.min_periods
            if span > r:
                break
            tail = recent[i, r - span :]
            if np.isnan(tail).any() or not (tail.max(axis=0) > tail.min(axis=0)).any():
                continue
            if (tail[p:] == tail[:-p]).all():
                found = p
                break
        out.append(found)
    return np.array(out)


def test_periods_equal_their_definition_on_random_windows():
    class Base:
        horizon, levels = 24, (0.5, 0.95)

    overlay = PeriodicOverlay(Base())
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 20))
        r = overlay.window if rng.random() < 0.7 else int(rng.integers(1, overlay.window + 1))
        x = rng.integers(0, 3, size=(n, r, 2)).astype(float)
        for i in range(n):
            if rng.random() < 0.5:
                p = int(rng.integers(2, 30))
                x[i] = np.tile(rng.integers(0, 4, size=(p, 2)), (r // p + 1, 1))[:r]
            if rng.random() < 0.2:
                x[i, : int(rng.integers(0, r + 1))] = np.nan
            if rng.random() < 0.1:
                x[i] = 1.0
        assert (overlay.periods(x) == _reference_periods(overlay, x)).all()
