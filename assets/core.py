"""Canonical tables, one partition per trace source: workloads, 5-minute usage, the long-running filter."""

import dagster as dg
import polars as pl

from assets import checks
from assets.io_manager import frame_metadata
from assets.resources import TraceFolder, Warehouse
from assets.settings import dataclass_config
from pipelines.ingest import describe_missing_shards, raw_table_name
from pipelines.long_running import (
    JUDGED_CHECK_DOCS,
    LONG_RUNNING_TABLE_DOCS,
    REPORT_CHECK_DOCS,
    LongRunningConfig,
    check_judged,
    check_report,
    long_running_tables,
)
from pipelines.schemas import USAGE, empty_frame
from pipelines.sources import SOURCES
from pipelines.usage import (
    USAGE_CHECK_DOCS,
    UsageRunSettings,
    above_one_machine_line,
    check_usage_files,
    iter_usage_chunks,
    sum_counts,
)
from pipelines.usage import check_usage_invariants as check_usage_invariants  # tests/assets/test_warehouse.py
from pipelines.workloads import build_workloads

SOURCE_PARTITIONS = dg.StaticPartitionsDefinition(list(SOURCES))
"""Downstream of the raw layer, a partition is a trace source."""
UsageRunConfig = dataclass_config(UsageRunSettings)
LongRunningRunConfig = dataclass_config(LongRunningConfig)
TABLE_OUT = {"io_manager_key": "table_io", "kinds": {"parquet", "polars"}}
RAW_DEPS = [
    dg.AssetDep(raw_table_name(s.name, t), partition_mapping=dg.AllPartitionMapping())
    for s in SOURCES.values()
    for t in s.tables
]


def load_raw(warehouse: Warehouse, traces: TraceFolder, source: str, log=None) -> dict[str, pl.LazyFrame]:
    """The raw tables of one source as lazy scans over the partitions ingested from the shards now in the trace
    folder; partitions left by a run over another folder (or from a file since replaced) are not read (logged)."""
    out: dict[str, pl.LazyFrame] = {}
    for t in SOURCES[source].tables:
        name, shards = raw_table_name(source, t), traces.shards(source, t)
        keys = [k for k, path in shards.items() if warehouse.is_current(name, k, path)]
        n_old = len(warehouse.partition_keys_on_disk(name)) - len(keys)
        if log is not None and n_old > 0:
            log.warning(
                f"{name}: {n_old} stored partition(s) not from the shards now in {traces.root} were not read "
                f"({len(keys)} of {len(shards)} current shards ingested)"
            )
        if keys:
            out[t] = warehouse.scan(name, keys)
    return out


def partial_source_metadata(warehouse: Warehouse, traces: TraceFolder, source: str, log) -> dict:
    """`is_partial_source` and `missing_raw_shards` (raw table -> shards with no current raw partition) of a
    core table, with a warning naming them: a source whose shard failed is never reported as if it were whole."""
    missing = {}
    for t in SOURCES[source].tables:
        name = raw_table_name(source, t)
        keys = [k for k, path in traces.shards(source, t).items() if not warehouse.is_current(name, k, path)]
        if keys:
            missing[t] = keys
    if missing:
        log.warning(describe_missing_shards(source, traces.root, missing))
    return {"is_partial_source": bool(missing), "missing_raw_shards": dg.MetadataValue.json(missing)}


@dg.asset(
    partitions_def=SOURCE_PARTITIONS,
    deps=RAW_DEPS,
    group_name="core",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    check_specs=checks.specs("core__workloads"),
)
def core__workloads(context: dg.AssetExecutionContext, warehouse: Warehouse, traces: TraceFolder):
    """One row per workload (Google: a task; Alibaba: a container; derived: a job or job-day): source,
    machine, start/end (trace seconds), usage records, requested CPU and memory as fractions of a machine,
    priority, scheduling class, final state and whether it was only partly recorded."""
    source = context.partition_key
    raw = load_raw(warehouse, traces, source, context.log)
    context.log.info(f"raw tables available: {sorted(raw)}")
    workloads = build_workloads(source, raw)
    yield dg.Output(workloads, metadata=partial_source_metadata(warehouse, traces, source, context.log))
    yield from checks.table_results("core__workloads", workloads, may_be_empty=not raw)


@dg.asset(
    partitions_def=SOURCE_PARTITIONS,
    deps=RAW_DEPS,
    group_name="core",
    kinds={"parquet", "polars"},
    check_specs=checks.specs("core__usage", USAGE_CHECK_DOCS, blocking=("usage_contract",)),
)
def core__usage(
    context: dg.AssetExecutionContext, config: UsageRunConfig, warehouse: Warehouse, traces: TraceFolder
) -> dg.MaterializeResult:
    """One row per workload per 5-minute bin: CPU and memory as fractions of one machine, the number of raw
    samples averaged into the bin, and whether the gap-filling policy produced it (`is_filled`). Written as a
    folder of chunk files per source (one per slice of trace time), never held in memory whole."""
    source, settings = context.partition_key, config.build()
    raw, cfg = load_raw(warehouse, traces, source, context.log), settings.for_source(source)
    context.log.info(f"{source}: gap filling {cfg.fill_policy}, at most {cfg.max_fill_bins} bin(s)")
    counts: list[pl.DataFrame] = []

    def chunks():
        pieces = iter_usage_chunks(source, raw, cfg, **settings.chunking(source), log=context.log.info)
        for usage, chunk_counts in pieces:
            counts.append(chunk_counts)
            yield usage

    folder, rows = warehouse.write_chunks("core__usage", source, chunks(), empty_frame(USAGE))
    totals = sum_counts(counts)
    context.log.info(f"{source}: {rows} usage bins written; counts: {totals}")
    values = check_usage_files(warehouse.partition_files("core__usage", source))
    above = values["usage_within_one_machine"]
    line = above_one_machine_line(source, above["metadata"])
    (context.log.info if above["passed"] else context.log.warning)(line)
    return dg.MaterializeResult(
        check_results=[
            dg.AssetCheckResult(check_name=name, severity=severity, **values[name])
            for name, severity in [
                ("usage_contract", dg.AssetCheckSeverity.ERROR),
                ("usage_within_one_machine", dg.AssetCheckSeverity.WARN),
            ]
        ],
        metadata={
            **totals,
            **frame_metadata(warehouse.scan("core__usage", [source]).head(10).collect()),
            **partial_source_metadata(warehouse, traces, source, context.log),
            "dagster/row_count": rows,
            "path": dg.MetadataValue.path(str(folder)),
        },
    )


@dg.multi_asset(
    outs={name: dg.AssetOut(description=text, **TABLE_OUT) for name, text in LONG_RUNNING_TABLE_DOCS.items()},
    partitions_def=SOURCE_PARTITIONS,
    group_name="core",
    deps=["core__usage"],
    check_specs=[
        *checks.specs("core__long_running"),
        *checks.specs("core__long_running_report", REPORT_CHECK_DOCS),
        *checks.specs("core__long_running_judged", JUDGED_CHECK_DOCS),
    ],
)
def core__long_running(
    context: dg.AssetExecutionContext,
    config: LongRunningRunConfig,
    warehouse: Warehouse,
    core__workloads: pl.DataFrame,
):
    usage = warehouse.scan("core__usage", [context.partition_key])
    kept, report, judged = long_running_tables(core__workloads, usage, config.build())
    context.log.info("long-running filter:\n" + str(report))
    yield dg.Output(kept, output_name="core__long_running")
    yield dg.Output(
        report,
        output_name="core__long_running_report",
        metadata={"report": dg.MetadataValue.md("\n".join(f"- {r}: {n}" for _, r, n in report.iter_rows()))},
    )
    yield dg.Output(judged, output_name="core__long_running_judged")
    yield from checks.table_results("core__long_running", kept)
    yield dg.AssetCheckResult(
        asset_key="core__long_running_judged",
        check_name="every_workload_judged_once",
        **check_judged(judged, core__workloads, report),
    )
    yield dg.AssetCheckResult(
        asset_key="core__long_running_report",
        check_name="every_workload_counted_once",
        **check_report(report, len(core__workloads)),
    )


CORE_ASSETS = [core__workloads, core__usage, core__long_running]
CORE_CHECKS: list = []
