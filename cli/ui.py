"""`tvw-ui`: `dagster dev` on 127.0.0.1:3000 with the project's own DAGSTER_HOME (telemetry off)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from cli.run import PROJECT_ROOT, ensure_dagster_home


def main(argv: list[str] | None = None) -> None:
    """SIGINT is reset to its default first: a shell that starts a background job ignores SIGINT in it, and
    `dagster dev` would then outlive Ctrl-C / kill -INT."""
    parser = argparse.ArgumentParser(
        prog="tvw-ui",
        description="The Dagster UI (`dagster dev`, http://127.0.0.1:3000) over the project's instance: the "
        "runs made by tvw-run, every asset, job, partition, check and table.",
        epilog="Any other argument goes to `dagster dev` (e.g. -p 3001). Environment: TVW_TRACE_DIR, "
        "TVW_WAREHOUSE_DIR, TVW_PROFILE, TVW_DASK_SCHEDULER, DAGSTER_HOME (default .dagster_home/).",
    )
    parser.add_argument("--traces", type=Path, help="trace folder (sets TVW_TRACE_DIR; default: data/)")
    parser.add_argument(
        "--warehouse", type=Path, help="Parquet tables and tvw.duckdb (sets TVW_WAREHOUSE_DIR)"
    )
    parser.add_argument(
        "--profile",
        help="configuration in force as every asset's default and every job's tag: quick | sample | paper | trace_requests | a "
        "YAML file (sets TVW_PROFILE; default: quick)",
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    for flag, env in ((args.traces, "TVW_TRACE_DIR"), (args.warehouse, "TVW_WAREHOUSE_DIR")):
        if flag:
            os.environ[env] = str(flag.resolve())
    if args.profile:
        os.environ["TVW_PROFILE"] = (
            str(Path(args.profile).resolve()) if Path(args.profile).is_file() else args.profile
        )
    home = ensure_dagster_home()
    dagster_args = ["dagster", "dev", "-h", "127.0.0.1", "-p", "3000", *rest]
    print(f"DAGSTER_HOME={home}; starting: {' '.join(dagster_args)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    dagster = Path(sys.executable).with_name("dagster")
    os.chdir(PROJECT_ROOT)  # dagster dev reads [tool.dagster] from pyproject.toml here
    os.execv(str(dagster), dagster_args)
