"""Dejavu benchmarks (printed figures, not tests).

Section "speed": seconds per training iteration on this machine, pretraining (updates only) and RL (lock-step
episodes with the competitive reward, then updates), with the RL iteration split into rollout (simulation,
features, the baseline's copy step and the reward) and update time.

Section "learning": Dejavu trained on DeepPlace synthetic train sequences at one load, then dejavu vs kube_default
vs random_valid on the test sequences: the simulator's return, utilisation, machines used and Dejavu's own metrics.

    .venv/bin/python benchmarks/bench_dejavu.py speed
    .venv/bin/python benchmarks/bench_dejavu.py learning [--load 50] [--out /tmp/dejavu_bench]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from models.dejavu import (
    DejavuConfig,
    DejavuPolicy,
    _update,
    build_transitions,
    collect_demonstrations,
    compare_policies,
    concat_transitions,
    epsilon_greedy_act,
    latest_checkpoint,
    new_trainer,
    run_competitive_episodes,
    train,
)
from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import make_policy

TRAIN_SIM = SimConfig(jobs_per_episode=150)
"""Training episodes: the first 150 jobs of a sequence, long enough for the cluster to fill up by requests as in
the whole test sequences (with 60 jobs the agent rarely saw the states where kube_default holds)."""


def deepplace_jobs(load_pct: int, n_train: int, n_test: int) -> tuple[JobBatch, JobBatch]:
    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=n_train, n_test_sequences=n_test, loads_pct=(load_pct,))
    )
    return (
        JobBatch.from_frame(frame.filter(pl.col("split") == "train")),
        JobBatch.from_frame(frame.filter(pl.col("split") == "test")),
    )


def bench_speed(n_iterations: int = 3) -> None:
    torch.set_num_threads(1)
    train_jobs, _ = deepplace_jobs(50, 8, 1)
    for name, dcfg in (("short", DejavuConfig.short()), ("paper", DejavuConfig(n_demo_decisions=2000))):
        tr = new_trainer(dcfg, TRAIN_SIM)
        start = time.perf_counter()
        demos, counts = collect_demonstrations(TRAIN_SIM, dcfg, train_jobs, np.random.default_rng(0))
        demo_s = time.perf_counter() - start
        candidates = np.flatnonzero(demos.is_sampled.numpy())
        start = time.perf_counter()
        for _ in range(n_iterations):
            _update(tr, demos, candidates)
        pre_s = (time.perf_counter() - start) / n_iterations
        roll_s, upd_s, n_dec = 0.0, 0.0, 0
        for _ in range(n_iterations):
            start = time.perf_counter()
            rows = tr.rng.choice(train_jobs.batch_size, size=dcfg.episodes_per_iteration)
            ep = run_competitive_episodes(
                TRAIN_SIM, dcfg, train_jobs.select(rows), epsilon_greedy_act(tr.online, 0.1), tr.rng
            )
            part = build_transitions(
                ep.features, ep.masks, ep.actions, ep.rewards, ep.alive, dcfg.discount, dcfg.n_step, False
            )
            roll_s += time.perf_counter() - start
            n_dec += len(part)
            start = time.perf_counter()
            data = concat_transitions([demos, part])
            _update(tr, data, np.flatnonzero(data.is_sampled.numpy()))
            upd_s += time.perf_counter() - start
        print(
            f"[{name}] hidden {dcfg.hidden_units}, batch {dcfg.batch_size}, {dcfg.updates_per_iteration} updates/iter, "
            f"{dcfg.episodes_per_iteration} episodes/iter of {TRAIN_SIM.jobs_per_episode} jobs"
        )
        print(
            f"  demonstrations: {counts['n_candidates']} decisions in {demo_s:.1f} s "
            f"({1e3 * demo_s / counts['n_candidates']:.2f} ms/decision incl. selection), {counts['n_kept']} kept"
        )
        print(
            f"  pretraining iteration: {pre_s:.2f} s ({1e3 * pre_s / dcfg.updates_per_iteration:.1f} ms/update)"
        )
        rl = (roll_s + upd_s) / n_iterations
        print(
            f"  RL iteration: {rl:.2f} s = rollout {roll_s / n_iterations:.2f} s "
            f"({n_dec // n_iterations} decisions) + updates {upd_s / n_iterations:.2f} s"
        )


def bench_learning(load_pct: int, out: Path, n_train: int, n_test: int, dcfg: DejavuConfig) -> pl.DataFrame:
    train_jobs, test_jobs = deepplace_jobs(load_pct, n_train, n_test)
    start = time.perf_counter()
    train(dcfg, TRAIN_SIM, train_jobs, checkpoint_dir=out, log=print)
    print(f"training: {time.perf_counter() - start:.0f} s")
    eval_cfg = SimConfig()
    policies = {
        "dejavu": DejavuPolicy(latest_checkpoint(out)),
        "dejavu_untrained": make_policy("dejavu"),
        "kube_default": make_policy("kube_default"),
        "random_valid": make_policy("random_valid"),
    }
    table = compare_policies(policies, eval_cfg, test_jobs, seed=0)
    columns = [
        "episode_return",
        "avg_util_cpu_frac",
        "avg_util_mem_frac",
        "machines_used",
        "avg_overshoot_pct",
        "dejavu_util_frac",
        "rbd1",
        "rbd2",
        "completion_time_steps",
        "turnaround_time_steps",
    ]
    summary = table.group_by("policy").agg(
        [pl.col(c).mean() for c in columns] + [pl.col("episode_return").std().alias("episode_return_std")]
    )
    with pl.Config(tbl_cols=-1, tbl_width_chars=250, fmt_float="mixed"):
        print(
            f"DeepPlace synthetic, load {load_pct} %, {test_jobs.batch_size} test sequences (full sequences):"
        )
        print(summary.sort("policy"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("section", choices=("speed", "learning"))
    parser.add_argument("--load", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dejavu_bench"))
    parser.add_argument("--train-sequences", type=int, default=16)
    parser.add_argument("--test-sequences", type=int, default=10)
    parser.add_argument("--rl-iterations", type=int, default=20)
    parser.add_argument("--pretrain-iterations", type=int, default=20)
    parser.add_argument("--demo-decisions", type=int, default=5000)
    args = parser.parse_args()
    if args.section == "speed":
        bench_speed()
    else:
        dcfg = DejavuConfig.short(
            n_demo_decisions=args.demo_decisions,
            n_pretrain_iterations=args.pretrain_iterations,
            n_rl_iterations=args.rl_iterations,
            updates_per_iteration=100,
            episodes_per_iteration=8,
            hidden_units=(128, 128),
            target_update_every=200,
            epsilon_decay_iterations=max(args.rl_iterations // 2, 1),
            checkpoint_every=10,
        )
        bench_learning(args.load, args.out, args.train_sequences, args.test_sequences, dcfg)


if __name__ == "__main__":
    main()
