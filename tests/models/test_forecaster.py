from dataclasses import replace

import numpy as np
import pytest

from models.forecaster import ForecasterConfig, as_series_list, fit_forecaster, paper_scale, predict_series

TINY = ForecasterConfig(window=12, kernel_size=3, hidden_size=8, conv_channels=8, ar_window=4, min_steps=60)


def _sines(n: int, length: int, period: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    out = []
    for _ in range(n):
        phase = rng.uniform(0, 2 * np.pi)
        cpu = 0.3 + 0.1 * np.sin(2 * np.pi * t / period + phase)
        mem = 0.2 + 0.05 * np.cos(2 * np.pi * t / period + phase)
        out.append(np.stack([cpu, mem]) + rng.normal(0, 0.005, (2, length)))
    return out


def test_learns_a_sine_better_than_the_mean():
    series = _sines(n=4, length=160, period=16, seed=0)
    n_train = [112] * 4
    preds = predict_series(fit_forecaster(series, n_train, TINY), series, n_train)
    mse_model = np.mean([((s[:, 112:] - p) ** 2).mean() for s, p in zip(series, preds, strict=True)])
    mse_mean = np.mean([((s[:, 112:] - s[:, :112].mean(axis=1, keepdims=True)) ** 2).mean() for s in series])
    assert preds[0].shape == (2, 48)
    assert mse_model < 0.2 * mse_mean


def test_same_seed_same_predictions_and_other_seed_differs():
    series = _sines(n=2, length=80, period=10, seed=1)
    cfg = ForecasterConfig(
        window=12,
        kernel_size=3,
        hidden_size=4,
        conv_channels=4,
        ar_window=4,
        min_steps=5,
        skip_period=3,
        dropout=0.2,
    )
    runs = [predict_series(fit_forecaster(series, [60, 60], c), series, [60, 60]) for c in (cfg, cfg)]
    other = predict_series(fit_forecaster(series, [60, 60], replace(cfg, seed=1)), series, [60, 60])
    assert all(np.array_equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))
    assert not np.array_equal(runs[0][0], other[0])


def test_skip_gru_forward_shape():
    series = _sines(n=1, length=60, period=8, seed=2)
    cfg = ForecasterConfig(
        window=16, kernel_size=4, skip_period=4, hidden_size=4, conv_channels=4, min_steps=2
    )
    assert predict_series(fit_forecaster(series, [50], cfg), series, [50])[0].shape == (2, 10)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="workload 1: usage must have shape"):
        as_series_list([np.zeros((2, 10)), np.zeros((3, 10))])
    with pytest.raises(ValueError, match="workload 0: usage has 1 non-finite"):
        as_series_list([np.array([[0.1, np.nan], [0.1, 0.2]])])
    with pytest.raises(ValueError, match="skip_period"):
        ForecasterConfig(window=8, kernel_size=6, skip_period=4)
    with pytest.raises(ValueError, match="no training windows"):
        fit_forecaster([np.zeros((2, 10))], [10], ForecasterConfig(window=24))


def test_paper_scale_uses_lai_et_al_settings():
    cfg = paper_scale()
    assert (cfg.window, cfg.conv_channels, cfg.hidden_size, cfg.skip_period, cfg.ar_window) == (
        168,
        100,
        100,
        24,
        24,
    )
