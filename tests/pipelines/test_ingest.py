"""ingest_shard: counts, quarantine reasons, file-level errors, atomic and idempotent writes."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import polars as pl
import pytest

from pipelines import ingest as ingest_mod
from pipelines.ingest import (
    IngestError,
    check_rows_add_up,
    describe_missing_shards,
    ingest_shard,
    quarantine_key,
    quarantine_reason_counts,
    raw_table_name,
    reject_colliding_shards,
)
from pipelines.schemas import QUARANTINE
from pipelines.sources import SOURCES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = FIXTURES / "traces"
BAD = FIXTURES / "bad"
GOOGLE = SOURCES["google2011"]
USAGE = ROOT / "google-2011/task_usage/part-00000-of-00500.csv.gz"


def run(tmp_path: Path, path: Path, source=GOOGLE, table="task_usage", **kw):
    out, q = tmp_path / "out.parquet", tmp_path / "q.parquet"
    return ingest_shard(source, table, path, out, q, **kw), out, q


def test_quarantine_reasons_and_line_numbers(tmp_path):
    st, out, q = run(tmp_path, BAD / "task_usage_bad_rows.csv.gz")
    assert (st.rows_in, st.rows_written, st.rows_quarantined) == (10, 3, 7)
    quarantine = pl.read_parquet(q)
    assert quarantine.schema == pl.Schema(QUARANTINE)
    assert quarantine.select("line_number", "reason").rows() == [
        (3, "wrong field count: 6 fields, expected 20"),
        (4, "unparsable task_index: 'x'"),
        (5, "negative cpu_rate_frac: -0.5"),
        (6, "empty machine_id"),
        (8, "start_time_us goes backwards for (job_id, task_index): 300000000 after 900000000"),
        (9, "wrong field count: 1 fields, expected 20"),
        (10, "is_aggregated is not a 0/1 flag: 7"),
    ]
    assert quarantine["raw_line"][0] == "600000000,900000000,3418314,0,3938719206,0.0003071"
    assert pl.read_parquet(out).select("start_time_us", "task_index").rows() == [
        (600_000_000, 0),
        (600_000_000, 1),
        (900_000_000, 0),
    ]


def test_order_check_spans_chunks(tmp_path):
    line = "{t},{e},7,0,1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,1.0,0.1,0,1,0.1\n"
    times = [600, 900, 1200, 900, 1500, 1200]  # seconds; lines 4 and 6 go backwards
    text = "".join(line.format(t=t * 10**6, e=(t + 300) * 10**6) for t in times)
    path = tmp_path / "in.csv"
    path.write_text(text)
    st, _, q = run(tmp_path, path, batch_bytes=len(line) * 2)  # ~2 lines per chunk
    assert (st.rows_written, st.rows_quarantined) == (4, 2)
    assert pl.read_parquet(q)["line_number"].to_list() == [4, 6]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("not_gzip.csv.gz", "cannot decompress"),
        ("truncated.csv.gz", "cannot decompress"),
        ("empty.csv.gz", "empty file"),
        ("empty_content.csv.gz", "empty file"),
        ("wrong_columns.csv.gz", "do not have 20 fields"),
        ("missing.csv.gz", "file not found"),
    ],
)
def test_file_level_errors_write_nothing(tmp_path, name, message):
    with pytest.raises(IngestError, match=message) as err:
        run(tmp_path, BAD / name)
    assert err.value.path.name == name
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_tar_without_the_table_member(tmp_path):
    folder = tmp_path / "alibaba-2018"
    folder.mkdir()
    shutil.copy(ROOT / "alibaba-2018/container_usage.tar.gz", folder / "machine_usage.tar.gz")
    with pytest.raises(IngestError, match="no matching member"):
        run(tmp_path, folder / "machine_usage.tar.gz", SOURCES["alibaba2018"], "machine_usage")


def test_error_keeps_previous_outputs_byte_identical(tmp_path):
    _, out, q = run(tmp_path, USAGE)
    before = out.read_bytes(), q.read_bytes()
    with pytest.raises(IngestError):
        run(tmp_path, BAD / "truncated.csv.gz")
    assert (out.read_bytes(), q.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "q.parquet"]


def test_crash_mid_stream_is_atomic(tmp_path, monkeypatch):
    _, out, q = run(tmp_path, USAGE)
    before = out.read_bytes(), q.read_bytes()
    real = GOOGLE.iter_batches

    class Crashing:
        name, folder, tables = GOOGLE.name, GOOGLE.folder, GOOGLE.tables

        def iter_batches(self, table, path, batch_bytes):
            for i, batch in enumerate(real(table, path, batch_bytes)):
                if i == 2:
                    raise RuntimeError("simulated crash")
                yield batch

    with pytest.raises(RuntimeError, match="simulated crash"):
        ingest_shard(Crashing(), "task_usage", USAGE, out, q, batch_bytes=4000)
    assert (out.read_bytes(), q.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "q.parquet"]


def test_miscounting_source_raises_and_writes_nothing(tmp_path):
    class Miscounting:
        name, folder, tables = GOOGLE.name, GOOGLE.folder, GOOGLE.tables

        def iter_batches(self, table, path, batch_bytes):
            for batch in GOOGLE.iter_batches(table, path, batch_bytes):
                yield type(batch)(batch.rows, batch.quarantine, batch.n_lines + 1)

    with pytest.raises(IngestError, match="row count mismatch"):
        ingest_shard(Miscounting(), "task_usage", USAGE, tmp_path / "o.parquet", tmp_path / "q.parquet")
    assert list(tmp_path.iterdir()) == []


def test_rerun_is_idempotent_and_chunking_invariant(tmp_path):
    _, out, q = run(tmp_path, USAGE, batch_bytes=5000)
    first = out.read_bytes(), q.read_bytes()
    _, out, q = run(tmp_path, USAGE, batch_bytes=5000)
    assert (out.read_bytes(), q.read_bytes()) == first
    one_chunk = ingest_shard(GOOGLE, "task_usage", USAGE, tmp_path / "big.parquet", tmp_path / "bq.parquet")
    assert one_chunk.rows_written == 300
    assert pl.read_parquet(tmp_path / "big.parquet").equals(pl.read_parquet(out))


def test_background_writer_error_surfaces(tmp_path):
    def boom(_):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), ingest_mod._background(boom) as submit:
        submit(1)
        submit(2)
        submit(3)


# ---------------------------------------------------------------- raw-table helpers of the raw assets


def test_colliding_shards_are_refused_naming_them():
    stem = lambda key: key.removesuffix(".gz").removesuffix(".csv")  # noqa: E731
    reject_colliding_shards("raw_x__t", ["a.csv", "b.csv.gz"], stem)
    with pytest.raises(ValueError, match=r"raw_x__t: shard files \{'a': \['a.csv', 'a.csv.gz'\]\}"):
        reject_colliding_shards("raw_x__t", ["a.csv", "a.csv.gz", "b.csv"], stem)


def test_rows_add_up_reads_the_published_files(tmp_path):
    st, out, q = run(tmp_path, BAD / "task_usage_bad_rows.csv.gz")
    assert check_rows_add_up(st, out, q) == {
        "passed": True,
        "metadata": {"rows_in": 10, "rows_in_data_file": 3, "rows_in_quarantine_file": 7},
    }
    assert quarantine_reason_counts(q) and sum(quarantine_reason_counts(q).values()) == 7
    assert not check_rows_add_up(dataclasses.replace(st, rows_in=11), out, q)["passed"]


def test_names_and_the_partial_source_warning():
    assert raw_table_name("google2011", "task_usage") == "raw_google2011__task_usage"
    assert (
        quarantine_key("google2011", "task_usage", "part-0.csv.gz") == "google2011__task_usage__part-0.csv.gz"
    )
    missing = {"task_usage": [f"p{i}" for i in range(7)]}
    assert describe_missing_shards("google2011", Path("/t"), missing) == (
        "google2011 is PARTIAL: 7 shard(s) in /t have no raw table (their ingest failed or has not run), built "
        "from the other shards only: task_usage: p0, p1, p2, p3, p4 ..."
    )


def test_exact_duplicate_rows_are_kept_and_counted(tmp_path):
    import gzip

    lines = (
        gzip.open(ROOT / "google-2011/machine_events/part-00000-of-00001.csv.gz", "rt").read().splitlines()
    )
    shard = tmp_path / "part-00000-of-00001.csv.gz"
    with gzip.open(shard, "wt") as f:
        f.write("\n".join([*lines, lines[0], lines[0]]) + "\n")
    st, out, _ = run(tmp_path, shard, table="machine_events")
    clean, _, _ = run(tmp_path / "clean", ROOT / "google-2011/machine_events/part-00000-of-00001.csv.gz",
                      table="machine_events")  # fmt: skip
    assert st.rows_written == clean.rows_written + 2
    assert st.n_duplicate_rows == clean.n_duplicate_rows + 2
