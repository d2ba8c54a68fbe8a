"""The helpers every learned scheduler's assets share: sidecars, loading a trained policy back, curve frames."""

import json

import polars as pl
import pytest
import torch

from assets.learned import (
    check_sidecar,
    curve_frame,
    load_learned,
    policy_path,
    read_sidecar,
    stack_curves,
    write_sidecar,
)
from assets.resources import Warehouse
from models.deeprm import DeepRMAgentConfig, DeepRMAgentPolicy, build_net, checkpoint_config
from models.reinforce import save_checkpoint


def test_the_sidecar_names_its_run_and_a_file_under_another_runs_name_is_refused(tmp_path) -> None:
    wh = Warehouse(root=str(tmp_path))
    path = policy_path(wh, "deeprm_rl", "bitbrains", 50, 1)
    assert path == tmp_path / "models" / "deeprm_rl" / "bitbrains" / "load50-seed1.pt"
    path.parent.mkdir(parents=True)
    sidecar = write_sidecar(path, "deeprm_rl", "bitbrains", 50, 1, {"k_unused": 1.0}, "abc123")
    assert sidecar == path.with_suffix(".json")
    assert read_sidecar(path) == {
        "policy": "deeprm_rl",
        "source": "bitbrains",
        "load_pct": 50,
        "seed": 1,
        "git_revision": "abc123",
        "config": {"k_unused": 1.0},
    }
    check_sidecar(path, "deeprm_rl", "bitbrains", 50, 1)
    with pytest.raises(ValueError, match=r"describes another run \({'seed': 1}"):
        check_sidecar(path, "deeprm_rl", "bitbrains", 50, 2)
    # an older sidecar without the policy name: what it has must agree, what it lacks is not an error
    sidecar.write_text(json.dumps({"source": "bitbrains", "load_pct": 50, "seed": 1}))
    check_sidecar(path, "deeprm_rl", "bitbrains", 50, 1)
    with pytest.raises(ValueError, match="'load_pct': 50"):
        check_sidecar(path, "deeprm_rl", "bitbrains", 80, 1)
    sidecar.write_text('{"policy": "deeprm_rl", ')
    with pytest.raises(ValueError, match=r"load50-seed1\.json: not valid JSON"):
        check_sidecar(path, "deeprm_rl", "bitbrains", 50, 1)
    sidecar.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_sidecar(path)


def test_load_learned_names_the_missing_file_and_its_training_asset(tmp_path) -> None:
    wh = Warehouse(root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"dejavu/deepplace_synthetic/load30-seed0\.pt.*rl__dejavu"):
        load_learned("dejavu", "deepplace_synthetic", 30, 0, wh)
    with pytest.raises(ValueError, match="'best_fit' is not one of"):
        load_learned("best_fit", "deepplace_synthetic", 30, 0, wh)


def test_load_learned_builds_the_trained_scheduler(tmp_path) -> None:
    wh = Warehouse(root=str(tmp_path))
    cfg = DeepRMAgentConfig.short()
    path = policy_path(wh, "deeprm_rl", "deeprm_synthetic", 30, 0)
    net = build_net(cfg)
    save_checkpoint(path, checkpoint_config(cfg), 1, net, torch.optim.Adam(net.parameters()), [])
    write_sidecar(path, "deeprm_rl", "deeprm_synthetic", 30, 0, checkpoint_config(cfg), "abc")
    policy = load_learned("deeprm_rl", "deeprm_synthetic", 30, 0, wh)
    assert isinstance(policy, DeepRMAgentPolicy) and policy.cfg == cfg


def test_curves_stack_into_the_schema_with_nulls_where_a_run_reported_nothing() -> None:
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
