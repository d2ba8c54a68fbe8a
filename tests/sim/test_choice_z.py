"""`TuningConfig.choice_z`: validation may choose a setting by the lower confidence bound of its paired gain over
the fallback heuristic instead of by its mean return."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import make_policy
from sim.tuning import FitContext, TuningConfig, tuning_preset

CFG = SimConfig(n_machines=10, max_steps=600)
NAMES = ("tetris", "kube_default", "first_fit", "best_fit", "deeprm_sjf")
TUNING = TuningConfig(fallbacks=("tetris",), overshoot_budget_pct=None)


@pytest.fixture(scope="module")
def train() -> JobBatch:
    """Requests that understate usage on some sequences only, so spreading (kube_default) gains over Tetris by
    a return that varies from sequence to sequence."""
    rng = np.random.default_rng(1)
    sequences = []
    for s in range(10):
        jobs = []
        for i in range(12):
            high = 5 if s % 2 else 2
            cpu = rng.integers(1, high + 1, size=(int(rng.integers(8, 20)), 1))
            jobs.append(
                {
                    "arrival_step": int(rng.integers(0, 30)),
                    "usage": np.concatenate([cpu, np.ones_like(cpu)], axis=1).tolist(),
                    "ec_label": 0,
                    "request": [1, 1],
                    "workload_id": f"w{s}-{i}",
                }
            )
        sequences.append(jobs)
    return JobBatch.from_jobs(sequences)


def _choice(train: JobBatch, **knobs) -> tuple[dict, FitContext]:
    ctx = FitContext(cfg=CFG, train=train, tuning=replace(TUNING, **knobs))
    ctx.choose("rule", [({"heuristic": name}, make_policy(name)) for name in NAMES])
    return ctx.choices["rule"], ctx


def test_without_caution_the_best_mean_return_is_chosen(train) -> None:
    choice, _ = _choice(train)
    assert choice["choice_z"] == 0.0
    assert choice["validation_return"] == max(t["validation_return"] for t in choice["tried"])
    assert choice["heuristic"] != "tetris"  # a candidate gains over the fallback on the mean


def test_the_bound_is_the_paired_gain_minus_z_standard_errors(train) -> None:
    z = 1.645
    choice, ctx = _choice(train, choice_z=z)
    fallback = ctx.heuristic_outcomes("tetris")[0]
    for tried in choice["tried"]:
        d = ctx.validation_outcomes(make_policy(tried["heuristic"]))[0] - fallback
        se = d.std(ddof=1) / np.sqrt(d.size)
        assert tried["validation_gain"] == pytest.approx(d.mean())
        assert tried["validation_gain_bound"] == pytest.approx(d.mean() - z * se)
    fallback_row = next(t for t in choice["tried"] if t["heuristic"] == "tetris")
    assert fallback_row["validation_gain"] == 0.0 and fallback_row["validation_gain_bound"] == 0.0
    assert choice["validation_gain_bound"] == max(t["validation_gain_bound"] for t in choice["tried"])


def test_a_cautious_choice_keeps_the_setting_whose_gain_is_certain(train) -> None:
    bold, _ = _choice(train)
    cautious, _ = _choice(train, choice_z=1e6)  # every noisy gain's bound is far below the fallback's exact 0
    assert bold["heuristic"] != "tetris" and cautious["heuristic"] == "tetris"
    assert cautious["validation_return"] < bold["validation_return"]


@pytest.mark.parametrize("z", [-1.0, float("nan"), float("inf")])
def test_a_bad_choice_z_is_refused_by_name(z) -> None:
    with pytest.raises(ValueError, match="choice_z"):
        TuningConfig(choice_z=z)
    with pytest.raises(ValueError, match="choice_z"):
        tuning_preset("quick", 0.3, 0, choice_z=z)


def test_the_evaluation_and_the_residual_pass_their_choice_z_to_the_tuning() -> None:
    from models.forecast_placer import PlacerTrainConfig
    from sim.evaluate import EvalSettings

    assert EvalSettings(choice_z=1.5).tuning().choice_z == 1.5
    assert EvalSettings().tuning().choice_z == 0.0
    assert PlacerTrainConfig(choice_z=1.5).choice_z == 1.5
    for bad in (EvalSettings, PlacerTrainConfig):
        with pytest.raises(ValueError, match="choice_z"):
            bad(choice_z=-1.0)
