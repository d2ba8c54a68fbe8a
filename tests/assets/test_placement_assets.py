"""The evaluation assets with the rules fitted on training sequences: eval__baselines fits them per (source, load),
says what each policy is, records what validation chose; eval__forecast scores the forecasters on test jobs."""

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import eval__baselines, eval__forecast, sim__job_sequences
from assets.io_manager import TableIOManager
from assets.resources import Warehouse

# the evaluation layer with the fitted rules on generated sequences (about 20 s): `pytest -m integration`
pytestmark = pytest.mark.integration

POLICIES = ["tetris", "noop", "hybrid_observed", "n_sigma_observed", "forecast_risk", "forecast_risk_truth"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    wh = Warehouse(root=str(tmp_path_factory.mktemp("wh")))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq = {"n_train_sequences": 4, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    evaluation = {"policies": POLICIES, "seeds": [0], "tuning_preset": "quick"}
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq}}},
        ).success
        run = materialize(
            [eval__baselines, *sim__job_sequences.to_source_assets()],
            instance=instance,
            resources=resources,
            partition_key="load50",
            run_config={"ops": {"eval__baselines": {"config": evaluation}}},
            selection=[eval__baselines],
        )
        assert run.success
        metadata = run.asset_materializations_for_node("eval__baselines")[0].metadata
        forecast = materialize(
            [eval__forecast, *sim__job_sequences.to_source_assets()],
            instance=instance,
            resources=resources,
            selection=[eval__forecast],
            run_config={"ops": {"eval__forecast": {"config": {"origins_per_job": 1}}}},
        )
        assert forecast.success
    return wh, {
        **metadata,
        "eval__forecast": forecast.asset_materializations_for_node("eval__forecast")[0].metadata,
    }


def test_fitted_rules_are_evaluated_and_say_what_they_are(evaluated):
    wh, metadata = evaluated
    results = wh.scan("eval__baselines").collect()
    assert set(results["policy"]) == set(POLICIES)
    kinds = dict(results.select("policy", "policy_kind").unique().iter_rows())
    assert kinds["forecast_risk"] == "forecast" and kinds["forecast_risk_truth"] == "oracle"
    assert kinds["hybrid_observed"] == "heuristic" and kinds["tetris"] == "heuristic"
    oracles = set(results.filter(pl.col("is_oracle"))["policy"])
    assert oracles == {"forecast_risk_truth"} and not results["is_learned"].any()
    assert set(results["n_machines"]) >= {10}
    # what validation chose, per source and fitted rule, with its fallback heuristic
    choices = metadata["fitted_rule_choices"].value
    some_cell = next(iter(choices.values()))
    assert {"hybrid_observed", "forecast_risk", "n_sigma_observed"} <= set(some_cell)
    assert "fallback" in some_cell["forecast_risk"] and "level" in some_cell["forecast_risk"]


def test_forecast_table_scores_every_forecaster_on_test_jobs(evaluated):
    wh, metadata = evaluated
    # each learned forecaster's fit: its seconds and the conformal shifts it kept
    fits = metadata["eval__forecast"]["fits"].value
    assert fits and all(k.endswith(("learned_with_ec", "learned_without_ec")) for k in fits)
    assert all(f["conformal_shifts"].startswith(("per origin", "pooled")) for f in fits.values())
    table = wh.scan("eval__forecast").collect()
    assert set(table["forecaster"]) == {
        "learned_with_ec",
        "learned_without_ec",
        "remaining_peak_with_ec",
        "remaining_peak_without_ec",
        "request",
        "ec_age_quantile",
        "seasonal_naive",
        "last_period_max",
    }
    assert set(table["origin"]) == {"arrival", "running"} and table["n"].sum() > 0
    assert "deeprm_synthetic" not in set(
        table["source"]
    )  # flat blocks on its own cluster: nothing to forecast
    scored = table.filter(pl.col("n") > 0)
    assert scored["coverage"].is_between(0.0, 1.0).all() and (scored["pinball_units"] >= 0).all()
