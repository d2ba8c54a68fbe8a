from dataclasses import replace

import numpy as np
import pytest

from models.forecaster import ForecasterConfig, fit_forecaster, predict_series
from models.grouped_forecaster import fit_predict_many, groupable


def _walks(n: int, length: int, seed: int) -> list[np.ndarray]:
    """Random walks of uneven lengths around 0.3 (cpu, mem)."""
    rng = np.random.default_rng(seed)
    return [0.3 + 0.02 * np.cumsum(rng.normal(0, 1, (2, length + 7 * (i % 3))), axis=1) for i in range(n)]


def _one_at_a_time(series, n_train, sets, cfg):
    out = []
    for m in sets:
        part, nt = [series[j] for j in m], [n_train[j] for j in m]
        out.append(predict_series(fit_forecaster(part, nt, cfg), part, nt))
    return out


CONFIGS = {
    # the sample's proxy: 12 Adam steps, one or two batches per epoch
    "sample": ForecasterConfig(
        window=12, conv_channels=8, hidden_size=8, epochs=1, min_steps=12, max_train_windows=256
    ),
    # skip-GRU, member sets with different numbers of batches (and so of epochs and steps)
    "skip": ForecasterConfig(window=16, kernel_size=4, skip_period=4, min_steps=25, batch_size=32),
    "no_ar_stride": ForecasterConfig(window=10, kernel_size=3, ar_window=0, stride=2, min_steps=15),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_side_by_side_fits_equal_one_at_a_time_fits(name):
    cfg = CONFIGS[name]
    series = _walks(24, 90, seed=1)
    n_train = [s.shape[1] - 20 for s in series]
    sets = [np.arange(24), np.arange(0, 6), np.arange(3, 24, 4), np.array([5, 17]), np.arange(0, 6)]
    got = fit_predict_many(series, n_train, sets, cfg)
    want = _one_at_a_time(series, n_train, sets, cfg)
    assert groupable(cfg)
    for m, g, w in zip(sets, got, want, strict=True):
        assert [a.shape for a in g] == [(2, 20)] * len(m)
        for a, b in zip(g, w, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # a fit does not depend on the fits beside it
    alone = fit_predict_many(series, n_train, sets[3:4], cfg)[0]
    for a, b in zip(alone, got[3], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # the seed moves every fit
    other = fit_predict_many(series, n_train, sets[:1], replace(cfg, seed=3))[0]
    assert not np.allclose(other[0], got[0][0], atol=1e-4)


def test_configurations_it_cannot_stack_are_fitted_one_at_a_time():
    cfg = replace(CONFIGS["sample"], dropout=0.2)
    series = _walks(6, 60, seed=2)
    n_train = [40] * 6
    sets = [np.arange(6), np.array([1, 2, 3])]
    assert not groupable(cfg) and not groupable(replace(CONFIGS["sample"], val_fraction=0.2, patience=2))
    got = fit_predict_many(series, n_train, sets, cfg)
    want = _one_at_a_time(series, n_train, sets, cfg)
    assert all(
        np.array_equal(a, b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)
    )


def test_bad_member_sets_and_short_series_name_the_problem():
    series = _walks(4, 60, seed=3)
    cfg = CONFIGS["sample"]
    with pytest.raises(ValueError, match="member set 1: index out of range for 4 workloads"):
        fit_predict_many(series, [40] * 4, [np.arange(4), np.array([2, 9])], cfg)
    with pytest.raises(ValueError, match="member set 0: expected a non-empty"):
        fit_predict_many(series, [40] * 4, [np.array([], dtype=int)], cfg)
    with pytest.raises(ValueError, match="workload 2: training part has 5 bins"):
        fit_predict_many(series, [40, 40, 5, 40], [np.arange(4)], cfg)
