"""The generic table checks (`pipelines.table_checks`) and the offered-load check fail on degenerate tables."""

import math

import polars as pl
import pytest

from pipelines.job_sequences import offered_load_check_values
from pipelines.table_checks import TABLE_CHECKS, table_check, table_check_docs, table_check_values


def test_a_finite_table_in_range_passes():
    df = pl.DataFrame({"id": ["a", "b"], "x": [0.5, 1.0], "n": [1, 2]})
    passed, meta = table_check(df, bounds={"x": (0, 1)}, unique=("id",))
    assert passed and meta == {"n_rows": 2, "non_finite": {}, "out_of_range": {}, "n_duplicate_keys": 0}


@pytest.mark.parametrize(
    "df, kwargs, key, expected",
    [
        (pl.DataFrame({"x": [1.0, math.nan, math.inf]}), {}, "non_finite", {"x": 2}),
        (pl.DataFrame({"x": [0.5, 1.5, -0.1]}), {"bounds": {"x": (0, 1)}}, "out_of_range", {"x": 2}),
        (pl.DataFrame({"id": ["a", "a"], "x": [1.0, 2.0]}), {"unique": ("id",)}, "n_duplicate_keys", 1),
        (pl.DataFrame(schema={"x": pl.Float64}), {}, "n_rows", 0),
    ],
)
def test_a_degenerate_table_fails(df, kwargs, key, expected):
    passed, meta = table_check(df, **kwargs)
    assert not passed and meta[key] == expected


def test_empty_passes_only_where_the_layer_had_nothing_to_work_on():
    empty = pl.DataFrame(schema={"x": pl.Float64})
    assert table_check(empty, may_be_empty=True)[0]
    fig4 = pl.DataFrame(schema={"load_pct": pl.Int32, "policy": pl.String, "mean_slowdown": pl.Float64})
    assert not table_check_values("eval__deeprm_fig4", fig4)["slowdown_at_least_one"][0]
    assert table_check_values("eval__deeprm_fig4", fig4, may_be_empty=True)["slowdown_at_least_one"][0]


def test_a_column_the_check_names_but_the_table_lacks_fails():
    passed, meta = table_check(pl.DataFrame({"x": [1.0]}), bounds={"y": (0, 1)})
    assert not passed and meta["missing_columns"] == ["y"]


def test_nulls_are_missing_values_and_nan_is_not_a_range_violation():
    df = pl.DataFrame({"x": [None, 0.5, math.nan]})
    passed, meta = table_check(df, finite=(), bounds={"x": (0, 1)})
    assert passed and meta["out_of_range"] == {}
    assert table_check(df, bounds={"x": (0, 1)})[1]["non_finite"] == {"x": 1}


def test_every_table_check_names_columns_of_its_bounds_and_has_a_description():
    for asset, check in TABLE_CHECKS.items():
        assert table_check_docs(asset) == {check.name: check.description} and check.description


def test_fig4_slowdown_below_one_fails():
    fig4 = pl.DataFrame({"load_pct": [30, 30], "policy": ["sjf", "tetris"], "mean_slowdown": [1.2, 0.9]})
    assert not table_check_values("eval__deeprm_fig4", fig4)["slowdown_at_least_one"][0]
    fig4 = fig4.with_columns(mean_slowdown=pl.lit(1.5))
    assert table_check_values("eval__deeprm_fig4", fig4)["slowdown_at_least_one"][0]


def _offered(loads: list[float], label: int = 50) -> pl.DataFrame:
    n = len(loads)
    return pl.DataFrame(
        {
            "source": ["s"] * n,
            "load_pct": [label] * n,
            "offered_load_dominant": loads,
            "offered_load_mean": loads,
            "peak_demand_dominant": [1.0] * n,
        }
    )


def test_offered_load_near_its_label_passes_and_far_or_dead_fails():
    assert offered_load_check_values(_offered([0.48, 0.53]))["offered_load_near_label"][0]
    assert offered_load_check_values(_offered([0.6, 0.7]))["offered_load_near_label"][0]  # off 10 %, not 2x
    passed, meta = offered_load_check_values(_offered([0.2, 0.25]))["offered_load_near_label"]
    assert not passed and meta["off_label"][0]["load_pct"] == 50
    passed, meta = offered_load_check_values(_offered([1.0, 0.0]))["offered_load_near_label"]
    assert not passed and meta["n_sequences_without_load"] == 1
    assert not offered_load_check_values(_offered([]))["offered_load_near_label"][0]


def test_an_ablation_run_compared_with_no_heuristic_has_no_winner():
    winners = pl.DataFrame(
        {"tvw_rl_rank_by_return": [1, 2], "n_policies": [3, 3], "tvw_rl_return": [-1.0, -2.0]}
    )
    assert table_check_values("eval__ablation_winners", winners)["every_run_has_a_winner"][0]
    alone = winners.with_columns(n_policies=pl.lit(1))
    assert not table_check_values("eval__ablation_winners", alone)["every_run_has_a_winner"][0]
