"""The warehouse: Parquet files as the store of record, DuckDB views over them as the query layer.

Layout under `root`:
    tables/<table>/<partition>.parquet              one file per partition ("all" when unpartitioned)
    tables/<table>/<partition>/chunk-NNNNN.parquet  or a folder of chunks, for tables too big to hold whole
    tables/<table>/<partition>.source.json          for a raw partition: the input file it was ingested from
    tvw.duckdb                                      one view per table over tables/<table>/**/*.parquet

Writers never hold the DuckDB file: they write Parquet atomically, then open the database for the instant it
takes to (re)create the view. A user's `duckdb warehouse/tvw.duckdb` session therefore only conflicts with a
writer during that instant, and then the view refresh is retried.

A warehouse can be moved or copied whole (`cp -r warehouse /elsewhere`):
- The views name no absolute path. Each reads `<folder of the database file>/tables/<table>/**/*.parquet`,
  the folder taken when the view is queried from DuckDB's default `temp_directory` (`<database file>.tmp`),
  so `duckdb /elsewhere/tvw.duckdb` answers from any working directory with no setup. A session where that
  setting does not name the database file (the file ATTACHed to another database, or `temp_directory` set by
  hand) says where the warehouse is once: `SET VARIABLE tvw_root = '/elsewhere';` (this class does so on
  every connection it opens).
- The integrity guard (`is_current`) compares an input file's content (size and SHA-256), not its path: a
  trace folder moved or copied along with the warehouse keeps every partition current.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import re
import shutil
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

import duckdb
import polars as pl

from pipelines.storage import write_parquet_atomic

UNPARTITIONED = "all"
CLI_STORAGE_VERSION = "v1.4.0"
"""Oldest storage format readable by both duckdb 2.0 (Python) and the duckdb-cli 1.5 command."""
ROOT_VARIABLE = "tvw_root"
"""DuckDB variable that, when set in a session, names the warehouse folder the views read."""
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")
# the views' base folder, evaluated when a view is bound: the variable if set, else the database file's folder
# (empty when the file was opened from its own folder: the relative path then resolves against it)
_VIEW_ROOT = (
    f"coalesce(getvariable('{ROOT_VARIABLE}'), nullif(parse_dirpath(current_setting('temp_directory')), ''))"
)
log = logging.getLogger(__name__)


def partition_file_stem(partition_key: str | None) -> str:
    """File name (without .parquet) for a partition key: shard names keep their stem, unsafe chars become '_'."""
    if not partition_key:
        return UNPARTITIONED
    stem = partition_key
    for suffix in (".gz", ".tar", ".csv"):
        stem = stem.removesuffix(suffix)
    return _SAFE.sub("_", stem)


def quoted(identifier: str) -> str:
    """A SQL identifier in double quotes, inner quotes doubled."""
    return '"' + identifier.replace('"', '""') + '"'


def view_sql(table: str) -> str:
    """The statement creating `table`'s view over its Parquet files, relative to the database file."""
    glob = f"tables/{table}/**/*.parquet".replace("'", "''")
    return (
        f"CREATE OR REPLACE VIEW {quoted(table)} AS SELECT * FROM "
        f"read_parquet(concat_ws('/', {_VIEW_ROOT}, '{glob}'), union_by_name = true)"
    )


def _create_database(path: Path) -> None:
    """An empty database file in a storage format the `duckdb` command-line tool (duckdb-cli 1.5) can open; the
    Python package (2.0) would otherwise write a newer one that the CLI refuses."""
    with duckdb.connect() as con:
        con.execute(
            f"ATTACH '{str(path).replace(chr(39), chr(39) * 2)}' AS fresh (STORAGE_VERSION '{CLI_STORAGE_VERSION}')"
        )
        con.execute("DETACH fresh")


def shard_stat(path: Path) -> tuple[int, int]:
    """(bytes, latest modification time in ns) of a shard: a file, or every file in a shard folder."""
    path = Path(path)
    if not path.is_dir():
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    stats = [p.stat() for p in path.rglob("*") if p.is_file()]
    return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


def file_sha256(path: Path) -> str:
    """SHA-256 of a shard: of the file, or, for a shard that is a folder (a Bitbrains month of VM files), of
    every file in it (relative name and content, in name order)."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{f.relative_to(path)}\0{file_sha256(f)}\0".encode())
        return digest.hexdigest()
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def markdown_preview(df: pl.DataFrame, n: int = 10, max_chars: int = 40) -> str:
    """The first `n` rows of `df` as a Markdown table (long cells shortened)."""

    def cell(v: object) -> str:
        s = "" if v is None else str(v)
        s = s.replace("|", "\\|").replace("\n", " ")
        return s if len(s) <= max_chars else s[: max_chars - 1] + "…"

    head = df.head(n)
    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in head.iter_rows()]
    return "\n".join(lines)


class ParquetWarehouse:
    """Where every table lives: Parquet files under `root`, DuckDB views in `root/tvw.duckdb`.

    Methods read `self.root` only, so a Dagster resource with a `root` field can take them as a mixin."""

    def __init__(self, root: str | Path):
        self.root = root

    def _warn(self, message: str) -> None:
        log.warning(message)

    @property
    def duckdb_path(self) -> Path:
        return Path(self.root) / "tvw.duckdb"

    def table_dir(self, table: str) -> Path:
        return Path(self.root) / "tables" / table

    def partition_path(self, table: str, partition_key: str | None) -> Path:
        return self.table_dir(table) / f"{partition_file_stem(partition_key)}.parquet"

    def partition_files(self, table: str, partition_key: str | None) -> list[Path]:
        """The file of one partition, or its chunk files when it is stored as a folder."""
        single = self.partition_path(table, partition_key)
        if single.exists():
            return [single]
        folder = single.with_suffix("")
        self._restore_interrupted_swap(Path(self.root) / ".staging", table, folder)
        return sorted(folder.glob("*.parquet")) if folder.is_dir() else []

    def table_files(self, table: str, partition_keys: list[str] | None = None) -> list[Path]:
        """Existing files of a table (optionally only the given partitions), sorted."""
        if partition_keys is not None:
            return [f for k in partition_keys for f in self.partition_files(table, k)]
        d = self.table_dir(table)
        return sorted(d.glob("**/*.parquet")) if d.exists() else []

    def tables(self) -> list[str]:
        """Every table with a folder under tables/, sorted."""
        d = Path(self.root) / "tables"
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    # integrity of raw partitions

    def manifest_path(self, table: str, partition_key: str) -> Path:
        """Sidecar of a raw partition naming the input file it was ingested from (views read only *.parquet)."""
        return self.partition_path(table, partition_key).with_suffix(".source.json")

    def write_source_manifest(
        self, table: str, partition_key: str, source_file: Path, sha256: str | None = None
    ) -> None:
        """Record which file (path, size, modification time, SHA-256 of its content) a raw partition was
        ingested from."""
        size, mtime_ns = shard_stat(source_file)
        record = {
            "source_file": str(source_file.resolve()),
            "size_bytes": size,
            "mtime_ns": mtime_ns,
            "sha256": sha256 or file_sha256(source_file),
        }
        path = self.manifest_path(table, partition_key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def is_current(self, table: str, partition_key: str, source_file: Path) -> bool:
        """Whether the partition exists and was ingested from a file with exactly this file's content (same
        size and SHA-256), wherever either lies now: a partition from a different file of the same name (an
        earlier trace folder, a file since replaced) is not. The file as recorded (same path, size and
        modification time) is taken as unchanged without hashing; a match found by hashing is recorded, so
        a moved trace folder is hashed once."""
        manifest = self.manifest_path(table, partition_key)
        if not self.partition_files(table, partition_key) or not manifest.exists():
            return False
        record = json.loads(manifest.read_text())
        size, mtime_ns = shard_stat(source_file)
        if record.get("size_bytes") != size:
            return False
        if (record.get("source_file"), record.get("mtime_ns")) == (str(source_file.resolve()), mtime_ns):
            return True
        if record.get("sha256") != file_sha256(source_file):
            return False
        with contextlib.suppress(OSError):  # a read-only warehouse hashes again next time
            self.write_source_manifest(table, partition_key, source_file, sha256=record["sha256"])
        return True

    def partition_keys_on_disk(self, table: str) -> dict[str, list[Path]]:
        """Partition file stem -> its files (a single file, or a chunk folder's files), as stored now."""
        d = self.table_dir(table)
        if not d.is_dir():
            return {}
        out: dict[str, list[Path]] = {}
        for p in sorted(d.iterdir()):
            if p.is_dir():
                out[p.name] = sorted(p.glob("*.parquet"))
            elif p.suffix == ".parquet":
                out[p.stem] = [p]
        return out

    def remove_partition(self, table: str, stem: str) -> None:
        """Delete one stored partition (file or chunk folder) and its manifest."""
        d = self.table_dir(table)
        (d / f"{stem}.parquet").unlink(missing_ok=True)
        (d / f"{stem}.source.json").unlink(missing_ok=True)
        shutil.rmtree(d / stem, ignore_errors=True)

    # reading and writing

    def has_table(self, table: str) -> bool:
        return bool(self.table_files(table))

    def scan(self, table: str, partition_keys: list[str] | None = None) -> pl.LazyFrame:
        """Lazy scan over a table's files; raises naming the table when it has none."""
        files = self.table_files(table, partition_keys)
        if not files:
            raise FileNotFoundError(
                f"table {table!r} has no Parquet files under {self.table_dir(table)}"
                + (f" for partitions {partition_keys}" if partition_keys else "")
                + ": materialise it first"
            )
        return pl.scan_parquet([str(f) for f in files])

    def write(self, table: str, df: pl.DataFrame, partition_key: str | None = None) -> Path:
        """Write one partition of a table atomically and refresh its view."""
        path = write_parquet_atomic(df, self.partition_path(table, partition_key))
        shutil.rmtree(path.with_suffix(""), ignore_errors=True)  # a chunked version of this partition
        self.refresh_view(table)
        return path

    def write_chunks(
        self, table: str, partition_key: str | None, chunks: Iterable[pl.DataFrame], empty: pl.DataFrame
    ) -> tuple[Path, int]:
        """Write one partition as a folder of chunk files without ever holding it whole.

        Chunks go to a temporary sibling folder, which then replaces the partition's folder (and any single
        file of it): a crash mid-way leaves the previous version. Returns (folder, rows written). `empty`
        (a frame with the table's schema) is written as the one chunk when `chunks` yields no rows, so the
        partition still exists with its schema.
        """
        folder = self.partition_path(table, partition_key).with_suffix("")
        staging = Path(self.root) / ".staging"  # outside tables/: views and scans never see half a partition
        self._restore_interrupted_swap(staging, table, folder)
        tmp = staging / f"{table}.{folder.name}.{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        rows, n = 0, 0
        try:
            for chunk in chunks:
                if chunk.height:
                    write_parquet_atomic(chunk, tmp / f"chunk-{n:05d}.parquet")
                    rows, n = rows + chunk.height, n + 1
            if n == 0:
                write_parquet_atomic(empty, tmp / "chunk-00000.parquet")
            old = staging / f"{table}.{folder.name}.{uuid.uuid4().hex}.old"
            if folder.exists():
                folder.rename(old)
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
            self.partition_path(table, partition_key).unlink(missing_ok=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.refresh_view(table)
        return folder, rows

    @staticmethod
    def _restore_interrupted_swap(staging: Path, table: str, folder: Path) -> None:
        """A crash between the two renames of a swap leaves the previous version as `<table>.<name>.*.old` in
        staging and no partition folder: put the previous version back before reading or writing again."""
        if folder.exists() or not staging.exists():
            return
        olds = sorted(staging.glob(f"{table}.{folder.name}.*.old"), key=lambda p: p.stat().st_mtime)
        if olds:
            folder.parent.mkdir(parents=True, exist_ok=True)
            olds[-1].rename(folder)

    # the DuckDB views

    def refresh_view(self, table: str) -> None:
        """After `table` was written: its view, with every other table's (`refresh_views`)."""
        self.refresh_views()

    def refresh_views(self) -> None:
        """Rebuild the database with a view per table that has files (under tables/), in a fresh file swapped in
        atomically. A reader holding `tvw.duckdb` open (the duckdb CLI, a notebook) keeps the file it opened and
        never blocks a writer or costs it a view; writers take a lock file so that two rebuilds never drop each
        other's tables. Every view is rebuilt (one statement each); a table with no files has none. Rebuilds the
        views of a warehouse made before they were relative. Raises OSError naming the file when it cannot."""
        self.duckdb_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.duckdb_path.with_name(self.duckdb_path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fresh = self.duckdb_path.with_name(f".{self.duckdb_path.name}.{uuid.uuid4().hex}")
            try:
                _create_database(fresh)
                with duckdb.connect(str(fresh)) as con:
                    con.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [str(Path(self.root).resolve())])
                    for table in self.tables():
                        if self.table_files(table):
                            con.execute(view_sql(table))
                fresh.replace(self.duckdb_path)
                self.duckdb_path.with_name(self.duckdb_path.name + ".wal").unlink(missing_ok=True)
            finally:
                fresh.unlink(missing_ok=True)
                fresh.with_name(fresh.name + ".wal").unlink(missing_ok=True)

    def _ensure_database(self) -> None:
        if not self.duckdb_path.exists():
            self.refresh_views()

    def _connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        """A connection to the database whose views read this warehouse's folder, whatever DuckDB's settings."""
        con = duckdb.connect(str(self.duckdb_path), read_only=read_only)
        con.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [str(Path(self.root).resolve())])
        return con

    def query(self, sql: str) -> pl.DataFrame:
        """Run a read-only query against the views (opens the database read-only)."""
        self._ensure_database()
        with self._connect(read_only=True) as con:
            return pl.from_arrow(con.sql(sql).to_arrow_table())


if __name__ == "__main__":  # python -m pipelines.warehouse WAREHOUSE_DIR: rebuild every view
    ParquetWarehouse(sys.argv[1]).refresh_views()
