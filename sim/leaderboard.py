"""The leaderboard: per (source, load), every policy ranked by mean episode return, with its 95 % interval.

An oracle (a policy that sees the future) is a yardstick, never a winner: it gets no rank, and "best" is always the
best non-oracle policy. The best heuristic is the best policy of kind "heuristic" (neither an oracle, nor learned,
nor a forecast-driven rule: those are the contenders); every row says how far it is from that heuristic, so a
learned or forecast-driven policy's win or loss reads off one column.
"""

from __future__ import annotations

import polars as pl

LEADERBOARD_METRIC = "episode_return"
"""What the ranking is by: the mean episode return over test sequences (higher is better)."""
LEADERBOARD = {
    "source": pl.String,
    "load_pct": pl.Int64,
    "rank": pl.Int64,  # 1 = best non-oracle policy; null for an oracle
    "policy": pl.String,
    "policy_kind": pl.String,
    "is_oracle": pl.Boolean,
    "is_learned": pl.Boolean,
    "is_best": pl.Boolean,
    "is_best_heuristic": pl.Boolean,
    "mean": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "n": pl.Int64,
    "gap_to_best_heuristic": pl.Float64,
    "beats_best_heuristic": pl.Boolean,  # its interval lies above the best heuristic's mean
}


def leaderboard(summary: pl.DataFrame, metric: str = LEADERBOARD_METRIC) -> pl.DataFrame:
    """The LEADERBOARD table from a `sim.evaluate.summarise` frame (with is_oracle / is_learned columns).
    ValueError when the metric is missing or a (source, load) has no non-oracle heuristic to compare with."""
    rows = summary.filter(pl.col("metric") == metric)
    if rows.is_empty():
        raise ValueError(f"leaderboard: no `{metric}` rows in the summary")
    for col, default in (("is_oracle", False), ("is_learned", False), ("policy_kind", "")):
        if col not in rows.columns:
            rows = rows.with_columns(pl.lit(default).alias(col))
    cell = ["source", "load_pct"]
    # forecast-driven rules (policy_kind "forecast") are contenders like the learned ones, never "the best heuristic"
    heuristic = ~pl.col("is_oracle") & ~pl.col("is_learned") & (pl.col("policy_kind") != "forecast")
    best_heur = (
        rows.filter(heuristic)
        .sort(["mean", "policy"], descending=[True, False])  # a tie goes to the first name
        .group_by(cell, maintain_order=True)
        .agg(best_heuristic=pl.col("policy").first(), best_heuristic_mean=pl.col("mean").first())
    )
    missing = rows.select(cell).unique().join(best_heur, on=cell, how="anti")
    if not missing.is_empty():
        raise ValueError(f"leaderboard: no non-oracle heuristic in cells {missing.rows()}")
    ranked = rows.join(best_heur, on=cell).with_columns(
        rank=pl.when(~pl.col("is_oracle"))
        .then(pl.col("mean").rank("ordinal", descending=True).over([*cell, "is_oracle"]))
        .cast(pl.Int64),
        gap_to_best_heuristic=pl.col("mean") - pl.col("best_heuristic_mean"),
        is_best_heuristic=pl.col("policy") == pl.col("best_heuristic"),
        beats_best_heuristic=pl.col("ci_low") > pl.col("best_heuristic_mean"),
    )
    return (
        ranked.with_columns(is_best=pl.col("rank") == 1)
        .with_columns(pl.col("is_best").fill_null(False))
        .select([pl.col(c).cast(t) for c, t in LEADERBOARD.items()])
        .sort(["source", "load_pct", pl.col("rank").is_null(), "rank", "policy"])
    )


def leaderboard_text(board: pl.DataFrame, top: int = 5) -> list[str]:
    """Lines for a terminal: per cell the top non-oracle policies (best heuristic and learned ones marked, every
    learned policy shown whatever its rank) and the oracle apart."""
    lines = [
        f"leaderboard ({LEADERBOARD_METRIC}, mean [95 % interval] over test sequences; * best heuristic, "
        "L learned, F forecast-driven, oracle apart)"
    ]
    width = max((len(p) for p in board["policy"].to_list()), default=0)
    for (source, load), cell in board.group_by(["source", "load_pct"], maintain_order=True):
        lines.append(f"  {source} @ {load}%")
        for r in cell.iter_rows(named=True):
            contender = r["is_learned"] or r["policy_kind"] == "forecast"
            shown = (r["rank"] or 10**9) <= top or contender or r["is_oracle"]
            if not shown:
                continue
            mark = (
                "*" if r["is_best_heuristic"] else ("L" if r["is_learned"] else ("F" if contender else " "))
            )
            where = "oracle" if r["is_oracle"] else f"{r['rank']:>2}."
            lines.append(
                f"    {where:>6} {mark} {r['policy']:<{width}} {r['mean']:>12.4g} [{r['ci_low']:.4g}, {r['ci_high']:.4g}]"
                f"  {r['gap_to_best_heuristic']:+.3g} vs best heuristic"
            )
    return lines


LEADERBOARD_CHECKS = {
    "ranks_policies_that_differ": "The table is not empty and no cell gives every non-oracle policy the same mean "
    "(a degenerate evaluation).",
    "oracle_is_never_best": "No oracle has a rank or is best.",
}


def leaderboard_check_values(board) -> dict[str, tuple[bool, dict]]:
    """Check name (LEADERBOARD_CHECKS) -> (passed, metadata)."""
    spread = board.filter(~pl.col("is_oracle")).group_by("source", "load_pct").agg(pl.col("mean").n_unique())
    flat = spread.filter(pl.col("mean") < 2)
    bad_oracle = board.filter(pl.col("is_oracle") & (pl.col("rank").is_not_null() | pl.col("is_best")))
    return {
        "ranks_policies_that_differ": (
            bool(board.height) and flat.is_empty(),
            {"cells_with_one_value": flat.height},
        ),
        "oracle_is_never_best": (bad_oracle.is_empty(), {"oracle_rows_ranked": bad_oracle.height}),
    }
