"""The one `Definitions` object, and the only place that reads settings from the environment.

Settings (environment variables; `tvw-run` and `tvw-ui` flags set the same ones):
    TVW_TRACE_DIR       folder holding `google-2011/`, `alibaba-2018/`, `google-2011-derived/` in the public
                        distribution layout (default: the embedded sample in `data/`)
    TVW_WAREHOUSE_DIR   where Parquet tables and `tvw.duckdb` go (default: `warehouse/`). With a Dask cluster it
                        must be on a filesystem every worker sees (steps exchange data only through it)
    TVW_PROFILE         the configuration in force: `sample`, `paper`, or a path to a run-config YAML of the
                        same shape (default: `sample` on the embedded sample, `paper` when TVW_TRACE_DIR is set).
                        Every job carries it as its default config and its `tvw/profile` tag, so the UI's
                        launchpad, `dagster job execute` and `tvw-run` use the same values
    TVW_DASK_SCHEDULER  address of a Dask scheduler (`tcp://host:8786`): every job's steps then run on that
                        cluster through dagster-dask's executor (default: in-process)
"""

import functools
import os
from pathlib import Path

import yaml
from dagster import Definitions, JobDefinition, in_process_executor

from assets import cluster, core, ec, rl, rl_baselines
from assets.io_manager import TableIOManager
from assets.jobs import build_jobs, with_shared_ec_config
from assets.raw import build_raw_assets
from assets.resources import TraceFolder, Warehouse
from assets.settings import ProfileError, apply_profile

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "quick": Path(__file__).with_name("quick_config.yaml"),
    "sample": Path(__file__).with_name("sample_config.yaml"),
    "paper": Path(__file__).with_name("paper_config.yaml"),
}
"""Named configurations; any other profile value is a path to a YAML file of the same shape."""
CODE_LOCATION = "tvw"
"""Code location name (pyproject's [tool.dagster]); runs started by `tvw-run` are attached to it."""


def trace_dir() -> Path:
    return Path(os.environ.get("TVW_TRACE_DIR", PROJECT_ROOT / "data")).resolve()


def warehouse_dir() -> Path:
    return Path(os.environ.get("TVW_WAREHOUSE_DIR", PROJECT_ROOT / "warehouse")).resolve()


def profile_name() -> str:
    """The profile in force: TVW_PROFILE, else `sample` on the embedded sample and `paper` on other traces."""
    return os.environ.get("TVW_PROFILE") or ("paper" if "TVW_TRACE_DIR" in os.environ else "sample")


def dask_scheduler() -> str | None:
    return os.environ.get("TVW_DASK_SCHEDULER") or None


def load_profile(profile: str) -> dict:
    """The run config (`ops:` per asset) of a named profile or of a YAML file; raises naming what is known."""
    path = PROFILES.get(profile, Path(profile))
    if not path.is_file():
        raise FileNotFoundError(
            f"profile {profile!r} is neither one of {sorted(PROFILES)} nor a run-config YAML file"
        )
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if (
        not isinstance(config, dict)
        or not isinstance(config.get("ops", {}), dict)
        or set(config) - {"ops", "extends"}
    ):
        raise ProfileError(
            f"{path}: expected `ops:` (and optionally `extends: <profile>`); see assets/sample_config.yaml"
        )
    base = config.get("extends")
    if base is None:
        return {"ops": dict(config.get("ops") or {})}
    return {"ops": merge_ops(load_profile(str(base))["ops"], config.get("ops") or {})}


def merge_ops(base: dict, over: dict) -> dict:
    """`over`'s settings on top of `base`'s, key by key (nested mappings merged, other values replaced)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            merge_ops(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def _executor(scheduler: str | None):
    if not scheduler:
        return in_process_executor
    from assets.dask_executor import dask_executor  # dagster-dask with task keys per run; `.[dask]` extra

    return dask_executor.configured({"cluster": {"existing": {"address": scheduler}}}, name="dask")


def build_definitions(
    traces: Path, warehouse_root: Path, profile: str = "sample", scheduler: str | None = None
) -> Definitions:
    """Definitions for a given trace folder, warehouse, profile and executor (tests point these at tmp_path)."""
    warehouse = Warehouse(root=str(warehouse_root))
    raw_assets = build_raw_assets(traces)
    config = load_profile(profile)
    all_assets = apply_profile(
        [
            *raw_assets,
            *core.CORE_ASSETS,
            *ec.EC_ASSETS,
            *cluster.CLUSTER_ASSETS,
            *rl.RL_ASSETS,
            *rl_baselines.RL_BASELINE_ASSETS,
        ],
        with_shared_ec_config(config["ops"]),
    )
    return Definitions(
        assets=all_assets,
        asset_checks=[*core.CORE_CHECKS],
        jobs=build_jobs(all_assets, config, profile),
        resources={
            "warehouse": warehouse,
            "traces": TraceFolder(root=str(traces)),
            "table_io": TableIOManager(warehouse=warehouse),
        },
        executor=_executor(scheduler),
    )


@functools.cache
def _cached_definitions(traces: str, warehouse_root: str, profile: str, scheduler: str | None) -> Definitions:
    return build_definitions(Path(traces), Path(warehouse_root), profile, scheduler)


def job_for(
    job_name: str, traces: str, warehouse_root: str, profile: str, scheduler: str | None = None
) -> JobDefinition:
    """One named job of the definitions built from these settings. Module-level, so that
    `dagster.build_reconstructable_job("assets.definitions", "job_for", args)` can rebuild it in another
    process (a `tvw-run` worker, a Dask worker)."""
    return _cached_definitions(traces, warehouse_root, profile, scheduler).resolve_job_def(job_name)


defs = build_definitions(trace_dir(), warehouse_dir(), profile_name(), dask_scheduler())
