"""REINFORCE with a time-dependent baseline (DeepRM Fig. 3, TVW-RL "Implementation"), the policy-gradient core
shared by the learned schedulers, plus checkpoints that resume bit-identically (in the one format of
`models.checkpoint`: a resumable checkpoint while training, a trained policy published apart when it is done).

One iteration: roll the current policy over `n_sequences` training sequences x `n_trajectories` trajectories each
in lock-step (`sim.rollout`), compute every decision's return-to-go v, subtract the baseline b_k = the mean of v at
decision k over the trajectories of the same sequence (alive ones), and take one Adam step on
-mean over decisions of log pi(a | s) * advantage.

Reward scale (TVW-RL's weights give returns of 1e4-1e7): `advantage` picks how advantages are scaled before the
gradient step: "normalise" (default) divides them by their standard deviation over the iteration's decisions
(the sign and the ranking of actions within a state are unchanged; only the step size is made scale-free);
"scale" divides by the fixed `reward_scale`; "raw" uses them as they are (Adam's per-parameter normalisation
absorbs a constant scale, but not the iteration-to-iteration swings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.checkpoint import check_config, read_payload, resume_message, save_atomic
from models.training import init_parameters
from sim.rollout import RolloutBatch, returns_to_go, time_baseline

ADVANTAGE_MODES = ("normalise", "scale", "raw")


@dataclass(frozen=True)
class ReinforceConfig:
    """Optimisation knobs of REINFORCE (TVW-RL: Adam, lr 0.001, N = 20 trajectories, 20 sequences per batch)."""

    learning_rate: float = 1e-3
    n_trajectories: int = 20
    n_sequences: int = 20
    n_iterations: int = 2000
    advantage: str = "normalise"
    reward_scale: float = 1e4
    """Divisor of advantages when advantage = "scale"."""
    discount: float = 1.0
    """gamma per decision of the returns-to-go (DeepRM Fig. 3: v_t = sum_s gamma^(s-t) r_s; 1 = undiscounted)."""
    checkpoint_every: int = 50
    """Save a checkpoint every this many iterations (and at the end)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {self.advantage!r}")
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {self.discount}")
        for name in ("n_trajectories", "n_sequences", "n_iterations", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def masked_log_probs(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax over the valid actions only (invalid ones get -inf)."""
    return torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)


def sample_masked(
    logits: torch.Tensor, mask: np.ndarray, rng: np.random.Generator, greedy: bool
) -> np.ndarray:
    """(E,) actions drawn from the masked softmax with numpy's `rng` (reproducible), or its argmax."""
    probs = torch.softmax(logits.masked_fill(~torch.from_numpy(mask), float("-inf")), dim=-1).numpy()
    if greedy:
        return probs.argmax(axis=1)
    cum = np.cumsum(probs, axis=1)
    u = rng.random((probs.shape[0], 1)) * cum[:, -1:]
    return np.minimum((cum < u).sum(axis=1), probs.shape[1] - 1)


def draw_sequences(rng: np.random.Generator, n_available: int, n: int) -> np.ndarray:
    """Rows of the training sequences one iteration rolls out: n distinct ones when there are enough (every
    iteration then sees a fresh mix, and a set no larger than n is seen whole every time, which keeps the learning
    curve free of draw noise), else every sequence once plus n - n_available drawn with replacement."""
    if n <= n_available:
        return np.sort(rng.choice(n_available, size=n, replace=False))
    return np.sort(
        np.concatenate([np.arange(n_available), rng.integers(0, n_available, size=n - n_available)])
    )


def advantages(batch: RolloutBatch, cfg: ReinforceConfig) -> np.ndarray:
    """(K, E) advantages v - b (0 where not alive), scaled as `cfg.advantage` says."""
    v = returns_to_go(batch.rewards, cfg.discount)
    adv = (v - time_baseline(v, batch.alive, batch.n_trajectories)) * batch.alive
    if cfg.advantage == "normalise":
        std = adv[batch.alive].std() if batch.alive.any() else 0.0
        adv = adv / (std + 1e-8)
    elif cfg.advantage == "scale":
        adv = adv / cfg.reward_scale
    return adv


def policy_gradient_step(
    net: nn.Module,
    optimiser: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: ReinforceConfig,
    iteration: int,
) -> dict[str, float]:
    """One Adam step on -mean(log pi(a|s) * advantage) over the alive decisions, on the device `net` lives on;
    returns loss and entropy.
    Raises FloatingPointError naming the iteration on a non-finite return or loss."""
    if not np.isfinite(batch.rewards).all():
        raise FloatingPointError(f"iteration {iteration}: non-finite reward in the rollout")
    adv = advantages(batch, cfg)
    k, e = np.nonzero(batch.alive)
    dev = next(net.parameters()).device
    x = torch.from_numpy(batch.features[k, e]).to(dev)
    mask = torch.from_numpy(batch.masks[k, e]).to(dev)
    logp_all = masked_log_probs(net(x), mask)
    logp = logp_all.gather(1, torch.from_numpy(batch.actions[k, e])[:, None].to(dev))[:, 0]
    loss = -(logp * torch.from_numpy(adv[k, e]).float().to(dev)).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"iteration {iteration}: non-finite policy-gradient loss {float(loss)}")
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    probs = logp_all.exp()
    entropy = -(probs * torch.where(mask, logp_all, torch.zeros_like(logp_all))).sum(dim=1).mean()
    return {"loss": float(loss.detach()), "entropy": float(entropy.detach())}


class PolicyNet(nn.Module):
    """features (E, F) -> logits over the actions: Linear(F, hidden), ReLU, Linear(hidden, n_actions), seeded
    (TVW-RL and DeepRM both use one hidden layer of 20 units)."""

    def __init__(self, n_features: int, n_actions: int, hidden_units: int, seed: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(n_features, hidden_units), nn.ReLU(), nn.Linear(hidden_units, n_actions)
        )
        init_parameters(self, torch.Generator().manual_seed(seed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


# checkpoints


def save_checkpoint(
    path: Path, config: dict, iteration: int, net: nn.Module, optimiser, curve: list[dict]
) -> None:
    """Write a resumable checkpoint atomically (`models.checkpoint.save_atomic`): config, iteration, weights,
    optimiser, curve."""
    payload = {
        "config": config,
        "iteration": iteration,
        "model": net.state_dict(),
        "optimiser": optimiser.state_dict(),
        "curve": curve,
    }
    save_atomic(Path(path), payload)


def load_checkpoint(path: Path, expected_config: dict | None = None) -> dict:
    """A checkpoint (or a trained policy file: it holds the same config, iteration and weights) loaded with
    weights_only=True. ValueError naming the file when it is corrupt or truncated, or when `expected_config` is
    given and differs from the one it was trained with (listing the fields)."""
    path = Path(path)
    ckpt = read_payload(path, "checkpoint")
    if not {"config", "iteration", "model"} <= set(ckpt):
        raise ValueError(f"checkpoint {path} lacks config/iteration/model: not a tvw checkpoint")
    if expected_config is not None:
        check_config(path, ckpt["config"], expected_config)
    return ckpt


def policy_payload(checkpoint_path: Path, policy: str) -> dict:
    """The trained-policy payload (`models.checkpoint.publish_policy`) of the REINFORCE checkpoint at
    `checkpoint_path`: its config, weights and curve, the iteration it reached and the n_iterations its config asks
    for; no optimiser (evaluation needs none)."""
    ckpt = load_checkpoint(checkpoint_path)
    return {
        "policy": policy,
        "config": ckpt["config"],
        "iteration": int(ckpt["iteration"]),
        "n_iterations": int(ckpt["config"]["ReinforceConfig"]["n_iterations"]),
        "model": ckpt["model"],
        "curve": list(ckpt.get("curve", [])),
    }


def check_state_space(policy: str, checkpoint, fields: tuple[str, ...], trained, given) -> None:
    """ValueError naming the policy and its checkpoint when the SimConfig `given` differs from the one the network
    was `trained` for in any of `fields` (those that fix the network's input and output)."""
    bad = [f for f in fields if getattr(given, f) != getattr(trained, f)]
    if bad:
        raise ValueError(
            f"{policy} policy {checkpoint or '(untrained)'} was built for another state space: "
            + ", ".join(f"{f} {getattr(trained, f)} != {getattr(given, f)}" for f in bad)
        )


def config_dict(*configs) -> dict:
    """The plain dict of one or more dataclass configs (tuples become lists, as a checkpoint stores them)."""

    def plain(v):
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    out: dict = {}
    for c in configs:
        out[type(c).__name__] = plain(asdict(c))
    return out


def train_loop(
    net: nn.Module,
    run_iteration: Callable[[int, np.random.Generator], RolloutBatch],
    cfg: ReinforceConfig,
    config: dict,
    checkpoint_path: Path | None = None,
    log: Callable[[str], None] | None = None,
    curve_extra: Callable[[RolloutBatch], dict[str, float]] | None = None,
    name: str = "policy",
) -> list[dict]:
    """Run REINFORCE for cfg.n_iterations, resuming from `checkpoint_path` when it exists (same `config`, else a
    clear error; `log` then gets "resuming <name> from iteration N of M"). The checkpoint is written there every
    cfg.checkpoint_every iterations and at the end; it is never the trained policy (`policy_payload`, then
    `models.checkpoint.publish_policy`, make that). Iteration i draws everything from default_rng([seed, i]), so a
    resumed run reaches the same weights as an uninterrupted one. Returns the learning curve: one row per
    iteration (iteration, mean and std of the episode return, loss, entropy, wall seconds, plus `curve_extra`)."""
    optimiser = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate)
    curve: list[dict] = []
    start = 0
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        ckpt = load_checkpoint(checkpoint_path, config)
        net.load_state_dict(ckpt["model"])
        optimiser.load_state_dict(ckpt["optimiser"])
        curve, start = list(ckpt["curve"]), int(ckpt["iteration"])
        if log is not None:
            log(resume_message(name, start, cfg.n_iterations))
    t_start = time.perf_counter()
    for i in range(start, cfg.n_iterations):
        t0 = time.perf_counter()
        rng = np.random.default_rng([cfg.seed, i])
        batch = run_iteration(i, rng)
        stats = policy_gradient_step(net, optimiser, batch, cfg, i)
        returns = batch.episode_returns
        row = {
            "iteration": i,
            "mean_return": float(returns.mean()),
            "std_return": float(returns.std()),
            **stats,
            "n_truncated": int(batch.is_truncated.sum()),
            "wall_s": time.perf_counter() - t0,
            **(curve_extra(batch) if curve_extra else {}),
        }
        curve.append(row)
        done = i + 1
        if checkpoint_path is not None and (done % cfg.checkpoint_every == 0 or done == cfg.n_iterations):
            save_checkpoint(checkpoint_path, config, done, net, optimiser, curve)
        if log is not None and (done == cfg.n_iterations or done % max(1, cfg.n_iterations // 20) == 0):
            elapsed = time.perf_counter() - t_start
            per_it = elapsed / (done - start)
            log(
                f"iteration {done}/{cfg.n_iterations}: return {row['mean_return']:.4g} "
                f"(sd {row['std_return']:.3g}), {per_it:.2f} s/iteration, "
                f"{math.ceil(per_it * (cfg.n_iterations - done))} s left"
            )
    return curve
