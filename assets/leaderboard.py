"""`eval__leaderboard`: per (source, load), every policy ranked by return, the oracle apart (`sim.leaderboard`)."""

import polars as pl
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets import checks
from assets.jobs import PROFILE_TAG
from assets.learned import RESULTS_TABLE
from assets.plots import leaderboard_plot, png_markdown
from sim.leaderboard import LEADERBOARD_CHECKS, leaderboard, leaderboard_check_values, leaderboard_text


@asset(**RESULTS_TABLE, check_specs=checks.specs("eval__leaderboard", LEADERBOARD_CHECKS))
def eval__leaderboard(context: AssetExecutionContext, eval__results_summary: pl.DataFrame):
    """Every policy of `eval__results_summary` ranked by mean episode return per (source, load), with its 95 %
    interval, its gap to the best non-oracle heuristic and the profile (budget) it ran under; oracles unranked."""
    board = leaderboard(eval__results_summary).with_columns(
        profile=pl.lit(context.run.tags.get(PROFILE_TAG, ""))
    )
    yield Output(
        board,
        metadata={
            "leaderboard": MetadataValue.md("```\n" + "\n".join(leaderboard_text(board)) + "\n```"),
            "plot": png_markdown(leaderboard_plot(board), "leaderboard"),
            "learned_beating_best_heuristic": int(board.filter("is_learned", "beats_best_heuristic").height),
        },
    )
    yield from checks.results(leaderboard_check_values(board))


LEADERBOARD_ASSETS = [eval__leaderboard]
