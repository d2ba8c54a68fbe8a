"""TVW-RL's long-running filter: keep whole, not-failed workloads with a long contiguous usage series.

TVW-RL ("Real Production Workload Traces"): discard workloads that were evicted, killed or failed, discard
partially recorded ones, and keep those with at least 6000 continuous 5-minute usage records (Google) or 2000
(Alibaba). Here:

* contiguous = consecutive 5-minute bins of the USAGE table (`bin_start_s` step of exactly 300 s); bins produced
  by gap filling (`is_filled`) count as present, so the fill policy of `pipelines.usage` decides how strict
  "continuous" is. The longest run is kept as the workload's window (`run_start_s`, `n_run_bins`; the earliest
  one on ties).
* each workload gets exactly one reason, first match in this order: `no_usage` (no bin at all),
  `bad_final_state` (final_state in `drop_states`), `partial` (is_partial and `drop_partial`), `too_short`
  (longest run < the source's `min_contiguous_bins`), else `kept`. The report lists all five reasons per source
  (zeros included) and their sum equals the number of workloads (checked).
* usage rows whose workload is not in `workloads` are ignored; if there are any, the report has one more row,
  reason `usage_without_workload`, counting those workload ids (outside the five reasons' sum).
* duplicate (workload_id, bin_start_s) rows are an error (build_usage never makes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipelines.schemas import BIN_SECONDS, LONG_RUNNING, LONG_RUNNING_REPORT, WORKLOADS, check_schema

REASONS = ("no_usage", "bad_final_state", "partial", "too_short", "kept")
"""Report reasons, in order of precedence."""
ORPHAN_REASON = "usage_without_workload"


def _default_min_bins() -> dict[str, int]:
    return {"google2011": 6000, "alibaba2018": 2000, "google2011_derived": 6000}


@dataclass(frozen=True)
class LongRunningConfig:
    """Thresholds of the long-running filter (defaults: TVW-RL's)."""

    min_contiguous_bins: dict[str, int] = field(default_factory=_default_min_bins)
    """source -> least number of consecutive 5-minute bins (TVW-RL: 6000 Google, 2000 Alibaba)."""
    drop_states: tuple[str, ...] = ("evicted", "killed", "failed", "lost")
    """final states that disqualify a workload (TVW-RL: evicted, killed, failed; lost is as bad)."""
    drop_partial: bool = True
    """drop partially recorded workloads (TVW-RL does)."""


def longest_runs(usage: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """Per (source, workload_id): the longest run of consecutive bins -> run_start_s, n_run_bins, n_dup_bins.

    Without a global sort: within a workload, `bin_start_s / 300 - dense_rank(bin_start_s)` is constant exactly
    along a run of consecutive bins, so grouping by it gives the runs (a duplicated bin shares its rank and shows
    up as len > n_unique).
    """
    key = ["source", "workload_id"]
    b = pl.col("bin_start_s")
    runs = (
        usage.lazy()
        .select(*key, "bin_start_s")
        .with_columns((b // BIN_SECONDS - b.rank("dense").over(key).cast(pl.Int64)).alias("run_key"))
        .group_by(*key, "run_key")
        .agg(
            b.min().alias("run_start_s"),
            b.n_unique().cast(pl.Int64).alias("n_run_bins"),
            (pl.len() - b.n_unique()).alias("n_dup_bins"),
        )
    )
    order = [pl.col("n_run_bins"), -pl.col("run_start_s")]
    return runs.group_by(key).agg(
        pl.col("run_start_s").sort_by(order, descending=True).first(),
        pl.col("n_run_bins").max(),
        pl.col("n_dup_bins").sum(),
    )


def _reason(cfg: LongRunningConfig) -> pl.Expr:
    min_bins = pl.col("source").replace_strict(cfg.min_contiguous_bins, return_dtype=pl.Int64)
    return (
        pl.when(pl.col("n_run_bins").is_null())
        .then(pl.lit("no_usage"))
        .when(pl.col("final_state").is_in(list(cfg.drop_states)))
        .then(pl.lit("bad_final_state"))
        .when(pl.col("is_partial").fill_null(False) & pl.lit(cfg.drop_partial))
        .then(pl.lit("partial"))
        .when(pl.col("n_run_bins") < min_bins)
        .then(pl.lit("too_short"))
        .otherwise(pl.lit("kept"))
    )


def _report(judged: pl.DataFrame, orphans: pl.DataFrame) -> pl.DataFrame:
    sources = judged["source"].unique().sort()
    grid = pl.DataFrame({"source": sources}).join(pl.DataFrame({"reason": list(REASONS)}), how="cross")
    counts = judged.group_by("source", "reason").agg(pl.len().cast(pl.Int64).alias("n_workloads"))
    report = grid.join(counts, on=["source", "reason"], how="left").with_columns(
        pl.col("n_workloads").fill_null(0)
    )
    if report["n_workloads"].sum() != judged.height:
        raise AssertionError(
            f"long-running report counts {report['n_workloads'].sum()} != {judged.height} workloads"
        )
    extra = orphans.group_by("source").agg(pl.len().cast(pl.Int64).alias("n_workloads"))
    extra = extra.select("source", pl.lit(ORPHAN_REASON).alias("reason"), "n_workloads")
    return check_schema(pl.concat([report, extra]), LONG_RUNNING_REPORT, "long_running_report")


def filter_long_running(
    workloads: pl.DataFrame,
    usage: pl.DataFrame | pl.LazyFrame,
    cfg: LongRunningConfig = LongRunningConfig(),
    n_partitions: int = 1,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(LONG_RUNNING: the kept workloads with their longest contiguous window, LONG_RUNNING_REPORT).

    `usage` may be lazy (e.g. `pl.scan_parquet` of the usage files). The run search holds one partition of the
    usage bins in memory; with `n_partitions > 1` it makes that many passes, each over the workloads whose id
    hashes to it (runs never cross workloads, so the result is the same).
    """
    workloads = check_schema(workloads, WORKLOADS, "workloads")
    unknown = set(workloads["source"].unique().drop_nulls()) - set(cfg.min_contiguous_bins)
    if unknown:
        raise ValueError(
            f"LongRunningConfig.min_contiguous_bins has no threshold for source(s) {sorted(unknown)}"
        )
    parts = [
        usage.lazy().filter(pl.col("workload_id").hash(seed=0) % n_partitions == i)
        if n_partitions > 1
        else usage
        for i in range(n_partitions)
    ]
    runs = pl.concat([longest_runs(part).collect(engine="streaming") for part in parts])
    dup = runs.filter(pl.col("n_dup_bins") > 0)
    if dup.height:
        raise ValueError(
            f"usage has {dup['n_dup_bins'].sum()} duplicate (workload_id, bin_start_s) rows, "
            f"e.g. workload {dup['workload_id'][0]!r} of source {dup['source'][0]!r}"
        )
    key = ["source", "workload_id"]
    judged = workloads.join(runs, on=key, how="left").with_columns(_reason(cfg).alias("reason"))
    orphans = runs.join(workloads.select(key), on=key, how="anti")
    kept = judged.filter(pl.col("reason") == "kept").sort(key)
    return check_schema(kept, LONG_RUNNING, "long_running"), _report(judged, orphans)
