"""The leaderboard ranks non-oracle policies by mean return, marks the best heuristic and never ranks an oracle."""

import polars as pl
import pytest

from sim.leaderboard import leaderboard, leaderboard_check_values, leaderboard_text

POLICIES = [  # policy, is_oracle, is_learned, mean return
    ("tetris", False, False, -10.0),
    ("foresight", True, False, -1.0),
    ("tvw_rl", False, True, -20.0),
    ("best_fit", False, False, -12.0),
]


def summary(policies=POLICIES, ci=1.0) -> pl.DataFrame:
    rows = [
        {"source": s, "load_pct": load, "policy": p, "policy_kind": "x", "is_oracle": o, "is_learned": lrn,
         "metric": "episode_return", "better": "higher", "n": 5, "n_seeds": 1, "mean": m, "std": 1.0,
         "ci_low": m - ci, "ci_high": m + ci}
        for s in ("a", "b") for load in (30, 50) for p, o, lrn, m in policies
    ]  # fmt: skip
    return pl.DataFrame(rows)


def test_ranks_exclude_the_oracle_and_the_best_heuristic_is_named():
    board = leaderboard(summary())
    cell = board.filter((pl.col("source") == "a") & (pl.col("load_pct") == 30))
    assert cell["policy"].to_list() == ["tetris", "best_fit", "tvw_rl", "foresight"]
    assert cell["rank"].to_list() == [1, 2, 3, None]
    assert cell.filter("is_best")["policy"].to_list() == ["tetris"]
    assert cell.filter("is_best_heuristic")["policy"].to_list() == ["tetris"]
    assert cell.filter(pl.col("policy") == "tvw_rl")["gap_to_best_heuristic"][0] == pytest.approx(-10.0)
    passed = {name: ok for name, (ok, _) in leaderboard_check_values(board).items()}
    assert passed == {"ranks_policies_that_differ": True, "oracle_is_never_best": True}
    text = "\n".join(leaderboard_text(board))
    assert "oracle" in text and "* tetris" in text


def test_a_learned_policy_beats_the_best_heuristic_only_when_its_interval_is_above():
    policies = [*POLICIES[:2], ("tvw_rl", False, True, -8.0), POLICIES[3]]
    board = leaderboard(summary(policies, ci=2.5))
    learned = board.filter(pl.col("policy") == "tvw_rl")
    assert learned["rank"].unique().to_list() == [1] and learned["is_best"].all()
    assert not learned["beats_best_heuristic"].any()  # its interval reaches -10.5, below the heuristic's -10
    board = leaderboard(summary(policies, ci=1.0))
    assert board.filter(pl.col("policy") == "tvw_rl")["beats_best_heuristic"].all()


def test_identical_means_fail_the_degenerate_check_and_no_heuristic_is_an_error():
    flat = leaderboard(summary([(p, o, lrn, -5.0) for p, o, lrn, _ in POLICIES]))
    assert not leaderboard_check_values(flat)["ranks_policies_that_differ"][0]
    with pytest.raises(ValueError, match="no non-oracle heuristic"):
        leaderboard(summary([("foresight", True, False, -1.0), ("tvw_rl", False, True, -2.0)]))


def test_a_forecast_driven_rule_is_a_contender_never_the_best_heuristic():
    rows = summary().with_columns(
        policy=pl.when(pl.col("policy") == "best_fit").then(pl.lit("forecast_rule")).otherwise("policy"),
        policy_kind=pl.when(pl.col("policy") == "best_fit").then(pl.lit("forecast")).otherwise("policy_kind"),
        mean=pl.when(pl.col("policy") == "best_fit").then(pl.lit(-5.0)).otherwise("mean"),
    )
    board = leaderboard(rows.with_columns(ci_low=pl.col("mean") - 1.0, ci_high=pl.col("mean") + 1.0))
    cell = board.filter((pl.col("source") == "a") & (pl.col("load_pct") == 30))
    assert cell.filter("is_best")["policy"].to_list() == ["forecast_rule"]
    assert cell.filter("is_best_heuristic")["policy"].to_list() == ["tetris"]
    row = cell.filter(pl.col("policy") == "forecast_rule").row(0, named=True)
    assert row["gap_to_best_heuristic"] == pytest.approx(5.0) and row["beats_best_heuristic"]
    assert "F forecast_rule" in "\n".join(leaderboard_text(board))
