"""The canonical `usage` table: per workload, CPU and memory per 5-minute bin, as fractions of a machine.

What is common to every source lives here: the chunk driver, gap filling, counts and checks. How a source's raw
rows become bins (which rows, which fractions, which weights) is the source's own `UsageMapping`
(`pipelines.sources.<name>`, its module docstring states the rules); nothing here branches on a source's name.

`iter_usage_chunks(source, raw, cfg, chunk_s)` yields the USAGE table of one source in pieces of trace time,
each with its USAGE_COUNTS rows (rows in, dropped by reason, per-source workload counts, bins out and filled);
write each piece as it comes (full Google: ~1.2 billion task_usage rows, about as many output bins). Each piece
filters the raw usage table(s) on the time column(s) the mapping names, so Parquet row-group statistics skip the
other rows when the files are in time order (Google's shards are) and memory follows `chunk_s`, not the trace
length. `build_usage` / `build_usage_with_report` concatenate the pieces (small data, tests); `scan_usage` is the
one-pass lazy plan the pieces reproduce exactly (its group-by holds every output bin: ~3.8 GB at 20 M bins).
Bins: `bin_start_s = floor(t / 300) * 300` in the source's trace time. Rows come in no particular order
unless `UsageConfig.sort_rows` (then sorted within each piece).

Validity: a raw row whose CPU or memory value is null, NaN or negative (or a reason of the source's own, such as
Google's window ending before it starts) is dropped and counted under `rows_dropped_<reason>` (first matching
reason, `pipelines.sources.mapping.BAD_ROW_REASONS`). Nothing is dropped silently.

Gaps: a bin without samples is absent unless `UsageConfig.fill_policy` is "hold" (repeat the last value before
the gap) or "linear" (interpolate between the bins around the gap) AND the gap is at most `max_fill_bins` bins;
such rows have `is_filled = True`, `n_samples = 0` and are counted (`bins_filled`). Longer gaps stay gaps, and
nothing is filled before the first or after the last bin of a workload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipelines.schemas import BIN_SECONDS, USAGE, USAGE_COUNTS, check_schema, empty_frame
from pipelines.sources import SOURCES
from pipelines.sources.mapping import BAD_ROW_REASONS, BINNED, UsageMapping

__all__ = [
    "BAD_ROW_REASONS",
    "FILL_POLICIES",
    "USAGE_COUNTS",
    "UsageConfig",
    "build_usage",
    "build_usage_with_report",
    "fill_gaps",
    "iter_usage_chunks",
    "scan_usage",
    "usage_chunk_bounds",
]

FILL_POLICIES = ("none", "hold", "linear")


@dataclass(frozen=True)
class UsageConfig:
    """How build_usage treats bins without samples."""

    fill_policy: Literal["none", "hold", "linear"] = "none"
    """none: gaps stay gaps; hold: repeat the value before the gap; linear: interpolate across the gap."""
    max_fill_bins: int = 0
    """Longest gap (in missing bins) that is filled; longer gaps stay gaps. 0 = fill nothing."""
    sort_rows: bool = False
    """Sort the output by (workload_id, bin_start_s). Off by default: at 20 M rows the sort costs about as much
    as the binning itself, and nothing downstream in this package needs the order."""

    def __post_init__(self) -> None:
        if self.fill_policy not in FILL_POLICIES:
            raise ValueError(f"UsageConfig.fill_policy={self.fill_policy!r}; expected one of {FILL_POLICIES}")
        if self.max_fill_bins < 0:
            raise ValueError(f"UsageConfig.max_fill_bins={self.max_fill_bins} must be >= 0")


# gaps ------------------------------------------------------------------------------------------------------


def fill_gaps(usage: pl.LazyFrame, cfg: UsageConfig) -> pl.LazyFrame:
    """Add `is_filled` and, per `cfg`, the filled bins of gaps of at most `cfg.max_fill_bins` bins."""
    usage = usage.with_columns(pl.lit(False).alias("is_filled"))
    if cfg.fill_policy == "none" or cfg.max_fill_bins == 0:
        return usage
    key = ["source", "workload_id"]
    s = usage.sort(*key, "bin_start_s")
    nxt = {c: pl.col(c).shift(-1).over(key) for c in ("bin_start_s", "cpu_frac", "mem_frac")}
    gap = ((nxt["bin_start_s"] - pl.col("bin_start_s")) // BIN_SECONDS - 1).alias("gap")
    k = pl.col("k")

    def value(c: str) -> pl.Expr:
        if cfg.fill_policy == "hold":
            return pl.col(c)
        return pl.col(c) + (pl.col(f"next_{c}") - pl.col(c)) * k / (pl.col("gap") + 1)

    fills = (
        s.with_columns(gap, *(e.alias(f"next_{c}") for c, e in nxt.items() if c != "bin_start_s"))
        .filter(pl.col("gap").is_between(1, cfg.max_fill_bins))
        .with_columns(pl.int_ranges(1, pl.col("gap") + 1).alias("k"))
        .explode("k")
        .select(
            "source",
            "workload_id",
            (pl.col("bin_start_s") + k * BIN_SECONDS).alias("bin_start_s"),
            value("cpu_frac").alias("cpu_frac"),
            value("mem_frac").alias("mem_frac"),
            pl.lit(0, pl.Int32).alias("n_samples"),
            pl.lit(True).alias("is_filled"),
        )
    )
    return pl.concat([s, fills])


# public API ------------------------------------------------------------------------------------------------


def _binner(source: str) -> UsageMapping:
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {sorted(SOURCES)}")
    return SOURCES[source].usage


def _binned(binner: UsageMapping, raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    bins, counts = binner.bins(raw)
    return bins.select([pl.col(c).cast(t) for c, t in BINNED.items()]), counts


def _in_range(t: pl.Expr, lo: int | None, hi: int | None) -> pl.Expr:
    """lo <= t < hi; an open lower end (None) also takes null times, so every row is in exactly one range."""
    if lo is None:
        return pl.lit(True) if hi is None else t.is_null() | (t < hi)
    return t >= lo if hi is None else (t >= lo) & (t < hi)


def _bin_counts(source: str, usage: pl.DataFrame) -> pl.DataFrame:
    n_filled = int(usage["is_filled"].sum())
    return pl.DataFrame(
        {"source": [source] * 2, "count": ["bins_out", "bins_filled"], "n": [usage.height, n_filled]},
        schema=USAGE_COUNTS,
    )


def scan_usage(
    source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Lazy one-pass plans of (USAGE table, USAGE_COUNTS of the rows and workloads) over all the data.

    The group-by holds every output bin (memory grows with the data): the reference that iter_usage_chunks
    reproduces chunk by chunk; use it for small data only.
    """
    binner = _binner(source)
    if binner.needed is not None and binner.needed not in raw:
        return empty_frame(USAGE).lazy(), empty_frame(USAGE_COUNTS).lazy()
    bins, counts = _binned(binner, raw)
    if binner.workload_counts is not None:
        counts = pl.concat([counts, binner.workload_counts(raw, bins.select("workload_id").unique())])
    usage = fill_gaps(bins, cfg).select([pl.col(c).cast(t) for c, t in USAGE.items()])
    return (usage.sort("workload_id", "bin_start_s") if cfg.sort_rows else usage), counts


def usage_chunk_bounds(source: str, raw: dict[str, pl.LazyFrame], chunk_s: int) -> list[int]:
    """Upper ends (trace seconds, multiples of `chunk_s`) of the time chunks [k*chunk_s, (k+1)*chunk_s) that
    hold usage rows, ascending. One streaming pass over the time column(s) only."""
    binner = _binner(source)
    parts = [
        raw[table].select((t // (chunk_s * unit)).cast(pl.Int64).alias("k"))
        for table, (t, unit) in binner.times.items()
        if table in raw
    ]
    if not parts:
        return []
    ks = pl.concat(parts).drop_nulls().unique().collect(engine="streaming")["k"].sort()
    return [(k + 1) * chunk_s for k in ks.to_list()]


def _restrict(binner: UsageMapping, raw: dict[str, pl.LazyFrame], lo: int | None, hi: int | None) -> dict:
    """`raw` with its usage table(s) cut to the rows whose bin lies in [lo, hi) (seconds)."""
    out = dict(raw)
    for table, (t, unit) in binner.times.items():
        if table in raw:
            lo_t, hi_t = (None if x is None else x * unit for x in (lo, hi))
            out[table] = raw[table].filter(_in_range(t, lo_t, hi_t))
    return out


def _shift(x: int | None, d: int) -> int | None:
    return None if x is None else x - d


def iter_usage_chunks(
    source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig(), chunk_s: int = 6 * 3600
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """The USAGE table of `source` in pieces: yields (USAGE rows, USAGE_COUNTS rows) per chunk of trace time.

    Chunk j holds exactly the bins in [b_(j-1) - D, b_j - D), where b_j are the ends of the non-empty
    `chunk_s` chunks (`usage_chunk_bounds`; the first range open below, the last open above) and
    D = max_fill_bins * 300 s when gaps are filled (else 0): a filled bin depends on the observed bins up to
    max_fill_bins away on both sides, so a chunk is emitted once the raw rows up to b_j have been read.
    Between chunks only the observed bins of the last 2 * max_fill_bins bins are carried (per workload).
    Concatenated, the chunks are the one-pass `scan_usage` table; summed per `count`, the counts are its
    counts (a per-workload count goes to the chunk where the workload first has usage).

    Each chunk reads the raw rows of one time range (a filter on the raw time column: Parquet row-group
    statistics skip the rest when the files are in time order, as Google's shards are), so memory follows
    `chunk_s`, not the trace length. Yields at least one chunk (maybe empty). Alibaba's container_usage is in
    container order, so there no row group can be skipped and every chunk scans the usage columns of the whole
    table: use a larger `chunk_s` (e.g. a day) to make fewer passes.
    """
    if chunk_s <= 0 or chunk_s % BIN_SECONDS:
        raise ValueError(f"chunk_s={chunk_s} must be a positive multiple of {BIN_SECONDS}")
    binner = _binner(source)
    if binner.needed is not None and binner.needed not in raw:
        yield empty_frame(USAGE), _bin_counts(source, empty_frame(USAGE))
        return
    raw = {k: v.collect().lazy() if k in binner.small_tables else v for k, v in raw.items()}
    ends = usage_chunk_bounds(source, raw, chunk_s)
    reads = list(zip([None, *ends[:-1]], [*ends[:-1], None], strict=True)) if ends else [(None, None)]
    fills = cfg.fill_policy != "none" and cfg.max_fill_bins > 0
    d = cfg.max_fill_bins * BIN_SECONDS if fills else 0
    tail, seen = empty_frame(BINNED), empty_frame({"workload_id": pl.String})
    for lo, hi in reads:
        bins_lf, counts_lf = _binned(binner, _restrict(binner, raw, lo, hi))
        bins, counts = pl.collect_all([bins_lf, counts_lf], engine="streaming")
        if binner.workload_counts is not None:
            new = bins.select("workload_id").unique().join(seen, on="workload_id", how="anti")
            counts = pl.concat([counts, binner.workload_counts(raw, new.lazy()).collect()])
            seen = pl.concat([seen, new])
        observed = pl.concat([tail, bins]) if tail.height else bins
        usage = (
            fill_gaps(observed.lazy(), cfg)
            .filter(_in_range(pl.col("bin_start_s"), _shift(lo, d), _shift(hi, d)))
            .select([pl.col(c).cast(t) for c, t in USAGE.items()])
            .collect()
        )
        if cfg.sort_rows:
            usage = usage.sort("workload_id", "bin_start_s")
        if fills and hi is not None:  # observed bins that later chunks' fills may need
            tail = observed.filter(pl.col("bin_start_s") >= hi - 2 * d)
        yield usage, pl.concat([counts.cast(USAGE_COUNTS), _bin_counts(source, usage)])


def build_usage_with_report(
    source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig(), chunk_s: int = 6 * 3600
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(USAGE table, USAGE_COUNTS: rows in, dropped per reason, workloads without meta, bins out and filled).

    All chunks of iter_usage_chunks in one frame: for data that fits in memory (tests, samples)."""
    parts = list(iter_usage_chunks(source, raw, cfg, chunk_s))
    usage = pl.concat([u for u, _ in parts])
    if cfg.sort_rows:
        usage = usage.sort("workload_id", "bin_start_s")
    counts = (
        pl.concat([c for _, c in parts])
        .group_by("source", "count", maintain_order=True)
        .agg(pl.col("n").sum())
    )
    return check_schema(usage, USAGE, f"{source} usage"), counts.cast(USAGE_COUNTS)


def build_usage(source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig()) -> pl.DataFrame:
    """The USAGE table of `source` (see the module docstring); use build_usage_with_report to get the counts."""
    return build_usage_with_report(source, raw, cfg)[0]
