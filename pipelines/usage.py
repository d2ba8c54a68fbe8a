"""The canonical `usage` table: per workload, CPU and memory per 5-minute bin, as fractions of a machine.

`build_usage(source, raw, cfg)` turns one source's raw tables into `pipelines.schemas.USAGE`;
`build_usage_with_report` also returns the row counts (in, dropped by reason, out, filled) and `scan_usage` gives
both as lazy plans (for `sink_parquet` at full Google scale: ~1.2 billion task_usage rows; nothing here loops
over rows or workloads in Python). Bins: `bin_start_s = floor(t / 300) * 300` in the source's trace time. Rows come in no particular order
unless `UsageConfig.sort_rows`.

Memory: the (workload, bin) group-by holds one entry per output bin (~3.8 GB peak RSS at 20 M bins), so at full
Google scale run it per time chunk: filter task_usage on `start_time_us` to ranges whose bounds are multiples of
300 s (a record's bin depends only on its start, so chunks never share a bin) and write each chunk's usage;
gap filling then needs a pass of its own over the assembled table (`fill_gaps`).

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
    per_workload = pct_bins.select("workload_id").unique().join(scale, on="workload_id", how="left")
    meta_counts = per_workload.select(
        pl.col("cpu_scale").is_null().sum().alias("workloads_without_meta"),
        pl.col("is_default_cpu_num").fill_null(False).sum().alias("workloads_default_cpu_num"),
    ).unpivot(variable_name="count", value_name="n")
    counts = pl.concat(
        [
            _count_reasons(rows, "alibaba2018"),
            meta_counts.select(pl.lit("alibaba2018").alias("source"), "count", pl.col("n").cast(pl.Int64)),
        ]
    )
    return bins, counts


# google2011_derived ----------------------------------------------------------------------------------------


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
        day_offset = (pl.col("day_index").cast(pl.Int64) - 1) * 86_400
        parts.append(
            raw["job_days"].select(
                pl.format("{}_d{}", "job_id", "day_index").alias("workload_id"),
                (day_offset + pl.col("step").cast(pl.Int64) * BIN_SECONDS).alias("bin_start_s"),
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


USAGE_BINNERS = {
    "google2011": (_google_bins, "task_usage"),
    "alibaba2018": (_alibaba_bins, "container_usage"),
    "google2011_derived": (_derived_bins, None),
}
"""source -> (raw tables -> (binned usage, counts), the raw table it needs; None: works with what is there)."""


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


def scan_usage(
    source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Lazy plans of (USAGE table, in no particular order unless `cfg.sort_rows`; USAGE_COUNTS of `source`)."""
    if source not in USAGE_BINNERS:
        raise ValueError(f"unknown source {source!r}; known: {sorted(USAGE_BINNERS)}")
    binner, needed = USAGE_BINNERS[source]
    if needed is not None and needed not in raw:
        return empty_frame(USAGE).lazy(), empty_frame(USAGE_COUNTS).lazy()
    bins, counts = binner(raw)
    bins = bins.select([pl.col(c).cast(t) for c, t in _BINNED.items()])
    usage = fill_gaps(bins, cfg).select([pl.col(c).cast(t) for c, t in USAGE.items()])
    return (usage.sort("workload_id", "bin_start_s") if cfg.sort_rows else usage), counts


def build_usage_with_report(
    source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig()
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(USAGE table, USAGE_COUNTS: rows in, dropped per reason, workloads without meta, bins out and filled)."""
    usage_lf, counts_lf = scan_usage(source, raw, cfg)
    usage, counts = pl.collect_all([usage_lf, counts_lf], engine="streaming")
    out = pl.DataFrame(
        {
            "source": [source, source],
            "count": ["bins_out", "bins_filled"],
            "n": [usage.height, int(usage["is_filled"].sum())],
        },
        schema=USAGE_COUNTS,
    )
    return check_schema(usage, USAGE, f"{source} usage"), pl.concat([counts.cast(USAGE_COUNTS), out])


def build_usage(source: str, raw: dict[str, pl.LazyFrame], cfg: UsageConfig = UsageConfig()) -> pl.DataFrame:
    """The USAGE table of `source` (see the module docstring); use build_usage_with_report to get the counts."""
    return build_usage_with_report(source, raw, cfg)[0]
