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


def test_stride_and_validation_split_keep_targets_apart():
    from models.forecaster import _training_windows, series_stats

    series = _sines(n=3, length=200, period=16, seed=3)
    n_train = [150, 150, 120]
    cfg = replace(TINY, stride=5, val_fraction=0.2, max_train_windows=None)
    stats = series_stats(series, n_train)
    (x, y), val = _training_windows(series, n_train, stats, cfg, np.random.default_rng(0))
    # targets 12, 17, ... below 150 - 30 = 120 (first two), below 120 - 24 = 96 (third): 22 + 22 + 17 windows
    assert len(x) == len(y) == 22 + 22 + 17
    # validation targets: every 5th bin of the last 20 % of each training part (120, 125, ..., 145 for workload 0)
    assert len(val[0]) == 6 + 6 + 5
    # the first training window of workload 0 ends at bin 11 and targets bin 12, the next targets bin 17
    mean, std = stats
    assert np.allclose(y[0], (series[0][:, 12] - mean[0]) / std[0], atol=1e-6)
    assert np.allclose(y[1], (series[0][:, 17] - mean[0]) / std[0], atol=1e-6)
    assert np.allclose(val[1][0], (series[0][:, 120] - mean[0]) / std[0], atol=1e-6)


def test_early_stopping_keeps_the_best_epoch_and_stops():
    series = _sines(n=4, length=160, period=16, seed=0)
    cfg = replace(TINY, val_fraction=0.2, patience=2, epochs=40, min_steps=0, lr=0.05)
    seen = []
    fitted = fit_forecaster(series, [112] * 4, cfg, on_epoch=lambda e, loss, val: seen.append(val))
    assert fitted.epochs == len(seen) <= 40
    assert fitted.val_loss == min(seen)
    best = seen.index(min(seen))
    # it stopped early, exactly `patience` epochs after the best one, which is not the last epoch run
    assert fitted.epochs < 40 and fitted.epochs == best + 1 + 2
    # the kept weights are the best epoch's: their validation loss is measured again
    from models.forecaster import _training_windows, series_stats

    stats = series_stats(series, [112] * 4)
    _, (xv, yv) = _training_windows(series, [112] * 4, stats, cfg, np.random.default_rng(cfg.seed))
    import torch

    with torch.no_grad():
        again = float(torch.nn.functional.mse_loss(fitted.model(torch.from_numpy(xv)), torch.from_numpy(yv)))
    assert again == pytest.approx(fitted.val_loss, rel=1e-5)


def test_schedule_settings_are_checked():
    with pytest.raises(ValueError, match="patience=3 needs a validation split"):
        ForecasterConfig(patience=3)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ForecasterConfig(stride=0)
    with pytest.raises(ValueError, match="val_fraction must be in"):
        ForecasterConfig(val_fraction=1.0)
    with pytest.raises(ValueError, match="no validation windows"):
        fit_forecaster(_sines(1, 40, 8, 0), [30], replace(TINY, val_fraction=0.01))


def test_paper_feasible_is_the_paper_model_on_a_shorter_schedule():
    from models.forecaster import paper_feasible

    paper, fast = paper_scale(), paper_feasible()
    same = (
        "window",
        "conv_channels",
        "kernel_size",
        "hidden_size",
        "skip_period",
        "skip_hidden",
        "ar_window",
    )
    assert all(getattr(paper, f) == getattr(fast, f) for f in same + ("dropout", "lr", "batch_size"))
    assert (fast.stride, fast.val_fraction, fast.patience) == (6, 0.1, 5)


def test_default_schedule_draws_the_windows_it_always_drew():
    """stride 1, no validation: every window once (or the same `max_train_windows` sample as a direct draw)."""
    from models.forecaster import _training_windows, series_stats

    series = _sines(n=3, length=60, period=8, seed=5)
    n_train = [50, 40, 30]
    stats = series_stats(series, n_train)
    cfg = replace(TINY, max_train_windows=None)
    (x, y), val = _training_windows(series, n_train, stats, cfg, np.random.default_rng(0))
    first = cfg.window + cfg.horizon - 1
    pairs = [(i, t) for i, nt in enumerate(n_train) for t in range(first, nt)]
    mean, std = stats
    want = np.stack([(series[i][:, t] - mean[i]) / std[i] for i, t in pairs])
    assert val is None and len(x) == len(pairs) and np.allclose(y, want, atol=1e-6)
    capped = replace(TINY, max_train_windows=20)
    (_, yc), _ = _training_windows(series, n_train, stats, capped, np.random.default_rng(7))
    drawn = np.sort(np.random.default_rng(7).choice(len(pairs), 20, replace=False))
    assert np.allclose(yc, want[drawn], atol=1e-6)


@pytest.mark.parametrize("where", ["training", "validation"])
def test_a_nan_loss_names_the_epoch(where):
    import torch

    from models.training import train_minibatches

    nan = torch.full((8, 1), float("nan"))
    y = nan if where == "training" else torch.ones(8, 1)
    validation = (torch.ones(8, 2), nan) if where == "validation" else None
    with pytest.raises(FloatingPointError, match=f"{where} loss is nan at epoch 1"):
        train_minibatches(
            torch.nn.Linear(2, 1),
            torch.ones(8, 2),
            y,
            torch.nn.functional.mse_loss,
            lr=0.1,
            batch_size=4,
            n_epochs=3,
            generator=torch.Generator().manual_seed(0),
            validation=validation,
            patience=2 if validation is not None else 0,
        )
