"""An IO manager that stores polars frames as Parquet tables in the `Warehouse`, one file per partition."""

import polars as pl
from dagster import (
    ConfigurableIOManager,
    DagsterInvariantViolationError,
    InputContext,
    MetadataValue,
    OutputContext,
    ResourceDependency,
)

from assets.column_docs import table_schema, undocumented
from assets.resources import Warehouse
from pipelines.warehouse import markdown_preview


def frame_metadata(df: pl.DataFrame, table: str | None = None) -> dict:
    """Row count, column schema (type and description of every column, `assets.column_docs`; `table` picks the
    table's own meaning of a column where it has one) and a preview: what the UI shows for every table."""
    return {
        "dagster/row_count": len(df),
        "dagster/column_schema": table_schema(df.schema, table),
        "preview": MetadataValue.md(markdown_preview(df)),
    }


class TableIOManager(ConfigurableIOManager):
    """Writes each output frame to `tables/<asset>/<partition>.parquet` and refreshes its DuckDB view;
    loads an input as the concatenation of the upstream partitions it depends on."""

    warehouse: ResourceDependency[Warehouse]

    def handle_output(self, context: OutputContext, obj: pl.DataFrame) -> None:
        if obj is None:
            return
        if not isinstance(obj, pl.DataFrame):
            raise TypeError(
                f"{context.asset_key.to_user_string()}: expected a polars DataFrame, got {type(obj)}"
            )
        name = "__".join(context.asset_key.path)
        key = context.partition_key if context.has_partition_key else None
        path = self.warehouse.write(name, obj, key)
        # the configuration in force (sample / paper / a file), as tagged on the run by the job
        try:
            profile = context.step_context.run_tags.get("tvw/profile", "unset")
        except DagsterInvariantViolationError:  # an OutputContext built outside a run (unit tests)
            profile = "unset"
        missing = undocumented(obj.columns, name)
        if missing:
            context.log.warning(f"{name}: column(s) {missing} have no description in assets/column_docs.py")
        context.add_output_metadata(
            {**frame_metadata(obj, name), "path": MetadataValue.path(str(path)), "tvw/profile": profile}
        )

    def load_input(self, context: InputContext) -> pl.DataFrame:
        name = "__".join(context.asset_key.path)
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else None
        if keys is not None and not keys:
            keys = None
        return self.warehouse.scan(name, keys).collect()
