"""Timings of the EC pipeline (features, DTW, k sweep with silhouette, the prediction-gain forecasters) on seeded
synthetic usage series, and the projected cost of the full EC stage at paper scale.

    python benchmarks/bench_ec.py --n 1000
    python benchmarks/bench_ec.py --n 10000 --skip-dtw
    python benchmarks/bench_ec.py --n 10000 --only-series-matrix --usage-input both
    python benchmarks/bench_ec.py --project --n 4000 --profile sample [--check-n 8000]

`--project` runs the real EC stage (the sweep of every method as ec__method_sweep runs it, and its Table 1 rows
as ec__method_gain runs them: forecaster fits over seeds and random controls, ARI across seeds, stability over
time) with a tvw-run profile's EC settings on n/2 and n generated workloads of --length bins, fits process CPU
seconds = fixed + per-workload x n for each (method, part), and projects to --project-n workloads (default
10,000); --check-n measures one more size and prints the projection's error there. Each part is at most linear in
n once n exceeds the stage's sample caps (silhouettes and DTW medoids on samples, forecaster windows capped), so
measure above them. The paper-size forecaster is timed by `benchmarks/bench_paper_forecaster.py`.

Prints seconds per stage and peak memory (ru_maxrss); for series_matrix also the memory the call itself added
(Linux: peak RSS during the call, reset through /proc/self/clear_refs, minus RSS before it). Series: n workloads x 2 resources x --length bins,
a mix of daily sines, square waves, ramps and random walks with random levels, amplitudes and noise.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.equivalence import (
    DtwConfig,
    EcConfig,
    dtw_cross,
    dtw_matrix,
    fit_kmedoids,
    prepare_dtw,
    sweep_dtw,
    sweep_kmeans,
    sweep_methods,
)
from pipelines.features import (
    TemporalConfig,
    aggregate_from_values,
    series_from_arrays,
    series_matrix,
    temporal_features,
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


def profile_settings(profile: str):
    """The EC run settings (`models.ec_mapping.EcRunSettings`) of a tvw-run profile's ec__mapping entry: a named
    profile (quick, sample, paper) or a YAML file, with what it extends merged in (`assets.definitions.load_profile`,
    as tvw-run reads it)."""
    from assets.definitions import load_profile
    from models.ec_mapping import EcRunSettings
    from pipelines.profiles import ProfileError
    from pipelines.settings import to_dataclass

    try:
        ops = load_profile(profile)["ops"]
    except ProfileError as exc:
        raise SystemExit(f"--profile: {exc}") from None
    return to_dataclass(ops.get("ec__mapping", {}).get("config", {}), EcRunSettings)


def stage_seconds(n: int, a: argparse.Namespace, settings) -> dict[tuple[str, str], float]:
    """CPU seconds of the real EC stage on n generated workloads, per (method, part): the sweep
    (`pipelines.equivalence.sweep_methods`, as ec__method_sweep runs it) and the Table 1 rows
    (`models.ec_mapping.method_gain_rows`, as ec__method_gain runs it: forecaster fits over seeds and controls,
    ARI across seeds, stability over time)."""
    from models.ec_mapping import method_gain_rows
    from pipelines.equivalence import sweep_labels_frame

    values = generate(n, a.length, a.seed)
    series = series_from_arrays([f"w{i}" for i in range(n)], values)
    if settings.series_max_bins:
        series = series_from_arrays(series.workload_ids, values[:, :, : settings.series_max_bins])
    cfg = settings.ec
    out, sweeps = {}, {}
    for method in cfg.methods:
        sweeps[method], out[(method, "sweep")] = _clock(
            sweep_methods, series, "bench", replace(cfg, methods=(method,))
        )
    silhouette = pl.concat([sw.silhouette for sw in sweeps.values()])
    for method in cfg.methods:
        labels = sweep_labels_frame(sweeps[method], method)
        _, out[(method, "table1")] = _clock(
            method_gain_rows, series, "bench", method, silhouette, labels, settings
        )
    return out


def project(a: argparse.Namespace) -> None:
    """Time the real EC stage at two sizes, fit seconds = fixed + per-workload x n per (method, part), project
    to a.project_n; with --check-n, measure that size too and print the projection's error."""
    settings = profile_settings(a.profile)
    sizes = [a.n // 2, a.n]
    cap = max(settings.ec.silhouette_sample_size, settings.ec.dtw.exact_max_n)
    if sizes[0] < cap:
        print(
            f"WARNING: n/2 = {sizes[0]} is below the stage's sample caps ({cap}: silhouettes, exact DTW); parts "
            f"grow faster than linearly up to there, so this projection is too low. Use --n {2 * cap} or more.",
            flush=True,
        )
    print(
        f"EC stage of the {a.profile} profile ({', '.join(settings.ec.methods)}; k {settings.ec.k_min}.."
        f"{settings.ec.k_max}, {settings.ec.n_init} inits, {settings.gain.n_seeds} forecaster seeds x "
        f"(1 + {settings.gain.n_control_draws} controls), forecaster '{settings.forecaster_preset}') on generated "
        f"series of {a.length} bins, measured at n = {sizes[0]} and {sizes[1]} (process CPU seconds)",
        flush=True,
    )
    # warm-up, not measured: numba compiles DTW, torch allocates
    stage_seconds(min(sizes[0], 40), a, settings)
    measured = {}
    for n in sizes:
        t0 = time.perf_counter()
        measured[n] = stage_seconds(n, a, settings)
        print(
            f"  n={n}: {sum(measured[n].values()):8.1f} s CPU ({time.perf_counter() - t0:.1f} s wall)",
            flush=True,
        )
    fit = project_fit(measured, sizes)
    total = 0.0
    for key, (fixed, per) in fit.items():
        t = fixed + per * a.project_n
        total += t
        print(
            f"  {key[0]:<9s} {key[1]:<6s} {fixed:8.1f} s + {per * 1e3:8.2f} ms/workload -> {t:9.1f} s at n={a.project_n}"
        )
    print(
        f"full EC stage at n={a.project_n}, {a.length} bins: {total:9.1f} CPU s = {total / 3600:.2f} CPU h "
        f"(target 1 h: {'met' if total <= 3600 else 'NOT met'} on one core; "
        f"{total / 3600 / max(os.cpu_count() or 1, 1):.2f} h wall at best on {os.cpu_count()} cores)",
        flush=True,
    )
    if a.check_n:
        got = sum(stage_seconds(a.check_n, a, settings).values())
        want = sum(fixed + per * a.check_n for fixed, per in fit.values())
        print(f"check at n={a.check_n}: measured {got:.1f} s, projected {want:.1f} s ({want / got - 1:+.0%})")


def project_fit(
    measured: dict[int, dict[tuple[str, str], float]], sizes: list[int]
) -> dict[tuple[str, str], tuple[float, float]]:
    """Per part, (fixed seconds, seconds per workload) through the two measured sizes; a part that shrank
    (noise) is taken as fixed at its larger measurement. Every part is at most linear in n once n exceeds the
    stage's sample caps (silhouettes and DTW medoids on samples, forecaster windows capped), so measure there."""
    n1, n2 = sizes
    out = {}
    for key in measured[n2]:
        t1, t2 = measured[n1][key], measured[n2][key]
        per = max((t2 - t1) / (n2 - n1), 0.0)
        out[key] = (max(t2 - per * n2, 0.0), per) if per > 0 else (max(t1, t2), 0.0)
    return out


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
    p.add_argument("--project", action="store_true", help="time the real EC stage at n/2 and n, project")
    p.add_argument("--project-n", type=int, default=10_000)
    p.add_argument("--profile", default="sample", help="the tvw-run profile whose EC settings are timed")
    p.add_argument("--check-n", type=int, default=0, help="also measure the stage at this n; print the error")
    a = p.parse_args()
    if a.project:
        project(a)
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
