"""Raw tables: one partitioned asset per (trace source, table), one partition per input shard.

Generated from `SOURCES`: a new source adds its tables here with no Dagster code. Partitions are the shard files
found when the definitions load. Files no table reads are logged and counted (`n_unread_files`, `unread_files`).
"""

import dataclasses
from pathlib import Path

import dagster as dg
import polars as pl

from assets.io_manager import frame_metadata
from assets.resources import Warehouse, partition_file_stem
from pipelines.ingest import (
    QUARANTINE_TABLE,
    StalePartition,
    check_rows_add_up,
    describe_raw_table,
    ingest_shard,
    quarantine_key,
    quarantine_reason_counts,
    raw_table_name,
    reject_colliding_shards,
)
from pipelines.sources import SOURCES, TraceSource
from pipelines.sources.base import describe_unread_files, expected_files, find_unread_files

NO_SHARD = "no-shard-found"
"""Placeholder partition of a table whose folder has no shard yet (materialising it fails clearly)."""


def build_raw_asset(source: TraceSource, table: str, trace_root: Path) -> dg.AssetsDefinition:
    """The partitioned asset that ingests one table of one source, shard by shard."""
    name = raw_table_name(source.name, table)
    found = source.discover(trace_root, table)
    reject_colliding_shards(name, found, partition_file_stem)

    @dg.asset(
        name=name,
        group_name=f"raw_{source.name}",
        partitions_def=dg.StaticPartitionsDefinition(sorted(found) or [NO_SHARD]),
        description=describe_raw_table(source, table),
        check_specs=[
            dg.AssetCheckSpec("rows_add_up", asset=name, description="rows read = rows written + quarantined")
        ],
        kinds={"parquet", "polars"},
    )
    def _raw(context: dg.AssetExecutionContext, warehouse: Warehouse) -> dg.MaterializeResult:
        shard = context.partition_key
        found = source.discover(trace_root, table)
        unread = find_unread_files(source, trace_root)
        unread_text = describe_unread_files(source, trace_root, unread) if unread else None
        if unread:
            context.log.warning(unread_text)
        if shard not in found:
            raise FileNotFoundError(
                f"{name}: shard {shard!r} not found under {trace_root / source.folder} "
                f"(found {len(found)} shard(s)); check TVW_TRACE_DIR. Expected names: "
                f"{expected_files(source)[table]}"
            )
        out = warehouse.partition_path(name, shard)
        quarantine = warehouse.partition_path(QUARANTINE_TABLE, quarantine_key(source.name, table, shard))
        stats = ingest_shard(source, table, found[shard], out, quarantine)
        warehouse.write_source_manifest(name, shard, found[shard])
        warehouse.refresh_view(name)
        warehouse.refresh_view(QUARANTINE_TABLE)
        context.log.info(
            f"{name}[{shard}]: {stats.rows_in} rows in, {stats.rows_written} written, "
            f"{stats.rows_quarantined} quarantined"
        )
        reasons = quarantine_reason_counts(quarantine)
        if reasons:
            context.log.warning(f"{name}[{shard}]: quarantined lines by reason: {reasons}")
        return dg.MaterializeResult(
            metadata={
                **frame_metadata(pl.scan_parquet(out).head(10).collect()),
                "quarantine_path": dg.MetadataValue.path(str(quarantine)),
                **{k: v for k, v in dataclasses.asdict(stats).items() if isinstance(v, int | float)},
                "dagster/row_count": stats.rows_written,
                "source_file": dg.MetadataValue.path(str(found[shard])),
                "quarantined_by_reason": dg.MetadataValue.json(reasons),
                "path": dg.MetadataValue.path(str(out)),
                "n_unread_files": len(unread),
                **({"unread_files": dg.MetadataValue.text(unread_text)} if unread else {}),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="rows_add_up",
                    severity=dg.AssetCheckSeverity.ERROR,
                    **check_rows_add_up(stats, out, quarantine),  # the files' footers: what is on disk
                )
            ],
        )

    return _raw


def find_stale_raw(
    warehouse: Warehouse, root: Path, sources: list[str] | None = None
) -> list[StalePartition]:
    """Raw partitions (of `sources`, default all) whose input file is not in the trace folder `root` now (left by a run
    over another trace folder, or by a shard since deleted), or that were ingested from another file."""
    stale: list[StalePartition] = []
    for src in [SOURCES[s] for s in (sources or SOURCES)]:
        for table in src.tables:
            name = raw_table_name(src.name, table)
            current = {partition_file_stem(k): (k, p) for k, p in src.discover(root, table).items()}
            for stem in warehouse.partition_keys_on_disk(name):
                if stem not in current:
                    stale.append(StalePartition(name, stem, "no such shard in the trace folder"))
                elif not warehouse.is_current(name, *current[stem]):
                    stale.append(StalePartition(name, stem, "ingested from another file"))
    return stale


def remove_stale_raw(
    warehouse: Warehouse, root: Path, sources: list[str] | None = None
) -> list[StalePartition]:
    """Delete every stale raw partition (and its rows in `raw_quarantine`); return what was removed."""
    stale = find_stale_raw(warehouse, root, sources)
    for p in stale:
        warehouse.remove_partition(p.table, p.stem)
        # quarantine stem of shard S of raw_<source>__<table>: <source>__<table>__<stem of S>
        warehouse.remove_partition(QUARANTINE_TABLE, f"{p.table.removeprefix('raw_')}__{p.stem}")
    for table in {p.table for p in stale} | ({QUARANTINE_TABLE} if stale else set()):
        warehouse.refresh_view(table)
    return stale


def build_raw_assets(trace_root: Path) -> list[dg.AssetsDefinition]:
    """Every raw asset of every registered source."""
    return [build_raw_asset(src, table, trace_root) for src in SOURCES.values() for table in src.tables]
