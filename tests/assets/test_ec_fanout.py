"""The EC method sweep fans out: the runs tvw-run plans and their order, the shared config, the table order the
random controls are drawn by, and each method's own mapping (ec__method_assignments)."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from assets.definitions import load_profile
from assets.ec import EC_SWEEP_LABELS, _gathered_rows, _method_assignments, k_rules
from assets.jobs import with_shared_ec_config
from assets.main import RunSpec, Target, _ops_config_for, _ready, plan_runs
from models.prediction_gain import choose_mapping, with_holm

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
EC_LAYERS = ("per_source", "ec_sweep", "ec_gain", "ec", "cluster")


def _spec(specs: list[RunSpec], label: str) -> RunSpec:
    return next(s for s in specs if s.label == label)


def test_the_ec_layers_plan_a_run_per_source_and_configured_method():
    target = Target(str(FIXTURES), "/nowhere", "sample")
    specs = plan_runs(target, ["bitbrains", "alibaba2018"], EC_LAYERS)
    assert [s.label for s in specs if s.layer == "ec_sweep"] == [
        "ec_sweep_job[aggregate|bitbrains]",
        "ec_sweep_job[temporal|bitbrains]",
        "ec_sweep_job[dtw|bitbrains]",
        "ec_sweep_job[aggregate|alibaba2018]",
        "ec_sweep_job[temporal|alibaba2018]",
        "ec_sweep_job[dtw|alibaba2018]",
    ]
    assert [s.label for s in specs if s.layer == "ec"] == ["ec_job[bitbrains]", "ec_job[alibaba2018]"]
    two = {"ops": {"ec__mapping": {"config": {"methods": ["temporal", "dtw"]}}}}
    planned = plan_runs(target, ["bitbrains"], ("ec_gain",), two)
    assert [s.partition for s in planned] == ["temporal|bitbrains", "dtw|bitbrains"]


def test_an_ec_run_waits_only_for_the_earlier_ec_runs_of_its_own_source():
    specs = plan_runs(Target(str(FIXTURES), "/nowhere", "sample"), ["bitbrains", "alibaba2018"], EC_LAYERS)
    sweep = _spec(specs, "ec_sweep_job[dtw|bitbrains]")
    gain = _spec(specs, "ec_gain_job[aggregate|bitbrains]")
    choice = _spec(specs, "ec_job[bitbrains]")
    other_sweep = _spec(specs, "ec_sweep_job[dtw|alibaba2018]")
    assert not _ready(sweep, [_spec(specs, "per_source_job[bitbrains]")], set())
    assert _ready(sweep, [_spec(specs, "per_source_job[alibaba2018]")], set())
    # the gain of one method needs every method's sweep of its source (the common k), not other sources'
    assert not _ready(gain, [], {sweep})
    assert _ready(gain, [other_sweep], set())
    assert not _ready(choice, [_spec(specs, "ec_gain_job[dtw|bitbrains]")], set())
    assert _ready(choice, [other_sweep, _spec(specs, "ec_gain_job[dtw|alibaba2018]")], set())
    assert not _ready(_spec(specs, "cluster_job"), [], {_spec(specs, "ec_job[alibaba2018]")})


def test_the_profile_configures_the_ec_layer_once():
    sample = load_profile("sample")
    ec = sample["ops"]["ec__mapping"]
    shared = with_shared_ec_config(sample["ops"])
    assert shared["ec__method_sweep"] == shared["ec__method_gain"] == ec
    own = {"ec__mapping": ec, "ec__method_gain": {"config": {"n_init": 2}}}
    assert with_shared_ec_config(own)["ec__method_gain"] == {"config": {"n_init": 2}}  # given: kept
    assert with_shared_ec_config({"core__usage": {}}) == {"core__usage": {}}
    target = Target(str(FIXTURES), "/nowhere", "sample")
    for profile in ("sample", "paper"):
        config = load_profile(profile)
        for job, op in (("ec_sweep_job", "ec__method_sweep"), ("ec_gain_job", "ec__method_gain")):
            assert _ops_config_for(target, job, config)["ops"] == {op: config["ops"]["ec__mapping"]}
        assert set(_ops_config_for(target, "ec_job", config)["ops"]) <= {
            "ec__mapping",
            "ec__classifier_accuracy",
        }


def test_table_order_is_every_k_of_every_method():
    best = {"aggregate": 4, "temporal": 3, "dtw": None}
    labelled = {"aggregate": {5, 3, 4}, "temporal": {3, 4}, "dtw": set()}
    assert list(k_rules(best, labelled).items()) == [
        (("aggregate", 3), "sweep"),
        (("aggregate", 4), "silhouette_best"),
        (("aggregate", 5), "sweep"),
        (("temporal", 3), "silhouette_best"),
        (("temporal", 4), "sweep"),
    ]


def _comparison() -> pl.DataFrame:
    """aggregate: k=3 passes Holm (median 1), k=4 does not (median 2); temporal and dtw: nothing passes
    (silhouette-best k 3). Holm over the 5 rows: 0.001 x 5 = 0.005; 0.02 x 4 = 0.08."""
    rows = [
        ("aggregate", 4, "silhouette_best", 2.0, 0.02),
        ("aggregate", 3, "sweep", 1.0, 0.001),
        ("temporal", 3, "silhouette_best", 0.5, 0.02),
        ("temporal", 4, "sweep", 5.0, 0.02),
        ("dtw", 3, "silhouette_best", 0.0, 1.0),
    ]
    schema = ["method", "k", "k_rule", "eg_diff_pct_median", "eg_diff_sign_p_value"]
    return with_holm(pl.DataFrame(rows, schema=schema, orient="row").with_columns(source=pl.lit("s")))


def _labels(workloads: list[str]) -> pl.DataFrame:
    frames = []
    for method, k in [("aggregate", 3), ("aggregate", 4), ("temporal", 3), ("temporal", 4), ("dtw", 3)]:
        labels = (np.arange(len(workloads)) * (k + len(method))) % k  # a different partition per mapping
        frames.append(
            pl.DataFrame(
                {
                    "source": "s",
                    "workload_id": workloads,
                    "method": method,
                    "k": k,
                    "ec_label": labels,
                    "is_medoid": False,
                },
                schema=EC_SWEEP_LABELS,
            )
        )
    return pl.concat(frames)


def test_each_method_gets_the_mapping_its_own_rows_would_choose():
    workloads = ["w3", "w1", "w2", "w0", "w4"]  # the series order, not sorted
    comparison, labels = _comparison(), _labels(workloads)
    per_method, picks = _method_assignments(
        comparison, labels, ("aggregate", "temporal", "dtw"), np.array(workloads)
    )
    got = per_method.group_by("method", "k", maintain_order=True).len().rows()
    assert got == [("aggregate", 3, 5), ("temporal", 3, 5), ("dtw", 3, 5)]
    assert picks == {
        "aggregate": "k=3 (significant)",  # passes Holm although k=4 has the larger median gain
        "temporal": "k=3 (silhouette_best: no row passes)",  # not its largest-median row
        "dtw": "k=3 (silhouette_best: no row passes)",
    }
    assert per_method["workload_id"].to_list()[:5] == workloads
    # the mapping chosen over all methods is the chosen method's own pick: its rows are ec__assignments
    choice = choose_mapping(comparison)
    assert (choice.method, choice.k) == ("aggregate", 3)
    nothing = with_holm(comparison.with_columns(eg_diff_sign_p_value=pl.lit(0.5)))
    assert choose_mapping(nothing).method is None
    fallback, _ = _method_assignments(nothing, labels, ("aggregate", "dtw"), np.array(workloads))
    assert fallback.group_by("method", "k", maintain_order=True).len().rows() == [
        ("aggregate", 4, 5),
        ("dtw", 3, 5),
    ]
    chosen = labels.filter((pl.col("method") == "aggregate") & (pl.col("k") == 3)).drop("is_medoid")
    assert per_method.filter(pl.col("method") == "aggregate").equals(chosen)
    with pytest.raises(ValueError, match="not the 4 usable long-running ones"):
        _method_assignments(comparison, labels, ("aggregate",), np.array(workloads[:4]))


def test_stored_gain_rows_come_back_in_table_order_and_stale_ones_are_named():
    comparison = _comparison()
    rules = {
        ("temporal", 3): "a",
        ("dtw", 3): "a",
        ("aggregate", 4): "a",
        ("aggregate", 3): "a",
        ("temporal", 4): "a",
    }
    rows = _gathered_rows(comparison.reverse(), "s", rules)
    assert [tuple(r) for r in rows.select("method", "k").iter_rows()] == list(rules)
    with pytest.raises(ValueError, match=r"mappings \[\('dtw', 4\)\] missing"):
        _gathered_rows(comparison, "s", {**rules, ("dtw", 4): "common"})


def test_no_mapping_chosen_passes_the_checks_with_empty_labels():
    from assets.ec import _chosen_check, _coverage_check
    from pipelines.equivalence import EC_ASSIGNMENTS
    from pipelines.features import series_from_arrays

    comparison = with_holm(_comparison().with_columns(eg_diff_sign_p_value=pl.lit(0.5)))
    choice = choose_mapping(comparison)
    assert choice.method is None and choice.basis == "none"
    table = comparison.with_columns(is_chosen=pl.lit(False))
    assert _chosen_check(table, choice)[0]
    series = series_from_arrays(["w0", "w1"], np.zeros((2, 2, 4)))
    kept = pl.DataFrame({"workload_id": ["w0", "w1"]})
    ok, meta = _coverage_check(pl.DataFrame(schema=EC_ASSIGNMENTS), series, kept, choice)
    assert ok and meta["n_labelled"] == 0 and "no mapping chosen" in meta["note"].value
