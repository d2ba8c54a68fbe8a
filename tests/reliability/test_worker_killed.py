"""A worker killed with SIGKILL in the middle of a run: the driver names the lost run, marks it failed, replaces
the worker and makes the independent runs, prints its summary and exits 1, with no traceback."""

from __future__ import annotations

import os
import signal

import pytest

pytestmark = pytest.mark.slow


def test_a_worker_killed_mid_run_costs_its_run_only(tmp_path, tvw):
    home, wh = tmp_path / "home", tmp_path / "wh"
    cmd = tvw.command(tvw.FIXTURES, wh, "sample", "raw,per_source", "alibaba2018,google2011_derived", 1)
    proc = tvw.start(cmd, home)
    (run,) = tvw.wait_for(lambda: tvw.started_runs(home, "per_source_job"), proc, "a per_source run")
    (worker,) = tvw.worker_pids(proc.pid)  # --jobs 1: the one worker makes the run in flight
    os.kill(worker, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert tvw.status_of(home, run.run_id) == "FAILURE"
    assert not tvw.started_runs(home)

    label = run.label
    other = "google2011_derived" if "alibaba2018" in label else "alibaba2018"
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert f"{label}: FAILED" in out and f"(worker died: exit code -{int(signal.SIGKILL)})" in out, out
    assert f"per_source_job[{other}]: ok" in out, out  # the replacement worker made the independent run
    assert "finished in" in out and "per_source    2 run(s), 1 failed" in out, out
    assert f"FAILED: {label}" in out


def ignores_sigterm(pid: int) -> bool:
    """Whether process `pid` ignores SIGTERM (its SigIgn mask in /proc)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_an_idle_worker_keeps_its_death_signal_after_a_run(tmp_path, tvw):
    home, wh = tmp_path / "home", tmp_path / "wh"
    cmd = tvw.command(tvw.FIXTURES, wh, "sample", "raw,per_source", "google2011_derived", 2)
    proc = tvw.start(cmd, home)
    try:
        # two raw runs, one per worker, then one per_source run: the other worker is idle after its run
        tvw.wait_for(lambda: tvw.started_runs(home, "per_source_job"), proc, "the per_source run")
        workers = tvw.worker_pids(proc.pid)
        assert len(workers) == 2
        assert not [p for p in workers if ignores_sigterm(p)], "a worker ignores SIGTERM"
    finally:
        proc.kill()
        proc.communicate(timeout=60)
