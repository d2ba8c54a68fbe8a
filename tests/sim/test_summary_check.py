"""The summary check (`sim.evaluate.summary_check_values`): a cell where every policy has the same mean return
is a degenerate evaluation."""

import math

import polars as pl

from sim.evaluate import summary_check_values


def _summary(means: dict[str, float], metric: str = "episode_return") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "source": ["s"] * len(means),
            "load_pct": [50] * len(means),
            "policy": list(means),
            "metric": [metric] * len(means),
            "mean": list(means.values()),
        }
    )


def test_policies_with_different_means_pass():
    passed, meta = summary_check_values(_summary({"noop": -100.0, "tetris": -10.0}))[
        "policies_differ_in_every_cell"
    ]
    assert passed and meta["n_cells"] == 1 and meta["cells_with_one_mean"] == []


def test_a_cell_where_every_policy_has_the_same_mean_fails():
    passed, meta = summary_check_values(_summary({"noop": -5.0, "tetris": -5.0}))[
        "policies_differ_in_every_cell"
    ]
    assert not passed and meta["cells_with_one_mean"] == [{"source": "s", "load_pct": 50}]


def test_no_return_rows_or_a_non_finite_mean_fail():
    assert not summary_check_values(_summary({"noop": 1.0, "tetris": 2.0}, metric="machines_used"))[
        "policies_differ_in_every_cell"
    ][0]
    passed, meta = summary_check_values(_summary({"noop": -5.0, "tetris": math.inf}))[
        "policies_differ_in_every_cell"
    ]
    assert not passed and meta["n_non_finite_means"] == 1
