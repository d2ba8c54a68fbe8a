"""Benchmark of the canonical layer on a synthetic Google 2011 task_usage: build_usage + filter_long_running.

Generates (seeded) a raw task_usage dataset of `--tasks` x `--windows` five-minute windows (default 10k x 2000 =
20 M rows, written as Parquet shards of `--windows-per-file` windows each, in time order like the real shards) and
the matching task_events in the raw schemas, then times build_workloads, build_usage and filter_long_running on
`pl.scan_parquet(files)` and prints rows/s and the peak RSS of the process. Only the raw columns the canonical layer reads get values; the others are all null. About 0.1 % of windows are dropped (gaps), 1 % of windows are split into two shorter
windows (two records in one bin), 5 % of tasks end with a terminal event.

    python benchmarks/bench_core.py [--tasks 10000] [--windows 2000] [--seed 0] [--dir /tmp/bench_core]
        [--fill none|hold|linear] [--mode collect|sink|chunks] [--chunk-hours 6]
    collect: build_usage_with_report (all in memory); sink: one-pass scan_usage -> sink_parquet;
    chunks: iter_usage_chunks, each chunk written with write_parquet_atomic (what the core__usage asset does),
            then filter_long_running on the scan of the chunk files. Peak RSS should not grow with --windows.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.long_running import LongRunningConfig, filter_long_running
from pipelines.raw_schemas import GOOGLE2011
from pipelines.storage import write_parquet_atomic
from pipelines.usage import UsageConfig, build_usage_with_report, iter_usage_chunks, scan_usage
from pipelines.workloads import build_workloads

US = 1_000_000
TASKS_PER_JOB = 100
USAGE_COLS = [
    "start_time_us",
    "end_time_us",
    "job_id",
    "task_index",
    "machine_id",
    "cpu_rate_frac",
    "canonical_mem_frac",
]


def to_raw_schema(df: pl.DataFrame, table: str) -> pl.DataFrame:
    """`df` in the raw schema of `table`: columns in order, cast, the ones not generated all null."""
    schema = GOOGLE2011[table]
    return df.select(
        [(pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )


def generate_usage_shard(
    rng: np.random.Generator, n_tasks: int, first_window: int, n_windows: int
) -> pl.DataFrame:
    """task_usage rows of all tasks in windows first_window .. first_window + n_windows - 1 (300 s each, from
    trace time 600 s), in time order."""
    task = np.tile(np.arange(n_tasks), n_windows)
    start_s = 600 + 300 * np.repeat(np.arange(first_window, first_window + n_windows), n_tasks)
    keep = rng.random(task.size) >= 0.001
    task, start_s = task[keep], start_s[keep]
    split = rng.random(task.size) < 0.01  # a restart inside the window: two records [s, s+60), [s+60, s+300)
    task = np.concatenate([task, task[split]])
    end_s = np.concatenate([np.where(split, start_s + 60, start_s + 300), start_s[split] + 300])
    start_s = np.concatenate([start_s, start_s[split] + 60])
    n = task.size
    return pl.DataFrame(
        {
            "start_time_us": start_s * US,
            "end_time_us": end_s * US,
            "job_id": task // TASKS_PER_JOB + 1,
            "task_index": task % TASKS_PER_JOB,
            "machine_id": task % 12_500,
            "cpu_rate_frac": rng.gamma(2.0, 0.01, n),
            "canonical_mem_frac": rng.gamma(2.0, 0.02, n),
        }
    ).pipe(to_raw_schema, "task_usage")


def generate_events(rng: np.random.Generator, n_tasks: int) -> pl.DataFrame:
    """SUBMIT + SCHEDULE at time 0 for every task; 5 % also get a terminal event (EVICT..LOST) at 1 h."""
    task = np.arange(n_tasks)
    ended = task[rng.random(n_tasks) < 0.05]
    all_task = np.concatenate([task, task, ended])
    etype = np.concatenate([np.zeros(n_tasks), np.ones(n_tasks), rng.integers(2, 7, ended.size)])
    time_us = np.concatenate([np.zeros(2 * n_tasks), np.full(ended.size, 3600 * US)])
    n = all_task.size
    return pl.DataFrame(
        {
            "time_us": time_us.astype(np.int64),
            "job_id": all_task // TASKS_PER_JOB + 1,
            "task_index": all_task % TASKS_PER_JOB,
            "machine_id": all_task % 12_500,
            "event_type": etype,
            "priority": rng.integers(0, 12, n),
            "scheduling_class": rng.integers(0, 4, n),
            "cpu_request_frac": rng.random(n) * 0.1,
            "mem_request_frac": rng.random(n) * 0.1,
        }
    ).pipe(to_raw_schema, "task_events")


def write_dataset(args: argparse.Namespace) -> dict[str, list[Path]]:
    rng = np.random.default_rng(args.seed)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    (root / "task_usage").mkdir(parents=True)
    (root / "task_events").mkdir(parents=True)
    files = []
    for i, first in enumerate(range(0, args.windows, args.windows_per_file)):
        shard = generate_usage_shard(rng, args.tasks, first, min(args.windows_per_file, args.windows - first))
        files.append(root / "task_usage" / f"part-{i:05d}.parquet")
        shard.sort("start_time_us").write_parquet(files[-1])
    events = root / "task_events" / "part-00000.parquet"
    generate_events(rng, args.tasks).write_parquet(events)
    return {"task_usage": files, "task_events": [events]}


def write_chunks(raw: dict[str, pl.LazyFrame], cfg: UsageConfig, chunk_s: int, folder: Path) -> pl.DataFrame:
    """iter_usage_chunks -> folder/chunk-NNNNN.parquet; returns the summed counts. Prints the RSS as it goes."""
    counts = []
    for i, (usage, chunk_counts) in enumerate(iter_usage_chunks("google2011", raw, cfg, chunk_s)):
        write_parquet_atomic(usage, folder / f"chunk-{i:05d}.parquet")
        counts.append(chunk_counts)
        if i % 10 == 0:
            print(
                f"  chunk {i}: {usage.height:,} bins, peak RSS so far {peak_rss_mib():,.0f} MiB", flush=True
            )
    return pl.concat(counts).group_by("count", maintain_order=True).agg(pl.col("n").sum())


def peak_rss_mib() -> float:
    """Peak RSS of this process since the last reset_peak_rss (Linux VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB, never reset


def reset_peak_rss() -> None:
    """Start a new peak RSS measurement (Linux: writing 5 to clear_refs resets VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--windows", type=int, default=2_000)
    ap.add_argument("--windows-per-file", type=int, default=17, help="17 windows ~ one 1.4 h Google shard")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default="/tmp/bench_core")
    ap.add_argument("--fill", default="none", choices=["none", "hold", "linear"])
    ap.add_argument("--mode", default="collect", choices=["collect", "sink", "chunks"])
    ap.add_argument("--chunk-hours", type=float, default=6.0, help="chunks mode: trace hours per chunk")
    args = ap.parse_args()

    t0 = time.perf_counter()
    reset_peak_rss()
    files = write_dataset(args)
    t_gen = time.perf_counter() - t0
    rss_gen = peak_rss_mib()
    raw = {table: pl.scan_parquet(paths) for table, paths in files.items()}
    n_rows = raw["task_usage"].select(pl.len()).collect().item()
    print(
        f"generated {n_rows:,} task_usage rows ({args.tasks:,} tasks x {args.windows:,} windows) in {t_gen:.1f} s"
    )

    timings = {}

    def timed(name: str, fn, *a):
        reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn(*a)
        timings[name] = (time.perf_counter() - t0, time.process_time() - c0, peak_rss_mib())
        return out

    fill_cfg = UsageConfig(args.fill, 2 if args.fill != "none" else 0)
    workloads = timed("build_workloads", build_workloads, "google2011", raw)
    if args.mode == "sink":  # one pass, streamed to one file
        usage_path = Path(args.dir) / "usage.parquet"
        usage_lf, counts_lf = scan_usage("google2011", raw, fill_cfg)
        timed("build_usage", lambda: usage_lf.sink_parquet(usage_path))
        counts = counts_lf.collect(engine="streaming")
        usage = pl.scan_parquet(usage_path)
    elif args.mode == "chunks":  # the full-scale path: usage never held whole
        chunk_s = int(args.chunk_hours * 3600) // 300 * 300
        counts = timed("build_usage", write_chunks, raw, fill_cfg, chunk_s, Path(args.dir) / "core__usage")
        usage = pl.scan_parquet(Path(args.dir) / "core__usage" / "*.parquet")
    else:
        usage, counts = timed("build_usage", build_usage_with_report, "google2011", raw, fill_cfg)
    cfg = LongRunningConfig(min_contiguous_bins={"google2011": min(6000, args.windows // 2)})
    kept, report = timed("filter_long_running", filter_long_running, workloads, usage, cfg)

    # wall and process CPU time (user + sys, all threads): on a shared machine CPU time is the steadier figure
    print(f"{'stage':22s} {'wall s':>7s} {'cpu s':>7s} {'M rows/s wall':>14s} {'peak RSS MiB':>13s}  out")
    n_bins = usage.lazy().select(pl.len()).collect().item()
    outs = {"build_workloads": workloads.height, "build_usage": n_bins, "filter_long_running": kept.height}
    for name, (wall, cpu, rss) in timings.items():
        n_in = n_bins if name == "filter_long_running" else n_rows
        print(f"{name:22s} {wall:7.2f} {cpu:7.2f} {n_in / wall / 1e6:14.2f} {rss:13,.0f}  {outs[name]:,}")
    wall = timings["build_usage"][0] + timings["filter_long_running"][0]
    cpu = timings["build_usage"][1] + timings["filter_long_running"][1]
    print(f"{'usage + filter':22s} {wall:7.2f} {cpu:7.2f} {n_rows / wall / 1e6:14.2f}  (raw rows in)")
    print(f"peak RSS of generation: {rss_gen:,.0f} MiB; of the stages: see above")
    print(dict(zip(report["reason"], report["n_workloads"], strict=True)))
    print(dict(zip(counts["count"], counts["n"], strict=True)))


if __name__ == "__main__":
    main()
