"""Dagster resources: the trace folder a run reads and the warehouse it writes (`pipelines.warehouse`)."""

from pathlib import Path

from dagster import ConfigurableResource, get_dagster_logger

from pipelines.sources import SOURCES
from pipelines.warehouse import UNPARTITIONED, ParquetWarehouse, partition_file_stem

__all__ = ["UNPARTITIONED", "TraceFolder", "Warehouse", "partition_file_stem"]


class TraceFolder(ConfigurableResource):
    """The trace folder a run reads (`TVW_TRACE_DIR`): one subfolder per source in the public layout."""

    root: str

    def shards(self, source: str, table: str) -> dict[str, Path]:
        """Shard file name (= raw partition key) -> path, for one table of one source, as found now."""
        return SOURCES[source].discover(Path(self.root), table)


class Warehouse(ConfigurableResource, ParquetWarehouse):
    """Where every table lives: Parquet files under `root`, DuckDB views in `root/tvw.duckdb` (every method is
    `pipelines.warehouse.ParquetWarehouse`'s; the folder can be moved or copied whole)."""

    root: str

    def _warn(self, message: str) -> None:
        get_dagster_logger().warning(message)
