import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from models.forecaster import ForecasterConfig
from models.prediction_gain import (
    GainConfig,
    choose_mapping,
    control_labels,
    effective_gain,
    gain_pct,
    gaining_fraction,
    holm_adjust,
    mapping_gain_table,
    mean_interval,
    median_interval,
    min_holm_p,
    paired_difference,
    paired_sign_summary,
    pearson,
    prediction_gain,
    sign_test_p,
    with_holm,
)

FAST = GainConfig(
    forecaster=ForecasterConfig(
        window=12, kernel_size=3, conv_channels=8, hidden_size=8, ar_window=4, min_steps=100
    )
)


def test_eg_and_f_hand_case():
    # EG = (10*2 + 0*3 + 20*5) / 10 = 12; f = (2 + 5) / 10
    assert effective_gain([10.0, -5.0, 20.0], [2, 3, 5]) == pytest.approx(12.0)
    assert gaining_fraction([10.0, -5.0, 20.0], [2, 3, 5]) == pytest.approx(0.7)
    assert effective_gain([float("nan"), 50.0], [3, 1]) == pytest.approx(12.5)
    assert gaining_fraction([0.0, 50.0], [3, 1]) == pytest.approx(0.25)


def test_gain_pct_and_pearson():
    assert gain_pct(0.6, 0.5) == pytest.approx(20.0)
    assert gain_pct(-0.3, -0.6) == pytest.approx(50.0)  # relative to |corr_global|
    assert math.isnan(gain_pct(0.6, 0.0))
    assert pearson(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0])) == pytest.approx(1.0)
    assert pearson(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert math.isnan(pearson(np.array([1.0, 1.0]), np.array([1.0, 2.0])))


def _row(method, k, median, p, stability=0.5, eg=1.0):
    return {
        "method": method,
        "k": k,
        "eg_pct": eg,
        "eg_diff_pct_median": median,
        "eg_diff_sign_p_value": p,
        "ari_time_halves": stability,
    }


def test_holm_by_hand():
    # sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06, monotone)
    p = [0.03, 0.01, 0.04, 0.02]
    assert holm_adjust(p) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjust([float("nan"), 0.01]) == pytest.approx([1.0, 0.02])  # NaN counts as 1
    assert min_holm_p(10, 39) == pytest.approx(39 / 1024) and min_holm_p(6, 39) == pytest.approx(39 / 64)
    assert min_holm_p(4, 39) == 1.0


def test_choice_is_the_largest_median_gain_among_rows_passing_holm_then_stability_then_smaller_k():
    rows = [
        _row("aggregate", 5, 9.0, 0.02, eg=400.0),  # largest EG and median, but Holm: 0.02 x 3 = 0.06
        _row("temporal", 6, 4.0, 1 / 1024),
        _row("dtw", 3, 4.0, 1 / 1024, stability=0.9),  # same median: the more stable one
        _row("dtw", 4, 4.0, 1 / 1024, stability=0.9),  # same median and stability: the smaller k wins
        _row("dtw", 5, 2.0, 1 / 1024),
        _row("temporal", 3, 1.0, 0.5),
        _row("temporal", 4, 1.0, 0.5),
    ]
    c = choose_mapping(rows)
    assert (c.method, c.k, c.basis) == ("dtw", 3, "significant")
    assert "Holm-adjusted" in c.reason
    table = with_holm(pl.DataFrame(rows))
    assert table["beats_control"].to_list() == [False, True, True, True, True, False, False]
    assert table["eg_diff_sign_p_holm"][0] == pytest.approx(0.06)
    with pytest.raises(ValueError, match="no mappings"):
        choose_mapping([])


def test_no_row_passing_holm_chooses_nothing():
    rows = [_row("aggregate", 3, 20.0, 0.011), _row("temporal", 3, 5.0, 0.011), _row("dtw", 3, -1.0, 0.001)]
    c = choose_mapping(rows)  # Holm 0.011 x 2 = 0.022 passes; the dtw row passes Holm but loses to chance
    assert (c.method, c.k) == ("aggregate", 3)
    more = [_row("dtw", k, 1.0, 0.5) for k in (4, 5, 6)]
    c = choose_mapping(rows + more)  # six rows: 0.011 x 5 = 0.055, nothing passes but the losing dtw row
    assert (c.method, c.k, c.basis) == (None, None, "none")
    assert "no mapping chosen" in c.reason and "dtw k=3" in c.reason


def test_one_outlier_seed_with_a_huge_eg_does_not_flip_the_choice():
    """Heavy-tailed EG: in one seed the EC-agnostic model tracks mapping B's ECs poorly and B's EG explodes.
    Ranked by the mean EG B would win; by the median paired gain A stays chosen (both pass Holm)."""
    control = [2.0] * 10
    a = [14.0, 15.0, 16.0, 15.5, 14.5, 16.5, 15.2, 14.8, 15.9, 16.1]
    b = [9.0, 8.5, 9.5, 10.0, 8.8, 9.2, 1193.0, 9.1, 8.9, 9.4]
    rows = []
    for method, eg in (("temporal", a), ("dtw", b)):
        med, _, _, _, _, p = paired_sign_summary(eg, control)
        rows.append({**_row(method, 7, med, p), "eg_pct": float(np.mean(eg))})
    assert rows[1]["eg_pct"] > 5 * rows[0]["eg_pct"]
    c = choose_mapping(rows)
    assert (c.method, c.k) == ("temporal", 7)


def test_mean_interval_and_control_labels():
    m, lo, hi = mean_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302652729749464 / np.sqrt(3))  # t(0.975, 2) * sd / sqrt(n)
    assert mean_interval([4.0]) == (4.0, 4.0, 4.0)
    labels = np.array([0, 0, 0, 1, 1, 2])
    shuffled = control_labels(labels, seed=0, index=1)
    assert sorted(shuffled.tolist()) == sorted(labels.tolist())  # same class sizes
    assert np.array_equal(shuffled, control_labels(labels, seed=0, index=1))
    assert not np.array_equal(shuffled, control_labels(labels, seed=1, index=1))
    assert not np.array_equal(shuffled, control_labels(labels, seed=0, index=1, draw=1))


def test_paired_difference_removes_a_shift_shared_by_both_sides():
    # a seed-level shift (the global model's quality) moves both sides: unpaired intervals overlap, paired do not
    shift = np.array([0.0, 30.0, -20.0, 50.0, 10.0])
    mapping, control = 10.0 + shift + np.array([1.0, -1.0, 0.5, 0.0, -0.5]), 2.0 + shift
    m, lo, hi, p = paired_difference(mapping, control)
    assert m == pytest.approx(8.0)
    d = mapping - control  # 9, 7, 8.5, 8, 7.5: sd 0.7906
    half = 2.7764451051977987 * d.std(ddof=1) / np.sqrt(5)  # t(0.975, 4)
    assert (lo, hi) == pytest.approx((8.0 - half, 8.0 + half))
    assert lo > 0 and p < 1e-4
    assert mean_interval(mapping)[1] < mean_interval(control)[2]  # unpaired: the intervals overlap
    _, lo, _, p = paired_difference([1.0, -1.0, 2.0], [0.0, 0.0, 0.0])
    assert lo < 0 and 0.2 < p < 0.5
    assert paired_difference([3.0], [1.0]) == (2.0, 2.0, 2.0, pytest.approx(float("nan"), nan_ok=True))
    assert paired_difference([3.0, 3.0], [1.0, 1.0])[3] == 0.0
    with pytest.raises(ValueError, match="equal-length"):
        paired_difference([1.0, 2.0], [1.0])


def test_median_interval_and_sign_test_resist_one_wild_seed():
    # nine seeds favour the mapping by 8-23 points, one by 280: the t-interval crosses 0, the sign test does not
    d = [17.3, 10.7, 7.6, 280.2, 177.3, 9.7, 11.0, 23.4, 20.4, 8.3]
    assert mean_interval(d)[1] < 0
    # n = 10: j = 2 (P(B <= 1) = 11/1024, coverage 97.9 %; j = 3 would cover 89 %)
    assert median_interval(d) == pytest.approx((14.15, 8.3, 177.3))
    assert sign_test_p(d) == pytest.approx(1 / 1024)
    assert median_interval([-1.0] + d[1:])[1] == pytest.approx(7.6)  # one seed against: still above 0
    assert median_interval([-1.0, -2.0] + d[2:])[1] == pytest.approx(-1.0)  # two against: not
    assert median_interval(range(1, 21))[1:] == (6.0, 15.0)  # n = 20: j = 6, coverage 95.9 %
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0])[1] != median_interval([1.0] * 5)[1]  # NaN: n <= 5
    assert median_interval(range(1, 7))[1:] == (1.0, 6.0)  # n = 6: min and max, coverage 1 - 2/64
    assert sign_test_p([0.0, 0.0]) == 1.0 and sign_test_p([1.0, -1.0, 0.0]) == pytest.approx(0.75)


def test_paired_sign_summary_leaves_ties_out():
    # 10 seeds: 8 for the mapping, 1 against, 1 tie (EG 0 on both sides): 8 of 9 informative, p = 10/512
    mapping = [20.8, 1.3, 18.0, 14.7, 7.4, 6.7, 56.5, 3.0, 0.0, 7.2]
    control = [0.2, 2.0, 0.6, 1.6, 2.6, 3.4, 5.3, 0.9, 0.0, 3.0]
    med, lo, hi, n_pos, n_neg, p = paired_sign_summary(mapping, control)
    assert (n_pos, n_neg) == (8, 1) and p == pytest.approx(10 / 512)
    d = sorted(np.subtract(mapping, control)[[0, 1, 2, 3, 4, 5, 6, 7, 9]])
    assert (med, lo, hi) == pytest.approx((d[4], d[1], d[7]))  # n = 9: j = 2 (coverage 96.1 %)
    assert lo > 0
    med, lo, hi, n_pos, n_neg, p = paired_sign_summary([0.0, 0.0], [0.0, 0.0])
    assert (med, n_pos, n_neg, p) == (0.0, 0, 0, 1.0) and np.isnan(lo) and np.isnan(hi)


def _ar_workloads(phis: list[float], length: int, seed: int) -> np.ndarray:
    """AR(1) usage around 0.3: phi = +0.9 (smooth) and -0.9 (alternating) have the same spread, opposite dynamics."""
    rng = np.random.default_rng(seed)
    out = []
    for phi in phis:
        x = np.zeros((2, length))
        noise = rng.normal(0, 1, (2, length))
        for t in range(1, length):
            x[:, t] = phi * x[:, t - 1] + noise[:, t]
        out.append(0.3 + 0.02 * x)
    return np.stack(out)


def test_ecs_with_opposite_dynamics_gain_over_the_global_model():
    values = _ar_workloads([0.9] * 3 + [-0.9] * 3, length=150, seed=1)
    r = prediction_gain(values, np.array([0, 0, 0, 1, 1, 1]), FAST)
    assert r.rows["ec_label"].to_list() == [0, 1]
    assert (r.rows["gain_pct"] > 0).all(), r.rows
    assert r.f_frac == 1.0
    assert r.eg_pct == pytest.approx(effective_gain(r.rows["gain_pct"].to_list(), [3, 3]))
    assert r.rows["corr_ec"].min() > 0.5


def test_small_ecs_are_reported_not_trained():
    values = _ar_workloads([0.9, 0.9, -0.9], length=80, seed=2)
    cfg = GainConfig(
        forecaster=ForecasterConfig(
            window=8, kernel_size=3, hidden_size=4, conv_channels=4, ar_window=4, min_steps=10
        )
    )
    table = mapping_gain_table(
        values, {("temporal", 2): np.array([5, 5, 7])}, replace(cfg, n_seeds=1, n_control_draws=1)
    )
    r = prediction_gain(values, np.array([5, 5, 7]), cfg)
    assert r.rows.filter(pl.col("ec_label") == 7)["status"].to_list() == ["too_small"]
    assert r.rows.filter(pl.col("ec_label") == 7)["gain_pct"].to_list() == [0.0]
    assert r.n_ecs_too_small == 1 and r.k == 2 and r.n_workloads == 3
    assert table.row(0, named=True)["n_ecs_too_small"] == 1
    assert table["eg_pct"].to_list() == pytest.approx([r.eg_pct])  # n_seeds=1: the one draw
    assert table["eg_pct_ci_low"].to_list() == table["eg_pct"].to_list()
    raw = prediction_gain(values, np.array([5, 5, 7]), replace(cfg, correlation_space="raw"))
    assert raw.rows["n_workloads"].to_list() == [2, 1] and -1.0 <= raw.rows["corr_ec"][0] <= 1.0


def test_bad_inputs():
    values = _ar_workloads([0.5, 0.5], length=15, seed=3)
    with pytest.raises(ValueError, match="workload 0: series of 15 bins is too short"):
        prediction_gain(values, np.array([0, 1]), FAST)
    with pytest.raises(ValueError, match="labels has shape"):
        prediction_gain(_ar_workloads([0.5, 0.5], 100, 3), np.array([0, 1, 2]), FAST)
    with pytest.raises(ValueError, match="train_frac"):
        GainConfig(train_frac=1.0)
    with pytest.raises(ValueError, match="correlation_space"):
        GainConfig(correlation_space="pooled")


def test_table_over_seeds_with_a_random_control():
    values = _ar_workloads([0.9] * 4 + [-0.9] * 4, length=120, seed=4)
    cfg = replace(FAST, n_seeds=6, max_eval_bins=20, n_control_draws=1)
    labels = np.array([0] * 4 + [1] * 4)
    table = mapping_gain_table(values, {("temporal", 2): labels}, cfg, {("temporal", 2): "silhouette_best"})
    r = table.row(0, named=True)
    assert r["n_seeds"] == 6 and r["k_rule"] == "silhouette_best"
    assert r["eg_pct_ci_low"] <= r["eg_pct"] <= r["eg_pct_ci_high"]
    assert r["f_frac_ci_low"] <= r["f_frac"] <= r["f_frac_ci_high"]
    # the planted split helps in every seed, its shuffled controls much less: it beats them, paired by seed
    assert r["eg_pct"] > r["control_eg_pct"]
    assert r["eg_diff_pct"] == pytest.approx(r["eg_pct"] - r["control_eg_pct"])
    assert r["eg_diff_pct_ci_low"] <= r["eg_diff_pct"] <= r["eg_diff_pct_ci_high"]
    assert r["eg_diff_p_value"] < 0.025 and r["n_control_draws"] == 1
    assert r["n_seeds_diff_positive"] == 6 and r["n_seeds_diff_negative"] == 0
    assert r["eg_diff_sign_p_value"] == pytest.approx(1 / 64)
    assert r["eg_diff_pct_median_ci_low"] > 0 and r["eg_pct_median"] == np.median(r["eg_pct_by_seed"])
    assert len(r["eg_pct_by_seed"]) == 6 and np.mean(r["eg_pct_by_seed"]) == pytest.approx(r["eg_pct"])
    d = np.subtract(r["eg_pct_by_seed"], r["control_eg_pct_by_seed"])
    assert paired_difference(r["eg_pct_by_seed"], r["control_eg_pct_by_seed"])[:3] == pytest.approx(
        (r["eg_diff_pct"], r["eg_diff_pct_ci_low"], r["eg_diff_pct_ci_high"])
    )
    assert (d.min(), d.max()) == pytest.approx(
        (r["eg_diff_pct_median_ci_low"], r["eg_diff_pct_median_ci_high"])
    )
    lines = []
    two = mapping_gain_table(
        values,
        {("temporal", 2): labels},
        replace(cfg, n_seeds=3, n_control_draws=2),
        log=lines.append,
        label="t1",
    ).row(0, named=True)
    # same seeds: the mapping's own fits are unchanged, the controls average two shuffles
    assert two["eg_pct_by_seed"] == pytest.approx(r["eg_pct_by_seed"][:3])
    assert two["n_control_draws"] == 2 and two["control_eg_pct_by_seed"] != r["control_eg_pct_by_seed"][:3]
    assert np.isnan(two["eg_diff_pct_median_ci_low"])  # 3 seeds: no 95 % sign-test interval exists
    assert lines[0].startswith("t1: 1/3 mappings") and lines[-1].startswith("t1: 3/3 mappings")
    with pytest.raises(ValueError, match="n_control_draws"):
        GainConfig(n_control_draws=0)


@pytest.mark.slow
def test_a_table_over_some_mappings_with_their_global_control_indices_equals_those_rows_of_the_full_table():
    """One method's mappings scored alone (the EC method fan-out) give the rows of the table over every method's."""
    values = _ar_workloads([0.9] * 3 + [-0.9] * 3, length=90, seed=5)
    cfg = replace(FAST, n_seeds=2, max_eval_bins=12, n_control_draws=1)
    mappings = {
        ("aggregate", 2): np.array([0, 0, 0, 1, 1, 1]),
        ("temporal", 2): np.array([0, 1, 0, 1, 0, 1]),
        ("temporal", 3): np.array([0, 0, 1, 1, 2, 2]),
    }
    full = mapping_gain_table(values, mappings, cfg)
    position = {key: i for i, key in enumerate(mappings)}
    temporal = {key: v for key, v in mappings.items() if key[0] == "temporal"}
    part = mapping_gain_table(values, temporal, cfg, control_index=position)
    assert part.equals(full.filter(pl.col("method") == "temporal"))
    # without the global indices the controls are other shuffles: the control columns differ
    alone = mapping_gain_table(values, temporal, cfg)
    assert alone["eg_pct_by_seed"].to_list() == part["eg_pct_by_seed"].to_list()
    assert alone["control_eg_pct_by_seed"].to_list() != part["control_eg_pct_by_seed"].to_list()
    with pytest.raises(ValueError, match="no index for mapping"):
        mapping_gain_table(values, temporal, cfg, control_index={("temporal", 2): 1})
    with pytest.raises(ValueError, match="the same index"):
        mapping_gain_table(values, temporal, cfg, control_index={("temporal", 2): 1, ("temporal", 3): 1})


TINY = GainConfig(
    forecaster=ForecasterConfig(
        window=8,
        kernel_size=3,
        conv_channels=4,
        hidden_size=4,
        ar_window=4,
        min_steps=40,
        max_train_windows=256,
    ),
    n_seeds=8,  # 4 rows: the smallest Holm p is 4 / 256
    n_control_draws=5,
    max_eval_bins=24,
    min_members=4,  # a planted class split in two leaves ECs too small for their own model
)


def _table_of_sweep(values: np.ndarray) -> pl.DataFrame:
    """Every k = 2..5 of the temporal sweep of `values`, scored and Holm-corrected."""
    from pipelines.equivalence import EcConfig, sweep_methods
    from pipelines.features import series_from_arrays

    series = series_from_arrays([f"w{i}" for i in range(len(values))], values)
    sweep = sweep_methods(series, "syn", EcConfig(k_min=2, k_max=5, n_init=5, methods=("temporal",)))
    mappings = {("temporal", k): labels for k, labels in sweep.labels["temporal"].items()}
    return with_holm(mapping_gain_table(values, mappings, TINY))


def _ar2_workloads(coefs: list[tuple[float, float]], length: int, seed: int) -> np.ndarray:
    """AR(2) usage around 0.3: x_t = a1 x_{t-1} + a2 x_{t-2} + noise, one (a1, a2) per workload."""
    rng = np.random.default_rng(seed)
    out = []
    for a1, a2 in coefs:
        x = np.zeros((2, length))
        noise = rng.normal(0, 1, (2, length))
        for t in range(2, length):
            x[:, t] = a1 * x[:, t - 1] + a2 * x[:, t - 2] + noise[:, t]
        out.append(0.3 + 0.01 * x)
    return np.stack(out)


@pytest.mark.slow
def test_planted_classes_are_recovered_at_the_right_k_and_no_structure_chooses_nothing():
    # three planted predictable dynamics (smooth, alternating, oscillating with a period of about 6 bins)
    planted = _ar2_workloads([(0.9, 0.0)] * 6 + [(-0.9, 0.0)] * 6 + [(1.0, -0.9)] * 6, length=160, seed=7)
    table = _table_of_sweep(planted)
    choice = choose_mapping(table)
    row = table.filter(pl.col("k") == 3).row(0, named=True)
    assert (choice.method, choice.k) == ("temporal", 3), table
    assert row["eg_diff_sign_p_holm"] < 0.05 and row["n_control_draws"] == 5
    # one process for every workload: whatever the clustering finds, it predicts no better than chance
    flat = _ar2_workloads([(0.0, 0.0)] * 18, length=160, seed=8)
    assert choose_mapping(_table_of_sweep(flat)).method is None
