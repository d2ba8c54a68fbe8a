"""`tvw-run`'s run workers may start processes of their own (the learned placer trains its variants at once in
them), and the pool still stops them all, whatever they started."""

import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

from cli.workers import WorkerPool

ROOT = Path(__file__).resolve().parents[2]


def _sleep_forever() -> None:
    time.sleep(600)


def _starts_a_child(conn, parent, instance_ref, threads, target, driver) -> None:
    """A worker's main (the arguments `cli.workers._worker_main` gets): starts a process of its own, reports
    whether the placer's variants would train at once here and the child's pid, then waits to be stopped."""
    from models.placer_variants import may_start_processes

    os.setsid()  # its own group, as `_worker_main`: the pool's stop kills the group
    child = multiprocessing.get_context("spawn").Process(target=_sleep_forever)
    child.start()
    conn.send(("done", (may_start_processes(), child.pid)))
    conn.recv()  # the pool's stop: None
    time.sleep(600)  # still running: only the pool's kill of the group ends it and its child


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_run_worker_may_start_processes_and_stop_takes_them_too(monkeypatch) -> None:
    # a spawned worker imports this module by its name (tests.cli.test_workers) from the sys.path it is given
    monkeypatch.syspath_prepend(str(ROOT))
    pool = WorkerPool(1, None, SimpleNamespace(get_ref=lambda: None), 1, main=_starts_a_child)
    worker = pool.workers[0]
    try:
        assert not worker.process.daemon
        pool.submit(worker, "run")  # what the main reads first is irrelevant here: it reports on start
        events, t0 = [], time.time()
        while not events and time.time() - t0 < 60:
            events = pool.events(timeout=1.0)
        assert events, "the worker never reported"
        _, kind, (may_start, child_pid) = events[0]
        assert kind == "done" and may_start is True
        assert _alive(child_pid)
        worker.spec = None  # its "run" is done: stop asks it to finish, then kills its group
    finally:
        pool.stop(grace=1.0)
    assert not worker.process.is_alive()
    t0 = time.time()
    while _alive(child_pid) and time.time() - t0 < 10:
        time.sleep(0.1)
    assert not _alive(child_pid), "the worker's own child outlived the pool's stop"
    pool.stop()  # again (the driver's exit calls it after `execute` has): harmless
