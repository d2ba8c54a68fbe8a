"""What a source's mapping to the canonical tables is made of, and the row-level helpers every mapping uses.

A source maps its raw tables (table name -> LazyFrame in its raw schema; a table missing from the trace folder is
missing from the dict) to
* its `workloads` frame: `TraceSource.workloads(raw)`, a LazyFrame with (at least) the WORKLOADS columns;
* its binned usage: `TraceSource.usage`, a `UsageMapping` that says how raw rows become 5-minute bins, and how
  the common driver (`pipelines.usage.iter_usage_chunks`) should stream them given how the raw rows are stored:
  in slices of trace time (`TimeChunks`, for time-ordered raw files such as Google's shards) or in ranges of
  workload keys (`WorkloadChunks`, for raw files sorted by workload such as Alibaba's container_usage);
* its long-running rule: `TraceSource.long_running`, a `LongRunningRule` (the paper's default for that trace).

This module sits below the source modules and above `pipelines.schemas` only, so `pipelines.usage`,
`pipelines.workloads` and `pipelines.long_running` can import the source registry without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipelines.schemas import BIN_SECONDS

BAD_ROW_REASONS = (
    "no_workload_id",
    "null_usage",
    "nan_usage",
    "infinite_usage",
    "negative_usage",
    "bad_window",
)
"""Why a raw usage row is dropped before binning (first matching reason), counted as rows_dropped_<reason>."""

BINNED = {
    "source": pl.String,
    "workload_id": pl.String,
    "bin_start_s": pl.Int64,
    "cpu_frac": pl.Float64,
    "mem_frac": pl.Float64,
    "n_samples": pl.Int32,
}
"""Columns of a mapping's binned usage (USAGE before gap filling)."""

LONG_RUNNING_RULES = ("contiguous_bins", "observed_bins")


@dataclass(frozen=True)
class TimeChunks:
    """Stream the usage in slices of `seconds` of trace time. Suits raw usage stored in time order: a Parquet row
    group then holds a short time range, and a chunk's filter on the time column skips the other row groups."""

    seconds: int
    """trace seconds per chunk (a positive multiple of 300)."""

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.seconds % BIN_SECONDS:
            raise ValueError(
                f"TimeChunks.seconds={self.seconds} must be a positive multiple of {BIN_SECONDS}"
            )


@dataclass(frozen=True)
class WorkloadChunks:
    """Stream the usage in ranges of workload keys holding about `rows` raw usage rows each. Suits raw usage
    stored sorted by workload key: a Parquet row group then holds a short key range, a chunk's filter on the key
    skips the other row groups, and the whole build reads every raw row once (plus the one row group at each
    chunk boundary). A workload's rows all fall in one range, so gap filling needs nothing from other chunks."""

    keys: dict[str, pl.Expr]
    """usage table -> expression of a raw row's workload key (written on the raw column so Parquet row-group
    statistics apply; every row of one workload has the same key; null keys go to the first range)."""
    rows: int
    """raw usage rows per chunk, about (a workload with more rows has a chunk of its own)."""

    def __post_init__(self) -> None:
        if self.rows <= 0:
            raise ValueError(f"WorkloadChunks.rows={self.rows} must be positive")


@dataclass(frozen=True)
class UsageMapping:
    """How one source's raw tables become binned usage."""

    bins: Callable[[dict[str, pl.LazyFrame]], tuple[pl.LazyFrame, pl.LazyFrame]]
    """raw tables -> (binned usage with the BINNED columns, USAGE_COUNTS of the rows read)."""
    needed: str | None
    """the raw table it cannot do without (None: works with whatever is there)."""
    times: dict[str, tuple[pl.Expr, int]]
    """usage table -> (expression of a row's time, its units per second); a row's bin is
    floor(time / units / 300) * 300, so a time range [lo, hi) in seconds selects whole bins when lo, hi are
    multiples of 300. Written on the raw column where possible so Parquet row-group statistics skip data."""
    small_tables: tuple[str, ...] = ()
    """tables read whole by every chunk (metadata): collected once by the chunk driver."""
    workload_counts: Callable[[dict[str, pl.LazyFrame], pl.LazyFrame], pl.LazyFrame] | None = None
    """(raw tables, unique workload ids with usage) -> per-workload USAGE_COUNTS; None: there are none."""
    chunking: TimeChunks | WorkloadChunks = TimeChunks(6 * 3600)
    """how the chunk driver streams this source by default (it follows how the raw usage rows are stored)."""


@dataclass(frozen=True)
class LongRunningRule:
    """A source's long-running threshold as its paper states it."""

    kind: Literal["contiguous_bins", "observed_bins"]
    """contiguous_bins: the longest run of consecutive 5-minute bins counts (TVW-RL for Google: "6000 continuous
    records"); observed_bins: every 5-minute bin with at least one sample counts, wherever the gaps are (TVW-RL for
    Alibaba: "at least 2000 timestamped resource usage records")."""
    min_bins: int
    """least number of bins of that kind."""
    max_gap_bins: int = 0
    """Longest gap (missing 5-minute bins) a kept window bridges (0: gap-free windows only)."""

    def __post_init__(self) -> None:
        if self.max_gap_bins < 0:
            raise ValueError(f"LongRunningRule.max_gap_bins must be >= 0, got {self.max_gap_bins}")
        if self.kind not in LONG_RUNNING_RULES:
            raise ValueError(f"LongRunningRule.kind={self.kind!r}; expected one of {LONG_RUNNING_RULES}")


# ---------------------------------------------------------------- row helpers


def last_value(col: str) -> pl.Expr:
    """Last non-null value of `col` (frame already sorted by time within the group)."""
    return pl.col(col).drop_nulls().last()


def bin_start(t_s: pl.Expr) -> pl.Expr:
    """bin_start_s of a time in seconds: floor(t / 300) * 300."""
    return t_s // BIN_SECONDS * BIN_SECONDS


def bad_reason(cpu: pl.Expr, mem: pl.Expr) -> pl.Expr:
    """First reason a usage row is unusable, null when it is fine (extend with `.when(...)` for more)."""
    return (
        pl.when(cpu.is_null() | mem.is_null())
        .then(pl.lit("null_usage"))
        .when(cpu.is_nan() | mem.is_nan())
        .then(pl.lit("nan_usage"))
        .when(cpu.is_infinite() | mem.is_infinite())
        .then(pl.lit("infinite_usage"))
        .when((cpu < 0) | (mem < 0))
        .then(pl.lit("negative_usage"))
    )


def count_reasons(rows: pl.LazyFrame, source: str) -> pl.LazyFrame:
    """rows (with a nullable `bad_reason` column) -> USAGE_COUNTS rows: rows_in and rows_dropped_<reason>."""
    sums = [pl.len().alias("rows_in")] + [
        (pl.col("bad_reason") == r).sum().alias(f"rows_dropped_{r}") for r in BAD_ROW_REASONS
    ]
    return counts_frame(rows.select(sums), source)


def counts_frame(wide: pl.LazyFrame, source: str) -> pl.LazyFrame:
    """A one-row frame of named counts -> USAGE_COUNTS rows (one per column)."""
    return wide.unpivot(variable_name="count", value_name="n").select(
        pl.lit(source).alias("source"), "count", pl.col("n").cast(pl.Int64)
    )


def mean_per_bin(rows: pl.LazyFrame, source: str) -> pl.LazyFrame:
    """Valid rows (workload_id, bin_start_s, cpu_frac, mem_frac) -> equal-weight mean per bin."""
    return (
        rows.group_by("workload_id", "bin_start_s")
        .agg(pl.col("cpu_frac").mean(), pl.col("mem_frac").mean(), pl.len().cast(pl.Int32).alias("n_samples"))
        .with_columns(pl.lit(source).alias("source"))
    )
