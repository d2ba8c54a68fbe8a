"""Values are checked where they enter: every source declares the valid range of each numeric column, and a
non-finite or out-of-range value, or a line that is not UTF-8, costs its own line only (quarantined with file,
line, reason), on a corrupted copy of each source's fixture shard."""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
from pathlib import Path

import polars as pl
import pytest

from pipelines.ingest import ingest_shard
from pipelines.sources import SOURCES, alibaba2018, bitbrains, google2011, google2011_derived
from pipelines.sources.base import CsvTable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACES = FIXTURES / "traces"
BITBRAINS = FIXTURES / "bitbrains" / "folders" / "bitbrains-gwa-t-12" / "rnd" / "2013-7"

SPECS: dict[str, list[CsvTable]] = {
    "google2011": list(google2011.TABLES.values()),
    "alibaba2018": list(alibaba2018.TABLES.values()),
    "google2011_derived": [google2011_derived.SUMS_SPEC, google2011_derived.DAYS_SPEC],
    "bitbrains": [bitbrains.FILE_SPEC],
}


def test_every_source_is_covered():
    assert set(SPECS) == set(SOURCES)


@pytest.mark.parametrize("source", sorted(SPECS))
def test_every_numeric_column_declares_its_valid_range(source):
    for spec in SPECS[source]:
        assert spec.undeclared_columns() == [], (source, spec.table)
        for column, (lo, hi) in spec.valid_ranges.items():
            assert lo is None or hi is None or lo <= hi, (source, spec.table, column)


# ---------------------------------------------------------------- corrupted fixture shards


def corrupt_lines(data: bytes, sep: bytes, column: int, values: dict[int, bytes]) -> bytes:
    """`data` with field `column` of each 1-based line in `values` replaced (its leading blanks kept)."""
    lines = data.split(b"\n")
    for n, value in values.items():
        fields = lines[n - 1].split(sep)
        blanks = fields[column][: len(fields[column]) - len(fields[column].lstrip())]
        fields[column] = blanks + value
        lines[n - 1] = sep.join(fields)
    return b"\n".join(lines)


def write_gz(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data, mtime=0))


def write_tar_member(path: Path, member: str, data: bytes) -> None:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def tar_member(path: Path) -> tuple[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        info = next(m for m in tar if m.isfile())
        return info.name, tar.extractfile(info).read()


BAD = {1: b"inf", 2: b"nan", 3: b"1e300", 4: b"-inf", 5: b"0.2\xff\xfe"}
"""Corruptions put on five lines of each shard (offset per case): +inf, NaN, huge, -inf, an invalid UTF-8 byte."""

# (source, table, fixture, container, separator, column index, first corrupted line, out-of-range value, reasons)
CASES = [
    ("google2011", "task_usage", TRACES / "google-2011/task_usage/part-00000-of-00500.csv.gz", "gz", b",", 5, 20,
     b"1.5", "cpu_rate_frac out of range [0, 1]: 1.5"),
    ("alibaba2018", "container_usage", TRACES / "alibaba-2018/container_usage.tar.gz", "tar", b",", 3, 150,
     b"250", "cpu_util_pct out of range [0, 100]: 250.0"),
    ("alibaba2018", "container_meta", TRACES / "alibaba-2018/container_meta.csv.gz", "gz", b",", 7, 20,
     b"100.5", "mem_size_pct out of range [0, 100]: 100.5"),
    ("google2011_derived", "job_sums", TRACES / "google-2011-derived/job6336594489_5min_sum.csv.gz", "gz", b",", 3,
     10, b"1e9", "cpu_rate_sum_frac out of range [0, 13000]: 1000000000.0"),
    ("bitbrains", "vm_usage", BITBRAINS / "1.csv.gz", "gz", b";", 3, 20,
     b"2e7", "cpu_usage_mhz out of range [0, 1.024e+07]: 20000000.0"),
]  # fmt: skip


def _shard(tmp_path: Path, case, corrupt: bool) -> Path:
    source, table, fixture, container, sep, column, first, out_of_range, _ = case
    folder = tmp_path / ("bad" if corrupt else "clean")
    if source == "bitbrains":  # a partition is a month folder: copy it whole, corrupt one VM file
        shutil.copytree(BITBRAINS, folder / "rnd" / "2013-7")
        target, shard = folder / "rnd" / "2013-7" / fixture.name, folder / "rnd" / "2013-7"
    else:
        folder.mkdir()
        target = shard = folder / fixture.name
        shutil.copy(fixture, target)
    if not corrupt:
        return shard
    values = {first + k: v for k, v in BAD.items()} | {first + 6: out_of_range}
    if container == "tar":
        member, data = tar_member(fixture)
        write_tar_member(target, member, corrupt_lines(data, sep, column, values))
    else:
        write_gz(target, corrupt_lines(gzip.decompress(fixture.read_bytes()), sep, column, values))
    return shard


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_values_and_bytes_cost_their_line_only(tmp_path, case):
    source, table, fixture, _, _, _, first, _, out_of_range_reason = case
    src = SOURCES[source]
    clean = ingest_shard(
        src, table, _shard(tmp_path, case, False), tmp_path / "c.parquet", tmp_path / "cq.parquet"
    )
    bad = ingest_shard(
        src, table, _shard(tmp_path, case, True), tmp_path / "b.parquet", tmp_path / "bq.parquet"
    )
    assert bad.rows_in == clean.rows_in == bad.rows_written + bad.rows_quarantined
    assert bad.rows_written == clean.rows_written - 6  # every other line ingested
    q = pl.read_parquet(tmp_path / "bq.parquet").join(
        pl.read_parquet(tmp_path / "cq.parquet"), on=["source_file", "line_number"], how="anti"
    )
    got = dict(zip(q["line_number"], q["reason"], strict=True))
    name = out_of_range_reason.split(" ")[0]
    assert sorted(got) == [first + k for k in range(1, 7)]
    assert got[first + 1] == f"non-finite {name}: inf"
    assert got[first + 2] == f"non-finite {name}: NaN"
    assert got[first + 3].startswith(f"{name} out of range")
    assert got[first + 4] == f"non-finite {name}: -inf"
    assert got[first + 5].startswith(r"invalid UTF-8: b'\xff' at byte ")
    assert got[first + 6] == out_of_range_reason
    assert set(q["source_file"]) == {fixture.name if source != "bitbrains" else f"rnd/2013-7/{fixture.name}"}
    assert r"0.2\xff\xfe" in q.filter(pl.col("line_number") == first + 5)["raw_line"].item()
    rows = pl.read_parquet(tmp_path / "b.parquet")
    for c, dtype in rows.schema.items():
        if dtype.is_float():
            assert rows[c].is_finite().fill_null(True).all(), c


def test_invalid_byte_in_a_job_days_member_costs_its_line(tmp_path):
    fixture = TRACES / "google-2011-derived/GCD_VMs.tiny.tar.gz"
    out = tmp_path / fixture.name
    with tarfile.open(fixture, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for i, info in enumerate(m for m in src if m.isfile()):
            data = src.extractfile(info).read()
            if i == 0:
                data = corrupt_lines(data, b" ", 0, {3: b"5\xff", 4: b"inf", 5: b"1e300"})
                info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    stats = ingest_shard(
        SOURCES["google2011_derived"], "job_days", out, tmp_path / "o.parquet", tmp_path / "q.parquet"
    )
    q = pl.read_parquet(tmp_path / "q.parquet")
    assert q["line_number"].to_list() == [3, 4, 5] and stats.rows_quarantined == 3
    assert q["reason"][0].startswith("invalid UTF-8") and q["reason"][1] == "non-finite cpu_pct: inf"
    assert q["reason"][2].startswith("cpu_pct out of range")
    assert stats.rows_written == stats.rows_in - 3
