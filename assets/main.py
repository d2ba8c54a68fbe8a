"""`tvw-run`: materialise every asset on the configured traces (default: the embedded sample), running
independent work at the same time.

    raw layer      a run of `raw_<source>__<table>_job` per shard file: a bad shard fails alone
    per_source     a run of `per_source_job` per trace source, started as soon as that source's shards are in
    ec_sweep       a run of `ec_sweep_job` per (source, EC method): one distance's k sweep
    ec_gain        a run of `ec_gain_job` per (source, EC method), once every method of that source is swept
    ec             a run of `ec_job` per source, once its methods are scored: the choice, labels, classifier
    cluster        a run of `cluster_job` once every source is done (job sequences, EC labelling in the simulator)
    eval           a run of `eval_job` per configured load (every heuristic on every source), then `eval_summary_job`
    rl             a run of `rl_job` per (load, training seed), beside the eval runs: the learned schedulers
    results        a run of `results_job`: every policy, learned ones included, and its summary

Every run is a normal run of a named job of the `tvw` code location, recorded in the project's Dagster
instance (`.dagster_home/`): `tvw-ui` shows them on the job pages and the timeline, and re-executes them.
Up to `--jobs` runs go at once (default: the number of cores), each in one of `--jobs` worker processes;
with TVW_DASK_SCHEDULER set, every step of those runs executes on that Dask cluster instead.
Exit status 1 when any run failed; the summary names which.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CONFIG = Path(__file__).with_name("sample_config.yaml")
LAYERS = ("raw", "per_source", "ec_sweep", "ec_gain", "ec", "cluster", "eval", "rl", "results")
SOURCE_LAYERS = ("raw", "per_source", "ec_sweep", "ec_gain", "ec")
"""Layers whose runs are per source: a run waits only for the earlier layers' runs of its own source."""

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
"""Dagster's console logger prints every step event; the terminal gets the runner's own lines and errors, and
every event and warning stays in the run's log (the UI's run page)."""


def _ensure_dagster_home() -> Path:
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return home


@dataclasses.dataclass(frozen=True)
class Target:
    """What every run of one `tvw-run` invocation reads and writes (picklable: sent to worker processes)."""

    traces: str
    warehouse: str
    profile: str = "sample"
    scheduler: str | None = None
    """Dask scheduler address: steps run there (None: in the run's own process)."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run to make: a named job, and its partition when the job is partitioned."""

    layer: str
    job: str
    partition: str | None
    source: str | None
    input_bytes: int = 0

    @property
    def label(self) -> str:
        return f"{self.job}[{self.partition}]" if self.partition else self.job


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    ok: bool
    seconds: float
    run_id: str
    peak_rss_mib: float
    """peak resident memory of the process that made the run (a worker, or this process), MiB"""
    started_at: float = 0.0
    """wall-clock start (time.time()), to get a layer's wall time from its runs"""


def _remote_origin(job_name: str):
    """The origin the UI knows this code location by (`dagster dev` loading `assets.definitions` as `tvw`):
    a run that carries it is listed on the job's page and can be re-executed from there."""
    from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
    from dagster._core.remote_origin import (
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from assets.definitions import CODE_LOCATION

    location = ManagedGrpcPythonEnvCodeLocationOrigin(
        LoadableTargetOrigin(
            executable_path=sys.executable,
            module_name="assets.definitions",
            working_directory=str(PROJECT_ROOT),
        ),
        location_name=CODE_LOCATION,
    )
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, SINGLETON_REPOSITORY_NAME), job_name)


def execute_named_run(target: Target, spec: RunSpec, instance, run_config: dict) -> RunOutcome:
    """Create a run of `spec.job` (for `spec.partition`) in `instance`, attached to the code location, and
    execute it in this process with the job's executor (in-process, or Dask)."""
    import resource

    from dagster import build_reconstructable_job
    from dagster._core.execution.api import execute_run

    recon = build_reconstructable_job(
        "assets.definitions",
        "job_for",
        reconstructable_args=(spec.job, target.traces, target.warehouse, target.profile, target.scheduler),
    )
    job_def = recon.get_definition()
    tags = {**job_def.tags, "tvw/runner": "tvw-run"}
    if spec.partition:
        tags["dagster/partition"] = spec.partition
    t0, started_at = time.perf_counter(), time.time()
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=run_config,
        tags=tags,
        remote_job_origin=_remote_origin(spec.job),
        job_code_origin=recon.get_python_origin(),
    )
    result = execute_run(recon, run, instance, raise_on_error=False)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return RunOutcome(spec, result.success, time.perf_counter() - t0, run.run_id, rss_mib, started_at)


# worker processes: each opens the instance once and then makes the runs it is handed
_WORKER_INSTANCE = None


THREAD_ENV = (
    "POLARS_MAX_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
"""Thread pools sized from these at import (polars, torch/numpy BLAS, numba): a worker gets its share of the cores."""


def _init_worker(instance_ref, threads: int) -> None:
    global _WORKER_INSTANCE
    for name in THREAD_ENV:  # before polars / torch / numba are imported in this fresh process
        os.environ.setdefault(name, str(threads))
    from dagster import DagsterInstance

    _WORKER_INSTANCE = DagsterInstance.from_ref(instance_ref)


def _run_in_worker(target: Target, spec: RunSpec, run_config: dict) -> RunOutcome:
    return execute_named_run(target, spec, _WORKER_INSTANCE, run_config)


def _read_marker(path: str) -> str | None:
    """On a Dask worker: the content of the marker file, or None when this worker cannot see it."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def check_shared_warehouse(scheduler: str, warehouse: str) -> None:
    """Stop unless every worker of the Dask cluster at `scheduler` sees the warehouse folder as this process
    does (steps exchange data only through the Parquet files there): write a marker with a fresh token and
    have every worker read it back."""
    import uuid

    from distributed import Client

    root = Path(warehouse)
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = root / f".tvw-shared-check-{token}"
    marker.write_text(token)
    try:
        with Client(scheduler, timeout=30) as client:
            seen = client.run(_read_marker, str(marker))
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted(w for w, got in seen.items() if got != token)
    if not seen or blind:
        raise RuntimeError(
            f"TVW_WAREHOUSE_DIR={root} must be on a filesystem every Dask worker sees (NFS, Lustre, ...): "
            + (f"worker(s) {blind} cannot read {marker.name} there" if seen else "the cluster has no worker")
        )


def plan_runs(
    target: Target, sources: list[str], layers: tuple[str, ...], run_config: dict | None = None
) -> list[RunSpec]:
    """Every run of the chosen layers and sources, raw shards largest first (the long ones start early).
    The evaluation runs are the loads of `sim__job_sequences.loads_pct` in `run_config` (default: the
    target's profile)."""
    from assets.jobs import raw_job_name
    from assets.raw import raw_table_name
    from pipelines.sources import SOURCES

    specs: list[RunSpec] = []
    if "raw" in layers:
        raw = []
        for s in sources:
            for table in SOURCES[s].tables:
                for key, path in SOURCES[s].discover(Path(target.traces), table).items():
                    job = raw_job_name(raw_table_name(s, table))
                    raw.append(RunSpec("raw", job, key, s, path.stat().st_size))
        specs += sorted(raw, key=lambda r: -r.input_bytes)
    if "per_source" in layers:
        specs += [RunSpec("per_source", "per_source_job", s, s) for s in sources]
    methods = ec_methods(target, run_config)
    for layer, job in (("ec_sweep", "ec_sweep_job"), ("ec_gain", "ec_gain_job")):
        if layer in layers:
            specs += [RunSpec(layer, job, ec_partition(s, m), s) for s in sources for m in methods]
    if "ec" in layers:
        specs += [RunSpec("ec", "ec_job", s, s) for s in sources]
    if "cluster" in layers:
        specs.append(RunSpec("cluster", "cluster_job", None, None))
    if "eval" in layers:
        specs += [RunSpec("eval", "eval_job", key, None) for key in eval_partitions(target, run_config)]
        specs.append(RunSpec("eval", "eval_summary_job", None, None))
    if "rl" in layers:
        from assets.rl import RL_PARTITIONS

        specs += [RunSpec("rl", "rl_job", key, None) for key in RL_PARTITIONS.get_partition_keys()]
    if "results" in layers:
        specs.append(RunSpec("results", "results_job", None, None))
    return specs


def _op_config(target: Target, run_config: dict | None, op: str) -> dict:
    """`op`'s `config:` entry in the run config (default: the target's profile); {} where it sets none."""
    from assets.definitions import load_profile

    config = load_profile(target.profile) if run_config is None else run_config
    return config.get("ops", {}).get(op, {}).get("config", {})


def ec_methods(target: Target, run_config: dict | None = None) -> list[str]:
    """The EC distance methods `ec__mapping` is configured with (its default when the run config, default the
    target's profile, does not set them): the methods the EC sweep fans out over."""
    from assets.ec import EcRunConfig

    ec = _op_config(target, run_config, "ec__mapping")
    return list(ec.get("methods", EcRunConfig().methods))


def ec_partition(source: str, method: str) -> str:
    """The `ec_sweep_job` / `ec_gain_job` partition key of (source, method)."""
    from dagster import MultiPartitionKey

    return str(MultiPartitionKey({"source": source, "method": method}))


def eval_partitions(target: Target, run_config: dict | None = None) -> list[str]:
    """The `eval_job` partitions of the loads `sim__job_sequences` is configured with (its default when the
    run config, default the target's profile, does not set them); ValueError for a load with no partition."""
    from assets.cluster import JobSequencesConfig, eval_partition_keys

    seq = _op_config(target, run_config, "sim__job_sequences")
    return eval_partition_keys(list(seq.get("loads_pct", JobSequencesConfig().loads_pct)))


def _ready(spec: RunSpec, pending: list[RunSpec], running: set[RunSpec]) -> bool:
    """A run of a per-source layer (per_source, ec_sweep, ec_gain, ec) waits for the earlier layers' runs of its
    own source: an EC method's gain run for every method's sweep of its source (the common k), the EC choice
    for every method's gain run; the cluster run waits for every earlier run; the evaluation runs and the
    training runs wait for the cluster run (the job sequences) and go side by side; the evaluation summary
    waits for the evaluation runs, the results for everything."""
    blockers = [*pending, *running]
    if spec.layer in SOURCE_LAYERS:
        earlier = SOURCE_LAYERS[: SOURCE_LAYERS.index(spec.layer)]
        return not any(b.layer in earlier and b.source == spec.source for b in blockers)
    if spec.layer == "cluster":
        return not any(b.layer not in ("cluster", "eval", "rl", "results") for b in blockers)
    if spec.job == "eval_summary_job":
        return not any(b.layer not in ("rl", "results") and b.job != spec.job for b in blockers)
    if spec.layer in ("eval", "rl"):  # both read the job sequences
        return not any(b.layer not in ("eval", "rl", "results") for b in blockers)
    if spec.layer == "results":
        return not any(b.layer != "results" for b in blockers)
    return True


def _ops_config_for(target: Target, job_name: str, run_config: dict) -> dict:
    """The run config of one run: the profile's entries for this job's ops (`ec__mapping`'s also for the EC
    sweep and gain ops), and a quiet console."""
    from assets.definitions import job_for
    from assets.jobs import ops_config_of

    job = job_for(job_name, target.traces, target.warehouse, target.profile, target.scheduler)
    return {**QUIET, **ops_config_of({node.name for node in job.graph.nodes}, run_config)}


def run_all(
    target: Target,
    instance,
    run_config: dict | None = None,
    log: Callable[[str], None] = print,
    max_concurrent: int = 1,
    sources: list[str] | None = None,
    layers: tuple[str, ...] = LAYERS,
) -> list[RunOutcome]:
    """Make every run of `layers` for `sources` (default: all) on `instance`, up to `max_concurrent` at once
    (1: one after the other in this process); return the outcome of each, in the order they finished.

    `run_config` defaults to the target's profile. Concurrent runs need a persistent instance (worker
    processes reopen it from its reference)."""
    from assets.definitions import load_profile
    from assets.raw import remove_stale_raw
    from assets.resources import Warehouse
    from pipelines.sources import SOURCES

    run_config = load_profile(target.profile) if run_config is None else run_config
    sources = list(sources or SOURCES)
    if "raw" in layers:
        stale = remove_stale_raw(Warehouse(root=target.warehouse), Path(target.traces), sources)
        if stale:
            shown = ", ".join(f"{p.table}[{p.stem}]" for p in stale[:5]) + (" ..." if len(stale) > 5 else "")
            log(f"  removed {len(stale)} raw partition(s) not ingested from {target.traces}: {shown}")
    pending = plan_runs(target, sources, layers, run_config)
    if "eval" in layers:
        unplanned = remove_unplanned_evaluations(Warehouse(root=target.warehouse), pending)
        if unplanned:
            log(f"  removed eval__baselines partition(s) of loads not configured now: {', '.join(unplanned)}")
    configs = {s.job: _ops_config_for(target, s.job, run_config) for s in pending}
    outcomes: list[RunOutcome] = []

    def finished(o: RunOutcome) -> None:
        outcomes.append(o)
        status = "ok" if o.ok else f"FAILED (run {o.run_id})"
        log(f"  {o.spec.label}: {status} ({o.seconds:.1f}s)")

    if max_concurrent <= 1:
        for spec in pending:
            finished(execute_named_run(target, spec, instance, configs[spec.job]))
        return outcomes

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked sqlite handles or threads
    running: dict[Future, RunSpec] = {}
    threads = max(1, (os.cpu_count() or 1) // max_concurrent)  # N workers x their threads = the cores
    with ProcessPoolExecutor(max_concurrent, ctx, _init_worker, (instance.get_ref(), threads)) as pool:
        while pending or running:
            for spec in [s for s in pending if _ready(s, pending, set(running.values()))]:
                if len(running) >= max_concurrent:
                    break
                pending.remove(spec)
                running[pool.submit(_run_in_worker, target, spec, configs[spec.job])] = spec
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                running.pop(fut)
                finished(fut.result())
    return outcomes


def remove_unplanned_evaluations(warehouse, planned: list[RunSpec]) -> list[str]:
    """Delete the stored `eval__baselines` partitions of loads that this invocation does not evaluate (left by
    a run with other loads): readers concatenate every stored partition, and must not mix in stale loads."""
    from assets.resources import partition_file_stem

    keep = {partition_file_stem(s.partition) for s in planned if s.job == "eval_job"}
    stale = sorted(set(warehouse.partition_keys_on_disk("eval__baselines")) - keep)
    for stem in stale:
        warehouse.remove_partition("eval__baselines", stem)
    return stale


def layer_lines(outcomes: list[RunOutcome]) -> list[str]:
    """One line per layer: runs made, failed, summed run time."""
    lines = []
    for layer in LAYERS:
        runs = [o for o in outcomes if o.spec.layer == layer]
        if runs:
            failed = sum(not o.ok for o in runs)
            wall = max(o.started_at + o.seconds for o in runs) - min(o.started_at for o in runs)
            lines.append(
                f"  {layer:<10} {len(runs):>4} run(s), {failed} failed, {wall:.0f}s wall, "
                f"{sum(o.seconds for o in runs):.0f}s of run time, peak RSS per worker "
                f"{max(o.peak_rss_mib for o in runs):.0f} MiB"
            )
    return lines


class TraceFolderError(RuntimeError):
    """The trace folder lacks the shards of a source the run was asked for."""


def expected_layout(traces: Path, source: str) -> str:
    """Where a source's files go under the trace folder, and how they are named (from its `discover`)."""
    import inspect

    from pipelines.sources import SOURCES

    src = SOURCES[source]
    naming = (inspect.getdoc(type(src).discover) or "").splitlines()[0]
    return f"{source}: {traces / src.folder}/ with tables {', '.join(src.tables)} ({naming})"


def check_trace_folder(traces: Path, sources: list[str], subset_asked: bool) -> dict[str, int]:
    """Shards found per source. Stops at once, naming the folder and the layout expected per source, when the
    folder is missing or a source has no shard at all, unless the user asked for a subset of sources (then
    only the asked ones must have shards)."""
    from pipelines.sources import SOURCES
    from pipelines.sources.base import unread_file_warnings

    found = {s: sum(len(SOURCES[s].discover(traces, t)) for t in SOURCES[s].tables) for s in sources}
    empty = [s for s, n in found.items() if n == 0]
    if not traces.is_dir() or empty:
        what = "does not exist" if not traces.is_dir() else f"has no shard of {', '.join(empty)}"
        layout = "\n".join("  " + expected_layout(traces, s) for s in (empty or sources))
        present = [s for s, n in found.items() if n]
        hint = (
            f"\nTo run only the sources you have, pass --sources {','.join(present)}"
            if present and not subset_asked
            else ""
        )
        raise TraceFolderError(
            f"trace folder {traces} {what} (TVW_TRACE_DIR). Expected layout:\n{layout}{hint}"
        )
    for line in unread_file_warnings(traces, SOURCES.values(), sources):  # nothing is ignored silently
        print(f"WARNING {line}", file=sys.stderr)
    return found


def failed_check_lines(instance, outcomes: list[RunOutcome]) -> list[str]:
    """One warning line per asset check that did not pass in the runs of `outcomes` (a run whose checks fail
    still succeeds: the checks say what is wrong with its tables), naming the check, its asset and severity."""
    from dagster import DagsterEventType

    lines = []
    for o in outcomes:
        if not o.run_id:
            continue
        for record in instance.get_records_for_run(
            o.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
        ).records:
            check = record.event_log_entry.dagster_event.event_specific_data
            if not check.passed:
                severity = getattr(check.severity, "value", str(check.severity))
                lines.append(
                    f"  WARNING check failed ({severity}): {check.asset_key.to_user_string()}"
                    f".{check.check_name} in {o.spec.label}"
                )
    return lines


def source_summary(warehouse: Path, sources: list[str], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Per source: workloads, long-running workloads kept, equivalence classes, job sequences; a warning line
    for a source whose thresholds kept too few workloads for the later layers (of those in `layers`: a run of
    the early layers alone is not warned about the tables it did not make)."""
    import polars as pl

    from assets.resources import Warehouse

    wh = Warehouse(root=str(warehouse))

    warnings = []

    def read(table: str, query) -> pl.DataFrame | None:
        """`query` over the table's files, or None (with a warning line) where its partitions disagree: files
        written by different versions of the code, e.g. a source not re-run since an upgrade."""
        if not wh.has_table(table):
            return None
        try:
            return query(wh.scan(table)).collect()
        except pl.exceptions.PolarsError as e:
            first = str(e).splitlines()[0]
            warnings.append(
                f"  WARNING {table}: its partitions cannot be read together ({first}); re-run the layers of "
                "the sources not run with this version, or remove their stale files"
            )
            return None

    def counts(table: str, expr: pl.Expr) -> dict[str, int]:
        df = read(table, lambda lf: lf.group_by("source").agg(expr.alias("n")))
        return {} if df is None else {s: int(n) for s, n in df.iter_rows()}

    workloads = counts("core__workloads", pl.len())
    kept = counts("core__long_running", pl.len())
    ecs = counts("ec__assignments", pl.col("ec_label").n_unique())
    seqs = counts("sim__job_sequences", pl.struct("load_pct", "split", "sequence_id").n_unique())
    rows = read("ec__method_comparison", lambda lf: lf.filter(pl.col("is_chosen")))
    chosen = {
        r["source"]: f"{r['method']} k={r['k']} ({r['choice_basis']})"
        for r in ([] if rows is None else rows.iter_rows(named=True))
    }
    lines = [f"  {'source':<20} {'workloads':>10} {'kept':>8} {'ECs':>5} {'sequences':>10}  EC mapping"]
    for s in sources:
        row = [workloads.get(s, 0), kept.get(s, 0), ecs.get(s, 0), seqs.get(s, 0)]
        method = chosen.get(s, "-")
        lines.append(f"  {s:<20} {row[0]:>10} {row[1]:>8} {row[2]:>5} {row[3]:>10}  {method}")
        if row[1] == 0:
            warnings.append(
                f"  WARNING {s}: no long-running workload kept of {row[0]}: its EC and evaluation rows are "
                "empty (lower core__long_running.min_contiguous_bins in the profile, or use longer traces)"
            )
        elif row[2] == 0 and "ec" in layers:
            warnings.append(f"  WARNING {s}: {row[1]} kept, too few to map to equivalence classes")
        elif row[2] > 0 and row[3] == 0 and "cluster" in layers:
            warnings.append(f"  WARNING {s}: {row[1]} kept in {row[2]} ECs, too few to build job sequences")
    return lines + warnings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvw-run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Environment: TVW_TRACE_DIR, TVW_WAREHOUSE_DIR, TVW_PROFILE, TVW_DASK_SCHEDULER, DAGSTER_HOME "
        "(the flags above set the first four).",
    )
    parser.add_argument(
        "--traces", type=Path, help="trace folder (sets TVW_TRACE_DIR; default: the embedded sample in data/)"
    )
    parser.add_argument(
        "--warehouse",
        type=Path,
        help="where the Parquet tables and tvw.duckdb go (sets TVW_WAREHOUSE_DIR; default: warehouse/)",
    )
    parser.add_argument(
        "--profile",
        "--config",
        dest="profile",
        help="configuration: sample | paper | path to a run-config YAML (sets TVW_PROFILE; default: sample on "
        "the embedded sample, paper on other traces). Recorded as the tvw/profile tag of every run",
    )
    parser.add_argument(
        "--sources",
        help="comma-separated subset of trace sources (default: all; each must have shards in the folder)",
    )
    parser.add_argument(
        "--layers",
        default=",".join(LAYERS),
        help="comma-separated subset of %(default)s (later layers read what earlier runs wrote)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="runs at once, each in a worker process (default: the number of cores, here %(default)s; "
        "1: one after the other in this process)",
    )
    parser.add_argument(
        "--dask-scheduler",
        help="run every step on this Dask cluster (tcp://host:8786; sets TVW_DASK_SCHEDULER); the warehouse "
        "must be on a filesystem every worker sees, and is checked first",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for flag, env in (
        (args.traces, "TVW_TRACE_DIR"),
        (args.warehouse, "TVW_WAREHOUSE_DIR"),
        (args.profile, "TVW_PROFILE"),
        (args.dask_scheduler, "TVW_DASK_SCHEDULER"),
    ):
        if flag:
            os.environ[env] = str(flag.resolve()) if isinstance(flag, Path) else flag
    if args.profile and Path(args.profile).is_file():
        os.environ["TVW_PROFILE"] = str(Path(args.profile).resolve())
    home = _ensure_dagster_home()

    from dagster import DagsterInstance

    from assets.definitions import dask_scheduler, profile_name, trace_dir, warehouse_dir
    from pipelines.sources import SOURCES

    sources = args.sources.split(",") if args.sources else list(SOURCES)
    layers = tuple(args.layers.split(","))
    unknown = [s for s in sources if s not in SOURCES] + [x for x in layers if x not in LAYERS]
    if unknown:
        print(f"tvw-run: unknown source or layer {unknown}; sources: {list(SOURCES)}, layers: {list(LAYERS)}")
        return 2
    target = Target(str(trace_dir()), str(warehouse_dir()), profile_name(), dask_scheduler())
    try:
        shards = check_trace_folder(trace_dir(), sources, subset_asked=bool(args.sources))
        if target.scheduler:
            check_shared_warehouse(target.scheduler, target.warehouse)
        if "eval" in layers:
            eval_partitions(target)  # a configured load without an evaluation partition stops here
    except (TraceFolderError, RuntimeError, ValueError) as exc:
        print(f"tvw-run: {exc}", file=sys.stderr)
        return 2
    print(f"traces:    {target.traces} ({', '.join(f'{s}: {n} shards' for s, n in shards.items())})")
    print(f"warehouse: {target.warehouse}")
    print(f"profile:   {target.profile}")
    print(
        f"runs:      up to {args.jobs} at once"
        + (f", steps on Dask at {target.scheduler}" if target.scheduler else "")
    )
    t0 = time.perf_counter()
    outcomes = run_all(
        target, DagsterInstance.get(), max_concurrent=args.jobs, sources=sources, layers=layers
    )
    failures = [o.spec.label for o in outcomes if not o.ok]
    db = warehouse_dir() / "tvw.duckdb"
    print(f"\nfinished in {time.perf_counter() - t0:.0f}s; DAGSTER_HOME={home}")
    print("\n".join(layer_lines(outcomes)))
    print("\n".join(source_summary(warehouse_dir(), sources, layers)))
    print("\n".join(failed_check_lines(DagsterInstance.get(), outcomes)))
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

    SIGINT is reset to its default first: a shell that starts a background job ignores SIGINT in it, and
    `dagster dev` would then outlive Ctrl-C / kill -INT."""
    import signal

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
        help="configuration shown as every job's launchpad default and tag: sample | paper | a YAML file "
        "(sets TVW_PROFILE; default: sample on the embedded sample, paper on other traces)",
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    for flag, env in ((args.traces, "TVW_TRACE_DIR"), (args.warehouse, "TVW_WAREHOUSE_DIR")):
        if flag:
            os.environ[env] = str(flag.resolve())
    if args.profile:
        os.environ["TVW_PROFILE"] = (
            str(Path(args.profile).resolve()) if Path(args.profile).is_file() else args.profile
        )
    home = _ensure_dagster_home()
    dagster_args = ["dagster", "dev", "-h", "127.0.0.1", "-p", "3000", *rest]
    print(f"DAGSTER_HOME={home}; starting: {' '.join(dagster_args)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    dagster = Path(sys.executable).with_name("dagster")
    os.chdir(PROJECT_ROOT)  # dagster dev reads [tool.dagster] from pyproject.toml here
    os.execv(str(dagster), dagster_args)


if __name__ == "__main__":
    sys.exit(main())
