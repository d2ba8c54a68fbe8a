"""The EC layers (`ec_sweep`, `ec_gain`, `ec`) with `--jobs 1` vs `--jobs N`: wall time of the three layers and
the speed-up, with the load average (prints figures; not a test).

    python benchmarks/bench_ec_fanout.py                          # the test fixtures, sample profile, N = 2
    python benchmarks/bench_ec_fanout.py --traces data --jobs 2   # the embedded sample

The raw and per-source layers run once into a base warehouse; each measurement copies it to a fresh warehouse
and Dagster instance under --work (default: a temporary folder), so both measure the same EC work.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from cli.run import run_all
from cli.summary import layer_lines
from cli.workers import Target

ROOT = Path(__file__).resolve().parents[1]
EC_LAYERS = ("ec_sweep", "ec_gain", "ec")


def _instance_dir(work: Path, name: str) -> Path:
    home = work / f"{name}_home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _run(traces: Path, wh: Path, home: Path, profile: str, jobs: int, layers: tuple[str, ...]):
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        load = os.getloadavg()
        t0 = time.perf_counter()
        outcomes = run_all(
            Target(str(traces), str(wh), profile),
            instance,
            log=lambda _: None,
            max_concurrent=jobs,
            layers=list(layers),
        )
        wall = time.perf_counter() - t0
    failed = [o.spec.label for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"runs failed: {failed}")
    return wall, outcomes, (load, os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=Path, default=ROOT / "tests" / "fixtures" / "traces")
    parser.add_argument("--profile", default="sample")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate serial and concurrent this many times"
    )
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tvw_bench_ec_"))
    base = work / "base_wh"
    shutil.rmtree(base, ignore_errors=True)
    _run(args.traces.resolve(), base, _instance_dir(work, "base"), args.profile, 1, ("raw", "per_source"))
    for r in range(args.repeats):
        walls = {}
        for jobs in (1, args.jobs):
            wh = work / f"jobs{jobs}_wh"
            shutil.rmtree(wh, ignore_errors=True)
            shutil.copytree(base, wh)
            wall, outcomes, (before, after) = _run(
                args.traces.resolve(), wh, _instance_dir(work, f"jobs{jobs}"), args.profile, jobs, EC_LAYERS
            )
            walls[jobs] = wall
            print(
                f"repeat {r}: --jobs {jobs}: EC layers {wall:.1f}s wall, {len(outcomes)} runs, "
                f"load average {before[0]:.2f} before / {after[0]:.2f} after"
            )
            print("\n".join(layer_lines(outcomes, list(EC_LAYERS))))
        print(f"repeat {r}: speed-up --jobs {args.jobs} over --jobs 1: {walls[1] / walls[args.jobs]:.2f}x")


if __name__ == "__main__":
    main()
