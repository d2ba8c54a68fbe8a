"""Shared by the reliability suite: real `tvw-run` subprocesses on the fixture traces, the processes they start, the
runs they record, and the warehouses they leave.

The helpers that find a process tree and read a run's progress lines are `tests/cli/test_interrupt.py`'s (loaded
from its file, as `compare`/`read_table`/`tables` are from `benchmarks/compare_warehouses.py`). Tests reach this
module through the `tvw` fixture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "traces"


def load_file(path: Path, name: str):
    """The module at `path` (tests and benchmarks are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_interrupt = load_file(ROOT / "tests" / "cli" / "test_interrupt.py", "_reliability_test_interrupt")
_compare = load_file(ROOT / "benchmarks" / "compare_warehouses.py", "_reliability_compare_warehouses")
descendants = _interrupt.descendants
alive = _interrupt.alive
wait_for_finished_runs = _interrupt.wait_for_finished_runs
IGNORED_COLUMNS = re.compile(_compare.DEFAULT_IGNORE)
"""Columns that record when, where or how long (compare_warehouses' default): left out of every comparison."""


def command(
    traces: Path, warehouse: Path, profile: str, layers: str, sources: str, jobs: int, *extra
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli.run",
        "--traces",
        str(traces),
        "--warehouse",
        str(warehouse),
        "--profile",
        profile,
        "--layers",
        layers,
        "--sources",
        sources,
        "--jobs",
        str(jobs),
        *extra,
    ]


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "DAGSTER_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def start(cmd: list[str], home: Path) -> subprocess.Popen:
    """`cmd` (a `tvw-run`) in the background, stdout and stderr merged into one text pipe."""
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def run(cmd: list[str], home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`cmd` to its end: (returncode, stdout, stderr)."""
    return subprocess.run(cmd, cwd=ROOT, env=env(home), capture_output=True, text=True, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class Run:
    run_id: str
    job: str
    status: str
    partition: str | None

    @property
    def label(self) -> str:
        return f"{self.job}[{self.partition}]" if self.partition else self.job


def runs(home: Path) -> list[Run]:
    """The runs recorded under DAGSTER_HOME `home`, read from its run storage through a read-only SQLite connection:
    reading while a tvw-run records never writes (opening a DagsterInstance there could create or stamp the
    storage's schema at the same time as the driver or its workers do)."""
    db = home / "history" / "runs.db"
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
            rows = con.execute("select run_id, pipeline_name, status, partition from runs").fetchall()
    except sqlite3.Error:  # not created yet, or locked for longer than the timeout
        return []
    return [Run(*row) for row in rows]


def started_runs(home: Path, job_prefix: str = "") -> list[Run]:
    """The runs in STARTED status whose job name starts with `job_prefix`."""
    return [r for r in runs(home) if r.status == "STARTED" and r.job.startswith(job_prefix)]


def status_of(home: Path, run_id: str) -> str:
    return next(r.status for r in runs(home) if r.run_id == run_id)


def lock_holder(warehouse: Path) -> str:
    """What the lock file of a tvw-run holding `warehouse` says ('pid N on host'), or ''."""
    lock = warehouse / ".tvw-run" / "lock"
    return lock.read_text() if lock.exists() else ""


@contextlib.contextmanager
def instance_of(home: Path):
    """The Dagster instance at DAGSTER_HOME `home`, once no tvw-run uses it."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        yield instance


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300, every: float = 0.1):
    """Poll `condition()` until it returns something truthy (returned); fail naming `what` when `proc` ends first or
    `timeout` passes."""
    t0 = time.time()
    while True:
        found = condition()
        if found:
            return found
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"tvw-run ended (exit {proc.returncode}) before {what}:\n{out}")
        if time.time() - t0 > timeout:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(every)


def kill_9(proc: subprocess.Popen) -> set[int]:
    """kill -9 of the driver `proc`; returns the processes of its run (collected from /proc just before) that are
    still alive 5 s later (empty when it took them with it)."""
    tree = descendants(proc.pid)
    assert tree, "the runs go in worker processes"
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(5)
    return {p for p in tree if alive(p)}


def worker_pids(driver: int) -> list[int]:
    """The driver's worker processes: its children that lead their own session (the multiprocessing resource
    tracker, also a child, does not)."""
    found = []
    for task in Path(f"/proc/{driver}/task").glob("*"):
        with contextlib.suppress(OSError):
            for kid in (task / "children").read_text().split():
                with contextlib.suppress(OSError, IndexError):
                    stat = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[3]) == int(kid):  # session id == pid: setsid() was called
                        found.append(int(kid))
    return found


def flat(frame):
    """`frame` with each list column as one string per row ("1.5,2.0"): compare_warehouses.compare cannot cast a
    List column to String (it raises polars' InvalidOperationError), so a list must be equal as text."""
    import polars as pl

    lists = [c for c, dtype in frame.schema.items() if dtype.is_nested()]
    return frame.with_columns(
        pl.col(c).list.eval(pl.element().cast(pl.String)).list.join(",").alias(c) for c in lists
    )


def differing_tables(clean: Path, other: Path) -> dict[str, str]:
    """Per table that is not the same in both warehouses (compare_warehouses' rules: rows, columns, values with
    floats to 1e-9, wall times and paths left out; lists as text), what differs."""
    names = _compare.tables(clean) | _compare.tables(other)
    out = {}
    for table in sorted(names):
        if table not in _compare.tables(clean) or table not in _compare.tables(other):
            out[table] = "only in " + ("the clean run" if table in _compare.tables(clean) else "the other")
            continue
        what = _compare.compare(
            flat(_compare.read_table(clean, table)),
            flat(_compare.read_table(other, table)),
            1e-9,
            IGNORED_COLUMNS,
        )
        if what is not None:
            out[table] = what
    return out


@pytest.fixture(scope="session")
def tvw():
    """This module: the suite's helpers (`tvw.start`, `tvw.kill_9`, `tvw.differing_tables`, ...)."""
    return sys.modules[__name__]
