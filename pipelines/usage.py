"""The canonical `usage` table: per workload, CPU and memory per 5-minute bin, as fractions of a machine.

What is common to every source lives here: the chunk driver, gap filling, counts and checks. How a source's raw
rows become bins (which rows, which fractions, which weights) is the source's own `UsageMapping`
(`pipelines.sources.<name>`, its module docstring states the rules); nothing here branches on a source's name.

`iter_usage_chunks(source, raw, cfg)` yields the USAGE table of one source in pieces, each with its USAGE_COUNTS
rows (rows in, dropped by reason, per-source workload counts, bins out and filled); write each piece as it comes
(full Google: ~1.2 billion task_usage rows, about as many output bins). How the pieces are cut follows how the
source stores its raw usage (`UsageMapping.chunking`): slices of trace time for time-ordered raw files (Google's
shards), ranges of workload keys for raw files sorted by workload (Alibaba's container_usage). Either way a piece
filters the raw usage on the column it is sorted by, so Parquet row-group statistics skip the other rows, the
whole build reads the raw usage about once, and memory follows the chunk size, not the trace length.
`build_usage` / `build_usage_with_report` concatenate the pieces (small data, tests); `scan_usage` is the
one-pass lazy plan the pieces reproduce exactly (its group-by holds every output bin: ~3.8 GB at 20 M bins).
Bins: `bin_start_s = floor(t / 300) * 300` in the source's trace time. Rows come in no particular order
unless `UsageConfig.sort_rows` (then sorted within each piece).

Validity: a value outside its column's valid range, NaN or infinite never reaches a raw table (the source quarantines
its line at ingest, `pipelines.sources.base.CsvTable.ranges`). A raw row whose CPU or memory value is null, NaN,
infinite or negative (or a reason of the source's own, such as
Google's window ending before it starts) is dropped and counted under `rows_dropped_<reason>` (first matching
reason, `pipelines.sources.mapping.BAD_ROW_REASONS`). Nothing is dropped silently.

Scale: every source maps to fractions of one machine (1.0 = the source's reference machine, its docstring
says which). A bin above 1.0 (a job totalled over many machines, memory over-committed, a VM larger than the
reference machine) is not dropped: `count_bins_above_one_machine` counts such bins per resource for the
`usage_within_one_machine` check (a warning); the job-sequence builder scales each source's usage to machine
units (`pipelines.job_sequences`, a per-source quantile), and the simulator clips what still exceeds a machine
and counts it (`SimConfig.oversize="clip"`).

Gaps: a bin without samples is absent unless `UsageConfig.fill_policy` is "hold" (repeat the last value before
the gap) or "linear" (interpolate between the bins around the gap) AND the gap is at most `max_fill_bins` bins;
such rows have `is_filled = True`, `n_samples = 0` and are counted (`bins_filled`). Longer gaps stay gaps, and
nothing is filled before the first or after the last bin of a workload. A fill only copies (or interpolates between)
bins whose values are finite and non-negative: a gap next to any other value stays a gap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb
import polars as pl

from pipelines.progress import Progress
from pipelines.schemas import BIN_SECONDS, USAGE, USAGE_COUNTS, check_schema, empty_frame
from pipelines.sources import SOURCES
from pipelines.sources.mapping import BAD_ROW_REASONS, BINNED, TimeChunks, UsageMapping, WorkloadChunks

__all__ = [
    "BAD_ROW_REASONS",
    "FILL_POLICIES",
    "USAGE_COUNTS",
    "UsageConfig",
    "UsageRunSettings",
    "above_one_machine_line",
    "build_usage",
    "build_usage_with_report",
    "check_usage_files",
    "check_usage_invariants",
    "count_bins_above_one_machine",
    "fill_gaps",
    "iter_usage_chunks",
    "scan_usage",
    "sum_counts",
    "usage_chunk_bounds",
    "workload_chunk_bounds",
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


@dataclass(frozen=True)
class UsageRunSettings:
    """Settings of one source's usage build (`core__usage`): its gap filling and how its raw usage is chunked."""

    usage: UsageConfig = UsageConfig()
    """Gap filling of every source without an entry in `usage_by_source`."""
    usage_by_source: dict[str, UsageConfig] = field(default_factory=dict)
    """Per source: its own gap filling, in place of `usage` (e.g. bitbrains: linear over gaps of up to 2 bins,
    since a VM's monitor misses single 5-min samples)."""
    chunk_hours: dict[str, int] = field(default_factory=dict)
    """Per source: stream the build in time chunks of this many hours of trace time instead of the source's own
    chunking (`UsageMapping.chunking`: time chunks for time-ordered raw usage such as Google's shards, container
    ranges for Alibaba's container-sorted container_usage)."""
    chunk_rows: dict[str, int] = field(default_factory=dict)
    """Per source: stream the build in workload-key ranges of about this many raw rows (only for a source whose
    raw usage is sorted by workload, e.g. alibaba2018)."""

    def for_source(self, source: str) -> UsageConfig:
        """The gap filling of `source`: its `usage_by_source` entry, else `usage`."""
        return self.usage_by_source.get(source, self.usage)

    def chunking(self, source: str) -> dict[str, int | None]:
        """`chunk_s` and `chunk_rows` of `source` for `iter_usage_chunks` (None: the source's own chunking)."""
        hours = self.chunk_hours.get(source)
        return {"chunk_s": None if hours is None else hours * 3600, "chunk_rows": self.chunk_rows.get(source)}


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

    # the bins a fill reads: the one before the gap, and for "linear" the one after it too
    sources = ["cpu_frac", "mem_frac"] + (
        ["next_cpu_frac", "next_mem_frac"] if cfg.fill_policy == "linear" else []
    )
    usable = pl.all_horizontal([pl.col(c).is_finite() & (pl.col(c) >= 0) for c in sources]).fill_null(False)
    fills = (
        s.with_columns(gap, *(e.alias(f"next_{c}") for c, e in nxt.items() if c != "bin_start_s"))
        .filter(pl.col("gap").is_between(1, cfg.max_fill_bins) & usable)
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


def workload_chunk_bounds(source: str, raw: dict[str, pl.LazyFrame], chunk_rows: int) -> list:
    """Lower ends (workload keys, ascending) of the workload-key ranges after the first: consecutive keys are
    grouped so that a range holds about `chunk_rows` raw usage rows (a key with more rows gets a range of its
    own). One streaming pass over the key column(s) only; memory: one row per workload."""
    keys = _chunking(source, _binner(source), None, chunk_rows).keys
    parts = [raw[table].select(key.alias("key")) for table, key in keys.items() if table in raw]
    if not parts:
        return []
    per_key = (
        pl.concat(parts)
        .group_by("key")
        .agg(pl.len().alias("n"))
        .collect(engine="streaming")
        .drop_nulls("key")
    )
    per_key = per_key.sort("key")
    slot = (per_key["n"].cum_sum() - per_key["n"]) // chunk_rows  # which chunk_rows-slice a key starts in
    first = slot != slot.shift(1, fill_value=slot[0] if len(slot) else 0)
    return per_key.filter(first)["key"].to_list()


def _chunking(
    source: str, binner: UsageMapping, chunk_s: int | None, chunk_rows: int | None
) -> TimeChunks | WorkloadChunks:
    """The chunking asked for: time chunks of `chunk_s`, workload chunks of `chunk_rows`, else the source's."""
    if chunk_s is not None and chunk_rows is not None:
        raise ValueError(f"chunk_s={chunk_s} and chunk_rows={chunk_rows}: give one (time or workload chunks)")
    if chunk_s is not None:
        return TimeChunks(chunk_s)
    if chunk_rows is not None:
        if not isinstance(binner.chunking, WorkloadChunks):
            raise ValueError(f"{source}: its raw usage declares no workload key; chunk it by time (chunk_s)")
        return WorkloadChunks(binner.chunking.keys, chunk_rows)
    return binner.chunking


def _restrict(binner: UsageMapping, raw: dict[str, pl.LazyFrame], lo: int | None, hi: int | None) -> dict:
    """`raw` with its usage table(s) cut to the rows whose bin lies in [lo, hi) (seconds)."""
    out = dict(raw)
    for table, (t, unit) in binner.times.items():
        if table in raw:
            lo_t, hi_t = (None if x is None else x * unit for x in (lo, hi))
            out[table] = raw[table].filter(_in_range(t, lo_t, hi_t))
    return out


def _restrict_keys(keys: dict[str, pl.Expr], raw: dict[str, pl.LazyFrame], lo, hi) -> dict:
    """`raw` with its usage table(s) cut to the rows whose workload key lies in [lo, hi)."""
    return {t: lf.filter(_in_range(keys[t], lo, hi)) if t in keys else lf for t, lf in raw.items()}


def _shift(x: int | None, d: int) -> int | None:
    return None if x is None else x - d


def _ranges(ends: list) -> list[tuple]:
    """Ascending inner bounds -> [(None, b1), (b1, b2), ..., (bn, None)] (one open range when there are none)."""
    return list(zip([None, *ends], [*ends, None], strict=True))


class _ChunkReader:
    """Bins one restricted slice of the raw tables; adds the per-workload counts of workloads seen first."""

    def __init__(self, binner: UsageMapping, raw: dict[str, pl.LazyFrame]):
        self.binner, self.raw = binner, raw
        self.seen = empty_frame({"workload_id": pl.String})

    def read(self, part: dict[str, pl.LazyFrame]) -> tuple[pl.DataFrame, pl.DataFrame]:
        bins_lf, counts_lf = _binned(self.binner, part)
        bins, counts = pl.collect_all([bins_lf, counts_lf], engine="streaming")
        if self.binner.workload_counts is not None:
            new = bins.select("workload_id").unique().join(self.seen, on="workload_id", how="anti")
            counts = pl.concat([counts, self.binner.workload_counts(self.raw, new.lazy()).collect()])
            self.seen = pl.concat([self.seen, new])
        return bins, counts


def _finish(source: str, usage: pl.LazyFrame, counts: pl.DataFrame, cfg: UsageConfig):
    out = usage.select([pl.col(c).cast(t) for c, t in USAGE.items()]).collect()
    if cfg.sort_rows:
        out = out.sort("workload_id", "bin_start_s")
    return out, pl.concat([counts.cast(USAGE_COUNTS), _bin_counts(source, out)])


def _time_chunks(source, binner, raw, cfg, chunk_s, progress_log):
    ends = usage_chunk_bounds(source, raw, chunk_s)
    reads = _ranges(ends[:-1]) if ends else [(None, None)]
    progress = Progress(len(reads), f"{source} usage ({chunk_s / 3600:g} h time chunks)", progress_log,
                        unit="chunks")  # fmt: skip
    reader = _ChunkReader(binner, raw)
    fills = cfg.fill_policy != "none" and cfg.max_fill_bins > 0
    d = cfg.max_fill_bins * BIN_SECONDS if fills else 0
    tail = empty_frame(BINNED)
    for lo, hi in reads:
        bins, counts = reader.read(_restrict(binner, raw, lo, hi))
        observed = pl.concat([tail, bins]) if tail.height else bins
        usage = fill_gaps(observed.lazy(), cfg).filter(
            _in_range(pl.col("bin_start_s"), _shift(lo, d), _shift(hi, d))
        )
        if fills and hi is not None:  # observed bins that later chunks' fills may need
            tail = observed.filter(pl.col("bin_start_s") >= hi - 2 * d)
        out = _finish(source, usage, counts, cfg)
        progress.advance()
        yield out


def _workload_chunks(source, binner, raw, cfg, chunking: WorkloadChunks, progress_log):
    reads = _ranges(workload_chunk_bounds(source, raw, chunking.rows))
    progress = Progress(len(reads), f"{source} usage (workload chunks of ~{chunking.rows:,} rows)",
                        progress_log, unit="chunks")  # fmt: skip
    reader = _ChunkReader(binner, raw)
    for lo, hi in reads:
        bins, counts = reader.read(_restrict_keys(chunking.keys, raw, lo, hi))
        out = _finish(source, fill_gaps(bins.lazy(), cfg), counts, cfg)
        progress.advance()
        yield out


def iter_usage_chunks(
    source: str,
    raw: dict[str, pl.LazyFrame],
    cfg: UsageConfig = UsageConfig(),
    chunk_s: int | None = None,
    chunk_rows: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """The USAGE table of `source` in pieces: yields (USAGE rows, USAGE_COUNTS rows) per chunk.

    How the pieces are cut follows how the source stores its raw usage (`UsageMapping.chunking`), unless
    `chunk_s` (time chunks of that many seconds) or `chunk_rows` (workload chunks of about that many raw rows)
    is given. Concatenated, the chunks are the one-pass `scan_usage` table; summed per `count`, the counts are
    its counts (a per-workload count goes to the first chunk where the workload has usage). Yields at least one
    chunk (maybe empty). `log` gets a progress line (chunks done / total, rate, time left) now and then.

    Time chunks (raw usage in time order, as Google's shards): chunk j holds exactly the bins in
    [b_(j-1) - D, b_j - D), where b_j are the ends of the non-empty `chunk_s` chunks (`usage_chunk_bounds`; the
    first range open below, the last open above) and D = max_fill_bins * 300 s when gaps are filled (else 0): a
    filled bin depends on the observed bins up to max_fill_bins away on both sides, so a chunk is emitted once the
    raw rows up to b_j have been read. Between chunks only the observed bins of the last 2 * max_fill_bins bins
    are carried (per workload). Each chunk filters the raw time column, so Parquet row-group statistics skip the
    rest and memory follows `chunk_s`, not the trace length. On raw usage in workload order every time chunk
    would scan the whole table.

    Workload chunks (raw usage sorted by workload key, as Alibaba's container_usage): chunk j holds every bin of
    the workloads whose key lies in [k_(j-1), k_j) (`workload_chunk_bounds`: ranges of about `chunk_rows` raw
    rows; null keys in the first range). Each chunk filters the raw key column, so row-group statistics skip
    the rest: the build reads each raw row once and memory follows `chunk_rows`. Gaps are filled within the
    chunk (a workload never spans two).
    """
    binner = _binner(source)
    chunking = _chunking(source, binner, chunk_s, chunk_rows)
    if binner.needed is not None and binner.needed not in raw:
        yield empty_frame(USAGE), _bin_counts(source, empty_frame(USAGE))
        return
    raw = {k: v.collect().lazy() if k in binner.small_tables else v for k, v in raw.items()}
    if isinstance(chunking, WorkloadChunks):
        yield from _workload_chunks(source, binner, raw, cfg, chunking, log)
    else:
        yield from _time_chunks(source, binner, raw, cfg, chunking.seconds, log)


def build_usage_with_report(
    source: str,
    raw: dict[str, pl.LazyFrame],
    cfg: UsageConfig = UsageConfig(),
    chunk_s: int | None = None,
    chunk_rows: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(USAGE table, USAGE_COUNTS: rows in, dropped per reason, workloads without meta, bins out and filled).

    All chunks of iter_usage_chunks in one frame: for data that fits in memory (tests, samples)."""
    parts = list(iter_usage_chunks(source, raw, cfg, chunk_s, chunk_rows))
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


# ---------------------------------------------------------------- values above one machine

ABOVE_ONE_MACHINE_COUNTS = (
    "n_bins",
    "n_cpu_bins_above_one_machine",
    "n_mem_bins_above_one_machine",
    "n_workloads_above_one_machine",
)
"""Keys of `count_bins_above_one_machine` besides the maxima (`max_cpu_frac`, `max_mem_frac`)."""


def count_bins_above_one_machine(usage: pl.LazyFrame | Sequence[Path]) -> dict[str, int | float]:
    """Bins whose CPU or memory is above one machine (`cpu_frac > 1`, `mem_frac > 1`), counted per resource,
    the workloads with at least one such bin, all bins, and the largest `cpu_frac` / `mem_frac` (0.0 when
    there are no bins). `usage` is a USAGE frame or its Parquet files (scanned, streamed). Such bins are kept
    in `core__usage` (they may be real: a job's total over many machines); downstream the job-sequence builder
    scales each source to machine units and the simulator clips and counts what still exceeds a machine."""
    if not isinstance(usage, pl.LazyFrame) and not usage:
        usage = empty_frame(USAGE).lazy()
    lf = usage if isinstance(usage, pl.LazyFrame) else pl.scan_parquet([str(f) for f in usage])
    over_cpu, over_mem = pl.col("cpu_frac") > 1.0, pl.col("mem_frac") > 1.0
    row = (
        lf.select(
            pl.len().alias("n_bins"),
            over_cpu.sum().alias("n_cpu_bins_above_one_machine"),
            over_mem.sum().alias("n_mem_bins_above_one_machine"),
            pl.col("workload_id")
            .filter(over_cpu | over_mem)
            .n_unique()
            .alias("n_workloads_above_one_machine"),
            pl.col("cpu_frac").max().alias("max_cpu_frac"),
            pl.col("mem_frac").max().alias("max_mem_frac"),
        )
        .collect()
        .row(0, named=True)
    )
    return {k: (float(v or 0.0) if k.startswith("max_") else int(v or 0)) for k, v in row.items()}


def above_one_machine_line(source: str, above: dict[str, int | float]) -> str:
    """The log line of `count_bins_above_one_machine`'s counts for one source."""
    return (
        f"{source}: {above['n_cpu_bins_above_one_machine']} bins above one machine of CPU "
        f"(max cpu_frac {above['max_cpu_frac']:.3g}), {above['n_mem_bins_above_one_machine']} of memory "
        f"(max mem_frac {above['max_mem_frac']:.3g}), in {above['n_workloads_above_one_machine']} workload(s), "
        f"of {above['n_bins']} bins; kept (scaled per source for job sequences, clipped by the simulator)"
    )


# ---------------------------------------------------------------- the USAGE contract

USAGE_INVARIANTS_SQL = """
select
    count(*) filter (where bin_start_s % {bin_s} <> 0)                       as n_off_grid,
    count(*) filter (where not (isfinite(cpu_frac) and isfinite(mem_frac)
                                and cpu_frac >= 0 and mem_frac >= 0))        as n_bad_values,
    count(*) filter (where is_filled and n_samples <> 0)                     as n_filled_with_samples,
    count(*) - count(distinct (workload_id, bin_start_s))                    as n_duplicate_bins
from read_parquet({files})
"""


def check_usage_invariants(files: list[Path]) -> dict[str, int]:
    """Counts of rows that break the USAGE contract (bins off the 5-minute grid, non-finite or negative
    fractions, filled bins with samples, duplicate bins), computed by DuckDB over the files (streaming)."""
    listed = "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"
    con = duckdb.connect()
    try:
        row = con.sql(USAGE_INVARIANTS_SQL.format(bin_s=BIN_SECONDS, files=listed)).fetchall()[0]
    finally:
        con.close()
    return dict(
        zip(("n_off_grid", "n_bad_values", "n_filled_with_samples", "n_duplicate_bins"), row, strict=True)
    )


USAGE_CHECK_DOCS = {
    "usage_contract": "ERROR, blocking: bins on the 5-minute grid, one per workload, finite non-negative "
    "fractions, filled bins carry no samples (metadata also counts the bins above one machine)",
    "usage_within_one_machine": "warns when bins use more than one machine (cpu_frac or mem_frac > 1), counted "
    "per resource; such bins are kept (job sequences scale each source, the simulator clips the rest)",
}
"""The checks of `check_usage_files`: name -> what passing means."""


def check_usage_files(files: list[Path]) -> dict[str, dict]:
    """`passed` and `metadata` of the two checks of a source's usage files: `usage_contract` (no row breaks the
    USAGE contract; its metadata also counts the bins above one machine) and `usage_within_one_machine` (no bin
    above one machine, `count_bins_above_one_machine`)."""
    broken, above = check_usage_invariants(files), count_bins_above_one_machine(files)
    n_above = above["n_cpu_bins_above_one_machine"] + above["n_mem_bins_above_one_machine"]
    return {
        "usage_contract": {"passed": not any(broken.values()), "metadata": {**broken, **above}},
        "usage_within_one_machine": {"passed": n_above == 0, "metadata": above},
    }


def sum_counts(counts: list[pl.DataFrame]) -> dict[str, int]:
    """The USAGE_COUNTS rows of every chunk summed per `count` (rows_in, rows_dropped_<reason>, bins_out, ...)."""
    if not counts:
        return {}
    totals = pl.concat(counts).group_by("count", maintain_order=True).agg(pl.col("n").sum())
    return {k: int(v) for k, v in totals.iter_rows()}
