"""Benchmark the learned usage forecaster (`models.usage_forecast`, issue 22 item 1) on real and synthetic sequences.

Sources, each turned into `sim__job_sequences` rows by the project's own builders (so the view matches the
simulator's):
- Bitbrains GWA-T-12 (`<traces>/bitbrains-gwa-t-12/`, the 84 rnd VMs): ingest_shard -> build_workloads ->
  iter_usage_chunks (the paper profile's linear fill of gaps up to 2 bins) -> filter_long_running (6000 contiguous
  bins) -> EC labels from the aggregate method's sweep (k 3..8, best silhouette) -> build_job_sequences (one load,
  one-hour steps). The sequences are cached under benchmarks/out/forecast/ (delete to rebuild).
- DeepPlace's synthetic square-wave workload (`pipelines.synthetic.build_deepplace_sequences`).

For each source and load it fits, on the training split only, the learned forecaster with and without EC inputs
and the four baselines, and scores them on the test split (`forecast_table`: every test job at arrival and at
running origins). Prints fit seconds, forecasts per second (job_view + features + numpy net, batches of 300 jobs,
one thread) and per forecaster the mean pinball loss / C and the coverage of each level, overall and at arrival /
running origins.

    python benchmarks/bench_forecast.py [--traces /work/shared/traces] [--preset sample|default] [--sources bitbrains,deepplace]
        [--calibration choose|origin|pooled]

`--calibration origin` fits the learned forecasters with one set of conformal shifts per origin, `pooled` with one
set for every origin, `choose` (the default) with whichever wins a cross-fit on the calibration workloads
(`ForecastConfig.calibrate_by_origin`, `choose_calibration`): run them and compare the "by origin" tables.

Measured (2 shared cores, load average about 8 from other processes; default preset; load 50 %, 20 training and
10 test sequences; pinball = mean over levels 50/90/95/99, 24 steps and both resources, / C; seed 0):
- Bitbrains (84 VMs kept, EC aggregate k = 5; 59 training / 25 test VMs): learned with EC 0.00378, EC per-age
  quantile 0.00381, learned without EC 0.00389, request 0.00414, last-period max 0.00484, seasonal-naive 0.00783.
  95 % coverage: with EC 0.969, without 0.955 (requests and the EC quantile: 1.000). On CPU alone the request is
  best (0.00554 vs 0.00584 learned): 83 % of the steps sit exactly at the request (1-unit jobs).
- DeepPlace: learned without EC 0.01324, with EC 0.01418, EC quantile 0.01615, request 0.02323, last-period max
  0.02655, seasonal-naive 0.03288. 95 % coverage: without EC 0.970, with EC 0.968.
- EC inputs over seeds 0-2 (each also redraws the workload split): Bitbrains -3.3 % pinball (3 of 3 seeds);
  DeepPlace +6.4 % (0 of 3; the per-age prior is what hurts: one-hot only 0.01300, prior only 0.01369).
- Calibration per origin (`--calibration origin`, the default since 2026-12-01) against one set for both
  (`pooled`), AMD EPYC 2-core machine: Bitbrains 95 % coverage with EC 0.966 / 0.974 (running 0.951 / 0.962,
  arrival 0.998 / 0.998), pinball over seeds 0-2 with EC 0.00377 / 0.00380, without 0.00385 / 0.00387; DeepPlace
  with EC 0.01449 / 0.01369, without 0.01387 / 0.01302, arrival coverage with EC 0.912 / 0.962 (its calibration
  templates do not resemble the test templates at arrival). 136 s per run.
- `--calibration choose` (the default since 2026-12-02: per origin unless pooled is significantly better on
  held-out calibration workloads): Bitbrains keeps per origin (per origin - pooled [-0.00002, +0.00004] with EC),
  seeds 0-2 0.00377 / 0.00385 with / without EC; DeepPlace pools ([+0.0011, +0.0033]), 0.01369 / 0.01302.
- Fit 3-8 s per learned forecaster; about 40k job-forecasts per CPU second (20k per wall second under that load),
  job_view included; whole benchmark 86 s (Bitbrains sequences built once, 7 s, then cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.usage_forecast import (  # noqa: E402
    FORECAST_PRESETS,
    ForecastConfig,
    fit_forecasters,
    fit_usage_forecaster,
    forecast_table,
    origin_state,
    shifts_kept,
    summarise_forecast_table,
)
from sim.config import SimConfig  # noqa: E402
from sim.jobs import JobBatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "forecast"
LOAD = 50
N_TRAIN, N_TEST = 20, 10


def bitbrains_sequences(traces: Path) -> pl.DataFrame:
    """Bitbrains job sequences through the pipeline's own functions (cached)."""
    cache = OUT / "bitbrains_sequences.parquet"
    if cache.exists():
        return pl.read_parquet(cache)
    from benchmarks.bitbrains_data import bitbrains_long_running
    from pipelines.equivalence import EcConfig, assignments_frame, sweep_methods
    from pipelines.features import series_matrix
    from pipelines.job_sequences import SequenceConfig, build_job_sequences

    t0 = time.perf_counter()
    workloads, usage, kept = bitbrains_long_running(traces)
    series = series_matrix(usage, kept, None)
    sweep = sweep_methods(series, "bitbrains", EcConfig(k_min=3, k_max=8, n_init=10, methods=("aggregate",)))
    k = sweep.best_k["aggregate"]
    assignments = assignments_frame(sweep, "aggregate", k)
    scfg = SequenceConfig(loads_pct=(LOAD,), n_train_sequences=N_TRAIN, n_test_sequences=N_TEST)
    seqs, _ = build_job_sequences(usage, kept, assignments, scfg)
    OUT.mkdir(parents=True, exist_ok=True)
    seqs.write_parquet(cache)
    print(
        f"bitbrains: {kept.height} of {workloads.height} VMs long-running, EC aggregate k={k}, "
        f"{seqs.height} jobs; built in {time.perf_counter() - t0:.1f} s"
    )
    return seqs


def deepplace_sequences() -> pl.DataFrame:
    from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences

    cfg = DeepPlaceConfig(loads_pct=(LOAD,), n_train_sequences=N_TRAIN, n_test_sequences=N_TEST)
    return build_deepplace_sequences(cfg)[0]


def forecasts_per_second(
    sim_cfg: SimConfig, forecaster, test: JobBatch, batch: int = 300, reps: int = 20
) -> float:
    """Job-forecasts per second of `forecaster.forecast` on running test jobs, `batch` jobs per call."""
    rng = np.random.default_rng(0)
    is_real = test.is_real
    n_obs = np.where(test.duration >= 2, rng.integers(1, np.maximum(test.duration, 2)), 0)
    state = origin_state(sim_cfg, test, n_obs)
    env, job = np.nonzero(is_real)
    pick = rng.choice(len(env), size=min(batch, len(env)), replace=False)
    e, j = env[pick], job[pick]
    forecaster.forecast(sim_cfg, state, e, j)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        forecaster.forecast(sim_cfg, state, e, j)
    n = reps * len(e)
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def run_source(name: str, seqs: pl.DataFrame, cfg: ForecastConfig) -> None:
    sim_cfg = SimConfig(n_labels=max(16, int(seqs["ec_label"].max()) + 1))
    train = JobBatch.from_frame(seqs.filter(pl.col("split") == "train"))
    test = JobBatch.from_frame(seqs.filter(pl.col("split") == "test"))
    n_tr = int(train.n_jobs.sum())
    n_te = int(test.n_jobs.sum())
    n_wl = seqs.group_by("split").agg(pl.col("workload_id").n_unique()).sort("split").rows()
    print(f"\n=== {name} (load {LOAD} %): {n_tr} training jobs, {n_te} test jobs; distinct workloads {n_wl}")
    t0 = time.perf_counter()
    forecasters = fit_forecasters(sim_cfg, train, cfg)
    print(f"fit all (learned x2 + baselines): {time.perf_counter() - t0:.1f} s")
    for key in ("learned_with_ec", "learned_without_ec"):
        rep = forecasters[key].report
        cov = {k: round(v, 3) for k, v in rep["calibration_coverage"].items()}
        print(
            f"  {key}: fit {rep['fit_s']:.1f} s, {rep['epochs_run']} epochs, examples {rep['n_examples']}, "
            f"workloads {rep['n_workloads']}, calibration coverage {cov}, shifts "
            f"{shifts_kept(rep)} "
            f"{rep.get('calibration_cross_fit', '')}"
        )
        wall, cpu = forecasts_per_second(sim_cfg, forecasters[key], test)
        print(
            f"    forecasts/s (batches of 300, 1 thread): {wall:,.0f} per wall second, {cpu:,.0f} per CPU second"
        )
    t0 = time.perf_counter()
    table = forecast_table(sim_cfg, test, forecasters, origins_per_job=3, seed=0)
    print(
        f"forecast table: {time.perf_counter() - t0:.1f} s, {int(table.filter(pl.col('level') == 0.5)['n'].sum()) // 2:,} scored job-steps per level and resource"
    )
    cols = ["forecaster", "pinball_frac", "coverage_50", "coverage_90", "coverage_95", "coverage_99"]
    with pl.Config(
        tbl_rows=40, tbl_cols=12, tbl_width_chars=160, float_precision=4, tbl_hide_dataframe_shape=True
    ):
        print("all origins:")
        print(summarise_forecast_table(table).select(cols))
        print("by resource:")
        print(summarise_forecast_table(table, ("resource",)).select(["resource", *cols]))
        print("by origin (arrival: nothing observed; running: ages 1 .. duration - 1):")
        print(summarise_forecast_table(table, ("origin",)).select(["origin", *cols]))
        h95 = (
            table.filter((pl.col("level") == 0.95) & pl.col("forecaster").str.starts_with("learned"))
            .group_by("forecaster", "horizon_step")
            .agg((pl.col("coverage") * pl.col("n")).sum() / pl.col("n").sum())
            .pivot(on="horizon_step", index="forecaster")
        )
        print("95 % coverage of the learned forecasters per horizon step 1..H:")
        print(h95.select("forecaster", *[str(h) for h in (1, 2, 4, 8, 12, 24) if str(h) in h95.columns]))
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "" if cfg.choose_calibration else "_origin" if cfg.calibrate_by_origin else "_pooled"
    table.write_parquet(OUT / f"table_{name}{suffix}.parquet")
    ec_value_over_seeds(sim_cfg, cfg, train, test)


def ec_value_over_seeds(sim_cfg: SimConfig, cfg, train: JobBatch, test: JobBatch, seeds=(0, 1, 2)) -> None:
    """The learned forecaster with and without EC inputs over several seeds (each seed also redraws the
    workload split and the origins): the measured value of ECs and how much of it is seed noise."""
    fitted = {}
    for seed in seeds:
        for use_ec in (True, False):
            key = f"{'with' if use_ec else 'without'}_ec_seed{seed}"
            fitted[key] = fit_usage_forecaster(
                sim_cfg, train, dataclasses.replace(cfg, use_ec=use_ec, seed=seed)
            )
    summary = summarise_forecast_table(forecast_table(sim_cfg, test, fitted, origins_per_job=3, seed=0))
    rows = summary.with_columns(pl.col("forecaster").str.extract(r"^(with|without)_ec").alias("variant"))
    paired = summary.with_columns(
        pl.col("forecaster").str.extract(r"seed(\d+)").alias("seed"),
        pl.col("forecaster").str.extract(r"^(with|without)_ec").alias("variant"),
    ).pivot(on="variant", index="seed", values="pinball_frac")
    print(f"with vs without EC inputs, seeds {list(seeds)} (mean +- sd over seeds):")
    for variant, part in rows.group_by("variant", maintain_order=True):
        print(
            f"  {variant[0]:>7}_ec: pinball/C {part['pinball_frac'].mean():.5f} +- {part['pinball_frac'].std():.5f}, "
            f"coverage 95 % {part['coverage_95'].mean():.4f} ({part['coverage_95'].min():.4f}..{part['coverage_95'].max():.4f})"
        )
    wins = int((paired["with"] < paired["without"]).sum())
    diff = (paired["with"] - paired["without"]) / paired["without"]
    print(f"  EC lowers pinball in {wins} of {paired.height} seeds; mean change {100 * diff.mean():+.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--preset", default="default", choices=sorted(FORECAST_PRESETS))
    ap.add_argument("--sources", default="bitbrains,deepplace")
    ap.add_argument("--calibration", default="choose", choices=("choose", "origin", "pooled"))
    args = ap.parse_args()
    cfg = dataclasses.replace(
        FORECAST_PRESETS[args.preset],
        calibrate_by_origin=args.calibration != "pooled",
        choose_calibration=args.calibration == "choose",
    )
    print(f"load average {os.getloadavg()[0]:.1f}; preset {args.preset}: {dataclasses.asdict(cfg)}")
    t0 = time.perf_counter()
    for name in args.sources.split(","):
        seqs = bitbrains_sequences(args.traces) if name == "bitbrains" else deepplace_sequences()
        run_source(name, seqs, cfg)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
