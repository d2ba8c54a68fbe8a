"""Google clusterdata-2011-2: headerless gzip CSV shards `<table>/part-NNNNN-of-00500.csv.gz`.

Time convention (kept as in the trace, not converted): `*_time_us` are int64 microseconds since
600 s before the start of the trace window (an event 20 s into the window has 620,000,000);
0 means "before the window" and 2**63 - 1 means "after the window". Usage windows are nominally
300 s. Resource columns (`_frac`) are normalised to the largest machine (= 1.0).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from pipelines.raw_schemas import GOOGLE2011
from pipelines.sources.base import (
    DEFAULT_BATCH_BYTES,
    CsvTable,
    ParsedBatch,
    check_table,
    iter_csv_batches,
    list_shards,
)

NAME = "google2011"
FOLDER = "google-2011"

TIME_BEFORE_WINDOW_US = 0
"""Special time value: the event happened before the trace window."""
TIME_AFTER_WINDOW_US = 2**63 - 1
"""Special time value: the event happened after the trace window."""
TRACE_OFFSET_US = 600_000_000
"""Trace time of the start of the window (600 s)."""


def _bools_as_int8(schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    # booleans are written 0/1 in the trace; polars' CSV reader wants true/false
    return {c: pl.Int8 for c, t in schema.items() if t == pl.Boolean}


def _spec(table: str, mandatory: tuple[str, ...], **kw) -> CsvTable:
    schema = GOOGLE2011[table]
    non_negative = tuple(c for c, t in schema.items() if t.is_numeric())
    return CsvTable(
        source=NAME,
        table=table,
        schema=schema,
        mandatory=mandatory,
        non_negative=non_negative,
        parse_as=_bools_as_int8(schema),
        **kw,
    )


# mandatory fields: the bucket's schema.csv ("mandatory" = YES)
TABLES: dict[str, CsvTable] = {
    "job_events": _spec("job_events", ("time_us", "job_id", "event_type")),
    "task_events": _spec("task_events", ("time_us", "job_id", "task_index", "event_type", "priority")),
    "task_usage": _spec(
        "task_usage",
        ("start_time_us", "end_time_us", "job_id", "task_index", "machine_id"),
        order_keys=("job_id", "task_index"),
        order_time="start_time_us",
    ),
    "machine_events": _spec("machine_events", ("time_us", "machine_id", "event_type")),
    "machine_attributes": _spec(
        "machine_attributes", ("time_us", "machine_id", "attribute_name", "is_deleted")
    ),
    "task_constraints": _spec(
        "task_constraints", ("time_us", "job_id", "task_index", "comparison_operator", "attribute_name")
    ),
}


class Google2011Source:
    """The Google 2011 trace in the bucket's layout under `<root>/google-2011/`."""

    name = NAME
    folder = FOLDER
    tables = tuple(GOOGLE2011)

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Shards of `table`: file name (e.g. `part-00000-of-00500.csv.gz`) -> path, sorted."""
        return list_shards(
            self, table, Path(root) / FOLDER / table, lambda n: n.endswith((".csv.gz", ".csv"))
        )

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one shard (streamed)."""
        check_table(self, table)
        yield from iter_csv_batches(TABLES[table], Path(path), batch_bytes)
