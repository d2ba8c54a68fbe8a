"""Benchmark `ingest_shard` against a bare DuckDB CSV -> Parquet COPY of the same generated file.

Generates a deterministic (seeded) genuine-format .csv.gz of about `--mb` uncompressed megabytes
into benchmarks/out/ (git-ignored), then times, each in its own subprocess (so peak RSS is its own):
  1. ingest_shard(...)                     (streamed parse + checks + zstd Parquet)
  2. duckdb COPY (SELECT * FROM read_csv(f, header=false)) TO 'x.parquet'
and prints input MB/s, rows/s, peak RSS and the time ratio ingest / duckdb.

    python benchmarks/bench_ingest.py --mb 500 --table task_usage
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parents[1]
ROWS_PER_BLOCK = 200_000


def _fmt(x: np.ndarray, digits: int = 4) -> pl.Series:
    # the trace writes ~4 significant digits (e.g. 0.001562, 2.861e-06)
    return pl.Series(np.round(x, digits + 2))


def _task_usage_block(rng: np.random.Generator, block: int, n_tasks: int) -> pl.DataFrame:
    # rows sorted by window start, as in the real shards; each window holds every task once
    row = np.arange(block * ROWS_PER_BLOCK, (block + 1) * ROWS_PER_BLOCK)
    window, task = row // n_tasks, row % n_tasks
    start = 600_000_000 + window * 300_000_000
    n = len(row)
    cols = {
        "start": start,
        "end": start + 300_000_000 - rng.integers(0, 2, n) * rng.integers(0, 200, n) * 1_000_000,
        "job": 3_418_309 + task // 50,
        "task": task % 50,
        "machine": rng.integers(1, 4_000_000_000, n),
    }
    df = pl.DataFrame(cols)
    floats = {f"f{i}": _fmt(rng.gamma(1.0, 0.02, n)) for i in range(11)}
    df = df.with_columns(**floats)
    cpi = rng.gamma(2.0, 1.5, n)
    df = df.with_columns(
        cpi=pl.when(pl.Series(rng.random(n) < 0.03)).then(None).otherwise(_fmt(cpi, 2)),
        portion=pl.lit(0),
        agg=pl.lit(1),
        sampled=_fmt(rng.gamma(1.0, 0.02, n)),
    )
    return df


def _container_usage_block(rng: np.random.Generator, block: int, per_container: int) -> pl.DataFrame:
    # sorted by container id as a string, then time (the real file's order)
    row = np.arange(block * ROWS_PER_BLOCK, (block + 1) * ROWS_PER_BLOCK)
    cont, k = row // per_container, row % per_container
    n = len(row)
    disk = rng.integers(0, 20, n).astype(float)
    disk[rng.random(n) < 0.001] = -1.0
    disk[rng.random(n) < 0.001] = 101.0
    has_cpi = rng.random(n) > 0.45
    return pl.DataFrame(
        {
            "container_id": [f"c_{c + 1}" for c in cont],
            "machine_id": [f"m_{(c * 7) % 4000 + 1}" for c in cont],
            "time_stamp": 86_400 + k * 450 + rng.integers(0, 40, n) * 10 // 40 * 10,
            "cpu": rng.integers(2, 90, n),
            "mem": rng.integers(10, 100, n),
            "cpi": pl.Series(np.where(has_cpi, np.round(rng.gamma(2.0, 0.8, n), 2), np.nan)).fill_nan(None),
            "mem_gps": pl.Series(np.where(has_cpi, np.round(rng.gamma(1.0, 0.2, n), 2), np.nan)).fill_nan(
                None
            ),
            "mpki": pl.Series(np.where(has_cpi, rng.integers(0, 10, n), -9)).replace(-9, None),
            "net_in": np.round(rng.gamma(1.0, 2.0, n), 2),
            "net_out": np.round(rng.gamma(1.0, 2.0, n), 2),
            "disk": disk.astype(np.int64),
        }
    )


def generate(table: str, mb: int, seed: int = 0) -> Path:
    """Write benchmarks/out/<table>_<mb>mb.csv.gz (headerless, genuine column layout); reuse if present."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{table}_{mb}mb.csv.gz"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    target, written, block = mb * 1_000_000, 0, 0
    # level 1: generation speed; decompression speed barely depends on the level
    with gzip.open(tmp, "wb", compresslevel=1) as f:
        while written < target:
            if table == "task_usage":
                df = _task_usage_block(rng, block, n_tasks=150_000)
            else:
                df = _container_usage_block(rng, block, per_container=1_000)
            data = df.write_csv(include_header=False).encode()
            f.write(data)
            written += len(data)
            block += 1
    tmp.rename(path)
    return path


INGEST = """
import json, resource, sys, time
from pathlib import Path
from pipelines.ingest import ingest_shard
from pipelines.sources import SOURCES
src, table, f, out = sys.argv[1:5]
t = time.perf_counter()
st = ingest_shard(SOURCES[src], table, Path(f), Path(out) / "ingest.parquet", Path(out) / "ingest.q.parquet")
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rows": st.rows_in, "quarantined": st.rows_quarantined, "markers": st.n_invalid_markers}))
"""

DUCKDB = """
import json, resource, sys, time
import duckdb
f, out = sys.argv[1:3]
t = time.perf_counter()
con = duckdb.connect()
con.execute(f"COPY (SELECT * FROM read_csv('{f}', header=false)) TO '{out}/duckdb.parquet' (FORMAT parquet)")
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(code: str, *args: str) -> dict:
    res = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=2000, help="uncompressed size of the generated file (MB)")
    ap.add_argument("--table", choices=["task_usage", "container_usage"], default="task_usage")
    args = ap.parse_args()
    source = "google2011" if args.table == "task_usage" else "alibaba2018"
    t = time.perf_counter()
    f = generate(args.table, args.mb)
    print(
        f"input {f.name}: {f.stat().st_size / 1e6:.0f} MB gzip, ~{args.mb} MB CSV ({time.perf_counter() - t:.0f} s)"
    )
    ing = _run(INGEST, source, args.table, str(f), str(OUT))
    duck = _run(DUCKDB, str(f), str(OUT))
    for name, r in (("ingest_shard", ing), ("duckdb COPY", duck)):
        print(
            f"{name:13s} {r['s']:7.1f} s  {args.mb / r['s']:6.1f} MB/s (uncompressed)  "
            f"{ing['rows'] / r['s'] / 1e6:5.2f} M rows/s  peak RSS {r['rss_mb']:6.0f} MB"
        )
    print(f"rows {ing['rows']:,}  quarantined {ing['quarantined']:,}  invalid markers {ing['markers']:,}")
    print(f"ratio ingest / duckdb = {ing['s'] / duck['s']:.2f}  (target <= 1.5; peak RSS target < 1500 MB)")


if __name__ == "__main__":
    main()
