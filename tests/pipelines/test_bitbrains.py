"""The Bitbrains GWA-T-12 source: layouts (month folders, plain/gzip files, the original zip), bad input,
and its canonical workloads / usage / long-running mapping, on cuts of the genuine files and hand-made lines."""

from __future__ import annotations

import gzip
import shutil
import zipfile
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.ingest import ingest_shard
from pipelines.long_running import LongRunningConfig, filter_long_running, judge_long_running
from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import USAGE, WORKLOADS
from pipelines.sources import SOURCES, IngestError
from pipelines.sources.bitbrains import SCHEMAS, BitbrainsConfig, BitbrainsSource
from pipelines.usage import UsageConfig, build_usage, build_usage_with_report
from pipelines.workloads import build_workloads

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bitbrains"
FOLDERS = FIXTURES / "folders"
ZIP = FIXTURES / "zip"
SRC = SOURCES["bitbrains"]
T = "vm_usage"
HEADER = (
    "Timestamp [ms];\tCPU cores;\tCPU capacity provisioned [MHZ];\tCPU usage [MHZ];\tCPU usage [%];\t"
    "Memory capacity provisioned [KB];\tMemory usage [KB];\tDisk read throughput [KB/s];\t"
    "Disk write throughput [KB/s];\tNetwork received throughput [KB/s];\tNetwork transmitted throughput [KB/s]"
)
GOOD = "1376000000;\t2;\t5851.9989;\t87.7799835;\t1.5;\t8218624.0;\t1034592.8;\t160.8;\t21.7;\t0.26;\t1.46"


def read_all(path: Path) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    batches = list(SRC.iter_batches(T, path, 1 << 20))
    return (
        pl.concat([b.rows for b in batches]),
        pl.concat([b.quarantine for b in batches]),
        sum(b.n_lines for b in batches),
    )


def write_vm(folder: Path, name: str, lines: list[str], gz: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode() if lines else b""
    path = folder / (f"{name}.csv.gz" if gz else f"{name}.csv")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


# ---------------------------------------------------------------- registry and layouts


def test_registered_with_its_raw_schema_and_long_running_rule():
    assert "bitbrains" in SOURCES and RAW_SCHEMAS["bitbrains"] == SCHEMAS
    assert set(SCHEMAS[T]) >= {"cpu_usage_mhz", "cpu_capacity_mhz", "mem_usage_kb", "mem_capacity_kb"}
    cfg = LongRunningConfig()
    assert cfg.min_contiguous_bins["bitbrains"] == 6000 and cfg.rule_of("bitbrains") == "contiguous_bins"


def test_discover_month_folders_and_zip(tmp_path):
    assert list(SRC.discover(FOLDERS, T)) == ["rnd_2013-7", "rnd_2013-8"]
    assert SRC.discover(ZIP, T) == {"rnd.zip": ZIP / "bitbrains-gwa-t-12" / "rnd.zip"}
    # a set folder beside its zip: the folder is read, the zip is its archive
    both = tmp_path / "bitbrains-gwa-t-12"
    shutil.copytree(FOLDERS / "bitbrains-gwa-t-12", both)
    shutil.copy(ZIP / "bitbrains-gwa-t-12" / "rnd.zip", both / "rnd.zip")
    assert list(SRC.discover(tmp_path, T)) == ["rnd_2013-7", "rnd_2013-8"]
    assert SRC.discover(tmp_path / "nothing", T) == {}
    # an empty set folder beside the zip: the zip is read
    (tmp_path / "empty" / "bitbrains-gwa-t-12" / "rnd" / "2013-7").mkdir(parents=True)
    shutil.copy(ZIP / "bitbrains-gwa-t-12" / "rnd.zip", tmp_path / "empty" / "bitbrains-gwa-t-12" / "rnd.zip")
    assert list(SRC.discover(tmp_path / "empty", T)) == ["rnd.zip"]
    with pytest.raises(IngestError, match="unknown bitbrains table"):
        SRC.discover(FOLDERS, "task_usage")


def test_month_folder_rows_keep_every_column_with_seconds_timestamps():
    rows, quarantine, n = read_all(FOLDERS / "bitbrains-gwa-t-12" / "rnd" / "2013-8")
    assert n == rows.height == 4 * 150 and quarantine.height == 0
    assert rows.schema == pl.Schema(SCHEMAS[T])
    assert rows["vm_id"].unique(maintain_order=True).to_list() == ["1", "14", "18", "24"]  # by VM number
    assert set(rows["month"]) == {"2013-8"} and set(rows["vm_set"]) == {"rnd"}
    # 2013-08 in epoch seconds (the "[ms]" header is wrong), each VM in time order
    assert rows["timestamp_s"].min() >= 1375315200 - 86400 and rows["timestamp_s"].max() < 1377993600
    first = (FOLDERS / "bitbrains-gwa-t-12/rnd/2013-8/14.csv").read_text().splitlines()[1].split(";\t")
    got = rows.filter(pl.col("vm_id") == "14").row(0)[3:]
    assert got == (int(first[0]), int(first[1]), *(float(x) for x in first[2:]))


def test_zip_read_in_place_equals_the_month_folders():
    folder_rows = pl.concat([read_all(p)[0] for p in SRC.discover(FOLDERS, T).values()])
    zip_rows, quarantine, _ = read_all(ZIP / "bitbrains-gwa-t-12" / "rnd.zip")
    assert quarantine.height == 0
    key = ["vm_id", "timestamp_s"]
    assert_frame_equal(zip_rows.sort(key), folder_rows.sort(key))


def test_ingest_counts_add_up(tmp_path):
    folder = SRC.discover(FOLDERS, T)["rnd_2013-7"]
    stats = ingest_shard(SRC, T, folder, tmp_path / "o.parquet", tmp_path / "q.parquet")
    assert (stats.rows_in, stats.rows_written, stats.rows_quarantined) == (600, 600, 0)
    assert stats.bytes_in == sum(p.stat().st_size for p in folder.iterdir())
    assert pl.read_parquet(tmp_path / "o.parquet").height == 600


# ---------------------------------------------------------------- bad input


def test_bad_rows_go_to_quarantine_with_file_line_and_reason(tmp_path):
    month = tmp_path / "bitbrains-gwa-t-12" / "rnd" / "2013-8"
    lines = [
        HEADER,
        GOOD,  # line 2
        "1376000300;\t2;\t5851.9989;\t87.7",  # 3: wrong field count
        GOOD.replace("1376000000", "1376000600").replace("87.7799835", "abc"),  # 4: unparsable
        GOOD.replace("1376000000", "1376000900").replace("1034592.8", "-5.0"),  # 5: negative memory usage
        GOOD.replace("1376000000", "1376001200").replace("8218624.0", "8.218624E6"),  # 6: E notation, fine
        GOOD.replace("1376000000", "1376000100"),  # 7: backwards (after 1376001200)
        GOOD.replace("1376000000", "1376001500").replace(";\t2;", ";\t2.5;"),  # 8: non-integer cores
        GOOD.replace("1376000000", "1376001800").replace("1034592.8", "0.0"),  # 9: memory 0: kept
    ]
    write_vm(month, "7", lines)
    write_vm(month, "8", [HEADER, GOOD.replace("1376000000", "1375999000")])  # another VM: its own order
    rows, q, n = read_all(month)
    assert n == 9 and rows.height == 4 and q.height == 5
    assert rows.filter(pl.col("vm_id") == "7")["timestamp_s"].to_list() == [
        1376000000,
        1376001200,
        1376001800,
    ]
    assert rows.filter(pl.col("timestamp_s") == 1376001200)["mem_capacity_kb"].item() == 8218624.0
    got = {(r["source_file"], r["line_number"]): r["reason"] for r in q.iter_rows(named=True)}
    f = "rnd/2013-8/7.csv.gz"
    assert set(got) == {(f, 3), (f, 4), (f, 5), (f, 7), (f, 8)}
    assert got[(f, 3)].startswith("wrong field count")
    assert got[(f, 4)].startswith("unparsable cpu_usage_mhz")
    assert got[(f, 5)].startswith("negative mem_usage_kb")
    assert got[(f, 7)] == "timestamp_s goes backwards for VM rnd/7: 1376000100 after 1376001200"
    assert got[(f, 8)].startswith("non-integer cpu_cores")
    assert q.filter(pl.col("line_number") == 7)["raw_line"].item() == lines[6]
    assert q.filter(pl.col("line_number") == 4)["raw_line"].item() == lines[3]


def test_time_order_is_checked_across_chunks_of_one_vm(tmp_path):
    month = tmp_path / "rnd" / "2013-8"
    times = [1376000000 + 300 * i for i in range(400)]
    times[300] = 1376000000  # far back, in a later chunk
    write_vm(month, "5", [HEADER, *(GOOD.replace("1376000000", str(t)) for t in times)])
    batches = list(SRC.iter_batches(T, month, 2000))  # many small chunks
    assert len(batches) > 5
    q = pl.concat([b.quarantine for b in batches])
    assert q["line_number"].to_list() == [302] and "goes backwards" in q["reason"].item()


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (None, 0, "empty file"),  # 0 bytes
        (b"", 0, "empty file"),  # valid gzip of nothing
        ((HEADER + "\n").encode(), 1, "no data rows"),
        (("Timestamp;CPU\n" + GOOD + "\n").encode(), 1, "wrong header"),
        (b"Timestamp \xff;CPU\n" + GOOD.encode() + b"\n", 1, "wrong header"),  # a bad byte in the header
    ],
)
def test_bad_file_is_quarantined_alone(tmp_path, content, line, message):
    month = tmp_path / "rnd" / "2013-8"
    write_vm(month, "1", [HEADER, GOOD])
    write_vm(month, "3", [HEADER, GOOD, GOOD.replace("1376000000", "1376000300")])
    bad = month / "2.csv.gz"
    bad.write_bytes(b"" if content is None else gzip.compress(content, mtime=0))
    stats = ingest_shard(SRC, T, month, tmp_path / "o.parquet", tmp_path / "q.parquet")
    assert (stats.rows_in, stats.rows_written, stats.rows_quarantined) == (4, 3, 1)
    assert pl.read_parquet(tmp_path / "o.parquet")["vm_id"].to_list() == ["1", "3", "3"]
    q = pl.read_parquet(tmp_path / "q.parquet")
    assert q.select("source_file", "line_number").rows() == [("rnd/2013-8/2.csv.gz", line)]
    assert q["reason"].item().startswith("whole file quarantined: ") and message in q["reason"].item()
    if line == 1:
        assert q["raw_line"].item() == content.split(b"\n")[0].decode("utf-8", "backslashreplace")


def test_truncated_gzip_is_quarantined_naming_the_file(tmp_path):
    month = tmp_path / "rnd" / "2013-8"
    path = write_vm(month, "3", [HEADER, *[GOOD] * 2000])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    write_vm(month, "4", [HEADER, GOOD])
    rows, q, n = read_all(month)
    assert n == 2 and rows["vm_id"].to_list() == ["4"]
    assert q["source_file"].to_list() == ["rnd/2013-8/3.csv.gz"]
    assert "cannot decompress" in q["reason"].item()


def test_truncated_zip_fails_and_a_corrupt_member_is_quarantined_alone(tmp_path):
    data = (ZIP / "bitbrains-gwa-t-12" / "rnd.zip").read_bytes()
    cut = tmp_path / "cut" / "rnd.zip"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) // 2])  # the central directory is gone
    with pytest.raises(IngestError, match=r"rnd\.zip.*cannot read zip"):
        read_all(cut)
    corrupt = tmp_path / "corrupt" / "rnd.zip"
    corrupt.parent.mkdir()
    with zipfile.ZipFile(ZIP / "bitbrains-gwa-t-12" / "rnd.zip") as z:
        info = z.getinfo("2013-8/18.csv")
    mid = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    corrupt.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + 64]) + data[mid + 64 :])
    rows, q, n = read_all(corrupt)
    good_rows, _, _ = read_all(ZIP / "bitbrains-gwa-t-12" / "rnd.zip")
    assert q["source_file"].to_list() == ["rnd.zip:2013-8/18.csv"]
    assert rows.height == good_rows.height - 150 and n == rows.height + 1
    assert rows.filter((pl.col("vm_id") == "18") & (pl.col("month") == "2013-8")).height == 0


def test_bad_bytes_cost_their_line_only(tmp_path):
    month = tmp_path / "rnd" / "2013-8"
    lines = [HEADER, GOOD, GOOD.replace("1376000000", "1376000300"), GOOD.replace("1376000000", "1376000600")]
    path = write_vm(month, "5", lines)
    text = gzip.decompress(path.read_bytes()).replace(b"\t87.7799835", b"\t87.7\xff\xfe", 1)
    path.write_bytes(gzip.compress(text.replace(b"1376000300;", b"1376000300\xc3;"), mtime=0))
    rows, q, n = read_all(month)
    assert n == 3 and rows["timestamp_s"].to_list() == [1376000600]
    assert q["line_number"].to_list() == [2, 3]
    assert q["reason"].to_list() == [
        "invalid UTF-8: b'\\xff' at byte 31",
        "invalid UTF-8: b'\\xc3' at byte 11",
    ]
    assert "87.7\\xff\\xfe" in q["raw_line"][0]


# ---------------------------------------------------------------- canonical tables


def raw_frame(rows: list[tuple]) -> dict[str, pl.LazyFrame]:
    """(vm_id, timestamp_s, cpu_capacity_mhz, cpu_usage_mhz, mem_capacity_kb, mem_usage_kb) -> raw vm_usage."""
    data = [
        {c: None for c in SCHEMAS[T]}
        | dict(
            vm_set="rnd",
            vm_id=v,
            month="2013-8",
            timestamp_s=t,
            cpu_cores=2,
            cpu_capacity_mhz=cap,
            cpu_usage_mhz=cpu,
            mem_capacity_kb=memcap,
            mem_usage_kb=mem,
        )  # fmt: skip
        for v, t, cap, cpu, memcap, mem in rows
    ]
    return {T: pl.DataFrame(data, schema=SCHEMAS[T]).lazy()}


REF = BitbrainsConfig()
RAW = raw_frame(
    [
        ("1", 1200, 1000.0, 100.0, 2048.0, 1024.0),
        ("1", 1350, 1000.0, 300.0, 2048.0, 0.0),  # same bin as 1200; memory not measured (0)
        ("1", 1500, 2000.0, 500.0, 4096.0, 2048.0),  # resized up
        ("1", 2700, 2000.0, 700.0, 4096.0, 2048.0),  # after a gap of 3 bins
        ("2", 600, 500.0, 50.0, 1024.0, 512.0),
    ]
)


def test_workloads_one_per_vm_with_largest_provisioned_capacity_as_request():
    got = build_workloads("bitbrains", RAW)
    expected = pl.DataFrame(
        {
            "source": ["bitbrains"] * 2,
            "workload_id": ["rnd/1", "rnd/2"],
            "machine_id": [None, None],
            "start_time_s": [1200.0, 600.0],
            "end_time_s": [3000.0, 900.0],
            "n_usage_records": [4, 1],
            "cpu_request_frac": [2000.0 / REF.reference_cpu_mhz, 500.0 / REF.reference_cpu_mhz],
            "mem_request_frac": [4096.0 / REF.reference_mem_kb, 1024.0 / REF.reference_mem_kb],
            "priority": [None, None],
            "scheduling_class": [None, None],
            "final_state": ["running", "running"],
            "is_partial": [False, False],
        },
        schema=WORKLOADS,
    )
    assert_frame_equal(got, expected)


def test_usage_fractions_of_the_reference_machine_and_gaps_recorded():
    usage, counts = build_usage_with_report("bitbrains", RAW, UsageConfig(sort_rows=True))
    c, m = REF.reference_cpu_mhz, REF.reference_mem_kb
    expected = pl.DataFrame(
        {
            "source": ["bitbrains"] * 4,
            "workload_id": ["rnd/1", "rnd/1", "rnd/1", "rnd/2"],
            "bin_start_s": [1200, 1500, 2700, 600],
            "cpu_frac": [(100 / c + 300 / c) / 2, 500 / c, 700 / c, 50 / c],
            "mem_frac": [(1024 / m + 0.0) / 2, 2048 / m, 2048 / m, 512 / m],
            "n_samples": [2, 1, 1, 1],
            "is_filled": [False] * 4,
        },
        schema=USAGE,
    )
    assert_frame_equal(usage, expected)
    n = dict(zip(counts["count"], counts["n"], strict=True))
    assert (n["rows_in"], n["rows_mem_zero"], n["bins_out"], n["bins_filled"]) == (5, 1, 4, 0)
    # the same fill policy as every source: a gap of 3 bins is filled only when allowed
    held = build_usage("bitbrains", RAW, UsageConfig("hold", 3, sort_rows=True))
    assert held.filter(pl.col("is_filled"))["bin_start_s"].to_list() == [1800, 2100, 2400]
    assert build_usage("bitbrains", RAW, UsageConfig("hold", 2)).height == 4


def test_reference_machine_is_configuration():
    small = BitbrainsSource(BitbrainsConfig(reference_cpu_mhz=1000.0, reference_mem_kb=1024.0))
    bins, _ = small.usage.bins(RAW)
    got = bins.filter(pl.col("workload_id") == "rnd/2").collect()
    assert got.select("cpu_frac", "mem_frac").row(0) == (0.05, 0.5)
    with pytest.raises(ValueError, match="must be positive"):
        BitbrainsConfig(reference_cpu_mhz=0)


def test_one_workload_across_months_and_long_running_reasons(tmp_path):
    raw = {}
    for key, path in SRC.discover(FOLDERS, T).items():
        ingest_shard(SRC, T, path, tmp_path / f"{key}.parquet", tmp_path / f"q_{key}.parquet")
    raw[T] = pl.scan_parquet(sorted(tmp_path.glob("rnd_*.parquet")))
    workloads = build_workloads("bitbrains", raw)
    assert workloads["workload_id"].to_list() == ["rnd/1", "rnd/14", "rnd/18", "rnd/24"]
    assert workloads["n_usage_records"].to_list() == [300] * 4
    usage = build_usage("bitbrains", raw, UsageConfig("hold", 12))
    cfg = LongRunningConfig(min_contiguous_bins={"bitbrains": 150})
    judged = judge_long_running(workloads, usage, cfg)
    # the month boundary leaves a gap of about a day: the longest gap-free run is one month's 150 samples
    assert judged["n_run_bins"].to_list() == [150] * 4
    assert judged["n_observed_bins"].to_list() == [300] * 4
    assert set(judged["reason"]) == {"kept"} and set(judged["rule"]) == {"contiguous_bins"}
    kept, report = filter_long_running(
        workloads, usage, LongRunningConfig(min_contiguous_bins={"bitbrains": 152})
    )
    assert kept.height == 0
    assert dict(zip(report["reason"], report["n_workloads"], strict=True))["too_short"] == 4
    by_records = LongRunningConfig(
        min_contiguous_bins={"bitbrains": 300}, rule={"bitbrains": "observed_bins"}
    )
    assert filter_long_running(workloads, usage, by_records)[0]["n_run_bins"].to_list() == [150] * 4
