"""Seconds per TVW-RL training iteration at the paper's configuration, split into simulation, observation and
network time; and the projected time of the full 2000-iteration run.

Paper configuration (`models.tvw_rl.TvwRlConfig.paper()`): 20 sequences x 20 trajectories (400 envs) of up to
L = 200 steps, 40 jobs per episode, M = 10, h = 20, C = 8. Jobs: the DeepPlace synthetic workload at 50 % load
(`pipelines.synthetic`), which needs no trace; the agent sees the true job classes (no classifier), so the
labelling time is 0 here (with the EC classifier add its predict time per decision). Target: the 2000 iterations
in under 1 hour on 2 CPU cores (the paper reports 28-108 hours on a 32-core server).

--device puts the learner (the policy-gradient update) there; --act-device the forward passes while acting
(default: the CPU, with the learner's weights copied back after each update; one decision batch of 400 rows is
small for a GPU).

Run: .venv/bin/python benchmarks/bench_rl.py [--iterations 5] [--device cpu|cuda] [--act-device cpu|cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import polars as pl
import torch

from models.forecaster import torch_threads
from models.reinforce import policy_gradient_step
from models.tvw_rl import TvwRlConfig, build_net, make_act
from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim.jobs import JobBatch
from sim.observation import ObservationConfig
from sim.rollout import rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations")
    parser.add_argument("--device", default="cpu", help="where the update runs")
    parser.add_argument("--act-device", default="cpu", help="where the forward passes of acting run")
    args = parser.parse_args()
    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=100, n_test_sequences=1, loads_pct=(50,))
    )
    jobs = JobBatch.from_frame(frame.filter(pl.col("split") == "train"))
    cfg = dataclasses.replace(TvwRlConfig.paper(), obs=ObservationConfig(labels="true"))
    r = cfg.reinforce
    learner = build_net(cfg).to(args.device)
    actor = learner if args.act_device == args.device else build_net(cfg).to(args.act_device)
    optimiser = torch.optim.Adam(learner.parameters(), lr=r.learning_rate)
    totals: dict[str, float] = {}
    n_decisions = 0
    with torch_threads(1):
        for i in range(-1, args.iterations):  # iteration -1 warms up (CUDA context, allocator) untimed
            if i == 0:
                totals, n_decisions, wall = {}, 0, time.perf_counter()
            rng = np.random.default_rng([r.seed, i + 1])
            rows = rng.integers(0, jobs.batch_size, size=r.n_sequences)
            timings: dict[str, float] = {}
            batch = rollout(
                cfg.sim, cfg.obs, jobs.select(rows), r.n_trajectories, make_act(actor), i + 1, timings=timings
            )
            t0 = time.perf_counter()
            policy_gradient_step(learner, optimiser, batch, r, i + 1)
            if actor is not learner:
                actor.load_state_dict(learner.state_dict())
            timings["update"] = time.perf_counter() - t0
            n_decisions += int(batch.alive.sum())
            for k, v in timings.items():
                totals[k] = totals.get(k, 0.0) + v
    wall = time.perf_counter() - wall
    per_it = wall / args.iterations
    sim_s = totals.get("step", 0.0)
    obs_s = totals.get("encode", 0.0) + totals.get("label", 0.0)
    net_s = totals.get("act", 0.0) + totals.get("update", 0.0)
    print(f"learner on {args.device}, acting on {args.act_device}")
    print(
        f"paper config: {r.n_sequences} x {r.n_trajectories} trajectories, {cfg.sim.jobs_per_episode} jobs, L = {cfg.sim.max_steps}"
    )
    print(
        f"  {per_it:.2f} s/iteration ({n_decisions / wall:,.0f} decisions/s over {args.iterations} iterations)"
    )
    print(
        f"  split per iteration: simulation {sim_s / args.iterations:.2f} s, observation {obs_s / args.iterations:.2f} s, "
        f"network {net_s / args.iterations:.2f} s (forward while acting {totals.get('act', 0) / args.iterations:.2f} s, "
        f"update {totals.get('update', 0) / args.iterations:.2f} s)"
    )
    print(f"  projected {r.n_iterations} iterations: {per_it * r.n_iterations / 3600:.2f} h (target < 1 h)")


if __name__ == "__main__":
    main()
