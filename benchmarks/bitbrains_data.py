"""The shared Bitbrains VMs (`<traces>/bitbrains-gwa-t-12/`) as the paper profile's pipeline sees them, for the
benchmarks that need real long series: ingest_shard -> build_workloads -> iter_usage_chunks (linear fill of gaps
up to 2 bins) -> filter_long_running (6000 contiguous 5-minute bins)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl


def bitbrains_long_running(traces: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(workloads, 5-minute usage, long-running workloads kept) of the Bitbrains trace under `traces`."""
    from pipelines.ingest import ingest_shard
    from pipelines.long_running import LongRunningConfig, filter_long_running
    from pipelines.sources import SOURCES
    from pipelines.usage import UsageConfig, iter_usage_chunks
    from pipelines.workloads import build_workloads

    src = SOURCES["bitbrains"]
    with tempfile.TemporaryDirectory(prefix="bench_bitbrains_") as tmp:
        files = []
        for key, path in src.discover(traces, "vm_usage").items():
            files.append(Path(tmp) / f"{key}.parquet")
            ingest_shard(src, "vm_usage", path, files[-1], Path(tmp) / f"q_{key}.parquet")
        raw = {"vm_usage": pl.scan_parquet(files)}
        workloads = build_workloads("bitbrains", raw)
        ucfg = UsageConfig(fill_policy="linear", max_fill_bins=2)
        usage = pl.concat([u for u, _ in iter_usage_chunks("bitbrains", raw, ucfg, chunk_s=48 * 3600)])
    lcfg = LongRunningConfig(min_contiguous_bins={"bitbrains": 6000}, rule={"bitbrains": "contiguous_bins"})
    kept, _ = filter_long_running(workloads, usage, lcfg)
    return workloads, usage, kept
