"""Per-workload usage series and the features TVW-RL clusters them on.

Input: the canonical `USAGE` table (5-minute bins) and the `LONG_RUNNING` table (each workload's kept
contiguous window `run_start_s`, `n_run_bins`). Output: a `SeriesSet`, i.e. one (cpu_frac, mem_frac)
series per workload over its whole kept window (or a configured cap / common length), and two feature matrices
computed on any list of series (the EC clustering passes the training part of each series only):

- aggregate (Zhang et al. 2011 baseline, TVW-RL "EC Analysis"): totals and means of CPU and memory, duration,
  mean / std / normalised std of the memory-to-CPU ratio;
- temporal (TVW-RL "Temporal Features"): per resource autocorrelation at a few lags, linear trend, aggregated
  linear trend, mean, mean absolute change and std, computed with numpy on all series at once and equal to
  tsfresh's `feature_calculators` of the same names (tests/pipelines/test_features.py checks it).

Every feature is length-independent (means, per-bin changes, slopes per bin, autocorrelations at fixed lags),
so series of different lengths are compared directly. Both matrices are min-max normalised per column to [0, 1] before Euclidean distances are taken.
"""

from __future__ import annotations

from collections.abc import Iterator
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

BATCH_ROWS = 250_000
"""Usage rows `series_matrix` turns into numpy at a time: bounds its temporary memory (about 100 bytes a row)."""


@dataclass(frozen=True)
class SeriesSet:
    """Usage series of n workloads, each from the first bin of its kept window, of possibly different lengths.

    `values[i, 0, :lengths[i]]` is workload i's cpu_frac and `values[i, 1, :lengths[i]]` its mem_frac, one value
    per 5-minute bin; bins past `lengths[i]` are padding (0.0) and belong to no series. `n_run_bins[i]` is the
    full kept window in bins (`lengths[i]` is smaller only when a cap or a common length cut it);
    `aggregate[i]` holds the `AGGREGATE_FEATURES` over that full window (a description of the data; the EC
    clustering computes its own features from the training part of each series, see `training_parts`).
    """

    workload_ids: np.ndarray  # (n,) str
    values: np.ndarray  # (n, 2, L_max) float64, zero-padded past lengths[i]
    lengths: np.ndarray  # (n,) int64, bins of each series in `values`
    aggregate: np.ndarray  # (n, len(AGGREGATE_FEATURES)) float64
    skipped: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SKIP_SCHEMA))
    length_note: str = ""  # how the series lengths were chosen
    n_run_bins: np.ndarray | None = None  # (n,) int64 full kept windows; None = equal to lengths

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def length(self) -> int:
        """Longest series, in bins (the padded width of `values`)."""
        return int(self.values.shape[2])

    @property
    def is_ragged(self) -> bool:
        return bool(self.n and (self.lengths != self.length).any())

    def series_list(self) -> list[np.ndarray]:
        """Each workload's (2, lengths[i]) series, without padding (views into `values`)."""
        return [self.values[i, :, : int(m)] for i, m in enumerate(self.lengths)]

    def training_bins(self, train_frac: float) -> np.ndarray:
        """(n,) bins of each series' training part: its first floor(train_frac * lengths[i]) bins."""
        return np.floor(train_frac * self.lengths).astype(np.int64)

    def training_parts(self, train_frac: float) -> list[np.ndarray]:
        """Each workload's training part (2, training_bins[i]): the only bins the EC clustering may see;
        the rest of each series is the prediction-gain proxy's held-out evaluation window."""
        return [self.values[i, :, : int(m)] for i, m in enumerate(self.training_bins(train_frac))]

    @property
    def is_constant(self) -> np.ndarray:
        """(n, 2) bool: the series of that resource is constant (std <= CONSTANT_STD).

        Kept, not dropped. Features that divide by the std give 0 for it (autocorrelation, normalised std),
        and DTW z-normalisation turns it into all zeros."""
        return np.array([s.std(axis=1) <= CONSTANT_STD for s in self.series_list()]).reshape(self.n, 2)


# series


def series_from_arrays(
    workload_ids: list[str] | np.ndarray, values: np.ndarray, lengths: np.ndarray | None = None
) -> SeriesSet:
    """A `SeriesSet` from an (n, 2, L) array (tests, benchmarks); `lengths` (default: all L) marks series
    shorter than L, whose bins past their length must be padding."""
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
    lengths = np.full(n, length, dtype=np.int64) if lengths is None else np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (n,) or (lengths < 1).any() or (lengths > length).any():
        raise ValueError(f"lengths must be {n} values in 1..{length}; got {lengths.tolist()[:10]}")
    series = [values[i, :, :m] for i, m in enumerate(lengths)]
    note = f"all series {length} bins" if (lengths == length).all() else "series of different lengths"
    return SeriesSet(ids, values, lengths, aggregate_of(series), length_note=note, n_run_bins=lengths)


def series_matrix(
    usage: pl.DataFrame | pl.LazyFrame,
    long_running: pl.DataFrame | pl.LazyFrame,
    length: int | None,
    batch_rows: int = BATCH_ROWS,
    max_bins: int | None = None,
) -> SeriesSet:
    """Each long-running workload's (cpu_frac, mem_frac) series over its kept window.

    Each workload's kept window is [run_start_s, run_start_s + n_run_bins * BIN_SECONDS). A workload whose
    window has a missing bin, a duplicate bin, a null/NaN or a negative value is skipped and listed in
    `skipped` with the reason (checked over the whole window, which the aggregate features use).
    Length policy: `length=None` keeps the whole kept window of every workload (series of different lengths),
    cut to its first `max_bins` bins when `max_bins` is given; `length=L` cuts every series to its first L bins
    and skips windows shorter than L ("window_shorter_than_length").

    `usage` may be a DataFrame or a LazyFrame (e.g. a Parquet scan, best pre-filtered to these workloads); it
    is streamed `batch_rows` rows at a time (polars streaming engine) into numpy, which checks the windows, sums
    the aggregate features and fills a preallocated array by computed offsets, in one read. Memory: the
    output, one byte per kept-window bin, and a few batches (rows may come in any order).
    """
    if length is not None and length < 0:
        raise ValueError(f"length must be None or >= 0; got {length}")
    if max_bins is not None and max_bins < 1:
        raise ValueError(f"max_bins must be None or >= 1; got {max_bins}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1; got {batch_rows}")
    windows = _windows(long_running)
    rows = _usage_rows(usage)
    stats = _WindowStats(windows["n_run_bins"].to_numpy())
    run_bins = np.maximum(stats.n_run_bins, 0)
    if length is None:
        used = run_bins if max_bins is None else np.minimum(run_bins, max_bins)
    else:
        used = np.where(run_bins >= length, length, 0)
    slot = _slots(used > 0)
    width = int(used.max(initial=0)) if length is None else length
    buffer = np.zeros((int(slot.max(initial=-1)) + 1, 2, width))
    for idx, offset_s, cpu, mem in _window_batches(rows, windows, batch_rows):
        stats.add(idx, offset_s, cpu, mem)
        _place(buffer, slot[idx], offset_s, cpu, mem, used[idx])
    reasons = stats.reasons()
    if length is not None:
        reasons[(reasons == "ok") & (run_bins < length)] = "window_shorter_than_length"
    valid = np.flatnonzero(reasons == "ok")
    values = _compact(buffer, slot[valid])
    if length is None and int(used[valid].max(initial=0)) < width:  # the longest windows were skipped
        values = np.ascontiguousarray(values[:, :, : int(used[valid].max(initial=0))])
    ids = windows["workload_id"]
    return SeriesSet(
        workload_ids=ids.gather(valid).to_numpy().astype(str),
        values=values,
        lengths=used[valid].astype(np.int64),
        aggregate=stats.aggregate(valid),
        skipped=pl.DataFrame(
            {"workload_id": ids.filter(reasons != "ok"), "reason": reasons[reasons != "ok"].tolist()},
            schema=SKIP_SCHEMA,
        ),
        length_note=_length_note(length, max_bins, used[valid]),
        n_run_bins=stats.n_run_bins[valid].astype(np.int64),
    )


def _length_note(length: int | None, max_bins: int | None, used: np.ndarray) -> str:
    span = f"{int(used.min())}..{int(used.max())} bins" if len(used) else "no series"
    if length is not None:
        return f"first {length} bins of every kept window (configured length)"
    if max_bins is not None:
        return f"whole kept window, at most the first {max_bins} bins: {span}"
    return f"whole kept window: {span}"


def _windows(long_running: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """One row per workload, sorted by workload_id, with `idx` (its row) and its window's end `run_end_s`."""
    if isinstance(long_running, pl.LazyFrame):
        long_running = long_running.collect()
    lr = check_schema(long_running, LONG_RUNNING, "long_running")
    sources = lr["source"].unique().to_list()
    if len(sources) > 1:
        raise ValueError(
            f"long_running holds several sources {sorted(map(str, sources))}; call once per source"
        )
    dupes = lr.filter(pl.col("workload_id").is_duplicated())["workload_id"].unique().to_list()
    if dupes:
        raise ValueError(f"long_running lists workload(s) {dupes[:5]} more than once")
    no_window = lr.filter(pl.col("run_start_s").is_null() | pl.col("n_run_bins").is_null())
    if no_window.height:
        raise ValueError(
            f"long_running has a null run_start_s or n_run_bins for workload(s) "
            f"{no_window['workload_id'].head(5).to_list()}"
        )
    return lr.sort("workload_id").select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("idx"),
        "source",
        "workload_id",
        "run_start_s",
        "n_run_bins",
        (pl.col("run_start_s") + pl.col("n_run_bins") * BIN_SECONDS).alias("run_end_s"),
    )


def _usage_rows(usage: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """The USAGE columns series_matrix reads, cast to the contract; raises if a USAGE column is missing."""
    lazy = usage.lazy()
    names = lazy.collect_schema().names()
    missing = [c for c in USAGE if c not in names]
    if missing:
        raise ValueError(f"table 'usage' is missing column(s) {missing}; has {names}")
    cols = ("source", "workload_id", "bin_start_s", "cpu_frac", "mem_frac")
    return lazy.select([pl.col(c).cast(USAGE[c]) for c in cols])


def _window_batches(
    rows: pl.LazyFrame, windows: pl.DataFrame, batch_rows: int
) -> Iterator[tuple[np.ndarray, ...]]:
    """(idx, offset_s, cpu_frac, mem_frac) numpy arrays of the usage rows inside each window, in batches.

    `offset_s` is bin_start_s - run_start_s (>= 0, < run_end_s - run_start_s); a null value becomes NaN.
    Rows come in no particular order: callers place them by (idx, offset_s)."""
    plan = (
        rows.join(windows.lazy(), on=["source", "workload_id"], how="inner")
        .filter(
            (pl.col("bin_start_s") >= pl.col("run_start_s")) & (pl.col("bin_start_s") < pl.col("run_end_s"))
        )
        .select(
            "idx",
            (pl.col("bin_start_s") - pl.col("run_start_s")).alias("offset_s"),
            pl.col("cpu_frac").fill_null(np.nan),
            pl.col("mem_frac").fill_null(np.nan),
        )
    )
    for batch in plan.collect_batches(chunk_size=batch_rows, maintain_order=False):
        if batch.height:
            yield tuple(batch[c].to_numpy() for c in batch.columns)


class _WindowStats:
    """Per-workload counts and sums over the rows of its kept window, accumulated batch by batch."""

    def __init__(self, n_run_bins: np.ndarray) -> None:
        n = len(n_run_bins)
        self.n_run_bins = n_run_bins.astype(np.int64)
        width = np.maximum(self.n_run_bins, 0)
        self.first_bin = np.cumsum(width) - width  # windows laid end to end in `is_seen`
        self.is_seen = np.zeros(int(width.sum()), dtype=bool)  # one flag per bin of every window
        self.n_rows, self.n_bad, self.n_misaligned = (np.zeros(n, dtype=np.int64) for _ in range(3))
        self.cpu_sum, self.mem_sum = np.zeros(n), np.zeros(n)
        # memory-to-CPU ratio over bins with cpu_frac > 0: count, mean and sum of squared deviations
        self.ratio_n, self.ratio_mean, self.ratio_m2 = np.zeros(n), np.zeros(n), np.zeros(n)

    def add(self, idx: np.ndarray, offset_s: np.ndarray, cpu: np.ndarray, mem: np.ndarray) -> None:
        n = len(self.n_rows)
        self.n_rows += np.bincount(idx, minlength=n)
        is_bad = ~(cpu >= 0) | ~(mem >= 0)  # NaN compares False: null/NaN or negative
        self.n_bad += np.bincount(idx[is_bad], minlength=n)
        is_aligned = offset_s % BIN_SECONDS == 0
        self.n_misaligned += np.bincount(idx[~is_aligned], minlength=n)
        self.is_seen[self.first_bin[idx[is_aligned]] + offset_s[is_aligned] // BIN_SECONDS] = True
        self.cpu_sum += np.bincount(idx, weights=cpu, minlength=n)
        self.mem_sum += np.bincount(idx, weights=mem, minlength=n)
        has_cpu = cpu > 0
        self._add_ratios(idx[has_cpu], mem[has_cpu] / cpu[has_cpu])

    def _add_ratios(self, idx: np.ndarray, ratio: np.ndarray) -> None:
        """Merge a batch's per-workload ratio mean and squared deviations (Chan et al.'s pairwise update)."""
        n = len(self.n_rows)
        count = np.bincount(idx, minlength=n).astype(np.float64)
        mean = np.bincount(idx, weights=ratio, minlength=n) / np.maximum(count, 1.0)
        m2 = np.bincount(idx, weights=(ratio - mean[idx]) ** 2, minlength=n)
        total = self.ratio_n + count
        safe = np.maximum(total, 1.0)
        delta = mean - self.ratio_mean
        self.ratio_m2 += m2 + delta**2 * self.ratio_n * count / safe
        self.ratio_mean += delta * count / safe
        self.ratio_n = total

    def n_distinct_bins(self) -> np.ndarray:
        """Distinct on-grid bins seen per workload (0 for an empty window)."""
        # one window at a time: a vectorised reduceat would make an int64 copy of all of `is_seen`
        ends = self.first_bin + np.maximum(self.n_run_bins, 0)
        bounds = zip(self.first_bin.tolist(), ends.tolist(), strict=True)
        counts = [np.count_nonzero(self.is_seen[a:b]) for a, b in bounds]
        return np.array(counts, dtype=np.int64)

    def reasons(self) -> np.ndarray:
        """Per workload 'ok' or why it is skipped; the first failing check wins, in this order."""
        n_bins = self.n_distinct_bins()
        checks = [
            (self.n_run_bins < 1, "empty_window"),
            (self.n_rows == 0, "no_usage_in_window"),
            (self.n_bad > 0, "nan_or_negative_value"),
            (self.n_misaligned > 0, "bin_not_on_grid"),
            (self.n_rows > n_bins, "duplicate_bins"),
            (n_bins < self.n_run_bins, "missing_bins"),
        ]
        return np.select([c for c, _ in checks], [r for _, r in checks], default="ok").astype(object)

    def aggregate(self, rows: np.ndarray) -> np.ndarray:
        """`AGGREGATE_FEATURES` over the full kept windows of the workloads at `rows`."""
        r_n = self.ratio_n[rows]
        r_std = np.sqrt(self.ratio_m2[rows] / np.maximum(r_n, 1.0))
        n_bins = self.n_run_bins[rows].astype(np.float64)
        return _stack_aggregate(self.cpu_sum[rows], self.mem_sum[rows], n_bins, self.ratio_mean[rows], r_std)


def _slots(is_kept: np.ndarray) -> np.ndarray:
    """Row of each workload in a buffer holding only the kept ones, in order; -1 for the others."""
    slot = np.full(len(is_kept), -1, dtype=np.int64)
    slot[is_kept] = np.arange(int(is_kept.sum()))
    return slot


def _place(
    values: np.ndarray,
    slot: np.ndarray,
    offset_s: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    limit: np.ndarray,
) -> None:
    """Write each row into `values[slot, :, offset_s // BIN_SECONDS]`, skipping slot -1 and bins at or past
    the row's `limit` (its series length) or the array's end."""
    k = offset_s // BIN_SECONDS
    keep = (slot >= 0) & (k < np.minimum(limit, values.shape[2]))
    slot, k = slot[keep], k[keep]
    values[slot, 0, k] = cpu[keep]
    values[slot, 1, k] = mem[keep]


def _compact(buffer: np.ndarray, keep: np.ndarray, block: int = 256) -> np.ndarray:
    """`buffer[keep]` (keep ascending) built in place: rows move forward a block at a time, then it shrinks."""
    moved = np.flatnonzero(keep != np.arange(len(keep)))
    for lo in range(moved[0] if len(moved) else len(keep), len(keep), block):
        # keep[j] >= j, so a block's source rows are never overwritten by an earlier block
        rows = keep[lo : lo + block]
        buffer[lo : lo + len(rows)] = buffer[rows]
    buffer.resize((len(keep), *buffer.shape[1:]), refcheck=False)
    return buffer


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


def aggregate_of(series: list[np.ndarray]) -> np.ndarray:
    """`AGGREGATE_FEATURES` of series of any lengths (a list of (2, L_i) arrays), each taken as a whole window."""
    out = np.zeros((len(series), len(AGGREGATE_FEATURES)))
    for idx in _by_length(series):
        out[idx] = aggregate_from_values(np.stack([series[i] for i in idx]))
    return out


def _by_length(series: list[np.ndarray]) -> list[np.ndarray]:
    """Indices of the series grouped by length (vectorised work per group)."""
    lengths = np.array([s.shape[1] for s in series], dtype=np.int64)
    return [np.flatnonzero(lengths == m) for m in np.unique(lengths)]


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
    return np.column_stack([np.asarray(c, dtype=np.float64) for c in cols]).reshape(len(n_bins), len(cols))


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
    return _temporal_block(values, values.shape[2], cfg)


def temporal_features_of(series: list[np.ndarray], cfg: TemporalConfig = TemporalConfig()) -> np.ndarray:
    """Temporal features of series of any lengths (a list of (2, L_i) arrays); every feature is a per-bin or
    per-lag statistic, so series of different lengths are comparable. The columns are
    `temporal_feature_names(min L_i)`: a lag or chunk the shortest series cannot hold is left out for all."""
    shortest = min((s.shape[1] for s in series), default=0)
    names, _ = temporal_feature_names(shortest, cfg)
    out = np.zeros((len(series), len(names)))
    for idx in _by_length(series):
        out[idx] = _temporal_block(np.stack([series[i] for i in idx]), shortest, cfg)
    return out


def _temporal_block(values: np.ndarray, names_length: int, cfg: TemporalConfig) -> np.ndarray:
    """Temporal features of (n, 2, L) equal-length series, with the columns of `names_length`."""
    n, n_res, _ = values.shape
    names, _ = temporal_feature_names(names_length, cfg)
    out = np.empty((n, len(names)))
    per_res = len(names) // n_res
    for lo in range(0, n, cfg.block_rows):
        block = values[lo : lo + cfg.block_rows]
        for r in range(n_res):
            out[lo : lo + len(block), r * per_res : (r + 1) * per_res] = _series_features(
                block[:, r], cfg, names_length
            )
    return out


def _series_features(x: np.ndarray, cfg: TemporalConfig, names_length: int) -> np.ndarray:
    """Temporal features of (b, L) univariate series, columns as in `temporal_feature_names(names_length)`
    (names_length <= L: lags and chunks that fit the shortest series of a ragged set)."""
    length = x.shape[1]
    mean = x.mean(axis=1)
    centred = x - mean[:, None]
    var = (centred**2).mean(axis=1)
    is_const = np.sqrt(var) <= CONSTANT_STD
    safe_var = np.where(is_const, 1.0, var)
    cols = []
    for lag in (lag for lag in cfg.lags if lag < names_length):
        # tsfresh autocorrelation: sum_t (x_t - mu)(x_{t+lag} - mu) / ((L - lag) * var)
        cov = np.einsum("ij,ij->i", centred[:, : length - lag], centred[:, lag:]) / (length - lag)
        cols.append(np.where(is_const, 0.0, cov / safe_var))
    cols.append(_slope(x))
    if cfg.agg_chunk_len < names_length:
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
