"""`tvw-run`: materialise every asset, layer by layer, on the configured traces (default: the embedded sample).

    raw layer      one run per (table, shard): a bad shard fails alone, the others still land
    per source     one run of `per_source_job` per trace source
    cluster        one run of `cluster_job`

Runs are recorded in the project's Dagster instance (`.dagster_home/`), so `dagster dev` shows them.
Exit status 1 when any run failed; the summary names which.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CONFIG = Path(__file__).with_name("sample_config.yaml")


def _ensure_dagster_home() -> Path:
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return home


def _run_config(path: Path | None) -> dict:
    return yaml.safe_load(path.read_text()) if path else {}


QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
"""Dagster's console logger prints every step event; the summary lines below say what matters."""


def _ops_config_for(job_def, run_config: dict) -> dict:
    """Keep only the ops config entries that belong to this job (Dagster rejects unknown ops)."""
    names = {node.name for node in job_def.graph.nodes}
    ops = {k: v for k, v in run_config.get("ops", {}).items() if k in names}
    return {**QUIET, "ops": ops} if ops else dict(QUIET)


def run_all(defs, instance, run_config: dict, log=print) -> list[str]:
    """Materialise every layer of `defs` on `instance`; return the failed runs (empty when all succeeded)."""
    from dagster import materialize

    from assets.core import SOURCE_PARTITIONS
    from assets.raw import NO_SHARD

    resources = defs.resources
    failures: list[str] = []
    raw_assets = [a for a in defs.assets if any(k.path[0].startswith("raw_") for k in a.keys)]

    # raw layer: a run per shard
    for asset_def in raw_assets:
        keys = asset_def.partitions_def.get_partition_keys()
        if keys == [NO_SHARD]:
            log(f"  {asset_def.key.to_user_string()}: no shard in the trace folder, skipped")
            continue
        for key in keys:
            t0 = time.perf_counter()
            res = materialize(
                [asset_def],
                instance=instance,
                resources=resources,
                partition_key=key,
                run_config=QUIET,
                raise_on_error=False,
            )
            status = "ok" if res.success else "FAILED"
            log(f"  {asset_def.key.to_user_string()}[{key}]: {status} ({time.perf_counter() - t0:.1f}s)")
            if not res.success:
                failures.append(f"{asset_def.key.to_user_string()}[{key}]")

    # per-source layer
    job = defs.resolve_job_def("per_source_job")
    for source in SOURCE_PARTITIONS.get_partition_keys():
        t0 = time.perf_counter()
        res = job.execute_in_process(
            instance=instance,
            partition_key=source,
            run_config=_ops_config_for(job, run_config),
            raise_on_error=False,
        )
        log(
            f"  per_source_job[{source}]: {'ok' if res.success else 'FAILED'} ({time.perf_counter() - t0:.1f}s)"
        )
        if not res.success:
            failures.append(f"per_source_job[{source}]")

    # cluster layer
    job = defs.resolve_job_def("cluster_job")
    if job.graph.nodes:
        t0 = time.perf_counter()
        res = job.execute_in_process(
            instance=instance, run_config=_ops_config_for(job, run_config), raise_on_error=False
        )
        log(f"  cluster_job: {'ok' if res.success else 'FAILED'} ({time.perf_counter() - t0:.1f}s)")
        if not res.success:
            failures.append("cluster_job")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tvw-run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="run config YAML (default: the embedded-sample config when TVW_TRACE_DIR is unset, "
        "else the paper defaults)",
    )
    args = parser.parse_args(argv)
    home = _ensure_dagster_home()
    config_path = args.config or (None if "TVW_TRACE_DIR" in os.environ else SAMPLE_CONFIG)

    from dagster import DagsterInstance

    from assets.definitions import defs, trace_dir, warehouse_dir

    print(f"traces:    {trace_dir()}")
    print(f"warehouse: {warehouse_dir()}")
    print(f"config:    {config_path or 'paper defaults'}")
    t0 = time.perf_counter()
    failures = run_all(defs, DagsterInstance.get(), _run_config(config_path))
    db = warehouse_dir() / "tvw.duckdb"
    print(f"\nfinished in {time.perf_counter() - t0:.0f}s; DAGSTER_HOME={home}")
    print(f"results: Parquet under {warehouse_dir() / 'tables'}, DuckDB views in {db}")
    duckdb_cli = Path(sys.executable).with_name("duckdb")
    query = (
        "select source, load_pct, policy, round(mean, 3) as avg_util_cpu from eval__summary "
        "where metric = 'avg_util_cpu_frac' order by source, load_pct, mean desc"
    )
    print(f'try:     {duckdb_cli if duckdb_cli.exists() else "duckdb"} {db} "{query}"')
    if failures:
        print("FAILED: " + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


def ui(argv: list[str] | None = None) -> None:
    """`tvw-ui`: `dagster dev` on 127.0.0.1:3000 with the project's own DAGSTER_HOME (telemetry off).

    Extra arguments go to `dagster dev`. SIGINT is reset to its default first: a shell that starts a
    background job ignores SIGINT in it, and `dagster dev` would then outlive Ctrl-C / kill -INT."""
    import signal

    home = _ensure_dagster_home()
    args = ["dagster", "dev", "-h", "127.0.0.1", "-p", "3000", *(sys.argv[1:] if argv is None else argv)]
    print(f"DAGSTER_HOME={home}; starting: {' '.join(args)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    dagster = Path(sys.executable).with_name("dagster")
    os.chdir(PROJECT_ROOT)  # dagster dev reads [tool.dagster] from pyproject.toml here
    os.execv(str(dagster), args)


if __name__ == "__main__":
    sys.exit(main())
