"""Trace sources on genuine-format fixtures (cuts of the real files, see tests/fixtures/README.md)."""

from __future__ import annotations

import gzip
import shutil
import tarfile
from pathlib import Path

import polars as pl
import pytest

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import QUARANTINE
from pipelines.sources import SOURCES, IngestError
from pipelines.sources.base import describe_unread_files, find_unread_files, unread_file_warnings

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def parse_all(source: str, table: str, path: Path, batch_bytes: int = 1 << 20):
    batches = list(SOURCES[source].iter_batches(table, path, batch_bytes))
    rows = pl.concat([b.rows for b in batches])
    quarantine = pl.concat([b.quarantine for b in batches])
    return rows, quarantine, sum(b.n_lines for b in batches), sum(b.n_invalid_markers for b in batches)


def only_shard(source: str, table: str) -> Path:
    shards = SOURCES[source].discover(ROOT, table)
    assert len(shards) == 1, shards
    return next(iter(shards.values()))


def test_registry_names_folders_and_tables():
    assert set(SOURCES) == {"google2011", "alibaba2018", "google2011_derived", "bitbrains"}
    for name, src in SOURCES.items():
        assert src.name == name
        assert src.tables == tuple(RAW_SCHEMAS[name])
    assert SOURCES["google2011"].folder == "google-2011"
    assert SOURCES["alibaba2018"].folder == "alibaba-2018"
    assert SOURCES["google2011_derived"].folder == "google-2011-derived"
    assert SOURCES["bitbrains"].folder == "bitbrains-gwa-t-12"


def test_discover_uses_file_names_as_shard_keys():
    g = SOURCES["google2011"]
    assert list(g.discover(ROOT, "task_usage")) == ["part-00000-of-00500.csv.gz"]
    assert list(g.discover(ROOT, "machine_events")) == ["part-00000-of-00001.csv.gz"]
    assert g.discover(ROOT, "task_constraints") == {}
    assert g.discover(ROOT / "nowhere", "task_usage") == {}
    a = SOURCES["alibaba2018"]
    assert list(a.discover(ROOT, "container_usage")) == ["container_usage.tar.gz"]
    assert list(a.discover(ROOT, "machine_usage")) == ["machine_usage.csv.gz"]
    assert a.discover(ROOT, "batch_instance") == {}
    d = SOURCES["google2011_derived"]
    assert list(d.discover(ROOT, "job_sums")) == ["job6336594489_5min_sum.csv.gz"]
    assert list(d.discover(ROOT, "job_days")) == ["GCD_VMs.tiny.tar.gz"]


def test_alibaba_discover_accepts_cut_names_and_prefers_tarball(tmp_path):
    folder = tmp_path / "alibaba-2018"
    folder.mkdir()
    for name in ["machine_usage.first10000rows.csv", "machine_usage.csv.gz", "machine_meta.csv", "notes.txt"]:
        (folder / name).write_text("x\n")
    a = SOURCES["alibaba2018"]
    assert list(a.discover(tmp_path, "machine_usage")) == [
        "machine_usage.csv.gz",
        "machine_usage.first10000rows.csv",
    ]
    (folder / "machine_usage.tar.gz").write_text("x")
    assert list(a.discover(tmp_path, "machine_usage")) == ["machine_usage.tar.gz"]


def test_google_task_usage_exact_first_row():
    rows, q, n, markers = parse_all("google2011", "task_usage", only_shard("google2011", "task_usage"))
    assert rows.schema == pl.Schema(RAW_SCHEMAS["google2011"]["task_usage"])
    assert (n, rows.height, q.height, markers) == (300, 300, 0, 0)
    first = rows.row(0, named=True)
    assert first["start_time_us"] == 600_000_000 and first["end_time_us"] == 900_000_000
    assert (first["job_id"], first["task_index"], first["machine_id"]) == (3418309, 0, 4155527081)
    assert first["cpu_rate_frac"] == 0.001562 and first["cpi"] == 2.445
    assert first["is_aggregated"] is True and first["sampled_cpu_rate_frac"] == 0.0


def test_google_task_events_empty_fields_are_null():
    rows, q, n, _ = parse_all("google2011", "task_events", only_shard("google2011", "task_events"))
    assert (n, rows.height, q.height) == (300, 300, 0)
    r1, r3 = rows.row(0, named=True), rows.row(2, named=True)
    assert r1["missing_info"] == 2 and r1["cpu_request_frac"] is None and r1["is_different_machines"] is None
    assert r3["missing_info"] is None and r3["job_id"] == 3418314 and r3["priority"] == 9
    assert (r3["cpu_request_frac"], r3["mem_request_frac"], r3["disk_request_frac"]) == (
        0.125,
        0.07446,
        0.0004244,
    )
    assert r3["is_different_machines"] is False
    assert r3["user"] == "70s3v5qRyCO/1PCdI6fVXnrW8FU/w+5CKRSa72xgcIo="


def test_google_machine_events_first_row():
    rows, _, n, _ = parse_all("google2011", "machine_events", only_shard("google2011", "machine_events"))
    assert n == 200
    assert rows.row(0) == (0, 5, 0, "HofLGzk1Or/8Ildj2+Lqv0UGGvY82NLoni8+J/Yy0RU=", 0.5, 0.2493)


def test_alibaba_container_usage_tarball_quarantines_empty_container_id():
    rows, q, n, _ = parse_all("alibaba2018", "container_usage", only_shard("alibaba2018", "container_usage"))
    assert (n, rows.height, q.height) == (300, 200, 100)
    assert q.schema == pl.Schema(QUARANTINE)
    assert set(q["reason"]) == {"empty container_id"}
    assert q["line_number"].to_list() == list(range(1, 101))
    assert q.row(99, named=True)["raw_line"] == ",m_998,777400,7,100,1.43,0,0,0.02,0.02,1"
    assert q["source_file"][0] == "container_usage.tar.gz" and q["table"][0] == "container_usage"
    assert rows.row(0) == ("c_1", "m_2556", 86610, 12.0, 88.0, None, None, None, 1.22, 1.15, 7.0)


def test_alibaba_invalid_marker_becomes_null_and_is_counted():
    rows, q, n, markers = parse_all(
        "alibaba2018", "machine_usage", only_shard("alibaba2018", "machine_usage")
    )
    assert (n, rows.height, q.height, markers) == (300, 300, 0, 1)
    row = rows.row(113, named=True)  # file line 12114: m_1934,212730,72,95,,,37.49,28.09,-1
    assert (row["machine_id"], row["time_s"], row["disk_io_pct"]) == ("m_1934", 212730, None)
    assert rows["disk_io_pct"].null_count() == 1


def test_derived_job_sums_takes_job_id_from_file_name():
    rows, q, n, _ = parse_all("google2011_derived", "job_sums", only_shard("google2011_derived", "job_sums"))
    assert (n, rows.height, q.height) == (50, 50, 0)
    assert rows.schema == pl.Schema(RAW_SCHEMAS["google2011_derived"]["job_sums"])
    r = rows.row(1, named=True)
    assert (r["job_id"], r["time_s"], r["n_tasks"], r["n_machines"]) == (6336594489, 879156, 15400, 15400)
    assert r["cpu_rate_sum_frac"] == 70.972984314 and r["sampled_cpu_rate_sum_frac"] == 71.0558776855
    assert rows["time_s"].diff().drop_nulls().unique().to_list() == [300]


def test_derived_job_days_one_row_per_point():
    rows, q, n, _ = parse_all("google2011_derived", "job_days", only_shard("google2011_derived", "job_days"))
    assert (n, rows.height, q.height) == (12 * 288, 12 * 288, 0)
    assert rows.row(0) == (1218322450, 1, 0, 6.763, 5.103)
    per_member = (
        rows.filter(pl.col("job_id") == 1218322450)
        .group_by("day_index")
        .agg(pl.len(), lo=pl.col("step").min(), hi=pl.col("step").max())
        .sort("day_index")
    )
    assert per_member.rows()[:3] == [(1, 288, 0, 287), (2, 288, 0, 287), (6, 288, 0, 287)]
    assert rows.group_by("job_id", "day_index").len()["len"].unique().to_list() == [288]


def test_unknown_table_raises():
    with pytest.raises(IngestError, match="unknown"):
        SOURCES["google2011"].discover(ROOT, "container_usage")


# ---------------------------------------------------------------- the source modules own their mapping


def _imports(path: Path) -> set[str]:
    """pipelines.* modules a file imports, at module level or inside functions."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipelines"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pipelines"))
    return found


def test_no_import_cycle_between_pipelines_modules():
    pkg = Path(__file__).resolve().parents[2] / "pipelines"
    graph = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = {m for m in _imports(path) if m != name}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*stack, m, d])}")
            if d in graph and d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


@pytest.mark.parametrize("module", ["usage", "workloads", "long_running", "ingest"])
def test_common_modules_name_no_source(module):
    """Per-source code lives in pipelines/sources/<name>.py only: the common modules hold no source name."""
    text = (Path(__file__).resolve().parents[2] / "pipelines" / f"{module}.py").read_text()
    for name in SOURCES:
        assert f'"{name}"' not in text and f"'{name}'" not in text, (module, name)


# ---------------------------------------------------------------- derived files under their publishers' names

DERIVED = ROOT / "google-2011-derived"
SUMS_FIXTURE = DERIVED / "job6336594489_5min_sum.csv.gz"
DAYS_FIXTURE = DERIVED / "GCD_VMs.tiny.tar.gz"


def derived_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "google-2011-derived"
    folder.mkdir()
    return folder


def unpack(tarball: Path, into: Path) -> list[str]:
    """Unpack like `tar xzf` (members GCD_VMs/vm_<job>_<k>); returns the member names."""
    with tarfile.open(tarball, "r:gz") as tar:
        tar.extractall(into, filter="data")
        return sorted(m.name for m in tar.getmembers() if m.isfile())


@pytest.mark.parametrize(
    "name",
    [
        "data_resource_JobId_6336594489_5minutes.csv",
        "data_resource_JobId_6336594489_5minutes.csv.gz",
        "data_resource_usage_fiveMinutes_6336594489.csv",
        "job6336594489_5min_sum.csv",
    ],
)
def test_derived_job_sums_read_under_the_publishers_names(tmp_path, name):
    folder = derived_folder(tmp_path)
    data = gzip.decompress(SUMS_FIXTURE.read_bytes())
    (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    d = SOURCES["google2011_derived"]
    assert list(d.discover(tmp_path, "job_sums")) == [name]
    rows, q, n, _ = parse_all("google2011_derived", "job_sums", folder / name)
    expected, _, _, _ = parse_all("google2011_derived", "job_sums", SUMS_FIXTURE)
    assert (n, q.height) == (50, 0)
    assert rows.equals(expected)
    assert rows["job_id"].unique().to_list() == [6336594489]
    assert find_unread_files(d, tmp_path) == []


def test_derived_one_file_per_job_the_second_name_is_reported(tmp_path):
    folder = derived_folder(tmp_path)
    for name in ["data_resource_JobId_6336594489_5minutes.csv.gz", "job6336594489_5min_sum.csv.gz"]:
        shutil.copy(SUMS_FIXTURE, folder / name)
    d = SOURCES["google2011_derived"]
    assert list(d.discover(tmp_path, "job_sums")) == ["job6336594489_5min_sum.csv.gz"]
    assert find_unread_files(d, tmp_path) == [folder / "data_resource_JobId_6336594489_5minutes.csv.gz"]


def test_derived_job_days_from_the_unpacked_folder_equal_the_tarball(tmp_path):
    folder = derived_folder(tmp_path)
    members = unpack(DAYS_FIXTURE, folder)
    assert len(members) == 12 and all(m.startswith("GCD_VMs/vm_") for m in members)
    d = SOURCES["google2011_derived"]
    assert d.discover(tmp_path, "job_days") == {"GCD_VMs": folder / "GCD_VMs"}
    rows, q, n, _ = parse_all("google2011_derived", "job_days", folder / "GCD_VMs", batch_bytes=5000)
    expected, _, _, _ = parse_all("google2011_derived", "job_days", DAYS_FIXTURE)
    assert (n, q.height) == (12 * 288, 0)
    key = ["job_id", "day_index", "step"]
    assert rows.sort(key).equals(expected.sort(key))
    assert rows.sort(key).row(0) == (1218322450, 1, 0, 6.763, 5.103)
    # a tarball beside its unpacked folder is not read twice: the folder wins, the tarball is reported
    shutil.copy(DAYS_FIXTURE, folder / "GCD_VMs.tar.gz")
    assert list(d.discover(tmp_path, "job_days")) == ["GCD_VMs"]
    assert find_unread_files(d, tmp_path) == [folder / "GCD_VMs.tar.gz"]


def test_derived_unpacked_folder_quarantines_files_of_other_names(tmp_path):
    folder = derived_folder(tmp_path)
    unpack(DAYS_FIXTURE, folder)
    (folder / "GCD_VMs" / "notes.csv").write_text("1 2\n")
    rows, q, n, _ = parse_all("google2011_derived", "job_days", folder / "GCD_VMs")
    assert (rows.height, n) == (12 * 288, 12 * 288 + 1)
    assert q.select("source_file", "reason").rows() == [
        ("GCD_VMs/notes.csv", "member name is not vm_<job>_<k>")
    ]


@pytest.mark.parametrize("name", ["GCD_VMs.tgz", "GCD_VMs.tar"])
def test_derived_job_days_tgz_and_tar(tmp_path, name):
    folder = derived_folder(tmp_path)
    data = DAYS_FIXTURE.read_bytes()
    (folder / name).write_bytes(data if name.endswith(".tgz") else gzip.decompress(data))
    assert list(SOURCES["google2011_derived"].discover(tmp_path, "job_days")) == [name]
    rows, q, n, _ = parse_all("google2011_derived", "job_days", folder / name)
    assert (rows.height, q.height, n) == (12 * 288, 0, 12 * 288)
    assert rows.row(0) == (1218322450, 1, 0, 6.763, 5.103)


def test_stray_files_are_reported_with_the_expected_names(tmp_path):
    folder = derived_folder(tmp_path)
    shutil.copy(SUMS_FIXTURE, folder / "job6336594489_5min_sum.csv.gz")
    shutil.copy(DAYS_FIXTURE, folder / "GCD_VMs.dev.tar.gz")
    (folder / "data_resource_usage_tenMinutes_6176858948.csv").write_text("600,1\n")  # a 10-minute series
    (folder / "GCD_VMs.zip").write_bytes(b"PK")
    (folder / "old").mkdir()
    (folder / "old" / "vm_1_1").write_text("1 2\n")
    (folder / "empty").mkdir()
    for companion in ["SOURCE.md", ".DS_Store", "README"]:
        (folder / companion).write_text("x")
    d = SOURCES["google2011_derived"]
    unread = find_unread_files(d, tmp_path)
    assert [p.name for p in unread] == ["GCD_VMs.zip", "data_resource_usage_tenMinutes_6176858948.csv", "old"]
    (line,) = unread_file_warnings(tmp_path, SOURCES.values())
    assert unread_file_warnings(tmp_path, SOURCES.values(), ["google2011"]) == []  # not asked for
    assert line.startswith(f"google2011_derived: 3 file(s) in {folder} match no table and are not read: ")
    assert "GCD_VMs.zip, data_resource_usage_tenMinutes_6176858948.csv, old/." in line
    for expected in [
        "job_sums: ",
        "data_resource_JobId_<id>_5minutes.csv[.gz]",
        "job_days: ",
        "GCD_VMs/ folder",
    ]:
        assert expected in line


def test_unread_files_of_a_source_without_expected_files_use_its_discover_doc(tmp_path):
    folder = tmp_path / "google-2011"
    (folder / "task_usage").mkdir(parents=True)
    shutil.copy(only_shard("google2011", "task_usage"), folder / "task_usage" / "part-00000-of-00500.csv.gz")
    (folder / "task_usage" / "part-00001-of-00500.csv.bz2").write_bytes(b"x")
    (folder / "SHA256SUM").write_text("x")
    g = SOURCES["google2011"]
    assert find_unread_files(g, tmp_path) == [folder / "task_usage" / "part-00001-of-00500.csv.bz2"]
    line = describe_unread_files(g, tmp_path, find_unread_files(g, tmp_path))
    assert "task_usage/part-00001-of-00500.csv.bz2" in line
    assert "job_events, task_events, task_usage" in line and "part-00000-of-00500.csv.gz" in line


def test_entries_beside_the_source_folders_are_reported(tmp_path):
    """A trace file dropped into the trace folder itself, or a folder of another trace, is not read: say so."""
    shutil.copy(SUMS_FIXTURE, tmp_path / "job6336594489_5min_sum.csv.gz")
    (tmp_path / "google-2019").mkdir()
    (tmp_path / "google-2011").mkdir()
    (tmp_path / "README.md").write_text("x")
    (line,) = unread_file_warnings(tmp_path, SOURCES.values(), [])
    assert line.startswith(f"2 entries in {tmp_path} are no source's folder and are not read: ")
    assert "google-2019/, job6336594489_5min_sum.csv.gz." in line
    assert "google-2011-derived/ (google2011_derived)" in line
