"""Equivalence classes (ECs) of long-running workloads (TVW-RL, "Workload Equivalence-Class (EC) Mapping").

Three distances, each clustered for k = k_min..k_max with the best of n_init initialisations, and k chosen by
the highest mean silhouette (TVW-RL "Implementation", Table 1):

- "aggregate": Euclidean on min-max normalised aggregate features (Zhang et al. 2011 baseline); K-Means++.
- "temporal": Euclidean on min-max normalised temporal features (tsfresh names); K-Means++.
- "dtw": DTW of z-normalised series, per resource, averaged over CPU and memory; K-Medoids with random
  medoid initialisation (our own alternating PAM-style implementation below, no GPL package).

Silhouettes come from ONE precomputed distance matrix per method (on a seeded sample when n is large), not
recomputed per k. For n > DtwConfig.exact_max_n the DTW medoids are found on a seeded sample and every
workload is assigned to its nearest medoid (DTW to the medoids only).
"""

from __future__ import annotations

import io
import time
import warnings as pywarnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from numba import njit, prange
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from threadpoolctl import threadpool_limits

from pipelines.features import (
    SeriesSet,
    TemporalConfig,
    euclidean_distances,
    minmax_normalise,
    temporal_feature_names,
    temporal_features,
)

EC_SILHOUETTE = {
    "source": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "silhouette": pl.Float64,  # mean silhouette; null when skipped
    "n_workloads": pl.Int64,  # workloads clustered
    "n_silhouette_points": pl.Int64,  # workloads the silhouette was computed on (a seeded sample when large)
    "is_skipped": pl.Boolean,
    "skip_reason": pl.String,  # null unless is_skipped
}
"""`ec__silhouette`: one row per (method, k)."""

EC_ASSIGNMENTS = {
    "source": pl.String,
    "workload_id": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "ec_label": pl.Int64,  # 0..k-1, 0 = largest EC
}
"""`ec__assignments`: the EC of every workload for one (method, k)."""

EC_PROFILES = {
    "source": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "ec_label": pl.Int64,
    "step": pl.Int64,  # bin index from the start of the kept window
    "cpu_frac": pl.Float64,
    "mem_frac": pl.Float64,
    "n_members": pl.Int64,
}
"""`ec__profiles`: each EC's representative series (DTW: its medoid; K-Means methods: the members' mean)."""


@dataclass(frozen=True)
class DtwConfig:
    """How DTW distances are computed and, for many workloads, approximated."""

    window_frac: float | None = None
    """Sakoe-Chiba radius as a fraction of the (downsampled) length; None = full DTW (the paper)."""
    downsample: int = 1
    """Average non-overlapping blocks of this many bins before DTW (1 = none)."""
    exact_max_n: int = 500
    """Up to this many workloads, the full n x n DTW matrix is computed and clustered."""
    sample_size: int = 300
    """Above exact_max_n: medoids are found on a seeded random sample of this many workloads."""
    seed: int = 0
    """Seed of that sample."""


@dataclass(frozen=True)
class EcConfig:
    """EC sweep configuration; defaults are TVW-RL's (k 3..15, best of 50 initialisations)."""

    k_min: int = 3
    """Smallest number of ECs tried."""
    k_max: int = 15
    """Largest number of ECs tried."""
    n_init: int = 50
    """Initialisations per k (K-Means++ seeds, or random medoid sets); the lowest-cost one is kept."""
    methods: tuple[str, ...] = ("aggregate", "temporal", "dtw")
    """Distances to sweep, keys of EC_METHODS."""
    seed: int = 0
    """Seed of every random choice (K-Means, medoid initialisation, silhouette sample)."""
    series_length: int | None = None
    """Passed to features.series_matrix: None = truncate to the shortest kept window."""
    silhouette_sample_size: int = 2000
    """Silhouette on a seeded sample of this many workloads when there are more (one matrix per method)."""
    kmedoids_max_iter: int = 100
    """Cap on assign/update rounds of one K-Medoids run."""
    kmeans_threads: int | None = 1
    """OpenMP threads of K-Means; None = library default. Small fits on a busy 2-core machine ran 20x
    slower with the default (threads spin-waiting), so one thread is the default."""
    temporal: TemporalConfig = field(default_factory=TemporalConfig)
    """Which temporal features are used."""
    dtw: DtwConfig = field(default_factory=DtwConfig)
    """How DTW distances are computed."""


@dataclass(frozen=True)
class EcSweep:
    """Result of sweeping k for every method on one source's workloads."""

    source: str
    workload_ids: np.ndarray  # (n,) in SeriesSet order; labels below are aligned with it
    silhouette: pl.DataFrame  # EC_SILHOUETTE rows of all methods
    labels: dict[str, dict[int, np.ndarray]]  # method -> k -> (n,) int labels
    medoids: dict[str, dict[int, np.ndarray]]  # "dtw" -> k -> (k,) workload indices, in label order
    best_k: dict[str, int | None]  # method -> k with the highest silhouette (None: every k skipped)
    warnings: list[str]  # things the asset should log (skipped k, left-out features)
    notes: list[str]  # how each method was computed (sampling, length policy)
    counts: dict[str, int]
    timings_s: dict[str, float]


@dataclass
class _MethodResult:
    rows: list[dict] = field(default_factory=list)
    labels: dict[int, np.ndarray] = field(default_factory=dict)
    medoids: dict[int, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# DTW


@njit(nogil=True, cache=False)
def _dtw_pair(x, y, radius):
    """DTW of two equal-length 1-d series: sqrt of the least sum of squared differences along a warping path
    with |i - j| <= radius (tslearn's definition). Two rolling rows: O(L) memory, O(L * radius) time."""
    n = x.shape[0]
    prev = np.full(n + 1, np.inf)
    cur = np.full(n + 1, np.inf)
    prev[0] = 0.0
    for i in range(1, n + 1):
        lo = max(1, i - radius)
        hi = min(n, i + radius)
        cur[lo - 1] = np.inf  # left of the band (and column 0) is unreachable; clears a stale value
        for j in range(lo, hi + 1):
            d = x[i - 1] - y[j - 1]
            best = prev[j - 1]
            if prev[j] < best:
                best = prev[j]
            if cur[j - 1] < best:
                best = cur[j - 1]
            cur[j] = d * d + best
        prev, cur = cur, prev
    return np.sqrt(prev[n])


@njit(parallel=True, nogil=True, cache=False)
def _dtw_pairs(a, b, ia, ib, radius):
    out = np.empty(ia.shape[0])
    for p in prange(ia.shape[0]):
        out[p] = _dtw_pair(a[ia[p]], b[ib[p]], radius)
    return out


def prepare_dtw(values: np.ndarray, cfg: DtwConfig) -> np.ndarray:
    """(n, 2, L) usage -> (n, 2, L // downsample) block means, z-normalised per series (constant -> zeros).

    z-normalisation makes DTW compare shapes, and makes CPU and memory distances comparable before they
    are averaged ("normalised DTW distances")."""
    n, n_res, length = values.shape
    ds = max(1, cfg.downsample)
    m = length // ds
    x = values[:, :, : m * ds].reshape(n, n_res, m, ds).mean(axis=3)
    mean = x.mean(axis=2, keepdims=True)
    std = x.std(axis=2, keepdims=True)
    return np.divide(x - mean, std, out=np.zeros_like(x), where=std > 1e-12)


def _radius(length: int, cfg: DtwConfig) -> int:
    return length if cfg.window_frac is None else max(1, int(np.ceil(cfg.window_frac * length)))


def dtw_cross(a: np.ndarray, b: np.ndarray, cfg: DtwConfig) -> np.ndarray:
    """(n_a, n_b) DTW distances between prepared series (see `prepare_dtw`), mean over resources.

    Each resource's DTW is divided by sqrt(length), an RMS aligned difference, so values do not depend on
    the downsampling."""
    n_a, n_res, length = a.shape
    ia, ib = (g.ravel() for g in np.meshgrid(np.arange(n_a), np.arange(b.shape[0]), indexing="ij"))
    total = np.zeros(ia.shape[0])
    for r in range(n_res):
        ar, br = np.ascontiguousarray(a[:, r]), np.ascontiguousarray(b[:, r])
        total += _dtw_pairs(ar, br, ia, ib, _radius(length, cfg))
    return (total / (n_res * np.sqrt(max(length, 1)))).reshape(n_a, b.shape[0])


def dtw_matrix(a: np.ndarray, cfg: DtwConfig) -> np.ndarray:
    """Symmetric (n, n) DTW distance matrix of prepared series (upper triangle computed once)."""
    n, n_res, length = a.shape
    iu, ju = np.triu_indices(n, k=1)
    total = np.zeros(iu.shape[0])
    for r in range(n_res):
        ar = np.ascontiguousarray(a[:, r])
        total += _dtw_pairs(ar, ar, iu, ju, _radius(length, cfg))
    d = np.zeros((n, n))
    d[iu, ju] = total / (n_res * np.sqrt(max(length, 1)))
    return d + d.T


# K-Medoids


def fit_kmedoids(
    dist: np.ndarray, k: int, n_init: int, rng: np.random.Generator, max_iter: int = 100
) -> tuple[np.ndarray, np.ndarray, float]:
    """Best of `n_init` alternating K-Medoids runs on a precomputed (n, n) distance matrix.

    Each run starts from k distinct random points (Kaufmann & Rousseeuw's medoids, random initialisation as in
    TVW-RL), then alternates: assign every point to its nearest medoid; make each cluster's medoid the member
    with the least summed distance to the other members; until the total cost stops falling.
    Returns (medoids (k,), labels (n,), total cost), the lowest-cost run.
    """
    n = dist.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k-medoids needs 1 <= k <= n; got k={k}, n={n}")
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for _ in range(n_init):
        medoids = rng.choice(n, size=k, replace=False)
        labels, cost = _assign(dist, medoids)
        for _ in range(max_iter):
            new = _update_medoids(dist, labels, k)
            new_labels, new_cost = _assign(dist, new)
            if new_cost >= cost - 1e-12 * max(cost, 1.0):
                break
            medoids, labels, cost = new, new_labels, new_cost
        if best is None or cost < best[2]:
            best = (medoids, labels, cost)
    return best


def _assign(dist: np.ndarray, medoids: np.ndarray) -> tuple[np.ndarray, float]:
    labels = np.argmin(dist[:, medoids], axis=1)
    # a medoid always labels itself (ties with a duplicate point would otherwise empty its cluster)
    labels[medoids] = np.arange(len(medoids))
    return labels, float(dist[np.arange(len(labels)), medoids[labels]].sum())


def _update_medoids(dist: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    member = np.zeros((len(labels), k))
    member[np.arange(len(labels)), labels] = 1.0
    within = dist @ member  # within[i, c] = summed distance from point i to the members of cluster c
    within[member == 0] = np.inf  # only members are candidates
    return np.argmin(within, axis=0)


# sweeps


def _relabel(labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Renumber clusters by size (0 = largest, ties: lowest first member); returns (labels, old-of-new)."""
    n = len(labels)
    sizes = np.bincount(labels, minlength=k)
    first = np.full(k, n)
    np.minimum.at(first, labels, np.arange(n))
    order = np.lexsort((first, -sizes))
    new_of_old = np.empty(k, dtype=np.int64)
    new_of_old[order] = np.arange(k)
    return new_of_old[labels], order


def _silhouette_sample(n: int, cfg: EcConfig) -> np.ndarray:
    if n <= cfg.silhouette_sample_size:
        return np.arange(n)
    rng = np.random.default_rng([cfg.seed, 1])
    return np.sort(rng.choice(n, size=cfg.silhouette_sample_size, replace=False))


def _n_distinct(points: np.ndarray) -> int:
    return int(np.unique(points.reshape(len(points), -1), axis=0).shape[0]) if len(points) else 0


def _skip_reason(n: int, n_distinct: int, k: int) -> str | None:
    if n <= k:
        return f"n_workloads {n} <= k {k}: silhouette needs more workloads than clusters"
    if n_distinct < k:
        return f"only {n_distinct} distinct workload(s) < k {k}: silhouette undefined"
    return None


def _score(dist: np.ndarray, labels: np.ndarray) -> tuple[float | None, str | None]:
    n_labels = len(np.unique(labels))
    if not 2 <= n_labels <= len(labels) - 1:
        return None, f"{n_labels} cluster(s) among {len(labels)} silhouette points: silhouette undefined"
    return float(silhouette_score(dist, labels, metric="precomputed")), None


def _row(method: str, k: int, n: int, n_sil: int, score: float | None, reason: str | None) -> dict:
    return {
        "method": method,
        "k": k,
        "silhouette": score,
        "n_workloads": n,
        "n_silhouette_points": n_sil,
        "is_skipped": reason is not None,
        "skip_reason": reason,
    }


def sweep_kmeans(features: np.ndarray, method: str, cfg: EcConfig) -> _MethodResult:
    """K-Means++ (best of n_init) for every k on min-max normalised features; silhouette on one matrix."""
    out = _MethodResult()
    x = minmax_normalise(features)
    n = len(x)
    sample = _silhouette_sample(n, cfg)
    dist = euclidean_distances(x[sample])
    n_distinct = _n_distinct(x)
    if len(sample) < n:
        out.notes.append(f"{method}: silhouette on a seeded sample of {len(sample)} of {n} workloads")
    for k in range(cfg.k_min, cfg.k_max + 1):
        reason = _skip_reason(n, n_distinct, k)
        score = None
        if reason is None:
            km = KMeans(n_clusters=k, init="k-means++", n_init=cfg.n_init, random_state=cfg.seed)
            with pywarnings.catch_warnings(), threadpool_limits(cfg.kmeans_threads, user_api="openmp"):
                pywarnings.simplefilter("ignore")  # ties at k close to n_distinct; counted via _score
                labels = km.fit_predict(x)
            out.labels[k], _ = _relabel(labels, k)
            score, reason = _score(dist, out.labels[k][sample])
        if reason is not None:
            out.warnings.append(f"{method} k={k} skipped: {reason}")
        out.rows.append(_row(method, k, n, len(sample), score, reason))
    return out


def sweep_aggregate(series: SeriesSet, cfg: EcConfig) -> _MethodResult:
    """The Zhang et al. (2011) aggregate-feature baseline."""
    return sweep_kmeans(series.aggregate, "aggregate", cfg)


def sweep_temporal(series: SeriesSet, cfg: EcConfig) -> _MethodResult:
    """TVW-RL's temporal features (tsfresh definitions, numpy implementation)."""
    _, notes = temporal_feature_names(series.length, cfg.temporal)
    out = sweep_kmeans(temporal_features(series.values, cfg.temporal), "temporal", cfg)
    out.warnings[:0] = [f"temporal: {note}" for note in notes]
    return out


def sweep_dtw(series: SeriesSet, cfg: EcConfig) -> _MethodResult:
    """K-Medoids on DTW distances; exact for n <= exact_max_n, else medoids from a sample."""
    out = _MethodResult()
    prepared = prepare_dtw(series.values, cfg.dtw)
    n = series.n
    fit = np.arange(n)
    if n > cfg.dtw.exact_max_n:
        rng = np.random.default_rng([cfg.dtw.seed, 2])
        fit = np.sort(rng.choice(n, size=min(cfg.dtw.sample_size, n), replace=False))
        out.notes.append(
            f"dtw: {n} workloads > exact_max_n {cfg.dtw.exact_max_n}: medoids and silhouette on a seeded "
            f"sample of {len(fit)}; every workload assigned to its nearest medoid"
        )
    out.notes.append(
        f"dtw: z-normalised series, downsample {cfg.dtw.downsample}, length {prepared.shape[2]}, "
        f"window {'full' if cfg.dtw.window_frac is None else cfg.dtw.window_frac}"
    )
    dist = dtw_matrix(prepared[fit], cfg.dtw)
    n_distinct = _n_distinct(prepared[fit])
    rng = np.random.default_rng([cfg.seed, 3])
    fitted: dict[int, np.ndarray] = {}
    for k in range(cfg.k_min, cfg.k_max + 1):
        reason = _skip_reason(len(fit), n_distinct, k)
        score = None
        if reason is None:
            medoids, labels, _ = fit_kmedoids(dist, k, cfg.n_init, rng, cfg.kmedoids_max_iter)
            fitted[k] = fit[medoids]
            score, reason = _score(dist, labels)
        if reason is not None:
            out.warnings.append(f"dtw k={k} skipped: {reason}")
        out.rows.append(_row("dtw", k, n, len(fit), score, reason))
    _assign_all(prepared, fit, fitted, cfg, out)
    return out


def _assign_all(
    prepared: np.ndarray, fit: np.ndarray, fitted: dict[int, np.ndarray], cfg: EcConfig, out: _MethodResult
) -> None:
    """Every workload to its nearest medoid; DTW is computed once to the union of all k's medoids."""
    if not fitted:
        return
    union = np.unique(np.concatenate(list(fitted.values())))
    to_union = dtw_cross(prepared, prepared[union], cfg.dtw)
    for k, medoids in fitted.items():
        cols = np.searchsorted(union, medoids)
        labels = np.argmin(to_union[:, cols], axis=1)
        labels[medoids] = np.arange(k)
        out.labels[k], order = _relabel(labels, k)
        out.medoids[k] = medoids[order]


EC_METHODS: dict[str, Callable[[SeriesSet, EcConfig], _MethodResult]] = {
    "aggregate": sweep_aggregate,
    "temporal": sweep_temporal,
    "dtw": sweep_dtw,
}
"""Distance methods by name: each sweeps k and returns silhouette rows and per-k labels."""


def sweep_methods(series: SeriesSet, source: str, cfg: EcConfig = EcConfig()) -> EcSweep:
    """Cluster `series` with every method in cfg.methods for k = k_min..k_max and pick k by silhouette."""
    unknown = [m for m in cfg.methods if m not in EC_METHODS]
    if unknown:
        raise ValueError(f"unknown EC method(s) {unknown}; known: {sorted(EC_METHODS)}")
    rows, labels, medoids, warns, timings = [], {}, {}, [], {}
    notes = [f"series: {series.n} workloads, {series.length} bins ({series.length_note})"]
    for method in cfg.methods:
        t0 = time.perf_counter()
        res = EC_METHODS[method](series, cfg)
        timings[method] = time.perf_counter() - t0
        rows += res.rows
        labels[method], medoids[method] = res.labels, res.medoids
        warns += res.warnings
        notes += res.notes
    sil = (
        pl.DataFrame([{"source": source, **r} for r in rows], schema=EC_SILHOUETTE, orient="row")
        if rows
        else pl.DataFrame(schema=EC_SILHOUETTE)
    )
    return EcSweep(
        source=source,
        workload_ids=series.workload_ids,
        silhouette=sil,
        labels=labels,
        medoids=medoids,
        best_k=best_k(sil),
        warnings=warns,
        notes=notes,
        counts=_counts(series, sil),
        timings_s=timings,
    )


def best_k(sil: pl.DataFrame) -> dict[str, int | None]:
    """Per method, the k with the highest silhouette (smallest k on ties); None when every k was skipped."""
    out: dict[str, int | None] = {}
    for method in sil["method"].unique(maintain_order=True).to_list():
        ok = sil.filter((pl.col("method") == method) & ~pl.col("is_skipped"))
        out[method] = (
            int(ok.sort(["silhouette", "k"], descending=[True, False])["k"][0]) if ok.height else None
        )
    return out


def _counts(series: SeriesSet, sil: pl.DataFrame) -> dict[str, int]:
    const = series.is_constant
    counts = {
        "n_workloads": series.n,
        "n_series_skipped": series.skipped.height,
        "n_constant_cpu": int(const[:, 0].sum()),
        "n_constant_mem": int(const[:, 1].sum()),
        "n_k_skipped": int(sil["is_skipped"].sum()) if sil.height else 0,
    }
    for reason, n in series.skipped.group_by("reason").len().iter_rows():
        counts[f"n_series_skipped_{reason}"] = int(n)
    return counts


# frames


def assignments_frame(sweep: EcSweep, method: str, k: int) -> pl.DataFrame:
    """`ec__assignments` rows of one (method, k)."""
    labels = _labels_of(sweep, method, k)
    return pl.DataFrame(
        {
            "source": [sweep.source] * len(labels),
            "workload_id": sweep.workload_ids.tolist(),
            "method": [method] * len(labels),
            "k": [k] * len(labels),
            "ec_label": labels.astype(np.int64),
        },
        schema=EC_ASSIGNMENTS,
    )


def profiles_frame(sweep: EcSweep, series: SeriesSet, method: str, k: int) -> pl.DataFrame:
    """`ec__profiles` rows of one (method, k): the medoid's series (dtw) or the members' mean series."""
    labels = _labels_of(sweep, method, k)
    sizes = np.bincount(labels, minlength=k)
    medoids = sweep.medoids.get(method, {}).get(k)
    if medoids is not None:
        rep = series.values[medoids]
    else:
        sums = np.zeros((k, 2, series.length))
        np.add.at(sums, labels, series.values)
        rep = sums / np.maximum(sizes, 1)[:, None, None]
    length = series.length
    return pl.DataFrame(
        {
            "source": [sweep.source] * (k * length),
            "method": [method] * (k * length),
            "k": [k] * (k * length),
            "ec_label": np.repeat(np.arange(k), length),
            "step": np.tile(np.arange(length), k),
            "cpu_frac": rep[:, 0].ravel(),
            "mem_frac": rep[:, 1].ravel(),
            "n_members": np.repeat(sizes, length),
        },
        schema=EC_PROFILES,
    )


def _labels_of(sweep: EcSweep, method: str, k: int) -> np.ndarray:
    labels = sweep.labels.get(method, {}).get(k)
    if labels is None:
        have = {m: sorted(d) for m, d in sweep.labels.items()}
        raise KeyError(f"no labels for method {method!r}, k={k} in source {sweep.source!r}; have {have}")
    return labels


# plots


def plot_silhouette(sil: pl.DataFrame) -> bytes:
    """PNG: mean silhouette against k, one line per (source, method), the chosen k starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ok = sil.filter(~pl.col("is_skipped")).sort("k")
    for (source, method), part in ok.group_by(["source", "method"], maintain_order=True):
        line = ax.plot(part["k"], part["silhouette"], marker="o", label=f"{source} {method}")[0]
        top = part.sort("silhouette", descending=True).row(0, named=True)
        ax.plot([top["k"]], [top["silhouette"]], marker="*", markersize=14, color=line.get_color())
    ax.set_xlabel("k (number of ECs)")
    ax.set_ylabel("mean silhouette")
    ax.grid(alpha=0.3)
    if ok.height:
        ax.legend(fontsize=8)
    return _png(fig)


def plot_profiles(profiles: pl.DataFrame) -> bytes:
    """PNG: each EC's representative CPU and memory series; one column per (method, k), one row per EC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = profiles.partition_by(["method", "k"], maintain_order=True, as_dict=True)
    n_rows = max([int(g["ec_label"].max()) + 1 for g in groups.values()] or [1])
    fig, axes = plt.subplots(
        n_rows, max(len(groups), 1), figsize=(4 * max(len(groups), 1), 1.6 * n_rows), squeeze=False
    )
    for col, ((method, k), g) in enumerate(groups.items()):
        for label, part in g.sort("step").group_by("ec_label", maintain_order=True):
            ax = axes[int(label[0]), col]
            ax.plot(part["step"], part["cpu_frac"], label="cpu_frac", lw=0.8)
            ax.plot(part["step"], part["mem_frac"], label="mem_frac", lw=0.8)
            ax.set_title(f"{method} k={k} EC {label[0]} (n={part['n_members'][0]})", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
