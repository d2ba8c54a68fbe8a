"""Per-workload usage series and the features TVW-RL clusters them on.

Input: the canonical `USAGE` table (5-minute bins) and the `LONG_RUNNING` table (each workload's kept
contiguous window `run_start_s`, `n_run_bins`). Output: a `SeriesSet`, i.e. one (cpu_frac, mem_frac)
series per workload cut to a common length, and two feature matrices on it:

- aggregate (Zhang et al. 2011 baseline, TVW-RL "EC Analysis"): totals and means of CPU and memory, duration,
  mean / std / normalised std of the memory-to-CPU ratio;
- temporal (TVW-RL "Temporal Features"): per resource autocorrelation at a few lags, linear trend, aggregated
  linear trend, mean, mean absolute change and std, computed with numpy on all series at once and equal to
  tsfresh's `feature_calculators` of the same names (tests/pipelines/test_features.py checks it).

Both matrices are min-max normalised per column to [0, 1] before Euclidean distances are taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy.spatial.distance import cdist

from pipelines.schemas import BIN_SECONDS, LONG_RUNNING, USAGE, check_schema

RESOURCES = ("cpu", "mem")
"""Resource axis of `SeriesSet.values`: index 0 is `cpu_frac`, index 1 is `mem_frac`."""

AGGREGATE_FEATURES = (
    "cpu_total_frac_s",  # sum over the kept window of cpu_frac * BIN_SECONDS
    "cpu_mean_frac",
    "mem_total_frac_s",
    "mem_mean_frac",
    "duration_s",  # n_run_bins * BIN_SECONDS
    "ratio_mean",  # mem_frac / cpu_frac over bins with cpu_frac > 0
    "ratio_std",
    "ratio_norm_std",  # ratio_std / ratio_mean; 0 when ratio_mean is 0
)
"""Columns of the aggregate (Zhang et al. 2011) feature matrix, in order."""

CONSTANT_STD = 1e-12
"""A series whose population std is at or below this (in cpu/mem fraction units) counts as constant.

tsfresh's autocorrelation uses `np.isclose(var, 0)` (absolute 1e-8 on the variance), which would call many
genuine low-usage fraction series constant; we use an explicit, much smaller threshold instead."""

SKIP_SCHEMA = {"workload_id": pl.String, "reason": pl.String}


@dataclass(frozen=True)
class SeriesSet:
    """Usage series of n workloads, all cut to the same length L.

    `values[i, 0]` is workload i's cpu_frac and `values[i, 1]` its mem_frac, one value per 5-minute bin,
    starting at the first bin of its kept window. `lengths[i]` is the full kept window in bins (before
    truncation); `aggregate[i]` holds the `AGGREGATE_FEATURES`, computed over that full window.
    """

    workload_ids: np.ndarray  # (n,) str
    values: np.ndarray  # (n, 2, L) float64
    lengths: np.ndarray  # (n,) int64, bins in the kept window
    aggregate: np.ndarray  # (n, len(AGGREGATE_FEATURES)) float64
    skipped: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SKIP_SCHEMA))
    length_note: str = ""  # how the common length L was chosen

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def length(self) -> int:
        return int(self.values.shape[2])

    @property
    def is_constant(self) -> np.ndarray:
        """(n, 2) bool: the series of that resource is constant (std <= CONSTANT_STD).

        Kept, not dropped. Features that divide by the std give 0 for it (autocorrelation, normalised std),
        and DTW z-normalisation turns it into all zeros."""
        return self.values.std(axis=2) <= CONSTANT_STD


# series


def series_from_arrays(workload_ids: list[str] | np.ndarray, values: np.ndarray) -> SeriesSet:
    """A `SeriesSet` from an (n, 2, L) array (tests, benchmarks): the window is the whole array."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 3 or values.shape[1] != 2:
        raise ValueError(f"values must have shape (n, 2, L); got {values.shape}")
    if not np.isfinite(values).all():
        bad = np.flatnonzero(~np.isfinite(values).all(axis=(1, 2)))
        raise ValueError(f"values has NaN/inf for workload index(es) {bad[:10].tolist()}")
    ids = np.asarray(workload_ids, dtype=str)
    if ids.shape != (values.shape[0],):
        raise ValueError(f"{ids.shape[0]} workload ids for {values.shape[0]} series")
    n, _, length = values.shape
    lengths = np.full(n, length, dtype=np.int64)
    return SeriesSet(
        ids, values, lengths, aggregate_from_values(values), length_note=f"all series {length} bins"
    )


def series_matrix(usage: pl.DataFrame, long_running: pl.DataFrame, length: int | None) -> SeriesSet:
    """Cut each long-running workload's (cpu_frac, mem_frac) series to a common length.

    Each workload's kept window is [run_start_s, run_start_s + n_run_bins * BIN_SECONDS). A workload whose
    window has a missing bin, a duplicate bin, a null/NaN or a negative value is skipped and listed in
    `skipped` with the reason (checked over the whole window, which the aggregate features use).
    Length policy: `length=None` truncates every series to the shortest valid window (min n_run_bins);
    `length=L` truncates to the first L bins and skips windows shorter than L ("window_shorter_than_length").
    """
    usage = check_schema(usage, USAGE, "usage")
    lr = check_schema(long_running, LONG_RUNNING, "long_running")
    sources = lr["source"].unique().to_list()
    if len(sources) > 1:
        raise ValueError(
            f"long_running holds several sources {sorted(map(str, sources))}; call once per source"
        )
    dupes = lr.filter(pl.col("workload_id").is_duplicated())["workload_id"].unique().to_list()
    if dupes:
        raise ValueError(f"long_running lists workload(s) {dupes[:5]} more than once")
    windows = lr.select(
        "source",
        "workload_id",
        "run_start_s",
        "n_run_bins",
        (pl.col("run_start_s") + pl.col("n_run_bins") * BIN_SECONDS).alias("run_end_s"),
    )
    rows = usage.join(windows, on=["source", "workload_id"], how="inner").filter(
        (pl.col("bin_start_s") >= pl.col("run_start_s")) & (pl.col("bin_start_s") < pl.col("run_end_s"))
    )
    checks = _check_windows(rows, windows)
    skipped = checks.filter(pl.col("reason") != "ok")
    valid = checks.filter(pl.col("reason") == "ok")
    if length is None:
        length = int(valid["n_run_bins"].min()) if valid.height else 0
        note = f"truncated to the shortest kept window: {length} bins"
    else:
        short = valid.filter(pl.col("n_run_bins") < length).with_columns(
            reason=pl.lit("window_shorter_than_length")
        )
        skipped = pl.concat([skipped, short])
        valid = valid.filter(pl.col("n_run_bins") >= length)
        note = f"truncated to the configured length: {length} bins"
    skipped = skipped.select("workload_id", "reason").sort("workload_id")
    valid = valid.sort("workload_id")
    values = _cut_values(rows, valid, length)
    return SeriesSet(
        workload_ids=valid["workload_id"].to_numpy().astype(str),
        values=values,
        lengths=valid["n_run_bins"].to_numpy().astype(np.int64),
        aggregate=_aggregate_from_rows(rows, valid),
        skipped=skipped,
        length_note=note,
    )


def _check_windows(rows: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per workload: n_run_bins and 'ok' or the reason it is skipped."""
    bad_value = (
        pl.col("cpu_frac").fill_nan(None).is_null()
        | pl.col("mem_frac").fill_nan(None).is_null()
        | (pl.col("cpu_frac") < 0)
        | (pl.col("mem_frac") < 0)
    )
    per = rows.group_by("workload_id").agg(
        n_rows=pl.len(),
        n_bins=pl.col("bin_start_s").n_unique(),
        n_bad=bad_value.sum(),
        n_misaligned=((pl.col("bin_start_s") - pl.col("run_start_s")) % BIN_SECONDS != 0).sum(),
    )
    out = windows.select("workload_id", "n_run_bins").join(
        per, on="workload_id", how="left", maintain_order="left"
    )
    reason = (
        pl.when(pl.col("n_run_bins") < 1)
        .then(pl.lit("empty_window"))
        .when(pl.col("n_rows").is_null())
        .then(pl.lit("no_usage_in_window"))
        .when(pl.col("n_bad") > 0)
        .then(pl.lit("nan_or_negative_value"))
        .when(pl.col("n_misaligned") > 0)
        .then(pl.lit("bin_not_on_grid"))
        .when(pl.col("n_rows") > pl.col("n_bins"))
        .then(pl.lit("duplicate_bins"))
        .when(pl.col("n_bins") < pl.col("n_run_bins"))
        .then(pl.lit("missing_bins"))
        .otherwise(pl.lit("ok"))
    )
    return out.select("workload_id", "n_run_bins", reason.alias("reason"))


def _cut_values(rows: pl.DataFrame, valid: pl.DataFrame, length: int) -> np.ndarray:
    """(n, 2, length) array of the first `length` bins of each valid workload, in `valid`'s order."""
    n = valid.height
    if n == 0 or length == 0:
        return np.zeros((n, 2, length))
    cut = (
        rows.join(valid.select("workload_id"), on="workload_id", how="semi")
        .filter(pl.col("bin_start_s") < pl.col("run_start_s") + length * BIN_SECONDS)
        .sort("workload_id", "bin_start_s")
    )
    flat = cut.select("cpu_frac", "mem_frac").to_numpy().astype(np.float64)
    # every valid window is complete and unique, so each workload contributes exactly `length` rows
    return np.ascontiguousarray(flat.reshape(n, length, 2).transpose(0, 2, 1))


def _aggregate_from_rows(rows: pl.DataFrame, valid: pl.DataFrame) -> np.ndarray:
    """`AGGREGATE_FEATURES` over each valid workload's full kept window, in `valid`'s order."""
    ratio = pl.when(pl.col("cpu_frac") > 0).then(pl.col("mem_frac") / pl.col("cpu_frac"))
    per = rows.group_by("workload_id").agg(
        cpu_sum=pl.col("cpu_frac").sum(),
        mem_sum=pl.col("mem_frac").sum(),
        ratio_mean=ratio.mean(),
        ratio_std=ratio.std(ddof=0),
    )
    df = valid.select("workload_id", "n_run_bins").join(
        per, on="workload_id", how="left", maintain_order="left"
    )
    n_bins = df["n_run_bins"].to_numpy().astype(np.float64)
    cpu_sum, mem_sum = df["cpu_sum"].to_numpy(), df["mem_sum"].to_numpy()
    r_mean = np.nan_to_num(df["ratio_mean"].fill_null(0.0).to_numpy().astype(np.float64))
    r_std = np.nan_to_num(df["ratio_std"].fill_null(0.0).to_numpy().astype(np.float64))
    return _stack_aggregate(cpu_sum, mem_sum, n_bins, r_mean, r_std)


def aggregate_from_values(values: np.ndarray) -> np.ndarray:
    """`AGGREGATE_FEATURES` of (n, 2, L) series taken as whole windows (same definition as `series_matrix`)."""
    cpu, mem = values[:, 0], values[:, 1]
    has_cpu = cpu > 0
    ratio = np.where(has_cpu, mem / np.where(has_cpu, cpu, 1.0), 0.0)
    count = has_cpu.sum(axis=1)
    safe = np.maximum(count, 1)
    r_mean = ratio.sum(axis=1) / safe
    r_var = np.where(has_cpu, (ratio - r_mean[:, None]) ** 2, 0.0).sum(axis=1) / safe
    n_bins = np.full(values.shape[0], float(values.shape[2]))
    return _stack_aggregate(cpu.sum(axis=1), mem.sum(axis=1), n_bins, r_mean, np.sqrt(r_var))


def _stack_aggregate(cpu_sum, mem_sum, n_bins, r_mean, r_std) -> np.ndarray:
    n_bins_safe = np.maximum(n_bins, 1.0)
    r_norm = np.divide(r_std, r_mean, out=np.zeros_like(r_std), where=r_mean > 0)
    cols = [
        cpu_sum * BIN_SECONDS,
        cpu_sum / n_bins_safe,
        mem_sum * BIN_SECONDS,
        mem_sum / n_bins_safe,
        n_bins * BIN_SECONDS,
        r_mean,
        r_std,
        r_norm,
    ]
    return np.column_stack([np.asarray(c, dtype=np.float64) for c in cols]).reshape(len(n_bins), -1)


# temporal features


@dataclass(frozen=True)
class TemporalConfig:
    """Which temporal features (TVW-RL 'Temporal Features', tsfresh names) are computed per resource."""

    lags: tuple[int, ...] = (1, 12, 288)
    """Autocorrelation lags in bins: 5 min, 1 hour, 1 day. Lags >= the series length are left out."""
    agg_chunk_len: int = 12
    """Chunk length (bins) of tsfresh's agg_linear_trend (f_agg="mean", attr="slope"): hourly means."""
    block_rows: int = 1024
    """Workloads processed per numpy block; bounds temporary memory to a few block-sized arrays."""


def temporal_feature_names(length: int, cfg: TemporalConfig) -> tuple[list[str], list[str]]:
    """Names of the temporal feature columns for series of `length` bins, and notes on left-out features."""
    notes: list[str] = []
    lags = [lag for lag in cfg.lags if lag < length]
    for lag in sorted(set(cfg.lags) - set(lags)):
        notes.append(f"autocorrelation lag {lag} left out: series length {length} bins <= lag")
    per_res = [f"autocorrelation__lag_{lag}" for lag in lags] + ["linear_trend__slope"]
    if cfg.agg_chunk_len < length:
        per_res.append(f"agg_linear_trend__slope__chunk_len_{cfg.agg_chunk_len}__mean")
    else:
        notes.append(f"agg_linear_trend left out: chunk_len {cfg.agg_chunk_len} >= series length {length}")
    per_res += ["mean", "mean_abs_change", "standard_deviation"]
    return [f"{r}__{name}" for r in RESOURCES for name in per_res], notes


def temporal_features(values: np.ndarray, cfg: TemporalConfig = TemporalConfig()) -> np.ndarray:
    """Raw (not normalised) temporal features of (n, 2, L) series: (n, len(temporal_feature_names)).

    Column order follows `temporal_feature_names`. Values equal tsfresh's calculators except that a
    constant series gets autocorrelation 0 (tsfresh: NaN)."""
    n, n_res, length = values.shape
    names, _ = temporal_feature_names(length, cfg)
    out = np.empty((n, len(names)))
    per_res = len(names) // n_res
    for lo in range(0, n, cfg.block_rows):
        block = values[lo : lo + cfg.block_rows]
        for r in range(n_res):
            out[lo : lo + len(block), r * per_res : (r + 1) * per_res] = _series_features(block[:, r], cfg)
    return out


def _series_features(x: np.ndarray, cfg: TemporalConfig) -> np.ndarray:
    """Temporal features of (b, L) univariate series, columns as in `temporal_feature_names`."""
    length = x.shape[1]
    mean = x.mean(axis=1)
    centred = x - mean[:, None]
    var = (centred**2).mean(axis=1)
    is_const = np.sqrt(var) <= CONSTANT_STD
    safe_var = np.where(is_const, 1.0, var)
    cols = []
    for lag in (lag for lag in cfg.lags if lag < length):
        # tsfresh autocorrelation: sum_t (x_t - mu)(x_{t+lag} - mu) / ((L - lag) * var)
        cov = np.einsum("ij,ij->i", centred[:, : length - lag], centred[:, lag:]) / (length - lag)
        cols.append(np.where(is_const, 0.0, cov / safe_var))
    cols.append(_slope(x))
    if cfg.agg_chunk_len < length:
        cols.append(_slope(_chunk_means(x, cfg.agg_chunk_len)))
    cols.append(mean)
    cols.append(np.abs(np.diff(x, axis=1)).mean(axis=1))
    cols.append(np.sqrt(var))
    return np.column_stack(cols)


def _slope(y: np.ndarray) -> np.ndarray:
    """Least-squares slope of each row of (b, m) against 0..m-1 (scipy.stats.linregress's slope)."""
    m = y.shape[1]
    t = np.arange(m, dtype=np.float64) - (m - 1) / 2.0
    return (y @ t) / (t @ t)


def _chunk_means(x: np.ndarray, chunk_len: int) -> np.ndarray:
    """Means of consecutive chunks of `chunk_len` columns; the last chunk may be shorter (as tsfresh)."""
    length = x.shape[1]
    starts = np.arange(0, length, chunk_len)
    counts = np.diff(np.append(starts, length))
    return np.add.reduceat(x, starts, axis=1) / counts


# normalisation and distances


def minmax_normalise(features: np.ndarray) -> np.ndarray:
    """Scale each column to [0, 1] across workloads; a column with a single value becomes all 0."""
    if features.shape[0] == 0:
        return features.astype(np.float64)
    lo = features.min(axis=0)
    span = features.max(axis=0) - lo
    return np.divide(features - lo, span, out=np.zeros(features.shape), where=span > 0)


def euclidean_distances(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Pairwise Euclidean distances between the rows of `a` and of `b` (default `a`); exact 0 on equal rows."""
    return cdist(a, a if b is None else b, metric="euclidean")
