"""TVW-RL's long-running filter: keep whole, not-failed workloads with a long contiguous usage series.

TVW-RL ("Real Production Workload Traces"): discard workloads that were evicted, killed or failed, discard
partially recorded ones, and keep those "that had at least 6000 continuous timestamped resource usage records for
Google traces and, at least 2000 timestamped resource usage records for Alibaba traces". The length rule is
therefore per source (`LongRunningConfig.rule`, default: each source's `TraceSource.long_running`):

* `contiguous_bins`: the longest run of consecutive 5-minute bins of the USAGE table (`bin_start_s` step of
  exactly 300 s) must reach the threshold; bins produced by gap filling (`is_filled`) count as present, so the
  fill policy of `pipelines.usage` decides how strict "continuous" is.
* `observed_bins`: the number of 5-minute bins with at least one sample (`is_filled` false), wherever the gaps
  are, must reach the threshold (Alibaba's default in `pipelines.sources.alibaba2018`); Google's sources and
  Bitbrains default to contiguous_bins.
* `records`: the number of raw usage RECORDS (the bins' `n_samples`, summed; filled bins have none), wherever
  the gaps are: TVW-RL's wording for Alibaba ("at least 2000 timestamped resource usage records"). A 5-minute bin
  can hold several records (on the Alibaba head, bins undercount records by about 20 %), so `observed_bins` is
  stricter than the paper.
* Either way the longest run is kept as the workload's window (`run_start_s`, `n_run_bins`; the earliest one on
  ties). A run may bridge gaps of at most `LongRunningConfig.max_gap_bins[source]` missing bins (default: 0,
  gap-free; Alibaba: its rule's `max_gap_bins`, an hour), and its length counts the bridged bins: its usage is then
  completed by `fill_window_gaps` (linear interpolation between the neighbouring records, flagged `is_filled`),
  so a container sampled in every other bin keeps its whole span instead of a 1-bin series. Everything
  downstream gets a complete window.
* each workload gets exactly one reason, first match in this order: `no_usage` (no bin at all),
  `bad_final_state` (final_state in `drop_states`), `partial` (is_partial and `drop_partial`), `too_short`
  (below the source's threshold under its rule), else `kept`. `judge_long_running` gives that reason per
  workload, with the numbers it was judged on (`long_running_tables` gives it with the kept workloads and the
  report, from one pass). The report lists all five reasons per source
  (zeros included) and their sum equals the number of workloads (checked).
* usage rows whose workload is not in `workloads` are ignored; if there are any, the report has one more row,
  reason `usage_without_workload`, counting those workload ids (outside the five reasons' sum).
* duplicate (workload_id, bin_start_s) rows are an error (build_usage never makes them).

Memory: the run search reads the usage one time chunk at a time (`chunked_longest_runs`) and carries a few
numbers per workload (best run, the run still open at the chunk's end), so a lazy scan over the usage chunk
files never has to be held whole (measured: 320 MiB peak at 20 M and at 60 M usage bins, 10k workloads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipelines.schemas import BIN_SECONDS, LONG_RUNNING, LONG_RUNNING_REPORT, USAGE, WORKLOADS, check_schema
from pipelines.sources import SOURCES
from pipelines.sources.mapping import LONG_RUNNING_RULES

REASONS = ("no_usage", "bad_final_state", "partial", "too_short", "kept")
"""Report reasons, in order of precedence."""
ORPHAN_REASON = "usage_without_workload"
KEY = ["source", "workload_id"]


JUDGED = {
    "source": pl.String,
    "workload_id": pl.String,
    "reason": pl.String,  # one of REASONS
    "rule": pl.String,  # contiguous_bins | observed_bins | records
    "min_bins": pl.Int64,  # the source's threshold under its rule
    "n_run_bins": pl.Int64,  # longest run of consecutive bins, bridged gaps included (null: no usage)
    "n_observed_bins": pl.Int64,  # bins with at least one sample (null: no usage)
    "n_records": pl.Int64,  # raw usage records (sum of the bins' n_samples; null: no usage)
    "final_state": pl.String,
    "is_partial": pl.Boolean,
}
"""Per workload: the filter's verdict and what it was based on."""


def _default_min_bins() -> dict[str, int]:
    return {name: s.long_running.min_bins for name, s in SOURCES.items()}


def _default_rules() -> dict[str, str]:
    return {name: s.long_running.kind for name, s in SOURCES.items()}


RULES = (*LONG_RUNNING_RULES, "records")
"""The length rules: the sources' own kinds and `records` (raw records, TVW-RL's Alibaba rule)."""


def _default_max_gaps() -> dict[str, int]:
    """source -> longest gap its kept windows bridge, from each source's `long_running` rule (Alibaba: an hour)."""
    return {name: s.long_running.max_gap_bins for name, s in SOURCES.items() if s.long_running.max_gap_bins}


@dataclass(frozen=True)
class LongRunningConfig:
    """Thresholds of the long-running filter (defaults: TVW-RL's, from each source's `long_running` rule)."""

    min_contiguous_bins: dict[str, int] = field(default_factory=_default_min_bins)
    """source -> least number of 5-minute bins, counted as `rule` says for that source (TVW-RL: 6000 for Google,
    2000 for Alibaba). The name is the historical one: for an `observed_bins` source the
    threshold is on observed, not contiguous, bins."""
    rule: dict[str, str] = field(default_factory=_default_rules)
    """source -> `contiguous_bins` (longest run), `observed_bins` (bins with a sample, anywhere) or `records`
    (raw records, anywhere); a source missing here is judged on contiguous bins."""
    max_gap_bins: dict[str, int] = field(default_factory=_default_max_gaps)
    """source -> longest gap of missing 5-minute bins a kept window may bridge (filled by `fill_window_gaps`);
    a source missing here: 0, the window is gap-free."""
    drop_states: tuple[str, ...] = ("evicted", "killed", "failed", "lost")
    """final states that disqualify a workload (TVW-RL: evicted, killed, failed; lost is as bad)."""
    drop_partial: bool = True
    """drop partially recorded workloads (TVW-RL does)."""

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.rule.items() if v not in RULES}
        if bad:
            raise ValueError(f"LongRunningConfig.rule has unknown rule(s) {bad}; expected {RULES}")
        negative = {k: v for k, v in self.max_gap_bins.items() if v < 0}
        if negative:
            raise ValueError(f"LongRunningConfig.max_gap_bins must be >= 0; got {negative}")

    def rule_of(self, source: str) -> str:
        return self.rule.get(source, "contiguous_bins")


def longest_runs(
    usage: pl.DataFrame | pl.LazyFrame, max_gap_bins: dict[str, int] | None = None
) -> pl.LazyFrame:
    """Per (source, workload_id): the longest run (gaps of at most max_gap_bins[source] missing bins bridged) ->
    run_start_s, n_run_bins (its span, bridged bins included), n_dup_bins, n_observed_bins, n_records."""
    runs = longest_runs_per_run(usage, max_gap_bins)
    order = [pl.col("n_run_bins"), -pl.col("run_start_s")]
    return runs.group_by(KEY).agg(
        pl.col("run_start_s").sort_by(order, descending=True).first(),
        pl.col("n_run_bins").max(),
        pl.col("n_dup_bins").sum(),
        pl.col("n_observed_bins").sum(),
        pl.col("n_records").sum(),
    )


def longest_runs_per_run(
    usage: pl.DataFrame | pl.LazyFrame, max_gap_bins: dict[str, int] | None = None
) -> pl.LazyFrame:
    """Every run of bins, a new run starting after a gap of more than max_gap_bins[source] missing bins (0:
    consecutive bins only): (source, workload_id, run_key) -> run_start_s, n_run_bins (the span from its first
    to its last bin), n_dup_bins, n_observed_bins (bins not produced by gap filling; all of them when `usage`
    has no `is_filled`), n_records (sum of n_samples; the observed bins when `usage` has no `n_samples`) and
    max_gap (the source's bound, in bins). Sorts within each workload (one chunk at a time when chunked)."""
    b = pl.col("bin_start_s")
    step = (b.diff().over(KEY) > (pl.col("max_gap") + 1) * BIN_SECONDS).fill_null(True)
    return (
        _run_columns(usage, max_gap_bins)
        .sort(*KEY, "bin_start_s")
        .with_columns(step.cast(pl.Int64).cum_sum().over(KEY).alias("run_key"))
        .group_by(*KEY, "run_key")
        .agg(
            b.min().alias("run_start_s"),
            ((b.max() - b.min()) // BIN_SECONDS + 1).cast(pl.Int64).alias("n_run_bins"),
            (pl.len() - b.n_unique()).alias("n_dup_bins"),
            (~pl.col("is_filled")).sum().cast(pl.Int64).alias("n_observed_bins"),
            pl.col("n_records").sum().cast(pl.Int64).alias("n_records"),
            pl.col("max_gap").first(),
        )
    )


def _run_columns(usage: pl.DataFrame | pl.LazyFrame, max_gap_bins: dict[str, int] | None) -> pl.LazyFrame:
    """(source, workload_id, bin_start_s, is_filled, n_records, max_gap) of the usage rows (is_filled false
    when absent; n_records the bin's n_samples, or 1 per observed bin when absent; max_gap per source)."""
    lf = usage.lazy()
    names = lf.collect_schema()
    filled = pl.col("is_filled").fill_null(False) if "is_filled" in names else pl.lit(False)
    records = (
        pl.col("n_samples").fill_null(0).cast(pl.Int64) if "n_samples" in names else (~filled).cast(pl.Int64)
    )
    gap = pl.lit(0, pl.Int64)
    for source, bins in (max_gap_bins or {}).items():
        gap = pl.when(pl.col("source") == source).then(pl.lit(int(bins), pl.Int64)).otherwise(gap)
    return lf.select(
        *KEY, "bin_start_s", filled.alias("is_filled"), records.alias("n_records"), gap.alias("max_gap")
    )


def _chunk_runs(part: pl.LazyFrame, max_gap_bins: dict[str, int] | None) -> pl.DataFrame:
    """Per workload of one time chunk: its first, last and longest run of consecutive bins (start, length),
    duplicated bins and number of runs."""
    runs = longest_runs_per_run(part, max_gap_bins)
    by_start = pl.col("run_start_s")
    n = pl.col("n_run_bins")
    return (
        runs.group_by(KEY)
        .agg(
            by_start.min().alias("c_first_start"),
            n.sort_by(by_start).first().alias("c_first_n"),
            by_start.max().alias("c_last_start"),
            n.sort_by(by_start).last().alias("c_last_n"),
            n.max().alias("c_best_n"),
            by_start.sort_by([n, -by_start], descending=True).first().alias("c_best_start"),
            pl.col("n_dup_bins").sum().alias("c_dup"),
            pl.col("n_observed_bins").sum().alias("c_obs"),
            pl.col("n_records").sum().alias("c_rec"),
            pl.col("max_gap").first().alias("c_gap"),
            pl.len().alias("c_runs"),
        )
        .collect(engine="streaming")
    )


def _merge_runs(state: pl.DataFrame | None, chunk: pl.DataFrame) -> pl.DataFrame:
    """Fold one chunk's runs into the per-workload state (best run, open run = the one ending last, dups).

    The chunk's first run continues the open run when at most `max_gap` bins are missing between the open run's
    end and its start (0: it starts exactly one bin after); the merged run spans both and the gap."""
    if state is None:
        return chunk.select(
            *KEY, pl.col("c_best_start").alias("best_start"), pl.col("c_best_n").alias("best_n"),
            pl.col("c_last_start").alias("open_start"), pl.col("c_last_n").alias("open_n"),
            pl.col("c_dup").alias("n_dup"), pl.col("c_obs").alias("n_obs"), pl.col("c_rec").alias("n_rec"),
            pl.col("c_gap").alias("max_gap"),
        )  # fmt: skip
    c = pl.col
    j = state.join(chunk, on=KEY, how="full", coalesce=True)
    gap = pl.coalesce(c("max_gap"), c("c_gap"))
    open_end = c("open_start") + c("open_n") * BIN_SECONDS
    cont = (c("c_first_start") - open_end <= gap * BIN_SECONDS).fill_null(False)
    merged_n = pl.when(cont).then((c("c_first_start") - c("open_start")) // BIN_SECONDS + c("c_first_n"))
    cands = [(c("best_n"), c("best_start")), (c("c_best_n"), c("c_best_start")), (merged_n, c("open_start"))]
    best_n = pl.max_horizontal([n for n, _ in cands])
    best_start = pl.min_horizontal([pl.when(n == best_n).then(s) for n, s in cands])
    absent = c("c_first_start").is_null()
    one_merged = cont & (c("c_runs") == 1)
    open_start = pl.when(absent | one_merged).then(c("open_start")).otherwise(c("c_last_start"))
    open_n = pl.when(absent).then(c("open_n")).when(one_merged).then(merged_n).otherwise(c("c_last_n"))
    return j.select(
        *KEY, best_start.alias("best_start"), best_n.alias("best_n"), open_start.alias("open_start"),
        open_n.alias("open_n"), (c("n_dup").fill_null(0) + c("c_dup").fill_null(0)).alias("n_dup"),
        (c("n_obs").fill_null(0) + c("c_obs").fill_null(0)).alias("n_obs"),
        (c("n_rec").fill_null(0) + c("c_rec").fill_null(0)).alias("n_rec"), gap.alias("max_gap"),
    )  # fmt: skip


def chunked_longest_runs(
    usage: pl.DataFrame | pl.LazyFrame, chunk_s: int, max_gap_bins: dict[str, int] | None = None
) -> pl.DataFrame:
    """longest_runs, one time chunk of `chunk_s` seconds at a time (ties: earliest run, as longest_runs).

    Memory: one chunk's bins plus a few numbers per workload, whatever the number of usage rows; each chunk
    filters the scan on bin_start_s, so Parquet row-group statistics skip the rest of time-ordered files."""
    if chunk_s <= 0 or chunk_s % BIN_SECONDS:
        raise ValueError(f"chunk_s={chunk_s} must be a positive multiple of {BIN_SECONDS}")
    lf = usage.lazy()
    ks = lf.select((pl.col("bin_start_s") // chunk_s).alias("k")).unique().collect(engine="streaming")
    state = None
    for k in ks["k"].drop_nulls().sort().to_list():
        part = lf.filter(pl.col("bin_start_s").is_between(k * chunk_s, (k + 1) * chunk_s, closed="left"))
        state = _merge_runs(state, _chunk_runs(part, max_gap_bins))
    if state is None:
        return pl.DataFrame(
            schema={**{k: pl.String for k in KEY}, "run_start_s": pl.Int64, "n_run_bins": pl.Int64,
                    "n_dup_bins": pl.Int64, "n_observed_bins": pl.Int64, "n_records": pl.Int64},
        )  # fmt: skip
    return state.select(
        *KEY,
        pl.col("best_start").alias("run_start_s"),
        pl.col("best_n").alias("n_run_bins"),
        pl.col("n_dup").cast(pl.Int64).alias("n_dup_bins"),
        pl.col("n_obs").cast(pl.Int64).alias("n_observed_bins"),
        pl.col("n_rec").cast(pl.Int64).alias("n_records"),
    )


def _reason(cfg: LongRunningConfig) -> pl.Expr:
    length = (
        pl.when(pl.col("rule") == "observed_bins")
        .then(pl.col("n_observed_bins"))
        .when(pl.col("rule") == "records")
        .then(pl.col("n_records"))
        .otherwise("n_run_bins")
    )
    return (
        pl.when(pl.col("n_run_bins").is_null())
        .then(pl.lit("no_usage"))
        .when(pl.col("final_state").is_in(list(cfg.drop_states)))
        .then(pl.lit("bad_final_state"))
        .when(pl.col("is_partial").fill_null(False) & pl.lit(cfg.drop_partial))
        .then(pl.lit("partial"))
        .when(length < pl.col("min_bins"))
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


def _judge(
    workloads: pl.DataFrame,
    usage: pl.DataFrame | pl.LazyFrame,
    cfg: LongRunningConfig,
    n_partitions: int,
    chunk_s: int | None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(workloads joined with their runs, rule, threshold and reason; run rows of ids that are no workload)."""
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
    runs = pl.concat(
        [
            longest_runs(part, cfg.max_gap_bins).collect(engine="streaming")
            if chunk_s is None
            else chunked_longest_runs(part, chunk_s, cfg.max_gap_bins)
            for part in parts
        ]
    )
    dup = runs.filter(pl.col("n_dup_bins") > 0)
    if dup.height:
        raise ValueError(
            f"usage has {dup['n_dup_bins'].sum()} duplicate (workload_id, bin_start_s) rows, "
            f"e.g. workload {dup['workload_id'][0]!r} of source {dup['source'][0]!r}"
        )
    sources = workloads["source"].unique().drop_nulls().to_list()
    rules = pl.DataFrame(
        {
            "source": sources,
            "rule": [cfg.rule_of(s) for s in sources],
            "min_bins": [cfg.min_contiguous_bins[s] for s in sources],
        },
        schema={"source": pl.String, "rule": pl.String, "min_bins": pl.Int64},
    )
    judged = (
        workloads.join(runs, on=KEY, how="left")
        .join(rules, on="source", how="left")
        .with_columns(_reason(cfg).alias("reason"))
    )
    orphans = runs.join(workloads.select(KEY), on=KEY, how="anti")
    return judged, orphans


def judge_long_running(
    workloads: pl.DataFrame,
    usage: pl.DataFrame | pl.LazyFrame,
    cfg: LongRunningConfig = LongRunningConfig(),
    n_partitions: int = 1,
    chunk_s: int | None = 6 * 3600,
) -> pl.DataFrame:
    """JUDGED: why each workload was kept or dropped (reason, rule, threshold, longest run, observed bins),
    sorted by (source, workload_id). Same arguments as `filter_long_running`."""
    judged, _ = _judge(workloads, usage, cfg, n_partitions, chunk_s)
    return check_schema(judged.sort(KEY), JUDGED, "long_running_judged")


def long_running_tables(
    workloads: pl.DataFrame,
    usage: pl.DataFrame | pl.LazyFrame,
    cfg: LongRunningConfig = LongRunningConfig(),
    n_partitions: int = 1,
    chunk_s: int | None = 6 * 3600,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(LONG_RUNNING, LONG_RUNNING_REPORT, JUDGED) from one pass over the usage: the kept workloads, the counts
    per reason, and every workload's verdict. Same arguments as `filter_long_running`."""
    judged, orphans = _judge(workloads, usage, cfg, n_partitions, chunk_s)
    kept = judged.filter(pl.col("reason") == "kept").sort(KEY)
    return (
        check_schema(kept, LONG_RUNNING, "long_running"),
        _report(judged, orphans),
        check_schema(judged.sort(KEY), JUDGED, "long_running_judged"),
    )


def filter_long_running(
    workloads: pl.DataFrame,
    usage: pl.DataFrame | pl.LazyFrame,
    cfg: LongRunningConfig = LongRunningConfig(),
    n_partitions: int = 1,
    chunk_s: int | None = 6 * 3600,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(LONG_RUNNING: the kept workloads with their longest contiguous window, LONG_RUNNING_REPORT).

    `usage` may be lazy (e.g. `pl.scan_parquet` of the usage chunk files). The run search reads it one time
    chunk of `chunk_s` seconds at a time and keeps a few numbers per workload between chunks, so memory grows
    with the number of workloads and the bins of one chunk, not with the usage rows (None: one pass, which
    holds every usage bin). With `n_partitions > 1` it makes that many passes, each over the workloads whose
    id hashes to it (runs never cross workloads, so the result is the same either way).
    """
    kept, report, _ = long_running_tables(workloads, usage, cfg, n_partitions, chunk_s)
    return kept, report


def fill_window_gaps(usage: pl.DataFrame | pl.LazyFrame, long_running: pl.DataFrame) -> pl.LazyFrame:
    """The USAGE rows of every kept window [run_start_s, run_start_s + n_run_bins * 300 s), the bins a window
    bridged (gaps of at most `LongRunningConfig.max_gap_bins`) added: cpu_frac and mem_frac interpolated
    linearly between the window's neighbouring bins, n_samples 0, is_filled true. A window always starts and
    ends on a bin of the usage, so every added bin has a neighbour on each side. Gap-free windows come back
    unchanged."""
    windows = long_running.lazy().select(
        *KEY,
        pl.int_ranges(
            "run_start_s", pl.col("run_start_s") + pl.col("n_run_bins") * BIN_SECONDS, BIN_SECONDS
        ).alias("bin_start_s"),
    )
    grid = windows.explode("bin_start_s").with_columns(pl.col("bin_start_s").cast(pl.Int64))
    rows = usage.lazy().select([pl.col(c).cast(t) for c, t in USAGE.items()])
    return (
        grid.join(rows, on=[*KEY, "bin_start_s"], how="left")
        .sort(*KEY, "bin_start_s")
        .with_columns(
            pl.col("cpu_frac").interpolate().over(KEY),
            pl.col("mem_frac").interpolate().over(KEY),
            pl.col("n_samples").fill_null(0),
            pl.col("is_filled").fill_null(True),
        )
        .select(list(USAGE))
    )


# ---------------------------------------------------------------- checks of the three tables

LONG_RUNNING_TABLE_DOCS = {
    "core__long_running": "Workloads that pass the TVW-RL filter: not evicted/killed/failed/lost, fully "
    "recorded, with at least N contiguous 5-minute records; with the contiguous window kept.",
    "core__long_running_report": "How many workloads the filter kept and dropped, per reason.",
    "core__long_running_judged": "Why each workload was kept or dropped by the long-running filter, one row per "
    "workload: the reason (first match of no_usage, bad_final_state, partial, too_short, else kept), the rule and "
    "threshold it was judged under, and what it was judged on (runs, observed bins, records, final state).",
}
"""The filter's three tables (the assets' descriptions)."""
REPORT_CHECK_DOCS = {
    "every_workload_counted_once": "the report's counts add up to the number of workloads of the source",
}
"""The check of the report (`check_report`)."""
JUDGED_CHECK_DOCS = {
    "every_workload_judged_once": "every workload of the source has exactly one row, and the rows per reason "
    "equal the report's counts",
}
"""The check of the judged table (`check_judged`)."""


def check_report(report: pl.DataFrame, n_workloads: int) -> dict:
    """`passed` and `metadata` of the report's check: the five reasons' counts add up to the `n_workloads`
    workloads of the source (usage ids without a workload are counted apart, outside the sum)."""
    n_reported = int(report.filter(pl.col("reason").is_in(list(REASONS)))["n_workloads"].sum())
    n_orphans = int(report.filter(pl.col("reason") == ORPHAN_REASON)["n_workloads"].sum())
    return {
        "passed": n_reported == n_workloads,
        "metadata": {
            "n_reported": n_reported,
            "n_workloads": n_workloads,
            "n_usage_ids_without_workload": n_orphans,
        },
    }


def check_judged(judged: pl.DataFrame, workloads: pl.DataFrame, report: pl.DataFrame) -> dict:
    """`passed` and `metadata` of the judged table's check: each workload of `workloads` exactly once (no other
    rows), and the rows per (source, reason) equal the report's counts of the five reasons."""
    n_dup = judged.height - judged.select(KEY).n_unique()
    n_missing = workloads.select(KEY).join(judged.select(KEY), on=KEY, how="anti").height
    n_extra = judged.select(KEY).join(workloads.select(KEY), on=KEY, how="anti").height
    per_reason = judged.group_by("source", "reason").agg(pl.len().cast(pl.Int64).alias("n_judged"))
    reported = report.filter(pl.col("reason").is_in(list(REASONS)))
    diff = reported.join(per_reason, on=["source", "reason"], how="full", coalesce=True).filter(
        pl.col("n_workloads").fill_null(0) != pl.col("n_judged").fill_null(0)
    )
    mismatches = [f"{s}/{r}: report {a}, judged {b}" for s, r, a, b in diff.iter_rows()]
    return {
        "passed": n_dup == 0 and n_missing == 0 and n_extra == 0 and not mismatches,
        "metadata": {
            "n_judged": judged.height,
            "n_workloads": workloads.height,
            "n_duplicate_rows": n_dup,
            "n_workloads_missing": n_missing,
            "n_rows_not_a_workload": n_extra,
            "reason_count_mismatches": "; ".join(mismatches) or "none",
        },
    }


def long_running_usage(warehouse, source: str, long_running: pl.DataFrame) -> pl.LazyFrame:
    """The usage bins of one source's long-running workloads from a warehouse (`pipelines.warehouse.
    ParquetWarehouse`, or the Dagster resource built on it): a lazy semi-join on the chunked usage scan."""
    ids = long_running.select("source", "workload_id").unique()
    return warehouse.scan("core__usage", [source]).join(ids.lazy(), on=["source", "workload_id"], how="semi")
