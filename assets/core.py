"""Canonical tables, one partition per trace source: workloads, 5-minute usage, the long-running filter."""

from pathlib import Path

import duckdb
import polars as pl
from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetOut,
    Config,
    MaterializeResult,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)
from pydantic import Field

from assets.io_manager import frame_metadata
from assets.raw import raw_table_name
from assets.resources import TraceFolder, Warehouse
from pipelines.long_running import ORPHAN_REASON, REASONS, LongRunningConfig, long_running_tables
from pipelines.schemas import BIN_SECONDS, USAGE, empty_frame
from pipelines.sources import SOURCES
from pipelines.usage import UsageConfig, count_bins_above_one_machine, iter_usage_chunks
from pipelines.workloads import build_workloads

SOURCE_PARTITIONS = StaticPartitionsDefinition(list(SOURCES))
"""Downstream of the raw layer, a partition is a trace source."""

PAPER_MIN_BINS = dict(LongRunningConfig().min_contiguous_bins)
PAPER_RULES = dict(LongRunningConfig().rule)


def _raw_deps() -> list[AssetDep]:
    return [
        AssetDep(raw_table_name(s.name, t), partition_mapping=AllPartitionMapping())
        for s in SOURCES.values()
        for t in s.tables
    ]


def load_raw(warehouse: Warehouse, traces: TraceFolder, source: str, log=None) -> dict[str, pl.LazyFrame]:
    """The raw tables of one source as lazy scans over exactly the partitions ingested from the shards in
    the current trace folder. Partitions left by a run over another folder (or ingested from a file since
    replaced) are not read; their count is logged (`tvw-run` removes them before it starts)."""
    out: dict[str, pl.LazyFrame] = {}
    for t in SOURCES[source].tables:
        name = raw_table_name(source, t)
        shards = traces.shards(source, t)
        keys = [k for k, path in shards.items() if warehouse.is_current(name, k, path)]
        n_stored = len(warehouse.partition_keys_on_disk(name))
        if log is not None and n_stored > len(keys):
            log.warning(
                f"{name}: {n_stored - len(keys)} stored partition(s) not from the shards now in "
                f"{traces.root} were not read ({len(keys)} of {len(shards)} current shards ingested)"
            )
        if keys:
            out[t] = warehouse.scan(name, keys)
    return out


def missing_raw_shards(warehouse: Warehouse, traces: TraceFolder, source: str) -> dict[str, list[str]]:
    """Raw table -> the shards of `source` in the trace folder that have no current raw partition (their ingest
    failed, or has not run): a table built from the others covers part of the source only."""
    out: dict[str, list[str]] = {}
    for t in SOURCES[source].tables:
        name = raw_table_name(source, t)
        missing = [
            k for k, path in traces.shards(source, t).items() if not warehouse.is_current(name, k, path)
        ]
        if missing:
            out[t] = missing
    return out


def partial_source_metadata(warehouse: Warehouse, traces: TraceFolder, source: str, log) -> dict:
    """`is_partial_source` and `missing_raw_shards` metadata of a core table, with a warning naming the shards
    when some are missing: a source whose shard failed is never reported as if it were whole."""
    missing = missing_raw_shards(warehouse, traces, source)
    if missing:
        listed = "; ".join(
            f"{t}: {', '.join(keys[:5])}" + (" ..." if len(keys) > 5 else "") for t, keys in missing.items()
        )
        log.warning(
            f"{source} is PARTIAL: {sum(map(len, missing.values()))} shard(s) in {traces.root} have no raw table "
            f"(their ingest failed or has not run), built from the other shards only: {listed}"
        )
    return {"is_partial_source": bool(missing), "missing_raw_shards": MetadataValue.json(missing)}


@asset(
    partitions_def=SOURCE_PARTITIONS,
    deps=_raw_deps(),
    group_name="core",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
)
def core__workloads(
    context: AssetExecutionContext, warehouse: Warehouse, traces: TraceFolder
) -> pl.DataFrame:
    """One row per workload (Google: a task; Alibaba: a container; derived: a job or job-day): source,
    machine, start/end (trace seconds), number of usage records, requested CPU and memory as fractions of
    a machine, priority, scheduling class, final state and whether it was only partly recorded."""
    raw = load_raw(warehouse, traces, context.partition_key, context.log)
    context.log.info(f"raw tables available: {sorted(raw)}")
    context.add_output_metadata(
        partial_source_metadata(warehouse, traces, context.partition_key, context.log)
    )
    return build_workloads(context.partition_key, raw)


class UsageRunConfig(Config):
    fill_policy: str = Field(
        default="none", description="none | hold | linear: how gaps between bins are filled"
    )
    max_fill_bins: int = Field(default=0, description="longest gap (in 5-min bins) that the policy may fill")
    fill_policy_by_source: dict[str, str] = Field(
        default={}, description="per source: fill_policy for that source (others use fill_policy)"
    )
    max_fill_bins_by_source: dict[str, int] = Field(
        default={}, description="per source: max_fill_bins for that source (others use max_fill_bins)"
    )
    chunk_hours: dict[str, int] = Field(
        default={},
        description="per source: stream the usage build in time chunks of this many hours of trace time "
        "instead of the source's own chunking (each source's `usage.chunking`: time chunks for time-ordered raw "
        "usage such as Google's shards, container ranges for Alibaba's container-sorted container_usage)",
    )
    chunk_rows: dict[str, int] = Field(
        default={},
        description="per source: stream the usage build in workload-key ranges of about this many raw rows "
        "(only for a source whose raw usage is sorted by workload, e.g. alibaba2018)",
    )


USAGE_INVARIANTS_SQL = """
select
    count(*) filter (where bin_start_s % {bin_s} <> 0)                       as n_off_grid,
    count(*) filter (where not (isfinite(cpu_frac) and isfinite(mem_frac)
                                and cpu_frac >= 0 and mem_frac >= 0))        as n_bad_values,
    count(*) filter (where is_filled and n_samples <> 0)                     as n_filled_with_samples,
    count(*) - count(distinct (workload_id, bin_start_s))                    as n_duplicate_bins
from read_parquet({files})
"""


def above_one_machine_line(source: str, above: dict[str, int | float]) -> str:
    """The log line of `count_bins_above_one_machine`'s counts for one source."""
    return (
        f"{source}: {above['n_cpu_bins_above_one_machine']} bins above one machine of CPU "
        f"(max cpu_frac {above['max_cpu_frac']:.3g}), {above['n_mem_bins_above_one_machine']} of memory "
        f"(max mem_frac {above['max_mem_frac']:.3g}), in {above['n_workloads_above_one_machine']} workload(s), "
        f"of {above['n_bins']} bins; kept (scaled per source for job sequences, clipped by the simulator)"
    )


def check_usage_invariants(files: list[Path]) -> dict[str, int]:
    """Counts of rows that break the USAGE contract, computed by DuckDB over the files (streaming)."""
    listed = "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"
    con = duckdb.connect()
    try:
        row = con.sql(USAGE_INVARIANTS_SQL.format(bin_s=BIN_SECONDS, files=listed)).fetchall()[0]
    finally:
        con.close()
    return dict(
        zip(("n_off_grid", "n_bad_values", "n_filled_with_samples", "n_duplicate_bins"), row, strict=True)
    )


def usage_config_for(config: UsageRunConfig, source: str) -> UsageConfig:
    """The gap-filling settings of `source`: its entries of the `*_by_source` maps, else the common ones."""
    try:
        return UsageConfig(
            fill_policy=config.fill_policy_by_source.get(source, config.fill_policy),
            max_fill_bins=config.max_fill_bins_by_source.get(source, config.max_fill_bins),
        )
    except ValueError as e:
        raise ValueError(f"core__usage config for source {source!r}: {e}") from e


@asset(
    partitions_def=SOURCE_PARTITIONS,
    deps=_raw_deps(),
    group_name="core",
    kinds={"parquet", "polars"},
    check_specs=[
        AssetCheckSpec(
            "usage_contract",
            asset="core__usage",
            description="ERROR, blocking: bins on the 5-minute grid, one per workload, finite non-negative "
            "fractions (no NaN, no infinity), filled bins carry no samples (metadata also counts the bins above "
            "one machine, per resource)",
            blocking=True,
        ),
        AssetCheckSpec(
            "usage_within_one_machine",
            asset="core__usage",
            description="warns when bins use more than one machine (cpu_frac > 1 or mem_frac > 1): counted per "
            "resource with the workloads involved and the largest values. Such bins are kept; the job-sequence "
            "builder scales each source to machine units and the simulator clips and counts what still exceeds "
            "a machine (oversize='clip')",
        ),
    ],
)
def core__usage(
    context: AssetExecutionContext, config: UsageRunConfig, warehouse: Warehouse, traces: TraceFolder
) -> MaterializeResult:
    """One row per workload per 5-minute bin: CPU and memory as fractions of one machine, the number of raw
    samples averaged into the bin, and whether the gap-filling policy produced it (`is_filled`). Written as a
    folder of chunk files per source (one per slice of trace time), never held in memory whole."""
    source = context.partition_key
    raw = load_raw(warehouse, traces, source, context.log)
    cfg = usage_config_for(config, source)
    context.log.info(f"{source}: gap filling {cfg.fill_policy}, at most {cfg.max_fill_bins} bin(s)")
    counts: list[pl.DataFrame] = []

    def chunks():
        hours, rows = config.chunk_hours.get(source), config.chunk_rows.get(source)
        chunk_s = None if hours is None else hours * 3600
        for usage, chunk_counts in iter_usage_chunks(
            source, raw, cfg, chunk_s=chunk_s, chunk_rows=rows, log=context.log.info
        ):
            counts.append(chunk_counts)
            yield usage

    folder, rows = warehouse.write_chunks("core__usage", source, chunks(), empty_frame(USAGE))
    totals = pl.concat(counts).group_by("count").agg(pl.col("n").sum()) if counts else pl.DataFrame()
    context.log.info(f"{source}: {rows} usage bins written; counts: {dict(totals.iter_rows())}")
    preview = warehouse.scan("core__usage", [source]).head(10).collect()
    files = warehouse.partition_files("core__usage", source)
    broken = check_usage_invariants(files)
    above = count_bins_above_one_machine(files)
    n_above = above["n_cpu_bins_above_one_machine"] + above["n_mem_bins_above_one_machine"]
    (context.log.warning if n_above else context.log.info)(above_one_machine_line(source, above))
    return MaterializeResult(
        check_results=[
            AssetCheckResult(
                check_name="usage_contract",
                passed=not any(broken.values()),
                severity=AssetCheckSeverity.ERROR,
                metadata={**broken, **above},
            ),
            AssetCheckResult(
                check_name="usage_within_one_machine",
                passed=n_above == 0,
                severity=AssetCheckSeverity.WARN,
                metadata=above,
            ),
        ],
        metadata={
            **{k: int(v) for k, v in totals.iter_rows()},
            **frame_metadata(preview),
            **partial_source_metadata(warehouse, traces, source, context.log),
            "dagster/row_count": rows,
            "path": MetadataValue.path(str(folder)),
        },
    )


class LongRunningRunConfig(Config):
    min_contiguous_bins: dict[str, int] = Field(
        default=PAPER_MIN_BINS,
        description="per source: minimum 5-min records, counted as `rule` says (TVW-RL: 6000 continuous for "
        "Google, 2000 records for Alibaba)",
    )
    rule: dict[str, str] = Field(
        default=PAPER_RULES,
        description="per source: contiguous_bins (longest gap-free run of 5-min bins; Google, Bitbrains) or "
        "observed_bins (5-min bins with a sample, anywhere; TVW-RL's records rule for Alibaba)",
    )


def long_running_usage(warehouse: Warehouse, source: str, long_running: pl.DataFrame) -> pl.LazyFrame:
    """The usage bins of one source's long-running workloads: a lazy semi-join on the chunked usage scan."""
    ids = long_running.select("source", "workload_id").unique()
    return warehouse.scan("core__usage", [source]).join(ids.lazy(), on=["source", "workload_id"], how="semi")


@multi_asset(
    outs={
        "core__long_running": AssetOut(
            io_manager_key="table_io",
            description="Workloads that pass the TVW-RL filter: not evicted/killed/failed/lost, fully recorded, "
            "with at least N contiguous 5-minute records; with the contiguous window kept.",
            kinds={"parquet", "polars"},
        ),
        "core__long_running_report": AssetOut(
            io_manager_key="table_io",
            description="How many workloads the long-running filter kept, and dropped for each reason.",
            kinds={"parquet", "polars"},
        ),
        "core__long_running_judged": AssetOut(
            io_manager_key="table_io",
            description="Why each workload was kept or dropped by the long-running filter, one row per workload: "
            "the reason (first match of no_usage, bad_final_state, partial, too_short, else kept), the rule and "
            "threshold it was judged under (rule, min_bins), and what it was judged on: its longest run of "
            "consecutive 5-minute bins (n_run_bins), its bins with a sample (n_observed_bins), its final_state "
            "and is_partial.",
            kinds={"parquet", "polars"},
        ),
    },
    partitions_def=SOURCE_PARTITIONS,
    group_name="core",
    deps=["core__usage"],
    check_specs=[
        AssetCheckSpec(
            "every_workload_counted_once",
            asset="core__long_running_report",
            description="the report's counts add up to the number of workloads of the source",
        ),
        AssetCheckSpec(
            "every_workload_judged_once",
            asset="core__long_running_judged",
            description="every workload of the source has exactly one row, and the rows per reason equal the "
            "report's counts",
        ),
    ],
)
def core__long_running(
    context: AssetExecutionContext,
    config: LongRunningRunConfig,
    warehouse: Warehouse,
    core__workloads: pl.DataFrame,
):
    cfg = LongRunningConfig(
        min_contiguous_bins={**PAPER_MIN_BINS, **config.min_contiguous_bins},
        rule={**PAPER_RULES, **config.rule},
    )
    usage = warehouse.scan("core__usage", [context.partition_key])
    kept, report, judged = long_running_tables(core__workloads, usage, cfg)
    context.log.info("long-running filter:\n" + str(report))
    # the five reasons partition the workloads; usage_without_workload counts ids outside the table
    n_reported = int(report.filter(pl.col("reason").is_in(list(REASONS)))["n_workloads"].sum())
    yield Output(kept, output_name="core__long_running")
    yield Output(
        report,
        output_name="core__long_running_report",
        metadata={"report": MetadataValue.md("\n".join(f"- {r}: {n}" for _, r, n in report.iter_rows()))},
    )
    yield Output(judged, output_name="core__long_running_judged")
    yield AssetCheckResult(
        asset_key="core__long_running_judged",
        check_name="every_workload_judged_once",
        **check_judged(judged, core__workloads, report),
    )
    yield AssetCheckResult(
        asset_key="core__long_running_report",
        check_name="every_workload_counted_once",
        passed=n_reported == len(core__workloads),
        metadata={
            "n_reported": n_reported,
            "n_workloads": len(core__workloads),
            "n_usage_ids_without_workload": int(
                report.filter(pl.col("reason") == ORPHAN_REASON)["n_workloads"].sum()
            ),
        },
    )


def check_judged(judged: pl.DataFrame, workloads: pl.DataFrame, report: pl.DataFrame) -> dict:
    """`passed` and `metadata` of the judged table's check: each workload of `workloads` exactly once (no other
    rows), and the rows per (source, reason) equal the report's counts of the five reasons."""
    key = ["source", "workload_id"]
    n_dup = judged.height - judged.select(key).n_unique()
    n_missing = workloads.select(key).join(judged.select(key), on=key, how="anti").height
    n_extra = judged.select(key).join(workloads.select(key), on=key, how="anti").height
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


CORE_ASSETS = [core__workloads, core__usage, core__long_running]
CORE_CHECKS: list = []
