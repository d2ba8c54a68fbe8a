"""Loading a trained policy back from the warehouse (only a complete, published one of the run asked for)."""

import json

import pytest
import torch

from assets.learned import TRAINING_ASSET, load_learned, policy_path
from assets.resources import Warehouse
from models.checkpoint import (
    check_sidecar,
    make_sidecar,
    publish_trained,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)
from models.deeprm import DeepRMAgentConfig, DeepRMAgentPolicy, build_net, checkpoint_config
from models.learned import TRAINED_AS
from models.reinforce import policy_payload, save_checkpoint


def deeprm_payload(cfg: DeepRMAgentConfig, iteration: int, tmp_path) -> dict:
    """The policy payload of a DeepRM checkpoint saved at `iteration` (untrained weights)."""
    net = build_net(cfg)
    ckpt = tmp_path / f"ckpt{iteration}.pt"
    save_checkpoint(ckpt, checkpoint_config(cfg), iteration, net, torch.optim.Adam(net.parameters()), [])
    return policy_payload(ckpt, DeepRMAgentPolicy.name)


def test_the_sidecar_names_its_run_and_a_file_under_another_runs_name_is_refused(tmp_path) -> None:
    wh = Warehouse(root=str(tmp_path))
    path = policy_path(wh, "deeprm_rl", "bitbrains", 50, 1)
    assert path == tmp_path / "models" / "deeprm_rl" / "bitbrains" / "load50-seed1.pt"
    cfg = DeepRMAgentConfig.short()
    n = cfg.reinforce.n_iterations
    publish_trained(path, deeprm_payload(cfg, n, tmp_path), "bitbrains", 50, 1, {"k_unused": 1.0}, "abc123")
    assert read_sidecar(path) == {
        "format": "tvw-policy/1",
        "policy": "deeprm_rl",
        "source": "bitbrains",
        "load_pct": 50,
        "seed": 1,
        "iteration": n,
        "n_iterations": n,
        "git_revision": "abc123",
        "config": {"k_unused": 1.0},
    }
    check_sidecar(path, "deeprm_rl", "bitbrains", 50, 1)
    with pytest.raises(ValueError, match=r"describes another run \({'seed': 1}"):
        check_sidecar(path, "deeprm_rl", "bitbrains", 50, 2)
    # a sidecar without the policy name: what it has must agree, what it lacks is not an error
    sidecar = sidecar_path(path)
    sidecar.write_text(
        json.dumps({"source": "bitbrains", "load_pct": 50, "seed": 1, "iteration": n, "n_iterations": n})
    )
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
    payload = deeprm_payload(cfg, cfg.reinforce.n_iterations, tmp_path)
    publish_trained(path, payload, "deeprm_synthetic", 30, 0, checkpoint_config(cfg), "abc")
    policy = load_learned("deeprm_rl", "deeprm_synthetic", 30, 0, wh)
    assert isinstance(policy, DeepRMAgentPolicy) and policy.cfg == cfg


@pytest.mark.parametrize("name", sorted(TRAINING_ASSET))
def test_load_learned_refuses_a_partial_policy_naming_the_file(tmp_path, name) -> None:
    """Every learned policy: a file at the policy's name without a sidecar (a checkpoint written there by a killed
    run), or with a sidecar short of its config's iterations, is refused, naming the file and the asset."""
    wh = Warehouse(root=str(tmp_path))
    path = policy_path(wh, name, "bitbrains", 50, 0)
    trained = TRAINED_AS.get(name, name)  # the replay guard loads forecast_residual_rl's file
    path.parent.mkdir(parents=True)
    torch.save({"config": {}, "iteration": 25, "model": {}}, path)
    with pytest.raises(
        ValueError, match=rf"{trained}/bitbrains/load50-seed0\.pt: no sidecar .*{TRAINING_ASSET[name]}"
    ):
        load_learned(name, "bitbrains", 50, 0, wh)
    write_sidecar(path, make_sidecar(trained, "bitbrains", 50, 0, {}, "abc", 25, 150))
    with pytest.raises(ValueError, match=r"load50-seed0\.pt: trained 25 of its config's 150 iterations"):
        load_learned(name, "bitbrains", 50, 0, wh)
