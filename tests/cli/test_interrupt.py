"""A real `tvw-run` subprocess, stopped on purpose: SIGINT stops it within 10 s with no process of the run left and
the same command resumes; kill -9 of the driver takes its workers with it (no orphan keeps computing)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
LAYERS = "raw,per_source,ec_sweep,ec_gain"
SOURCES = "google2011,alibaba2018,google2011_derived"


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc), children first."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "cli.run", "--traces", str(FIXTURES), "--warehouse", str(tmp_path / "wh")]
    return subprocess.Popen(
        [*cmd, "--layers", LAYERS, "--sources", SOURCES, "--jobs", "2", "--profile", "sample", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_finished_runs(proc: subprocess.Popen, n: int, timeout: float = 180) -> list[str]:
    """Lines read until `n` runs have finished (`[k/total]` lines)."""
    lines, done, t0 = [], 0, time.time()
    while done < n:
        assert time.time() - t0 < timeout, "\n".join(lines)
        line = proc.stdout.readline()
        assert line, "tvw-run ended early:\n" + "\n".join(lines)
        lines.append(line.rstrip())
        done += line.lstrip().startswith("[") and "/" in line.split("]")[0]
    return lines


@pytest.mark.integration
def test_sigint_stops_within_10s_leaves_no_process_and_the_same_command_resumes(tmp_path):
    proc = start(tmp_path)
    wait_for_finished_runs(proc, 2)
    workers = descendants(proc.pid)
    assert workers, "the runs go in worker processes"
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    out, _ = proc.communicate(timeout=30)
    assert time.time() - t0 < 10
    assert proc.returncode == 128 + signal.SIGINT, out
    assert "interrupted by SIGINT" in out and "run the same command again to resume" in out
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)], "a process of the run outlived it"
    again = start(tmp_path)
    first = wait_for_finished_runs(again, 1)
    again.send_signal(signal.SIGTERM)
    out, _ = again.communicate(timeout=30)
    assert any(line.startswith("resuming:") for line in first), "\n".join(first)
    assert again.returncode == 128 + signal.SIGTERM


@pytest.mark.integration
def test_kill_9_of_the_driver_takes_its_workers_and_marks_its_runs_failed(tmp_path):
    proc = start(tmp_path)
    wait_for_finished_runs(proc, 2)
    workers = descendants(proc.pid)
    assert workers
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.time() + 10
    while time.time() < deadline and [p for p in workers if alive(p)]:
        time.sleep(0.2)
    assert not [p for p in workers if alive(p)], "orphans kept running after kill -9 of tvw-run"

    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
    from dagster._core.instance.ref import InstanceRef

    from cli.run import fail_orphaned_runs

    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path / "home"))) as instance:
        started = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        marked = fail_orphaned_runs(instance)
        assert set(marked) == {r.run_id for r in started}
        assert not instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
