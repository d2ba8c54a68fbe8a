"""Streamed ingest of one raw trace file (a "shard") into one Parquet file plus its quarantine file.

The file is read in chunks of whole lines, each chunk parsed by the source into the raw schema,
and written as a row group; memory stays bounded by a few chunks whatever the file size. Both
outputs appear atomically at the end (temp file + rename): on any error neither is touched.

A bad line costs that line only: a wrong field count, bytes that are not UTF-8, an unparsable, non-finite or
out-of-range value (each source declares the valid range of every numeric column, `CsvTable.ranges`) send it to
the quarantine file with file, line and reason, counted; only a file-level fault fails the shard. A clean chunk
takes the fast path (one polars read, one vectorised test of every range); decoding errors are looked for only
after polars has refused a chunk.

Memory (measured, 64 MB chunks): at most 3 parsed chunks are alive (one being encoded, one queued, one
being parsed) besides the raw bytes read ahead; the only state that grows with the file is the source's
per-workload time maxima for the order check (`pipelines.sources.base.CsvChunkParser`), one row per workload.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import QUARANTINE
from pipelines.sources.base import DEFAULT_BATCH_BYTES, IngestError, TraceSource, expected_files
from pipelines.storage import open_parquet_stream, polars_to_arrow_schema

__all__ = [
    "QUARANTINE_TABLE",
    "IngestError",
    "IngestStats",
    "StalePartition",
    "check_rows_add_up",
    "describe_missing_shards",
    "describe_raw_table",
    "ingest_shard",
    "parquet_rows",
    "quarantine_key",
    "quarantine_reason_counts",
    "raw_table_name",
    "reject_colliding_shards",
]


@dataclass(frozen=True)
class IngestStats:
    """Counts of one ingested shard. Invariant: rows_in == rows_written + rows_quarantined."""

    source: str
    table: str
    source_file: str  # file name (the shard key)
    bytes_in: int  # size of the input file (or folder of files) on disk, compressed if it is
    rows_in: int  # input lines (records)
    rows_written: int  # rows in the output Parquet file
    rows_quarantined: int  # rows in the quarantine Parquet file
    n_invalid_markers: int  # documented invalid values turned into null (Alibaba -1/101)
    seconds: float  # wall-clock time of the ingest
    n_duplicate_rows: int = 0  # written rows equal to an earlier written row in every column (kept, counted)


@contextmanager
def _background(fn: Callable[[object], object], depth: int = 2) -> Iterator[Callable[[object], None]]:
    """Run `fn(item)` for each submitted item in one worker thread, in order, at most `depth` queued.

    Parquet encoding (pyarrow frees the GIL) then overlaps with parsing the next chunk. An error in
    the worker is re-raised in the caller at the next submit or on exit.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    errors: list[BaseException] = []

    def work() -> None:
        while (item := q.get()) is not _STOP:
            if not errors:
                try:
                    fn(item)
                except BaseException as e:
                    errors.append(e)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def submit(item: object) -> None:
        if errors:
            raise errors[0]
        q.put(item)

    try:
        yield submit
    finally:
        q.put(_STOP)
        thread.join()
    if errors:
        raise errors[0]


_STOP = object()


def input_bytes(path: Path) -> int:
    """Size on disk of an input partition: the file, or every file under the folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def ingest_shard(
    source: TraceSource,
    table: str,
    path: Path,
    out_path: Path,
    quarantine_path: Path,
    *,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> IngestStats:
    """Parse `path` (one input partition of `source`'s `table`: a file, or a folder the source reads) into `out_path` (raw schema) and `quarantine_path`.

    Raises `IngestError` for file-level faults (missing, empty, not gzip / truncated, wrong format);
    then nothing is written and existing outputs stay as they were.
    """
    t0 = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise IngestError(path, "file not found")
    schema = RAW_SCHEMAS[source.name][table]
    rows_in = written = quarantined = markers = 0
    with (
        open_parquet_stream(out_path, polars_to_arrow_schema(schema)) as out,
        open_parquet_stream(quarantine_path, polars_to_arrow_schema(QUARANTINE)) as qout,
        _background(lambda b: (out.write(b.rows), qout.write(b.quarantine)), depth=1) as write,
    ):
        for batch in source.iter_batches(table, path, batch_bytes):
            write(batch)
            rows_in += batch.n_lines
            written += batch.rows.height
            quarantined += batch.quarantine.height
            markers += batch.n_invalid_markers
        if rows_in != written + quarantined:  # a source miscounted: publish nothing
            raise IngestError(
                path, f"row count mismatch: {rows_in} in, {written} written + {quarantined} quarantined"
            )
    return IngestStats(
        source=source.name,
        table=table,
        source_file=path.name,
        bytes_in=input_bytes(path),
        rows_in=rows_in,
        rows_written=written,
        rows_quarantined=quarantined,
        n_invalid_markers=markers,
        seconds=time.perf_counter() - t0,
        n_duplicate_rows=duplicate_rows(out_path),
    )


def duplicate_rows(parquet: Path) -> int:
    """Rows of a Parquet file that repeat an earlier row in every column (DuckDB's hash aggregate: bounded
    memory, spills to disk on a full-size shard)."""
    file = str(parquet).replace("'", "''")
    with duckdb.connect() as con:
        total, distinct = con.execute(
            f"select (select count(*) from read_parquet('{file}')), "
            f"(select count(*) from (select distinct * from read_parquet('{file}')))"
        ).fetchone()
    return int(total - distinct)


# ---------------------------------------------------------------- raw tables: names, descriptions, shards

QUARANTINE_TABLE = "raw_quarantine"
"""The table of every line set aside at ingest (file, line, reason), one partition per ingested shard."""


def raw_table_name(source: str, table: str) -> str:
    """Warehouse (and asset) name of one raw table of one source."""
    return f"raw_{source}__{table}"


def quarantine_key(source: str, table: str, shard: str) -> str:
    """Partition of `QUARANTINE_TABLE` holding the lines set aside from one shard."""
    return f"{source}__{table}__{shard}"


def describe_raw_table(source: TraceSource, table: str) -> str:
    """What a raw table holds: where its files are, where bad lines go, which files are read, its columns."""
    cols = ", ".join(f"`{c}` {t}" for c, t in RAW_SCHEMAS[source.name][table].items())
    return (
        f"Raw `{table}` table of the `{source.name}` trace, parsed from its genuine files under "
        f"`<trace dir>/{source.folder}/`, one Parquet file per input shard (zstd). Rows that cannot be "
        f"parsed go to `{QUARANTINE_TABLE}` with file, line and reason. Files read: "
        f"{expected_files(source)[table]}\n\nColumns: {cols}"
    )


def reject_colliding_shards(name: str, keys: Iterable[str], stem: Callable[[str], str]) -> None:
    """ValueError when two shard keys of table `name` would write the same output file stem (e.g. `x.csv` beside
    `x.csv.gz`): they would overwrite each other's output."""
    by_stem: dict[str, list[str]] = {}
    for key in keys:
        by_stem.setdefault(stem(key), []).append(key)
    clashes = {s: ks for s, ks in by_stem.items() if len(ks) > 1}
    if clashes:
        raise ValueError(
            f"{name}: shard files {clashes} would overwrite each other's output; keep one copy of each shard"
        )


def parquet_rows(path: Path) -> int:
    """Row count from a Parquet file's footer (no data read)."""
    return pq.ParquetFile(path).metadata.num_rows


def check_rows_add_up(stats: IngestStats, out: Path, quarantine: Path) -> dict:
    """`passed` and `metadata` of a shard's `rows_add_up` check: rows read = rows in the published data file +
    rows in its quarantine file, both counted from the files' footers (what is on disk, not the ingest's own
    counters)."""
    written, quarantined = parquet_rows(out), parquet_rows(quarantine)
    return {
        "passed": stats.rows_in == written + quarantined,
        "metadata": {
            "rows_in": stats.rows_in,
            "rows_in_data_file": written,
            "rows_in_quarantine_file": quarantined,
        },
    }


def quarantine_reason_counts(quarantine: Path) -> dict[str, int]:
    """Quarantined lines of one shard per kind of reason (the reason up to its first ':', e.g. "non-finite
    cpu_util_pct", "invalid UTF-8 at byte 12"), most frequent first."""
    reasons = pl.scan_parquet(quarantine).select(pl.col("reason").str.split(":").list.first().alias("kind"))
    counts = reasons.group_by("kind").len().sort(["len", "kind"], descending=[True, False]).collect()
    return dict(counts.iter_rows())


@dataclass(frozen=True)
class StalePartition:
    """A raw partition in the warehouse that the current trace folder did not produce."""

    table: str
    stem: str
    reason: str  # "no such shard in the trace folder" | "ingested from another file"


def describe_missing_shards(source: str, root: Path, missing: dict[str, list[str]]) -> str:
    """The warning of a source built without some of its shards (raw table -> shards with no raw partition)."""
    listed = "; ".join(
        f"{t}: {', '.join(k[:5])}" + (" ..." if len(k) > 5 else "") for t, k in missing.items()
    )
    return (
        f"{source} is PARTIAL: {sum(map(len, missing.values()))} shard(s) in {root} have no raw table "
        f"(their ingest failed or has not run), built from the other shards only: {listed}"
    )
