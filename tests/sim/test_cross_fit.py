"""`TuningConfig.cross_fit`: a rule that learns from its fit part is chosen on both folds of the training split,
each sequence validated by a rule fitted without its workloads, and the rule kept is the first fold's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import POLICIES
from sim.risk import _peak_candidates
from sim.tuning import ChoiceMemo, FitContext, TuningConfig, sequence_outcomes, sequence_returns

CFG = SimConfig(n_machines=4, max_steps=600)
TUNING = TuningConfig(
    peak_levels=(0.5, 0.9),
    peak_modes=("deviate", "pack"),
    min_observed=(0,),
    fallbacks=("tetris", "first_fit"),
)


@pytest.fixture(scope="module")
def train() -> JobBatch:
    dp = replace(
        DeepPlaceConfig(), loads_pct=(50,), n_train_sequences=5, n_test_sequences=1, arrival_steps=30
    )
    frame, _ = build_deepplace_sequences(dp)
    return JobBatch.from_frame(frame.filter(pl.col("split") == "train"))


def test_the_swapped_fold_exchanges_fit_and_validation(train, tmp_path) -> None:
    ctx = FitContext(cfg=CFG, train=train, tuning=TUNING, memo=ChoiceMemo(tmp_path))
    fit, validation = ctx.split()
    other = ctx.swapped()
    assert other.split()[0] is validation and other.split()[1] is fit and other.fold == 1
    assert ctx.swapped() is other and other.choices is not ctx.choices
    assert other.memo_key("fallback") != ctx.memo_key("fallback")  # each fold's choices are its own


def test_the_swapped_folds_validation_is_capped_evenly(train) -> None:
    ctx = FitContext(cfg=CFG, train=train, tuning=replace(TUNING, cross_fit=True, cross_fit_sequences=2))
    fit, validation = ctx.split()
    assert fit.batch_size > 2
    swapped_fit, swapped_validation = ctx.swapped().split()
    assert swapped_fit is validation and swapped_validation.batch_size == 2
    keys = [fit.sequence_keys[0], fit.sequence_keys[-1]]  # evenly spaced: the first and the last
    assert list(swapped_validation.sequence_keys) == keys
    POLICIES["forecast_peak"].fit(ctx)
    assert ctx.choices["forecast_peak"]["n_validation_sequences"] == validation.batch_size + 2
    with pytest.raises(ValueError, match="cross_fit_sequences"):
        TuningConfig(cross_fit_sequences=0)


def test_cross_fit_pools_both_folds_and_keeps_the_first_folds_rule(train) -> None:
    ctx = FitContext(cfg=CFG, train=replace(train), tuning=replace(TUNING, cross_fit=True), where="dp")
    policy = POLICIES["forecast_peak"].fit(ctx)
    chosen = ctx.choices["forecast_peak"]
    fit, validation = ctx.split()
    assert chosen["validation_folds"] == 2
    assert chosen["n_validation_sequences"] == fit.batch_size + validation.batch_size == train.batch_size
    # every candidate's validation return is its mean over both folds, each fold's rule fitted on the other part
    fresh = FitContext(cfg=CFG, train=train, tuning=TUNING)
    first = _peak_candidates(fresh, "forecast_peak", True, True)
    second = _peak_candidates(fresh.swapped(), "forecast_peak", True, True)
    seed = TUNING.seed
    for tried, (_, one), (_, two) in zip(chosen["tried"], first, second, strict=True):
        pooled = np.concatenate(
            [sequence_returns(one, CFG, validation, seed), sequence_returns(two, CFG, fit, seed)]
        )
        assert tried["validation_return"] == pytest.approx(float(pooled.mean()))
        overshoot = np.concatenate(
            [sequence_outcomes(one, CFG, validation, seed)[1], sequence_outcomes(two, CFG, fit, seed)[1]]
        )
        assert tried["validation_overshoot_pct"] == pytest.approx(float(overshoot.mean()))
    best = next(
        i for i, t in enumerate(chosen["tried"]) if t["validation_return"] == chosen["validation_return"]
    )
    # the rule kept is the first fold's (fitted on the fit part): it plays as that candidate on validation
    assert np.array_equal(
        sequence_returns(policy, CFG, validation, seed),
        sequence_returns(first[best][1], CFG, validation, seed),
    )
    assert 0 <= chosen["first_fold_choice"] < len(chosen["tried"])


def test_without_cross_fit_one_fold_is_validated(train) -> None:
    ctx = FitContext(cfg=CFG, train=train, tuning=TUNING)
    POLICIES["forecast_peak"].fit(ctx)
    chosen = ctx.choices["forecast_peak"]
    assert chosen["validation_folds"] == 1 and "first_fold_choice" not in chosen
    assert chosen["n_validation_sequences"] == ctx.split()[1].batch_size
    # a rule that fits nothing on its fit part validates one fold even when cross-fitting is asked for
    plain = FitContext(cfg=CFG, train=train, tuning=replace(TUNING, cross_fit=True, n_sigmas=(2.0,)))
    POLICIES["n_sigma_observed"].fit(plain)
    assert plain.choices["n_sigma_observed"]["validation_folds"] == 1
