"""Multivariate usage forecaster after LSTNet (Lai et al. 2018), the model behind TVW-RL's prediction-gain proxy.

Data: a list of workloads, each a float array (2, L_i) of (cpu_frac, mem_frac) per 5-minute bin. One model is shared
by all workloads it is trained on; a training sample is a window of `window` past bins of one workload and its target
is the value `horizon` bins after the window's last bin (LSTNet's single-step convention).

Each workload's series are standardised with the mean/std of that workload's own training part, so workloads of very
different sizes share one model; predictions are returned in the original units (fractions of a machine).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from models.training import init_parameters, train_minibatches

N_SERIES = 2
"""cpu and mem."""

_STD_FLOOR = 1e-6
"""Smallest std used to standardise a series (a constant series would otherwise divide by zero)."""


@dataclass(frozen=True)
class ForecasterConfig:
    """LSTNet size and training budget. Defaults are small: fast enough for the prediction-gain sweep on 2 cores."""

    window: int = 24
    """Past bins fed to the model (LSTNet "window")."""
    horizon: int = 1
    """Predict the value this many bins after the window's last bin."""
    conv_channels: int = 16
    """LSTNet hidCNN: output channels of the 1-D convolution."""
    kernel_size: int = 6
    """LSTNet CNN kernel: bins covered by one convolution."""
    hidden_size: int = 16
    """LSTNet hidRNN: GRU state size."""
    skip_period: int = 0
    """LSTNet skip: period p of the skip-GRU in bins; 0 turns the skip-GRU off."""
    skip_hidden: int = 4
    """LSTNet hidSkip: skip-GRU state size."""
    ar_window: int = 8
    """LSTNet highway window: last bins seen by the linear autoregressive part; 0 = off."""
    dropout: float = 0.0
    """Dropout after the convolution and GRUs (seeded masks)."""
    epochs: int = 4
    """Passes over the (subsampled) training windows, at least."""
    min_steps: int = 100
    """More epochs are run until this many Adam steps: equal compute for small (per-EC) and big (global) fits."""
    batch_size: int = 128
    """Windows per Adam step."""
    lr: float = 1e-2
    """Adam learning rate."""
    max_train_windows: int | None = 2000
    """Windows drawn (without replacement) per fit; None = all of them."""
    seed: int = 0
    """Seeds parameter init, window subsampling, shuffling and dropout."""
    n_threads: int | None = 1
    """Torch intra-op threads while fitting/predicting (restored after); None = leave as is."""
    stride: int = 1
    """Train on every stride-th window of each workload (targets first, first + stride, ...; before
    `max_train_windows` sampling). 1 = every window (Lai et al.); at 5-minute bins neighbouring windows share all
    but one bin, so 12 (one window per hour) keeps the data's span at a twelfth of the steps."""
    val_fraction: float = 0.0
    """Last fraction (in time) of each workload's training part whose windows form the validation split of early
    stopping (their inputs may reach back into the rest; no training target lies in it). Its windows follow the
    same `stride` and `max_train_windows` cap (an unbiased sample of the validation period). 0 = no validation."""
    patience: int = 0
    """Stop after this many epochs without a lower validation loss and keep the best epoch's weights (needs
    val_fraction > 0); 0 = run every epoch."""
    device: str = "cpu"
    """torch device of the fit ('cuda' where a GPU is lent); the fitted model is moved back to the CPU."""
    amp: bool = False
    """Mixed precision (bfloat16 autocast) during the fit; for a GPU."""

    def __post_init__(self) -> None:
        if self.window < self.kernel_size:
            raise ValueError(f"window ({self.window}) must be >= kernel_size ({self.kernel_size})")
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.patience > 0 and self.val_fraction == 0.0:
            raise ValueError(f"patience={self.patience} needs a validation split (val_fraction > 0)")
        if self.ar_window > self.window:
            raise ValueError(f"ar_window ({self.ar_window}) must be <= window ({self.window})")
        if self.skip_period > 0 and (self.window - self.kernel_size + 1) < self.skip_period:
            raise ValueError(
                f"skip_period ({self.skip_period}) needs window - kernel_size + 1 >= skip_period "
                f"(window={self.window}, kernel_size={self.kernel_size})"
            )
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")


def paper_scale() -> ForecasterConfig:
    """Lai et al. 2018's published LSTNet settings (hidCNN=hidRNN=100, kernel 6, skip 24, hidSkip 5,
    highway 24, window 168, dropout 0.2, Adam lr 1e-3, batch 128, 100 epochs), on all training windows.
    At 5-minute bins a 168-bin window is 14 h and period 24 is 2 h (Lai et al. used hourly data)."""
    return ForecasterConfig(
        window=168,
        conv_channels=100,
        kernel_size=6,
        hidden_size=100,
        skip_period=24,
        skip_hidden=5,
        ar_window=24,
        dropout=0.2,
        epochs=100,
        batch_size=128,
        lr=1e-3,
        max_train_windows=None,
        min_steps=0,
    )


def paper_feasible() -> ForecasterConfig:
    """The paper's model and optimiser (`paper_scale`: same layers, sizes, dropout, Adam lr and batch) on a
    schedule that makes one global fit on the 84 Bitbrains VMs take minutes on 2 cores, not 14-19 h: every 6th
    window (neighbouring 5-minute windows share all but one bin), the last 10 % of each training part as the
    validation split, and early stopping after 5 epochs without a lower validation loss (at most the paper's
    100 epochs; the best epoch's weights are kept). Stride 6 had the lowest validation loss of strides 4, 6 and
    12 on the 84 VMs (each stride's validation windows are an unbiased sample of the same period); the held-out
    months were not used to choose. Measured by `benchmarks/bench_paper_forecaster.py` (figures in the README)."""
    return replace(paper_scale(), stride=6, val_fraction=0.1, patience=5)


FORECASTER_PRESETS = {"small": ForecasterConfig, "paper": paper_scale, "paper_feasible": paper_feasible}
"""Named forecaster settings: 'small' (the defaults, fast enough for the prediction-gain sweep on 2 cores),
'paper' (Lai et al. 2018's, `paper_scale`: every window, 100 epochs) and 'paper_feasible' (the paper's model on
a strided, early-stopped schedule, `paper_feasible`)."""


def forecaster_preset(name: str) -> ForecasterConfig:
    """The named preset (ValueError naming the presets on an unknown name)."""
    if name not in FORECASTER_PRESETS:
        raise ValueError(f"forecaster preset must be one of {sorted(FORECASTER_PRESETS)}; got {name!r}")
    return FORECASTER_PRESETS[name]()


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with `n` torch intra-op threads, then restore the previous count. Nets this small are
    fastest single-threaded: on 2 busy cores, 2 threads measured about 10x slower than 1."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LSTNet(nn.Module):
    """Conv1d over time -> GRU (+ optional skip-GRU) -> linear, plus a linear AR highway on the raw last bins.

    Input (batch, window, N_SERIES) standardised usage; output (batch, N_SERIES) standardised prediction.
    """

    def __init__(self, cfg: ForecasterConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.cfg = cfg
        self.generator = generator  # dropout masks come from here, never from the global RNG
        self.conv = nn.Conv1d(N_SERIES, cfg.conv_channels, cfg.kernel_size)
        self.gru = nn.GRU(cfg.conv_channels, cfg.hidden_size, batch_first=True)
        n_out_in = cfg.hidden_size
        self.skip_gru = None
        if cfg.skip_period > 0:
            self.skip_gru = nn.GRU(cfg.conv_channels, cfg.skip_hidden, batch_first=True)
            n_out_in += cfg.skip_period * cfg.skip_hidden
        self.out = nn.Linear(n_out_in, N_SERIES)
        self.ar = nn.Linear(cfg.ar_window, 1) if cfg.ar_window > 0 else None
        init_parameters(self, generator)

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        p = self.cfg.dropout
        if not self.training or p <= 0.0:
            return x
        keep = torch.rand(x.shape, generator=self.generator, device=x.device) >= p
        return x * keep / (1.0 - p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        # convolution over time: (batch, channels, T') with T' = window - kernel + 1
        c = self._dropout(torch.relu(self.conv(x.transpose(1, 2))))
        c_seq = c.transpose(1, 2)
        _, h = self.gru(c_seq)
        r = self._dropout(h[-1])
        if self.skip_gru is not None:
            p = self.cfg.skip_period
            n_steps = c_seq.shape[1] // p
            # the last n_steps*p conv outputs, regrouped so each phase of the period is one sequence
            s = c_seq[:, -n_steps * p :, :].reshape(batch, n_steps, p, -1).transpose(1, 2)
            _, hs = self.skip_gru(s.reshape(batch * p, n_steps, -1))
            r = torch.cat([r, self._dropout(hs[-1].reshape(batch, -1))], dim=1)
        y = self.out(r)
        if self.ar is not None:
            # one AR filter shared by cpu and mem, applied to each series' last ar_window raw values
            z = x[:, -self.cfg.ar_window :, :].transpose(1, 2)
            y = y + self.ar(z).squeeze(-1)
        return y


@dataclass(frozen=True)
class FittedForecaster:
    """A trained LSTNet and the config it was trained with."""

    model: LSTNet
    cfg: ForecasterConfig
    final_loss: float  # training MSE (standardised units) of the last epoch run (with early stopping, not the kept one's)
    epochs: int = 0
    """Epochs run (fewer than configured when early stopping ended the fit)."""
    val_loss: float | None = None
    """Validation MSE (standardised units) of the kept weights; None without a validation split."""
    n_windows: int = 0
    """Training windows of one epoch."""


def as_series_list(values: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """Check usage series and return them as a list of float64 (2, L_i) arrays; raise naming the bad workload."""
    out = []
    for i, v in enumerate(values):
        a = np.asarray(v, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] != N_SERIES:
            raise ValueError(f"workload {i}: usage must have shape (2, L) (cpu, mem), got {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"workload {i}: usage has {int((~np.isfinite(a)).sum())} non-finite value(s)")
        out.append(a)
    return out


def series_stats(series: list[np.ndarray], n_train: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per workload and resource mean and std of the first n_train[i] bins: two (n, 2) arrays."""
    mean = np.stack([s[:, :t].mean(axis=1) for s, t in zip(series, n_train, strict=True)])
    std = np.stack([s[:, :t].std(axis=1) for s, t in zip(series, n_train, strict=True)])
    return mean, np.maximum(std, _STD_FLOOR)


def _windows(z: np.ndarray, targets: np.ndarray, cfg: ForecasterConfig) -> np.ndarray:
    """Input windows (len(targets), window, 2) of standardised series z (2, L) for the given target bins."""
    ends = targets - cfg.horizon + 1  # exclusive end of each input window
    idx = ends[:, None] - cfg.window + np.arange(cfg.window)[None, :]
    return z[:, idx].transpose(1, 2, 0)


def _window_pairs(
    lo: np.ndarray, hi: np.ndarray, stride: int, cap: int | None, rng: np.random.Generator
) -> np.ndarray:
    """(workload, target bin) pairs, (n, 2): targets lo[i], lo[i] + stride, ... below hi[i] of every workload,
    `cap` of them drawn without replacement when there are more. No array of every window is built (long series
    have millions): index j of the flat list of all windows maps to workload searchsorted(ends, j)."""
    counts = np.maximum(-(-(hi - lo) // stride), 0)
    total = int(counts.sum())
    flat = (
        np.sort(rng.choice(total, cap, replace=False))
        if cap is not None and total > cap
        else np.arange(total)
    )
    ends = np.cumsum(counts)
    workload = np.searchsorted(ends, flat, side="right")
    return np.stack([workload, lo[workload] + stride * (flat - (ends - counts)[workload])], axis=1)


def _standardised_windows(
    series: list[np.ndarray], pairs: np.ndarray, stats: tuple[np.ndarray, np.ndarray], cfg: ForecasterConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Input windows and targets of the given (workload, target) pairs (at least one), standardised with each
    workload's (mean, std) `stats`; float32."""
    xs, ys = [], []
    mean, std = stats
    for i in np.unique(pairs[:, 0]):
        t = pairs[pairs[:, 0] == i, 1]
        xs.append((_windows(series[i], t, cfg) - mean[i]) / std[i])
        ys.append((series[i][:, t].T - mean[i]) / std[i])
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.float32)


def _training_windows(
    series: list[np.ndarray],
    n_train: Sequence[int],
    stats: tuple[np.ndarray, np.ndarray],
    cfg: ForecasterConfig,
    rng: np.random.Generator,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """The training windows (every `stride`-th, or `max_train_windows` of them sampled) whose target lies in the
    training part, and with `val_fraction` > 0 the validation windows, whose targets are the last val_fraction
    of each training part (where no training target lies); standardised with `stats`."""
    first = cfg.window + cfg.horizon - 1  # first target bin with a full window before it
    n_train = np.asarray(n_train, dtype=np.int64)
    held = np.round(cfg.val_fraction * n_train).astype(np.int64)
    lo = np.full(len(n_train), first, dtype=np.int64)
    train_hi = n_train - held
    if np.maximum(train_hi - lo, 0).sum() == 0:
        raise ValueError(
            f"no training windows: every training part (less its last val_fraction={cfg.val_fraction}) is "
            f"shorter than window+horizon={first + 1}"
        )
    train = _standardised_windows(
        series, _window_pairs(lo, train_hi, cfg.stride, cfg.max_train_windows, rng), stats, cfg
    )
    if cfg.val_fraction == 0.0:
        return train, None
    pairs = _window_pairs(np.maximum(train_hi, first), n_train, cfg.stride, cfg.max_train_windows, rng)
    if len(pairs) == 0:
        raise ValueError(
            f"no validation windows: val_fraction={cfg.val_fraction} of every training part holds no target bin "
            f"after window+horizon-1={first}"
        )
    return train, _standardised_windows(series, pairs, stats, cfg)


def fit_forecaster(
    values: np.ndarray | Sequence[np.ndarray],
    n_train: Sequence[int] | None,
    cfg: ForecasterConfig,
    on_epoch: Callable[[int, float, float | None], None] | None = None,
) -> FittedForecaster:
    """Train one LSTNet on the first n_train[i] bins of every workload (all bins when n_train is None);
    `on_epoch(epoch, train_loss, val_loss)` reports progress (`models.training.train_minibatches`)."""
    with torch_threads(cfg.n_threads):
        return _fit(values, n_train, cfg, on_epoch)


def _fit(
    values: np.ndarray | Sequence[np.ndarray],
    n_train: Sequence[int] | None,
    cfg: ForecasterConfig,
    on_epoch: Callable[[int, float, float | None], None] | None,
) -> FittedForecaster:
    series = as_series_list(values)
    n_train = [s.shape[1] for s in series] if n_train is None else list(n_train)
    stats = series_stats(series, n_train)
    (x, y), val = _training_windows(series, n_train, stats, cfg, np.random.default_rng(cfg.seed))
    device = torch.device(cfg.device)
    x_t, y_t = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    val_t = (
        None if val is None else (torch.from_numpy(val[0]).to(device), torch.from_numpy(val[1]).to(device))
    )

    gen = torch.Generator().manual_seed(cfg.seed)
    model = LSTNet(cfg, gen)
    if device.type != "cpu":
        # dropout masks are drawn where the activations are; init and shuffling stay on the CPU generator
        model.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        model.to(device)
    n_batches = math.ceil(len(x_t) / cfg.batch_size)
    # at least cfg.epochs, and enough epochs for min_steps Adam steps (equal compute for small and big fits)
    n_epochs = max(cfg.epochs, math.ceil(cfg.min_steps / n_batches))
    log = train_minibatches(
        model,
        x_t,
        y_t,
        nn.functional.mse_loss,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        n_epochs=n_epochs,
        generator=gen,
        validation=val_t,
        patience=cfg.patience,
        autocast_dtype=torch.bfloat16 if cfg.amp else None,
        on_epoch=on_epoch,
    )
    if device.type != "cpu":
        model.to("cpu")
        model.generator = gen
    model.eval()
    return FittedForecaster(
        model=model,
        cfg=cfg,
        final_loss=log.final_loss,
        epochs=log.epochs,
        val_loss=log.best_val,
        n_windows=len(x_t),
    )


def predict_series(
    fitted: FittedForecaster,
    values: np.ndarray | Sequence[np.ndarray],
    n_train: Sequence[int],
    batch_size: int = 4096,
) -> list[np.ndarray]:
    """Predictions (`horizon` bins ahead) for bins n_train[i]..L_i-1 of every workload, each (2, L_i - n_train[i]),
    in the original units. Inputs are the actual past bins (teacher forcing), standardised with the
    workload's own training-part stats."""
    with torch_threads(fitted.cfg.n_threads):
        return _predict(fitted, as_series_list(values), n_train, batch_size)


def _predict(
    fitted: FittedForecaster, series: list[np.ndarray], n_train: Sequence[int], batch_size: int
) -> list[np.ndarray]:
    cfg = fitted.cfg
    mean, std = series_stats(series, n_train)
    windows, counts = [], []
    for i, (s, nt) in enumerate(zip(series, n_train, strict=True)):
        if nt < cfg.window + cfg.horizon - 1:
            raise ValueError(
                f"workload {i}: training part has {nt} bins, fewer than window+horizon-1="
                f"{cfg.window + cfg.horizon - 1} needed before the first predicted bin"
            )
        z = (s - mean[i][:, None]) / std[i][:, None]
        windows.append(_windows(z, np.arange(nt, s.shape[1]), cfg).astype(np.float32))
        counts.append(s.shape[1] - nt)
    # all workloads' windows in shared batches: one model call per batch, not per workload
    x = np.concatenate(windows) if windows else np.zeros((0, cfg.window, N_SERIES), dtype=np.float32)
    device = torch.device(cfg.device)  # predicted where it was fitted; the model goes back to the CPU after
    model = fitted.model.to(device)
    try:
        with torch.no_grad():
            preds = [
                model(torch.from_numpy(x[j : j + batch_size]).to(device)).float().cpu().numpy()
                for j in range(0, len(x), batch_size)
            ]
    finally:
        fitted.model.to("cpu")
    p = np.concatenate(preds) if preds else np.zeros((0, N_SERIES), dtype=np.float32)
    out = []
    for i, part in enumerate(np.split(p, np.cumsum(counts)[:-1])):
        out.append(part.T.astype(np.float64) * std[i][:, None] + mean[i][:, None])
    return out
