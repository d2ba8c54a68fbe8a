"""The canonical `workloads` table: one row per workload, built from a source's raw tables.

`build_workloads(source, raw)` takes the raw tables of one source (`raw`: table name -> LazyFrame in the source's
raw schema; a table missing from the source's folder is missing from the dict) and returns a frame in
`pipelines.schemas.WORKLOADS`, sorted by workload_id. What a workload is and how its times, requests, final state
and partial flag are read is the source's own mapping (`TraceSource.workloads`; the rules are in each source
module's docstring, `pipelines.sources.<name>`); this module only looks the source up, casts to the canonical
schema, sorts and checks. Nothing here branches on a source's name.
"""

from __future__ import annotations

import re

import numpy as np
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


WORKLOAD_GROUP_PATTERN = r"^(.+)_d\d+$"
"""Workload ids that are windows of one longer workload: the pattern's first group names the workload they come
from (the derived Google job-days '<job>_d<k>' are days of one job). Splits keep a group whole (train or test,
fit or validation), so that no test workload is a day of a job trained on."""


def workload_groups(workload_ids: list[str], pattern: str = WORKLOAD_GROUP_PATTERN) -> np.ndarray:
    """The group of each workload: the pattern's first group where it matches, else the id itself."""
    rx = re.compile(pattern)
    return np.array([(m.group(1) if (m := rx.match(w)) else w) for w in workload_ids])
