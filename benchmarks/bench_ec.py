"""Timings of the EC pipeline (features, DTW, k sweep with silhouette, the prediction-gain forecasters) on seeded
synthetic usage series, and the projected cost of the full EC stage at paper scale.

    python benchmarks/bench_ec.py --n 1000
    python benchmarks/bench_ec.py --n 10000 --skip-dtw
    python benchmarks/bench_ec.py --n 10000 --only-series-matrix --usage-input both
    python benchmarks/bench_ec.py --project --n 2000 --length 6000 --dtw-downsample 24 --dtw-window 0.1 \
        --dtw-sample 400 --max-eval-bins 96
    python benchmarks/bench_ec.py --paper-forecaster --fc-windows 2048 --fc-threads 1 2

`--paper-forecaster` times one epoch of the forecaster at Lai et al.'s size (`models.forecaster.paper_scale`) on
--fc-windows training windows per torch thread count, and prints the time per window and epoch with the projected
cost of one global fit on --vms VMs of --vm-bins bins (84 x 8,640: the shared Bitbrains VMs) and of Table 1 at the
paper profile (every k 3..15 of 3 methods, 1 + --control-draws sides, --seeds seeds, --epochs epochs).

`--project` times each stage (process CPU seconds) at n workloads (series of --length bins, clustered on their first 70 %) and
projects it to --project-n workloads (default 10,000) of --length bins: the full EC stage of three methods,
k 3..15, --n-init initialisations, --seeds forecaster seeds with --control-draws random controls each, per method, with the
sampling / windowing / downsampling given (which the EC tables' metadata records in a real run).

Prints seconds per stage and peak memory (ru_maxrss); for series_matrix also the memory the call itself added
(Linux: peak RSS during the call, reset through /proc/self/clear_refs, minus RSS before it). Series: n workloads x 2 resources x --length bins,
a mix of daily sines, square waves, ramps and random walks with random levels, amplitudes and noise.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from models.forecaster import ForecasterConfig, fit_forecaster, predict_series
from pipelines.equivalence import (
    DtwConfig,
    EcConfig,
    dtw_cross,
    dtw_matrix,
    fit_kmedoids,
    kmeans_runs,
    kmedoids_runs,
    prepare_dtw,
    prepare_dtw_series,
    silhouette_from_distances,
    sweep_dtw,
    sweep_kmeans,
)
from pipelines.features import (
    TemporalConfig,
    aggregate_from_values,
    aggregate_of,
    euclidean_distances,
    minmax_normalise,
    series_from_arrays,
    series_matrix,
    temporal_features,
    temporal_features_of,
)
from pipelines.schemas import BIN_SECONDS, LONG_RUNNING, USAGE


def generate(n: int, length: int, seed: int) -> np.ndarray:
    """(n, 2, length) usage fractions in [0, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    kind = rng.integers(0, 4, size=n)
    level = rng.uniform(0.05, 0.6, size=(n, 2, 1))
    amp = rng.uniform(0.02, 0.3, size=(n, 2, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
    out = np.empty((n, 2, length))
    shapes = {
        0: lambda m: np.sin(2 * np.pi * t / 288 + phase[m]),
        1: lambda m: np.sign(np.sin(2 * np.pi * t / 576 + phase[m])),
        2: lambda m: np.broadcast_to(t / length - 0.5, (int(m.sum()), 1, length)),
        3: lambda m: np.cumsum(rng.standard_normal((int(m.sum()), 1, length)), axis=2) / np.sqrt(length),
    }
    for kd, shape in shapes.items():
        m = kind == kd
        out[m] = level[m] + amp[m] * shape(m)
    out += 0.01 * rng.standard_normal(out.shape)
    return np.clip(out, 0.0, 1.0)


def timed(label: str, fn, *args, **kwargs):
    t0 = time.perf_counter()
    res = fn(*args, **kwargs)
    print(f"{label:<58s} {time.perf_counter() - t0:9.2f} s", flush=True)
    return res


def usage_frames(values: np.ndarray) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A canonical USAGE / LONG_RUNNING pair whose kept windows hold exactly `values`."""
    n, _, length = values.shape
    ids = [f"w{i:06d}" for i in range(n)]
    usage = pl.DataFrame(
        {
            "source": "bench",
            "workload_id": np.repeat(np.array(ids), length),
            "bin_start_s": np.tile(np.arange(length) * BIN_SECONDS, n),
            "cpu_frac": values[:, 0].ravel(),
            "mem_frac": values[:, 1].ravel(),
            "n_samples": 1,
            "is_filled": False,
        }
    ).cast(USAGE)
    lr = pl.DataFrame(
        {c: None for c in LONG_RUNNING}
        | {"source": "bench", "workload_id": ids, "run_start_s": 0, "n_run_bins": length}
    ).cast(LONG_RUNNING)
    return usage, lr


def _rss_mib(field_name: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux); NaN elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the next peak is the call's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measured_series_matrix(label: str, usage, lr: pl.DataFrame, batch_rows: int | None):
    """series_matrix with seconds, RSS before, peak RSS during and the difference."""
    kwargs = {} if batch_rows is None else {"batch_rows": batch_rows}
    before = _rss_mib("VmRSS")
    _reset_peak_rss()
    s = timed(label, series_matrix, usage, lr, None, **kwargs)
    peak = _rss_mib("VmHWM")
    print(
        f"  RSS before {before:.0f} MiB, peak during {peak:.0f} MiB (+{peak - before:.0f} MiB); "
        f"output array {s.values.nbytes / 2**20:.0f} MiB"
    )
    return s


def bench_frames(values: np.ndarray, usage_input: str, batch_rows: int | None) -> None:
    """series_matrix on a canonical USAGE frame and/or a lazy scan of it written as Parquet chunks."""
    usage, lr = usage_frames(values)
    n_rows = usage.height
    if usage_input in ("frame", "both"):
        s = measured_series_matrix(f"series_matrix, USAGE DataFrame ({n_rows:,} rows)", usage, lr, batch_rows)
        assert s.n == len(values) and np.array_equal(s.values, values)
        del s
    if usage_input in ("lazy", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            for i, chunk in enumerate(usage.iter_slices(max(1, n_rows // 8))):
                chunk.write_parquet(Path(tmp) / f"chunk_{i:03d}.parquet")
            del usage
            scan = pl.scan_parquet(Path(tmp) / "*.parquet").join(
                lr.select("source", "workload_id").lazy(), on=["source", "workload_id"], how="semi"
            )
            label = f"series_matrix, Parquet LazyFrame ({n_rows:,} rows)"
            s = measured_series_matrix(label, scan, lr, batch_rows)
            assert s.n == len(values) and np.array_equal(s.values, values)


def bench_tsfresh_ratio(values: np.ndarray, cfg: TemporalConfig, numpy_s: float) -> None:
    from tsfresh.feature_extraction import feature_calculators as fc

    m = min(20, len(values))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in values[:m].reshape(-1, values.shape[2]):
            [fc.autocorrelation(x, lag) for lag in cfg.lags]
            fc.linear_trend(x, [{"attr": "slope"}])
            list(fc.agg_linear_trend(x, [{"attr": "slope", "chunk_len": cfg.agg_chunk_len, "f_agg": "mean"}]))
            fc.mean(x), fc.mean_abs_change(x), fc.standard_deviation(x)
    per_series = (time.perf_counter() - t0) / m
    print(
        f"tsfresh calculators, same features: {per_series * 1e3:.1f} ms/workload -> "
        f"{per_series * len(values):.1f} s extrapolated for n={len(values)} "
        f"({per_series * len(values) / numpy_s:.0f}x the numpy time)"
    )


def bench_dtw(values: np.ndarray, cfg: EcConfig, exact_n: int) -> None:
    d = cfg.dtw
    timed("numba compile (tiny DTW call)", dtw_matrix, np.zeros((2, 2, 4)), d)
    prepared = timed("prepare_dtw (z-normalise, downsample)", prepare_dtw, values, d)
    print(f"  DTW series length {prepared.shape[2]}, window {d.window_frac}, downsample {d.downsample}")
    m = min(exact_n, len(values))
    dist = timed(
        f"exact DTW matrix n={m} ({m * (m - 1) // 2:,} pairs x 2 resources)", dtw_matrix, prepared[:m], d
    )
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for k in range(cfg.k_min, cfg.k_max + 1):
        fit_kmedoids(dist, k, cfg.n_init, rng, cfg.kmedoids_max_iter)
    print(
        f"{f'k-medoids k={cfg.k_min}..{cfg.k_max} x {cfg.n_init} inits on n={m}':<58s} "
        f"{time.perf_counter() - t0:9.2f} s"
    )
    if len(values) > d.exact_max_n:
        res = timed(
            f"sampled DTW sweep n={len(values)} (sample {d.sample_size})",
            sweep_dtw,
            series_from_arrays([str(i) for i in range(len(values))], values),
            cfg,
        )
        n_union = len(np.unique(np.concatenate(list(res.medoids.values()))))
        print(
            f"  medoid union {n_union}; best silhouette row: "
            f"{max((r for r in res.rows if r['silhouette'] is not None), key=lambda r: r['silhouette'])}"
        )
        one = timed("  DTW of all workloads to 10 medoids", dtw_cross, prepared, prepared[:10], d)
        assert one.shape == (len(values), 10)


def _clock(fn, *args, **kwargs):
    """(result, CPU seconds of this process): on a shared machine wall time mostly measures the neighbours;
    CPU time over-counts numba's parallel DTW (both cores add up), so projections err on the slow side."""
    t0 = time.process_time()
    res = fn(*args, **kwargs)
    return res, time.process_time() - t0


def _silhouettes(dist: np.ndarray, labellings: list[np.ndarray]) -> list[float]:
    return [silhouette_from_distances(dist, y) for y in labellings if 2 <= len(np.unique(y)) < len(y)]


def project(values: np.ndarray, a: argparse.Namespace) -> None:
    """Time every EC stage at n = len(values) and project it to a.project_n workloads."""
    n, big_n = len(values), a.project_n
    scale = big_n / n
    ks = range(3, 16)
    cfg = EcConfig(n_init=a.n_init, dtw=DtwConfig(a.dtw_window, a.dtw_downsample, sample_size=a.dtw_sample))
    parts = [v[:, : int(0.7 * v.shape[1])] for v in values]
    print(
        f"projection: measured at n={n}, projected to n={big_n} (x{scale:.1f}); series {values.shape[2]} bins, "
        f"clustered on the first 70 %; k 3..15, {a.n_init} inits, {a.seeds} forecaster seeds"
    )
    total = {}
    # aggregate and temporal: features linear in n; K-Means fits linear in n; silhouettes on <= 2000 points
    for method, feats_fn in (("aggregate", aggregate_of), ("temporal", temporal_features_of)):
        feats, t_feat = _clock(feats_fn, parts)
        x = minmax_normalise(feats)
        sample = np.arange(min(n, cfg.silhouette_sample_size))
        dist = euclidean_distances(x[sample])
        t_fit = t_sil = 0.0
        for k in ks:
            runs, dt = _clock(kmeans_runs, x, k, cfg, 0, method)
            t_fit += dt
            t_sil += _clock(_silhouettes, dist, [r[0][sample] for r in runs])[1]
        sil_scale = (min(big_n, cfg.silhouette_sample_size) / len(sample)) ** 2
        total[method] = (t_feat + t_fit) * scale + t_sil * sil_scale
        print(
            f"  {method:<9s} features {t_feat:6.2f} s, {len(ks)} k x {a.n_init} K-Means fits {t_fit:7.2f} s, "
            f"silhouettes {t_sil:6.2f} s -> projected {total[method]:8.1f} s"
        )
    # DTW: medoids on a fixed-size sample (constant in n), then every workload to the union of medoids
    prepared, lengths = prepare_dtw_series(parts, cfg.dtw)
    m = min(a.dtw_sample, n)
    dist, t_mat = _clock(dtw_matrix, prepared[:m], cfg.dtw, lengths[:m])
    t_med = 0.0
    union = set()
    for k in ks:
        runs, dt = _clock(kmedoids_runs, dist, k, a.n_init, np.random.default_rng(k))
        t_sil = _clock(_silhouettes, dist, [r[1] for r in runs])[1]
        t_med += dt + t_sil
        union |= set(min(runs, key=lambda r: r[2])[0].tolist())
    probe = min(n, 200)
    _, t_cross = _clock(dtw_cross, prepared[:probe], prepared[:10], cfg.dtw, lengths[:probe], lengths[:10])
    t_assign = t_cross / (probe * 10) * big_n * len(union)
    total["dtw"] = t_mat + t_med + t_assign
    print(
        f"  dtw       {prepared.shape[2]} points (downsample {a.dtw_downsample}, window {a.dtw_window}), "
        f"sample {m}: matrix {t_mat:6.2f} s, K-Medoids+swap+silhouettes {t_med:7.2f} s, "
        f"assign {big_n} x {len(union)} medoids {t_assign:7.2f} s (projected) -> {total['dtw']:8.1f} s"
    )
    # forecaster: a fit costs the same whatever n (windows capped); prediction is linear in n * eval bins
    fc = ForecasterConfig(
        epochs=a.fc_epochs, min_steps=a.fc_min_steps, max_train_windows=a.fc_max_train_windows
    )
    train = [int(0.7 * v.shape[1]) for v in values]
    fitted, t_fit = _clock(fit_forecaster, list(values), train, fc)
    quarter = max(1, n // 4)
    _, t_fit_q = _clock(fit_forecaster, list(values[:quarter]), train[:quarter], fc)
    per_series = max(t_fit - t_fit_q, 0.0) / max(
        n - quarter, 1
    )  # a fit = fixed training steps + stats per series
    fixed = max(t_fit - per_series * n, 0.0)
    ev = values[:, :, : train[0] + a.max_eval_bins]
    _, t_pred = _clock(predict_series, fitted, list(ev), train)
    per_window = t_pred / (n * a.max_eval_bins)
    sum_k = 3 * sum(ks)  # every k of every method's sweep is a row of Table 1
    n_maps = 3 * len(ks)
    sides = 1 + a.control_draws  # the mapping and each of its random controls
    fits = a.seeds * (1 + sides * sum_k)
    # every mapping's EC fits together see all N series once, as does each control and the global fit
    t_fits = fits * fixed + a.seeds * (1 + sides * n_maps) * big_n * per_series
    windows = a.seeds * (1 + sides * n_maps) * big_n * a.max_eval_bins
    t_fc = t_fits + windows * per_window
    print(
        f"  forecaster one fit {fixed:5.2f} s + {per_series * 1e3:.3f} ms per series, "
        f"prediction {per_window * 1e6:5.1f} us/window; "
        f"{a.seeds} seeds x (1 global + {sides} x sum k={sum_k} EC and control fits) = {fits} fits, "
        f"{windows / 1e6:.1f} M windows ({a.max_eval_bins} held-out bins per workload) -> {t_fc:8.1f} s"
    )
    # ARI across 3 seeds at every k: 3 more sweeps per method (the DTW matrix reused); stability over time:
    # each half clustered at every k, about one more sweep per method (halves: half the DTW points)
    t_ari = 3 * sum(total[mth] for mth in ("aggregate", "temporal")) + 3 * (t_med + t_assign)
    t_halves = sum(total[mth] for mth in ("aggregate", "temporal")) + t_mat / 2 + t_med + t_assign
    grand = sum(total.values()) + t_fc + t_ari + t_halves
    print(
        f"  ARI across 3 seeds at every k (projected) {t_ari:8.1f} s; two-halves stability {t_halves:8.1f} s"
    )
    print(
        f"full EC stage at n={big_n}, {values.shape[2]} bins: {grand:8.1f} s = {grand / 3600:.2f} h "
        f"(target: 1 h on this 2-core machine; {'met' if grand <= 3600 else 'NOT met'})"
    )


def paper_forecaster(a: argparse.Namespace) -> None:
    """Seconds per training window and epoch of the paper-size LSTNet, and what a global fit and Table 1 cost."""
    from dataclasses import replace

    from models.forecaster import paper_scale

    base = paper_scale()
    length = base.window + a.fc_windows + 1
    values = list(generate(1, int(length / 0.7) + 2, a.seed))
    train = [length]
    windows_per_vm = int(0.7 * a.vm_bins) - base.window
    n_windows = a.vms * windows_per_vm
    n_maps = 3 * len(range(3, 16))
    fits = a.seeds * (1 + (1 + a.control_draws) * n_maps)  # each side's EC fits see every window once
    for threads in a.fc_threads:
        cfg = replace(base, epochs=1, min_steps=0, max_train_windows=a.fc_windows, n_threads=threads)
        t0 = time.perf_counter()
        _, cpu = _clock(fit_forecaster, values, train, cfg)
        per = (time.perf_counter() - t0) / a.fc_windows  # wall: more threads spend more CPU to finish sooner
        fit_h = per * n_windows * a.epochs / 3600
        print(
            f"paper-size LSTNet, {threads} torch thread(s): {per * 1e3:6.3f} ms per window and epoch (wall; "
            f"{cpu / a.fc_windows * 1e3:.3f} ms CPU) "
            f"({a.fc_windows} windows, batch {base.batch_size}); one global fit on {a.vms} VMs x {a.vm_bins} bins "
            f"({n_windows} windows, {a.epochs} epochs): {fit_h:8.1f} h; Table 1 at the paper profile "
            f"({fits} data-sized fits): {fit_h * fits:10.0f} h"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--length", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-init", type=int, default=50)
    p.add_argument("--dtw-downsample", type=int, default=10)
    p.add_argument("--dtw-window", type=float, default=None, help="Sakoe-Chiba fraction; default full DTW")
    p.add_argument("--dtw-exact-n", type=int, default=500, help="size of the exact-matrix DTW run")
    p.add_argument("--dtw-sample", type=int, default=300)
    p.add_argument("--skip-dtw", action="store_true")
    p.add_argument("--skip-frames", action="store_true", help="skip series_matrix on a USAGE frame")
    p.add_argument("--only-series-matrix", action="store_true", help="run series_matrix only, then stop")
    p.add_argument("--usage-input", choices=("frame", "lazy", "both"), default="frame")
    p.add_argument("--batch-rows", type=int, default=None, help="series_matrix batch_rows; default its own")
    p.add_argument("--project", action="store_true", help="time every stage and project to --project-n")
    p.add_argument("--project-n", type=int, default=10_000)
    p.add_argument("--seeds", type=int, default=10, help="forecaster seeds of the projection")
    p.add_argument("--control-draws", type=int, default=5, help="random controls per mapping and seed")
    p.add_argument("--max-eval-bins", type=int, default=96, help="held-out bins scored per workload")
    p.add_argument("--fc-epochs", type=int, default=1)
    p.add_argument("--fc-min-steps", type=int, default=30)
    p.add_argument("--fc-max-train-windows", type=int, default=500)
    p.add_argument("--paper-forecaster", action="store_true", help="time the paper-size forecaster per epoch")
    p.add_argument("--fc-windows", type=int, default=2048, help="training windows of that timing")
    p.add_argument("--fc-threads", type=int, nargs="+", default=[1], help="torch thread counts to time")
    p.add_argument("--vms", type=int, default=84)
    p.add_argument("--vm-bins", type=int, default=8640)
    p.add_argument("--epochs", type=int, default=100)
    a = p.parse_args()
    if a.paper_forecaster:
        paper_forecaster(a)
        return
    if a.project:
        project(generate(a.n, a.length, a.seed), a)
        return

    cfg = EcConfig(
        n_init=a.n_init,
        dtw=DtwConfig(window_frac=a.dtw_window, downsample=a.dtw_downsample, sample_size=a.dtw_sample),
    )
    print(f"n={a.n} length={a.length} resources=2 n_init={cfg.n_init} k={cfg.k_min}..{cfg.k_max}")
    values = timed("generate series", generate, a.n, a.length, a.seed)
    if not a.skip_frames or a.only_series_matrix:
        bench_frames(values, a.usage_input, a.batch_rows)
    if a.only_series_matrix:
        print(f"peak memory (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        return
    agg = timed("aggregate features (numpy)", aggregate_from_values, values)
    t0 = time.perf_counter()
    temporal = temporal_features(values, cfg.temporal)
    numpy_s = time.perf_counter() - t0
    print(f"{'temporal features (numpy, ' + str(temporal.shape[1]) + ' columns)':<58s} {numpy_s:9.2f} s")
    bench_tsfresh_ratio(values, cfg.temporal, numpy_s)
    for name, feats in (("aggregate", agg), ("temporal", temporal)):
        res = timed(f"K-Means++ sweep + silhouette, {name}", sweep_kmeans, feats, name, cfg)
        best = max((r for r in res.rows if r["silhouette"] is not None), key=lambda r: r["silhouette"])
        print(
            f"  best k={best['k']} silhouette={best['silhouette']:.3f} on {best['n_silhouette_points']} points"
        )
    if not a.skip_dtw:
        bench_dtw(values, cfg, a.dtw_exact_n)
    print(f"peak memory (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
