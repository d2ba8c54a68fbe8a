"""`tvw-run` serial vs concurrent, and a projection of the full Google 2011 / Alibaba 2018 runs from the
measured per-shard figures (prints figures; not a test).

    python benchmarks/bench_runner.py                      # both cases, --jobs = number of cores
    python benchmarks/bench_runner.py --case google --shards 24 --tasks 6000 --days 2

Cases:
    google   a generated genuine-format Google 2011 trace with --shards shards per table (>= 20), plus the
             generated Alibaba 2018 tables: the raw layer (every shard of every table, one run each) with
             --jobs 1 (one run after the other, in this process) and with --jobs N (N worker processes);
             then the projection from the serial per-table figures
    sample   the whole pipeline (raw, per source, cluster) on the embedded sample, --jobs 1 vs --jobs N

Each measurement uses a fresh warehouse and Dagster instance under --work (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.raw import QUARANTINE_TABLE
from cli.run import run_all
from cli.summary import layer_lines
from cli.workers import RunOutcome, Target

LAYERS = None
"""Every layer but the on-demand ones (the runner reads them from the definitions)."""

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "tests" / "fixtures" / "generate_traces.py"

FULL_GOOGLE_ROWS = {
    "task_usage": 1_232_799_308,
    "task_events": 144_648_288,
    "job_events": 2_012_242,
    "machine_events": 37_780,
}
"""Rows of the full clusterdata-2011-2 tables (the trace's format + schema document, v2.1), 500 shards
each for the event and usage tables, about 41 GB gzip in all."""
FULL_ALIBABA_UNPACKED_GB = 280.0
"""cluster-trace-v2018 unpacked (container_usage, machine_usage, batch_task, batch_instance and the metas);
projected with the ingest throughput measured per uncompressed byte of the generated Alibaba CSVs."""
FULL_SHARDS_PER_TABLE = 500


def load_generator():
    spec = importlib.util.spec_from_file_location("tvw_generate_traces", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fresh(work: Path, name: str) -> tuple[Path, Path]:
    """An empty warehouse folder and Dagster home for one measurement."""
    wh, home = work / f"{name}_wh", work / f"{name}_home"
    for d in (wh, home):
        shutil.rmtree(d, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return wh, home


def timed_run(
    traces: Path, work: Path, name: str, jobs: int, sources: list[str] | None, layers: tuple[str, ...]
) -> tuple[float, list[RunOutcome], Path]:
    wh, home = fresh(work, name)
    os.environ["DAGSTER_HOME"] = str(home)
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        t0 = time.perf_counter()
        outcomes = run_all(
            Target(str(traces), str(wh), "sample"),
            instance,
            log=lambda _: None,
            max_concurrent=jobs,
            sources=sources,
            layers=layers,
        )
        wall = time.perf_counter() - t0
    failed = [o.spec.label for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"{name}: runs failed: {failed}")
    return wall, outcomes, wh


def compare(title: str, serial: float, concurrent: float, jobs: int) -> None:
    print(
        f"{title}: serial {serial:.1f}s, {jobs} at once {concurrent:.1f}s, speed-up {serial / concurrent:.2f}x"
    )


def gunzipped_bytes(path: Path) -> int:
    if path.suffix != ".gz":
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n


def step_seconds(home: Path) -> dict[str, float]:
    """Run id -> seconds its steps took (from the STEP_SUCCESS events): the work, without the run's bookkeeping."""
    from dagster import DagsterEventType, EventRecordsFilter

    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.STEP_SUCCESS))
    out: dict[str, float] = {}
    for r in records:
        entry = r.event_log_entry
        out[entry.run_id] = (
            out.get(entry.run_id, 0.0) + entry.dagster_event.event_specific_data.duration_ms / 1e3
        )
    return out


def per_table(outcomes: list[RunOutcome], wh: Path, traces: Path, home: Path) -> dict[str, dict[str, float]]:
    """Per raw table: runs, input bytes (gzip and unpacked), rows in, run seconds, step seconds, Parquet bytes."""
    from pipelines.sources import SOURCES

    steps = step_seconds(home)
    figures: dict[str, dict[str, float]] = {}
    for o in outcomes:
        table = o.spec.job.removesuffix("_job")
        f = figures.setdefault(
            table,
            {
                "runs": 0,
                "gz_bytes": 0,
                "raw_bytes": 0,
                "rows": 0,
                "seconds": 0.0,
                "step_s": 0.0,
                "parquet_bytes": 0,
            },
        )
        source = o.spec.source
        short = table.removeprefix(f"raw_{source}__")
        path = SOURCES[source].discover(traces, short)[o.spec.partition]
        files = sorted((wh / "tables" / table).glob("**/*.parquet"))
        f["runs"] += 1
        f["gz_bytes"] += path.stat().st_size
        f["raw_bytes"] += gunzipped_bytes(path) if path.is_file() else 0
        f["seconds"] += o.seconds
        f["step_s"] += steps[o.run_id]
        f["_files"] = files  # type: ignore[assignment]
    for table, f in figures.items():
        files = f.pop("_files")  # type: ignore[arg-type]
        quarantined = [
            p
            for p in (wh / "tables" / QUARANTINE_TABLE).glob("*.parquet")
            if f"{table.removeprefix('raw_')}__" in p.name
        ]
        f["rows"] = sum(pq.ParquetFile(p).metadata.num_rows for p in [*files, *quarantined])
        f["parquet_bytes"] = sum(p.stat().st_size for p in files)
    return figures


def project(
    figures: dict[str, dict[str, float]], speedup: float, peak_rss_mib: float, workers: list[int]
) -> None:
    """Hours for the full traces' raw layer. A run costs its step (timed by Dagster's STEP_SUCCESS event) plus
    a fixed bookkeeping cost (run and event records in the instance: run time minus step time, averaged).
    Google: 500 shards per event/usage table at the full row counts, at the rows/s of the measured steps;
    Alibaba: unpacked bytes at container_usage's measured bytes/s. This machine: serial time / measured
    speed-up; N workers: serial / N (500 shards per table keep N workers busy up to N ~ 100)."""
    n_runs = sum(f["runs"] for f in figures.values())
    overhead_s = sum(f["seconds"] - f["step_s"] for f in figures.values()) / n_runs
    print(
        f"\nper-shard figures (serial, this machine); bookkeeping of a run besides its step: {overhead_s:.2f}s"
    )
    print(
        f"  {'table':<36} {'runs':>5} {'rows/run':>10} {'s/run':>7} {'rows/s*':>10} {'MB/s* unp':>9} {'B/row pq':>9}"
    )

    def work_s(f: dict[str, float]) -> float:
        return f["step_s"]

    for table, f in sorted(figures.items()):
        print(
            f"  {table:<36} {f['runs']:>5.0f} {f['rows'] / f['runs']:>10,.0f} {f['seconds'] / f['runs']:>7.2f} "
            f"{f['rows'] / work_s(f):>10,.0f} {f['raw_bytes'] / work_s(f) / 1e6:>9.1f} "
            f"{f['parquet_bytes'] / max(f['rows'], 1):>9.1f}"
        )
    print("  (* per second of the ingest step itself)")
    google_s, google_disk = 0.0, 0.0
    for table, rows in FULL_GOOGLE_ROWS.items():
        f = figures.get(f"raw_google2011__{table}")
        if f and f["rows"]:
            runs = 1 if table == "machine_events" else FULL_SHARDS_PER_TABLE
            google_s += runs * overhead_s + rows / (f["rows"] / work_s(f))
            google_disk += rows * f["parquet_bytes"] / f["rows"]
    ali = [f for t, f in figures.items() if t.startswith("raw_alibaba2018__") and f["raw_bytes"]]
    big = max(ali, key=lambda f: f["raw_bytes"])  # container_usage: the bulk of the unpacked bytes
    ali_rate = big["raw_bytes"] / work_s(big)
    ali_s = FULL_ALIBABA_UNPACKED_GB * 1e9 / ali_rate
    ali_disk = FULL_ALIBABA_UNPACKED_GB * 1e9 * big["parquet_bytes"] / big["raw_bytes"]
    print("\nprojection of the raw layer (ingest) of the full traces:")
    for name, serial_s, disk in (
        ("Google 2011 (1.38 billion rows, 1501 shards)", google_s, google_disk),
        (f"Alibaba 2018 ({FULL_ALIBABA_UNPACKED_GB:.0f} GB unpacked)", ali_s, ali_disk),
    ):
        per_n = ", ".join(f"{n} workers {serial_s / n / 3600:.1f} h" for n in workers)
        print(
            f"  {name}: one core {serial_s / 3600:.1f} h; this 2-core machine {serial_s / speedup / 3600:.1f} h; "
            f"{per_n}; warehouse {disk / 1e9:.0f} GB Parquet"
        )
    print(
        f"  peak RSS per worker: {peak_rss_mib:.0f} MiB here; ingest streams fixed-size batches, so it does not "
        f"grow with the shard (a full task_usage shard has about "
        f"{FULL_GOOGLE_ROWS['task_usage'] / FULL_SHARDS_PER_TABLE / 1e6:.1f} M rows)"
    )


def google_case(work: Path, jobs: int, shards: int, tasks: int, days: float) -> None:
    gen = load_generator()
    traces = work / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    t0 = time.perf_counter()
    n_long = max(len(gen.SHAPES), tasks // 2)
    gen.write_google2011(
        traces, 0, days=days, n_long=n_long, n_short=tasks - n_long, n_shards=shards, compresslevel=1
    )
    gen.write_alibaba2018(
        traces, 0, days=days, n_long=max(1, tasks // 20), n_short=tasks // 20, compresslevel=1
    )
    n_files = sum(1 for _ in traces.rglob("*.csv*"))
    size = sum(p.stat().st_size for p in traces.rglob("*") if p.is_file())
    print(
        f"generated {n_files} files ({shards} shards per Google table), {size / 1e6:.1f} MB gzip, "
        f"in {time.perf_counter() - t0:.0f}s"
    )
    sources = ["google2011", "alibaba2018"]
    serial, s_out, s_wh = timed_run(traces, work, "google_serial", 1, sources, ("raw",))
    concurrent, c_out, _ = timed_run(traces, work, "google_concurrent", jobs, sources, ("raw",))
    print(f"raw layer, {len(s_out)} runs (one per shard):")
    compare("  raw layer", serial, concurrent, jobs)
    for line in layer_lines(c_out, list(dict.fromkeys(o.spec.layer for o in c_out))):
        print(f"  {jobs} at once:{line}")
    figures = per_table(s_out, s_wh, traces, work / "google_serial_home")
    project(figures, serial / concurrent, max(o.peak_rss_mib for o in c_out), [16, 64])


def sample_case(work: Path, jobs: int) -> None:
    traces = ROOT / "data"
    serial, s_out, _ = timed_run(traces, work, "sample_serial", 1, None, LAYERS)
    concurrent, c_out, _ = timed_run(traces, work, "sample_concurrent", jobs, None, LAYERS)
    print(f"embedded sample, whole pipeline, {len(s_out)} runs:")
    compare("  all layers", serial, concurrent, jobs)
    for title, out in (("serial", s_out), (f"{jobs} at once", c_out)):
        for line in layer_lines(out, list(dict.fromkeys(o.spec.layer for o in out))):
            print(f"  {title}:{line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=["google", "sample", "both"], default="both")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--shards", type=int, default=24, help="Google shards per table (>= 20)")
    p.add_argument("--tasks", type=int, default=6000, help="generated Google tasks")
    p.add_argument("--days", type=float, default=2.0)
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tvw_bench_runner_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores; scratch {work}")
    if args.case in ("google", "both"):
        google_case(work, args.jobs, args.shards, args.tasks, args.days)
    if args.case in ("sample", "both"):
        sample_case(work, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
