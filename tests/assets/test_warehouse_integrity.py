"""A run uses exactly the shards of its own trace folder: raw partitions ingested from files that are not there
now are neither read nor kept (the mix-up: a shard of an earlier folder showing up after TVW_TRACE_DIR changed),
while a warehouse and trace folder moved or copied together keep every partition (the guard compares content)."""

import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.raw import find_stale_raw
from assets.resources import Warehouse
from cli.run import run_all
from cli.workers import Target

pytestmark = pytest.mark.integration  # tvw-run over two trace folders (about 30 s): `pytest -m integration`

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
SOURCE = "google2011"
EXTRA = "part-00001-of-00500.csv.gz"
EXTRA_JOB_OFFSET = 10**9


def _folder_with_extra_shard(root: Path) -> Path:
    """The fixture Google folder plus a second task_events shard whose jobs exist nowhere else."""
    shutil.copytree(FIXTURES / "google-2011", root / "google-2011")
    events = root / "google-2011" / "task_events"
    lines = gzip.decompress((events / "part-00000-of-00500.csv.gz").read_bytes()).decode().splitlines()
    shifted = []
    for line in lines:
        cols = line.split(",")
        cols[2] = str(int(cols[2]) + EXTRA_JOB_OFFSET)  # job ID
        shifted.append(",".join(cols))
    (events / EXTRA).write_bytes(gzip.compress(("\n".join(shifted) + "\n").encode()))
    return root


def _with_other_events(root: Path) -> Path:
    """The fixture Google folder whose task_events shard has the same name and other content (shifted jobs)."""
    shutil.copytree(FIXTURES / "google-2011", root / "google-2011")
    _folder_with_extra_shard(root / "scratch")
    shard = root / "google-2011" / "task_events" / "part-00000-of-00500.csv.gz"
    shard.write_bytes((root / "scratch" / "google-2011" / "task_events" / EXTRA).read_bytes())
    return root


def _workload_ids(warehouse: Path) -> set[str]:
    wh = Warehouse(root=str(warehouse))
    return set(wh.scan("core__workloads", [SOURCE]).select("workload_id").collect()["workload_id"])


def _run(traces: Path, warehouse: Path, layers: tuple[str, ...]) -> list[str]:
    lines: list[str] = []
    home = warehouse.with_name(f"{warehouse.name}_dagster_home")  # the runner needs a persistent instance
    home.mkdir(exist_ok=True)
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        outcomes = run_all(
            Target(str(traces), str(warehouse)), instance, sources=[SOURCE], layers=layers, log=lines.append
        )
    assert all(o.ok for o in outcomes), lines
    return lines


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    earlier = _folder_with_extra_shard(tmp_path_factory.mktemp("earlier"))
    current = tmp_path_factory.mktemp("current")
    shutil.copytree(FIXTURES / "google-2011", current / "google-2011")
    fresh = tmp_path_factory.mktemp("fresh_wh")
    _run(current, fresh, ("raw", "per_source"))
    shared = tmp_path_factory.mktemp("shared_wh")
    _run(earlier, shared, ("raw", "per_source"))
    return earlier, current, fresh, shared


def test_the_earlier_folder_has_workloads_the_current_one_lacks(runs):
    _, _, fresh, shared = runs
    assert _workload_ids(shared) > _workload_ids(fresh)  # otherwise the checks below prove nothing


def test_partitions_of_another_folder_are_not_read(runs, tmp_path):
    _, current, fresh, shared = runs
    wh = tmp_path / "wh"
    shutil.copytree(shared, wh)
    # only the per-source layer over the current folder: nothing re-ingested, nothing removed
    _run(current, wh, ("per_source",))
    assert (
        Warehouse(root=str(wh)).table_dir("raw_google2011__task_events") / "part-00001-of-00500.parquet"
    ).exists()
    # the shard only the earlier folder has is not read; the shards both folders hold byte for byte are
    assert _workload_ids(wh) == _workload_ids(fresh)


def test_a_shard_of_the_same_name_with_other_content_is_stale(runs, tmp_path):
    _, _, fresh, _ = runs
    other = _with_other_events(tmp_path / "other")
    shutil.copytree(fresh, tmp_path / "wh")  # the guard records the files it matched by content
    assert [
        (p.table, p.stem) for p in find_stale_raw(Warehouse(root=str(tmp_path / "wh")), other, [SOURCE])
    ] == [("raw_google2011__task_events", "part-00000-of-00500")]


def test_a_warehouse_moved_with_its_traces_keeps_every_partition(runs, tmp_path):
    _, current, fresh, _ = runs
    # `cp -r` of both folders (new paths and modification times), the originals out of reach
    moved = tmp_path / "moved"
    shutil.copytree(current, moved / "traces", copy_function=shutil.copy)
    shutil.copytree(fresh, moved / "warehouse", copy_function=shutil.copy)
    wh = Warehouse(root=str(moved / "warehouse"))
    assert find_stale_raw(wh, moved / "traces", [SOURCE]) == []
    _run(moved / "traces", moved / "warehouse", ("per_source",))
    assert _workload_ids(moved / "warehouse") == _workload_ids(fresh) != set()
    assert wh.query("select count(*) as n from core__workloads")["n"][0] == len(_workload_ids(fresh))


def test_a_full_run_over_the_current_folder_removes_them_and_matches_a_fresh_warehouse(runs, tmp_path):
    _, current, fresh, shared = runs
    wh = tmp_path / "wh"
    shutil.copytree(shared, wh)
    assert {(p.table, p.stem) for p in find_stale_raw(Warehouse(root=str(wh)), current, [SOURCE])} >= {
        ("raw_google2011__task_events", "part-00001-of-00500")
    }
    lines = _run(current, wh, ("raw", "per_source"))
    assert any(
        "removed" in line and "raw_google2011__task_events[part-00001-of-00500]" in line for line in lines
    )
    assert find_stale_raw(Warehouse(root=str(wh)), current, [SOURCE]) == []
    assert _workload_ids(wh) == _workload_ids(fresh)
    n_events = Warehouse(root=str(wh)).query("select count(*) as n from raw_google2011__task_events")["n"][0]
    assert (
        n_events
        == pl.scan_csv(current / "google-2011" / "task_events" / "*.csv.gz", has_header=False)
        .select(pl.len())
        .collect()
        .item()
        - Warehouse(root=str(wh)).query(
            "select count(*) as n from raw_quarantine where \"table\" = 'task_events'"
        )["n"][0]
    )
