"""A real job on a local Dask cluster (2 worker processes) writes the same tables as the default executor."""

import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.resources import Warehouse
from cli.plan import RunSpec
from cli.run import run_all
from cli.summary import check_shared_warehouse
from cli.workers import Target, execute_named_run

pytestmark = pytest.mark.integration  # a Dask LocalCluster runs the EC layers: `pytest -m integration`

distributed = pytest.importorskip("distributed")
pytest.importorskip("dagster_dask")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
SOURCE = "alibaba2018"
TABLES = [
    "core__workloads",
    "core__usage",
    "core__long_running",
    "core__long_running_report",
]
"""per_source_job writes the canonical tables only; the EC layers fan out (test below)."""
EC_SOURCE = "google2011_derived"
"""The fixture source with long-running series to cluster."""
SMALL_EC = {
    "ec__mapping": {
        "config": {
            "ec": {"k_max": 5, "n_init": 3, "dtw": {"downsample": 12}},
            "gain": {
                "n_seeds": 2,
                "n_control_draws": 1,
                "max_eval_bins": 24,
                "forecaster": {"epochs": 1, "min_steps": 5, "max_train_windows": 50},
            },
            "stability_shuffles": 20,
            "ari_seeds": 1,
        }
    }
}
"""A quick EC configuration, given once: the profile copies it to the sweep and gain ops."""


def profile_file(folder: Path, ops: dict) -> str:
    """A profile YAML: the sample profile with these ops' settings on top."""
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump({"extends": "sample", "ops": ops}))
    return str(path)


EC_TABLES = [
    "ec__sweep_silhouette",
    "ec__sweep_labels",
    "ec__method_gain",
    "ec__silhouette",
    "ec__method_comparison",
    "ec__assignments",
    "ec__profiles",
    "ec__method_assignments",
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
        assert execute_named_run(local, spec, instance).ok
        on_dask = Target(str(FIXTURES), str(dask_wh), "sample", cluster.scheduler_address)
        check_shared_warehouse(on_dask.scheduler, on_dask.warehouse)
        with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
            outcome = execute_named_run(on_dask, spec, instance)
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


def test_the_ec_method_sweeps_fan_out_on_dask(tmp_path, cluster):
    """The EC layers on the derived fixture: the sweep and gain runs of the three methods two at a time, every
    step a Dask task; the same tables as in-process, and each method's own mapping beside the chosen one."""
    local_wh, dask_wh = tmp_path / "wh_local", tmp_path / "wh_dask"
    home = tmp_path / "dagster_home"
    home.mkdir()
    ec_layers = ("ec_sweep", "ec_gain", "ec")
    profile = profile_file(
        tmp_path, SMALL_EC
    )  # the sample's long-running thresholds, a quick EC configuration
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        local = Target(str(FIXTURES), str(local_wh), profile)
        quiet = {"log": lambda _: None, "sources": [EC_SOURCE]}
        assert all(o.ok for o in run_all(local, instance, layers=("raw", "per_source"), **quiet))
        shutil.copytree(local_wh, dask_wh)
        assert all(o.ok for o in run_all(local, instance, layers=ec_layers, **quiet))
        on_dask = Target(str(FIXTURES), str(dask_wh), profile, cluster.scheduler_address)
        with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
            outcomes = run_all(on_dask, instance, max_concurrent=2, layers=ec_layers, **quiet)
        assert all(o.ok for o in outcomes)
        labels = [o.spec.label for o in outcomes]
        assert sorted(labels) == sorted(
            [
                f"{job}[{m}|{EC_SOURCE}]"
                for job in ("ec_sweep_job", "ec_gain_job")
                for m in ("aggregate", "dtw", "temporal")
            ]
            + [f"ec_job[{EC_SOURCE}]"]
        )
        # every gain run started after every sweep of its source had finished (the common k reads them all)
        sweeps = [o for o in outcomes if o.spec.layer == "ec_sweep"]
        gains = [o for o in outcomes if o.spec.layer == "ec_gain"]
        assert max(o.started_at + o.seconds for o in sweeps) <= min(o.started_at for o in gains)
        assert labels[-1] == f"ec_job[{EC_SOURCE}]"
        run_ids = {o.run_id for o in sweeps + gains}
    keys = [t["key"] for t in stream.data]
    assert {k.split(".")[1] for k in keys if k.startswith(("ec_sweep_job.", "ec_gain_job."))} == run_ids
    for table in EC_TABLES:
        local_df = Warehouse(root=str(local_wh)).scan(table).collect()
        dask_df = Warehouse(root=str(dask_wh)).scan(table).collect()
        is_empty_allowed = table in ("ec__assignments", "ec__profiles")  # empty when no mapping is chosen
        assert local_df.height or is_empty_allowed, table
        assert local_df.sort(local_df.columns).equals(dask_df.sort(dask_df.columns)), table
    wh = Warehouse(root=str(dask_wh))
    per_method = wh.scan("ec__method_assignments").collect()
    assert sorted(per_method["method"].unique()) == ["aggregate", "dtw", "temporal"]
    chosen = wh.scan("ec__method_comparison").filter(pl.col("is_chosen")).collect()
    assert chosen.height <= 1  # none when no row passes the Holm-corrected test (2 seeds here: never)
    chosen_rows = (
        per_method.filter(pl.col("method") == chosen["method"][0]) if chosen.height else per_method.clear()
    )
    assert chosen_rows.equals(wh.scan("ec__assignments").collect())


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
    profile = profile_file(tmp_path, config["ops"])
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        local = Target(str(FIXTURES), str(local_wh), profile)
        assert all(o.ok for o in run_all(local, instance, log=lambda _: None, layers=("eval",)))
        on_dask = Target(str(FIXTURES), str(dask_wh), profile, cluster.scheduler_address)
        with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
            outcomes = run_all(on_dask, instance, log=lambda _: None, max_concurrent=2, layers=("eval",))
        assert all(o.ok for o in outcomes)
        assert sorted(o.spec.label for o in outcomes) == [
            "eval_job[load30]",
            "eval_job[load50]",
            "eval_summary_job",
            "forecast_eval_job",  # the forecast and EC labelling tables, beside the evaluations
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
    import cli.summary as summary

    monkeypatch.setattr(summary, "_read_marker", lambda path: None)  # as if on another filesystem
    with pytest.raises(RuntimeError, match="every Dask worker"):
        check_shared_warehouse(cluster.scheduler_address, str(tmp_path / "wh"))
