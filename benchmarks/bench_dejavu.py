"""Dejavu benchmarks (printed figures, not tests).

Section "speed": seconds per training iteration on this machine, pretraining (updates only) and RL (lock-step
episodes with the competitive reward, then updates), with the RL iteration split into rollout (simulation,
features, the baseline's copy step and the reward) and update time.

Section "learning": Dejavu trained on DeepPlace synthetic train sequences at one load, then dejavu vs kube_default
vs random_valid on the test sequences: the simulator's return, utilisation, machines used and Dejavu's own metrics.

Section "cells": against its demonstrator. For every (source, load) of a warehouse's `sim__job_sequences` (Dejavu's
sources: not DeepRM's single node), Dejavu trained with a preset (`DejavuTrainConfig`, as `rl__dejavu`) per seed,
then greedy on the test sequences against kube_default in `eval__results`' simulator: mean episode return of each
(seeds averaged within a sequence), the paired difference with its 95 % t-interval over sequences, and the share
of the agent's own decisions where kube_default would decide the same. Measured on the sample profile's warehouse
(sample preset, seeds 0-2, 5 test sequences per cell, 2 shared cores): with --demonstrator-prior 0 the agent is
below kube_default in 8 of 9 cells (agreement 2-65 %; 10x the pretraining, no RL or every demonstration kept left
DeepPlace 50 % still at 2.9-3.4x kube_default's cost, agreement 15-21 %); with the default prior (5) none is.

    .venv/bin/python benchmarks/bench_dejavu.py speed
    .venv/bin/python benchmarks/bench_dejavu.py learning [--load 50] [--out /tmp/dejavu_bench]
    .venv/bin/python benchmarks/bench_dejavu.py cells --sequences <warehouse>/tables/sim__job_sequences/all.parquet
        [--preset sample] [--seeds 0,1,2] [--demonstrator-prior 5]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import stats

from models.dejavu import (
    SINGLE_NODE_SOURCES,
    DejavuConfig,
    DejavuPolicy,
    DejavuTrainConfig,
    _update,
    build_transitions,
    collect_demonstrations,
    compare_policies,
    concat_transitions,
    dejavu_episode_metrics,
    epsilon_greedy_act,
    eval_label_count,
    latest_checkpoint,
    new_trainer,
    run_competitive_episodes,
    train,
)
from models.learned import ResultsConfig
from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import KubeDefault, decide, make_policy

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


def agreement(policy, cfg: SimConfig, jobs: JobBatch, seed: int) -> float:
    """Share of `policy`'s own decisions (envs alive) where kube_default, on the same state, decides the same."""
    rng = np.random.default_rng(seed)
    state, trace, kube = core.reset(cfg, jobs, seed), core.make_trace(cfg, jobs.batch_size), KubeDefault()
    same = total = 0
    for _ in range(int(jobs.max_jobs + cfg.max_steps + 1)):
        if state.is_done.all():
            break
        alive = ~state.is_done
        state_for, actions = decide(policy, cfg, state, rng)
        same += int((alive & (actions == kube.act(cfg, state_for, rng))).sum())
        total += int(alive.sum())
        state, *_ = core.step(cfg, state_for, actions, trace)
    return same / max(total, 1)


def bench_cells(sequences: Path, preset: str, seeds: list[int], prior: float, out: Path) -> None:
    frame = pl.read_parquet(sequences).filter(~pl.col("source").is_in(SINGLE_NODE_SOURCES))
    n_labels = eval_label_count(frame)
    settings = ResultsConfig()
    cfg = SimConfig(
        n_machines=settings.n_machines,
        max_steps=settings.max_steps,
        n_labels=n_labels,
        noise_max_units=settings.noise_max_units,
        oversize="clip",
    )
    for (source, load), part in frame.group_by("source", "load_pct", maintain_order=True):
        train_jobs = JobBatch.from_frame(part.filter(pl.col("split") == "train"))
        test_jobs = JobBatch.from_frame(part.filter(pl.col("split") == "test"))
        returns = {"kube_default": [], "dejavu": []}
        agree, start = [], time.perf_counter()
        for seed in seeds:
            dcfg, sim_cfg = DejavuTrainConfig(preset=preset).configs(seed, n_labels)
            folder = out / f"{source}-{load}-{seed}"
            train(replace(dcfg, demonstrator_prior=prior), sim_cfg, train_jobs, checkpoint_dir=folder)
            agent = DejavuPolicy(latest_checkpoint(folder))
            for name, policy in (("kube_default", make_policy("kube_default")), ("dejavu", agent)):
                metrics = dejavu_episode_metrics(policy, cfg, test_jobs, seed)
                returns[name].append([m["episode_return"] for m in metrics])
            agree.append(agreement(agent, cfg, test_jobs, seed))
        kube, agent_ret = np.mean(returns["kube_default"], axis=0), np.mean(returns["dejavu"], axis=0)
        diff = agent_ret - kube
        half = (
            stats.t.ppf(0.975, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
            if diff.size > 1
            else 0.0
        )
        print(
            f"{source} {load} %: kube_default {kube.mean():.4g}, dejavu {agent_ret.mean():.4g}, difference "
            f"{diff.mean():+.4g} +- {half:.3g} ({100 * diff.mean() / abs(kube.mean()):+.1f} %), agreement "
            f"{np.mean(agree):.0%}, {time.perf_counter() - start:.0f} s",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("section", choices=("speed", "learning", "cells"))
    parser.add_argument("--sequences", type=Path, help="cells: a sim__job_sequences Parquet file")
    parser.add_argument("--preset", default="sample", help="cells: the DejavuConfig preset")
    parser.add_argument("--seeds", default="0,1,2", help="cells: training seeds")
    parser.add_argument("--demonstrator-prior", type=float, default=DejavuConfig().demonstrator_prior)
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
    elif args.section == "cells":
        if args.sequences is None or not args.sequences.exists():
            raise SystemExit("cells: --sequences <warehouse>/tables/sim__job_sequences/all.parquet")
        seeds = [int(x) for x in args.seeds.split(",")]
        bench_cells(args.sequences, args.preset, seeds, args.demonstrator_prior, args.out)
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
