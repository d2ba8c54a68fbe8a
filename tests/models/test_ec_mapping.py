"""The EC mapping of a source from its fanned-out steps: settings, table order, stored rows gathered, the choice,
each method's own mapping, the checks' computations and the comparison's Markdown."""

import numpy as np
import polars as pl
import pytest

from models.ec_mapping import (
    METHOD_COMPARISON,
    EcRunSettings,
    assignments_and_profiles,
    choice_summary,
    chosen_check,
    comparison_and_choice,
    coverage_check,
    gathered_rows,
    k_rules,
    labels_of,
    medoids_of,
    method_assignments,
    method_assignments_check,
    rules_of,
    silhouette_check,
    table_markdown,
    unreachable_choice,
)
from models.forecaster import ForecasterConfig, paper_scale
from models.prediction_gain import GainConfig, choose_mapping, with_holm
from pipelines.equivalence import EC_ASSIGNMENTS, EC_SILHOUETTE, EC_SWEEP_LABELS, DtwConfig, EcConfig
from pipelines.features import series_from_arrays

# --- settings -------------------------------------------------------------------------------------------------


def test_the_forecaster_is_the_preset_with_the_settings_that_differ_from_the_defaults():
    assert EcRunSettings().forecaster() == ForecasterConfig()
    assert EcRunSettings(forecaster_preset="paper").forecaster() == paper_scale()
    small = EcRunSettings(gain=GainConfig(forecaster=ForecasterConfig(window=12, epochs=1)))
    assert small.forecaster() == ForecasterConfig(window=12, epochs=1)
    paper = EcRunSettings(
        forecaster_preset="paper", gain=GainConfig(forecaster=ForecasterConfig(window=48, seed=3))
    ).forecaster()
    assert (paper.window, paper.ar_window, paper.seed, paper.conv_channels, paper.epochs) == (
        48,
        24,
        3,
        100,
        100,
    )
    gain = EcRunSettings(gain=GainConfig(n_seeds=8, forecaster=ForecasterConfig(epochs=1))).gain_config()
    assert gain.n_seeds == 8 and gain.forecaster.epochs == 1


def test_unknown_preset_and_disagreeing_training_parts_are_refused():
    with pytest.raises(ValueError, match="forecaster_preset"):
        EcRunSettings(forecaster_preset="huge")
    with pytest.raises(ValueError, match=r"ec.train_frac \(0.5\) and gain.train_frac \(0.7\)"):
        EcRunSettings(ec=EcConfig(train_frac=0.5))
    both = EcRunSettings(ec=EcConfig(train_frac=0.5), gain=GainConfig(train_frac=0.5))
    assert both.gain_config().train_frac == 0.5


# --- table order and stored rows ------------------------------------------------------------------------------


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


def test_rules_of_gathered_silhouettes_skip_the_skipped_k_and_follow_the_configured_order():
    rows = [
        ("s", "dtw", 3, 0.2, False),
        ("s", "dtw", 4, 0.5, False),
        ("s", "aggregate", 3, 0.7, False),
        ("s", "aggregate", 4, None, True),
    ]
    sil = pl.DataFrame(rows, schema=["source", "method", "k", "silhouette", "is_skipped"], orient="row")
    assert list(rules_of(sil, ("aggregate", "dtw")).items()) == [
        (("aggregate", 3), "silhouette_best"),
        (("dtw", 3), "sweep"),
        (("dtw", 4), "silhouette_best"),
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
                    "is_medoid": method == "dtw" and False,
                },
                schema=EC_SWEEP_LABELS,
            )
        )
    return pl.concat(frames)


def test_stored_gain_rows_come_back_in_table_order_and_stale_ones_are_named():
    comparison = _comparison()
    rules = {
        ("temporal", 3): "a",
        ("dtw", 3): "a",
        ("aggregate", 4): "a",
        ("aggregate", 3): "a",
        ("temporal", 4): "a",
    }
    rows = gathered_rows(comparison.reverse(), "s", rules)
    assert [tuple(r) for r in rows.select("method", "k").iter_rows()] == list(rules)
    with pytest.raises(ValueError, match=r"mappings \[\('dtw', 4\)\] missing"):
        gathered_rows(comparison, "s", {**rules, ("dtw", 4): "common"})


def test_stored_labels_must_be_the_series_workloads_in_order_and_medoids_come_in_label_order():
    labels = _labels(["w1", "w0", "w2"])
    assert labels_of(labels, "dtw", 3, np.array(["w1", "w0", "w2"]))["workload_id"].to_list() == [
        "w1",
        "w0",
        "w2",
    ]
    with pytest.raises(ValueError, match="re-run ec_sweep_job"):
        labels_of(labels, "dtw", 3, np.array(["w0", "w1", "w2"]))
    rows = pl.DataFrame({"ec_label": [1, 0, 1, 0], "is_medoid": [True, False, False, True]})
    assert medoids_of(rows).tolist() == [3, 0]  # EC 0's medoid is workload 3, EC 1's workload 0
    assert medoids_of(rows.with_columns(is_medoid=pl.lit(False))) is None


# --- the choice -----------------------------------------------------------------------------------------------


def _gain_rows() -> pl.DataFrame:
    base = {c: None for c in METHOD_COMPARISON}
    rows = []
    for method, k, rule, median, p in [
        ("temporal", 3, "silhouette_best", 1.0, 0.001),
        ("temporal", 4, "sweep", 3.0, 0.004),
        ("dtw", 3, "silhouette_best", 4.0, 0.2),
    ]:
        rows.append(
            {**base, "source": "s", "method": method, "k": k, "k_rule": rule}
            | {"eg_diff_pct_median": median, "eg_diff_sign_p_value": p, "ari_time_halves": 0.5}
        )
    keep = [c for c in METHOD_COMPARISON if c not in ("eg_diff_sign_p_holm", "beats_control")][:-3]
    return pl.DataFrame(rows, schema={c: METHOD_COMPARISON[c] for c in keep})


def test_the_comparison_marks_the_largest_median_among_the_rows_that_pass_holm():
    rules = {("temporal", 3): "silhouette_best", ("temporal", 4): "sweep", ("dtw", 3): "silhouette_best"}
    comparison, choice = comparison_and_choice(_gain_rows().reverse(), "s", rules, 0.05)
    assert list(comparison.columns) == list(METHOD_COMPARISON)
    assert [tuple(r) for r in comparison.select("method", "k").iter_rows()] == list(rules)
    # Holm over 3 rows: 0.001 x 3, 0.004 x 2, 0.2; dtw's larger median does not pass
    assert comparison["eg_diff_sign_p_holm"].to_list() == pytest.approx([0.003, 0.008, 0.2])
    assert (choice.method, choice.k, choice.basis) == ("temporal", 4, "significant")
    assert comparison["is_chosen"].to_list() == [False, True, False]
    assert set(comparison["choice_basis"]) == {"significant"} and chosen_check(comparison, choice)[0]
    summary = choice_summary(comparison, choice, n_seeds=8)
    assert summary["chosen"] == "temporal, k=4" and summary["n_rows_passing_holm"] == 2
    assert summary["smallest_reachable_holm_p"] == pytest.approx(3 / 256)
    none, nothing = comparison_and_choice(_gain_rows(), "s", rules, 0.001)
    assert nothing.method is None and not none["is_chosen"].any() and chosen_check(none, nothing)[0]


def test_a_choice_is_unreachable_when_holm_over_the_rows_cannot_get_below_alpha():
    assert unreachable_choice(9, GainConfig(n_seeds=8)) is None  # 9/256 < 0.05
    note = unreachable_choice(39, GainConfig(n_seeds=8))
    assert note.startswith("39 rows with forecaster_seeds=8") and "0.152 >= alpha 0.05" in note


def test_each_method_gets_the_mapping_its_own_rows_would_choose():
    workloads = ["w3", "w1", "w2", "w0", "w4"]  # the series order, not sorted
    comparison, labels = _comparison(), _labels(workloads)
    per_method, picks = method_assignments(
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
    fallback, _ = method_assignments(nothing, labels, ("aggregate", "dtw"), np.array(workloads))
    assert fallback.group_by("method", "k", maintain_order=True).len().rows() == [
        ("aggregate", 4, 5),
        ("dtw", 3, 5),
    ]
    chosen = labels.filter((pl.col("method") == "aggregate") & (pl.col("k") == 3)).drop("is_medoid")
    assert per_method.filter(pl.col("method") == "aggregate").equals(chosen)
    assert method_assignments_check(per_method, chosen, choice) == (
        True,
        {"n_mappings": 3, "is_one_mapping_per_method": True, "is_chosen_equal_to_ec_assignments": True},
    )
    assert not method_assignments_check(per_method, chosen.head(2), choice)[0]
    with pytest.raises(ValueError, match="not the 4 usable long-running ones"):
        method_assignments(comparison, labels, ("aggregate",), np.array(workloads[:4]))


def test_the_chosen_labels_and_profiles_follow_the_series_and_nothing_chosen_gives_empty_tables():
    workloads = ["w1", "w0", "w2", "w3", "w4"]
    t = np.arange(6, dtype=float)
    values = np.array([[t * (i + 1) / 100, t * 0 + i / 10] for i in range(5)])
    series = series_from_arrays(workloads, values)
    comparison, labels = _comparison(), _labels(workloads)
    is_chosen = (pl.col("method") == "aggregate") & (pl.col("k") == 3)
    labels = labels.with_columns(
        ec_label=pl.when(is_chosen).then(pl.int_range(pl.len()) % 3).otherwise("ec_label")
    )
    choice = choose_mapping(comparison)
    assignments, profiles = assignments_and_profiles(labels, choice, series, "s")
    assert list(assignments.columns) == list(EC_ASSIGNMENTS)
    assert assignments["workload_id"].to_list() == workloads
    members = assignments.filter(pl.col("ec_label") == 0)["workload_id"].to_list()
    ec0 = profiles.filter(pl.col("ec_label") == 0).sort("step")
    idx = [workloads.index(w) for w in members]
    assert ec0["cpu_frac"].to_numpy() == pytest.approx(values[idx, 0].mean(axis=0))
    assert ec0["n_members"][0] == len(members) and set(profiles["ec_label"]) == {0, 1, 2}
    nothing = choose_mapping(with_holm(comparison.with_columns(eg_diff_sign_p_value=pl.lit(0.5))))
    empty, no_profiles = assignments_and_profiles(labels, nothing, series, "s")
    assert empty.is_empty() and no_profiles.is_empty()


# --- checks ---------------------------------------------------------------------------------------------------


def test_the_silhouette_check_names_missing_and_duplicate_rows():
    cfg = EcConfig(k_min=3, k_max=4, methods=("aggregate", "dtw"), dtw=DtwConfig())
    rows = [("s", m, k) for m in ("aggregate", "dtw") for k in (3, 4)]
    sil = pl.DataFrame(rows, schema=["source", "method", "k"], orient="row")
    assert silhouette_check(sil, cfg) == (True, {"n_rows": 4, "missing": "[]", "n_duplicates": 0})
    ok, meta = silhouette_check(pl.concat([sil.head(3), sil.head(1)]), cfg)
    assert not ok and meta["missing"] == "[('dtw', 4)]" and meta["n_duplicates"] == 1
    assert list(EC_SILHOUETTE)[:3] == ["source", "method", "k"]


def test_no_mapping_chosen_passes_the_checks_with_empty_labels():
    comparison = with_holm(_comparison().with_columns(eg_diff_sign_p_value=pl.lit(0.5)))
    choice = choose_mapping(comparison)
    assert choice.method is None and choice.basis == "none"
    table = comparison.with_columns(is_chosen=pl.lit(False))
    assert chosen_check(table, choice)[0]
    series = series_from_arrays(["w0", "w1"], np.zeros((2, 2, 4)))
    kept = pl.DataFrame({"workload_id": ["w0", "w1"]})
    ok, meta = coverage_check(pl.DataFrame(schema=EC_ASSIGNMENTS), series, kept, choice)
    assert ok and meta["n_labelled"] == 0 and "no mapping chosen" in meta["note"]


def test_coverage_fails_for_a_workload_labelled_twice_or_not_at_all():
    choice = choose_mapping(_comparison())
    series = series_from_arrays(["w0", "w1"], np.zeros((2, 2, 4)))
    kept = pl.DataFrame({"workload_id": ["w0", "w1"]})
    row = {"source": "s", "method": "aggregate", "k": 3, "ec_label": 0}
    one = pl.DataFrame([{**row, "workload_id": "w0"}], schema=EC_ASSIGNMENTS)
    both = pl.DataFrame([{**row, "workload_id": w} for w in ("w0", "w1")], schema=EC_ASSIGNMENTS)
    assert coverage_check(both, series, kept, choice)[0]
    assert not coverage_check(one, series, kept, choice)[0]
    assert not coverage_check(pl.concat([both, one]), series, kept, choice)[0]


# --- Markdown -------------------------------------------------------------------------------------------------


def test_the_markdown_shows_the_paired_test():
    row = {c: None for c in METHOD_COMPARISON}
    row.update(
        method="dtw",
        k=3,
        k_rule="silhouette_best",
        eg_pct=5.0,
        eg_pct_ci_low=-1.0,
        eg_pct_ci_high=11.0,
        f_frac=0.5,
        f_frac_ci_low=0.2,
        f_frac_ci_high=0.8,
        control_eg_pct=1.0,
        control_eg_pct_ci_low=-2.0,
        control_eg_pct_ci_high=4.0,
        eg_diff_pct=4.0,
        eg_diff_pct_ci_low=1.5,
        eg_diff_pct_ci_high=6.5,
        eg_diff_p_value=0.004,
        eg_diff_pct_median=3.0,
        eg_diff_pct_median_ci_low=0.5,
        eg_diff_pct_median_ci_high=7.0,
        n_seeds_diff_positive=9,
        n_seeds_diff_negative=1,
        n_seeds=10,
        eg_diff_sign_p_value=0.0107,
        eg_diff_sign_p_holm=0.032,
        beats_control=True,
        ari_time_halves=0.61,
        ari_time_halves_shuffled_95=0.08,
        is_chosen=True,
    )
    md = table_markdown(pl.DataFrame([row], schema=METHOD_COMPARISON))
    assert "paired EG - control" in md.splitlines()[0] and "Holm p" in md.splitlines()[0]
    assert "| 4.00 (1.50, 6.50), 0.004 | 3.00 (0.50, 7.00), +9 -1 of 10 | 0.0107, 0.032 | True |" in md
    assert "| 0.61 (0.08) | True |" in md
