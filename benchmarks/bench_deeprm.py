"""Seconds per training iteration of DeepRM's agent (`models.deeprm`), split into simulation, state encoding and
network time, on DeepRM's synthetic workload (70 % load) and on TVW-RL's cluster (M = 10, DeepPlace workload).

One iteration = a lock-step rollout of n_sequences x n_trajectories episodes (the same calls as
`models.deeprm.rollout_deeprm`, timed piece by piece) and one policy-gradient step (`models.reinforce`).
"simulation": promoting the chosen job, Best-Fit, `sim.core.step` and the reward; "encoding": the image state and
the slot mask; "network": forward passes during the rollout, sampling, and the gradient step. One torch thread.

Run: .venv/bin/python benchmarks/bench_deeprm.py [--iterations 3] [--batches 8x8,20x20]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import polars as pl
import torch

from models.deeprm import (
    DeepRMAgentConfig,
    apply_choice,
    build_net,
    decision_rewards,
    encode,
    n_features,
    slot_mask,
)
from models.reinforce import policy_gradient_step, sample_masked
from pipelines.synthetic import (
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
)
from sim import core
from sim.jobs import JobBatch
from sim.rollout import RolloutBatch


def timed_iteration(net, optimiser, cfg: DeepRMAgentConfig, jobs: JobBatch, seed: int) -> dict[str, float]:
    """One training iteration with its time split (seconds) and its size (decisions, envs)."""
    r = cfg.reinforce
    rng = np.random.default_rng(seed)
    picked = jobs.select(rng.integers(0, jobs.batch_size, size=r.n_sequences))
    env_jobs = picked.select(np.repeat(np.arange(picked.batch_size), r.n_trajectories))
    t_sim = t_enc = t_net = 0.0
    t0 = time.perf_counter()
    state = core.reset(cfg.sim, env_jobs, rng.integers(0, 2**31 - 1, size=env_jobs.batch_size).tolist())
    t_sim += time.perf_counter() - t0
    feats, masks, acts, rewards, alive = [], [], [], [], []
    while not state.is_done.all():
        is_alive = ~state.is_done
        t0 = time.perf_counter()
        x = encode(cfg, state)
        mask = slot_mask(cfg, cfg.sim, state)
        t1 = time.perf_counter()
        with torch.no_grad():
            logits = net(torch.from_numpy(x))
        a = np.where(is_alive, sample_masked(logits, mask, rng, greedy=False), cfg.sim.queue_size)
        t2 = time.perf_counter()
        before, sim_actions = apply_choice(cfg, state, a)
        state, _, _, _, info = core.step(cfg.sim, before, sim_actions)
        rewards.append((decision_rewards(cfg, before, state, info) * is_alive[:, None]).sum(axis=1))
        t3 = time.perf_counter()
        t_enc, t_net, t_sim = t_enc + t1 - t0, t_net + t2 - t1, t_sim + t3 - t2
        feats.append(x)
        masks.append(mask)
        acts.append(a)
        alive.append(is_alive)
    batch = RolloutBatch(
        features=np.stack(feats),
        masks=np.stack(masks),
        actions=np.stack(acts),
        rewards=np.stack(rewards),
        alive=np.stack(alive),
        penalty_totals=np.zeros((env_jobs.batch_size, 3)),
        is_truncated=state.is_truncated.copy(),
        n_sequences=r.n_sequences,
        n_trajectories=r.n_trajectories,
    )
    t0 = time.perf_counter()
    policy_gradient_step(net, optimiser, batch, r, 0)
    t_grad = time.perf_counter() - t0
    return {
        "simulation_s": t_sim,
        "encoding_s": t_enc,
        "network_s": t_net + t_grad,
        "gradient_step_s": t_grad,
        "decisions": len(acts),
        "envs": env_jobs.batch_size,
        "features_mb": batch.features.nbytes / 2**20,
    }


def workloads() -> dict[str, tuple[DeepRMAgentConfig, JobBatch]]:
    """DeepRM's own setting (1-machine pool, its workload at 70 %) and TVW-RL's cluster (DeepPlace, 50 %)."""
    drm = build_deeprm_sequences(DeepRMConfig(n_train_sequences=40, n_test_sequences=0, loads_pct=(70,)))
    dp, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=20, n_test_sequences=0, loads_pct=(50,))
    )
    return {
        "deeprm_synthetic (M=1, K=10)": (DeepRMAgentConfig(), JobBatch.from_frame(drm)),
        "deepplace_synthetic (M=10, K=10, 40 jobs)": (
            DeepRMAgentConfig.tvw_baseline(),
            JobBatch.from_frame(dp),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=3, help="timed iterations per setting (after 1 warm-up)"
    )
    parser.add_argument(
        "--batches", default="8x8,20x20", help="n_sequences x n_trajectories, comma-separated"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, (base, jobs) in workloads().items():
        for spec in args.batches.split(","):
            n_seq, n_traj = (int(v) for v in spec.split("x"))
            cfg = replace(base, reinforce=replace(base.reinforce, n_sequences=n_seq, n_trajectories=n_traj))
            net = build_net(cfg)
            optimiser = torch.optim.Adam(net.parameters(), lr=cfg.reinforce.learning_rate)
            timed_iteration(net, optimiser, cfg, jobs, 0)
            runs = []
            for i in range(args.iterations):
                t0 = time.perf_counter()
                split = timed_iteration(net, optimiser, cfg, jobs, i + 1)
                runs.append({"total_s": time.perf_counter() - t0, **split})
            mean = pl.DataFrame(runs).mean().row(0, named=True)
            rows.append({"setting": name, "batch": spec, "features": n_features(cfg), **mean})
    with pl.Config(tbl_cols=20, tbl_width_chars=200, float_precision=2):
        print(pl.DataFrame(rows))
    print(
        "seconds per training iteration (mean of the timed iterations); one torch thread; this machine's load"
    )
    print("is shared, so compare settings within one run")


if __name__ == "__main__":
    main()
