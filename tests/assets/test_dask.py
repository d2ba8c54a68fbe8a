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
        prefix = f"per_source_job.{outcome.run_id}."  # keys carry the run: concurrent runs never share a task
        ran_on_dask = {t["key"].removeprefix(prefix) for t in stream.data if t["key"].startswith(prefix)}
        assert steps and steps <= ran_on_dask  # every step was a Dask task

    for table in TABLES:
        assert _table(local_wh, table).equals(_table(dask_wh, table)), table


def test_the_load_partitions_of_the_evaluation_fan_out_on_dask(tmp_path, cluster):
    """Two eval_job runs (one per load) at once, their steps on the Dask cluster: the same rows as in-process."""
    from dagster import materialize

    from assets.cluster import sim__job_sequences
    from assets.io_manager import TableIOManager

    local_wh, dask_wh = tmp_path / "wh_local", tmp_path / "wh_dask"
    wh = Warehouse(root=str(local_wh))
    seq = {"n_train_sequences": 2, "n_test_sequences": 2, "loads_pct": [30, 50], "include_synthetic": True}
    config = {
        "ops": {
            "sim__job_sequences": {"config": seq},
            "eval__baselines": {"config": {"policies": ["best_fit", "noop", "tetris"], "seeds": [0]}},
        }
    }
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources={"warehouse": wh, "table_io": TableIOManager(warehouse=wh)},
            run_config={"ops": {"sim__job_sequences": config["ops"]["sim__job_sequences"]}},
        ).success
    shutil.copytree(local_wh, dask_wh)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        local = Target(str(FIXTURES), str(local_wh), "sample")
        assert all(o.ok for o in run_all(local, instance, config, log=lambda _: None, layers=("eval",)))
        on_dask = Target(str(FIXTURES), str(dask_wh), "sample", cluster.scheduler_address)
        with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
            outcomes = run_all(
                on_dask, instance, config, log=lambda _: None, max_concurrent=2, layers=("eval",)
            )
        assert all(o.ok for o in outcomes)
        assert sorted(o.spec.label for o in outcomes) == [
            "eval_job[load30]",
            "eval_job[load50]",
            "eval_summary_job",
        ]
        per_load = [o for o in outcomes if o.spec.job == "eval_job"]
        starts = [o.started_at for o in per_load]
        ends = [o.started_at + o.seconds for o in per_load]
        assert max(starts) < min(ends)  # the two loads were in flight together
    tasks = [t["key"] for t in stream.data]
    eval_tasks = [k for k in tasks if k.startswith("eval_job.")]
    assert sorted(k.split(".")[1] for k in eval_tasks) == sorted(
        o.run_id for o in per_load
    )  # a task per load
    key = ["source", "load_pct", "policy", "sequence_id", "seed"]
    for table in ("eval__baselines", "eval__summary"):
        local_df = Warehouse(root=str(local_wh)).scan(table).collect()
        dask_df = Warehouse(root=str(dask_wh)).scan(table).collect()
        order = key if table == "eval__baselines" else ["source", "load_pct", "policy", "metric"]
        assert local_df.sort(order).equals(dask_df.sort(order)), table


def test_a_worker_that_cannot_see_the_warehouse_stops_the_run(tmp_path, cluster, monkeypatch):
    import assets.main as main

    monkeypatch.setattr(main, "_read_marker", lambda path: None)  # as if on another filesystem
    with pytest.raises(RuntimeError, match="every Dask worker"):
        check_shared_warehouse(cluster.scheduler_address, str(tmp_path / "wh"))
