"""kill -9 of the `tvw-run` driver at three moments of one command (raw -> rl on the derived Google source, a tiny
training budget): while a raw shard is ingested, while both workers make EC runs, and while TVW-RL trains. Each
time no process of the run is alive 5 s later, and the same command run again completes with no run of the dead
driver left STARTED (a worker's run fails with it; `fail_orphaned_runs` marks any other) and tables identical to a
clean run's (`benchmarks/compare_warehouses.py`). After the kill during training, the run again resumes TVW-RL
from its checkpoint ("resuming tvw_rl from iteration 25 of 40") and still gives the clean run's tables.

The clean run is made once, first: its tables are those of the code at that moment, so the tree must not change
while the suite runs.

The loader's refusal of a partial policy (no sidecar, short iteration count) is unit-tested in
tests/assets/test_learned.py::test_load_learned_refuses_a_partial_policy_naming_the_file and
tests/models/test_checkpoint.py; here the kill during training checks it on what a real kill leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LAYERS = "raw,per_source,ec_sweep,ec_gain,ec,cluster,rl"
SOURCES = "google2011_derived"
PROFILE = """\
extends: sample
ops:
  ec__mapping:
    config:
      ec:
        k_max: 3
        n_init: 5
        methods: [aggregate, temporal]   # two EC runs per layer: both workers busy at once
      gain:
        n_seeds: 2
        n_control_draws: 1
  ec__classifier_accuracy:
    config:
      classifier:
        epochs: 5
  sim__job_sequences:
    config:
      loads_pct: [30]
      n_train_sequences: 4
      n_test_sequences: 2
  eval__results:
    config:
      seeds: [0]                         # one rl_job run: load30-seed0
  rl__tvw_rl:
    config:
      preset: short                      # a checkpoint every 25 iterations
      n_iterations: 40
  rl__deeprm:
    config:
      preset: sample
      n_iterations: 5
  rl__dejavu:
    config:
      preset: sample
"""


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tvw):
    """(the command's arguments but the warehouse, the clean run's warehouse): one clean run, compared against
    by every kill below."""
    folder = tmp_path_factory.mktemp("reliability_kill_clean")
    profile = folder / "tiny.yaml"
    profile.write_text(PROFILE)

    def cmd(warehouse: Path) -> list[str]:
        return tvw.command(tvw.FIXTURES, warehouse, str(profile), LAYERS, SOURCES, 2)

    done = tvw.run(cmd(folder / "wh"), folder / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    return cmd, folder / "wh"


def mid_training_checkpoint(warehouse: Path) -> list[Path]:
    """TVW-RL checkpoints of a source whose policy is not published yet (training in progress)."""
    return [
        ckpt
        for ckpt in warehouse.glob("models/tvw_rl/*/load30-seed0.ckpt/checkpoint.pt")
        if not ckpt.parent.with_suffix(".pt").exists()
    ]


MOMENTS = {
    "ingest": lambda runs, wh: [r for r in runs if r.job.startswith("raw_")],
    "ec_pool": lambda runs, wh: (
        ec if len(ec := [r for r in runs if r.job in ("ec_sweep_job", "ec_gain_job")]) >= 2 else []
    ),
    "training": lambda runs, wh: (
        [r for r in runs if r.job == "rl_job"] if mid_training_checkpoint(wh) else []
    ),
}
"""Moment -> the runs in flight (STARTED runs, warehouse) that make it; empty until it comes."""


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_kill_9_of_the_driver_leaves_no_process_and_the_same_command_completes_as_a_clean_run(
    tmp_path, tvw, chain, moment
):
    cmd, clean = chain
    home, wh = tmp_path / "home", tmp_path / "wh"
    condition = MOMENTS[moment]
    proc = tvw.start(cmd(wh), home)
    inflight = tvw.wait_for(lambda: condition(tvw.started_runs(home), wh), proc, moment, timeout=420)
    survivors = tvw.kill_9(proc)
    assert not survivors, f"processes of the run outlived kill -9 of tvw-run by 5 s: {sorted(survivors)}"
    lost = [r.label for r in inflight if tvw.status_of(home, r.run_id) != "SUCCESS"]
    assert lost, f"the runs in flight ({[r.label for r in inflight]}) finished before the kill"
    if moment == "training":
        partial = mid_training_checkpoint(wh)
        assert partial, "the kill came after training published its policies"
        from assets.learned import load_learned
        from assets.resources import Warehouse

        source = partial[0].parent.parent.name
        with pytest.raises(FileNotFoundError, match=r"load30-seed0\.pt \(materialise rl__tvw_rl\)"):
            load_learned("tvw_rl", source, 30, 0, Warehouse(root=str(wh)))

    again = tvw.run(cmd(wh), home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Traceback" not in again.stdout + again.stderr
    assert not tvw.started_runs(home), "a run of the killed driver is still STARTED"
    assert {tvw.status_of(home, r.run_id) for r in inflight} <= {"SUCCESS", "FAILURE"}
    if moment == "training":
        with tvw.instance_of(home) as instance:
            resumed = [r for r in tvw.runs(home) if r.job == "rl_job" and r.status == "SUCCESS"]
            messages = [e.user_message for r in resumed for e in instance.all_logs(r.run_id)]
        assert any("resuming tvw_rl from iteration 25 of 40" in m for m in messages)
    assert tvw.differing_tables(clean, wh) == {}
