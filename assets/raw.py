"""Raw tables: one partitioned asset per (trace source, table), one partition per input shard.

The assets are generated from the `SOURCES` registry: adding a source module adds its tables here
with no Dagster code. Partitions are the shard files found in the trace folder when the
definitions load (restart `dagster dev`, or reload the code location, after adding files).
Files in a source's folder that no table reads (a wrong name, an unsupported layout) are never skipped
silently: each raw run logs a warning naming them and the names expected, and records them in its metadata
(`n_unread_files`, `unread_files`).
"""

import dataclasses
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    StaticPartitionsDefinition,
    asset,
)

from assets.io_manager import frame_metadata
from assets.resources import Warehouse, partition_file_stem
from pipelines.ingest import ingest_shard
from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.sources import SOURCES, TraceSource
from pipelines.sources.base import describe_unread_files, expected_files, find_unread_files

QUARANTINE_TABLE = "raw_quarantine"
NO_SHARD = "no-shard-found"
"""Placeholder partition of a table whose folder has no shard yet (materialising it fails clearly)."""


def raw_table_name(source: str, table: str) -> str:
    return f"raw_{source}__{table}"


def _describe(source: TraceSource, table: str) -> str:
    cols = ", ".join(f"`{c}` {t}" for c, t in RAW_SCHEMAS[source.name][table].items())
    return (
        f"Raw `{table}` table of the `{source.name}` trace, parsed from its genuine files under "
        f"`<trace dir>/{source.folder}/`, one Parquet file per input shard (zstd). Rows that cannot be "
        f"parsed go to `{QUARANTINE_TABLE}` with file, line and reason. Files read: "
        f"{expected_files(source)[table]}\n\nColumns: {cols}"
    )


def _reject_colliding_shards(name: str, found: dict[str, Path]) -> None:
    """Two shard files that would write the same Parquet file (e.g. `x.csv` beside `x.csv.gz`) are an error."""
    by_stem: dict[str, list[str]] = {}
    for key in found:
        by_stem.setdefault(partition_file_stem(key), []).append(key)
    clashes = {stem: keys for stem, keys in by_stem.items() if len(keys) > 1}
    if clashes:
        raise ValueError(
            f"{name}: shard files {clashes} would overwrite each other's output; keep one copy of each shard"
        )


def parquet_rows(path: Path) -> int:
    """Row count from a Parquet file's footer (no data read)."""
    return pq.ParquetFile(path).metadata.num_rows


def build_raw_asset(source: TraceSource, table: str, trace_root: Path) -> AssetsDefinition:
    """The partitioned asset that ingests one table of one source, shard by shard."""
    name = raw_table_name(source.name, table)
    found = source.discover(trace_root, table)
    _reject_colliding_shards(name, found)
    shards = sorted(found) or [NO_SHARD]

    @asset(
        name=name,
        group_name=f"raw_{source.name}",
        partitions_def=StaticPartitionsDefinition(shards),
        description=_describe(source, table),
        check_specs=[
            AssetCheckSpec(
                "rows_add_up",
                asset=name,
                description="rows read = rows written + rows quarantined, for the shard just ingested",
            )
        ],
        kinds={"parquet", "polars"},
    )
    def _raw(context: AssetExecutionContext, warehouse: Warehouse) -> MaterializeResult:
        shard = context.partition_key
        found = source.discover(trace_root, table)
        unread = find_unread_files(source, trace_root)
        if unread:
            context.log.warning(describe_unread_files(source, trace_root, unread))
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
        # re-read both published files' footers: the check sees what is on disk, not the ingest's own counters
        on_disk_rows, on_disk_quarantined = parquet_rows(out), parquet_rows(quarantine)
        added_up = stats.rows_in == on_disk_rows + on_disk_quarantined
        head = pl.scan_parquet(out).head(10).collect()
        reasons = quarantine_reason_counts(quarantine)
        if reasons:
            context.log.warning(f"{name}[{shard}]: quarantined lines by reason: {reasons}")
        return MaterializeResult(
            metadata={
                **frame_metadata(head),
                "quarantine_path": MetadataValue.path(str(quarantine)),
                **{k: v for k, v in dataclasses.asdict(stats).items() if isinstance(v, int | float)},
                "dagster/row_count": stats.rows_written,
                "source_file": MetadataValue.path(str(found[shard])),
                "quarantined_by_reason": MetadataValue.json(reasons),
                "path": MetadataValue.path(str(out)),
                **_unread_metadata(source, trace_root, unread),
            },
            check_results=[
                AssetCheckResult(
                    check_name="rows_add_up",
                    passed=added_up,
                    severity=AssetCheckSeverity.ERROR,
                    metadata={
                        "rows_in": stats.rows_in,
                        "rows_in_data_file": on_disk_rows,
                        "rows_in_quarantine_file": on_disk_quarantined,
                    },
                )
            ],
        )

    return _raw


def quarantine_reason_counts(quarantine: Path) -> dict[str, int]:
    """Quarantined lines of one shard per kind of reason (the reason up to its first ':', e.g. "non-finite
    cpu_util_pct", "invalid UTF-8 at byte 12"), most frequent first."""
    reasons = pl.scan_parquet(quarantine).select(pl.col("reason").str.split(":").list.first().alias("kind"))
    counts = reasons.group_by("kind").len().sort(["len", "kind"], descending=[True, False]).collect()
    return dict(counts.iter_rows())


def _unread_metadata(source: TraceSource, trace_root: Path, unread: list[Path]) -> dict:
    """`n_unread_files` always (0 when every file in the source's folder is read), and `unread_files` (the
    warning line: which files, which names are expected) when some are not."""
    if not unread:
        return {"n_unread_files": 0}
    return {
        "n_unread_files": len(unread),
        "unread_files": MetadataValue.text(describe_unread_files(source, trace_root, unread)),
    }


@dataclasses.dataclass(frozen=True)
class StalePartition:
    """A raw partition in the warehouse that the current trace folder did not produce."""

    table: str
    stem: str
    reason: str  # "no such shard in the trace folder" | "ingested from another file"


def quarantine_key(source: str, table: str, shard: str) -> str:
    return f"{source}__{table}__{shard}"


def find_stale_raw(
    warehouse: Warehouse, trace_root: Path, sources: list[str] | None = None
) -> list[StalePartition]:
    """Raw partitions (of `sources`, default all) whose input file is not in `trace_root` now (left by a run
    over another trace folder, or by a shard since deleted), or that were ingested from another file."""
    stale: list[StalePartition] = []
    for src in [SOURCES[s] for s in (sources or SOURCES)]:
        for table in src.tables:
            name = raw_table_name(src.name, table)
            found = src.discover(trace_root, table)
            current = {partition_file_stem(k): (k, p) for k, p in found.items()}
            for stem in warehouse.partition_keys_on_disk(name):
                if stem not in current:
                    stale.append(StalePartition(name, stem, "no such shard in the trace folder"))
                elif not warehouse.is_current(name, current[stem][0], current[stem][1]):
                    stale.append(StalePartition(name, stem, "ingested from another file"))
    return stale


def remove_stale_raw(
    warehouse: Warehouse, trace_root: Path, sources: list[str] | None = None
) -> list[StalePartition]:
    """Delete every stale raw partition (and its rows in `raw_quarantine`); return what was removed."""
    stale = find_stale_raw(warehouse, trace_root, sources)
    for p in stale:
        warehouse.remove_partition(p.table, p.stem)
        # quarantine stem of shard S of raw_<source>__<table>: <source>__<table>__<stem of S>
        warehouse.remove_partition(QUARANTINE_TABLE, f"{p.table.removeprefix('raw_')}__{p.stem}")
    for table in {p.table for p in stale} | ({QUARANTINE_TABLE} if stale else set()):
        warehouse.refresh_view(table)
    return stale


def build_raw_assets(trace_root: Path) -> list[AssetsDefinition]:
    """Every raw asset of every registered source."""
    return [build_raw_asset(src, table, trace_root) for src in SOURCES.values() for table in src.tables]
