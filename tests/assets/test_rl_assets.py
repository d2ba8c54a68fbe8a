"""The training and evaluation assets materialise with a tiny configuration, and their outputs hang together."""

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import eval__baselines, sim__job_sequences
from assets.io_manager import TableIOManager
from assets.learned import policy_path
from assets.resources import Warehouse
from assets.rl import eval__results, eval__results_summary, rl__tvw_rl


def test_training_then_evaluation_of_learned_and_heuristic_policies(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq_config = {"n_train_sequences": 3, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    with DagsterInstance.ephemeral() as instance:
        first = materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq_config}}},
        )
        assert first.success
        train_cfg = {"preset": "short", "n_iterations": 2, "sources": ["deepplace_synthetic"]}
        trained = materialize(
            [
                rl__tvw_rl,
                sim__job_sequences.to_source_assets()[0],
                *sim__job_sequences.to_source_assets()[1:],
            ],
            instance=instance,
            resources=resources,
            partition_key="load50-seed0",
            run_config={"ops": {"rl__tvw_rl": {"config": train_cfg}}},
            selection=[rl__tvw_rl],
        )
        assert trained.success
        curve = wh.scan("rl__tvw_rl").collect()
        assert curve["iteration"].to_list() == [0, 1] and set(curve["source"]) == {"deepplace_synthetic"}
        assert policy_path(wh, "tvw_rl", "deepplace_synthetic", 50, 0).exists()
        assert policy_path(wh, "tvw_rl", "deepplace_synthetic", 50, 0).with_suffix(".json").exists()
        base_cfg = {"policies": ["best_fit", "noop", "tetris"], "seeds": [0]}
        assert materialize(
            [eval__baselines, *sim__job_sequences.to_source_assets()],
            instance=instance,
            resources=resources,
            run_config={"ops": {"eval__baselines": {"config": base_cfg}}},
            selection=[eval__baselines],
            partition_key="load50",
        ).success
        eval_cfg = {"policies": ["tvw_rl"], "seeds": [0]}
        evaluated = materialize(
            [
                eval__results,
                eval__results_summary,
                *sim__job_sequences.to_source_assets(),
                *eval__baselines.to_source_assets(),
            ],
            instance=instance,
            resources=resources,
            run_config={"ops": {"eval__results": {"config": eval_cfg}}},
            selection=[eval__results],
            partition_key="load50",
        )
        assert evaluated.success
        assert materialize(
            [eval__results_summary, *eval__results.to_source_assets()],
            instance=instance,
            resources=resources,
            selection=[eval__results_summary],
        ).success
    results = wh.scan("eval__results").collect()
    learned = results.filter(pl.col("policy") == "tvw_rl")
    # the learned policy ran exactly where a checkpoint exists: DeepPlace at 50 %, seed 0, both test sequences
    assert learned.select("source", "load_pct", "seed").unique().rows() == [("deepplace_synthetic", 50, 0)]
    assert learned.height == 2
    assert set(results["policy"]) == {
        "best_fit",
        "noop",
        "tetris",
        "tvw_rl",
    }  # heuristics from eval__baselines
    assert (results["machines_lower_bound"] >= 1).all()
    checks = {e.check_name: e.passed for e in evaluated.get_asset_check_evaluations()}
    assert checks["noop_has_the_worst_return"] and checks["utilisation_within_capacity"]
    assert checks["only_noop_hits_the_safety_cap"]


def test_an_ablation_run_and_its_table(tmp_path):
    from assets.rl import eval__ablations, rl__ablation

    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq_config = {"n_train_sequences": 2, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    abl = {"preset": "short", "n_iterations": 1, "source": "deepplace_synthetic"}
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq_config}}},
        ).success
        for key in ("ec_mapping=none", "k_underutil=0.0"):
            assert materialize(
                [rl__ablation, *sim__job_sequences.to_source_assets()],
                instance=instance,
                resources=resources,
                partition_key=key,
                run_config={"ops": {"rl__ablation": {"config": abl}}},
                selection=[rl__ablation],
            ).success
        assert materialize(
            [eval__ablations, *rl__ablation.to_source_assets()],
            instance=instance,
            resources=resources,
            selection=[eval__ablations],
        ).success
    table = wh.scan("eval__ablations").collect()
    assert set(zip(table["ablation"], table["value"], strict=True)) == {
        ("ec_mapping", "none"),
        ("k_underutil", "0.0"),
    }
    assert sorted(set(table["eval_noise_units"])) == [0, 1, 2, 3] and (table["n_sequences"] == 2).all()


def test_the_runner_trains_after_the_sequences_and_evaluates_last(tmp_path):
    from pathlib import Path

    from assets.definitions import build_definitions
    from cli.plan import plan

    runs = plan(build_definitions(Path("data"), tmp_path / "wh", "sample"), ["cluster", "rl", "results"], [])
    layers = [s.layer for s in runs.runs]
    assert layers.count("rl") == 18 and layers[-1] == "results"  # the papers' agents and ours, 9 runs each
    cluster = next(s for s in runs.runs if s.layer == "cluster")
    rl = [s for s in runs.runs if s.layer == "rl"]
    results = {s.partition: s for s in runs.runs if s.job == "results_job"}
    assert not runs.waits[cluster] & {
        *rl,
        *results.values(),
    }  # pending later layers do not block the cluster run
    assert cluster in runs.waits[rl[0]]  # training waits for the sequences
    assert not runs.waits[rl[0]] & set(rl)  # training runs side by side
    for load, run in results.items():  # a load's evaluation waits for every training run at that load
        assert {s for s in rl if s.partition.startswith(f"{load}-")} <= runs.waits[run], load


def test_the_ec_mapping_ablation_relabels_jobs_with_each_methods_mapping(tmp_path):

    from assets.rl import relabel_by_method
    from models.ablation import ABLATIONS

    assert ABLATIONS["ec_mapping"] == ("none", "aggregate", "dtw", "temporal")  # TVW-RL Table 2's rows
    wh = Warehouse(root=str(tmp_path / "wh"))
    jobs = pl.DataFrame(
        {"workload_id": ["a", "b", "c", "a"], "ec_label": [5, 5, 5, 5], "cpu_units": [1, 2, 3, 1]},
        schema_overrides={"ec_label": pl.Int32},
    )
    with pytest.raises(ValueError, match="no ec__method_assignments table"):
        relabel_by_method(jobs, "dtw", wh, "google2011_derived")
    mapping = pl.DataFrame(
        {
            "source": ["google2011_derived"] * 4,
            "workload_id": ["a", "b", "a", "b"],
            "method": ["dtw", "dtw", "temporal", "temporal"],
            "k": [2, 2, 3, 3],
            "ec_label": [1, 0, 2, 2],
        }
    )
    wh.write("ec__method_assignments", mapping, "google2011_derived")
    lines = []
    dtw = relabel_by_method(jobs, "dtw", wh, "google2011_derived", lines.append)
    assert dtw.columns == jobs.columns and dtw["ec_label"].dtype == pl.Int32
    assert dtw["ec_label"].to_list() == [1, 0, 0, 1]  # c is not in the mapping: label 0, and counted
    assert "1 of 3 workloads uncovered" in lines[0]
    assert relabel_by_method(jobs, "temporal", wh, "google2011_derived")["ec_label"].to_list() == [2, 2, 0, 2]
    assert relabel_by_method(jobs, "none", wh, "google2011_derived")["ec_label"].to_list() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="synthetic source"):
        relabel_by_method(jobs, "aggregate", wh, "deepplace_synthetic")
    with pytest.raises(ValueError, match="unknown"):
        relabel_by_method(jobs, "kmeans", wh, "google2011_derived")
