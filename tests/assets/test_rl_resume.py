"""rl__tvw_rl killed mid-training leaves a checkpoint, never a policy the evaluation would load; the next run logs
"resuming tvw_rl from iteration N of M", finishes, and publishes the policy with its sidecar."""

import dataclasses

import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import sim__job_sequences
from assets.io_manager import TableIOManager
from assets.learned import load_learned, policy_path
from assets.resources import Warehouse
from assets.rl import rl__tvw_rl
from models import tvw_rl
from models.checkpoint import check_trained, checkpoint_file
from models.tvw_rl import TvwRlConfig, TvwRlPolicy


class Killed(Exception):
    """Stands for a kill -9 in the middle of training."""


def train(instance, resources):
    return materialize(
        [rl__tvw_rl, *sim__job_sequences.to_source_assets()],
        instance=instance,
        resources=resources,
        partition_key="load50-seed0",
        run_config={
            "ops": {
                "rl__tvw_rl": {
                    "config": {"preset": "short", "n_iterations": 3, "sources": ["deepplace_synthetic"]}
                }
            }
        },
        selection=[rl__tvw_rl],
        raise_on_error=False,
    )


def test_a_killed_training_resumes_and_publishes_only_when_done(tmp_path, monkeypatch):
    wh = Warehouse(root=str(tmp_path / "wh"))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    policy = policy_path(wh, "tvw_rl", "deepplace_synthetic", 50, 0)
    real = tvw_rl.train_tvw_rl

    def short_checkpointing_every_iteration(seed: int) -> TvwRlConfig:
        cfg = TvwRlConfig.short(seed)
        return dataclasses.replace(cfg, reinforce=dataclasses.replace(cfg.reinforce, checkpoint_every=1))

    monkeypatch.setitem(tvw_rl.TVW_RL_PRESETS, "short", short_checkpointing_every_iteration)

    def killed_after_one(jobs, cfg, labeller, ckpt, log):
        def dying(message: str) -> None:
            log(message)
            if message.startswith("iteration 1/"):
                raise Killed

        return real(jobs, cfg, labeller, ckpt, log=dying)

    seq_config = {"n_train_sequences": 2, "n_test_sequences": 1, "loads_pct": [50], "include_synthetic": True}
    with DagsterInstance.ephemeral() as instance:
        assert materialize(
            [sim__job_sequences],
            instance=instance,
            resources=resources,
            run_config={"ops": {"sim__job_sequences": {"config": seq_config}}},
        ).success
        monkeypatch.setattr(tvw_rl, "train_tvw_rl", killed_after_one)
        assert not train(instance, resources).success
        assert checkpoint_file(policy).exists() and not policy.exists()
        with pytest.raises(FileNotFoundError, match=r"load50-seed0\.pt \(materialise rl__tvw_rl\)"):
            load_learned("tvw_rl", "deepplace_synthetic", 50, 0, wh)

        monkeypatch.setattr(tvw_rl, "train_tvw_rl", real)
        resumed = train(instance, resources)
        assert resumed.success
        messages = [e.user_message for e in instance.all_logs(resumed.run_id)]
    assert any(m.endswith("deepplace_synthetic: resuming tvw_rl from iteration 1 of 3") for m in messages)
    assert check_trained(policy)["iteration"] == 3
    assert isinstance(load_learned("tvw_rl", "deepplace_synthetic", 50, 0, wh), TvwRlPolicy)
    assert wh.scan("rl__tvw_rl").collect()["iteration"].to_list() == [0, 1, 2]
