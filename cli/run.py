"""`tvw-run`: materialise every asset on the configured traces (default: the embedded sample, `quick` profile),
running independent work at the same time.

The runs are read from the definitions: one per partition of every job (raw shards, sources, (source, EC
method), loads, (load, training seed), ...), in the order of the jobs' layers (`tvw/layer` tags), each waiting
only for the runs that make what its assets read (the asset graph's upstream keys and partition mappings).

Every run is a normal run of a named job of the `tvw` code location, recorded in the project's Dagster instance
(`.dagster_home/`): `tvw-ui` shows them and re-executes them. Up to `--jobs` runs go at once, each in a worker
process; with TVW_DASK_SCHEDULER set, every step runs on that Dask cluster instead. Ctrl-C or SIGTERM stops
launching, stops the runs in flight, kills every worker process and exits 130/143; the same command then resumes
from what completed. Exit status 1 when any run failed or a source kept no long-running workload.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

from cli.plan import Plan, RunSpec, blocked_by_failure, ready

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RUNNER_DIR = ".tvw-run"
"""Under the warehouse: the lock, the resume state of an interrupted run, and the durations the ETA uses."""


class Interrupted(Exception):
    pass


def ensure_dagster_home() -> Path:
    """DAGSTER_HOME, the project's `.dagster_home` where it is unset or empty (an empty value is Dagster's "not
    set" too), created with telemetry off."""
    if not os.environ.get("DAGSTER_HOME", "").strip():
        os.environ["DAGSTER_HOME"] = str(PROJECT_ROOT / ".dagster_home")
    home = Path(os.environ["DAGSTER_HOME"]).resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return home


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tvw-run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Environment: TVW_TRACE_DIR, TVW_WAREHOUSE_DIR, TVW_PROFILE, TVW_DASK_SCHEDULER, DAGSTER_HOME "
        "(the flags above take precedence over the first four).",
    )
    p.add_argument(
        "--traces", type=Path, help="trace folder (default: TVW_TRACE_DIR, else the sample in data/)"
    )
    p.add_argument(
        "--warehouse", type=Path, help="where the Parquet tables and tvw.duckdb go (default: warehouse/)"
    )
    p.add_argument(
        "--profile",
        "--config",
        dest="profile",
        help="configuration: quick (default: a first answer in minutes) | sample (the README's results) | paper "
        "| trace_requests (quick with the traces' own requests) | path to a profile YAML. The trace folder never changes it. Recorded as every run's tvw/profile tag",
    )
    p.add_argument("--sources", help="comma-separated subset of trace sources (default: all)")
    p.add_argument("--layers", help="comma-separated subset of the layers (default: all but on-demand ones)")
    p.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        help="runs at once, each in a worker process (default: the number of cores, here %(default)s)",
    )
    p.add_argument(
        "--dask-scheduler",
        help="run every step on this Dask cluster (tcp://host:8786); the warehouse must be on a filesystem "
        "every worker sees, and is checked first",
    )
    p.add_argument(
        "--allow-empty",
        default="",
        help="comma-separated sources allowed to keep no long-running workload (else the run fails)",
    )
    p.add_argument(
        "--restart", action="store_true", help="ignore an interrupted run's progress; run everything"
    )
    return p


def settings(args) -> tuple[Path, Path, str, str | None]:
    """Trace folder, warehouse, profile and Dask scheduler: the flags, else the environment, else defaults."""
    from pipelines.profiles import environment

    env = environment(PROJECT_ROOT)
    traces = args.traces.resolve() if args.traces else env.traces
    warehouse = args.warehouse.resolve() if args.warehouse else env.warehouse
    profile = args.profile or env.profile
    if Path(profile).is_file():
        profile = str(Path(profile).resolve())
    return traces, warehouse, profile, args.dask_scheduler or env.scheduler


@contextlib.contextmanager
def exclusive(folder: Path, what: str):
    """One tvw-run per warehouse and per DAGSTER_HOME at a time: a lock file (with the holder's pid) taken before
    anything else touches `folder`; RuntimeError naming the holder when another tvw-run has it, or naming the
    folder when it cannot be written (read-only, full)."""
    path = folder / RUNNER_DIR / "lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 - held for the whole run
    except OSError as exc:
        raise RuntimeError(f"{what} {folder} cannot be written ({exc.strerror})") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RuntimeError(f"another tvw-run ({holder}) is using the {what} {folder}") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {os.uname().nodename}")
            f.flush()
        except OSError as exc:
            raise RuntimeError(f"{what} {folder} cannot be written ({exc.strerror})") from None
        yield


def fail_orphaned_runs(instance) -> list[str]:
    """Mark failed the STARTED runs a tvw-run on this host launched and that died with it (kill -9, OOM): their
    driver process is gone. Returns their run ids."""
    from dagster import DagsterRunStatus, RunsFilter

    from cli.workers import DRIVER_TAG, RUNNER_TAG

    host = os.uname().nodename
    failed = []
    for run in instance.get_runs(
        RunsFilter(statuses=[DagsterRunStatus.STARTED], tags={RUNNER_TAG: "tvw-run"})
    ):
        owner = run.tags.get(DRIVER_TAG, "")
        name, _, pid = owner.rpartition(":")
        if name != host or not pid.isdigit() or _alive(int(pid)):
            continue
        instance.report_run_failed(run, f"the tvw-run that launched it ({owner}) is gone")
        failed.append(run.run_id)
    return failed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ResumeState:
    """The runs an interrupted or failed tvw-run completed, for the same command to skip them."""

    def __init__(self, warehouse: Path, signature: dict) -> None:
        self.path = warehouse / RUNNER_DIR / "resume.json"
        self.signature = signature
        self.completed: set[str] = set()

    def load(self) -> set[str]:
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return set()
        return set(saved["completed"]) if saved.get("signature") == self.signature else set()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"signature": self.signature, "completed": sorted(self.completed)}))
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def latest_message(instance, run_id: str) -> str:
    """The latest log message of a run (e.g. a training iteration), shortened, or ''."""
    if not run_id:
        return ""
    try:
        records = instance.get_records_for_run(run_id, limit=20, ascending=False).records
    except Exception:  # noqa: BLE001 - a status line must never stop the run
        return ""
    for record in records:
        entry = record.event_log_entry
        if entry.dagster_event is None and entry.user_message:
            return " (" + " ".join(entry.user_message.split())[:60] + ")"
    return ""


def execute(
    plan: Plan,
    target,
    instance,
    jobs: int,
    progress,
    completed: set[str],
    on_done=lambda outcome: None,
    pool=None,
) -> tuple[list, list[RunSpec], bool]:
    """Make the plan's runs on `pool` (default: `jobs` worker processes; in this process for an ephemeral
    instance); returns (outcomes, runs stopped or never started, the signal that stopped it or 0). The first
    SIGINT/SIGTERM stops launching, stops the runs in flight and kills every worker."""
    from cli.workers import InProcess, RunOutcome, WorkerPool

    signals = []

    def on_signal(signum, _frame):
        signals.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    done = {r for r in plan.runs if r.label in completed}
    pending = [r for r in plan.runs if r not in done]
    failed: set[RunSpec] = set()
    outcomes: list[RunOutcome] = []
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if pool is None:
        pool = (
            InProcess(target, instance)
            if instance.is_ephemeral
            else WorkerPool(min(jobs, max(1, len(pending))), target, instance, threads)
        )
    last_note: dict[RunSpec, str] = {}
    try:
        while (pending or pool.busy()) and not signals:
            for spec in [s for s in pending if blocked_by_failure(s, plan, failed)]:
                pending.remove(spec)
                progress.skipped_line(f"  {spec.label}: not started (an upstream run failed)")
            for spec in [s for s in pending if ready(s, plan, done)]:
                idle = pool.idle()
                if not idle:
                    break
                pending.remove(spec)
                pool.submit(idle[0], spec)
                progress.started(spec)
            for worker, kind, payload in pool.events(timeout=1.0):
                if kind == "started":
                    continue
                spec = worker.spec
                outcome = (
                    payload
                    if kind == "done"
                    else RunOutcome(spec, False, time.time() - worker.since, worker.run_id, 0.0, worker.since)
                )
                worker.spec = None
                if kind == "died":
                    _fail_run(instance, worker.run_id, f"its tvw-run worker died (exit code {payload})")
                    pool.replace(worker)
                outcomes.append(outcome)
                (done if outcome.ok else failed).add(spec)
                note = "" if kind == "done" else f" (worker died: exit code {payload})"
                progress.finished(spec, outcome.ok, outcome.seconds, note)
                on_done(outcome)
            running = [(w.spec, w.since) for w in pool.busy()]
            if progress.is_tty:
                for w in pool.busy():
                    last_note[w.spec] = latest_message(instance, w.run_id)
            progress.status(pending, running, lambda s: last_note.get(s, ""))
    finally:
        stopped = [(w.spec, w.run_id, w.since) for w in pool.busy()]
        pool.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.close()
    interrupted = bool(signals)
    for spec, run_id, since in stopped:
        _fail_run(instance, run_id, "interrupted by tvw-run (Ctrl-C or SIGTERM)")
        outcomes.append(RunOutcome(spec, False, time.time() - since, run_id, 0.0, since, interrupted=True))
    return outcomes, [s for s, _, _ in stopped] + pending, interrupted and signals[0] or 0


def _fail_run(instance, run_id: str, message: str) -> None:
    if not run_id:
        return
    run = instance.get_run_by_id(run_id)
    if run is not None and not run.is_finished:
        instance.report_run_failed(run, message)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    home = ensure_dagster_home()
    traces, warehouse, profile, scheduler = settings(args)

    from dagster import DagsterInstance

    from assets.definitions import build_definitions, load_profile
    from assets.jobs import planned_partitions
    from cli import plan as planning
    from cli.progress import Durations, Progress, clock
    from cli.summary import (
        TraceFolderError,
        check_shared_warehouse,
        check_trace_folder,
        empty_sources,
        failed_check_lines,
        layer_lines,
        remove_unplanned_evaluations,
        source_summary,
    )
    from cli.workers import Target, WorkerPool
    from pipelines.profiles import ProfileError
    from pipelines.sources import SOURCES

    try:
        sources = args.sources.split(",") if args.sources else list(SOURCES)
        allow_empty = {s for s in args.allow_empty.split(",") if s}
        unknown = [s for s in [*sources, *allow_empty] if s not in SOURCES]
        if unknown:
            raise ValueError(f"unknown source {unknown}; sources: {list(SOURCES)}")
        shards = check_trace_folder(traces, sources, subset_asked=bool(args.sources))
        config = load_profile(profile)
        defs = build_definitions(traces, warehouse, profile, scheduler)
        known_layers = planning.job_layers(defs)
        layers = args.layers.split(",") if args.layers else planning.default_layers(defs)
        if [x for x in layers if x not in known_layers]:
            raise ValueError(
                f"unknown layer {[x for x in layers if x not in known_layers]}; layers: {known_layers}"
            )
        if scheduler:
            check_shared_warehouse(scheduler, str(warehouse))
        partitions = planned_partitions(defs)
    except (ProfileError, TraceFolderError, RuntimeError, ValueError, KeyError) as exc:
        print(f"tvw-run: {exc}", file=sys.stderr)
        return 2

    declared = config.get("sources", {})
    plan = planning.plan(defs, layers, sources, partitions)
    plan = _drop_declared(plan, declared)
    target = Target(str(traces), str(warehouse), profile, scheduler)
    print(f"traces:    {traces} ({', '.join(f'{s}: {n} shards' for s, n in shards.items())})")
    print(f"warehouse: {warehouse}")
    print(f"profile:   {profile}")
    print(
        f"plan:      {len(plan.runs)} runs in layers {', '.join(plan.layers())}; up to {args.jobs} at once"
        + (f", steps on Dask at {scheduler}" if scheduler else "")
    )
    for source, entry in declared.items():
        if source in sources:
            print(f"           {source}: layers {', '.join(entry['layers'])} only ({entry['reason']})")
    t0 = time.perf_counter()
    try:
        with exclusive(warehouse, "warehouse"), exclusive(home, "DAGSTER_HOME"):
            instance = DagsterInstance.get()
            threads = max(1, (os.cpu_count() or 1) // args.jobs)
            pool = WorkerPool(min(args.jobs, max(1, len(plan.runs))), target, instance, threads)  # warming up
            orphans = fail_orphaned_runs(instance)
            if orphans:
                print(f"           marked {len(orphans)} run(s) of a tvw-run that died as failed")
            _remove_stale(target, plan, sources, layers, remove_unplanned_evaluations)
            state = ResumeState(
                warehouse, {"profile": profile, "traces": str(traces), "layers": layers, "sources": sources}
            )
            completed = set() if args.restart else state.load() & {r.label for r in plan.runs}
            if completed:
                print(
                    f"resuming:  {len(completed)} of {len(plan.runs)} runs completed before (--restart to redo them)"
                )
            state.completed = set(completed)
            durations = Durations(warehouse / RUNNER_DIR / "durations.json")
            progress = Progress(plan, durations, args.jobs, skipped=len(completed))

            def on_done(outcome):
                if outcome.ok:
                    state.completed.add(outcome.spec.label)
                    state.save()
                durations.save()

            outcomes, stopped, signum = execute(
                plan, target, instance, args.jobs, progress, completed, on_done, pool
            )
    except RuntimeError as exc:
        print(f"tvw-run: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    if signum:
        name = signal.Signals(signum).name
        shown = ", ".join(s.label for s in stopped[:6]) + (" ..." if len(stopped) > 6 else "")
        print(
            f"\ninterrupted by {name} after {clock(elapsed)}: {len(stopped)} run(s) stopped or not started ({shown})"
        )
        print(f"{len(state.completed)} run(s) completed; run the same command again to resume from them")
        return 128 + signum
    ran = [layer for layer in plan.layers() if any(o.spec.layer == layer for o in outcomes)]
    skipped = {s: f"{', '.join(e['layers'])} only: {e['reason']}" for s, e in declared.items()}
    print(f"\nfinished in {clock(elapsed)}; DAGSTER_HOME={home}")
    print("\n".join(layer_lines(outcomes, ran)))
    print("\n".join(source_summary(warehouse, sources, tuple(ran), skipped)))
    print("\n".join(failed_check_lines(instance, outcomes)))
    failures = [o.spec.label for o in outcomes if not o.ok]
    empty = {}
    if "per_source" in ran:
        empty = {
            s: n
            for s, n in empty_sources(warehouse, sources).items()
            if s not in allow_empty and s not in declared
        }
    for source, n in empty.items():
        print(
            f"FAILED {source}: no long-running workload kept of {n} (thresholds: ops.core__long_running in "
            f"profile {profile}); pass --allow-empty {source} to accept it",
            file=sys.stderr,
        )
    _print_leaderboard(warehouse)
    db = warehouse / "tvw.duckdb"
    print(f"results: Parquet under {warehouse / 'tables'}, DuckDB views in {db}")
    print(
        f'try:     duckdb {db} "select * from eval__leaderboard where rank <= 3 order by source, load_pct, rank"'
    )
    if failures:
        print("FAILED: " + ", ".join(failures), file=sys.stderr)
    if failures or empty:
        return 1
    state.clear()
    return 0


class _LineStream:
    """A non-terminal stream that hands each complete line to `log`."""

    def __init__(self, log) -> None:
        self.log, self.buffer = log, ""

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> None:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self.log(line)

    def flush(self) -> None:
        pass


def run_all(target, instance, log=print, max_concurrent: int = 1, sources=None, layers=None) -> list:
    """Make every run of `layers` (default: all but on-demand) for `sources` (default: all) on a persistent
    `instance`, up to `max_concurrent` at once in worker processes; the outcome of each, in finishing order."""
    from assets.definitions import build_definitions, load_profile
    from assets.jobs import planned_partitions
    from cli import plan as planning
    from cli.progress import Durations, Progress
    from cli.summary import remove_unplanned_evaluations
    from pipelines.sources import SOURCES

    defs = build_definitions(Path(target.traces), Path(target.warehouse), target.profile, target.scheduler)
    layers = list(layers or planning.default_layers(defs))
    sources = list(sources or SOURCES)
    declared = load_profile(target.profile).get("sources", {})
    plan = _drop_declared(planning.plan(defs, layers, sources, planned_partitions(defs)), declared)
    _remove_stale(target, plan, sources, layers, remove_unplanned_evaluations, log)
    durations = Durations(Path(target.warehouse) / RUNNER_DIR / "durations.json")
    progress = Progress(plan, durations, max_concurrent, stream=_LineStream(log))
    outcomes, _, _ = execute(plan, target, instance, max_concurrent, progress, set())
    return outcomes


def _drop_declared(plan: Plan, declared: dict) -> Plan:
    """The plan without the runs of a source in layers its profile entry does not list."""
    keep = [
        r for r in plan.runs if not (r.source in declared and r.layer not in declared[r.source]["layers"])
    ]
    kept = set(keep)
    return Plan(keep, {r: frozenset(w for w in plan.waits[r] if w in kept) for r in keep})


def _remove_stale(target, plan: Plan, sources, layers, remove_unplanned_evaluations, log=print) -> None:
    from assets.raw import remove_stale_raw
    from assets.resources import Warehouse

    wh = Warehouse(root=target.warehouse)
    if "raw" in layers:
        stale = remove_stale_raw(wh, Path(target.traces), list(sources))
        if stale:
            shown = ", ".join(f"{p.table}[{p.stem}]" for p in stale[:5]) + (" ..." if len(stale) > 5 else "")
            log(
                f"           removed {len(stale)} raw partition(s) not ingested from {target.traces}: {shown}"
            )
    if "eval" in layers or "results" in layers:
        unplanned = remove_unplanned_evaluations(wh, plan.runs)
        if unplanned:
            log(f"           removed partition(s) of loads not configured now: {', '.join(unplanned)}")


def _print_leaderboard(warehouse: Path) -> None:
    from cli.summary import leaderboard_lines

    lines = leaderboard_lines(warehouse)
    if lines:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
