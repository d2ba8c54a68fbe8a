"""`forecast_peak` at a level set by the jobs an overshoot would charge (`sim.charge_level`)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.charge_level import ChargeAwarePeakPacking, admission_counts, fit_peak_charge, level_rows
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import POLICIES, FirstFit, play
from sim.risk import RiskAwarePacking, RiskConfig
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400, n_labels=4)
LEVELS = np.array([0.5, 0.75, 0.9, 0.95, 0.99])


def _jobs(n_rows: int, n_jobs: int, seed: int, p_rise: float = 0.3) -> JobBatch:
    """Jobs arriving 0-2 steps apart, requesting 5 of 8 units and using 1-2, a share `p_rise` rising to 4."""
    rng = np.random.default_rng(seed)
    rows = []
    for row in np.cumsum(rng.integers(0, 3, size=(n_rows, n_jobs)), axis=1):
        jobs = []
        for t in row:
            dur, rises, low = int(rng.integers(6, 30)), rng.random() < p_rise, int(rng.integers(1, 3))
            usage = [[4 if rises and a >= 3 else low, low] for a in range(dur)]
            jobs.append({"arrival_step": int(t), "usage": usage, "ec_label": 0, "request": [5, 5]})
        rows.append(jobs)
    return JobBatch.from_jobs(rows)


def test_the_level_keeps_jobs_charged_times_exceedance_at_the_validated_one() -> None:
    # q = 0.9 validated at 2 jobs per admission: n (1 - level) <= 2 x 0.1, rounded up to the grid
    n = np.array([1, 2, 4, 10, 100])
    assert LEVELS[level_rows(LEVELS, 0.9, 2.0, n, raise_only=False)].tolist() == [0.9, 0.9, 0.95, 0.99, 0.99]
    n = np.array([1, 3, 4])  # targets 0.7, 0.9, 0.925: a sparse machine may pack more boldly than q
    assert LEVELS[level_rows(LEVELS, 0.9, 3.0, n, raise_only=False)].tolist() == [0.75, 0.9, 0.95]
    assert LEVELS[level_rows(LEVELS, 0.75, 4.0, np.array([1, 2]), raise_only=False)].tolist() == [0.5, 0.5]
    assert LEVELS[level_rows(LEVELS, 0.75, 4.0, np.array([1, 2]), raise_only=True)].tolist() == [0.75, 0.75]
    assert level_rows(LEVELS, 0.9, 2.0, np.array([[0, 1], [2, 8]]), False).shape == (2, 2)  # any shape


def test_admission_counts_count_the_jobs_on_the_machine_when_each_job_started() -> None:
    # one machine of 8: a (3 units, steps 0-9), b (3, from step 1), c (3, from step 12: a and b have ended)
    cfg = SimConfig(n_machines=1, capacity_units=(8, 8), max_steps=100)
    jobs = JobBatch.from_jobs(
        [
            [
                {"arrival_step": 0, "usage": [[3, 1]] * 10, "ec_label": 0, "request": [3, 1]},
                {"arrival_step": 1, "usage": [[3, 1]] * 10, "ec_label": 0, "request": [3, 1]},
                {"arrival_step": 12, "usage": [[3, 1]] * 5, "ec_label": 0, "request": [3, 1]},
            ]
        ]
    )
    state = play(FirstFit(), cfg, jobs, 0)
    assert state.job_start[0, :3].tolist() == [0, 1, 12]
    assert admission_counts(state).tolist() == [1, 2, 1]


def test_one_level_is_the_rule_itself_and_a_crowded_machine_packs_more_cautiously() -> None:
    train = _jobs(24, 40, seed=7, p_rise=0.4)
    tuning = TuningConfig(peak_levels=(0.5, 0.9), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    fitted = fit_peak_charge(ctx, "forecast_peak_charge")
    choice = ctx.choices["forecast_peak_charge"]
    if not choice.get("charge_aware"):
        pytest.skip(f"validation kept {choice.get('forecaster')}: no level to set")
    assert isinstance(fitted, ChargeAwarePeakPacking) and choice["charge_n_ref"] >= 1.0
    assert fitted.levels[0] == 0.5 and list(fitted.levels) == sorted(fitted.levels)
    assert fitted.level in fitted.levels and fitted.fallback is not None or fitted.mode == "pack"
    test = _jobs(3, 40, seed=8, p_rise=0.3)
    k = fitted.levels.index(fitted.level)
    alone = ChargeAwarePeakPacking(
        (fitted.rules[k],), (fitted.level,), fitted.level, 1.0, fallback=fitted.fallback, mode=fitted.mode
    )
    a, b = play(alone, CFG, test, 0), play(fitted.rules[k], CFG, test, 0)
    assert np.array_equal(a.job_machine, b.job_machine) and np.array_equal(a.job_start, b.job_start)
    state = play(FirstFit(), CFG, test, 0, max_decisions=30)
    index = fitted.level_index(state, np.arange(state.batch_size))
    from sim.risk import jobs_per_machine

    n = jobs_per_machine(state)
    more = n[:, :, None] > n[:, None, :]  # a machine holding more jobs never gets a lower level
    assert not (more & (index[:, :, None] < index[:, None, :])).any()
    rolled = play(fitted, CFG, test, 0)
    assert rolled.is_done.all() and (rolled.job_machine[test.is_real] >= 0).all()


def test_bad_construction_is_a_clear_error_and_the_registry_names_a_forecast_rule() -> None:
    rule = RiskAwarePacking(risk=RiskConfig(level=0.9))
    with pytest.raises(ValueError, match="2 rules for 1 levels"):
        ChargeAwarePeakPacking((rule, rule), (0.9,))
    with pytest.raises(ValueError, match="levels must ascend"):
        ChargeAwarePeakPacking((rule, rule), (0.9, 0.5))
    with pytest.raises(ValueError, match="n_ref must be > 0"):
        ChargeAwarePeakPacking((rule,), (0.9,), n_ref=0.0)
    from sim.policies import policy_kind

    assert policy_kind("forecast_peak_charge") == "forecast" and "forecast_peak_charge_guard" in POLICIES
