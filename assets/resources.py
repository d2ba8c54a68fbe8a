"""The warehouse: Parquet files as the store of record, DuckDB views over them as the query layer.

Layout under `root`:
    tables/<table>/<partition>.parquet          one file per Dagster partition ("all" when unpartitioned)
    tables/<table>/<partition>/chunk-NNNNN.parquet  or a folder of chunks, for tables too big to hold whole
    tvw.duckdb                                   one view per table over tables/<table>/**/*.parquet

Writers never hold the DuckDB file: they write Parquet atomically, then open the database for the
instant it takes to (re)create the view. A user's `duckdb warehouse/tvw.duckdb` session therefore
only conflicts with a writer during that instant, and then the view refresh is retried.
"""

import json
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import duckdb
import polars as pl
from dagster import ConfigurableResource, get_dagster_logger

from pipelines.sources import SOURCES
from pipelines.storage import write_parquet_atomic

UNPARTITIONED = "all"
CLI_STORAGE_VERSION = "v1.4.0"
"""Oldest storage format readable by both duckdb 2.0 (Python) and the duckdb-cli 1.5 command."""
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")


def partition_file_stem(partition_key: str | None) -> str:
    """File name (without .parquet) for a partition key: shard names keep their stem, unsafe chars become '_'."""
    if not partition_key:
        return UNPARTITIONED
    stem = partition_key
    for suffix in (".gz", ".tar", ".csv"):
        stem = stem.removesuffix(suffix)
    return _SAFE.sub("_", stem)


class TraceFolder(ConfigurableResource):
    """The trace folder a run reads (`TVW_TRACE_DIR`): one subfolder per source in the public layout."""

    root: str

    def shards(self, source: str, table: str) -> dict[str, Path]:
        """Shard file name (= raw partition key) -> path, for one table of one source, as found now."""
        return SOURCES[source].discover(Path(self.root), table)


class Warehouse(ConfigurableResource):
    """Where every table lives: Parquet files under `root`, DuckDB views in `root/tvw.duckdb`."""

    root: str

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

    def manifest_path(self, table: str, partition_key: str) -> Path:
        """Sidecar of a raw partition naming the input file it was ingested from (views read only *.parquet)."""
        return self.partition_path(table, partition_key).with_suffix(".source.json")

    def write_source_manifest(self, table: str, partition_key: str, source_file: Path) -> None:
        """Record which file (path, size, modification time) a raw partition was ingested from."""
        st = source_file.stat()
        record = {
            "source_file": str(source_file.resolve()),
            "size_bytes": st.st_size,
            "mtime_ns": st.st_mtime_ns,
        }
        path = self.manifest_path(table, partition_key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def is_current(self, table: str, partition_key: str, source_file: Path) -> bool:
        """Whether the partition exists and was ingested from exactly this file as it is now (same path,
        size and modification time): a partition from another trace folder, or from a file since
        replaced, is not."""
        manifest = self.manifest_path(table, partition_key)
        if not self.partition_files(table, partition_key) or not manifest.exists():
            return False
        record = json.loads(manifest.read_text())
        st = source_file.stat()
        return (record.get("source_file"), record.get("size_bytes"), record.get("mtime_ns")) == (
            str(source_file.resolve()),
            st.st_size,
            st.st_mtime_ns,
        )

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

    def refresh_view(self, table: str, retries: int = 20) -> None:
        """(Re)create the DuckDB view of `table` over its files; drop it when it has none."""
        files = self.table_files(table)
        glob = str(self.table_dir(table) / "**" / "*.parquet").replace("'", "''")
        sql = (
            f"CREATE OR REPLACE VIEW \"{table}\" AS SELECT * FROM read_parquet('{glob}', union_by_name = true)"
            if files
            else f'DROP VIEW IF EXISTS "{table}"'
        )
        self.duckdb_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(retries):
            try:
                self._ensure_database()
                with duckdb.connect(str(self.duckdb_path)) as con:
                    con.execute(sql)
                return
            except duckdb.IOException as exc:  # another process holds the file lock
                if attempt == retries - 1:
                    get_dagster_logger().warning(f"could not refresh DuckDB view {table!r}: {exc}")
                    return
                time.sleep(0.25)

    def _ensure_database(self) -> None:
        """Create the database file in a storage format the `duckdb` command-line tool (duckdb-cli 1.5)
        can open; the Python package (2.0) would otherwise write a newer one that the CLI refuses."""
        if self.duckdb_path.exists():
            return
        path = str(self.duckdb_path).replace("'", "''")
        with duckdb.connect() as con:
            con.execute(f"ATTACH '{path}' AS warehouse (STORAGE_VERSION '{CLI_STORAGE_VERSION}')")
            con.execute("DETACH warehouse")

    def query(self, sql: str) -> pl.DataFrame:
        """Run a read-only query against the views (opens the database read-only)."""
        with duckdb.connect(str(self.duckdb_path), read_only=True) as con:
            return pl.from_arrow(con.sql(sql).to_arrow_table())
