"""The DeepRM and Dejavu training assets, DeepRM's Figure 4 and Dejavu's metrics materialise with a tiny
configuration; their checkpoints load back as schedulers that act on the evaluation's simulator."""

import json

import numpy as np
import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import sim__job_sequences
from assets.io_manager import TableIOManager
from assets.learned import load_learned, policy_path
from assets.resources import Warehouse
from assets.rl_baselines import (
    eval__deeprm_fig4,
    eval__dejavu_metrics,
    rl__deeprm,
    rl__dejavu,
)
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch

SOURCES = ["deepplace_synthetic", "deeprm_synthetic"]


def _train(instance, resources, asset, config: dict) -> None:
    result = materialize(
        [asset, *sim__job_sequences.to_source_assets()],
        instance=instance,
        resources=resources,
        partition_key="load50-seed0",
        run_config={"ops": {asset.node_def.name: {"config": config}}},
        selection=[asset],
    )
    assert result.success


def test_deeprm_and_dejavu_train_save_and_load_and_fig4_covers_every_policy_and_load(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq_config = {"n_train_sequences": 3, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq_config}}},
        ).success
        _train(instance, resources, rl__deeprm, {"preset": "sample", "n_iterations": 2, "sources": SOURCES})
        dejavu_cfg = {
            "preset": "sample",
            "n_pretrain_iterations": 1,
            "n_rl_iterations": 1,
            "n_demo_decisions": 60,
            "sources": ["deepplace_synthetic"],
        }
        _train(instance, resources, rl__dejavu, dejavu_cfg)
        fig4 = materialize(
            [eval__deeprm_fig4],
            instance=instance,
            resources=resources,
            run_config={
                "ops": {"eval__deeprm_fig4": {"config": {"loads_pct": [30, 70], "n_test_sequences": 2}}}
            },
        )
        assert fig4.success
        metrics = materialize(
            [eval__dejavu_metrics, *sim__job_sequences.to_source_assets()],
            instance=instance,
            resources=resources,
            run_config={"ops": {"eval__dejavu_metrics": {"config": {"seeds": [0, 1]}}}},
            selection=[eval__dejavu_metrics],
        )
        assert metrics.success
        [mat] = metrics.asset_materializations_for_node("eval__dejavu_metrics")
        [check] = metrics.get_asset_check_evaluations()
        assert check.check_name == "no_episode_hits_the_safety_cap" and check.passed
        assert mat.metadata["left_out"].data == ["dejavu deepplace_synthetic 50% seed 1"]

    # learning curves: one row per (source, iteration)
    curve = wh.scan("rl__deeprm").collect().sort("source", "iteration")
    assert curve.select("source", "iteration").rows() == [(s, i) for s in SOURCES for i in (0, 1)]
    assert curve["mean_slowdown"].is_finite().all() and (curve["mean_slowdown"] >= 1.0).all()
    dj = wh.scan("rl__dejavu").collect().sort("iteration")
    assert dj["iteration"].to_list() == [0, 1] and dj["is_pretraining"].to_list() == [True, False]
    assert dj["mean_return"].is_null().to_list() == [True, False] and dj["loss"].is_finite().all()

    # checkpoints with their sidecars, loaded back as schedulers that take valid actions
    eval_cfg = SimConfig(n_labels=16, oversize="clip")
    frame = wh.scan("sim__job_sequences").collect()
    jobs = JobBatch.from_frame(
        frame.filter((pl.col("source") == "deepplace_synthetic") & (pl.col("split") == "test"))
    )
    for name in ("deeprm_rl", "dejavu"):
        path = policy_path(wh, name, "deepplace_synthetic", 50, 0)
        meta = json.loads(path.with_suffix(".json").read_text())
        assert meta["policy"] == name and meta["git_revision"] and meta["config"]
        policy = load_learned(name, "deepplace_synthetic", 50, 0, wh)
        state = core.reset(eval_cfg, jobs, 0)
        rng = np.random.default_rng(0)
        for _ in range(30):
            actions = np.asarray(policy.act(eval_cfg, state, rng))
            assert core.action_mask(eval_cfg, state)[np.arange(jobs.batch_size), actions].all()
            state, *_ = core.step(eval_cfg, state, actions)
    assert policy_path(wh, "deeprm_rl", "deeprm_synthetic", 50, 0).exists()
    with pytest.raises(FileNotFoundError, match="seed1"):
        load_learned("dejavu", "deepplace_synthetic", 50, 1, wh)
    # a policy file under another run's name is refused, not silently evaluated
    wrong = policy_path(wh, "dejavu", "deepplace_synthetic", 80, 0)
    wrong.write_bytes(policy_path(wh, "dejavu", "deepplace_synthetic", 50, 0).read_bytes())
    wrong.with_suffix(".json").write_text(
        policy_path(wh, "dejavu", "deepplace_synthetic", 50, 0).with_suffix(".json").read_text()
    )
    with pytest.raises(ValueError, match="another run"):
        load_learned("dejavu", "deepplace_synthetic", 80, 0, wh)

    # Dejavu's metrics: one row per (source, load, policy), deeprm_synthetic left out, every metric finite
    dm = wh.scan("eval__dejavu_metrics").collect()
    assert sorted(dm.select("source", "load_pct", "policy").rows()) == [
        ("deepplace_synthetic", 50, p) for p in ("best_fit", "dejavu", "kube_default", "tetris")
    ]
    assert (dm["n_sequences"] == 2).all() and (dm["n_truncated"] == 0).all()
    assert dm.sort("policy")["n_seeds"].to_list() == [2, 1, 2, 2]  # Dejavu was trained with seed 0 only
    for metric in ("dejavu_util_frac", "rbd1", "rbd2", "completion_time_steps", "turnaround_time_steps"):
        assert dm[metric].is_finite().all() and dm[f"{metric}_ci95"].is_finite().all(), metric
    assert ((dm["dejavu_util_frac"] > 0) & (dm["dejavu_util_frac"] <= 1)).all()
    assert (dm["turnaround_time_steps"] <= dm["completion_time_steps"]).all()

    # Figure 4: every policy at every load, finite slowdowns, the agent trained at 50 %
    table = wh.scan("eval__deeprm_fig4").collect()
    policies = {"deeprm_rl", "deeprm_sjf", "deeprm_packer", "tetris", "tetris_star", "random_slot"}
    assert set(table.select("load_pct", "policy").rows()) == {
        (load, p) for load in (30, 70) for p in policies
    }
    assert table.height == 12
    assert table["mean_slowdown"].is_finite().all() and (table["mean_slowdown"] >= 1.0).all()
    assert table["slowdown_ci95"].is_finite().all() and (table["n_sequences"] == 2).all()
    agent = table.filter(pl.col("policy") == "deeprm_rl")
    assert agent["trained_at_load_pct"].to_list() == [50, 50]
    assert table.filter(pl.col("policy") != "deeprm_rl")["trained_at_load_pct"].is_null().all()


def test_eval_deeprm_fig4_without_a_trained_agent_is_a_clear_error(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    with pytest.raises(Exception, match="no DeepRM agent trained on deeprm_synthetic"):
        materialize([eval__deeprm_fig4], resources=resources, raise_on_error=True)
