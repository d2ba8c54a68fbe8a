"""The serving EC classifier never sees a workload (or a day of a job) of the test sequences."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from models.ec_classifier import ClassifierConfig, meta_matrix, train_classifier, usage_prefixes
from models.ec_serving import (
    SERVING_TABLE,
    fit_serving_classifier,
    serving_check_values,
    serving_path,
    with_served_labeller,
)
from models.sim_labeller import SIM_VIEW_SERVING
from pipelines.features import SeriesSet

CFG = ClassifierConfig(prefix_bins=4, hidden_sizes=(8, 4), epochs=5, n_threads=1)


def _labelled(ids: list[str], labels: list[int]) -> tuple[pl.DataFrame, SeriesSet]:
    rng = np.random.default_rng(0)
    n = len(ids)
    labelled = pl.DataFrame(
        {
            "source": ["s"] * n,
            "workload_id": ids,
            "ec_label": labels,
            "cpu_request_frac": rng.uniform(0.1, 0.5, n),
            "mem_request_frac": rng.uniform(0.1, 0.5, n),
            "priority": [1.0] * n,
            "scheduling_class": [0.0] * n,
        }
    )
    values = rng.uniform(0, 1, (n, 2, 6)) + np.asarray(labels, dtype=float)[:, None, None]
    series = SeriesSet(np.asarray(ids), values, np.full(n, 6), np.zeros((n, 8)))
    return labelled, series


def test_serving_classifier_leaves_out_every_day_of_a_test_job() -> None:
    ids = [f"j{j}_d{d}" for j in range(8) for d in range(3)] + ["vm1", "vm2"]
    labels = [j % 2 for j in range(8) for _ in range(3)] + [0, 1]
    labelled, series = _labelled(ids, labels)
    saved = train_classifier(np.zeros((4, 4)), np.zeros((4, 2, 4)), np.array([0, 1, 0, 1]), CFG)
    # the test sequences hold one day of j0 and of j5 and the VM vm2: all of j0's and j5's days are left out
    model, row = fit_serving_classifier(saved, labelled, series, ["j0_d1", "j5_d2", "vm2"])
    assert row == {
        "n_labelled": 26,
        "n_test_groups": 3,
        "n_left_out": 7,
        "n_trained": 19,
        "n_classes": 2,
        "prefix_bins": 4,
    }
    assert model is not None and model.cfg == saved.cfg and model.classes.tolist() == [0, 1]
    # the same model as one trained on the kept workloads directly: nothing else enters
    kept = labelled.filter(~pl.col("workload_id").str.contains(r"^j[05]_|^vm2$"))
    rows = [ids.index(w) for w in kept["workload_id"]]
    direct = train_classifier(
        meta_matrix(kept), usage_prefixes(list(series.values[rows]), 4), kept["ec_label"].to_numpy(), CFG
    )
    for name, weights in direct.model.state_dict().items():
        assert torch.equal(weights, model.model.state_dict()[name]), name
    # a labelled workload without a series is not counted; fewer than 2 ECs left: no classifier
    only_zero = labelled.with_columns(
        ec_label=pl.when(pl.col("workload_id").str.starts_with("j1")).then(1).otherwise(0)
    )
    none, row = fit_serving_classifier(saved, only_zero, series, ["j1_d0"])
    assert none is None and row["n_trained"] == 0 and row["n_left_out"] == 3


def test_serving_check_and_path() -> None:
    good = {
        "source": "s",
        "n_labelled": 10,
        "n_left_out": 3,
        "n_trained": 7,
        "model_path": "x",
        "served_labeller": "classifier",
        "sim_view_n_train_jobs": None,
        "sim_view_path": None,
    }
    frame = lambda row: pl.DataFrame([row], schema=SERVING_TABLE)  # noqa: E731
    assert serving_check_values(frame(good))["serving_counts_add_up"][0]
    sim_view = {**good, "served_labeller": "sim_view", "sim_view_n_train_jobs": 50, "sim_view_path": "y"}
    assert serving_check_values(frame(sim_view))["serving_counts_add_up"][0]
    # a source without a classifier, served by the simulator-view labeller; and one served by nothing
    no_classifier = {k: None for k in good} | {
        "source": "s",
        "served_labeller": "sim_view",
        "sim_view_path": "y",
    }
    assert serving_check_values(frame(no_classifier))["serving_counts_add_up"][0]
    nothing = {k: None for k in good} | {"source": "s", "served_labeller": "classifier"}
    assert serving_check_values(frame(nothing))["serving_counts_add_up"][0]  # no labels to serve: as before
    for bad in (
        {**good, "n_trained": 6},
        {**good, "model_path": None},
        {**sim_view, "sim_view_path": None},
        {**no_classifier, "sim_view_path": None},
    ):
        passed, meta = serving_check_values(frame(bad))["serving_counts_add_up"]
        assert not passed and meta["bad_sources"] == ["s"]
    from pathlib import Path

    assert serving_path(Path("/w/models/ec_classifier__bitbrains.pt")) == Path(
        "/w/models/ec_classifier_serving__bitbrains.pt"
    )


def test_served_labeller_rows_join_the_classifier_rows() -> None:
    row = {"source": "a", "n_labelled": 4, "n_test_groups": 1, "n_left_out": 1, "n_trained": 3}
    classifiers = pl.DataFrame(
        [row | {"n_classes": 2, "prefix_bins": 0, "model_path": "pa"}], schema=SERVING_TABLE
    )
    served = pl.DataFrame(
        [
            {"source": "a", "served_labeller": "sim_view", "sim_view_n_train_jobs": 9, "sim_view_path": "va"},
            {"source": "b", "served_labeller": "sim_view", "sim_view_n_train_jobs": 5, "sim_view_path": "vb"},
        ],
        schema=SIM_VIEW_SERVING,
    )
    out = with_served_labeller(classifiers, served)
    assert out.columns == list(SERVING_TABLE) and out["source"].to_list() == ["a", "b"]
    assert out["model_path"].to_list() == ["pa", None] and out["sim_view_path"].to_list() == ["va", "vb"]
    only_classifier = with_served_labeller(classifiers, served.clear())
    assert only_classifier["served_labeller"].to_list() == ["classifier"]


@pytest.mark.parametrize("test_ids", [[], ["nobody"]])
def test_no_test_workload_trains_on_all(test_ids: list[str]) -> None:
    labelled, series = _labelled(["a", "b", "c", "d"], [0, 1, 0, 1])
    saved = train_classifier(np.zeros((2, 4)), np.zeros((2, 2, 4)), np.array([0, 1]), CFG)
    model, row = fit_serving_classifier(saved, labelled, series, test_ids)
    assert model is not None and row["n_left_out"] == 0 and row["n_trained"] == 4
