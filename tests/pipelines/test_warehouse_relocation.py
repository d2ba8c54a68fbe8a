"""A warehouse moved or copied whole (`cp -r warehouse /elsewhere && rm -rf warehouse`) answers every view with
the same rows, from any working directory and from the `duckdb` command, and its integrity guard still sees
every raw partition as current when the trace folder moved with it."""

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipelines.warehouse import ParquetWarehouse

RAW = "raw_src__events"
SHARDS = {"part-00000.csv.gz": [1, 2, 3], "part-00001.csv.gz": [4, 5]}


def _build(root: Path) -> ParquetWarehouse:
    """Traces and a warehouse under `root`: a raw table with a manifest per shard, a chunked partitioned table
    and an unpartitioned one."""
    traces = root / "traces"
    traces.mkdir(parents=True)
    wh = ParquetWarehouse(root / "warehouse")
    for shard, ids in SHARDS.items():
        (traces / shard).write_text("\n".join(map(str, ids)))
        wh.write(RAW, pl.DataFrame({"job_id": ids}), shard)
        wh.write_source_manifest(RAW, shard, traces / shard)
    for key, n in (("a", 4), ("b", 0), ("c", 7)):
        frame = pl.DataFrame({"bin": list(range(n))}, schema={"bin": pl.Int64})
        wh.write_chunks("core__usage", key, [frame.head(2), frame.tail(max(n - 2, 0))], frame.clear())
    wh.write("eval__summary", pl.DataFrame({"policy": ["x", "y"], "score": [1.0, 2.0]}))
    return wh


def _counts(con: duckdb.DuckDBPyConnection, tables: list[str]) -> dict[str, int]:
    return {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}


def _copy_and_delete(src: Path, dst: Path) -> None:
    """`cp -r` (new modification times) then delete the original."""
    shutil.copytree(src, dst, copy_function=shutil.copy)
    shutil.rmtree(src)


@pytest.fixture
def moved(tmp_path, monkeypatch):
    """(counts before the move, the moved warehouse, the moved trace folder); the working directory is
    another folder."""
    wh = _build(tmp_path / "before")
    before = {t: wh.query(f'select count(*) as n from "{t}"')["n"][0] for t in wh.tables()}
    _copy_and_delete(tmp_path / "before", tmp_path / "after")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return before, ParquetWarehouse(tmp_path / "after" / "warehouse"), tmp_path / "after" / "traces"


def test_the_warehouse_has_the_tables_it_was_given(moved):
    before, _, _ = moved
    assert before == {RAW: 5, "core__usage": 11, "eval__summary": 2}


def test_every_view_answers_the_same_rows_after_the_move(moved):
    before, wh, _ = moved
    assert {t: wh.query(f'select count(*) as n from "{t}"')["n"][0] for t in before} == before


def test_no_view_names_an_absolute_path(moved, tmp_path):
    _, wh, _ = moved
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        sqls = [sql for (sql,) in con.sql("select sql from duckdb_views() where not internal").fetchall()]
    assert len(sqls) == 3
    assert not [s for s in sqls if str(tmp_path) in s]


def test_the_duckdb_python_api_reads_the_moved_views_from_any_folder(moved, monkeypatch):
    before, wh, _ = moved
    # the file by its path, from an unrelated working directory
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        assert _counts(con, list(before)) == before
    # the file by its bare name, from the warehouse folder
    monkeypatch.chdir(wh.root)
    with duckdb.connect("tvw.duckdb", read_only=True) as con:
        assert _counts(con, list(before)) == before


def test_an_attached_warehouse_needs_only_its_folder_named(moved):
    before, wh, _ = moved
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{wh.duckdb_path}' AS w (READ_ONLY)")
        with pytest.raises(duckdb.IOException):  # the attaching session's temp_directory names no warehouse
            con.sql("select count(*) from w.eval__summary").fetchall()
        con.execute(f"SET VARIABLE tvw_root = '{wh.root}'")
        assert {t: con.execute(f'select count(*) from w."{t}"').fetchone()[0] for t in before} == before


def test_the_duckdb_command_reads_the_moved_views(moved):
    before, wh, _ = moved
    cli = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which("duckdb")
    if cli is None:
        pytest.skip("the duckdb command (duckdb-cli) is not installed")
    sql = " union all ".join(f"select '{t}', count(*) from \"{t}\"" for t in before)
    out = subprocess.run(
        [cli, "-readonly", "-csv", "-noheader", str(wh.duckdb_path), sql],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert dict(line.split(",") for line in out.split()) == {t: str(n) for t, n in before.items()}


def test_the_integrity_guard_sees_every_partition_of_the_moved_traces(moved):
    _, wh, traces = moved
    stems = sorted(wh.partition_keys_on_disk(RAW))
    assert len(stems) == len(SHARDS)
    assert all(wh.is_current(RAW, shard, traces / shard) for shard in SHARDS)
    # the match was recorded: the manifest now names the moved file
    assert all(str((traces / s).resolve()) in wh.manifest_path(RAW, s).read_text() for s in SHARDS)


def test_a_file_of_the_same_name_and_size_with_other_content_is_not_current(moved):
    _, wh, traces = moved
    shard = "part-00000.csv.gz"
    text = (traces / shard).read_text()
    (traces / shard).write_text(text.replace("3", "9"))
    assert not wh.is_current(RAW, shard, traces / shard)
    (traces / shard).write_text(text + "\n6")
    assert not wh.is_current(RAW, shard, traces / shard)
    (traces / shard).write_text(text)
    assert wh.is_current(RAW, shard, traces / shard)


def test_refresh_views_rebuilds_absolute_views_of_an_older_warehouse(tmp_path, monkeypatch):
    wh = _build(tmp_path / "before")
    glob = wh.table_dir("eval__summary") / "**" / "*.parquet"
    with duckdb.connect(str(wh.duckdb_path)) as con:  # the view as written before views were relative
        con.execute(f"CREATE OR REPLACE VIEW eval__summary AS SELECT * FROM read_parquet('{glob}')")
    wh.refresh_views()
    _copy_and_delete(tmp_path / "before", tmp_path / "after")
    monkeypatch.chdir(tmp_path)
    assert ParquetWarehouse(tmp_path / "after" / "warehouse").query("select * from eval__summary").height == 2


def test_refresh_views_drops_the_view_of_an_emptied_table(tmp_path):
    wh = _build(tmp_path)
    for stem in wh.partition_keys_on_disk("eval__summary"):
        wh.remove_partition("eval__summary", stem)
    wh.refresh_views()
    names = set(wh.query("select view_name from duckdb_views() where not internal")["view_name"])
    assert names == {RAW, "core__usage"}


def test_a_shard_that_is_a_folder_is_hashed_by_its_files(tmp_path):
    """A Bitbrains month is a folder of VM files: its manifest covers their content, and one changed VM file
    makes the partition stale though the folder's own size and time do not change."""
    import polars as pl

    from pipelines.warehouse import ParquetWarehouse

    month = tmp_path / "traces" / "2013-7"
    month.mkdir(parents=True)
    (month / "1.csv").write_text("a;b\n1;2\n")
    (month / "2.csv").write_text("a;b\n3;4\n")
    wh = ParquetWarehouse(root=str(tmp_path / "wh"))
    wh.write("raw_bitbrains__vm_usage", pl.DataFrame({"a": [1]}), "2013-7")
    wh.write_source_manifest("raw_bitbrains__vm_usage", "2013-7", month)
    assert wh.is_current("raw_bitbrains__vm_usage", "2013-7", month)
    (month / "2.csv").write_text("a;b\n3;5\n")  # same size, other content
    assert not wh.is_current("raw_bitbrains__vm_usage", "2013-7", month)


def test_a_reader_holding_the_database_open_never_costs_a_writer_a_view(tmp_path):
    """A session that keeps tvw.duckdb open (the duckdb CLI, a notebook) while a run writes: every write is quick,
    every table gets its view for the next reader, and the open session still answers from what it opened."""
    import time

    import duckdb
    import polars as pl

    from pipelines.warehouse import ParquetWarehouse

    wh = ParquetWarehouse(root=str(tmp_path / "wh"))
    wh.write("first", pl.DataFrame({"x": [1, 2]}))
    reader = duckdb.connect(str(wh.duckdb_path), read_only=True)
    try:
        t0 = time.perf_counter()
        for i in range(5):
            wh.write(f"later_{i}", pl.DataFrame({"x": list(range(i + 1))}))
        assert time.perf_counter() - t0 < 5  # no lock waits
        assert reader.execute('select count(*) from "first"').fetchone()[0] == 2
    finally:
        reader.close()
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        names = {
            r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()
        }
    assert names == {"first", *(f"later_{i}" for i in range(5))}
    assert wh.query('select count(*) as n from "later_4"')["n"][0] == 5


def test_identifiers_are_quoted():
    from pipelines.warehouse import quoted, view_sql

    assert quoted('a"b') == '"a""b"'
    assert view_sql('odd"name').startswith('CREATE OR REPLACE VIEW "odd""name" AS')
