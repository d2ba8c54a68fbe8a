"""Alibaba cluster-trace-v2018: one headerless CSV per table, shipped as `<table>.tar.gz`.

Times are seconds from the start of the sampled period (container_usage rows may start on day 2,
alibaba/clusterdata issue #52: kept as they are). Normalised values are on [0, 100]; -1 and 101
are the documented invalid markers and become null (counted, not quarantined).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from pipelines.raw_schemas import ALIBABA2018
from pipelines.sources.base import (
    DEFAULT_BATCH_BYTES,
    CsvTable,
    IngestError,
    ParsedBatch,
    iter_csv_batches,
    list_shards,
)

NAME = "alibaba2018"
FOLDER = "alibaba-2018"


def _spec(table: str, mandatory: tuple[str, ...], **kw) -> CsvTable:
    schema = ALIBABA2018[table]
    # time stamps are "double" in schema.txt for the usage tables: parse as float, require integers
    parse_as = {c: pl.Float64 for c, t in schema.items() if t.is_integer() and c.endswith("_s")}
    return CsvTable(
        source=NAME,
        table=table,
        schema=schema,
        mandatory=mandatory,
        non_negative=tuple(c for c, t in schema.items() if t.is_numeric()),
        invalid_markers=tuple(c for c in schema if c.endswith("_pct")),
        parse_as=parse_as,
        **kw,
    )


TABLES: dict[str, CsvTable] = {
    "machine_meta": _spec("machine_meta", ("machine_id", "time_s")),
    "machine_usage": _spec(
        "machine_usage", ("machine_id", "time_s"), order_keys=("machine_id",), order_time="time_s"
    ),
    "container_meta": _spec("container_meta", ("container_id", "machine_id", "time_s")),
    # the head of the real file has thousands of rows with an empty container_id: "empty container_id"
    "container_usage": _spec(
        "container_usage",
        ("container_id", "machine_id", "time_s"),
        order_keys=("container_id",),
        order_time="time_s",
    ),
    "batch_task": _spec("batch_task", ("task_name", "job_name", "start_time_s", "end_time_s")),
    "batch_instance": _spec("batch_instance", ("instance_name", "task_name", "job_name")),
}


def _member_matcher(table: str):
    return lambda name: Path(name).name == f"{table}.csv"


class Alibaba2018Source:
    """The Alibaba 2018 trace under `<root>/alibaba-2018/`: `<table>.tar.gz` or `<table>[.anything].csv[.gz]`."""

    name = NAME
    folder = FOLDER
    tables = tuple(ALIBABA2018)

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Files of `table`: the official tarball if present, else every matching CSV (sorted by name)."""
        folder = Path(root) / FOLDER
        tarball = list_shards(self, table, folder, lambda n: n == f"{table}.tar.gz")
        if tarball:
            return tarball
        pattern = re.compile(rf"{re.escape(table)}(\.[A-Za-z0-9_-]+)?\.csv(\.gz)?")
        return list_shards(self, table, folder, lambda n: pattern.fullmatch(n) is not None)

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one file (streamed; a tarball is read member by member, never unpacked)."""
        if table not in self.tables:
            raise IngestError(path, f"unknown {NAME} table {table!r}")
        yield from iter_csv_batches(TABLES[table], Path(path), batch_bytes, member=_member_matcher(table))
