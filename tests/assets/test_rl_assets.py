"""The training and evaluation assets materialise with a tiny configuration, and their outputs hang together."""

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import eval__baselines, sim__job_sequences
from assets.io_manager import TableIOManager
from assets.resources import Warehouse
from assets.rl import eval__results, eval__results_summary, policy_path, rl__tvw_rl


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
            selection=[eval__results, eval__results_summary],
        )
        assert evaluated.success
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


def test_the_runner_trains_after_the_sequences_and_evaluates_last():
    from assets.main import LAYERS, Target, _ready, plan_runs

    specs = plan_runs(Target("data", "unused"), [], LAYERS)
    layers = [s.layer for s in specs]
    assert layers.count("rl") == 9 and layers[-1] == "results"
    cluster = next(s for s in specs if s.layer == "cluster")
    rl = [s for s in specs if s.layer == "rl"]
    results = specs[-1]
    assert _ready(cluster, [*rl, results], set())  # pending later layers do not block the cluster run
    assert not _ready(rl[0], [cluster, *rl[1:], results], set())  # training waits for the sequences
    assert _ready(rl[0], rl[1:] + [results], set())  # training runs side by side
    assert not _ready(results, [], {rl[3]})  # the evaluation waits for every training run


def test_ablation_winners_rank_each_run_against_the_heuristics_on_the_same_sequences():
    from assets.rl import ablation_winners

    def rows(policy, returns, seqs=(0, 1), **extra):
        return pl.DataFrame(
            {
                "source": "s",
                "load_pct": 50,
                "policy": policy,
                "sequence_id": list(seqs),
                "episode_return": returns,
                "avg_util_cpu_frac": 0.5,
                "avg_overshoot_pct": 0.0,
                **extra,
            }
        )

    # tetris wins on sequences 0-1; best_fit's huge return on sequence 2 must not count (another sequence)
    baselines = pl.concat(
        [rows("tetris", [-10.0, -10.0]), rows("best_fit", [-30.0, -30.0]), rows("best_fit", [0.0], seqs=(2,))]
    )
    runs = pl.concat(
        [
            rows("tvw_rl", [-20.0, -20.0], ablation="advantage", value="raw", eval_noise_units=0),
            rows("tvw_rl", [-5.0, -5.0], ablation="advantage", value="scale", eval_noise_units=0),
            rows("tvw_rl", [0.0, 0.0], ablation="advantage", value="scale", eval_noise_units=3),
        ]
    ).drop("policy")
    out = ablation_winners(runs, baselines)
    assert out.select("value", "winner_by_return", "tvw_rl_rank_by_return").rows() == [
        ("raw", "tetris", 2),
        ("scale", "tvw_rl", 1),
    ]
    assert out["best_baseline_return"].to_list() == [-10.0, -10.0]


def test_the_ec_mapping_ablation_relabels_jobs_with_each_methods_mapping(tmp_path):
    import pytest

    from assets.rl import ABLATIONS, relabel_by_method

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


def test_learning_curves_are_plotted_relative_to_their_first_tenth():
    from assets.rl import plot_learning_curves, relative_curves

    rows = []
    for load, scale in ((30, 1.0), (80, 3.0)):  # the same 2 % rise on returns three times the size
        rows += [
            {
                "source": "s",
                "load_pct": load,
                "seed": 0,
                "iteration": i,
                "mean_return": -scale * (100 - i * 0.2),
            }
            for i in range(20)
        ]
    out = relative_curves(pl.DataFrame(rows))
    last = out.filter(pl.col("iteration") == 19).sort("load_pct")["return_change_pct"].to_list()
    # first tenth = iterations 0-1 (mean -99.9 x scale); iteration 19: -96.2 x scale -> +3.70 % at both loads
    assert last == pytest.approx([3.7037, 3.7037], abs=1e-3)
    assert plot_learning_curves(pl.DataFrame(rows))[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_ablation_run_is_trained_with_its_setting_and_tested_under_the_unablated_penalties():
    from assets.rl import ablation_config, ablation_test_sim
    from models.tvw_rl import TvwRlConfig

    base = TvwRlConfig.short()
    assert ablation_config(base, "k_overshoot", "0.0").sim.k_overshoot == 0.0  # trained without K_o
    assert ablation_config(base, "train_noise", "3").sim.noise_max_units == 3
    tested = ablation_test_sim(base, 2)
    weights = ("k_overshoot", "k_underutil", "k_contention", "k_wait")
    assert [getattr(tested, w) for w in weights] == [getattr(base.sim, w) for w in weights]
    assert tested.k_overshoot == 30000.0  # the paper's K_o, whatever the run was trained with
    assert tested.noise_max_units == 2 and not tested.is_shape_perturbed
    assert (
        tested.jobs_per_episode is None and tested.max_steps == 1000
    )  # whole test sequences, the safety cap
