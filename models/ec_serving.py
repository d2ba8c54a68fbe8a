"""The EC classifier the simulator serves labels with: the saved one's model, trained without the test workloads.

`ec__classifier_accuracy` measures the classifier on held-out splits by workload group and then saves one trained
on EVERY labelled workload of the source: what labels a new workload in production. The evaluation cannot serve
that one. Its test sequences are cut from workloads it was trained on, so a test job's label would be recalled,
not predicted (in-sample: on the sample's Bitbrains, 0.89 accuracy from the workloads' first bins, against 0.55
from unseen ones; `models.sim_labeller`'s docstring). Here the same model (the saved file's config, its m, its
seed) is trained again on the labelled workloads outside every workload group that feeds a test sequence
(`sim__job_sequences`, split "test"; a group is the days of one Google job, `pipelines.workloads`), and saved
beside the first as `ec_classifier_serving__<source>.pt`. Every policy that reads EC labels on a real source, at
training and at test, was served by this one (`assets.ec.labellers`); since 2026-11-27 the simulator-view labeller
serves by default (`models.sim_labeller`, `SequenceRunSettings.served_labeller`) and this copy where it is
chosen or cannot be fitted. `eval__ec_labelling`'s classifier rows measure it. Rows in = left out + trained on
(`sim__ec_serving`, checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import polars as pl

from models.ec_classifier import (
    TrainedClassifier,
    load_classifier,
    meta_matrix,
    train_classifier,
    usage_prefixes,
    with_series,
)
from pipelines.features import SeriesSet, series_matrix
from pipelines.long_running import fill_window_gaps, long_running_usage
from pipelines.synthetic import is_synthetic
from pipelines.warehouse import ParquetWarehouse
from pipelines.workloads import workload_groups

SERVING_TABLE = {
    "source": pl.String,
    "n_labelled": pl.Int64,
    "n_test_groups": pl.Int64,
    "n_left_out": pl.Int64,
    "n_trained": pl.Int64,
    "n_classes": pl.Int64,
    "prefix_bins": pl.Int64,
    "model_path": pl.String,
    "served_labeller": pl.String,
    "sim_view_n_train_jobs": pl.Int64,
    "sim_view_path": pl.String,
}
"""One row per real source with a saved EC classifier or sequences: what its serving copy was trained on, and
which labeller serves its labels (`models.sim_labeller.SIM_VIEW_SERVING`; `with_served_labeller`)."""

SERVING_TABLE_DOCS = {
    "sim__ec_serving": "Per real source, which labeller serves EC labels in the simulator (served_labeller: the "
    "simulator-view labeller fitted on the training sequences' jobs, `models.sim_labeller`, or the EC classifier) "
    "and what the EC classifier's serving copy was trained on: the saved classifier's model without the test "
    "sequences' workload groups (`models.ec_serving`; it also reads core__workloads' meta columns)."
}
"""The table `sim__job_sequences` writes beside the sequences: name -> description."""

SERVING_CHECK_DOCS = {
    "serving_counts_add_up": "Per source, the labelled workloads with a usage series = those left out (in a workload "
    "group of the test sequences) + those the serving classifier was trained on; every source with a saved "
    "classifier has a serving one (2 or more ECs left to train on: else its test jobs would see their clustering "
    "labels, computed from their whole series), and the labeller said to serve a source exists (the "
    "simulator-view labeller's file where it serves, else the serving classifier's).",
}
"""The check of `sim__ec_serving`: name -> what passing means."""


def serving_path(saved: Path) -> Path:
    """Where the serving copy of the classifier saved at `saved` ('ec_classifier__<source>.pt') lives."""
    return saved.with_name(saved.name.replace("ec_classifier__", "ec_classifier_serving__", 1))


def fit_serving_classifier(
    saved: TrainedClassifier, labelled: pl.DataFrame, series: SeriesSet, test_workloads: Iterable[str]
) -> tuple[TrainedClassifier | None, dict]:
    """The saved classifier's model trained again, with its config, on the `labelled` workloads (EC label joined
    with the workloads' meta columns; those with a series in `series`) outside the workload groups of
    `test_workloads`, and its row of SERVING_TABLE (without source and path). None when fewer than 2 ECs are
    left."""
    labelled, values = with_series(labelled, series)
    test_groups = np.unique(workload_groups(sorted(set(test_workloads))))
    left_out = np.isin(workload_groups(labelled["workload_id"].to_list()), test_groups)
    keep = labelled.filter(pl.Series(~left_out))
    m = int(saved.cfg.prefix_bins)
    row = {
        "n_labelled": labelled.height,
        "n_test_groups": int(test_groups.size),
        "n_left_out": int(left_out.sum()),
        "n_trained": 0,
        "n_classes": 0,
        "prefix_bins": m,
    }
    if keep.height == 0 or keep["ec_label"].n_unique() < 2:
        return None, row
    values = [v for v, out in zip(values, left_out, strict=True) if not out]
    labels = keep["ec_label"].to_numpy()
    model = train_classifier(meta_matrix(keep), usage_prefixes(values, m) if m else None, labels, saved.cfg)
    return model, row | {"n_trained": keep.height, "n_classes": int(np.unique(labels).size)}


def serving_classifiers(
    warehouse: ParquetWarehouse,
    sequences: pl.DataFrame,
    saved_path_of: Callable[[str], Path],
    log: Callable[[str], None] = print,
    out_dir: Path | None = None,
) -> pl.DataFrame:
    """For every real source of `sequences` (the `sim__job_sequences` table) with a saved classifier
    (`saved_path_of(source)`): its serving copy (`fit_serving_classifier`) on the warehouse's EC labels, workload
    meta and long-running usage, saved at `serving_path`; a stale serving file of a source without one is
    removed, so nothing serves labels learned from test workloads. SERVING_TABLE rows. `out_dir`: save there
    instead (a benchmark's own sequences, beside the pipeline's serving files)."""
    rows = []
    for source in sorted(set(sequences["source"].unique().to_list())):
        saved_at = Path(saved_path_of(source))
        serve_at = serving_path(saved_at if out_dir is None else Path(out_dir) / saved_at.name)
        if is_synthetic(source) or not saved_at.exists():
            serve_at.unlink(missing_ok=True)
            continue
        saved = load_classifier(saved_at)
        long_running = warehouse.scan("core__long_running", [source]).collect()
        usage = long_running_usage(warehouse, source, long_running)
        series = series_matrix(
            fill_window_gaps(usage, long_running), long_running, None, max_bins=max(saved.cfg.prefix_bins, 1)
        )
        labelled = warehouse.scan("ec__assignments", [source]).join(
            warehouse.scan("core__workloads", [source]), on=["source", "workload_id"], how="inner"
        )
        test = sequences.filter((pl.col("source") == source) & (pl.col("split") == "test"))["workload_id"]
        model, row = fit_serving_classifier(saved, labelled.collect(), series, test.unique().to_list())
        if model is None:
            serve_at.unlink(missing_ok=True)
        else:
            card = {
                "source": source,
                "trained_on": f"{row['n_trained']} of {row['n_labelled']} labelled workloads",
                "left_out": f"{row['n_left_out']} in the {row['n_test_groups']} workload groups of the test "
                "sequences",
                "serves": "every EC label a policy reads in the simulator (models.ec_serving)",
            }
            model.save(serve_at, card=card)
        log(
            f"{source}: serving EC classifier on {row['n_trained']} of {row['n_labelled']} labelled workloads "
            f"({row['n_left_out']} left out: {row['n_test_groups']} test workload groups)"
            + ("" if model else "; fewer than 2 ECs left, no classifier served")
        )
        rows.append({"source": source, **row, "model_path": str(serve_at) if model else None})
    return pl.DataFrame(rows, schema=SERVING_TABLE)


def with_served_labeller(classifiers: pl.DataFrame, served: pl.DataFrame) -> pl.DataFrame:
    """SERVING_TABLE: the serving classifiers' rows (`serving_classifiers`) with which labeller serves each source
    (`models.sim_labeller.serving_sim_labellers` rows), one row per source of either; a source with a classifier
    but no row in `served` is served by the classifier."""
    left = classifiers.drop(
        [c for c in ("served_labeller", "sim_view_n_train_jobs", "sim_view_path") if c in classifiers.columns]
    )
    out = left.join(served, on="source", how="full", coalesce=True)
    out = out.with_columns(pl.col("served_labeller").fill_null("classifier"))
    return out.select(SERVING_TABLE.keys()).cast(SERVING_TABLE).sort("source")


def serving_check_values(table: pl.DataFrame) -> dict[str, tuple[bool, dict]]:
    """Check name (SERVING_CHECK_DOCS) -> (passed, metadata) of a SERVING_TABLE frame."""
    adds_up = pl.col("n_labelled") == pl.col("n_left_out") + pl.col("n_trained")
    has_classifier = pl.col("n_labelled").is_not_null()
    served_path = (
        pl.when(pl.col("served_labeller") == "sim_view").then("sim_view_path").otherwise("model_path")
    )
    must_serve = has_classifier | (pl.col("served_labeller") == "sim_view")
    bad = table.filter(
        (has_classifier & (~adds_up | pl.col("model_path").is_null())) | (must_serve & served_path.is_null())
    )
    return {"serving_counts_add_up": (bad.height == 0, {"bad_sources": bad["source"].to_list()})}
