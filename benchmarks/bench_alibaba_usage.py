"""Benchmark of the Alibaba usage build at full-trace scale: workload (container-range) chunks vs time chunks.

Alibaba's container_usage is sorted by container_id (as a string). Generated here (seeded) straight into the raw
layer's Parquet form, as the ingest writes it (raw schema, zstd, dictionary-encoded strings, row groups of at most
1 Mi rows, file order kept), split into `--files` partitions of consecutive container ranges (the ingest's
`container_usage.<part>.csv` layout). Containers sample irregularly on a 10 s grid (gaps 10 s ... 1 h, mean about
10 min) from day 2 to day 9, 200-1,600 samples each; cpi/mem_gps/mpki are empty in about half the rows, as in the
genuine head. The CSV-equivalent size is measured: every 4th generated batch is also written as headerless CSV (in
memory, discarded), and its bytes per row times the rows give the size.

Each measurement runs `iter_usage_chunks` in a fresh process (so peak RSS is that run's), writing every chunk with
`write_parquet_atomic` as the core__usage asset does, and prints wall time, process CPU time and peak RSS:

    python benchmarks/bench_alibaba_usage.py [--dir /tmp/bench_alibaba] [--files 20] [--containers-per-file 25000]
        [--scales 1,4] [--time-chunks-at 1] [--chunk-rows 10000000] [--chunk-hours 48] [--keep] [--reuse]

Measured (2 shared cores, load average 9-20 from other work, so CPU seconds are the steadier figure):
  1x  112.4 M rows, 5.65 GB CSV: container chunks (12) 298 s wall, 71 s CPU, peak RSS 2.0 GiB;
                                 48 h time chunks (6)  392 s wall, 86 s CPU, peak RSS 5.6 GiB
  4x  449.8 M rows, 22.6 GB CSV: container chunks (45) 1294 s wall, 285 s CPU, peak RSS 2.0 GiB
  4x / 1x (container chunks): CPU x4.01, wall x4.34, peak RSS x1.04. Time chunks at 4x were not run: each
  chunk holds 48 h of every container's bins (5.6 GiB at 1x, growing with the containers), beyond this
  machine's 23 GiB.

Scale s reads the first `files / max(scales) * s` partitions. With the defaults (about 22 M rows, 1 GB of CSV
per file) 1x is 5 files (about 110 M rows, 5.3 GB of CSV) and 4x all 20; the time-chunk ("before") build runs at the scales in `--time-chunks-at`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.storage import open_parquet_stream, polars_to_arrow_schema, write_parquet_atomic
from pipelines.usage import UsageConfig, iter_usage_chunks

SOURCE = "alibaba2018"
SCHEMA = RAW_SCHEMAS[SOURCE]["container_usage"]
ROW_GROUP_ROWS = 1 << 20
"""pyarrow's default largest row group: what the ingest's batches (64 MB of text, ~1.5 M rows) are split into."""
CSV_SAMPLE_EVERY = 4
"""the CSV-equivalent size is measured on every 4th generated batch (a quarter of the rows) and scaled."""
GAPS_S = np.array([10, 190, 300, 450, 900, 3600])
GAP_P = np.array([0.15, 0.2, 0.2, 0.25, 0.17, 0.03])


def container_ids(n: int) -> list[str]:
    """c_1 .. c_n in the file's order: sorted as strings (c_1, c_10, c_100, ...)."""
    return sorted(f"c_{i}" for i in range(1, n + 1))


def generate_batch(rng: np.random.Generator, ids: list[str]) -> pl.DataFrame:
    """container_usage rows of the containers `ids` (in that order), time-sorted within each container."""
    n_per = rng.integers(200, 1600, len(ids))
    n = int(n_per.sum())
    cid = np.repeat(np.arange(len(ids)), n_per)
    gaps = rng.choice(GAPS_S, n, p=GAP_P)
    first = np.cumsum(n_per) - n_per
    start = 86_400 + rng.integers(0, 8_640, len(ids)) * 10
    gaps[first] = 0
    t = np.cumsum(gaps)
    t = t - np.repeat(t[first], n_per) + np.repeat(start, n_per)
    machine = rng.integers(1, 4035, len(ids))
    empty = rng.random(n) < 0.47
    cpi = np.round(0.5 + 3.0 * rng.random(n), 2)
    net = np.round(4.0 * rng.random((len(ids), 2)), 2)
    return pl.DataFrame(
        {
            "container_id": pl.Series(ids).gather(cid),
            "machine_id": pl.Series([f"m_{m}" for m in machine]).gather(cid),
            "time_s": t,
            "cpu_util_pct": rng.integers(1, 91, n).astype(float),
            "mem_util_pct": np.minimum(rng.integers(30, 101, n), 100).astype(float),
            "cpi": np.where(empty, np.nan, cpi),
            "mem_gps_pct": np.where(empty, np.nan, np.round(cpi * 0.3, 2)),
            "mpki": np.where(empty, np.nan, np.round(cpi * 0.7, 2)),
            "net_in_pct": np.repeat(net[:, 0], n_per),
            "net_out_pct": np.repeat(net[:, 1], n_per),
            "disk_io_pct": rng.integers(0, 40, n).astype(float),
        }
    ).with_columns(pl.col(["cpi", "mem_gps_pct", "mpki"]).fill_nan(None))


def csv_bytes(df: pl.DataFrame) -> int:
    """Bytes of `df` as the genuine headerless CSV (integers without '.0', empty for null)."""
    whole = [c for c in ("time_s", "cpu_util_pct", "mem_util_pct", "disk_io_pct") if c in df.columns]
    buf = io.BytesIO()
    df.with_columns(pl.col(whole).cast(pl.Int64)).write_csv(buf, include_header=False)
    return buf.tell()


def write_dataset(root: Path, n_files: int, per_file: int, seed: int) -> dict:
    """Raw container_usage partitions (consecutive container ranges), container_meta and machine_meta."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "container_usage").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    ids = container_ids(n_files * per_file)
    arrow = polars_to_arrow_schema(SCHEMA)
    per_batch = 800  # about 0.7 M rows: one row group each
    files = []
    for f in range(n_files):
        path = root / "container_usage" / f"container_usage.part{f:03d}.parquet"
        part, n_rows, n_csv, n_csv_rows = ids[f * per_file : (f + 1) * per_file], 0, 0, 0
        with open_parquet_stream(path, arrow) as w:
            for b in range(0, len(part), per_batch):
                batch = generate_batch(rng, part[b : b + per_batch]).select(
                    [pl.col(c).cast(t) for c, t in SCHEMA.items()]
                )
                w.write(batch)
                n_rows += batch.height
                if (b // per_batch) % CSV_SAMPLE_EVERY == 0:
                    n_csv_rows, n_csv = n_csv_rows + batch.height, n_csv + csv_bytes(batch)
        n_csv = round(n_csv * n_rows / n_csv_rows)  # bytes per row of the sampled batches x rows
        files.append(
            {"path": str(path), "rows": n_rows, "csv_bytes": n_csv, "parquet_bytes": path.stat().st_size}
        )
        print(
            f"  {path.name}: {n_rows:,} rows, {n_csv / 1e9:.2f} GB as CSV, {files[-1]['parquet_bytes'] / 1e9:.2f} GB Parquet",
            flush=True,
        )
    n = len(ids)
    meta = pl.DataFrame(
        {
            "container_id": ids,
            "machine_id": [f"m_{m}" for m in rng.integers(1, 4035, n)],
            "time_s": np.zeros(n, dtype=np.int64),
            "app_du": [f"app_{i % 2000}" for i in range(n)],
            "status": ["started"] * n,
            "cpu_request_centicores": rng.choice([400.0, 800.0, 1600.0], n),
            "cpu_limit_centicores": rng.choice([400.0, 800.0, 1600.0], n),
            "mem_size_pct": np.round(rng.uniform(0.5, 3.0, n), 2),
        }
    ).select([pl.col(c).cast(t) for c, t in RAW_SCHEMAS[SOURCE]["container_meta"].items()])
    write_parquet_atomic(meta, root / "container_meta.parquet")
    machines = pl.DataFrame({"machine_id": [f"m_{m}" for m in range(1, 4035)], "time_s": 0, "cpu_num": 96})
    machines = machines.select(
        [(pl.col(c) if c in machines.columns else pl.lit(None)).cast(t).alias(c)
         for c, t in RAW_SCHEMAS[SOURCE]["machine_meta"].items()]
    )  # fmt: skip
    write_parquet_atomic(machines, root / "machine_meta.parquet")
    return {
        "files": files,
        "meta": str(root / "container_meta.parquet"),
        "machines": str(root / "machine_meta.parquet"),
    }


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_build(args: argparse.Namespace) -> None:
    """One usage build in this process (called in a child): prints one JSON line of figures."""
    manifest = json.loads(Path(args.manifest).read_text())
    files = [f["path"] for f in manifest["files"][: args.n_files]]
    raw = {
        "container_usage": pl.scan_parquet(files),
        "container_meta": pl.scan_parquet(manifest["meta"]),
        "machine_meta": pl.scan_parquet(manifest["machines"]),
    }
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    chunk = (
        {"chunk_rows": args.chunk_rows} if args.mode == "workload" else {"chunk_s": args.chunk_hours * 3600}
    )
    t0, c0 = time.perf_counter(), time.process_time()
    bins, rows_in, n_chunks = 0, 0, 0
    for usage, counts in iter_usage_chunks(SOURCE, raw, UsageConfig(), **chunk):
        write_parquet_atomic(usage, out / f"chunk-{n_chunks:05d}.parquet")
        bins += usage.height
        rows_in += int(counts.filter(pl.col("count") == "rows_in")["n"].sum())
        n_chunks += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": peak_rss_mib(), "bins": bins,
                      "rows_in": rows_in, "chunks": n_chunks}))  # fmt: skip


def child(args: argparse.Namespace, manifest: Path, n_files: int, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--build", "--manifest", str(manifest), "--n-files", str(n_files),
           "--mode", mode, "--out", str(Path(args.dir) / "core__usage"), "--chunk-rows", str(args.chunk_rows),
           "--chunk-hours", str(args.chunk_hours)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"build failed ({mode}, {n_files} files):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/bench_alibaba")
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--containers-per-file", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--time-chunks-at", default="1", help="scales at which the time-chunk build also runs")
    ap.add_argument("--chunk-rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-hours", type=int, default=48)
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--reuse", action="store_true", help="reuse data kept by an earlier --keep run")
    ap.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--manifest", help=argparse.SUPPRESS)
    ap.add_argument("--n-files", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["workload", "time"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        run_build(args)
        return

    root = Path(args.dir)
    scales = [int(s) for s in args.scales.split(",")]
    time_at = {int(s) for s in args.time_chunks_at.split(",") if s}
    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}")
    t0 = time.perf_counter()
    if args.reuse and (root / "manifest.json").is_file():
        manifest = json.loads((root / "manifest.json").read_text())
        print(f"reusing the {len(manifest['files'])} generated files under {root}")
    else:
        manifest = write_dataset(root / "raw", args.files, args.containers_per_file, args.seed)
        (root / "manifest.json").write_text(json.dumps(manifest))
        print(f"generated in {time.perf_counter() - t0:.0f} s")
    print(f"{'scale':>5s} {'chunks by':>10s} {'raw rows':>13s} {'CSV GB':>7s} {'chunks':>6s} {'wall s':>7s} "
          f"{'cpu s':>7s} {'M rows/s':>8s} {'peak RSS MiB':>12s} {'bins out':>13s}  load avg")  # fmt: skip
    results = []
    for s in scales:
        n_files = args.files * s // max(scales)
        part = manifest["files"][:n_files]
        rows, csv = sum(f["rows"] for f in part), sum(f["csv_bytes"] for f in part)
        for mode in ["workload", "time"] if s in time_at else ["workload"]:
            r = child(args, root / "manifest.json", n_files, mode)
            assert r["rows_in"] == rows, (r["rows_in"], rows)
            load = os.getloadavg()
            results.append({"scale": s, "mode": mode, "rows": rows, "csv_bytes": csv, **r, "load": load})
            print(f"{s:>4d}x {mode:>10s} {rows:13,d} {csv / 1e9:7.2f} {r['chunks']:6d} {r['wall_s']:7.1f} "
                  f"{r['cpu_s']:7.1f} {rows / r['wall_s'] / 1e6:8.2f} {r['peak_rss_mib']:12,.0f} {r['bins']:13,d}  "
                  f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)  # fmt: skip
    w = {r["scale"]: r for r in results if r["mode"] == "workload"}
    if len(w) >= 2:
        a, b = w[min(w)], w[max(w)]
        print(f"workload chunks, {max(w)}x vs {min(w)}x: rows x{b['rows'] / a['rows']:.2f}, wall x{b['wall_s'] / a['wall_s']:.2f}, "
              f"cpu x{b['cpu_s'] / a['cpu_s']:.2f}, peak RSS x{b['peak_rss_mib'] / a['peak_rss_mib']:.2f}")  # fmt: skip
    for r in results:
        if r["mode"] == "time" and r["scale"] in w:
            print(
                f"{r['scale']}x: time chunks / workload chunks wall = {r['wall_s'] / w[r['scale']]['wall_s']:.2f}"
            )
    print(f"load average after: {os.getloadavg()}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
