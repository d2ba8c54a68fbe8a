"""TVW-RL's low-overhead proxy for the goodness of an EC mapping: effective prediction gain (EG), Table 1.

For one mapping (labels per workload) a usage forecaster (LSTNet, `models.forecaster`) is trained per EC and once on
all workloads (EC-agnostic). Both predict the held-out tail of each series (time split: the first `train_frac` of
every series trains, the rest is evaluated).

Correlation (our definition; the paper does not spell it out): for one resource, the Pearson correlation between
predicted and actual values over all held-out bins of all the EC's workloads pooled together; the EC's correlation is
the mean over cpu and mem. With `correlation_space="standardised"` (default) each workload's actual and predicted
values are first standardised with that workload's training-part mean/std, so the pooled correlation measures how
well the dynamics are tracked rather than how far apart the workloads' levels are; `"raw"` pools the fractions as is.

G(e) = 100 * (corr_ec - corr_global) / |corr_global|      (percentage gain of EC e)
EG   = (1/n) * sum_e max(0, G(e)) * |e|                    (TVW-RL, "Equivalence-class (EC) Analysis")
f    = fraction of the n workloads in ECs with G(e) > 0     (Table 1's "f")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from models.forecaster import (
    ForecasterConfig,
    as_series_list,
    fit_forecaster,
    predict_series,
    series_stats,
)

GAIN_ROWS = {
    "ec_label": pl.Int64,
    "n_workloads": pl.Int64,
    "corr_ec": pl.Float64,
    "corr_global": pl.Float64,
    "gain_pct": pl.Float64,
    "status": pl.String,  # ok | too_small (G set to 0) | undefined_corr (a correlation is NaN or corr_global = 0; G = 0)
}
"""One row per EC of a mapping."""

MAPPING_ROWS = {
    "method": pl.String,
    "k": pl.Int64,
    "eg_pct": pl.Float64,
    "f_frac": pl.Float64,
    "n_workloads": pl.Int64,
    "n_ecs_too_small": pl.Int64,
    "n_ecs_undefined": pl.Int64,
}
"""One row per (method, k) mapping: the summary of Table 1."""


@dataclass(frozen=True)
class GainConfig:
    """How the prediction-gain proxy is measured."""

    forecaster: ForecasterConfig = field(default_factory=ForecasterConfig)  # model and budget for every fit
    train_frac: float = 0.7  # leading fraction of every series used for training; the rest is held out
    min_members: int = 2  # ECs with fewer workloads get G = 0 (status too_small) instead of their own model
    correlation_space: str = "standardised"  # "standardised" (per workload, training stats) or "raw"

    def __post_init__(self) -> None:
        if not 0.0 < self.train_frac < 1.0:
            raise ValueError(f"train_frac must be in (0, 1), got {self.train_frac}")
        if self.correlation_space not in ("standardised", "raw"):
            raise ValueError(
                f"correlation_space must be 'standardised' or 'raw', got {self.correlation_space!r}"
            )


@dataclass(frozen=True)
class GainResult:
    """Per-EC rows (GAIN_ROWS) and the mapping's summary."""

    rows: pl.DataFrame
    k: int  # number of ECs in the mapping
    f_frac: float  # fraction of workloads in ECs with G > 0
    eg_pct: float  # effective prediction gain, percent
    n_workloads: int
    n_ecs_too_small: int
    n_ecs_undefined: int


# --- pure formulas -------------------------------------------------------------------------------------------------


def gain_pct(corr_ec: float, corr_global: float) -> float:
    """G(e) = 100 * (corr_ec - corr_global) / |corr_global|; NaN when undefined (NaN input or corr_global = 0)."""
    if not (np.isfinite(corr_ec) and np.isfinite(corr_global)) or corr_global == 0.0:
        return float("nan")
    return 100.0 * (corr_ec - corr_global) / abs(corr_global)


def effective_gain(gains_pct: Sequence[float], sizes: Sequence[int]) -> float:
    """EG = (1/n) * sum_e max(0, G(e)) * |e| with n = sum of sizes. NaN gains count as 0."""
    g = np.nan_to_num(np.asarray(gains_pct, dtype=np.float64), nan=0.0)
    s = np.asarray(sizes, dtype=np.float64)
    return float((np.maximum(g, 0.0) * s).sum() / s.sum())


def gaining_fraction(gains_pct: Sequence[float], sizes: Sequence[int]) -> float:
    """f = fraction of workloads in ECs with G(e) > 0."""
    g = np.nan_to_num(np.asarray(gains_pct, dtype=np.float64), nan=0.0)
    s = np.asarray(sizes, dtype=np.float64)
    return float(s[g > 0].sum() / s.sum())


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two 1-D arrays; NaN when either is constant or has fewer than 2 points."""
    if a.size < 2:
        return float("nan")
    da, db = a - a.mean(), b - b.mean()
    denom = np.sqrt((da * da).sum() * (db * db).sum())
    return float((da * db).sum() / denom) if denom > 0 else float("nan")


def choose_mapping(rows: pl.DataFrame | Iterable[Mapping]) -> tuple[str, int]:
    """The (method, k) with the best eg_pct; ties go to the higher f_frac, then the smaller k."""
    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows))
    if df.height == 0:
        raise ValueError("choose_mapping: no mappings to choose from")
    best = df.sort(["eg_pct", "f_frac", "k"], descending=[True, True, False]).row(0, named=True)
    return str(best["method"]), int(best["k"])


# --- model fits ----------------------------------------------------------------------------------------------------


def _n_train(series: list[np.ndarray], cfg: GainConfig) -> list[int]:
    need = cfg.forecaster.window + cfg.forecaster.horizon - 1
    out = []
    for i, s in enumerate(series):
        nt = int(cfg.train_frac * s.shape[1])
        if nt < need + 1 or s.shape[1] - nt < 2:
            raise ValueError(
                f"workload {i}: series of {s.shape[1]} bins is too short: train part {nt} bins needs > {need} "
                f"(window+horizon-1) and the held-out part needs >= 2 bins (train_frac={cfg.train_frac})"
            )
        out.append(nt)
    return out


def predict_global(values: np.ndarray | Sequence[np.ndarray], cfg: GainConfig) -> list[np.ndarray]:
    """Held-out predictions of the EC-agnostic model (trained on all workloads); reusable across mappings."""
    series = as_series_list(values)
    n_train = _n_train(series, cfg)
    return predict_series(fit_forecaster(series, n_train, cfg.forecaster), series, n_train)


def _correlation(
    series: list[np.ndarray],
    preds: Sequence[np.ndarray] | Mapping[int, np.ndarray],
    n_train: list[int],
    members: np.ndarray,
    cfg: GainConfig,
) -> float:
    """Pooled Pearson over the members' held-out bins, averaged over cpu and mem (see module docstring)."""
    mean, std = series_stats([series[i] for i in members], [n_train[i] for i in members])
    actual, predicted = [], []
    for j, i in enumerate(members):
        a, p = series[i][:, n_train[i] :], preds[i]
        if cfg.correlation_space == "standardised":
            a = (a - mean[j][:, None]) / std[j][:, None]
            p = (p - mean[j][:, None]) / std[j][:, None]
        actual.append(a)
        predicted.append(p)
    a, p = np.concatenate(actual, axis=1), np.concatenate(predicted, axis=1)
    per_resource = [pearson(a[r], p[r]) for r in range(a.shape[0])]
    # a resource whose correlation is undefined (constant) is left out of the average
    return float(np.nanmean(per_resource)) if np.isfinite(per_resource).any() else float("nan")


def prediction_gain(
    values: np.ndarray | Sequence[np.ndarray],
    labels: np.ndarray,
    cfg: GainConfig,
    global_preds: list[np.ndarray] | None = None,
) -> GainResult:
    """Per-EC gain of an EC-specific forecaster over the EC-agnostic one, and the mapping's EG and f.

    values: (n, 2, L) or n arrays (2, L_i) of cpu/mem fractions; labels: (n,) EC label per workload.
    global_preds: output of `predict_global` for the same values and cfg (computed here when None).
    """
    series = as_series_list(values)
    labels = np.asarray(labels)
    if labels.shape != (len(series),):
        raise ValueError(f"labels has shape {labels.shape}; expected ({len(series)},), one per workload")
    n_train = _n_train(series, cfg)
    if global_preds is None:
        global_preds = predict_global(series, cfg)

    rows = []
    for ec in np.unique(labels):
        members = np.flatnonzero(labels == ec)
        corr_global = _correlation(series, global_preds, n_train, members, cfg)
        if len(members) < cfg.min_members:
            rows.append((int(ec), len(members), float("nan"), corr_global, 0.0, "too_small"))
            continue
        ec_series = [series[i] for i in members]
        ec_train = [n_train[i] for i in members]
        ec_preds = predict_series(fit_forecaster(ec_series, ec_train, cfg.forecaster), ec_series, ec_train)
        preds = dict(zip(members.tolist(), ec_preds, strict=True))
        corr_ec = _correlation(series, preds, n_train, members, cfg)
        g = gain_pct(corr_ec, corr_global)
        status = "ok" if np.isfinite(g) else "undefined_corr"
        rows.append((int(ec), len(members), corr_ec, corr_global, 0.0 if status != "ok" else g, status))

    df = pl.DataFrame(rows, schema=GAIN_ROWS, orient="row")
    gains, sizes = df["gain_pct"].to_list(), df["n_workloads"].to_list()
    return GainResult(
        rows=df,
        k=df.height,
        f_frac=gaining_fraction(gains, sizes),
        eg_pct=effective_gain(gains, sizes),
        n_workloads=len(series),
        n_ecs_too_small=int((df["status"] == "too_small").sum()),
        n_ecs_undefined=int((df["status"] == "undefined_corr").sum()),
    )


def mapping_gain_table(
    values: np.ndarray | Sequence[np.ndarray],
    mappings: Mapping[tuple[str, int], np.ndarray],
    cfg: GainConfig,
) -> pl.DataFrame:
    """Table 1: one MAPPING_ROWS row per (method, k) -> labels mapping; the EC-agnostic model is fitted once."""
    global_preds = predict_global(values, cfg)
    out = []
    for (method, k), labels in mappings.items():
        r = prediction_gain(values, labels, cfg, global_preds=global_preds)
        out.append((method, int(k), r.eg_pct, r.f_frac, r.n_workloads, r.n_ecs_too_small, r.n_ecs_undefined))
    return pl.DataFrame(out, schema=MAPPING_ROWS, orient="row")
