"""Our learned scheduler's training asset materialises with a tiny configuration, publishes a policy per source
that loads back as a scheduler taking valid actions on the evaluation's simulator, and refuses bad settings."""

import json

import numpy as np
import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import sim__job_sequences
from assets.io_manager import TableIOManager
from assets.learned import load_learned, policy_path
from assets.resources import Warehouse
from assets.rl import rl__forecast_residual
from models.forecast_placer import PlacerTrainConfig, placer_sim_config
from sim import core
from sim.jobs import JobBatch


def test_forecast_residual_trains_publishes_and_loads_back(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq_config = {"n_train_sequences": 4, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    train_config = {
        "sources": ["deepplace_synthetic"],
        "forecaster_preset": "sample",
        "tuning_preset": "smoke",  # the asset's wiring, not the grid: one level on validation
        # a budget that n_iterations bounds first: on a loaded machine 30 s went on the base stage, and no PG
        # iteration ran
        "placer": {"n_iterations": 1, "n_sequences": 2, "n_rollouts": 2, "time_budget_s": 600.0},
    }
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq_config}}},
        ).success
        result = materialize(
            [rl__forecast_residual, *sim__job_sequences.to_source_assets()],
            instance=instance,
            resources=resources,
            partition_key="load50-seed0",
            run_config={"ops": {"rl__forecast_residual": {"config": train_config}}},
            selection=[rl__forecast_residual],
        )
        assert result.success
        [check] = result.get_asset_check_evaluations()
        assert check.check_name == "learning_curve_is_finite" and check.passed

    curve = wh.scan("rl__forecast_residual").collect().sort("iteration")
    assert curve["stage"].to_list() == ["base", "pg"] and curve["iteration"].to_list() == [0, 1]
    assert curve["train_return"].is_null().to_list() == [True, False]
    assert curve["imitation_accuracy"][0] == 1.0  # untrained: the residual is its base rule
    path = policy_path(wh, "forecast_residual_rl", "deepplace_synthetic", 50, 0)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["policy"] == "forecast_residual_rl" and meta["config"]["base"] == "forecast_peak"

    frame = wh.scan("sim__job_sequences").collect()
    cfg = placer_sim_config(PlacerTrainConfig(), frame)
    jobs = JobBatch.from_frame(
        frame.filter((pl.col("source") == "deepplace_synthetic") & (pl.col("split") == "test"))
    )
    policy = load_learned("forecast_residual_rl", "deepplace_synthetic", 50, 0, wh)
    state, rng = core.reset(cfg, jobs, 0), np.random.default_rng(0)
    for _ in range(30):
        actions = np.asarray(policy.act(cfg, state, rng))
        assert core.action_mask(cfg, state)[np.arange(jobs.batch_size), actions].all()
        state, *_ = core.step(cfg, state, actions)


def test_train_settings_name_what_is_wrong():
    with pytest.raises(ValueError, match="base must be a fitted rule"):
        PlacerTrainConfig(base="tetris")
    with pytest.raises(ValueError, match="sees no future"):
        PlacerTrainConfig(base="forecast_risk_truth")  # an oracle cannot be the base of a learned policy
    with pytest.raises(ValueError, match="forecaster_preset must be one of"):
        PlacerTrainConfig(forecaster_preset="huge")
    with pytest.raises(ValueError, match="tuning_preset must be one of"):
        PlacerTrainConfig(tuning_preset="none")
    assert PlacerTrainConfig().train_sources(["bitbrains", "deeprm_synthetic"]) == ["bitbrains"]
