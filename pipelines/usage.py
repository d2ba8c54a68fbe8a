"""The canonical `usage` table: per workload, CPU and memory per 5-minute bin, as fractions of a machine.

`iter_usage_chunks(source, raw, cfg, chunk_s)` yields the USAGE table of one source in pieces of trace time,
each with its USAGE_COUNTS rows (rows in, dropped by reason, workloads without meta, bins out and filled); write
each piece as it comes (full Google: ~1.2 billion task_usage rows, about as many output bins). Each piece
filters the raw usage table on its time column, so Parquet row-group statistics skip the other rows when the
files are in time order (Google's shards are) and memory follows `chunk_s`, not the trace length.
`build_usage` / `build_usage_with_report` concatenate the pieces (small data, tests); `scan_usage` is the
one-pass lazy plan the pieces reproduce exactly (its group-by holds every output bin: ~3.8 GB at 20 M bins).
Bins: `bin_start_s = floor(t / 300) * 300` in the source's trace time. Rows come in no particular order
unless `UsageConfig.sort_rows` (then sorted within each piece).

Validity: a raw row whose CPU or memory value is null, NaN or negative (or, Google, whose window ends before it
starts) is dropped and counted under `rows_dropped_<reason>` (first matching reason in that order). Nothing is
dropped silently.

google2011: t = window start (µs / 1e6). `cpu_frac = cpu_rate_frac`, `mem_frac = canonical_mem_frac` (both
  already rescaled so the largest machine = 1.0, i.e. fractions of the largest machine). Several windows in one
  bin -> time-weighted mean, weight = window length (end - start); when every window of the bin has length 0,
  the plain mean. `n_samples` = windows in the bin.
alibaba2018: t = sample time; the samples (irregular, on a 10 s grid) of a bin are averaged with equal weights,
  `n_samples` = samples in the bin. cpu_util_pct is read as percent of the container's own cpu_request
  (100 = one core): `cpu_frac = cpu_util_pct/100 * cpu_request_centicores/100 / cpu_num` (cpu_num of the
  container's machine from machine_meta; 96 when the machine is unknown, counted as
  `workloads_default_cpu_num`); mem_util_pct as percent of the container's mem_size_pct:
  `mem_frac = mem_util_pct/100 * mem_size_pct/100`. JUDGEMENT CALL: a container without container_meta (or
  with no request recorded) is kept and its percentages are read as percent of the machine
  (`cpu_util_pct/100`, `mem_util_pct/100`), counted as `workloads_without_meta`. Rows with an empty
  container_id belong to no workload: `rows_dropped_no_workload_id`.
google2011_derived: job_sums rows -> workload `"job<job_id>"`, t = time_s, per-task means
  `cpu_frac = cpu_rate_sum_frac / n_tasks`, `mem_frac = canonical_mem_sum_frac / n_tasks` (a row with
  n_tasks <= 0 has no mean: counted as null usage); job_days rows -> workload `"<job_id>_d<k>"`,
  `bin_start_s = (k - 1) * 86400 + step * 300` (bins unique per workload), `cpu_frac = cpu_pct / 100`,
  `mem_frac = mem_pct / 100`.

Gaps: a bin without samples is absent unless `UsageConfig.fill_policy` is "hold" (repeat the last value before
the gap) or "linear" (interpolate between the bins around the gap) AND the gap is at most `max_fill_bins` bins;
such rows have `is_filled = True`, `n_samples = 0` and are counted (`bins_filled`). Longer gaps stay gaps, and
nothing is filled before the first or after the last bin of a workload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipelines.schemas import BIN_SECONDS, USAGE, check_schema, empty_frame
from pipelines.workloads import (
    ALIBABA_DEFAULT_CPU_NUM,
    US_PER_S,
    alibaba_container_meta,
    google_workload_id,
)

FILL_POLICIES = ("none", "hold", "linear")
USAGE_COUNTS = {"source": pl.String, "count": pl.String, "n": pl.Int64}
"""Row/workload counts of one build_usage run: `count` names what is counted (rows_in, rows_dropped_<reason>,
workloads_without_meta, workloads_default_cpu_num, bins_out, bins_filled), `n` how many."""
BAD_ROW_REASONS = ("no_workload_id", "null_usage", "nan_usage", "negative_usage", "bad_window")

_BINNED = {
    "source": pl.String,
    "workload_id": pl.String,
    "bin_start_s": pl.Int64,
    "cpu_frac": pl.Float64,
    "mem_frac": pl.Float64,
    "n_samples": pl.Int32,
}


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


def _bad_reason(cpu: pl.Expr, mem: pl.Expr) -> pl.Expr:
    """First reason a usage row is unusable, null when it is fine."""
    return (
        pl.when(cpu.is_null() | mem.is_null())
        .then(pl.lit("null_usage"))
        .when(cpu.is_nan() | mem.is_nan())
        .then(pl.lit("nan_usage"))
        .when((cpu < 0) | (mem < 0))
        .then(pl.lit("negative_usage"))
    )


def _count_reasons(rows: pl.LazyFrame, source: str) -> pl.LazyFrame:
    """rows (with a nullable `bad_reason` column) -> USAGE_COUNTS rows: rows_in and rows_dropped_<reason>."""
    sums = [pl.len().alias("rows_in")] + [
        (pl.col("bad_reason") == r).sum().alias(f"rows_dropped_{r}") for r in BAD_ROW_REASONS
    ]
    return (
        rows.select(sums)
        .unpivot(variable_name="count", value_name="n")
        .select(pl.lit(source).alias("source"), "count", pl.col("n").cast(pl.Int64))
    )


def _mean_per_bin(rows: pl.LazyFrame, source: str) -> pl.LazyFrame:
    """Valid rows (workload_id, bin_start_s, cpu_frac, mem_frac) -> equal-weight mean per bin."""
    return (
        rows.group_by("workload_id", "bin_start_s")
        .agg(pl.col("cpu_frac").mean(), pl.col("mem_frac").mean(), pl.len().cast(pl.Int32).alias("n_samples"))
        .with_columns(pl.lit(source).alias("source"))
    )


# google2011 ------------------------------------------------------------------------------------------------


def _google_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    rows = raw["task_usage"].select(
        "job_id", "task_index", "start_time_us", "end_time_us",
        pl.col("cpu_rate_frac").alias("cpu"), pl.col("canonical_mem_frac").alias("mem"),
    )  # fmt: skip
    bad = _bad_reason(pl.col("cpu"), pl.col("mem"))
    bad = bad.when(pl.col("end_time_us") < pl.col("start_time_us")).then(pl.lit("bad_window"))
    rows = rows.with_columns(bad.alias("bad_reason"))
    weight = (pl.col("end_time_us") - pl.col("start_time_us")).cast(pl.Float64)

    def weighted(c: str) -> pl.Expr:
        return pl.when(pl.col("w") > 0).then(pl.col(f"{c}_w") / pl.col("w")).otherwise(pl.col(f"{c}_mean"))

    bins = (
        rows.filter(pl.col("bad_reason").is_null())
        .with_columns(
            (pl.col("start_time_us") // (BIN_SECONDS * US_PER_S) * BIN_SECONDS).alias("bin_start_s")
        )
        .group_by("job_id", "task_index", "bin_start_s")
        .agg(
            (weight * pl.col("cpu")).sum().alias("cpu_w"),
            (weight * pl.col("mem")).sum().alias("mem_w"),
            weight.sum().alias("w"),
            pl.col("cpu").mean().alias("cpu_mean"),
            pl.col("mem").mean().alias("mem_mean"),
            pl.len().cast(pl.Int32).alias("n_samples"),
        )
        .with_columns(
            pl.lit("google2011").alias("source"),
            google_workload_id(),
            weighted("cpu").alias("cpu_frac"),
            weighted("mem").alias("mem_frac"),
        )
    )
    return bins, _count_reasons(rows, "google2011")


# alibaba2018 -----------------------------------------------------------------------------------------------


def _alibaba_scale(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Per container with a request: factors from util percent to fractions of a machine."""
    meta = alibaba_container_meta(raw).filter(
        pl.col("cpu_request_centicores").is_not_null() & pl.col("mem_size_pct").is_not_null()
    )
    return meta.select(
        pl.col("container_id").alias("workload_id"),
        (pl.col("cpu_request_centicores") / 100 / pl.col("cpu_num").fill_null(ALIBABA_DEFAULT_CPU_NUM)).alias(
            "cpu_scale"
        ),
        (pl.col("mem_size_pct") / 100).alias("mem_scale"),
        pl.col("cpu_num").is_null().alias("is_default_cpu_num"),
    )


def _alibaba_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    no_id = pl.col("workload_id").is_null() | (pl.col("workload_id") == "")
    bad = pl.when(no_id).then(pl.lit("no_workload_id")).otherwise(_bad_reason(pl.col("cpu"), pl.col("mem")))
    rows = raw["container_usage"].select(
        pl.col("container_id").alias("workload_id"), "time_s",
        pl.col("cpu_util_pct").alias("cpu"), pl.col("mem_util_pct").alias("mem"),
    ).with_columns(bad.alias("bad_reason"))  # fmt: skip
    pct_bins = (
        rows.filter(pl.col("bad_reason").is_null())
        .select(
            "workload_id",
            (pl.col("time_s") // BIN_SECONDS * BIN_SECONDS).alias("bin_start_s"),
            pl.col("cpu").alias("cpu_frac"),
            pl.col("mem").alias("mem_frac"),
        )
        .pipe(_mean_per_bin, "alibaba2018")
    )
    scale = _alibaba_scale(raw)
    bins = pct_bins.join(scale, on="workload_id", how="left").with_columns(
        (pl.col("cpu_frac") / 100 * pl.col("cpu_scale").fill_null(1.0)),
        (pl.col("mem_frac") / 100 * pl.col("mem_scale").fill_null(1.0)),
    )
    return bins, _count_reasons(rows, "alibaba2018")


def _alibaba_workload_counts(raw: dict[str, pl.LazyFrame], ids: pl.LazyFrame) -> pl.LazyFrame:
    """USAGE_COUNTS of the workloads `ids` (one column workload_id, unique): without meta, default cpu_num."""
    per_workload = ids.join(_alibaba_scale(raw), on="workload_id", how="left")
    return (
        per_workload.select(
            pl.col("cpu_scale").is_null().sum().alias("workloads_without_meta"),
            pl.col("is_default_cpu_num").fill_null(False).sum().alias("workloads_default_cpu_num"),
        )
        .unpivot(variable_name="count", value_name="n")
        .select(pl.lit("alibaba2018").alias("source"), "count", pl.col("n").cast(pl.Int64))
    )


# google2011_derived ----------------------------------------------------------------------------------------


def _job_days_bin() -> pl.Expr:
    """bin_start_s of a job_days row: day k starts at (k - 1) days, one step per 5-minute bin."""
    return (pl.col("day_index").cast(pl.Int64) - 1) * 86_400 + pl.col("step").cast(pl.Int64) * BIN_SECONDS


def derived_usage_rows(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Raw rows of the derived Google tables as (workload_id, bin_start_s, cpu_frac, mem_frac), before checks."""
    parts = []
    if "job_sums" in raw:
        per_task = pl.when(pl.col("n_tasks") > 0).then(1.0 / pl.col("n_tasks"))
        parts.append(
            raw["job_sums"].select(
                pl.format("job{}", "job_id").alias("workload_id"),
                (pl.col("time_s") // BIN_SECONDS * BIN_SECONDS).cast(pl.Int64).alias("bin_start_s"),
                (pl.col("cpu_rate_sum_frac") * per_task).alias("cpu_frac"),
                (pl.col("canonical_mem_sum_frac") * per_task).alias("mem_frac"),
            )
        )
    if "job_days" in raw:
        parts.append(
            raw["job_days"].select(
                pl.format("{}_d{}", "job_id", "day_index").alias("workload_id"),
                _job_days_bin().alias("bin_start_s"),
                (pl.col("cpu_pct") / 100).alias("cpu_frac"),
                (pl.col("mem_pct") / 100).alias("mem_frac"),
            )
        )
    if not parts:
        return empty_frame(
            {
                "workload_id": pl.String,
                "bin_start_s": pl.Int64,
                "cpu_frac": pl.Float64,
                "mem_frac": pl.Float64,
            }
        ).lazy()
    return pl.concat(parts)


def _derived_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    rows = derived_usage_rows(raw).with_columns(
        _bad_reason(pl.col("cpu_frac"), pl.col("mem_frac")).alias("bad_reason")
    )
    bins = rows.filter(pl.col("bad_reason").is_null()).pipe(_mean_per_bin, "google2011_derived")
    return bins, _count_reasons(rows, "google2011_derived")


@dataclass(frozen=True)
class UsageBinner:
    """How one source's raw tables become binned usage."""

    bins: Callable[[dict[str, pl.LazyFrame]], tuple[pl.LazyFrame, pl.LazyFrame]]
    """raw tables -> (binned usage, USAGE_COUNTS of the rows read)."""
    needed: str | None
    """the raw table it cannot do without (None: works with whatever is there)."""
    times: dict[str, tuple[pl.Expr, int]]
    """usage table -> (expression of a row's time, its units per second); a row's bin is
    floor(time / units / 300) * 300, so a time range [lo, hi) in seconds selects whole bins when lo, hi are
    multiples of 300. Written on the raw column where possible so Parquet row-group statistics skip data."""
    small_tables: tuple[str, ...] = ()
    """tables read whole by every chunk (metadata): collected once by iter_usage_chunks."""
    workload_counts: Callable[[dict[str, pl.LazyFrame], pl.LazyFrame], pl.LazyFrame] | None = None
    """(raw tables, unique workload ids with usage) -> per-workload USAGE_COUNTS; None: there are none."""


USAGE_BINNERS = {
    "google2011": UsageBinner(
        _google_bins, "task_usage", {"task_usage": (pl.col("start_time_us"), US_PER_S)}
    ),
    "alibaba2018": UsageBinner(
        _alibaba_bins,
        "container_usage",
        {"container_usage": (pl.col("time_s"), 1)},
        small_tables=("container_meta", "machine_meta"),
        workload_counts=_alibaba_workload_counts,
    ),
    "google2011_derived": UsageBinner(
        _derived_bins, None, {"job_sums": (pl.col("time_s"), 1), "job_days": (_job_days_bin(), 1)}
    ),
}
"""source -> how its usage is binned."""


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


def _binner(source: str) -> UsageBinner:
    if source not in USAGE_BINNERS:
        raise ValueError(f"unknown source {source!r}; known: {sorted(USAGE_BINNERS)}")
    return USAGE_BINNERS[source]


def _binned(binner: UsageBinner, raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    bins, counts = binner.bins(raw)
    return bins.select([pl.col(c).cast(t) for c, t in _BINNED.items()]), counts


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


def _restrict(binner: UsageBinner, raw: dict[str, pl.LazyFrame], lo: int | None, hi: int | None) -> dict:
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
    tail, seen = empty_frame(_BINNED), empty_frame({"workload_id": pl.String})
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
