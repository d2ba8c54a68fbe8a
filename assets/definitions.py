"""The one `Definitions` object, built from explicit arguments (`build_definitions`), and the UI's entry point.

`tvw-run` builds the definitions from its flags. The UI (`tvw-ui`, `dagster dev`) loads `defs` lazily; only then
are these environment variables read (`tvw-ui`'s flags set them):
    TVW_TRACE_DIR       folder holding each source's folder in the public distribution layout (default: the
                        embedded sample in `data/`)
    TVW_WAREHOUSE_DIR   where Parquet tables and `tvw.duckdb` go (default: `warehouse/`). With a Dask cluster it
                        must be on a filesystem every worker sees (steps exchange data only through it)
    TVW_PROFILE         the configuration in force: `quick` (default), `sample`, `paper`, or a path to a YAML file
                        of the same shape. It is the default config of every asset (`assets.settings.apply_profile`)
                        and every job's `tvw/profile` tag, so the asset page's Materialize button, the launchpad,
                        `dagster asset materialize` and `tvw-run` use the same values. The trace folder never
                        changes it.
    TVW_DASK_SCHEDULER  address of a Dask scheduler (`tcp://host:8786`): every job's steps then run on that
                        cluster through dagster-dask's executor (default: in-process)
"""

import functools
import os
from pathlib import Path

import yaml
from dagster import Definitions, JobDefinition, definitions, in_process_executor

from assets import cluster, core, ec, leaderboard, rl, rl_baselines
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


DEFAULT_PROFILE = "quick"


def profile_name() -> str:
    """The profile in force: TVW_PROFILE, else `quick` (whatever the trace folder)."""
    return os.environ.get("TVW_PROFILE") or DEFAULT_PROFILE


def dask_scheduler() -> str | None:
    return os.environ.get("TVW_DASK_SCHEDULER") or None


PROFILE_KEYS = ("extends", "ops", "sources")


def load_profile(profile: str) -> dict:
    """A named profile or a YAML file: `ops:` (each asset's config, in its settings dataclass's field names),
    `sources:` (per source, the layers it is run through and why, for a sample that cannot feed the later ones),
    and optionally `extends:` (a profile whose settings these override). ProfileError names what is wrong."""
    path = PROFILES.get(profile, Path(profile))
    if not path.is_file():
        raise ProfileError(
            f"unknown profile {profile!r}: use one of {', '.join(PROFILES)} or a YAML file's path"
        )
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict) or set(config) - set(PROFILE_KEYS):
        extra = sorted(set(config) - set(PROFILE_KEYS)) if isinstance(config, dict) else config
        raise ProfileError(f"{path}: unknown top-level key(s) {extra}; allowed: {', '.join(PROFILE_KEYS)}")
    for key in ("ops", "sources"):
        if not isinstance(config.get(key) or {}, dict):
            raise ProfileError(f"{path}: `{key}:` must be a mapping")
    loaded = {
        "ops": dict(config.get("ops") or {}),
        "sources": _sources_section(path, config.get("sources") or {}),
    }
    base = config.get("extends")
    if base is None:
        return loaded
    parent = load_profile(str(base) if str(base) in PROFILES else str(path.parent / str(base)))
    return {
        "ops": merge_ops(parent["ops"], loaded["ops"]),
        "sources": {**parent["sources"], **loaded["sources"]},
    }


def _sources_section(path: Path, sources: dict) -> dict:
    """`sources: {<source>: {layers: [...], reason: ...}}` checked: known sources, both keys given."""
    from pipelines.sources import SOURCES

    for name, entry in sources.items():
        if name not in SOURCES:
            raise ProfileError(f"{path}: sources.{name}: unknown source; known: {', '.join(SOURCES)}")
        if (
            not isinstance(entry, dict)
            or set(entry) != {"layers", "reason"}
            or not isinstance(entry["layers"], list)
        ):
            raise ProfileError(f"{path}: sources.{name}: expected `layers: [...]` and `reason: ...`")
    return dict(sources)


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
    traces: Path, warehouse_root: Path, profile: str = DEFAULT_PROFILE, scheduler: str | None = None
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
            *leaderboard.LEADERBOARD_ASSETS,
        ],
        with_shared_ec_config(config["ops"]),
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
    return build_definitions(trace_dir(), warehouse_dir(), profile_name(), dask_scheduler())
