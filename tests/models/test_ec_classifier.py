from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch

from models.ec_classifier import (
    META_COLUMNS,
    ClassifierConfig,
    ClassifierRunSettings,
    EcClassifier,
    accuracy_and_model,
    classifier_accuracy_table,
    evaluate,
    load_classifier,
    read_card,
    resampled_interval,
    split_by_group,
    split_train_test,
    too_few_labelled,
    train_classifier,
    usage_prefixes,
    workload_groups,
)
from pipelines.features import series_from_arrays

FAST = ClassifierConfig(prefix_bins=6, hidden_sizes=(16, 8), epochs=60, batch_size=32, lr=1e-2)


def _separable(n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """3 ECs, unbalanced (50/30/20 %): EC = level of cpu usage; meta cpu request weakly tied to the EC."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    meta = np.stack(
        [
            0.1 + 0.05 * labels + rng.normal(0, 0.05, n),
            rng.uniform(0, 0.3, n),
            rng.integers(0, 12, n),
            rng.integers(0, 4, n),
        ],
        axis=1,
    ).astype(np.float64)
    meta[rng.random(meta.shape) < 0.1] = np.nan  # missing meta values get imputed
    series = [
        np.stack([np.full(40, 0.1 + 0.2 * lab), np.full(40, 0.2)]) + rng.normal(0, 0.02, (2, 40))
        for lab in labels
    ]
    return meta, series, labels


def test_beats_both_constant_baselines_over_repeated_splits_with_intervals():
    meta, series, labels = _separable(90, seed=0)
    table = classifier_accuracy_table(meta, series, labels, (0, 6), replace(FAST, n_splits=4))
    assert table["prefix_bins"].to_list() == [0, 6] and table["n_splits"].to_list() == [4, 4]
    assert table["n_train"].to_list() == [63, 63] and table["n_test"].to_list() == [27, 27]
    assert table["split"][0].startswith("4 seeded splits by workload")
    with_prefix = table.row(1, named=True)
    assert with_prefix["accuracy_ci_low"] <= with_prefix["accuracy"] <= with_prefix["accuracy_ci_high"]
    assert with_prefix["accuracy_ci_low"] >= 0.85
    assert with_prefix["accuracy_ci_low"] > with_prefix["best_constant_accuracy_ci_high"]
    # the best constant guess of each test split is at least the training majority's accuracy there
    assert with_prefix["best_constant_accuracy"] >= with_prefix["majority_accuracy"]
    assert with_prefix["macro_f1"] >= 0.85


def test_resampled_interval_is_wider_than_the_plain_t_interval():
    scores = [0.5, 0.6, 0.55, 0.45, 0.52]
    m, lo, hi = resampled_interval(scores, n_train=70, n_test=30)
    s = np.std(scores, ddof=1)
    # t(0.975, 4) = 2.776; variance factor 1/5 + 30/70
    assert m == pytest.approx(0.524)
    assert hi - m == pytest.approx(2.7764451 * np.sqrt(0.2 + 30 / 70) * s, rel=1e-6)
    assert hi - m > 2.7764451 * s / np.sqrt(5)
    assert resampled_interval([0.7], 70, 30) == (0.7, 0.7, 0.7)


def test_save_load_round_trip_gives_identical_predictions(tmp_path):
    meta, series, labels = _separable(40, seed=1)
    prefixes = usage_prefixes(series, 6)
    clf = train_classifier(meta, prefixes, labels + 10, FAST)  # arbitrary label values survive
    path = tmp_path / "ec_classifier.pt"
    clf.save(path, card={"accuracy": 0.9, "n_splits": 10})
    loaded = load_classifier(path)
    assert read_card(path) == {"accuracy": 0.9, "n_splits": 10}
    assert isinstance(loaded.model, EcClassifier) and loaded.cfg == clf.cfg
    np.testing.assert_array_equal(loaded.predict(meta, prefixes), clf.predict(meta, prefixes))
    np.testing.assert_array_equal(loaded.predict_proba(meta, None), clf.predict_proba(meta, None))
    assert set(loaded.predict(meta, prefixes)) <= {10, 11, 12}
    assert evaluate(loaded, meta, prefixes, labels + 10) == evaluate(clf, meta, prefixes, labels + 10)


def test_short_or_missing_prefix_is_zero_padded():
    meta, series, labels = _separable(30, seed=2)
    clf = train_classifier(meta, usage_prefixes(series, 6), labels, FAST)
    none = clf.features(meta[:3], None).numpy()
    short = clf.features(meta[:3], usage_prefixes(series[:3], 2)).numpy()
    # the prefix part (after 4 meta + 4 is_missing columns) is 0 where bins are missing
    assert (none[:, 8:] == 0).all()
    assert (short[:, 8 + 2 : 8 + 6] == 0).all() and (short[:, 8 + 6 + 2 :] == 0).all()
    assert not (short[:, 8:10] == 0).all()
    assert clf.predict(meta[:3]).shape == (3,)


def test_same_seed_same_model():
    meta, series, labels = _separable(30, seed=3)
    a = train_classifier(meta, usage_prefixes(series, 6), labels, FAST)
    b = train_classifier(meta, usage_prefixes(series, 6), labels, FAST)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_split_is_stratified_and_seeded():
    labels = np.array([0] * 10 + [1] * 10)
    tr, te = split_train_test(labels, 0.3, seed=0)
    assert len(te) == 6 and (labels[te] == 0).sum() == 3
    assert np.array_equal(te, split_train_test(labels, 0.3, seed=0)[1])
    assert set(tr) | set(te) == set(range(20)) and not set(tr) & set(te)


def test_bad_inputs_name_the_problem():
    meta = np.zeros((6, 4))
    with pytest.raises(ValueError, match="1 class"):
        train_classifier(meta, None, np.zeros(6, int), ClassifierConfig(prefix_bins=0))
    with pytest.raises(ValueError, match="1 class"):
        split_train_test(np.zeros(6, int), 0.3, 0)
    with pytest.raises(ValueError, match="too few workloads to split: 2 workloads"):
        split_train_test(np.array([0, 1]), 0.3, 0)
    with pytest.raises(ValueError, match="usage prefix of 6 bins"):
        train_classifier(meta, None, np.array([0, 1] * 3), ClassifierConfig(prefix_bins=6))
    with pytest.raises(ValueError, match="labels has shape"):
        train_classifier(meta, None, np.array([0, 1]), ClassifierConfig(prefix_bins=0))
    with pytest.raises(ValueError, match=r"meta must have shape \(n, 4\)"):
        train_classifier(meta, None, np.array([0, 1] * 3), ClassifierConfig(prefix_bins=0)).predict(
            np.zeros((2, 3))
        )


def test_split_by_group_keeps_every_group_on_one_side():
    meta, series, labels = _separable(60, seed=1)
    groups = np.array([f"job{i // 3}" for i in range(60)])  # 3 days per job
    tr, te = split_by_group(labels, groups, 0.3, seed=0)
    assert not set(groups[tr]) & set(groups[te])
    assert set(tr) | set(te) == set(range(60)) and len(set(groups[te])) == 6  # 30 % of 20 jobs
    assert np.array_equal(te, split_by_group(labels, groups, 0.3, seed=0)[1])
    table = classifier_accuracy_table(meta, series, labels, (0,), replace(FAST, n_splits=2), groups=groups)
    assert table["n_groups_test"].to_list() == [6] and table["n_test"].to_list() == [18]
    assert table["split"][0].startswith("2 seeded splits by workload group")
    with pytest.raises(ValueError, match="differ in shape"):
        split_by_group(labels, groups[:5], 0.3, 0)


def test_workload_groups_are_the_patterns_first_group_or_the_id():
    pattern = ClassifierRunSettings().group_pattern
    groups = workload_groups(["job1_d0", "job1_d3", "job2_d1", "vm7", "x_dd"], pattern)
    assert groups.tolist() == ["job1", "job1", "job2", "vm7", "x_dd"]


def test_too_few_labelled_workloads_train_no_classifier():
    settings = ClassifierRunSettings(min_per_class=3)
    three_each = pl.DataFrame({"ec_label": [0, 0, 0, 1, 1, 1]})
    assert too_few_labelled(three_each, settings) is None
    assert "fewer than 2 ECs or than 3 per EC" in too_few_labelled(three_each.head(5), settings)
    assert too_few_labelled(pl.DataFrame({"ec_label": [0] * 9}), settings).startswith(
        "9 labelled workloads in 1 EC"
    )


def test_the_run_measures_every_prefix_and_saves_the_model_of_its_prefix_bins_with_a_card():
    meta, series, labels = _separable(48, seed=2)
    ids = [f"job{i // 2}_d{i % 2}" for i in range(48)]
    labelled = pl.DataFrame(
        {"workload_id": ids, "ec_label": labels, **{c: meta[:, j] for j, c in enumerate(META_COLUMNS)}}
    )
    settings = ClassifierRunSettings(classifier=replace(FAST, n_splits=2), prefix_lengths=(0, 6))
    # the series in another order, with one workload more: the run follows the ids
    order = list(range(48))[::-1]
    every = series_from_arrays(
        [*(ids[i] for i in order), "extra"], np.stack([*(series[i] for i in order), series[0]])
    )
    run = accuracy_and_model(labelled, every, settings, "syn")
    assert run.table["prefix_bins"].to_list() == [0, 6] and run.table["split"][0].startswith(
        "2 seeded splits by"
    )
    assert (run.n_labelled, run.n_groups, run.model.cfg.prefix_bins) == (48, 24, 6)
    assert run.card["trained_on"] == "all 48 labelled workloads (24 groups) of syn"
    assert [r["prefix_bins"] for r in run.card["accuracy_by_prefix_bins"]] == [0, 6]
    assert (run.model.predict(meta, usage_prefixes(series, 6)) == labels).mean() > 0.9
