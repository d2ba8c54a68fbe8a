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

One fit is one draw: the forecaster's seed alone moves EG by more than the gaps between methods. So every mapping
is scored over `n_seeds` forecaster seeds and reported as a mean with a 95 % t-interval, beside a RANDOM CONTROL:
the same class sizes with the labels shuffled (`n_control_draws` fresh permutations per seed, their EG averaged).

The test is PAIRED. G(e) is relative to the EC-agnostic forecaster, whose quality moves from seed to seed and
shifts every EG of that seed together; so the intervals of EG and of the control's EG are wide while their
difference is not. Per seed s the mapping and its control are scored with the same forecaster seed against the
same global model on the same training data, and the difference

    D_s = EG_mapping(s) - mean_r EG_control(s, r)

removes the shared global-model term. Both the mean of D (Student-t interval, t-test p-value) and its median
(distribution-free sign-test interval, sign-test p-value) are reported.

The choice (`choose_mapping`) uses the MEDIAN paired gain, never the mean EG. D is heavy-tailed by construction:
G(e) divides by |corr_global|, so a seed whose EC-agnostic model happens to track one EC poorly (corr_global near
0) multiplies that EC's G, and its EG, by ten or more (one fresh seed on the 84 Bitbrains VMs gave EG = 1,193 %
and moved a 10-seed mean from 15 to 138 while the median moved from 15.3 to 16.0). A rule that ranks by the mean
therefore ranks by the luckiest seed and does not reproduce with fresh seeds; the mean EG stays in the table as a
description (Table 1's number). The median of D over the informative seeds (D != 0: seeds where EG is 0 on both
sides favour neither) comes with the distribution-free sign-test interval [D_(j), D_(n+1-j)] (order statistics,
j the largest with coverage 1 - 2 P(Binomial(n, 1/2) <= j - 1) >= 95 %; it exists from 6 informative seeds) and
the one-sided exact sign-test p-value of P(D > 0) > 1/2, which assumes only independent seeds.

Every (method, k) of every method's sweep is a row, so a source has tens of rows, and the p-values are corrected
for that multiplicity with Holm's step-down method over ALL rows of the source (`holm_adjust`). A row is eligible
when its Holm-adjusted p is below `GainConfig.alpha` (0.05) and its median paired gain is positive; among those
the largest median paired gain is chosen, ties broken by the stability of the classes over time (ARI between the
clusterings of the two halves of each workload's window, higher first), then by the smaller k. When no row is
eligible NOTHING is chosen: there is no default mapping, the run says so loudly (a warning and the reason in the
metadata) and the EC labels are empty. The sign test's smallest p-value is 2^-n with n seeds, so with m rows a row
can pass only if m * 2^-n < alpha (10 seeds: at most 51 rows; `min_holm_p` gives the bound for a configuration).

EG fits are shared where the series are the same: within one table every EC-specific model is cached by (seed,
member set), so an EC that two mappings have in common (a cluster that stays the same from k to k + 1) is fitted
once per seed, and the EC-agnostic model is fitted once per seed for every mapping and control. All the fits of
a seed (the EC-agnostic model, every EC of every mapping and of every control) are trained side by side as slices
of one stacked model (`models.grouped_forecaster`): the same fits as one at a time, up to float rounding, at a
tenth of the time (on the sample's 971 Google-derived workloads one method's 8 seeds x 73 fits took 47 s one at a
time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl
from scipy import stats

from models.forecaster import ForecasterConfig, as_series_list, series_stats
from models.grouped_forecaster import fit_predict_many
from pipelines.progress import Progress

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
    "k_rule": pl.String,  # "silhouette_best" (the method's k of highest mean silhouette) or "sweep" (another k)
    "eg_pct": pl.Float64,  # effective prediction gain EG (%), mean over the forecaster seeds (not used to choose)
    "eg_pct_median": pl.Float64,  # median EG over the forecaster seeds
    "eg_pct_ci_low": pl.Float64,  # 95 % t-interval of that mean
    "eg_pct_ci_high": pl.Float64,
    "f_frac": pl.Float64,  # fraction of workloads in ECs with G(e) > 0, mean over seeds
    "f_frac_ci_low": pl.Float64,
    "f_frac_ci_high": pl.Float64,
    "control_eg_pct": pl.Float64,  # EG of the random control (same class sizes, labels shuffled), mean over seeds
    "control_eg_pct_ci_low": pl.Float64,
    "control_eg_pct_ci_high": pl.Float64,
    "control_f_frac": pl.Float64,  # f of the random control, mean over seeds
    "eg_diff_pct": pl.Float64,  # paired: mean over seeds of EG - control EG (same seed, same global model)
    "eg_diff_pct_ci_low": pl.Float64,  # 95 % t-interval of that mean
    "eg_diff_pct_ci_high": pl.Float64,
    "eg_diff_p_value": pl.Float64,  # one-sided paired t-test of mean difference > 0 (NaN with one seed)
    "eg_diff_pct_median": pl.Float64,  # median over the informative seeds (D != 0) of D = EG - control EG
    "eg_diff_pct_median_ci_low": pl.Float64,  # sign-test interval of that median (>= 95 %); NaN below 6 seeds
    "eg_diff_pct_median_ci_high": pl.Float64,
    "n_seeds_diff_positive": pl.Int64,  # seeds in which the mapping's EG exceeds its control's
    "n_seeds_diff_negative": pl.Int64,  # seeds in which it falls below (the rest are ties, left out)
    "eg_diff_sign_p_value": pl.Float64,  # one-sided exact sign test of P(D > 0) > 1/2 (ties dropped)
    "n_seeds": pl.Int64,  # forecaster seeds the means are over
    "n_control_draws": pl.Int64,  # random-control permutations per seed (their EG averaged)
    "eg_pct_by_seed": pl.List(pl.Float64),  # EG of each forecaster seed, in seed order
    "control_eg_pct_by_seed": pl.List(pl.Float64),  # the control's EG (mean over draws) of each seed
    "n_workloads": pl.Int64,
    "n_ecs_too_small": pl.Int64,  # ECs below min_members (G set to 0)
    "n_ecs_undefined": pl.Int64,  # ECs with an undefined correlation in at least one seed (G set to 0 there)
}
"""One row per (method, k) mapping: Table 1 with seeds, intervals and the random control. The Holm-adjusted
p-value and the choice need every row of the source (`with_holm`, `choose_mapping`)."""


@dataclass(frozen=True)
class GainConfig:
    """How the prediction-gain proxy is measured."""

    forecaster: ForecasterConfig = field(default_factory=ForecasterConfig)
    """Model and budget for every fit."""
    train_frac: float = 0.7
    """Leading fraction of every series used for training; the rest is held out."""
    min_members: int = 2
    """ECs with fewer workloads get G = 0 (status too_small) instead of their own model."""
    correlation_space: str = "standardised"
    """"standardised" (per workload, training stats) or "raw"."""
    n_seeds: int = 10
    """Forecaster seeds (forecaster.seed, +1, ...) each mapping and control is scored over. The sign test's
    smallest p is 2^-seeds, so with m rows (every k of every method) a row can pass Holm only when
    m * 2^-seeds < alpha (10 seeds allow up to 51 rows); its interval needs >= 6 informative seeds at 95 %."""
    max_eval_bins: int | None = None
    """Held-out bins scored per workload (the first after its training part); None = all."""
    confidence: float = 0.95
    """Level of the t-intervals over seeds."""
    n_control_draws: int = 5
    """Random-control permutations per seed, their EG averaged into the seed's control before pairing (the
    draws within a seed range widely, 4.1 to 46.6 on the 84 Bitbrains VMs, so one draw makes D as noisy as the
    control itself); each costs the mapping's fits again."""
    alpha: float = 0.05
    """Family-wise level of the choice: a row is eligible when its Holm-adjusted sign-test p is below it."""

    def __post_init__(self) -> None:
        if not 0.0 < self.train_frac < 1.0:
            raise ValueError(f"train_frac must be in (0, 1), got {self.train_frac}")
        if self.correlation_space not in ("standardised", "raw"):
            raise ValueError(
                f"correlation_space must be 'standardised' or 'raw', got {self.correlation_space!r}"
            )
        if self.n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1, got {self.n_seeds}")
        if self.n_control_draws < 1:
            raise ValueError(f"n_control_draws must be >= 1, got {self.n_control_draws}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.max_eval_bins is not None and self.max_eval_bins < 2:
            raise ValueError(f"max_eval_bins must be None or >= 2, got {self.max_eval_bins}")


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


def mean_interval(x: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean of x; a single value gives a zero-width interval."""
    a = np.asarray(x, dtype=np.float64)
    m = float(a.mean())
    if len(a) < 2:
        return m, m, m
    half = float(stats.t.ppf(0.5 + confidence / 2, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)))
    return m, m - half, m + half


def paired_difference(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """Paired comparison of x and y over the same seeds: (mean, low, high, p) of d = x - y, with the Student-t
    interval of mean(d) and the one-sided p-value of mean(d) > 0 (NaN with one pair; 0 or 1 when d does not
    vary)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or len(a) == 0:
        raise ValueError(
            f"paired_difference needs two equal-length 1-D sequences; got {a.shape} and {b.shape}"
        )
    d = a - b
    m, low, high = mean_interval(d, confidence)
    if len(d) < 2:
        return m, low, high, float("nan")
    sd = d.std(ddof=1)
    if sd == 0.0:
        return m, low, high, float(0.0 if m > 0 else 1.0)
    t = m / (sd / np.sqrt(len(d)))
    return m, low, high, float(stats.t.sf(t, len(d) - 1))


def median_interval(x: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the distribution-free sign-test interval of the median of x, the order statistics
    (x_(j), x_(n+1-j)) with the largest j (1-based) whose coverage 1 - 2 P(B <= j - 1), B ~ Binomial(n, 1/2),
    is at least `confidence` (so the coverage is at least that). (median, NaN, NaN) when even j = 1 falls
    short (n <= 5 at 95 %)."""
    a = np.sort(np.asarray(x, dtype=np.float64))
    n, m = len(a), float(np.median(np.asarray(x, dtype=np.float64)))
    j = 0
    while j + 1 <= n // 2 + n % 2 and 1.0 - 2.0 * stats.binom.cdf(j, n, 0.5) >= confidence:
        j += 1
    if j == 0:
        return m, float("nan"), float("nan")
    return m, float(a[j - 1]), float(a[n - j])


def sign_test_p(d: Sequence[float]) -> float:
    """One-sided exact sign test that a positive difference is more likely than a negative one: P(B >= n_pos)
    with B ~ Binomial(n_pos + n_neg, 1/2); zero differences are dropped (1.0 when every difference is 0)."""
    a = np.asarray(d, dtype=np.float64)
    n_pos, n_neg = int((a > 0).sum()), int((a < 0).sum())
    if n_pos + n_neg == 0:
        return 1.0
    return float(stats.binom.sf(n_pos - 1, n_pos + n_neg, 0.5))


def paired_sign_summary(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, int, int, float]:
    """Distribution-free paired comparison of x and y over the same seeds: (median, low, high, n_pos, n_neg, p)
    of d = x - y over the seeds where d != 0 (ties favour neither side), with the sign-test interval of that
    median (`median_interval`) and the one-sided sign-test p-value (`sign_test_p`). low > 0 is the sign test
    rejecting at (1 - confidence) / 2."""
    d = np.subtract(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    informative = d[d != 0.0]
    med = median_interval(informative, confidence) if len(informative) else (0.0, np.nan, np.nan)
    return (*med, int((d > 0).sum()), int((d < 0).sum()), sign_test_p(d))


def holm_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order: with the m p-values sorted
    ascending, p_(i) becomes max_{j <= i} min(1, (m - j + 1) p_(j)). Rejecting where the adjusted p < alpha
    controls the family-wise error rate at alpha. A NaN p-value counts as 1."""
    p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(stepped)
    return out


def min_holm_p(n_seeds: int, n_rows: int) -> float:
    """The smallest Holm-adjusted sign-test p-value any row can reach: n_rows * 2^-n_seeds (every seed favours
    the mapping). At or above alpha no mapping can ever be chosen."""
    return min(1.0, n_rows * 0.5**n_seeds)


P_HOLM = "eg_diff_sign_p_holm"
"""The Holm-adjusted sign-test p-value over all rows of a source."""


def with_holm(rows: pl.DataFrame, alpha: float = 0.05) -> pl.DataFrame:
    """`rows` (every row of one source) with `eg_diff_sign_p_holm` (Holm over all of them) and `beats_control`
    (that p below alpha and a positive median paired gain)."""
    p_holm = holm_adjust(rows["eg_diff_sign_p_value"].to_numpy()) if rows.height else np.zeros(0)
    return rows.with_columns(pl.Series(P_HOLM, p_holm, dtype=pl.Float64)).with_columns(
        beats_control=(pl.col(P_HOLM) < alpha) & (pl.col("eg_diff_pct_median").fill_nan(0.0) > 0.0)
    )


@dataclass(frozen=True)
class Choice:
    """Which mapping feeds the EC labels, and why."""

    method: str | None  # None: no mapping chosen
    k: int | None
    basis: str  # "significant" (a row passed the Holm-corrected test) | "none" (none did: no mapping)
    reason: str  # one sentence for the table and the run log


def choose_mapping(rows: pl.DataFrame | Iterable[Mapping], alpha: float = 0.05) -> Choice:
    """The mapping to use. Eligible rows: Holm-adjusted sign-test p (over all the given rows, `with_holm`,
    unless they carry `eg_diff_sign_p_holm` already) below `alpha` and a positive median paired gain. Among
    them the largest median paired gain `eg_diff_pct_median`; ties: the higher time stability `ari_time_halves`
    (when present), then the smaller k. The mean EG is not used (heavy-tailed: see the module docstring).
    No eligible row: nothing is chosen (basis "none"), with the reason."""
    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows))
    if df.height == 0:
        raise ValueError("choose_mapping: no mappings to choose from")
    if P_HOLM not in df.columns:
        df = with_holm(df, alpha)
    eligible = df.filter((pl.col(P_HOLM) < alpha) & (pl.col("eg_diff_pct_median").fill_nan(0.0) > 0.0))
    if eligible.height == 0:
        best = df.sort(P_HOLM).row(0, named=True)
        return Choice(
            None,
            None,
            "none",
            f"no mapping chosen: none of the {df.height} rows has a Holm-adjusted sign-test p < {alpha:g} "
            f"with a positive median paired gain over its random control (smallest adjusted p "
            f"{best[P_HOLM]:.3g}: {best['method']} k={best['k']}); no EC mapping is used",
        )
    stability = (
        pl.col("ari_time_halves").fill_null(-1.0).fill_nan(-1.0)
        if "ari_time_halves" in eligible.columns
        else pl.lit(0.0)
    )
    best = (
        eligible.with_columns(_stability=stability)
        .sort(["eg_diff_pct_median", "_stability", "k"], descending=[True, True, False])
        .row(0, named=True)
    )
    return Choice(
        str(best["method"]),
        int(best["k"]),
        "significant",
        f"{best['method']} k={best['k']}: the largest median paired gain over the random control "
        f"({best['eg_diff_pct_median']:.2f} points) among the {eligible.height} of {df.height} rows with a "
        f"Holm-adjusted sign-test p < {alpha:g} (its adjusted p {best[P_HOLM]:.3g})",
    )


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
    return fit_predict_many(series, n_train, [np.arange(len(series))], cfg.forecaster)[0]


def _correlation(
    series: list[np.ndarray],
    preds: Sequence[np.ndarray] | Mapping[int, np.ndarray],
    n_train: list[int],
    members: np.ndarray,
    cfg: GainConfig,
    stats: tuple[np.ndarray, np.ndarray],
) -> float:
    """Pooled Pearson over the members' held-out bins, averaged over cpu and mem (see module docstring); `stats`
    is `series_stats` of every series (each series' own training mean and std)."""
    mean, std = stats
    actual, predicted = [], []
    for i in members:
        a, p = series[i][:, n_train[i] :], preds[i]
        if cfg.correlation_space == "standardised":
            a = (a - mean[i][:, None]) / std[i][:, None]
            p = (p - mean[i][:, None]) / std[i][:, None]
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
    n_train: list[int] | None = None,
    fits: dict | None = None,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> GainResult:
    """Per-EC gain of an EC-specific forecaster over the EC-agnostic one, and the mapping's EG and f (one seed:
    cfg.forecaster.seed).

    values: (n, 2, L) or n arrays (2, L_i) of cpu/mem fractions; labels: (n,) EC label per workload.
    global_preds: output of `predict_global` for the same values and cfg (computed here when None).
    n_train: training bins per series (default: floor(train_frac * L_i)); bins after it are scored.
    fits: a cache of EC predictions by (seed, member indices), shared by the calls of one table (same series,
    same cfg apart from the seed): an EC with the same members in the same seed is fitted once.
    stats: `series_stats(series, n_train)`, each series' training mean and std (computed here when None; a table
    computes them once for all its calls).
    """
    series = as_series_list(values)
    labels = np.asarray(labels)
    if labels.shape != (len(series),):
        raise ValueError(f"labels has shape {labels.shape}; expected ({len(series)},), one per workload")
    n_train = _n_train(series, cfg) if n_train is None else n_train
    stats = series_stats(series, n_train) if stats is None else stats
    fits = {} if fits is None else fits
    fitted_global = fit_ec_models(
        series, n_train, [labels], cfg, fits, stats, with_global=global_preds is None
    )
    global_preds = fitted_global if global_preds is None else global_preds

    rows = []
    for ec in np.unique(labels):
        members = np.flatnonzero(labels == ec)
        corr_global = _correlation(series, global_preds, n_train, members, cfg, stats)
        if len(members) < cfg.min_members:
            rows.append((int(ec), len(members), float("nan"), corr_global, 0.0, "too_small"))
            continue
        preds = fits[(cfg.forecaster.seed, members.tobytes())]
        corr_ec = _correlation(series, preds, n_train, members, cfg, stats)
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


def fit_ec_models(
    series: list[np.ndarray],
    n_train: list[int],
    labelings: Sequence[np.ndarray],
    cfg: GainConfig,
    fits: dict,
    stats: tuple[np.ndarray, np.ndarray],
    with_global: bool = False,
) -> list[np.ndarray] | None:
    """Fit, side by side (`models.grouped_forecaster.fit_predict_many`), the EC model of every EC of every labeling
    in `labelings` that `fits` lacks (ECs of at least cfg.min_members workloads; `fits` maps (seed, member
    indices) to {workload: held-out predictions} and is filled here), and with `with_global` the EC-agnostic
    model on all workloads: its held-out predictions are returned (else None)."""
    seed = cfg.forecaster.seed
    todo: dict[bytes, np.ndarray] = {}
    for labels in labelings:
        for ec in np.unique(labels):
            members = np.flatnonzero(labels == ec)
            key = members.tobytes()
            if len(members) >= cfg.min_members and (seed, key) not in fits:
                todo[key] = members
    sets = ([np.arange(len(series))] if with_global else []) + list(todo.values())
    if not sets:
        return None
    preds = fit_predict_many(series, n_train, sets, cfg.forecaster, stats)
    for (key, members), p in zip(todo.items(), preds[int(with_global) :], strict=True):
        fits[(seed, key)] = dict(zip(members.tolist(), p, strict=True))
    return preds[0] if with_global else None


def scored_series(
    values: np.ndarray | Sequence[np.ndarray], cfg: GainConfig
) -> tuple[list[np.ndarray], list[int]]:
    """The series the proxy fits and scores, and their training bins: training part floor(train_frac * L_i)
    (the same bins the EC clustering saw), then at most max_eval_bins held-out bins."""
    series = as_series_list(values)
    n_train = _n_train(series, cfg)
    if cfg.max_eval_bins is not None:
        series = [s[:, : t + cfg.max_eval_bins] for s, t in zip(series, n_train, strict=True)]
    return series, n_train


def control_labels(labels: np.ndarray, seed: int, index: int, draw: int = 0) -> np.ndarray:
    """A random control of a mapping: its labels shuffled over the workloads (same class sizes); one permutation
    per (forecaster seed, mapping index, draw)."""
    return np.random.default_rng([seed, index, 7, draw]).permutation(np.asarray(labels))


def mapping_gain_table(
    values: np.ndarray | Sequence[np.ndarray],
    mappings: Mapping[tuple[str, int], np.ndarray],
    cfg: GainConfig,
    k_rules: Mapping[tuple[str, int], str] | None = None,
    log: Callable[[str], None] | None = None,
    label: str = "prediction gain",
    control_index: Mapping[tuple[str, int], int] | None = None,
) -> pl.DataFrame:
    """Table 1 over seeds: one MAPPING_ROWS row per (method, k) -> labels mapping, with its random control.

    For each of cfg.n_seeds forecaster seeds (forecaster.seed + s) the EC-agnostic model is fitted once; every
    mapping and its cfg.n_control_draws controls (fresh shuffles per seed) are scored against it with that
    seed, and the per-seed difference EG - mean control EG gives the paired columns. `log` receives progress
    lines (one item = one mapping with its controls in one seed), prefixed with `label`.

    `control_index` gives each mapping the index its random controls are drawn with (`control_labels`);
    default: its position in `mappings`. A table over part of a source's mappings (one method's, when the
    methods fan out) passes each mapping's position among ALL of them, so its rows equal the corresponding
    rows of the table over all mappings (the EC-agnostic model of a seed depends only on the series)."""
    series, n_train = scored_series(values, cfg)
    keys = list(mappings)
    index_of = _control_indices(keys, control_index)
    eg, f, c_eg, c_f = ({key: [] for key in keys} for _ in range(4))
    too_small = {key: 0 for key in keys}
    undefined = {key: 0 for key in keys}
    progress = Progress(cfg.n_seeds * len(keys), label, log=log, unit="mappings")
    stats = series_stats(series, n_train)  # each series' training mean and std: the same for every call below
    for s in range(cfg.n_seeds):
        # one EC-agnostic model per seed, shared by every mapping and control of that seed (the pairing); EC
        # models are cached by member set within the seed (the same cluster at two k is fitted once)
        seed = cfg.forecaster.seed + s
        cfg_s = replace(cfg, forecaster=replace(cfg.forecaster, seed=seed))
        controls = {
            key: [control_labels(mappings[key], seed, index_of[key], d) for d in range(cfg.n_control_draws)]
            for key in keys
        }
        fits: dict = {}
        labelings = [labels for key in keys for labels in (mappings[key], *controls[key])]
        global_preds = fit_ec_models(series, n_train, labelings, cfg_s, fits, stats, with_global=True)
        for key in keys:
            r = prediction_gain(series, mappings[key], cfg_s, global_preds, n_train, fits, stats)
            scored = [
                prediction_gain(series, labels, cfg_s, global_preds, n_train, fits, stats)
                for labels in controls[key]
            ]
            eg[key].append(r.eg_pct)
            f[key].append(r.f_frac)
            c_eg[key].append(float(np.mean([c.eg_pct for c in scored])))
            c_f[key].append(float(np.mean([c.f_frac for c in scored])))
            too_small[key] = r.n_ecs_too_small
            undefined[key] = max(undefined[key], r.n_ecs_undefined)
            progress.advance()
    return pl.DataFrame(
        [_table_row(key, eg, f, c_eg, c_f, too_small, undefined, k_rules, cfg, len(series)) for key in keys],
        schema=MAPPING_ROWS,
        orient="row",
    )


def _control_indices(
    keys: list[tuple[str, int]], control_index: Mapping[tuple[str, int], int] | None
) -> dict[tuple[str, int], int]:
    """Each mapping's control index: its position among `keys`, or the given one (every key must have one, and
    no two keys may share one: they would get the same random controls)."""
    if control_index is None:
        return {key: i for i, key in enumerate(keys)}
    missing = [key for key in keys if key not in control_index]
    if missing:
        raise ValueError(f"control_index has no index for mapping(s) {missing}")
    out = {key: int(control_index[key]) for key in keys}
    if len(set(out.values())) < len(out):
        raise ValueError(f"control_index gives two mappings the same index: {out}")
    return out


def _table_row(key, eg, f, c_eg, c_f, too_small, undefined, k_rules, cfg: GainConfig, n: int) -> dict:
    e, f_ci, ce = (mean_interval(v[key], cfg.confidence) for v in (eg, f, c_eg))
    d = paired_difference(eg[key], c_eg[key], cfg.confidence)
    med = paired_sign_summary(eg[key], c_eg[key], cfg.confidence)
    return {
        "method": key[0],
        "k": int(key[1]),
        "k_rule": (k_rules or {}).get(key, "given"),
        "eg_pct": e[0],
        "eg_pct_median": float(np.median(eg[key])),
        "eg_pct_ci_low": e[1],
        "eg_pct_ci_high": e[2],
        "f_frac": f_ci[0],
        "f_frac_ci_low": f_ci[1],
        "f_frac_ci_high": f_ci[2],
        "control_eg_pct": ce[0],
        "control_eg_pct_ci_low": ce[1],
        "control_eg_pct_ci_high": ce[2],
        "control_f_frac": float(np.mean(c_f[key])),
        "eg_diff_pct": d[0],
        "eg_diff_pct_ci_low": d[1],
        "eg_diff_pct_ci_high": d[2],
        "eg_diff_p_value": d[3],
        "eg_diff_pct_median": med[0],
        "eg_diff_pct_median_ci_low": med[1],
        "eg_diff_pct_median_ci_high": med[2],
        "n_seeds_diff_positive": med[3],
        "n_seeds_diff_negative": med[4],
        "eg_diff_sign_p_value": med[5],
        "n_seeds": cfg.n_seeds,
        "n_control_draws": cfg.n_control_draws,
        "eg_pct_by_seed": list(eg[key]),
        "control_eg_pct_by_seed": list(c_eg[key]),
        "n_workloads": n,
        "n_ecs_too_small": too_small[key],
        "n_ecs_undefined": undefined[key],
    }
