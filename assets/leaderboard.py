"""`eval__leaderboard`: per (source, load), every policy ranked by return, the oracle apart (`sim.leaderboard`)."""

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MetadataValue,
    Output,
    asset,
)

from assets.jobs import PROFILE_TAG
from assets.plots import leaderboard_plot, png_markdown
from sim.leaderboard import leaderboard, leaderboard_text

CHECKS = [
    AssetCheckSpec(
        "ranks_policies_that_differ",
        asset="eval__leaderboard",
        description="Not every policy has the "
        "same mean in a cell (a degenerate evaluation), and the table is not empty.",
    ),
    AssetCheckSpec(
        "oracle_is_never_best", asset="eval__leaderboard", description="No oracle has a rank or is best."
    ),
]


@asset(group_name="results", io_manager_key="table_io", kinds={"parquet", "polars"}, check_specs=CHECKS)
def eval__leaderboard(context: AssetExecutionContext, eval__results_summary: pl.DataFrame):
    """Every policy of `eval__results_summary` ranked by mean episode return per (source, load), with its 95 %
    interval, its gap to the best non-oracle heuristic and the profile (budget) it ran under; oracles unranked."""
    board = leaderboard(eval__results_summary).with_columns(
        profile=pl.lit(context.run.tags.get(PROFILE_TAG, ""))
    )
    spread = board.filter(~pl.col("is_oracle")).group_by("source", "load_pct").agg(pl.col("mean").n_unique())
    flat = spread.filter(pl.col("mean") < 2)
    context.add_output_metadata(
        {
            "leaderboard": MetadataValue.md("```\n" + "\n".join(leaderboard_text(board)) + "\n```"),
            "plot": png_markdown(leaderboard_plot(board), "leaderboard"),
            "learned_beating_best_heuristic": int(board.filter("is_learned", "beats_best_heuristic").height),
        }
    )
    yield from [
        Output(board),
        AssetCheckResult(
            check_name="ranks_policies_that_differ",
            passed=bool(board.height and flat.is_empty()),
            severity=AssetCheckSeverity.ERROR,
            metadata={"cells_with_one_value": flat.height, "rows": board.height},
        ),
        AssetCheckResult(
            check_name="oracle_is_never_best",
            passed=board.filter(
                pl.col("is_oracle") & (pl.col("rank").is_not_null() | pl.col("is_best"))
            ).is_empty(),
            severity=AssetCheckSeverity.ERROR,
        ),
    ]


LEADERBOARD_ASSETS = [eval__leaderboard]
