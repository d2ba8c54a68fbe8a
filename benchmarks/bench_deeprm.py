"""Seconds per training iteration of DeepRM's agent (`models.deeprm`), split into simulation, state encoding and
network time, on DeepRM's synthetic workload (70 % load) and on TVW-RL's cluster (M = 10, DeepPlace workload).

One iteration = a lock-step rollout of n_sequences x n_trajectories episodes (the same calls as
`models.deeprm.rollout_deeprm`, timed piece by piece) and one policy-gradient step (`models.reinforce`).
"simulation": promoting the chosen job, Best-Fit, `sim.core.step` and the reward; "encoding": the image state and
the slot mask; "network": forward passes during the rollout, sampling, and the gradient step. One torch thread.

Run: .venv/bin/python benchmarks/bench_deeprm.py [--iterations 3] [--batches 8x8,20x20]

With --fig4-load L: instead, DeepRM's own agent (`DeepRMAgentConfig.short`, its reward: the slowdown alone, unless
--k-unused) trained --iterations times on --batches (one, e.g. 8x8) of DeepRM's workload at load L, its learning
curve (training slowdown per tenth of the run) and the greedy agent's Figure 4 row against SJF, Packer, Tetris and
Tetris* on 30 test jobsets. Measured on 2 shared cores (load average about 11), seed 0, L = 90, 200 iterations of
8 x 8 (17 min; 6 min at load 4): training slowdown 3.44 (first 20 iterations) -> 2.08 (last 20), greedy 1.99 +- 0.22
(k_unused 0) and 2.12 +- 0.24 (k_unused 1) against SJF 1.84 +- 0.15 and Tetris* 1.90 +- 0.19; seed 1: 1.86 +- 0.16
and 2.00 +- 0.20; 500 iterations (k_unused 0, 8 min): 1.85 +- 0.16, at SJF's level; 1000 iterations (7 min at
a lower load): 1.65 +- 0.14, below SJF (training slowdown 2.70 in the first 100, 1.62 in the last); at 70 %, 200 iterations:
1.50 +- 0.14 against SJF 1.46 +- 0.12 and Tetris* 1.49 +- 0.14. The sample budget (15 of 4 x 4), seeds 0-2:
4.42 / 3.17 / 3.24 (k_unused 0) and 3.72 / 2.92 / 3.42 (k_unused 1): a near-initial policy either way.

    .venv/bin/python benchmarks/bench_deeprm.py --fig4-load 90 --iterations 200 --batches 8x8 [--k-unused 0]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

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
    slowdown_vs_load,
    train_deeprm,
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
        "deeprm_synthetic (M=1, K=10)": (DeepRMAgentConfig.paper(), JobBatch.from_frame(drm)),
        "deepplace_synthetic (M=10, K=10, 40 jobs)": (
            DeepRMAgentConfig.tvw_baseline(),
            JobBatch.from_frame(dp),
        ),
    }


def fig4_learning(load_pct: int, n_iterations: int, batch: str, k_unused: float, seed: int) -> None:
    """DeepRM's agent on its workload at `load_pct`: learning curve in tenths, then the Figure 4 row at that load."""
    frame = build_deeprm_sequences(DeepRMConfig(loads_pct=(load_pct,)))
    n_seq, n_traj = (int(v) for v in batch.split("x"))
    base = DeepRMAgentConfig.short(seed)
    r = replace(base.reinforce, n_iterations=n_iterations, n_sequences=n_seq, n_trajectories=n_traj)
    cfg = replace(base, k_unused=k_unused, reinforce=r)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agent.pt"
        start = time.perf_counter()
        curve = pl.DataFrame(
            train_deeprm(JobBatch.from_frame(frame.filter(pl.col("split") == "train")), cfg, path)
        )
        print(f"training: {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
        tenth = max(n_iterations // 10, 1)
        blocks = curve.with_row_index("i").group_by(
            (pl.col("i") // tenth).alias("tenth"), maintain_order=True
        )
        print(blocks.agg(pl.col("mean_slowdown", "entropy", "mean_return").mean()))
        table, _ = slowdown_vs_load(frame, path, include_random=False)
    print(table.select("load_pct", "policy", "mean_slowdown", "slowdown_ci95"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=3, help="timed iterations per setting (after 1 warm-up)"
    )
    parser.add_argument(
        "--batches", default="8x8,20x20", help="n_sequences x n_trajectories, comma-separated"
    )
    parser.add_argument(
        "--fig4-load", type=int, default=None, help="learning curve and Figure 4 at this load"
    )
    parser.add_argument(
        "--k-unused", type=float, default=0.0, help="with --fig4-load: the unused-resource weight"
    )
    parser.add_argument("--seed", type=int, default=0, help="with --fig4-load: the training seed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fig4_load is not None:
        fig4_learning(args.fig4_load, args.iterations, args.batches, args.k_unused, args.seed)
        return
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
