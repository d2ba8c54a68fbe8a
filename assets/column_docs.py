"""Column descriptions as Dagster column schemas. The descriptions are in `pipelines.column_docs` (derived tables)
and in each trace source's module (`TraceSource.column_docs`, raw tables)."""

from collections.abc import Mapping

import dagster as dg

from pipelines.column_docs import BETTER, describe, undocumented, undocumented_in_warehouse
from sim.evaluate import METRIC_BETTER

__all__ = ["SCORES", "describe", "table_schema", "undocumented", "undocumented_in_warehouse"]

SCORES = {**BETTER, **METRIC_BETTER}
"""Which way every score is better: the simulator's episode metrics and the other scores."""


def table_schema(schema: Mapping[str, object], table: str | None = None) -> dg.TableSchema:
    """Dagster's column schema for a table: name, type and description of every column ('' when undocumented);
    a score's description says which way is better."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=c, type=str(t), description=describe(c, table, SCORES) or "")
            for c, t in schema.items()
        ]
    )
