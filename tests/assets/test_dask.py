"""A real job on a local Dask cluster (2 worker processes) writes the same tables as the default executor."""

import shutil
from pathlib import Path

import polars as pl
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.main import RunSpec, Target, check_shared_warehouse, execute_named_run, run_all
from assets.resources import Warehouse

distributed = pytest.importorskip("distributed")
pytest.importorskip("dagster_dask")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
SOURCE = "alibaba2018"
TABLES = [
    "core__workloads",
    "core__usage",
    "core__long_running",
    "core__long_running_report",
    "ec__assignments",
]


def _table(root: Path, table: str) -> pl.DataFrame:
    df = Warehouse(root=str(root)).scan(table, [SOURCE]).collect()
    return df.sort(df.columns)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    ) as local:
        yield local


def test_per_source_job_on_dask_equals_in_process(tmp_path, cluster):
    assert len(cluster.workers) == 2
    local_wh, dask_wh = tmp_path / "wh_local", tmp_path / "wh_dask"
    home = tmp_path / "dagster_home"
    home.mkdir()
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        local = Target(str(FIXTURES), str(local_wh), "sample")
        outcomes = run_all(local, instance, layers=("raw",), sources=[SOURCE], log=lambda _: None)
        assert all(o.ok for o in outcomes) and outcomes
        shutil.copytree(local_wh, dask_wh)

        spec = RunSpec("per_source", "per_source_job", SOURCE, SOURCE)
        config = {"ops": {}}
        assert execute_named_run(local, spec, instance, config).ok
        on_dask = Target(str(FIXTURES), str(dask_wh), "sample", cluster.scheduler_address)
        check_shared_warehouse(on_dask.scheduler, on_dask.warehouse)
        with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
            outcome = execute_named_run(on_dask, spec, instance, config)
        assert outcome.ok
        steps = {
            e.dagster_event.step_key
            for e in instance.all_logs(outcome.run_id)
            if e.dagster_event and e.dagster_event.is_step_start
        }
        ran_on_dask = {t["key"].removeprefix("per_source_job.") for t in stream.data}
        assert steps and steps <= ran_on_dask  # every step was a Dask task

    for table in TABLES:
        assert _table(local_wh, table).equals(_table(dask_wh, table)), table


def test_a_worker_that_cannot_see_the_warehouse_stops_the_run(tmp_path, cluster, monkeypatch):
    import assets.main as main

    monkeypatch.setattr(main, "_read_marker", lambda path: None)  # as if on another filesystem
    with pytest.raises(RuntimeError, match="every Dask worker"):
        check_shared_warehouse(cluster.scheduler_address, str(tmp_path / "wh"))
