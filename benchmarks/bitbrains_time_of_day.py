"""Can a Bitbrains VM's time of day, or its own earlier usage, tell when its window peaks? (issue 22: the oracle's
headroom on Bitbrains is WHEN jobs peak, since a job's request is its window's peak.)

On the long-running Bitbrains VMs of a warehouse a `tvw-run` filled, usage is merged into the run's logical steps and
quantised as `sim__job_sequences` does (the source's `sim__usage_scale`, ceil into C_d = 8 units). For random
pairs of windows of the same VM (a "history" and a "target", each 31-100 steps as the long jobs are), the target's
usage at each step is predicted from the history by
- `time_of_day`: the history's largest usage at the same step of the day;
- `time_of_day_pm2`: the same over the day's steps within 2 of it;
- `flat`: the history's largest usage at any step,
each capped at the target's request (its peak). Only target job-resources with a request of 2 units or more count
(a 1-unit request uses its unit at every step). Printed per predictor: the share of target steps covered (usage at
most the prediction), the share of windows covered at every step (what packing beyond the request without an
overshoot needs), and the mean prediction and usage as shares of the request.

    PYTHONPATH=. python benchmarks/bitbrains_time_of_day.py --warehouse warehouse [--pairs 60] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.job_sequences import quantise_usage
from pipelines.schemas import BIN_SECONDS


def vm_steps(warehouse: Path) -> tuple[dict[str, dict[str, np.ndarray]], int, tuple[float, float]]:
    """Per VM, (cpu, mem) scaled fractions at every logical step of its kept run (NaN where a step is
    incomplete), the steps per day, and the source's usage scale."""
    scale = pl.read_parquet(warehouse / "tables" / "sim__usage_scale" / "all.parquet").filter(
        pl.col("source") == "bitbrains"
    )
    if scale.height == 0:
        raise SystemExit(
            f"{warehouse}: sim__usage_scale has no bitbrains row; run tvw-run on the sample first"
        )
    _, cpu_scale, mem_scale, step_bins = scale.row(0)
    step_s = BIN_SECONDS * int(step_bins)
    runs = pl.read_parquet(warehouse / "tables" / "core__long_running" / "**" / "*.parquet").filter(
        pl.col("source") == "bitbrains"
    )
    usage = pl.read_parquet(warehouse / "tables" / "core__usage" / "bitbrains" / "*.parquet")
    steps = (
        usage.join(runs.select("workload_id", "run_start_s", "n_run_bins"), on="workload_id")
        .filter(
            (pl.col("bin_start_s") >= pl.col("run_start_s"))
            & (pl.col("bin_start_s") < pl.col("run_start_s") + pl.col("n_run_bins") * BIN_SECONDS)
        )
        .group_by("workload_id", step=pl.col("bin_start_s") // step_s)
        .agg(pl.col("cpu_frac", "mem_frac").mean(), pl.len().alias("n_bins"))
        .filter(pl.col("n_bins") == step_bins)
        .sort("workload_id", "step")
    )
    out = {}
    for (wid,), g in steps.group_by(["workload_id"], maintain_order=True):
        step = g["step"].to_numpy()
        at = step - step.min()
        series = {"step0": np.array([step.min()])}
        for col, s in (("cpu_frac", cpu_scale), ("mem_frac", mem_scale)):
            arr = np.full(at.max() + 1, np.nan)
            arr[at] = g[col].to_numpy() * s
            series[col] = arr
        out[wid] = series
    return out, 86_400 // step_s, (cpu_scale, mem_scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--pairs", type=int, default=60, help="window pairs per VM and resource")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    vms, per_day, _ = vm_steps(Path(args.warehouse))
    names = ("time_of_day", "time_of_day_pm2", "flat")
    rows: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in names}
    for series in vms.values():
        for col in ("cpu_frac", "mem_frac"):
            frac = series[col]
            if frac.size < 300:
                continue
            units = np.where(np.isnan(frac), np.nan, quantise_usage(np.nan_to_num(np.clip(frac, 0, 1)), 8))
            hour = (np.arange(frac.size) + series["step0"][0]) % per_day
            for _ in range(args.pairs):
                dur = int(rng.integers(31, 101))
                start = int(rng.integers(0, frac.size - dur))
                target = units[start : start + dur]
                if np.isnan(target).any() or target.max() < 2:
                    continue
                request = target.max()
                h_len = int(rng.integers(31, 101))
                h_start = int(rng.integers(0, frac.size - h_len))
                hist, hist_hour = units[h_start : h_start + h_len], hour[h_start : h_start + h_len]
                by_hour = np.full(per_day, np.nan)
                for h in range(per_day):
                    seen = hist[(hist_hour == h) & ~np.isnan(hist)]
                    by_hour[h] = seen.max() if seen.size else np.nan
                near = np.stack([np.roll(by_hour, k) for k in range(-2, 3)])
                by_hour_pm2 = np.where(
                    np.isnan(near).all(axis=0), np.nan, np.nanmax(np.nan_to_num(near, nan=-1), 0)
                )
                th = hour[start : start + dur]
                preds = (by_hour[th], by_hour_pm2[th], np.full(dur, np.nanmax(hist)))
                for name, pred in zip(names, preds, strict=True):
                    pred = np.minimum(np.where(np.isnan(pred), request, pred), request)
                    covered = target <= pred
                    rows[name].append(
                        (covered.mean(), covered.all(), pred.mean() / request, target.mean() / request)
                    )
    print(
        f"{len(vms)} Bitbrains VMs, {per_day} steps a day, {len(rows['flat'])} target job-resources of >= 2 units"
    )
    for name in names:
        m = np.asarray(rows[name]).mean(axis=0)
        print(
            f"  {name:<16} steps covered {m[0]:.3f}, windows covered at every step {m[1]:.3f}, "
            f"prediction / request {m[2]:.3f}, usage / request {m[3]:.3f}"
        )


if __name__ == "__main__":
    main()
