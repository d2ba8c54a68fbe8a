"""Canonical (source-independent) table schemas.

Every source's raw tables are turned into these tables by its source module (`pipelines.sources`); everything
downstream (equivalence classes, job sequences, the simulator) reads only these.

Units live in column names: `_s` seconds of trace time, `_frac` a fraction of one machine's
capacity (1.0 = a whole machine of the source's reference size), `_units` integer quantised units.
"""

from __future__ import annotations

import polars as pl

BIN_SECONDS = 300
"""Width of a usage bin: TVW-RL works on 5-minute records."""

FINAL_STATES = ("finished", "evicted", "killed", "failed", "lost", "running", "unknown")
"""Closed set of `workloads.final_state` values. `running`: still running when the trace ends."""

QUARANTINE = {
    "source": pl.String,
    "table": pl.String,
    "source_file": pl.String,
    "line_number": pl.Int64,  # 1-based line in the (decompressed) input file
    "reason": pl.String,
    "raw_line": pl.String,
}
"""Rows set aside by ingest, with the file, line and reason."""

WORKLOADS = {
    "source": pl.String,
    "workload_id": pl.String,  # Google: "<job_id>/<task_index>"; Alibaba: container_id; derived: job id
    "machine_id": pl.String,  # last machine seen; null when unknown
    "start_time_s": pl.Float64,  # first usage record (trace time, seconds)
    "end_time_s": pl.Float64,  # end of the last usage record
    "n_usage_records": pl.Int64,  # raw usage rows of this workload
    "cpu_request_frac": pl.Float64,
    "mem_request_frac": pl.Float64,
    "priority": pl.Int32,
    "scheduling_class": pl.Int32,
    "final_state": pl.String,  # one of FINAL_STATES
    "is_partial": pl.Boolean,  # only partly recorded (starts before / ends after what the data covers)
}
"""One row per workload."""

USAGE = {
    "source": pl.String,
    "workload_id": pl.String,
    "bin_start_s": pl.Int64,  # multiple of BIN_SECONDS
    "cpu_frac": pl.Float64,
    "mem_frac": pl.Float64,
    "n_samples": pl.Int32,  # raw records averaged into the bin; 0 for a filled bin
    "is_filled": pl.Boolean,  # True when the gap-filling policy produced the value
}
"""One row per workload per 5-minute bin."""

USAGE_COUNTS = {"source": pl.String, "count": pl.String, "n": pl.Int64}
"""Row/workload counts of one usage build: `count` names what is counted (rows_in, rows_dropped_<reason>,
per-source counts such as workloads_without_meta, bins_out, bins_filled), `n` how many."""

LONG_RUNNING = {
    **WORKLOADS,
    "run_start_s": pl.Int64,  # first bin of the longest contiguous run
    "n_run_bins": pl.Int64,  # length of that run, in bins
}
"""Workloads that pass the TVW-RL long-running filter, with the contiguous window kept."""

LONG_RUNNING_REPORT = {
    "source": pl.String,
    "reason": pl.String,  # kept | bad_final_state | partial | too_short | no_usage
    "n_workloads": pl.Int64,
}
"""How many workloads each reason dropped (and how many were kept)."""


def empty_frame(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """An empty frame with the given schema."""
    return pl.DataFrame(schema=schema)


def check_schema(df: pl.DataFrame, schema: dict[str, pl.DataType], name: str) -> pl.DataFrame:
    """Return `df` with exactly `schema`'s columns, in order, cast; raise naming the table if one is missing."""
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise ValueError(f"table {name!r} is missing column(s) {missing}; has {df.columns}")
    return df.select([pl.col(c).cast(t) for c, t in schema.items()])
