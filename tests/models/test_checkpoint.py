"""The one checkpoint format of every learned policy: a checkpoint is never a trained policy, a policy and its
sidecar are published together only when training is complete, the gate refuses anything else naming the file,
and a resumed run says so."""

import json

import polars as pl
import pytest
import torch

from models import checkpoint as ck
from models.reinforce import ReinforceConfig, policy_payload
from models.training import curve_frame, stack_curves
from models.tvw_rl import TvwRlConfig, TvwRlPolicy, train_tvw_rl
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.observation import ObservationConfig


def toy_jobs() -> JobBatch:
    """Two sequences of 4 one-unit jobs on a 2-machine cluster: a training run of a few milliseconds."""
    return JobBatch.from_jobs(
        [[dict(arrival_step=a, usage=[[1, 1]] * 3, ec_label=0) for a in range(4)] for _ in range(2)]
    )


def toy_config(n_iterations: int, checkpoint_every: int = 1) -> TvwRlConfig:
    sim = SimConfig(
        n_machines=2, capacity_units=(4, 4), history_steps=2, queue_size=1, n_labels=1, max_steps=30,
        hold_rule="no_fit",
    )  # fmt: skip
    r = ReinforceConfig(
        n_iterations=n_iterations, n_sequences=2, n_trajectories=2, checkpoint_every=checkpoint_every
    )
    return TvwRlConfig(sim=sim, obs=ObservationConfig(labels="true"), reinforce=r)


class Killed(Exception):
    """Stands for a kill -9 in the middle of training."""


def kill_after(iteration: int, messages: list[str]):
    """A training log that records its lines and raises Killed once `iteration` is reported done."""

    def log(message: str) -> None:
        messages.append(message)
        if message.startswith(f"iteration {iteration}/"):
            raise Killed

    return log


def test_a_killed_run_leaves_a_checkpoint_that_cannot_be_published_and_resume_says_so(tmp_path):
    cfg = toy_config(4, checkpoint_every=1)
    policy = tmp_path / "models" / "tvw_rl" / "toy" / "load50-seed0.pt"
    ckpt = ck.checkpoint_file(policy)
    assert ckpt == tmp_path / "models" / "tvw_rl" / "toy" / "load50-seed0.ckpt" / "checkpoint.pt"
    lines: list[str] = []
    with pytest.raises(Killed):
        train_tvw_rl(toy_jobs(), cfg, checkpoint_path=ckpt, log=kill_after(2, lines))
    assert not policy.exists() and not ck.sidecar_path(policy).exists()
    payload = policy_payload(ckpt, TvwRlPolicy.name)
    assert (payload["iteration"], payload["n_iterations"]) == (2, 4)
    with pytest.raises(ValueError, match=r"load50-seed0\.pt: trained 2 of 4 iterations; not published"):
        ck.publish_trained(policy, payload, "toy", 50, 0, {}, "abc")
    assert not policy.exists()

    lines.clear()
    train_tvw_rl(toy_jobs(), cfg, checkpoint_path=ckpt, log=lines.append)
    assert lines[0] == "resuming tvw_rl from iteration 2 of 4"
    ck.publish_trained(policy, policy_payload(ckpt, TvwRlPolicy.name), "toy", 50, 0, {"k": 1}, "abc")
    meta = ck.check_trained(policy)
    assert (meta["iteration"], meta["n_iterations"], meta["source"], meta["config"]) == (
        4,
        4,
        "toy",
        {"k": 1},
    )
    assert isinstance(TvwRlPolicy(policy).net, torch.nn.Module)
    assert sorted(p.name for p in policy.parent.iterdir()) == [
        "load50-seed0.ckpt",
        "load50-seed0.json",
        policy.name,
    ]


def test_the_gate_refuses_a_partial_or_unpublished_policy_naming_the_file(tmp_path):
    cfg = toy_config(4, checkpoint_every=1)
    policy = tmp_path / "load30-seed1.pt"
    with pytest.raises(Killed):
        train_tvw_rl(toy_jobs(), cfg, checkpoint_path=policy, log=kill_after(1, []))  # the old layout's bug
    # a checkpoint under the policy's name, no sidecar
    with pytest.raises(ValueError, match=r"load30-seed1\.pt: no sidecar load30-seed1\.json: not a published"):
        ck.check_trained(policy, "materialise rl__tvw_rl")
    # a sidecar from before iteration counts were recorded
    ck.sidecar_path(policy).write_text(json.dumps({"policy": "tvw_rl", "source": "toy"}))
    with pytest.raises(ValueError, match=r"load30-seed1\.pt: its sidecar records no iteration count"):
        ck.check_trained(policy)
    # a sidecar saying training stopped short of its config
    ck.write_sidecar(policy, ck.make_sidecar("tvw_rl", "toy", 30, 1, {}, "abc", 1, 4))
    with pytest.raises(
        ValueError, match=r"load30-seed1\.pt: trained 1 of its config's 4 iterations; retrain"
    ):
        ck.check_trained(policy, "retrain")
    # a complete-looking sidecar beside a file that holds another iteration
    ck.write_sidecar(policy, ck.make_sidecar("tvw_rl", "toy", 30, 1, {}, "abc", 4, 4))
    with pytest.raises(ValueError, match=r"load30-seed1\.pt: the file holds iteration 1, its sidecar says 4"):
        ck.check_trained(policy)
    with pytest.raises(FileNotFoundError, match=r"no trained policy at .*missing\.pt"):
        ck.check_trained(tmp_path / "missing.pt")


def test_publish_refuses_disagreeing_counts_and_replaces_an_older_policy(tmp_path):
    path = tmp_path / "p.pt"
    done = {"policy": "x", "iteration": 3, "n_iterations": 3, "model": {"w": torch.zeros(2)}}
    with pytest.raises(ValueError, match="lacks"):
        ck.publish_policy(path, {"policy": "x"}, {"iteration": 3, "n_iterations": 3})
    with pytest.raises(ValueError, match="iteration counts differ"):
        ck.publish_policy(path, done, {"iteration": 2, "n_iterations": 3})
    ck.publish_trained(path, done, "s", 10, 0, {}, "r1")
    ck.publish_trained(path, done | {"model": {"w": torch.ones(2)}}, "s", 10, 0, {}, "r2")
    assert ck.check_trained(path)["git_revision"] == "r2"
    saved = ck.read_payload(path, "policy")
    assert torch.equal(saved["model"]["w"], torch.ones(2)) and saved["policy_format"] == ck.POLICY_FORMAT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.pt"]  # no temporary file left


def test_a_run_without_source_or_load_and_a_payload_read_once(tmp_path):
    path = tmp_path / "bench.pt"
    done = {"policy": "x", "iteration": 2, "n_iterations": 2, "model": {"w": torch.zeros(2)}}
    ck.publish_trained(path, done, None, None, 3, {"k": [1, 2]}, "r")
    meta = ck.read_sidecar(path)
    assert (
        "source" not in meta
        and "load_pct" not in meta
        and (meta["seed"], meta["config"]) == (3, {"k": [1, 2]})
    )
    ck.check_run(
        path, meta, {"policy": "x", "source": "any", "load_pct": 50, "seed": 3}
    )  # absent: not compared
    assert ck.make_sidecar("x", "s", 10, 0, {}, "r", 1, 1)["load_pct"] == 10
    payload = ck.read_payload(path, "policy")
    assert ck.check_trained(path, payload=payload) == meta
    with pytest.raises(ValueError, match=r"bench\.pt: the file holds iteration 1, its sidecar says 2"):
        ck.check_trained(path, payload=payload | {"iteration": 1})


def test_read_payload_names_a_damaged_file(tmp_path):
    path = ck.save_atomic(tmp_path / "c.pt", {"a": 1})
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ValueError, match=r"checkpoint .*c\.pt is corrupt or truncated"):
        ck.read_payload(path)
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*nothing\.pt does not exist"):
        ck.read_payload(tmp_path / "nothing.pt")


def test_training_curves_stack_into_the_schema_with_nulls_where_a_run_reported_nothing() -> None:
    a = curve_frame([{"iteration": 0, "loss": 1.5}, {"iteration": 1, "loss": 1.0}], "bitbrains", 50, 0)
    b = curve_frame(pl.DataFrame({"iteration": [0], "mean_return": [-3.0]}), "deepplace_synthetic", 50, 0)
    schema = {
        "source": pl.String,
        "load_pct": pl.Int32,
        "seed": pl.Int64,
        "iteration": pl.Int64,
        "mean_return": pl.Float64,
        "loss": pl.Float64,
        "wall_s": pl.Float64,
    }
    out = stack_curves([a, b], schema)
    assert out.schema == pl.Schema(schema)
    assert out.rows() == [
        ("bitbrains", 50, 0, 0, None, 1.5, None),
        ("bitbrains", 50, 0, 1, None, 1.0, None),
        ("deepplace_synthetic", 50, 0, 0, -3.0, None, None),
    ]
    with pytest.raises(ValueError, match="no learning curve"):
        stack_curves([], schema)


def test_a_checkpoint_of_another_configuration_is_refused_naming_the_fields(tmp_path) -> None:
    saved = {"ReinforceConfig": {"seed": 0, "n_iterations": 4}, "hidden_units": 20}
    wanted = {"ReinforceConfig": {"seed": 1, "n_iterations": 4}, "hidden_units": 20}
    assert ck.config_diff(saved, wanted) == ["ReinforceConfig.seed: 0 in the checkpoint, 1 now"]
    ck.check_config(tmp_path / "a.pt", saved, saved)
    with pytest.raises(
        ValueError, match=r"a\.pt was trained with another configuration.*seed: 0 in the checkpoint"
    ):
        ck.check_config(tmp_path / "a.pt", saved, wanted)


def test_per_iteration_checkpoints_sort_by_iteration_and_prune_to_the_latest(tmp_path) -> None:
    assert ck.latest_iteration_file(tmp_path / "none", "dejavu") is None
    for i in (2, 10, 9):
        ck.save_atomic(ck.iteration_file(tmp_path, "dejavu", i), {"iteration": i})
    assert ck.latest_iteration_file(tmp_path, "dejavu") == tmp_path / "dejavu_iter0000010.pt"
    ck.prune_iterations(tmp_path, "dejavu")
    assert [p.name for p in tmp_path.glob("*.pt")] == ["dejavu_iter0000010.pt"]
