"""eval__leaderboard materialises from a results summary: its table, metadata, plot and checks."""

import importlib.util
from pathlib import Path

import polars as pl
from dagster import AssetKey, DagsterInstance, asset, materialize

from assets.io_manager import TableIOManager
from assets.leaderboard import eval__leaderboard
from assets.resources import Warehouse


def _summary() -> pl.DataFrame:
    path = Path(__file__).parents[1] / "sim" / "test_leaderboard.py"
    spec = importlib.util.spec_from_file_location("leaderboard_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summary()


def test_the_leaderboard_asset_writes_its_table_and_passes_its_checks(tmp_path):
    @asset(name="eval__results_summary", io_manager_key="table_io")
    def summary() -> pl.DataFrame:
        return _summary()

    wh = Warehouse(root=str(tmp_path / "wh"))
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [summary, eval__leaderboard],
            instance=instance,
            resources={"warehouse": wh, "table_io": TableIOManager(warehouse=wh)},
            tags={"tvw/profile": "quick"},
        )
        assert result.success
        checks = result.get_asset_check_evaluations()
        assert checks and all(c.passed for c in checks)
        event = instance.get_latest_materialization_event(AssetKey("eval__leaderboard"))
        assert "plot" in event.asset_materialization.metadata
    board = wh.scan("eval__leaderboard").collect()
    assert board["profile"].unique().to_list() == ["quick"]
    assert board.filter("is_oracle")["rank"].null_count() == board.filter("is_oracle").height
