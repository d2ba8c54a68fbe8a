import warnings

import numpy as np
import polars as pl
import pytest

from pipelines.features import (
    AGGREGATE_FEATURES,
    TemporalConfig,
    aggregate_from_values,
    aggregate_of,
    minmax_normalise,
    series_from_arrays,
    series_matrix,
    temporal_feature_names,
    temporal_features,
    temporal_features_of,
)
from pipelines.schemas import BIN_SECONDS, LONG_RUNNING, USAGE

CFG = TemporalConfig(lags=(1, 2), agg_chunk_len=2)


def _features(x: list[float], cfg: TemporalConfig = CFG) -> dict[str, float]:
    """Temporal features of one series used as both resources; the cpu half by short name."""
    values = np.array([[x, x]], dtype=float)
    names, _ = temporal_feature_names(len(x), cfg)
    row = temporal_features(values, cfg)[0]
    return {
        name.removeprefix("cpu__"): v for name, v in zip(names, row, strict=True) if name.startswith("cpu")
    }


def test_linear_trend_and_mean_abs_change_by_hand():
    f = _features([1.0, 2.0, 3.0, 4.0])
    assert f["linear_trend__slope"] == pytest.approx(1.0)
    assert f["mean"] == pytest.approx(2.5)
    assert f["mean_abs_change"] == pytest.approx(1.0)
    assert f["standard_deviation"] == pytest.approx(np.sqrt(1.25))
    g = _features([1.0, 3.0, 2.0, 6.0])
    assert g["mean_abs_change"] == pytest.approx(7.0 / 3.0)  # |2| + |-1| + |4| over 3 changes


def test_agg_linear_trend_keeps_partial_last_chunk():
    # chunk means [1.5, 3.5, 5.0] (last chunk is [5] alone) -> slope (5.0 - 1.5) / 2
    f = _features([1.0, 2.0, 3.0, 4.0, 5.0])
    assert f["agg_linear_trend__slope__chunk_len_2__mean"] == pytest.approx(1.75)


def test_autocorrelation_of_alternating_series():
    f = _features([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    assert f["autocorrelation__lag_1"] == pytest.approx(-1.0)
    assert f["autocorrelation__lag_2"] == pytest.approx(1.0)


def test_constant_series_gives_zero_not_nan():
    f = _features([0.3, 0.3, 0.3, 0.3])
    assert f["autocorrelation__lag_1"] == 0.0
    assert f["standard_deviation"] == 0.0
    assert f["linear_trend__slope"] == pytest.approx(0.0)
    s = series_from_arrays(["a"], np.full((1, 2, 4), 0.3))
    assert s.is_constant.tolist() == [[True, True]]


def test_lags_longer_than_series_are_left_out_with_a_note():
    names, notes = temporal_feature_names(10, TemporalConfig(lags=(1, 12), agg_chunk_len=12))
    assert "cpu__autocorrelation__lag_1" in names
    assert not any("lag_12" in n or "agg_linear" in n for n in names)
    assert len(notes) == 2


def test_temporal_features_equal_tsfresh():
    fc = pytest.importorskip("tsfresh.feature_extraction.feature_calculators")
    cfg = TemporalConfig(lags=(1, 12, 288), agg_chunk_len=12)
    rng = np.random.default_rng(7)
    length = 301  # not a multiple of 12: the last agg_linear_trend chunk is partial
    t = np.arange(length)
    values = 0.2 + 0.05 * np.sin(2 * np.pi * t / 288)[None, None] + 0.02 * rng.random((5, 2, length))
    names, _ = temporal_feature_names(length, cfg)
    ours = temporal_features(values, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(5):
            for r, res in enumerate(("cpu", "mem")):
                x = values[i, r]
                ref = [fc.autocorrelation(x, lag) for lag in cfg.lags]
                ref.append(dict(fc.linear_trend(x, [{"attr": "slope"}]))['attr_"slope"'])
                agg = fc.agg_linear_trend(x, [{"attr": "slope", "chunk_len": 12, "f_agg": "mean"}])
                ref.append(next(iter(agg))[1])
                ref += [fc.mean(x), fc.mean_abs_change(x), fc.standard_deviation(x)]
                cols = [j for j, n in enumerate(names) if n.startswith(res)]
                np.testing.assert_allclose(ours[i, cols], ref, rtol=1e-6, atol=1e-12)


def test_aggregate_features_by_hand():
    cpu = [0.1, 0.2, 0.0, 0.1]
    mem = [0.2, 0.2, 0.5, 0.3]
    f = dict(zip(AGGREGATE_FEATURES, aggregate_from_values(np.array([[cpu, mem]]))[0], strict=True))
    # ratio over bins with cpu > 0: [2, 1, 3]
    expected = {
        "cpu_total_frac_s": 0.4 * BIN_SECONDS,
        "cpu_mean_frac": 0.1,
        "mem_total_frac_s": 1.2 * BIN_SECONDS,
        "mem_mean_frac": 0.3,
        "duration_s": 4 * BIN_SECONDS,
        "ratio_mean": 2.0,
        "ratio_std": np.sqrt(2 / 3),
        "ratio_norm_std": np.sqrt(2 / 3) / 2,
    }
    assert f == pytest.approx(expected)


def test_minmax_normalise_constant_column_is_zero():
    out = minmax_normalise(np.array([[1.0, 5.0], [3.0, 5.0], [2.0, 5.0]]))
    assert out.tolist() == [[0.0, 0.0], [1.0, 0.0], [0.5, 0.0]]


def _tables():
    def rows(wid, start_bin, cpu, mem):
        return [
            {
                "source": "s",
                "workload_id": wid,
                "bin_start_s": (start_bin + i) * BIN_SECONDS,
                "cpu_frac": c,
                "mem_frac": m,
                "n_samples": 1,
                "is_filled": False,
            }
            for i, (c, m) in enumerate(zip(cpu, mem, strict=True))
        ]

    usage = (
        rows("a", 9, [0.9, 0.1, 0.2, 0.3, 0.4, 0.5], [0.9, 0.5, 0.4, 0.3, 0.2, 0.1])  # bin 9 outside window
        + rows("b", 20, [0.1, 0.1, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2])
        + rows("c", 0, [0.1, float("nan"), 0.1, 0.1], [0.1, 0.1, 0.1, 0.1])
        + rows("d", 0, [0.1, 0.1], [0.1, 0.1])
        + rows("d", 3, [0.1, 0.1], [0.1, 0.1])
    )
    lr = [("a", 10, 5), ("b", 20, 4), ("c", 0, 4), ("d", 0, 5), ("e", 0, 4)]
    lr_rows = [
        {c: None for c in LONG_RUNNING}
        | {"source": "s", "workload_id": w, "run_start_s": s * 300, "n_run_bins": n}
        for w, s, n in lr
    ]
    return pl.DataFrame(usage, schema=USAGE), pl.DataFrame(lr_rows, schema=LONG_RUNNING)


def test_series_matrix_keeps_whole_windows_and_counts_skips():
    usage, lr = _tables()
    s = series_matrix(usage, lr, None)
    assert s.workload_ids.tolist() == ["a", "b"]
    assert s.length == 5 and s.is_ragged
    assert s.values[0].tolist() == [[0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1]]
    assert s.values[1].tolist() == [[0.1, 0.1, 0.2, 0.2, 0.0], [0.2, 0.2, 0.2, 0.2, 0.0]]  # padded
    assert [x.shape for x in s.series_list()] == [(2, 5), (2, 4)]
    assert s.lengths.tolist() == [5, 4] and s.n_run_bins.tolist() == [5, 4]
    assert s.length_note == "whole kept window: 4..5 bins"
    assert s.is_constant.tolist() == [[False, False], [False, True]]
    assert dict(s.skipped.iter_rows()) == {
        "c": "nan_or_negative_value",
        "d": "missing_bins",
        "e": "no_usage_in_window",
    }
    # aggregates over the whole kept window: "a" has 5 bins, "b" equals the array-based definition
    assert s.aggregate[0, 4] == 5 * BIN_SECONDS
    assert s.aggregate[0, 0] == pytest.approx(1.5 * BIN_SECONDS)
    np.testing.assert_allclose(s.aggregate[1], aggregate_of(s.series_list()[1:])[0])


def test_series_matrix_configured_length_skips_short_windows():
    usage, lr = _tables()
    s = series_matrix(usage, lr, 5)
    assert s.workload_ids.tolist() == ["a"]
    assert s.values.shape == (1, 2, 5)
    assert dict(s.skipped.iter_rows())["b"] == "window_shorter_than_length"
    assert s.skipped.height == 4


def test_series_from_arrays_rejects_nan():
    values = np.zeros((2, 2, 3))
    values[1, 0, 2] = np.nan
    with pytest.raises(ValueError, match=r"index\(es\) \[1\]"):
        series_from_arrays(["a", "b"], values)


def test_series_matrix_duplicate_bins_and_several_sources():
    usage, lr = _tables()
    doubled = pl.concat([usage, usage.filter(pl.col("workload_id") == "b").head(1)])
    assert dict(series_matrix(doubled, lr, None).skipped.iter_rows())["b"] == "duplicate_bins"
    other = lr.head(1).with_columns(source=pl.lit("t"))
    with pytest.raises(ValueError, match="several sources"):
        series_matrix(usage, pl.concat([lr, other]), None)


def _usage_row(wid: str, bin_start_s: int, cpu: float | None, mem: float | None) -> dict:
    return {
        "source": "s",
        "workload_id": wid,
        "bin_start_s": bin_start_s,
        "cpu_frac": cpu,
        "mem_frac": mem,
        "n_samples": 1,
        "is_filled": False,
    }


def _all_reason_tables() -> tuple[pl.DataFrame, pl.DataFrame]:
    """`_tables` plus an off-grid bin ("f"), an empty window ("g"), a null and a negative value ("h", "i"),
    a rival source's row for "b" and unknown workload "z"; rows shuffled."""
    usage, lr = _tables()
    extra = [
        _usage_row("f", 0, 0.1, 0.1),
        _usage_row("f", 450, 0.1, 0.1),  # 1.5 bins into the window
        _usage_row("f", 600, 0.1, 0.1),
        _usage_row("g", 0, 0.1, 0.1),
        _usage_row("h", 0, 0.1, None),
        _usage_row("i", 0, 0.1, -0.5),
        _usage_row("z", 0, 0.1, 0.1),
    ]
    rival = usage.filter(pl.col("workload_id") == "b").head(1).with_columns(source=pl.lit("t"), cpu_frac=9.0)
    usage = pl.concat([usage, pl.DataFrame(extra, schema=USAGE), rival]).sample(
        fraction=1.0, shuffle=True, seed=3
    )
    more = [("f", 0, 3), ("g", 0, 0), ("h", 0, 1), ("i", 0, 1)]
    lr_more = pl.DataFrame(
        [
            {c: None for c in LONG_RUNNING}
            | {"source": "s", "workload_id": w, "run_start_s": s, "n_run_bins": n}
            for w, s, n in more
        ],
        schema=LONG_RUNNING,
    )
    return usage, pl.concat([lr_more, lr])


def test_series_matrix_reasons_for_every_bad_window():
    usage, lr = _all_reason_tables()
    s = series_matrix(usage, lr, None)
    assert s.workload_ids.tolist() == ["a", "b"]  # the rival source's row does not make "b" a duplicate
    assert s.series_list()[1].tolist() == [[0.1, 0.1, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2]]
    assert s.skipped.to_dicts() == [
        {"workload_id": w, "reason": r}
        for w, r in [
            ("c", "nan_or_negative_value"),
            ("d", "missing_bins"),
            ("e", "no_usage_in_window"),
            ("f", "bin_not_on_grid"),
            ("g", "empty_window"),
            ("h", "nan_or_negative_value"),
            ("i", "nan_or_negative_value"),
        ]
    ]


@pytest.mark.parametrize("length", [None, 4, 5])
def test_series_matrix_same_for_lazy_input_and_any_batch_size(length):
    usage, lr = _all_reason_tables()
    ref = series_matrix(usage, lr, length)
    for inp, batch_rows in [(usage, 1), (usage, 3), (usage.lazy(), 1), (usage.lazy(), 1000)]:
        s = series_matrix(inp, lr.lazy() if batch_rows == 3 else lr, length, batch_rows=batch_rows)
        assert s.workload_ids.tolist() == ref.workload_ids.tolist()
        assert s.values.dtype == np.float64 and s.values.tolist() == ref.values.tolist()
        assert s.lengths.tolist() == ref.lengths.tolist()
        np.testing.assert_allclose(s.aggregate, ref.aggregate, rtol=1e-12)  # batch sums in another order
        assert s.skipped.equals(ref.skipped)
        assert s.length_note == ref.length_note


def test_series_matrix_caps_windows_at_max_bins():
    usage, lr = _tables()
    s = series_matrix(usage, lr, None, batch_rows=2, max_bins=3)
    assert s.workload_ids.tolist() == ["a", "b"]
    assert s.values.tolist() == [[[0.1, 0.2, 0.3], [0.5, 0.4, 0.3]], [[0.1, 0.1, 0.2], [0.2, 0.2, 0.2]]]
    assert s.lengths.tolist() == [3, 3] and s.n_run_bins.tolist() == [5, 4]
    assert s.length_note == "whole kept window, at most the first 3 bins: 3..3 bins"


def test_training_parts_and_ragged_features():
    values = np.zeros((2, 2, 10))
    values[0] = np.arange(10)
    values[1, :, :6] = np.arange(6)[::-1]
    s = series_from_arrays(["a", "b"], values, lengths=np.array([10, 6]))
    assert s.training_bins(0.7).tolist() == [7, 4]
    parts = s.training_parts(0.7)
    assert parts[0][0].tolist() == list(range(7)) and parts[1][0].tolist() == [5, 4, 3, 2]
    feats = temporal_features_of(parts, CFG)
    # each row equals the equal-length computation of that series alone (same columns: lags < 4 fit both)
    np.testing.assert_allclose(feats[1], temporal_features(parts[1][None], CFG)[0])
    np.testing.assert_allclose(feats[0], temporal_features(parts[0][None], CFG)[0])
    np.testing.assert_allclose(aggregate_of(parts)[1], aggregate_from_values(parts[1][None])[0])
    with pytest.raises(ValueError, match="lengths must be"):
        series_from_arrays(["a"], values[:1], lengths=np.array([11]))


def test_series_matrix_rejects_bad_arguments():
    usage, lr = _tables()
    with pytest.raises(ValueError, match="length must be"):
        series_matrix(usage, lr, -1)
    no_start = lr.with_columns(run_start_s=pl.when(pl.col("workload_id") == "b").then(pl.col("run_start_s")))
    with pytest.raises(ValueError, match=r"null run_start_s or n_run_bins for workload\(s\) \['a', 'c'"):
        series_matrix(usage, no_start, None)
    with pytest.raises(ValueError, match=r"'usage' is missing column\(s\) \['is_filled'\]"):
        series_matrix(usage.lazy().drop("is_filled"), lr, None)


def test_series_matrix_without_workloads_is_empty():
    usage, lr = _tables()
    s = series_matrix(usage, lr.clear(), 6)
    assert s.values.shape == (0, 2, 6) and s.aggregate.shape == (0, len(AGGREGATE_FEATURES))
    assert s.skipped.height == 0
