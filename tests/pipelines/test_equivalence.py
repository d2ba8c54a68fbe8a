import numpy as np
import polars as pl
import pytest

from pipelines.equivalence import (
    EC_ASSIGNMENTS,
    EC_PROFILES,
    EC_SILHOUETTE,
    EC_SWEEP_LABELS,
    DtwConfig,
    EcConfig,
    ari_across_seeds,
    assignments_frame,
    best_k,
    dtw_cross,
    dtw_matrix,
    fit_kmedoids,
    pam_swap,
    plot_gain_and_stability,
    plot_silhouette,
    prepare_dtw,
    prepare_dtw_series,
    profiles_frame,
    silhouette_from_distances,
    sweep_labels_frame,
    sweep_methods,
    time_halves,
    time_stability,
)
from pipelines.features import TemporalConfig, series_from_arrays

FAST = EcConfig(k_min=3, k_max=6, n_init=5, temporal=TemporalConfig(lags=(1, 6, 12), agg_chunk_len=12))
PLANTED = np.repeat(np.arange(4), 10)


def _planted(seed: int = 0, n_per: int = 10, length: int = 96):
    """4 well-separated shapes (sine, square, ramp up, ramp down), n_per noisy copies each, in order."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    shapes = [
        0.3 + 0.1 * np.sin(2 * np.pi * t / 24),
        0.6 + 0.2 * np.sign(np.sin(2 * np.pi * t / 48 + 0.1)),
        0.1 + 0.4 * t / length,
        0.9 - 0.4 * t / length,
    ]
    values = np.array([s + 0.01 * rng.standard_normal((2, length)) for s in shapes for _ in range(n_per)])
    return series_from_arrays([f"w{i:02d}" for i in range(len(values))], values)


def _dtw_reference(x, y):
    """Textbook full DTW (sqrt of summed squared differences on the best path)."""
    n, m = len(x), len(y)
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            acc[i, j] = (x[i - 1] - y[j - 1]) ** 2 + min(acc[i - 1, j], acc[i, j - 1], acc[i - 1, j - 1])
    return np.sqrt(acc[n, m])


def test_dtw_hand_cases_and_reference():
    full = DtwConfig()
    # a time shift costs nothing under DTW; a level shift of 1 over 3 bins costs sqrt(3) per resource
    a = np.array([[[0.0, 0.0, 1.0, 2.0]] * 2, [[0.0, 1.0, 2.0, 2.0]] * 2])
    assert dtw_matrix(a, full)[0, 1] == 0.0
    b = np.array([[[0.0, 0.0, 0.0]] * 2, [[1.0, 1.0, 1.0]] * 2])
    assert dtw_matrix(b, full)[0, 1] == pytest.approx(np.sqrt(3) / np.sqrt(3))  # divided by sqrt(length)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, 12))
    d = dtw_cross(x, x, full)
    ref = [
        [np.mean([_dtw_reference(x[i, r], x[j, r]) for r in (0, 1)]) / np.sqrt(12) for j in range(4)]
        for i in range(4)
    ]
    np.testing.assert_allclose(d, ref, rtol=1e-12)
    np.testing.assert_allclose(dtw_matrix(x, full), ref, rtol=1e-12, atol=1e-15)
    # a Sakoe-Chiba band can only make the distance larger, and radius >= length equals full DTW
    banded = dtw_cross(x, x, DtwConfig(window_frac=0.1))
    assert (banded >= d - 1e-12).all() and (banded > d + 1e-9).any()
    np.testing.assert_allclose(dtw_cross(x, x, DtwConfig(window_frac=1.0)), d)


def test_prepare_dtw_downsamples_and_znormalises_constant_to_zero():
    values = np.array([[[1.0, 3.0, 5.0, 7.0, 9.0], [2.0, 2.0, 2.0, 2.0, 2.0]]])
    out = prepare_dtw(values, DtwConfig(downsample=2))
    assert out.tolist() == [[[-1.0, 1.0], [0.0, 0.0]]]  # block means [2, 6], last bin dropped


def test_kmedoids_on_a_hand_matrix():
    x = np.array([0.0, 1.0, 2.0, 10.0, 11.0, 12.0])
    dist = np.abs(x[:, None] - x[None, :])
    medoids, labels, cost = fit_kmedoids(dist, 2, n_init=10, rng=np.random.default_rng(0))
    assert sorted(medoids.tolist()) == [1, 4]
    assert labels[:3].tolist() == [labels[0]] * 3 and labels[3:].tolist() == [labels[3]] * 3
    assert labels[0] != labels[3]
    assert cost == 4.0


def test_kmedoids_with_duplicate_points_keeps_k_clusters():
    dist = np.zeros((4, 4))
    medoids, labels, cost = fit_kmedoids(dist, 2, n_init=3, rng=np.random.default_rng(0))
    assert len(set(labels.tolist())) == 2 and cost == 0.0


@pytest.mark.parametrize("method", ["temporal", "dtw"])
def test_silhouette_picks_planted_k(method):
    series = _planted()
    sweep = sweep_methods(series, "syn", EcConfig(**{**FAST.__dict__, "methods": (method,)}))
    assert sweep.best_k == {method: 4}
    labels = sweep.labels[method][4]
    assert (labels == PLANTED).all()  # relabelled by size then first member: planted order
    assert sweep.silhouette.schema == pl.Schema(EC_SILHOUETTE)
    assert sweep.silhouette["k"].to_list() == [3, 4, 5, 6]


def test_sampled_dtw_assigns_every_workload_to_a_sampled_medoid():
    series = _planted()
    cfg = EcConfig(**{**FAST.__dict__, "methods": ("dtw",), "dtw": DtwConfig(exact_max_n=20, sample_size=16)})
    sweep = sweep_methods(series, "syn", cfg)
    sil = sweep.silhouette
    assert sil["n_silhouette_points"].to_list() == [16] * 4 and sil["n_workloads"].to_list() == [40] * 4
    assert any("sample of 16" in n for n in sweep.notes)
    for k, labels in sweep.labels["dtw"].items():
        medoids = sweep.medoids["dtw"][k]
        assert labels.shape == (40,) and labels[medoids].tolist() == list(range(k))
        # each sampled medoid is the nearest medoid of the workloads it labels
        parts = prepare_dtw(series.values[:, :, : series.training_bins(cfg.train_frac)[0]], cfg.dtw)
        d = dtw_cross(parts, parts[medoids], cfg.dtw)
        assert (d[np.arange(40), labels] <= d.min(axis=1) + 1e-12).all()


def test_too_few_workloads_skips_k_with_a_warning():
    series = series_from_arrays(["a", "b", "c", "d", "e"], _planted().values[::8])
    sweep = sweep_methods(series, "syn", FAST)
    sil = sweep.silhouette
    skipped = sil.filter(pl.col("is_skipped"))
    assert sorted(set(skipped["k"].to_list())) == [5, 6]
    assert skipped.height == 6 and skipped["silhouette"].null_count() == 6
    assert sum("k=5 skipped: n_workloads 5 <= k 5" in w for w in sweep.warnings) == 3
    assert sweep.counts["n_k_skipped"] == 6
    assert set(sweep.labels["temporal"]) == {3, 4}


def test_identical_workloads_skip_every_k_without_crashing():
    series = series_from_arrays([f"w{i}" for i in range(8)], np.full((8, 2, 30), 0.25))
    sweep = sweep_methods(series, "syn", FAST)
    assert sweep.silhouette["is_skipped"].all()
    assert all("distinct" in r for r in sweep.silhouette["skip_reason"].to_list())
    assert sweep.best_k == {"aggregate": None, "temporal": None, "dtw": None}
    assert sweep.counts["n_constant_cpu"] == 8 and sweep.counts["n_k_skipped"] == 12


def test_best_k_breaks_ties_by_smallest_k():
    sil = pl.DataFrame(
        {
            "source": ["s"] * 3,
            "method": ["m"] * 3,
            "k": [3, 4, 5],
            "silhouette": [0.5, 0.7, 0.7],
            "silhouette_sd": [0.0] * 3,
            "silhouette_kept": [0.5, 0.7, 0.7],
            "n_init": [1] * 3,
            "n_workloads": [9] * 3,
            "n_silhouette_points": [9] * 3,
            "is_skipped": [False] * 3,
            "skip_reason": [None] * 3,
        },
        schema=EC_SILHOUETTE,
    )
    assert best_k(sil) == {"m": 4}


def test_gain_and_stability_plot_is_a_png():
    comparison = pl.DataFrame(
        {
            "method": ["temporal", "temporal", "dtw"],
            "k": [3, 4, 3],
            "eg_diff_pct_median": [4.0, 1.0, -1.0],
            "eg_diff_pct_median_ci_low": [1.0, -1.0, -3.0],
            "eg_diff_pct_median_ci_high": [8.0, 3.0, 2.0],
            "beats_control": [True, False, False],
            "is_chosen": [True, False, False],
            "ari_time_halves": [0.6, 0.3, 0.1],
            "ari_time_halves_shuffled_95": [0.08, 0.07, 0.09],
        }
    )
    assert plot_gain_and_stability(comparison)[:8] == b"\x89PNG\r\n\x1a\n"


def test_frames_and_plots():
    series = _planted(n_per=5)
    sweep = sweep_methods(series, "syn", FAST)
    assign = assignments_frame(sweep, "temporal", 4)
    assert assign.schema == pl.Schema(EC_ASSIGNMENTS) and assign.height == 20
    assert assign["ec_label"].to_list() == np.repeat(np.arange(4), 5).tolist()
    prof = profiles_frame(sweep, series, "temporal", 4)
    assert prof.schema == pl.Schema(EC_PROFILES) and prof.height == 4 * 96
    # K-Means profile: members' mean series
    first = prof.filter(pl.col("ec_label") == 0).sort("step")
    np.testing.assert_allclose(first["cpu_frac"].to_numpy(), series.values[:5, 0].mean(axis=0))
    assert first["n_members"].unique().to_list() == [5]
    # DTW profile: the medoid's own series
    dtw = profiles_frame(sweep, series, "dtw", 4).filter(pl.col("ec_label") == 2).sort("step")
    medoid = sweep.medoids["dtw"][4][2]
    np.testing.assert_array_equal(dtw["mem_frac"].to_numpy(), series.values[medoid, 1])
    with pytest.raises(KeyError, match="no labels for method 'dtw', k=9"):
        assignments_frame(sweep, "dtw", 9)
    assert plot_silhouette(sweep.silhouette)[:4] == b"\x89PNG"
    # ec__sweep_labels: every k with labels in series order, DTW's medoids marked
    rows = sweep_labels_frame(sweep, "dtw")
    assert rows.schema == pl.Schema(EC_SWEEP_LABELS) and sorted(set(rows["k"])) == sorted(sweep.labels["dtw"])
    four = rows.filter(pl.col("k") == 4)
    assert four["workload_id"].to_list() == sweep.workload_ids.tolist()
    assert np.flatnonzero(four["is_medoid"].to_numpy()).tolist() == sorted(sweep.medoids["dtw"][4].tolist())
    assert not sweep_labels_frame(sweep, "temporal")["is_medoid"].any()


def test_dtw_of_different_lengths_equals_the_reference():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(7), rng.standard_normal(13)
    packed = np.zeros((2, 2, 13))
    packed[0, :, :7], packed[1] = a, b
    d = dtw_matrix(packed, DtwConfig(), np.array([7, 13]))
    assert d[0, 1] == pytest.approx(_dtw_reference(a, b) / np.sqrt(10))  # sqrt of the mean length
    # a band can only make it larger; the band around the slanted diagonal still reaches the end
    banded = dtw_matrix(packed, DtwConfig(window_frac=0.1), np.array([7, 13]))
    assert np.isfinite(banded[0, 1]) and banded[0, 1] >= d[0, 1] - 1e-12
    series = [np.vstack([a, a]), np.vstack([b, b])]
    prepared, lengths = prepare_dtw_series(series, DtwConfig(downsample=2))
    assert lengths.tolist() == [3, 6] and prepared.shape == (2, 2, 6)
    assert prepared[0, :, 3:].tolist() == [[0.0] * 3] * 2  # padding


def test_silhouette_equals_scikit_learn():
    from sklearn.metrics import silhouette_score

    rng = np.random.default_rng(1)
    x = rng.random((40, 3))
    dist = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    labels = rng.integers(0, 4, 40)
    labels[0] = 9  # a singleton scores 0
    assert silhouette_from_distances(dist, labels) == pytest.approx(
        silhouette_score(dist, labels, metric="precomputed"), abs=1e-12
    )


def test_pam_swap_reaches_a_local_optimum():
    rng = np.random.default_rng(2)
    x = rng.random((60, 2))
    dist = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    medoids, _, cost = fit_kmedoids(dist, 5, n_init=3, rng=np.random.default_rng(0))
    assert cost == pytest.approx(dist[:, medoids].min(axis=1).sum())
    for m in range(5):  # no single swap of a medoid with a non-medoid lowers the cost
        for cand in set(range(60)) - set(medoids.tolist()):
            trial = medoids.copy()
            trial[m] = cand
            assert dist[:, trial].min(axis=1).sum() >= cost - 1e-9
    # the swap phase alone from a bad start improves it
    start = np.arange(5)
    assert dist[:, pam_swap(dist, start)].min(axis=1).sum() < dist[:, start].min(axis=1).sum()


def test_clustering_never_sees_the_evaluation_window():
    """Two sample sets equal on every training part (first 70 %) and wildly different after it: every
    clustering input, label, silhouette and medoid is identical."""
    base = _planted()
    cut = base.training_bins(FAST.train_frac)[0]
    noisy = base.values.copy()
    rng = np.random.default_rng(9)
    noisy[:, :, cut:] = rng.random(noisy[:, :, cut:].shape) * 50.0  # the held-out window: garbage
    other = series_from_arrays(base.workload_ids, noisy)
    a, b = sweep_methods(base, "syn", FAST), sweep_methods(other, "syn", FAST)
    assert a.silhouette.equals(b.silhouette)
    for method in FAST.methods:
        for k in a.labels[method]:
            assert np.array_equal(a.labels[method][k], b.labels[method][k]), (method, k)
        for k in a.medoids[method]:
            assert np.array_equal(a.medoids[method][k], b.medoids[method][k])
    assert np.array_equal(a.inputs["temporal"], b.inputs["temporal"])
    assert np.array_equal(a.inputs["dtw"][0], b.inputs["dtw"][0])
    assert np.array_equal(a.inputs["dtw"][3], b.inputs["dtw"][3])  # the DTW distances
    # and the evaluation window is not empty: changing one training bin does change the inputs
    moved = base.values.copy()
    moved[0, 0, cut - 1] += 1.0
    c = sweep_methods(series_from_arrays(base.workload_ids, moved), "syn", FAST)
    assert not np.array_equal(a.inputs["aggregate"], c.inputs["aggregate"])


def test_ari_across_seeds():
    series = _planted()
    sweep = sweep_methods(series, "syn", FAST)
    for method in FAST.methods:
        assert ari_across_seeds(series, sweep, method, 4, FAST, 2) == pytest.approx([1.0, 1.0])


def _stationary(seed: int = 0, n_per: int = 8, length: int = 96) -> np.ndarray:
    """3 stationary classes (a sine at 0.3, a square wave at 0.6, AR(1) noise at 0.1), n_per noisy copies
    each: every half of a series looks like its whole."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    ar = np.zeros(length)
    for i in range(1, length):
        ar[i] = 0.8 * ar[i - 1] + rng.normal()
    shapes = [
        0.3 + 0.1 * np.sin(2 * np.pi * t / 24),
        0.6 + 0.2 * np.sign(np.sin(2 * np.pi * t / 16 + 0.1)),
        0.1 + 0.02 * ar,
    ]
    return np.array([s + 0.01 * rng.standard_normal((2, length)) for s in shapes for _ in range(n_per)])


def test_time_stability_is_one_on_a_stationary_source_and_near_zero_on_shuffled_halves():
    values = _stationary()
    series = series_from_arrays([f"w{i:02d}" for i in range(len(values))], values)
    first, second = time_halves(series)
    assert first.lengths.tolist() == [48] * 24 and np.array_equal(second.values[0], values[0, :, 48:])
    shuffled = values.copy()  # each workload's second half is another workload's: unrelated halves
    order = np.random.default_rng(1).permutation(len(values))
    shuffled[:, :, 48:] = values[order, :, 48:]
    mixed = series_from_arrays(series.workload_ids, shuffled)
    for method in FAST.methods:
        stable = time_stability(series, method, [3], FAST, n_shuffles=50).row(0, named=True)
        assert stable["ari_time_halves"] == pytest.approx(1.0), method
        assert stable["ari_time_halves_shuffled_95"] < 0.3
        unstable = time_stability(mixed, method, [3], FAST, n_shuffles=50).row(0, named=True)
        assert abs(unstable["ari_time_halves"]) < 0.2, method
    # a k a half cannot cluster is NaN, not an error
    few = series_from_arrays(["a", "b", "c"], values[:3])
    assert np.isnan(time_stability(few, "aggregate", [3], FAST)["ari_time_halves"][0])


def test_silhouette_rows_carry_mean_and_sd_over_initialisations():
    sweep = sweep_methods(_planted(), "syn", FAST)
    ok = sweep.silhouette.filter(~pl.col("is_skipped"))
    assert (ok["n_init"] == FAST.n_init).all()
    assert (ok["silhouette_sd"] >= 0).all() and ok["silhouette_sd"].null_count() == 0
    assert (ok["silhouette"] <= ok["silhouette"].max()).all()


def test_sweep_logs_progress_once_per_method_and_k_at_most():
    lines: list[str] = []
    sweep_methods(_planted(), "syn", FAST, log=lines.append)
    total = len(FAST.methods) * (FAST.k_max - FAST.k_min + 1)
    assert lines[0].startswith(f"syn EC sweep: 1/{total} (method, k)")
    assert lines[-1].startswith(f"syn EC sweep: {total}/{total} (method, k) (100 %)")
    assert len(lines) <= total
