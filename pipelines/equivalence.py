"""Equivalence classes (ECs) of long-running workloads (TVW-RL, "Workload Equivalence-Class (EC) Mapping").

Three distances, each clustered for k = k_min..k_max with n_init initialisations, and k chosen by the highest
silhouette averaged over the initialisations (TVW-RL "Implementation": "k corresponding to maximum average
silhouette over 50 different initializations was selected"); the labels kept for a k are those of the
lowest-cost initialisation:

- "aggregate": Euclidean on min-max normalised aggregate features (Zhang et al. 2011 baseline); K-Means++.
- "temporal": Euclidean on min-max normalised temporal features (tsfresh names); K-Means++.
- "dtw": DTW of z-normalised series (shape only: each series' own mean and std are removed, so usage LEVEL is
  ignored; the aggregate and temporal methods see levels), per resource, averaged over CPU and memory;
  K-Medoids (Kaufman & Rousseeuw) with random medoid initialisation, alternating assign/update steps followed
  by the PAM swap phase (FasterPAM's O(n^2) pass, Schubert & Rousseeuw 2021) until no swap lowers the cost,
  so every kept medoid set is a local optimum of the total distance.

No test data: every method sees only the TRAINING PART of each series (its first `train_frac` of bins,
`SeriesSet.training_parts`); the rest is the held-out window the prediction-gain proxy scores forecasters on.
All three methods use the same window. Series may differ in length (whole kept runs): the features are
length-independent and DTW aligns series of different lengths.

Silhouettes come from ONE precomputed distance matrix per method (on a seeded sample when n is large), not
recomputed per k. For n > DtwConfig.exact_max_n the DTW medoids are found on a seeded sample and every
workload is assigned to its nearest medoid (DTW to the medoids only). `ari_across_seeds` re-clusters with other
seeds (other initialisations and, when sampled, another sample) and reports the adjusted Rand index.
"""

from __future__ import annotations

import io
import time
import warnings as pywarnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl
from numba import njit, prange
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from threadpoolctl import threadpool_limits

from pipelines.features import (
    SeriesSet,
    TemporalConfig,
    aggregate_of,
    euclidean_distances,
    minmax_normalise,
    series_from_arrays,
    temporal_feature_names,
    temporal_features_of,
)
from pipelines.progress import Progress

EC_SILHOUETTE = {
    "source": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "silhouette": pl.Float64,  # mean silhouette averaged over the n_init initialisations; null when skipped
    "silhouette_sd": pl.Float64,  # standard deviation of the mean silhouette over the initialisations
    "silhouette_kept": pl.Float64,  # mean silhouette of the kept (lowest-cost) initialisation's labels
    "n_init": pl.Int64,  # initialisations the mean and sd are over
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

EC_SWEEP_LABELS = {
    "source": pl.String,
    "workload_id": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "ec_label": pl.Int64,
    "is_medoid": pl.Boolean,
}
"""`ec__sweep_labels`: the kept labels of every k a method clustered (skipped k have none), in series order; DTW
marks each EC's medoid."""
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
"""`ec__profiles`: each EC's representative series (DTW: its medoid's whole series; K-Means methods: the
members' mean over the bins every member has, i.e. as long as the EC's shortest series)."""


@dataclass(frozen=True)
class DtwConfig:
    """How DTW distances are computed and, for many workloads, approximated."""

    window_frac: float | None = None
    """Sakoe-Chiba radius as a fraction of the (downsampled) length; None = full DTW (the paper). For series of
    different lengths the band follows the diagonal from (0, 0) to (end, end)."""
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
    """EC sweep configuration; defaults are TVW-RL's (k 3..15, 50 initialisations)."""

    k_min: int = 3
    """Smallest number of ECs tried."""
    k_max: int = 15
    """Largest number of ECs tried."""
    n_init: int = 50
    """Initialisations per k (K-Means++ seeds, or random medoid sets): the silhouette is averaged over them and
    the lowest-cost one's labels are kept."""
    methods: tuple[str, ...] = ("aggregate", "temporal", "dtw")
    """Distances to sweep, keys of EC_METHODS."""
    seed: int = 0
    """Seed of every random choice (K-Means, medoid initialisation, silhouette sample)."""
    train_frac: float = 0.7
    """Leading fraction of every series the clustering sees (the rest is the proxy's evaluation window)."""
    silhouette_sample_size: int = 2000
    """Silhouette on a seeded sample of this many workloads when there are more (one matrix per method)."""
    kmedoids_max_iter: int = 100
    """Cap on assign/update rounds (and on swap passes) of one K-Medoids run."""
    kmeans_threads: int | None = 1
    """OpenMP and BLAS threads of the sweep (K-Means, distance products, silhouettes); None = library default.
    Small fits on a busy 2-core machine ran 10-20x slower with the default (threads spin-waiting), so one
    thread is the default."""
    temporal: TemporalConfig = field(default_factory=TemporalConfig)
    """Which temporal features are used."""
    dtw: DtwConfig = field(default_factory=DtwConfig)
    """How DTW distances are computed."""

    def __post_init__(self) -> None:
        if not 0.0 < self.train_frac <= 1.0:
            raise ValueError(f"train_frac must be in (0, 1]; got {self.train_frac}")
        if self.n_init < 1 or self.k_min < 2 or self.k_max < self.k_min:
            raise ValueError(f"need n_init >= 1 and 2 <= k_min <= k_max; got {self}")


@dataclass(frozen=True)
class EcSweep:
    """Result of sweeping k for every method on one source's workloads."""

    source: str
    workload_ids: np.ndarray  # (n,) in SeriesSet order; labels below are aligned with it
    silhouette: pl.DataFrame  # EC_SILHOUETTE rows of all methods
    labels: dict[str, dict[int, np.ndarray]]  # method -> k -> (n,) int labels
    medoids: dict[str, dict[int, np.ndarray]]  # "dtw" -> k -> (k,) workload indices, in label order
    best_k: dict[str, int | None]  # method -> k with the highest mean silhouette (None: every k skipped)
    warnings: list[str]  # things the asset should log (skipped k, left-out features)
    notes: list[str]  # how each method was computed (window, sampling, length policy)
    counts: dict[str, int]
    timings_s: dict[str, float]
    # method -> what it clustered: normalised features, or DTW's (prepared, lengths, fitted rows, distances)
    inputs: dict[str, np.ndarray | tuple] = field(default_factory=dict)


@dataclass
class _MethodResult:
    rows: list[dict] = field(default_factory=list)
    labels: dict[int, np.ndarray] = field(default_factory=dict)
    medoids: dict[int, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs: np.ndarray | tuple | None = None


# DTW


@njit(nogil=True, cache=False)
def _dtw_pair(x, nx, y, ny, radius):
    """DTW of x[:nx] and y[:ny]: sqrt of the least sum of squared differences along a warping path (tslearn's
    definition) inside a band of `radius` cells around the diagonal from (0, 0) to (nx-1, ny-1) (for equal
    lengths: |i - j| <= radius, Sakoe-Chiba). Two rolling rows: O(ny) memory, O(nx * radius) time."""
    prev = np.full(ny + 1, np.inf)
    cur = np.full(ny + 1, np.inf)
    prev[0] = 0.0
    slope = ny / nx
    # the band must let a path step from row to row: at least the diagonal's slope wide
    r = max(radius, int(np.ceil(slope)))
    stale_lo, stale_hi = 1, 0  # cells of the `cur` buffer written two rows back (cleared before reuse)
    prev_lo, prev_hi = 0, 0  # cells of `prev` written by the previous row (row 0: the origin only)
    for i in range(1, nx + 1):
        centre = i * slope
        lo = max(1, int(np.ceil(centre - r)))
        hi = min(ny, int(np.floor(centre + r)))
        for j in range(stale_lo, stale_hi + 1):
            cur[j] = np.inf
        for j in range(lo, hi + 1):
            d = x[i - 1] - y[j - 1]
            best = prev[j - 1]
            if prev[j] < best:
                best = prev[j]
            if cur[j - 1] < best:
                best = cur[j - 1]
            cur[j] = d * d + best
        prev, cur = cur, prev
        stale_lo, stale_hi = prev_lo, prev_hi
        prev_lo, prev_hi = lo, hi
    return np.sqrt(prev[ny])


@njit(parallel=True, nogil=True, cache=False)
def _dtw_pairs(a, la, b, lb, ia, ib, window_frac):
    out = np.empty(ia.shape[0])
    for p in prange(ia.shape[0]):
        nx, ny = la[ia[p]], lb[ib[p]]
        longest = max(nx, ny)
        radius = longest if window_frac < 0 else max(1, int(np.ceil(window_frac * longest)))
        out[p] = _dtw_pair(a[ia[p]], nx, b[ib[p]], ny, radius) / np.sqrt(0.5 * (nx + ny))
    return out


def prepare_dtw(values: np.ndarray, cfg: DtwConfig) -> np.ndarray:
    """(n, 2, L) usage -> (n, 2, L // downsample) block means, z-normalised per series (constant -> zeros).

    z-normalisation makes DTW compare shapes (each series' level and spread are removed), and makes CPU and
    memory distances comparable before they are averaged ("normalised DTW distances")."""
    n, n_res, length = values.shape
    ds = max(1, cfg.downsample)
    m = length // ds
    x = values[:, :, : m * ds].reshape(n, n_res, m, ds).mean(axis=3)
    mean = x.mean(axis=2, keepdims=True)
    std = x.std(axis=2, keepdims=True)
    return np.divide(x - mean, std, out=np.zeros_like(x), where=std > 1e-12)


def prepare_dtw_series(series: list[np.ndarray], cfg: DtwConfig) -> tuple[np.ndarray, np.ndarray]:
    """`prepare_dtw` of series of any lengths: (packed (n, 2, M_max) zero-padded, lengths (n,) after
    downsampling). A series shorter than one block keeps one point."""
    lengths = np.array([max(1, s.shape[1] // max(1, cfg.downsample)) for s in series], dtype=np.int64)
    packed = np.zeros((len(series), 2, int(lengths.max(initial=1))))
    for i, s in enumerate(series):
        ds = max(1, min(cfg.downsample, s.shape[1]))
        packed[i, :, : lengths[i]] = prepare_dtw(s[None, :, : lengths[i] * ds], DtwConfig(downsample=ds))[0]
    return packed, lengths


def _lengths(a: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    return np.full(a.shape[0], a.shape[2], dtype=np.int64) if lengths is None else lengths.astype(np.int64)


def _frac(cfg: DtwConfig) -> float:
    return -1.0 if cfg.window_frac is None else float(cfg.window_frac)


def dtw_cross(
    a: np.ndarray,
    b: np.ndarray,
    cfg: DtwConfig,
    lengths_a: np.ndarray | None = None,
    lengths_b: np.ndarray | None = None,
) -> np.ndarray:
    """(n_a, n_b) DTW distances between prepared series (see `prepare_dtw`), mean over resources.

    Each resource's DTW is divided by sqrt of the mean of the two lengths, an RMS aligned difference, so values
    do not depend on the downsampling or on how long the series are. `lengths_*`: series lengths when padded."""
    la, lb = _lengths(a, lengths_a), _lengths(b, lengths_b)
    ia, ib = (g.ravel() for g in np.meshgrid(np.arange(a.shape[0]), np.arange(b.shape[0]), indexing="ij"))
    total = np.zeros(ia.shape[0])
    for r in range(a.shape[1]):
        ar, br = np.ascontiguousarray(a[:, r]), np.ascontiguousarray(b[:, r])
        total += _dtw_pairs(ar, la, br, lb, ia, ib, _frac(cfg))
    return (total / a.shape[1]).reshape(a.shape[0], b.shape[0])


def dtw_matrix(a: np.ndarray, cfg: DtwConfig, lengths: np.ndarray | None = None) -> np.ndarray:
    """Symmetric (n, n) DTW distance matrix of prepared series (upper triangle computed once)."""
    n = a.shape[0]
    la = _lengths(a, lengths)
    iu, ju = np.triu_indices(n, k=1)
    total = np.zeros(iu.shape[0])
    for r in range(a.shape[1]):
        ar = np.ascontiguousarray(a[:, r])
        total += _dtw_pairs(ar, la, ar, la, iu, ju, _frac(cfg))
    d = np.zeros((n, n))
    d[iu, ju] = total / a.shape[1]
    return d + d.T


# K-Medoids


def fit_kmedoids(
    dist: np.ndarray, k: int, n_init: int, rng: np.random.Generator, max_iter: int = 100
) -> tuple[np.ndarray, np.ndarray, float]:
    """Best of `n_init` K-Medoids runs on a precomputed (n, n) distance matrix.

    Returns (medoids (k,), labels (n,), total cost) of the lowest-cost run; see `kmedoids_runs`."""
    runs = kmedoids_runs(dist, k, n_init, rng, max_iter)
    return min(runs, key=lambda r: r[2])


def kmedoids_runs(
    dist: np.ndarray, k: int, n_init: int, rng: np.random.Generator, max_iter: int = 100
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """`n_init` K-Medoids runs, each from k distinct random points (random initialisation as in TVW-RL):
    alternate (assign every point to its nearest medoid; make each cluster's medoid the member with the least
    summed distance to the others) until the cost stops falling, then the PAM swap phase (`pam_swap`) until no
    swap of a medoid with a non-medoid lowers the cost. Each run's medoids are a local optimum."""
    n = dist.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k-medoids needs 1 <= k <= n; got k={k}, n={n}")
    runs = []
    for _ in range(n_init):
        medoids = rng.choice(n, size=k, replace=False)
        labels, cost = _assign(dist, medoids)
        for _ in range(max_iter):
            new = _update_medoids(dist, labels, k)
            new_labels, new_cost = _assign(dist, new)
            if new_cost >= cost - 1e-12 * max(cost, 1.0):
                break
            medoids, labels, cost = new, new_labels, new_cost
        medoids = pam_swap(dist, medoids, max_iter)
        labels, cost = _assign(dist, medoids)
        runs.append((medoids, labels, cost))
    return runs


def pam_swap(dist: np.ndarray, medoids: np.ndarray, max_passes: int = 100) -> np.ndarray:
    """PAM's swap phase with FasterPAM's O(n^2) pass (Schubert & Rousseeuw 2021): for each non-medoid x, the
    cost change of swapping x with every medoid at once from the nearest/second-nearest caches; the best
    improving swap is made at once. Stops after a pass with no improving swap: a local optimum."""
    if len(medoids) >= dist.shape[0] or len(medoids) < 1:
        return np.asarray(medoids, dtype=np.int64)
    return _pam_swap(
        np.ascontiguousarray(dist, dtype=np.float64), medoids.astype(np.int64).copy(), max_passes
    )


@njit(cache=False)
def _nearest_two(dist, medoids):
    n, k = dist.shape[0], medoids.shape[0]
    n1 = np.zeros(n, dtype=np.int64)
    d1 = np.full(n, np.inf)
    d2 = np.full(n, np.inf)
    for o in range(n):
        for m in range(k):
            d = dist[o, medoids[m]]
            if d < d1[o]:
                d2[o] = d1[o]
                d1[o] = d
                n1[o] = m
            elif d < d2[o]:
                d2[o] = d
    return n1, d1, d2


@njit(cache=False)
def _removal_loss(n1, d1, d2, k):
    loss = np.zeros(k)
    for o in range(n1.shape[0]):
        loss[n1[o]] += d2[o] - d1[o]
    return loss, d1.sum()


@njit(cache=False)
def _pam_swap(dist, medoids, max_passes):
    n, k = dist.shape[0], medoids.shape[0]
    is_medoid = np.zeros(n, dtype=np.bool_)
    for m in range(k):
        is_medoid[medoids[m]] = True
    n1, d1, d2 = _nearest_two(dist, medoids)
    loss, cost = _removal_loss(n1, d1, d2, k)
    for _ in range(max_passes):
        swapped = False
        for x in range(n):
            if is_medoid[x]:
                continue
            # removal loss of each medoid, corrected for the points that x would take over
            delta = loss.copy()
            shared = 0.0
            for o in range(n):
                dox = dist[o, x]
                if dox < d1[o]:
                    shared += dox - d1[o]
                    delta[n1[o]] += d1[o] - d2[o]
                elif dox < d2[o]:
                    delta[n1[o]] += dox - d2[o]
            best = 0
            for m in range(1, k):
                if delta[m] < delta[best]:
                    best = m
            if delta[best] + shared < -1e-12 * max(cost, 1.0):
                is_medoid[medoids[best]] = False
                medoids[best] = x
                is_medoid[x] = True
                n1, d1, d2 = _nearest_two(dist, medoids)
                loss, cost = _removal_loss(n1, d1, d2, k)
                swapped = True
        if not swapped:
            break
    return medoids


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


# silhouette


def silhouette_from_distances(dist: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Rousseeuw 1987) of `labels` on a precomputed distance matrix; equals scikit-learn's
    `silhouette_score(metric="precomputed")` (a point alone in its cluster scores 0), computed with one
    matrix product. Needs 2 <= number of clusters <= n - 1."""
    _, y = np.unique(labels, return_inverse=True)
    n, k = len(y), int(y.max()) + 1
    if not 2 <= k <= n - 1:
        raise ValueError(f"silhouette needs 2 <= clusters <= n - 1; got {k} clusters of {n} points")
    member = np.zeros((n, k))
    member[np.arange(n), y] = 1.0
    sums = dist @ member
    sizes = member.sum(axis=0)
    rows = np.arange(n)
    own = sizes[y]
    a = sums[rows, y] / np.maximum(own - 1.0, 1.0)
    mean_other = sums / sizes[None, :]
    mean_other[rows, y] = np.inf
    b = mean_other.min(axis=1)
    denom = np.maximum(a, b)
    s = np.divide(b - a, denom, out=np.zeros(n), where=denom > 0)
    s[own == 1] = 0.0
    return float(s.mean())


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


def _score(dist: np.ndarray, labels: np.ndarray) -> float | None:
    n_labels = len(np.unique(labels))
    return silhouette_from_distances(dist, labels) if 2 <= n_labels <= len(labels) - 1 else None


def _row(
    method: str,
    k: int,
    n: int,
    n_sil: int,
    scores: list[float | None],
    kept: float | None,
    n_init: int,
    reason: str | None,
) -> dict:
    ok = [s for s in scores if s is not None]
    if reason is None and not ok:
        reason = f"every initialisation gave fewer than 2 clusters among {n_sil} silhouette points"
    return {
        "method": method,
        "k": k,
        "silhouette": float(np.mean(ok)) if ok and reason is None else None,
        "silhouette_sd": float(np.std(ok)) if ok and reason is None else None,
        "silhouette_kept": kept if reason is None else None,
        "n_init": n_init,
        "n_workloads": n,
        "n_silhouette_points": n_sil,
        "is_skipped": reason is not None,
        "skip_reason": reason,
    }


_METHOD_CODE = {"aggregate": 1, "temporal": 2, "dtw": 3}


def _init_seeds(cfg: EcConfig, seed: int, method: str, k: int) -> np.ndarray:
    return np.random.default_rng([seed, _METHOD_CODE.get(method, 0), k]).integers(0, 2**31 - 1, cfg.n_init)


def kmeans_runs(
    x: np.ndarray, k: int, cfg: EcConfig, seed: int, method: str
) -> list[tuple[np.ndarray, float]]:
    """`n_init` K-Means++ fits (one initialisation each, seeds drawn from `seed`): (labels, inertia) each."""
    out = []
    with pywarnings.catch_warnings(), threadpool_limits(cfg.kmeans_threads, user_api="openmp"):
        pywarnings.simplefilter("ignore")  # ties at k close to n_distinct; counted via _score
        for s in _init_seeds(cfg, seed, method, k):
            km = KMeans(n_clusters=k, init="k-means++", n_init=1, random_state=int(s)).fit(x)
            out.append((km.labels_.astype(np.int64), float(km.inertia_)))
    return out


def sweep_kmeans(
    features: np.ndarray, method: str, cfg: EcConfig, progress: Progress | None = None
) -> _MethodResult:
    """K-Means++ for every k on min-max normalised features: n_init single-initialisation fits, silhouette of
    each on one distance matrix (mean and sd reported), labels of the lowest-inertia fit kept."""
    out = _MethodResult()
    x = minmax_normalise(features)
    out.inputs = x
    n = len(x)
    sample = _silhouette_sample(n, cfg)
    dist = euclidean_distances(x[sample])
    n_distinct = _n_distinct(x)
    if len(sample) < n:
        out.notes.append(f"{method}: silhouette on a seeded sample of {len(sample)} of {n} workloads")
    for k in range(cfg.k_min, cfg.k_max + 1):
        reason = _skip_reason(n, n_distinct, k)
        scores, kept = [], None
        if reason is None:
            runs = kmeans_runs(x, k, cfg, cfg.seed, method)
            scores = [_score(dist, labels[sample]) for labels, _ in runs]
            best = min(range(len(runs)), key=lambda i: runs[i][1])
            labels = runs[best][0]
            kept = scores[best]
            if len(np.unique(labels)) == k:
                out.labels[k], _ = _relabel(labels, k)
            else:
                reason = f"the lowest-cost fit has {len(np.unique(labels))} < k non-empty clusters"
        row = _row(method, k, n, len(sample), scores, kept, cfg.n_init, reason)
        if row["is_skipped"]:
            out.labels.pop(k, None)
            out.warnings.append(f"{method} k={k} skipped: {row['skip_reason']}")
        out.rows.append(row)
        _advance(progress)
    return out


def _advance(progress: Progress | None) -> None:
    if progress is not None:
        progress.advance()


def series_notes(series: SeriesSet, cfg: EcConfig) -> list[str]:
    """What every method clusters: how many series, their lengths, and the clustering window."""
    return [f"series: {series.n} workloads, {series.length_note}", _window_note(series, cfg)]


def _window_note(series: SeriesSet, cfg: EcConfig) -> str:
    train = series.training_bins(cfg.train_frac)
    span = f"{int(train.min())}..{int(train.max())}" if len(train) else "0"
    return (
        f"clustering window (all methods): the first {cfg.train_frac:g} of each series ({span} bins); "
        f"the rest is the prediction-gain proxy's held-out window and is never clustered"
    )


def method_features(series: SeriesSet, method: str, cfg: EcConfig) -> np.ndarray:
    """The raw features a K-Means method clusters (before min-max normalisation), from each series' training
    part: Zhang et al.'s aggregates ("aggregate") or TVW-RL's temporal features ("temporal")."""
    parts = series.training_parts(cfg.train_frac)
    if method == "aggregate":
        return aggregate_of(parts)
    if method == "temporal":
        return temporal_features_of(parts, cfg.temporal)
    raise ValueError(f"{method!r} is not a K-Means method; K-Means methods: aggregate, temporal")


def sweep_aggregate(series: SeriesSet, cfg: EcConfig, progress: Progress | None = None) -> _MethodResult:
    """The Zhang et al. (2011) aggregate-feature baseline, on each series' training part."""
    return sweep_kmeans(method_features(series, "aggregate", cfg), "aggregate", cfg, progress)


def sweep_temporal(series: SeriesSet, cfg: EcConfig, progress: Progress | None = None) -> _MethodResult:
    """TVW-RL's temporal features (tsfresh definitions, numpy implementation), on each series' training part."""
    parts = series.training_parts(cfg.train_frac)
    _, notes = temporal_feature_names(min(p.shape[1] for p in parts), cfg.temporal)
    out = sweep_kmeans(method_features(series, "temporal", cfg), "temporal", cfg, progress)
    out.warnings[:0] = [f"temporal: {note}" for note in notes]
    return out


def _dtw_fit_sample(n: int, cfg: EcConfig, seed: int) -> np.ndarray:
    if n <= cfg.dtw.exact_max_n:
        return np.arange(n)
    rng = np.random.default_rng([seed, 2])
    return np.sort(rng.choice(n, size=min(cfg.dtw.sample_size, n), replace=False))


def sweep_dtw(series: SeriesSet, cfg: EcConfig, progress: Progress | None = None) -> _MethodResult:
    """K-Medoids on DTW distances of the training parts; exact for n <= exact_max_n, else medoids from a sample."""
    out = _MethodResult()
    prepared, lengths = prepare_dtw_series(series.training_parts(cfg.train_frac), cfg.dtw)
    out.inputs = (prepared, lengths)
    n = series.n
    fit = _dtw_fit_sample(n, cfg, cfg.dtw.seed)
    if len(fit) < n:
        out.notes.append(
            f"dtw: {n} workloads > exact_max_n {cfg.dtw.exact_max_n}: medoids and silhouette on a seeded "
            f"sample of {len(fit)}; every workload assigned to its nearest medoid"
        )
    out.notes.append(
        f"dtw: z-normalised series (shape only, usage level ignored), downsample {cfg.dtw.downsample}, "
        f"length {int(lengths.min()) if len(lengths) else 0}..{int(lengths.max(initial=0))} points, "
        f"window {'full' if cfg.dtw.window_frac is None else cfg.dtw.window_frac}, PAM swap phase"
    )
    dist = dtw_matrix(prepared[fit], cfg.dtw, lengths[fit])
    out.inputs = (prepared, lengths, fit, dist)
    n_distinct = _n_distinct(np.where(dist < 1e-12, 0.0, 1.0)) if len(fit) else 0
    fitted: dict[int, np.ndarray] = {}
    for k in range(cfg.k_min, cfg.k_max + 1):
        reason = _skip_reason(len(fit), n_distinct, k)
        scores, kept = [], None
        if reason is None:
            rng = np.random.default_rng([cfg.seed, 3, k])
            runs = kmedoids_runs(dist, k, cfg.n_init, rng, cfg.kmedoids_max_iter)
            scores = [_score(dist, labels) for _, labels, _ in runs]
            best = min(range(len(runs)), key=lambda i: runs[i][2])
            fitted[k] = fit[runs[best][0]]
            kept = scores[best]
        row = _row("dtw", k, n, len(fit), scores, kept, cfg.n_init, reason)
        if row["is_skipped"]:
            fitted.pop(k, None)
            out.warnings.append(f"dtw k={k} skipped: {row['skip_reason']}")
        out.rows.append(row)
        _advance(progress)
    _assign_all(prepared, lengths, fitted, cfg, out)
    return out


def _assign_all(
    prepared: np.ndarray,
    lengths: np.ndarray,
    fitted: dict[int, np.ndarray],
    cfg: EcConfig,
    out: _MethodResult,
) -> None:
    """Every workload to its nearest medoid; DTW is computed once to the union of all k's medoids."""
    if not fitted:
        return
    union = np.unique(np.concatenate(list(fitted.values())))
    to_union = dtw_cross(prepared, prepared[union], cfg.dtw, lengths, lengths[union])
    for k, medoids in fitted.items():
        labels = _nearest(to_union, union, medoids)
        out.labels[k], order = _relabel(labels, k)
        out.medoids[k] = medoids[order]


def _nearest(to_union: np.ndarray, union: np.ndarray, medoids: np.ndarray) -> np.ndarray:
    cols = np.searchsorted(union, medoids)
    labels = np.argmin(to_union[:, cols], axis=1)
    labels[medoids] = np.arange(len(medoids))
    return labels


EC_METHODS: dict[str, Callable[[SeriesSet, EcConfig, Progress | None], _MethodResult]] = {
    "aggregate": sweep_aggregate,
    "temporal": sweep_temporal,
    "dtw": sweep_dtw,
}
"""Distance methods by name: each sweeps k and returns silhouette rows and per-k labels; it advances the
progress (when given) once per k."""


def sweep_methods(
    series: SeriesSet,
    source: str,
    cfg: EcConfig = EcConfig(),
    log: Callable[[str], None] | None = None,
) -> EcSweep:
    """Cluster the training parts of `series` with every method in cfg.methods for k = k_min..k_max and pick
    k by mean silhouette. `log` receives progress lines, one item per (method, k)."""
    unknown = [m for m in cfg.methods if m not in EC_METHODS]
    if unknown:
        raise ValueError(f"unknown EC method(s) {unknown}; known: {sorted(EC_METHODS)}")
    rows, labels, medoids, warns, timings, inputs = [], {}, {}, [], {}, {}
    notes = series_notes(series, cfg)
    n_k = cfg.k_max - cfg.k_min + 1
    progress = Progress(len(cfg.methods) * n_k, f"{source} EC sweep", log=log, unit="(method, k)")
    for method in cfg.methods:
        t0 = time.perf_counter()
        with threadpool_limits(cfg.kmeans_threads):
            res = EC_METHODS[method](series, cfg, progress)
        timings[method] = time.perf_counter() - t0
        rows += res.rows
        labels[method], medoids[method] = res.labels, res.medoids
        inputs[method] = res.inputs
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
        inputs=inputs,
    )


def best_k(sil: pl.DataFrame) -> dict[str, int | None]:
    """Per method, the k with the highest mean silhouette (smallest k on ties); None when every k was skipped."""
    out: dict[str, int | None] = {}
    for method in sil["method"].unique(maintain_order=True).to_list():
        ok = sil.filter((pl.col("method") == method) & ~pl.col("is_skipped"))
        out[method] = (
            int(ok.sort(["silhouette", "k"], descending=[True, False])["k"][0]) if ok.height else None
        )
    return out


# stability across seeds


def ari_across_seeds(
    series: SeriesSet, sweep: EcSweep, method: str, k: int, cfg: EcConfig, n_seeds: int
) -> list[float]:
    """Adjusted Rand index between the kept labels of (method, k) and the labels the same method gives with
    each of `n_seeds` other seeds (cfg.seed + 1, ...): other initialisations and, for sampled DTW, another
    sample. 1 = identical partitions, about 0 = chance agreement."""
    return ari_of_labels(sweep.labels[method][k], sweep.inputs[method], method, k, cfg, n_seeds)


def ari_of_labels(
    main: np.ndarray, inputs: np.ndarray | tuple, method: str, k: int, cfg: EcConfig, n_seeds: int
) -> list[float]:
    """`ari_across_seeds` of the labels `main` of (method, k), given what the method clustered (`inputs`:
    `EcSweep.inputs[method]`, or `method_inputs`)."""
    with threadpool_limits(cfg.kmeans_threads):
        out = [_ari_one(inputs, method, k, cfg, cfg.seed + s, main) for s in range(1, n_seeds + 1)]
    return out


def method_inputs(series: SeriesSet, method: str, cfg: EcConfig) -> np.ndarray | tuple:
    """What `method`'s sweep clustered, computed again (deterministic: equal to `EcSweep.inputs[method]`):
    the min-max normalised features of a K-Means method, or DTW's (prepared series, lengths, fitted rows,
    distance matrix). The DTW matrix is the expensive part; it is only computed when the ARI reuses it (every
    workload fitted, no sample), else it is None."""
    if method != "dtw":
        return minmax_normalise(method_features(series, method, cfg))
    prepared, lengths = prepare_dtw_series(series.training_parts(cfg.train_frac), cfg.dtw)
    fit = _dtw_fit_sample(series.n, cfg, cfg.dtw.seed)
    dist = dtw_matrix(prepared[fit], cfg.dtw, lengths[fit]) if len(fit) == series.n else None
    return prepared, lengths, fit, dist


def _ari_one(inputs, method: str, k: int, cfg: EcConfig, seed: int, main: np.ndarray) -> float:
    if method == "dtw":
        labels = _dtw_labels(inputs, k, cfg, seed)
    else:
        runs = kmeans_runs(inputs, k, cfg, seed, method)
        labels = min(runs, key=lambda r: r[1])[0]
    return float(adjusted_rand_score(main, labels))


def _dtw_labels(inputs: tuple, k: int, cfg: EcConfig, seed: int) -> np.ndarray:
    prepared, lengths, fit_main, dist_main = inputs
    fit = _dtw_fit_sample(len(lengths), cfg, cfg.dtw.seed + seed - cfg.seed)
    is_same = len(fit) == len(fit_main) and np.array_equal(fit, fit_main)  # exact: every workload, one matrix
    dist = (
        dist_main if is_same and dist_main is not None else dtw_matrix(prepared[fit], cfg.dtw, lengths[fit])
    )
    medoids, _, _ = fit_kmedoids(
        dist, k, cfg.n_init, np.random.default_rng([seed, 3, k]), cfg.kmedoids_max_iter
    )
    medoids = fit[medoids]
    union = np.sort(medoids)
    to_union = dtw_cross(prepared, prepared[union], cfg.dtw, lengths, lengths[union])
    return _nearest(to_union, union, medoids)


# stability over time

TIME_STABILITY = {
    "method": pl.String,
    "k": pl.Int64,
    "ari_time_halves": pl.Float64,
    "ari_time_halves_shuffled_95": pl.Float64,
}
"""Per (method, k): ARI between the clusterings of the two halves of every workload's window, and the 95th
percentile of that ARI with one half's labels shuffled over the workloads (what chance agreement reaches)."""


def time_halves(series: SeriesSet) -> tuple[SeriesSet, SeriesSet]:
    """The first and the second half of each workload's series (its whole kept window, or the window used): two
    SeriesSets of the same workloads in the same order; an odd middle bin is left out."""
    halves = []
    for first in (True, False):
        parts = [
            s[:, : s.shape[1] // 2] if first else s[:, s.shape[1] - s.shape[1] // 2 :]
            for s in series.series_list()
        ]
        lengths = np.array([p.shape[1] for p in parts], dtype=np.int64)
        values = np.zeros((series.n, 2, int(lengths.max(initial=1))))
        for i, p in enumerate(parts):
            values[i, :, : p.shape[1]] = p
        halves.append(series_from_arrays(series.workload_ids, values, np.maximum(lengths, 1)))
    return halves[0], halves[1]


def time_stability(
    series: SeriesSet, method: str, ks: list[int], cfg: EcConfig, n_shuffles: int = 200
) -> pl.DataFrame:
    """TIME_STABILITY rows of `method` at every k in `ks`: the method clusters the first half and, separately,
    the second half of every workload's window (the whole half: `train_frac` 1, the same k, initialisations
    and seed as the sweep), and the ARI between the two labelings says whether a workload stays in its class
    over time (1: the same partition; about 0: unrelated). The reference is the 95th percentile of the ARI
    after `n_shuffles` seeded shuffles of the second half's labels. NaN where a half skips that k.

    The halves cover the held-out window the proxy scores, so this is a description of the classes, never an
    input of the clustering (the labels use only the training part)."""
    if not ks:
        return pl.DataFrame(schema=TIME_STABILITY)
    sub = replace(cfg, train_frac=1.0, k_min=min(ks), k_max=max(ks), methods=(method,))
    first, second = time_halves(series)
    with threadpool_limits(cfg.kmeans_threads):
        a, b = (EC_METHODS[method](half, sub, None).labels for half in (first, second))
    rng = np.random.default_rng([cfg.seed, 11, _METHOD_CODE.get(method, 0)])
    rows = []
    for k in ks:
        if k not in a or k not in b:
            rows.append((method, k, float("nan"), float("nan")))
            continue
        shuffled = [adjusted_rand_score(a[k], rng.permutation(b[k])) for _ in range(n_shuffles)]
        rows.append((method, k, float(adjusted_rand_score(a[k], b[k])), float(np.quantile(shuffled, 0.95))))
    return pl.DataFrame(rows, schema=TIME_STABILITY, orient="row")


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


def sweep_labels_frame(sweep: EcSweep, method: str) -> pl.DataFrame:
    """`ec__sweep_labels` rows of one method's sweep: every k with labels, workloads in the series order."""
    frames = []
    for k in sorted(sweep.labels[method]):
        is_medoid = np.zeros(len(sweep.labels[method][k]), dtype=bool)
        medoids = sweep.medoids.get(method, {}).get(k)
        if medoids is not None:
            is_medoid[medoids] = True
        frames.append(
            assignments_frame(sweep, method, k).with_columns(is_medoid=pl.Series(is_medoid, dtype=pl.Boolean))
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=EC_SWEEP_LABELS)


def profiles_frame(sweep: EcSweep, series: SeriesSet, method: str, k: int) -> pl.DataFrame:
    """`ec__profiles` rows of one (method, k): the medoid's whole series (dtw) or the members' mean series over
    the bins every member has (K-Means methods)."""
    labels = _labels_of(sweep, method, k)
    return profiles_of(sweep.source, series, method, k, labels, sweep.medoids.get(method, {}).get(k))


def profiles_of(
    source: str, series: SeriesSet, method: str, k: int, labels: np.ndarray, medoids: np.ndarray | None
) -> pl.DataFrame:
    """`ec__profiles` rows of one mapping: `labels` (n,) in `series` order, `medoids` (k,) workload indices in
    label order (DTW) or None (the members' mean series)."""
    sizes = np.bincount(labels, minlength=k)
    reps = []
    for c in range(k):
        if medoids is not None:
            reps.append(series.values[medoids[c], :, : int(series.lengths[medoids[c]])])
        else:
            members = np.flatnonzero(labels == c)
            m = int(series.lengths[members].min()) if len(members) else 0
            reps.append(series.values[members, :, :m].mean(axis=0) if len(members) else np.zeros((2, 0)))
    steps = [r.shape[1] for r in reps]
    total = sum(steps)
    return pl.DataFrame(
        {
            "source": [source] * total,
            "method": [method] * total,
            "k": [k] * total,
            "ec_label": np.repeat(np.arange(k), steps),
            "step": np.concatenate([np.arange(m) for m in steps]) if total else np.zeros(0, np.int64),
            "cpu_frac": np.concatenate([r[0] for r in reps]) if total else np.zeros(0),
            "mem_frac": np.concatenate([r[1] for r in reps]) if total else np.zeros(0),
            "n_members": np.repeat(sizes, steps),
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


def plot_gain_and_stability(comparison: pl.DataFrame) -> bytes:
    """PNG: per method (one column), the median paired gain over the random control with its sign-test
    interval (top) and the time-stability ARI with its shuffled 95 % reference (bottom) against k; the rows
    that pass the Holm-corrected test are filled, the chosen one starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = comparison["method"].unique(maintain_order=True).to_list() or ["-"]
    fig, axes = plt.subplots(2, len(methods), figsize=(4 * len(methods), 5), squeeze=False, sharex="col")
    for col, method in enumerate(methods):
        part = comparison.filter(pl.col("method") == method).sort("k")
        top, bottom = axes[0, col], axes[1, col]
        if part.height:
            k = part["k"].to_numpy()
            med = part["eg_diff_pct_median"].to_numpy()
            lo = part["eg_diff_pct_median_ci_low"].to_numpy()
            hi = part["eg_diff_pct_median_ci_high"].to_numpy()
            top.fill_between(k, lo, hi, alpha=0.2)
            top.plot(k, med, marker="o", mfc="white")
            passed = (
                part["beats_control"].to_numpy()
                if "beats_control" in part.columns
                else np.zeros(len(k), bool)
            )
            top.plot(k[passed], med[passed], "o", color="C0")
            if "is_chosen" in part.columns and part["is_chosen"].any():
                chosen = part["is_chosen"].to_numpy()
                top.plot(k[chosen], med[chosen], "*", markersize=14, color="C3")
            if "ari_time_halves" in part.columns:
                bottom.plot(k, part["ari_time_halves"].to_numpy(), marker="o", label="halves")
                bottom.plot(k, part["ari_time_halves_shuffled_95"].to_numpy(), ls="--", label="shuffled 95 %")
        top.axhline(0.0, color="grey", lw=0.8)
        top.set_title(method, fontsize=9)
        top.set_ylabel("median EG - control (points)")
        bottom.set_ylabel("ARI first vs second half")
        bottom.set_xlabel("k")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
