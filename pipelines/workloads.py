"""The canonical `workloads` table: one row per workload, built from a source's raw tables.

`build_workloads(source, raw)` takes the raw tables of one source (`raw`: table name -> LazyFrame in the source's
raw schema; a table missing from the source's folder is missing from the dict) and returns a frame in
`pipelines.schemas.WORKLOADS`, sorted by workload_id. What a workload is and how its times, requests, final state
and partial flag are read is the source's own mapping (`TraceSource.workloads`; the rules are in each source
module's docstring, `pipelines.sources.<name>`); this module only looks the source up, casts to the canonical
schema, sorts and checks. Nothing here branches on a source's name.
"""

from __future__ import annotations

import polars as pl

from pipelines.schemas import WORKLOADS, check_schema
from pipelines.sources import SOURCES


def scan_workloads(source: str, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Lazy plan of the WORKLOADS table of `source`, sorted by workload_id."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {sorted(SOURCES)}")
    lf = SOURCES[source].workloads(raw)
    return lf.select([pl.col(c).cast(t) for c, t in WORKLOADS.items()]).sort("workload_id")


def build_workloads(source: str, raw: dict[str, pl.LazyFrame]) -> pl.DataFrame:
    """The WORKLOADS table of `source` (one row per workload; rules in the source module's docstring)."""
    df = scan_workloads(source, raw).collect(engine="streaming")
    return check_schema(df, WORKLOADS, f"{source} workloads")
