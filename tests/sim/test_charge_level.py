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
    # two jobs placed on the machine in the same step: each counts the other (what a later overshoot charges)
    same_step = JobBatch.from_jobs(
        [
            [
                {"arrival_step": 0, "usage": [[3, 1]] * 10, "ec_label": 0, "request": [3, 1]},
                {"arrival_step": 0, "usage": [[3, 1]] * 10, "ec_label": 0, "request": [3, 1]},
            ]
        ]
    )
    state = play(FirstFit(), cfg, same_step, 0)
    assert state.job_start[0, :2].tolist() == [0, 0] and admission_counts(state).tolist() == [2, 2]


@pytest.mark.parametrize("mode", ["pack", "deviate"])
def test_at_one_level_it_decides_as_forecast_peak_itself(mode: str) -> None:
    """Built with forecast_peak's own level alone (its table refitted on the finer grid), the rule places every
    job where the fitted forecast_peak does; fitted in full, it finishes every episode and records its n_ref."""
    train = _jobs(24, 40, seed=7, p_rise=0.4)
    tuning = TuningConfig(peak_levels=(0.5, 0.9), peak_modes=(mode,), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    fitted = fit_peak_charge(ctx, "forecast_peak_charge_guard", raise_only=True)
    choice = ctx.choices["forecast_peak_charge_guard"]
    if not choice.get("charge_aware"):
        pytest.skip(f"validation kept {choice.get('forecaster')}: no level to set")
    assert isinstance(fitted, ChargeAwarePeakPacking) and fitted.mode == mode and fitted.raise_only
    assert choice["charge_n_ref"] >= 1.0 and fitted.n_ref == choice["charge_n_ref"]
    assert fitted.levels[0] == 0.5 and list(fitted.levels) == sorted(fitted.levels)
    peak = POLICIES["forecast_peak"].fit(ctx)
    test = _jobs(3, 40, seed=8, p_rise=0.3)
    k = fitted.levels.index(fitted.level)
    alone = ChargeAwarePeakPacking(
        (fitted.rules[k],), (fitted.level,), fitted.level, 1.0, fallback=fitted.fallback, mode=fitted.mode
    )
    a, b = play(alone, CFG, test, 0), play(peak, CFG, test, 0)
    assert np.array_equal(a.job_machine, b.job_machine) and np.array_equal(a.job_start, b.job_start)
    rolled = play(fitted, CFG, test, 0)
    assert rolled.is_done.all() and (rolled.job_machine[test.is_real] >= 0).all()


def test_bad_construction_is_a_clear_error_and_the_registry_names_a_forecast_rule() -> None:
    rule = RiskAwarePacking(risk=RiskConfig(level=0.9))
    with pytest.raises(ValueError, match="2 rules for 1 levels"):
        ChargeAwarePeakPacking((rule, rule), (0.9,))
    with pytest.raises(ValueError, match="levels must ascend"):
        ChargeAwarePeakPacking((rule, rule), (0.9, 0.5))
    with pytest.raises(ValueError, match="n_ref must be finite and > 0"):
        ChargeAwarePeakPacking((rule,), (0.9,), n_ref=0.0)
    with pytest.raises(ValueError, match="n_ref must be finite and > 0"):
        ChargeAwarePeakPacking((rule,), (0.9,), n_ref=float("inf"))
    with pytest.raises(ValueError, match="mode must be one of"):
        ChargeAwarePeakPacking((rule,), (0.9,), mode="squeeze")
    with pytest.raises(ValueError, match="the fitted level 0.75 is not one of"):
        ChargeAwarePeakPacking((rule,), (0.9,), level=0.75)
    with pytest.raises(ValueError, match="the rule for level 0.99 packs at 0.9"):
        ChargeAwarePeakPacking((rule, rule), (0.9, 0.99), level=0.9)
    with pytest.raises(ValueError, match="forecast_peak_charge_guard90: n_ref_quantile must be in"):
        fit_peak_charge(None, "forecast_peak_charge_guard90", raise_only=True, n_ref_quantile=1.5)
    from sim.policies import policy_kind

    assert policy_kind("forecast_peak_charge") == "forecast" and "forecast_peak_charge_guard" in POLICIES
