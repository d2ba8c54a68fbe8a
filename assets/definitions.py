"""The one `Definitions` object, and the only place that reads paths from the environment.

Settings (environment variables):
    TVW_TRACE_DIR      folder holding `google-2011/`, `alibaba-2018/`, `google-2011-derived/` in the public
                       distribution layout (default: the embedded sample in `data/`)
    TVW_WAREHOUSE_DIR  where Parquet tables and `tvw.duckdb` go (default: `warehouse/`)
"""

import os
from pathlib import Path

from dagster import Definitions, in_process_executor

from assets import cluster, core, ec
from assets.io_manager import TableIOManager
from assets.jobs import build_jobs
from assets.raw import build_raw_assets
from assets.resources import Warehouse

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def trace_dir() -> Path:
    return Path(os.environ.get("TVW_TRACE_DIR", PROJECT_ROOT / "data")).resolve()


def warehouse_dir() -> Path:
    return Path(os.environ.get("TVW_WAREHOUSE_DIR", PROJECT_ROOT / "warehouse")).resolve()


def build_definitions(traces: Path, warehouse_root: Path) -> Definitions:
    """Definitions for a given trace folder and warehouse (tests point these at tmp_path)."""
    warehouse = Warehouse(root=str(warehouse_root))
    raw_assets = build_raw_assets(traces)
    all_assets = [*raw_assets, *core.CORE_ASSETS, *ec.EC_ASSETS, *cluster.CLUSTER_ASSETS]
    return Definitions(
        assets=all_assets,
        asset_checks=[*core.CORE_CHECKS],
        jobs=build_jobs(),
        resources={"warehouse": warehouse, "table_io": TableIOManager(warehouse=warehouse)},
        executor=in_process_executor,
    )


defs = build_definitions(trace_dir(), warehouse_dir())
