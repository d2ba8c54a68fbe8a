"""The check values of the learned layers (learning curves, the EC classifier, EC profiles) pass on a sane
table and fail on the degenerate one they exist for."""

import math

import polars as pl

from models.ec_classifier import accuracy_check_values
from models.ec_mapping import Choice, profiles_check
from models.training import curve_check_values


def _curve(returns: list[float | None]) -> pl.DataFrame:
    n = len(returns)
    return pl.DataFrame(
        {
            "source": ["s"] * n,
            "load_pct": pl.Series([50] * n, dtype=pl.Int32),
            "seed": [0] * n,
            "iteration": list(range(n)),
            "mean_return": pl.Series(returns, dtype=pl.Float64),
        }
    )


def test_a_finite_learning_curve_passes_and_nulls_are_not_values():
    passed, meta = curve_check_values(_curve([None, -3.0, -2.0]))["learning_curve_is_finite"]
    assert passed and meta["n_runs"] == 1 and meta["n_rows"] == 3


def test_a_diverged_or_empty_learning_curve_fails():
    passed, meta = curve_check_values(_curve([-3.0, math.nan, -math.inf]))["learning_curve_is_finite"]
    assert not passed and meta["non_finite"] == {"mean_return": 2}
    assert not curve_check_values(_curve([]))["learning_curve_is_finite"][0]
    repeated = pl.concat([_curve([-1.0]), _curve([-1.0])])
    assert not curve_check_values(repeated)["learning_curve_is_finite"][0]


def _accuracy(acc: list[float], constant: list[float]) -> pl.DataFrame:
    return pl.DataFrame(
        {"prefix_bins": list(range(len(acc))), "accuracy": acc, "best_constant_accuracy": constant}
    )


def test_the_classifier_check_passes_when_above_the_best_constant_somewhere():
    passed, meta = accuracy_check_values(_accuracy([0.5, 0.8], [0.6, 0.6]))["beats_best_constant"]
    assert passed and math.isclose(meta["best_margin_over_constant"], 0.2)


def test_the_classifier_check_fails_at_or_below_the_best_constant_and_notes_no_training():
    assert not accuracy_check_values(_accuracy([0.5, 0.6], [0.6, 0.6]))["beats_best_constant"][0]
    assert not accuracy_check_values(_accuracy([], []))["beats_best_constant"][0]
    passed, meta = accuracy_check_values(pl.DataFrame(), "3 labelled workloads")["beats_best_constant"]
    assert passed and "3 labelled" in meta["note"]


def _profiles(labels: list[int], cpu: float = 0.2) -> pl.DataFrame:
    n = len(labels)
    return pl.DataFrame({"ec_label": labels, "cpu_frac": [cpu] * n, "mem_frac": [0.1] * n})


def _choice(method: str | None, k: int | None) -> Choice:
    return Choice(method=method, k=k, basis="significant" if method else "none", reason="test")


def test_profiles_of_a_chosen_mapping_pass_and_none_without_one():
    assert profiles_check(_profiles([0, 0, 1, 1]), _choice("dtw", 2))[0]
    assert profiles_check(_profiles([]), _choice(None, None))[0]


def test_profiles_fail_when_missing_extra_or_not_finite():
    assert not profiles_check(_profiles([]), _choice("dtw", 2))[0]
    assert not profiles_check(_profiles([0, 1, 2]), _choice("dtw", 2))[0]
    assert not profiles_check(_profiles([0]), _choice(None, None))[0]
    assert not profiles_check(_profiles([0, 1], cpu=math.nan), _choice("dtw", 2))[0]
