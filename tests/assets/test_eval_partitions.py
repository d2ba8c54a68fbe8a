"""The heuristic evaluation fans out by load: its partitions read back as the table evaluated whole, a load
without sequences fails naming it, stale load partitions are removed and `tvw-run` refuses a load without one."""

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import eval__baselines, eval__summary, sim__job_sequences
from assets.io_manager import TableIOManager
from assets.resources import Warehouse
from cli.plan import RunSpec
from cli.summary import remove_unplanned_evaluations
from sim.evaluate import (
    RESULT_KEY,
    EvalSettings,
    eval_partition_keys,
    eval_sim_config,
    evaluate_by_cluster,
    summarise,
)

POLICIES = ["best_fit", "noop", "tetris", "ec_peak_aware"]

pytestmark = pytest.mark.integration  # eval_job partitions materialised (about 10 s): `pytest -m integration`


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """Synthetic sequences at 30 and 50 %; eval__baselines materialised one load partition at a time, then the
    summary over both; the failed run of a load that has no sequences."""
    wh = Warehouse(root=str(tmp_path_factory.mktemp("wh")))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq = {"n_train_sequences": 2, "n_test_sequences": 2, "loads_pct": [30, 50], "include_synthetic": True}
    base = {"policies": POLICIES, "seeds": [0, 1]}
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq}}},
        ).success
        runs = {
            key: materialize(
                [eval__baselines, *sim__job_sequences.to_source_assets()],
                instance=instance,
                resources=resources,
                run_config={"ops": {"eval__baselines": {"config": base}}},
                partition_key=key,
                selection=[eval__baselines],
                raise_on_error=False,
            )
            for key in ("load30", "load50", "load80")
        }
        assert materialize(
            [eval__summary, *eval__baselines.to_source_assets()],
            instance=instance,
            resources=resources,
            selection=[eval__summary],
        ).success
    return wh, runs, base


def test_the_load_partitions_are_the_table_evaluated_whole(evaluated):
    wh, runs, base = evaluated
    assert runs["load30"].success and runs["load50"].success
    jobs = wh.scan("sim__job_sequences").collect()
    config = EvalSettings(policies=tuple(base["policies"]), seeds=tuple(base["seeds"]))
    whole = evaluate_by_cluster(
        jobs, POLICIES, eval_sim_config("eval__baselines", config, jobs), base["seeds"]
    )
    parts = wh.scan("eval__baselines").collect()
    assert sorted(p.name for p in wh.table_files("eval__baselines")) == ["load30.parquet", "load50.parquet"]
    assert parts.sort(list(RESULT_KEY)).equals(whole)
    assert wh.scan("eval__summary").collect().equals(summarise(whole))
    for key in ("load30", "load50"):  # the checks run per partition, on that load's rows
        checks = {e.check_name: e.passed for e in runs[key].get_asset_check_evaluations()}
        assert len(checks) == 4 and all(checks.values()), (key, checks)


def test_a_load_without_sequences_fails_naming_it(evaluated):
    _, runs, _ = evaluated
    failed = runs["load80"]
    assert not failed.success
    messages = " ".join(
        str(e.event_specific_data.error.cause or e.event_specific_data.error.message)
        for e in failed.all_events
        if e.is_step_failure
    )
    assert "no test sequences at 80 %" in messages and "[30, 50]" in messages


def test_a_load_with_no_partition_is_named():
    with pytest.raises(ValueError, match=r"load\(s\) \[40\] have no evaluation partition"):
        eval_partition_keys([30, 40])


def test_stale_load_partitions_are_removed_before_the_evaluation(tmp_path):
    wh = Warehouse(root=str(tmp_path))
    frame = pl.DataFrame({"load_pct": [30]})
    for key in ("load30", "load50", None):  # None: the table as written before it was partitioned
        wh.write("eval__baselines", frame, key)
        wh.write("eval__results", frame, key)
    planned = [RunSpec("eval", "eval_job", "load50", None), RunSpec("eval", "eval_summary_job", None, None)]
    assert remove_unplanned_evaluations(wh, planned) == ["eval__baselines[all]", "eval__baselines[load30]"]
    assert [p.name for p in wh.table_files("eval__baselines")] == ["load50.parquet"]
    assert len(wh.table_files("eval__results")) == 3  # its job is not run: left as it is
    planned.append(RunSpec("results", "results_job", "load50", None))
    assert remove_unplanned_evaluations(wh, planned) == ["eval__results[all]", "eval__results[load30]"]
    assert [p.name for p in wh.table_files("eval__results")] == ["load50.parquet"]


def test_tvw_run_stops_on_a_configured_load_without_partition(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from cli.run import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    profile = tmp_path / "profile.yaml"
    profile.write_text("ops:\n  sim__job_sequences:\n    config:\n      loads_pct: [50, 40]\n")
    traces = Path(__file__).parents[1] / "fixtures" / "traces"
    argv = ["--traces", str(traces), "--warehouse", str(tmp_path / "wh"), "--profile", str(profile)]
    assert main([*argv, "--sources", "google2011", "--layers", "eval"]) == 2
    assert "sim__job_sequences.loads_pct: ['40'] has no `eval_job` partition" in capsys.readouterr().err
    assert not (tmp_path / "wh").exists()
