"""The one `Definitions` object, built from explicit arguments (`build_definitions`), and the UI's entry point
`defs`, which reads TVW_TRACE_DIR, TVW_WAREHOUSE_DIR, TVW_PROFILE and TVW_DASK_SCHEDULER when Dagster loads it
(`pipelines.profiles.environment`; `tvw-ui`'s flags set them). The profile is every asset's default config and
every job's `tvw/profile` tag; the trace folder never changes it."""

import functools
from pathlib import Path

from dagster import Definitions, JobDefinition, definitions, in_process_executor

from assets import cluster, core, ec, leaderboard, rl, rl_baselines
from assets.io_manager import TableIOManager
from assets.jobs import SHARED_CONFIG, build_jobs
from assets.raw import build_raw_assets
from assets.resources import TraceFolder, Warehouse
from assets.settings import apply_profile
from pipelines.profiles import DEFAULT_PROFILE, ProfileError, environment, read_profile

__all__ = ["DEFAULT_PROFILE", "ProfileError", "load_profile"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_NAMED = ("quick", "sample", "paper", "trace_requests", "placer")
PROFILES = {name: Path(__file__).with_name(f"{name}_config.yaml") for name in _NAMED}
"""Named configurations; any other profile value is a path to a YAML file of the same shape."""
CODE_LOCATION = "tvw"
"""Code location name (pyproject's [tool.dagster]); runs started by `tvw-run` are attached to it."""


load_profile = functools.partial(read_profile, named=PROFILES)
"""`load_profile(name or path)`: `{"ops": ..., "sources": ...}` of a profile (`pipelines.profiles.read_profile`)."""


def _executor(scheduler: str | None):
    if not scheduler:
        return in_process_executor
    from assets.dask_executor import dask_executor  # dagster-dask with task keys per run; `.[dask]` extra

    return dask_executor.configured({"cluster": {"existing": {"address": scheduler}}}, name="dask")


def build_definitions(
    traces: Path, warehouse_root: Path, profile: str = DEFAULT_PROFILE, scheduler: str | None = None
) -> Definitions:
    """Definitions for a given trace folder, warehouse, profile and executor (tests point these at tmp_path)."""
    warehouse = Warehouse(root=str(warehouse_root))
    config = load_profile(profile)
    all_assets = apply_profile(
        [
            *build_raw_assets(traces),
            *core.CORE_ASSETS,
            *ec.EC_ASSETS,
            *cluster.CLUSTER_ASSETS,
            *rl.RL_ASSETS,
            *rl_baselines.RL_BASELINE_ASSETS,
            *leaderboard.LEADERBOARD_ASSETS,
        ],
        config["ops"],
        shared=SHARED_CONFIG,
    )
    return Definitions(
        assets=all_assets,
        asset_checks=[*core.CORE_CHECKS],
        jobs=build_jobs(all_assets, profile),
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


@definitions
def defs() -> Definitions:
    """The UI's definitions (`dagster dev` loads this lazily): the trace folder, warehouse, profile and executor
    from the environment (`tvw-ui` sets it from its flags)."""
    env = environment(PROJECT_ROOT)
    return build_definitions(env.traces, env.warehouse, env.profile, env.scheduler)
