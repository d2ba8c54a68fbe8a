"""Making runs: one run in this process, or in long-lived worker processes that the driver can always stop.

Each worker is a fresh interpreter (spawn) that leads its own process group, so the terminal's Ctrl-C reaches
only the driver, which decides; everything a worker starts (a DTW process pool, ...) stays in its group. A worker
asks the kernel for SIGTERM when the driver dies (`PR_SET_PDEATHSIG`, even after kill -9 or the OOM killer), and
on SIGTERM it kills its whole group: no orphan keeps computing or writing after the driver is gone.

Workers are not daemonic processes, so a run may start processes of its own (the learned placer's variants train
at once, one per core: `models.placer_variants`); multiprocessing would refuse a daemonic one children. What the
daemon flag gave, the pool does itself: `WorkerPool.stop` runs when the driver exits by any path (`atexit`, before
multiprocessing's own exit handler would wait for the workers), and it kills each worker's group.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import resource
import signal
import sys
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path

from cli.plan import RunSpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RUNNER_TAG = "tvw/runner"
DRIVER_TAG = "tvw/driver"
"""`<host>:<pid>` of the tvw-run that launched a run: a later tvw-run marks its STARTED runs failed when that
process is gone."""
THREAD_ENV = (
    "POLARS_MAX_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
"""Thread pools sized from these at import (polars, torch/numpy BLAS, numba): a worker gets its share of the cores."""
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
"""Dagster's console logger prints every step event; the terminal gets the runner's own lines, and every event
stays in the run's log (the UI's run page)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What every run of one `tvw-run` invocation reads and writes (picklable: sent to worker processes)."""

    traces: str
    warehouse: str
    profile: str = "quick"
    scheduler: str | None = None
    """Dask scheduler address: steps run there (None: in the run's own process)."""


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
    interrupted: bool = False


def driver_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


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


def execute_named_run(target: Target, spec: RunSpec, instance, driver: str = "", on_start=None) -> RunOutcome:
    """Create a run of `spec.job` (for `spec.partition`) in `instance`, attached to the code location, and
    execute it in this process with the job's executor (in-process, or Dask). Its config is the assets'
    defaults (the profile) and a quiet console."""
    from dagster import build_reconstructable_job
    from dagster._core.execution.api import execute_run

    recon = build_reconstructable_job(
        "assets.definitions",
        "job_for",
        reconstructable_args=(spec.job, target.traces, target.warehouse, target.profile, target.scheduler),
    )
    job_def = recon.get_definition()
    tags = {**job_def.tags, RUNNER_TAG: "tvw-run", DRIVER_TAG: driver or driver_id()}
    if spec.partition:
        tags["dagster/partition"] = spec.partition
    t0, started_at = time.perf_counter(), time.time()
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=QUIET,
        tags=tags,
        remote_job_origin=_remote_origin(spec.job),
        job_code_origin=recon.get_python_origin(),
    )
    if on_start:
        on_start(run.run_id)
    result = execute_run(recon, run, instance, raise_on_error=False)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return RunOutcome(spec, result.success, time.perf_counter() - t0, run.run_id, rss_mib, started_at)


# --- worker processes ------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGTERM to this process when the driver dies (Linux); elsewhere, nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _kill_own_group(*_) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _arm_signals() -> None:
    """SIGTERM (the driver's stop, or its death) kills the worker's whole group; SIGINT is the driver's to act on."""
    signal.signal(signal.SIGTERM, _kill_own_group)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_main(
    conn: Connection, parent: int, instance_ref, threads: int, target: Target, driver: str
) -> None:
    os.setsid()  # own process group: the terminal's Ctrl-C goes to the driver only
    _die_with_parent()
    _arm_signals()
    if os.getppid() != parent:  # the driver died before the death signal was armed
        _kill_own_group()
    for name in THREAD_ENV:  # before polars / torch / numba are imported in this fresh process
        os.environ.setdefault(name, str(threads))
    from dagster import DagsterInstance

    from assets.definitions import job_for

    instance = DagsterInstance.from_ref(instance_ref)
    job_for("per_source_job", target.traces, target.warehouse, target.profile, target.scheduler)  # warm up
    while True:
        spec = conn.recv()
        if spec is None:
            return
        outcome = execute_named_run(
            target, spec, instance, driver, lambda run_id: conn.send(("started", run_id))
        )
        _arm_signals()  # Dagster's execute_run leaves SIGTERM ignored when it restores its interrupt handling
        conn.send(("done", outcome))


@dataclasses.dataclass
class Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    spec: RunSpec | None = None
    run_id: str = ""
    since: float = 0.0


class InProcess:
    """The pool's interface, making each run in this process one after the other (an ephemeral instance, which
    worker processes cannot share, e.g. in tests)."""

    def __init__(self, target: Target, instance) -> None:
        self.target, self.instance = target, instance
        self.worker = Worker(process=None, conn=None)  # type: ignore[arg-type]

    def idle(self) -> list[Worker]:
        return [self.worker] if self.worker.spec is None else []

    def busy(self) -> list[Worker]:
        return [self.worker] if self.worker.spec is not None else []

    def submit(self, worker: Worker, spec: RunSpec) -> None:
        worker.spec, worker.since = spec, time.time()

    def events(self, timeout: float) -> list[tuple[Worker, str, object]]:
        if self.worker.spec is None:
            return []
        return [(self.worker, "done", execute_named_run(self.target, self.worker.spec, self.instance))]

    def replace(self, worker: Worker) -> None:
        pass

    def stop(self, grace: float = 3.0) -> None:
        pass


class WorkerPool:
    """`n` worker processes; `submit` hands one a run, `events` returns what they report, `stop` kills them all
    (process groups included) within `grace` seconds."""

    def __init__(self, n: int, target: Target, instance, threads: int, main=_worker_main) -> None:
        # spawn: a fresh interpreter, no forked sqlite handles or threads
        self._ctx = multiprocessing.get_context("spawn")
        self._args = (os.getpid(), instance.get_ref(), threads, target, driver_id())
        self._main = main  # what each worker runs (`_worker_main`; a test passes its own)
        self.workers: list[Worker] = []
        atexit.register(self.stop)  # the driver's exit by any path stops the (non-daemonic) workers first
        self.workers = [self._start() for _ in range(n)]

    def _start(self) -> Worker:
        mine, theirs = self._ctx.Pipe()
        # not daemonic: a run may start processes of its own (module docstring)
        process = self._ctx.Process(target=self._main, args=(theirs, *self._args), daemon=False)
        process.start()
        theirs.close()
        return Worker(process, mine)

    def replace(self, worker: Worker) -> None:
        """A worker that died (killed, out of memory): kill what is left of its process group, start another."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.join(1)
        self.workers[self.workers.index(worker)] = self._start()

    def idle(self) -> list[Worker]:
        return [w for w in self.workers if w.spec is None]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.spec is not None]

    def submit(self, worker: Worker, spec: RunSpec) -> None:
        worker.spec, worker.run_id, worker.since = spec, "", time.time()
        worker.conn.send(spec)

    def events(self, timeout: float) -> list[tuple[Worker, str, object]]:
        """(worker, kind, payload) reported within `timeout` s: ("started", run_id), ("done", RunOutcome), or
        ("died", exit code) for a worker that is gone (its run failed with it)."""
        by_conn = {w.conn: w for w in self.busy()}
        out = []
        for conn in wait(list(by_conn), timeout) if by_conn else []:
            worker = by_conn[conn]
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):
                worker.process.join(1)
                out.append((worker, "died", worker.process.exitcode))
                continue
            if kind == "started":
                worker.run_id = payload
            out.append((worker, kind, payload))
        if not by_conn:
            time.sleep(timeout)
        return out

    def stop(self, grace: float = 3.0) -> None:
        """Ask every worker to finish (idle ones exit), then kill each worker's process group. Safe to call again
        (the driver's exit calls it after `execute` has)."""
        if not self.workers:
            return
        atexit.unregister(self.stop)
        for w in self.workers:
            with contextlib.suppress(OSError, BrokenPipeError):
                if w.spec is None:
                    w.conn.send(None)
        for w in self.workers:
            if w.spec is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.process.pid, signal.SIGTERM)
        deadline = time.time() + grace
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.time()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.process.pid, signal.SIGKILL)
            w.process.join(1)
