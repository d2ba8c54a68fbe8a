"""TVW-RL at the paper's scale on a real source (issue 22 item 5): 100 training and 30 test sequences per load,
2000 REINFORCE iterations of 20 sequences x 20 trajectories (the paper's 20-unit network, its state and its time
baseline: `models.tvw_rl.TvwRlConfig.paper`), one run per training seed, then the greedy policy on the 30 test
sequences against the request-based heuristics, paired by sequence with 95 % intervals.

Sequences are cut by the project's own builder from a warehouse that a `tvw-run` filled (layers raw .. ec: the
long-running workloads, their usage and the EC labels; train and test from disjoint workloads); the agent sees EC
labels predicted by the source's saved EC classifier (TVW-RL Algorithm 1), as `rl__tvw_rl` does.

Resumable: each seed's checkpoint lives under `--out` and a second call goes on from the last saved iteration
(every 50), so the grid can run across sessions. Progress and the time left print every 5 % of a run.

    PYTHONPATH=. python benchmarks/run_tvw_rl_paper.py --warehouse warehouse [--source bitbrains] [--loads 50]
        [--seeds 0,1,2] [--iterations 2000] [--out runs/tvw_rl_paper]

The whole grid of the issue (Bitbrains and Google-derived at 30/50/80 %, 3 seeds) is
`--source bitbrains --loads 30,50,80` and `--source google2011_derived --loads 30,50,80`: 18 runs at the measured
seconds per iteration printed below (the README gives the projection).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.bench_placement import real_sequences, warehouse_labellers
from models.forecast_placer import paired_interval
from models.tvw_rl import TvwRlConfig, TvwRlPolicy, train_tvw_rl
from pipelines.job_sequences import SequenceConfig
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.labelling import Labeller
from sim.policies import make_policy
from sim.tuning import sequence_returns

HEURISTICS = (
    "tetris",
    "best_fit",
    "first_fit",
    "kube_default",
    "deeprm_sjf",
    "deeprm_packer",
    "random_valid",
)


def labeller(warehouse: Path, source: str, sequences: pl.DataFrame) -> Labeller | None:
    """The source's EC labeller as the pipeline serves it for `sequences` (fitted on their training jobs, or the
    classifier trained without their test workloads: `bench_placement.warehouse_labellers`), or None (the agent then sees the clustering labels)."""
    served = warehouse_labellers(warehouse, sequences)(source)
    if served is None:
        print(f"no EC classifier for {source} under {warehouse}: the agent sees the clustering labels")
    return served


def time_split(train: JobBatch, cfg: TvwRlConfig, lab, n_iterations: int) -> dict[str, float]:
    """Seconds per iteration of `n_iterations` timed REINFORCE iterations (a fresh network), split as
    `benchmarks/bench_rl.py` splits them: simulation (step), observation (encode + EC labelling), network (forward
    while acting + update)."""
    import torch

    from models.forecaster import torch_threads
    from models.reinforce import policy_gradient_step
    from models.tvw_rl import build_net, make_act
    from sim.rollout import rollout

    r = cfg.reinforce
    net = build_net(cfg)
    optimiser = torch.optim.Adam(net.parameters(), lr=r.learning_rate)
    totals: dict[str, float] = {}
    t0 = time.perf_counter()
    with torch_threads(1):
        for i in range(n_iterations):
            rng = np.random.default_rng([r.seed, i])
            rows = rng.integers(0, train.batch_size, size=r.n_sequences)
            timings: dict[str, float] = {}
            batch = rollout(
                cfg.sim, cfg.obs, train.select(rows), r.n_trajectories, make_act(net), i, lab, timings=timings
            )
            t1 = time.perf_counter()
            policy_gradient_step(net, optimiser, batch, r, i)
            timings["update"] = time.perf_counter() - t1
            for k, v in timings.items():
                totals[k] = totals.get(k, 0.0) + v
    n = max(n_iterations, 1)
    return {
        "total": (time.perf_counter() - t0) / n,
        "simulation": totals.get("step", 0.0) / n,
        "observation": (totals.get("encode", 0.0) + totals.get("label", 0.0)) / n,
        "network": (totals.get("act", 0.0) + totals.get("update", 0.0)) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--source", default="bitbrains")
    ap.add_argument("--loads", default="50")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=2000, help="REINFORCE iterations (paper: 2000)")
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=30)
    ap.add_argument(
        "--step-bins", type=int, default=6, help="5-minute bins per step (the sample profile's 6)"
    )
    ap.add_argument("--out", default="runs/tvw_rl_paper")
    ap.add_argument(
        "--split-iterations", type=int, default=3, help="timed iterations for the time split (0: none)"
    )
    args = ap.parse_args()
    warehouse, out = Path(args.warehouse), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = [int(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    seq_cfg = SequenceConfig(
        loads_pct=tuple(loads),
        step_bins=args.step_bins,
        n_train_sequences=args.n_train,
        n_test_sequences=args.n_test,
    )
    frame = real_sequences(warehouse, args.source, seq_cfg)
    lab = labeller(warehouse, args.source, frame)
    rows = []
    for load in loads:
        cell = frame.filter(pl.col("load_pct") == load)
        train = JobBatch.from_frame(cell.filter(pl.col("split") == "train"))
        test = JobBatch.from_frame(cell.filter(pl.col("split") == "test"))
        n_labels = int(max(train.ec_label.max(), test.ec_label.max())) + 1
        eval_cfg = SimConfig(n_machines=10, max_steps=1000, oversize="clip", n_labels=max(16, n_labels))
        print(
            f"{args.source} {load} %: {train.batch_size} training, {test.batch_size} test sequences",
            flush=True,
        )
        heuristic = {name: sequence_returns(make_policy(name), eval_cfg, test, 0) for name in HEURISTICS}
        best = max(heuristic, key=lambda n: heuristic[n].mean())
        for seed in seeds:
            paper = TvwRlConfig.paper(seed)
            cfg = replace(
                paper,
                sim=replace(paper.sim, n_labels=eval_cfg.n_labels),
                reinforce=replace(paper.reinforce, n_iterations=args.iterations, checkpoint_every=50),
            )
            if args.split_iterations and seed == seeds[0]:
                split = time_split(train, cfg, lab, args.split_iterations)
                print(
                    f"  seconds per iteration ({args.split_iterations} timed): {split['total']:.2f} = simulation "
                    f"{split['simulation']:.2f} + observation {split['observation']:.2f} + network "
                    f"{split['network']:.2f} (+ the rest); {args.iterations} iterations projected at "
                    f"{split['total'] * args.iterations / 3600:.2f} h per seed",
                    flush=True,
                )
            ckpt = out / f"{args.source}_{load}_seed{seed}.ckpt"
            t0 = time.perf_counter()
            curve = train_tvw_rl(
                train, cfg, lab, ckpt, log=lambda m, s=seed: print(f"  seed {s}: {m}", flush=True)
            )
            wall = time.perf_counter() - t0
            policy = TvwRlPolicy(ckpt, labeller=lab)
            ours = sequence_returns(policy, eval_cfg, test, seed)
            mean, lo, hi = paired_interval(ours - heuristic[best])
            per_it = float(np.mean([r["wall_s"] for r in curve])) if curve else float("nan")
            rows.append(
                {
                    "source": args.source,
                    "load_pct": load,
                    "seed": seed,
                    "iterations": len(curve),
                    "seconds_per_iteration": per_it,
                    "wall_s_this_call": wall,
                    "tvw_rl_return": float(ours.mean()),
                    "best_heuristic": best,
                    "best_heuristic_return": float(heuristic[best].mean()),
                    "diff": mean,
                    "diff_ci_low": lo,
                    "diff_ci_high": hi,
                    "n_sequences_better": int((ours > heuristic[best]).sum()),
                    "random_valid_return": float(heuristic["random_valid"].mean()),
                }
            )
            print(
                f"  seed {seed}: {len(curve)} iterations, {per_it:.2f} s each; test return {ours.mean() / 1e6:.4f}e6 "
                f"vs {best} {heuristic[best].mean() / 1e6:.4f}e6: {mean / 1e6:+.4f} [{lo / 1e6:+.4f}, {hi / 1e6:+.4f}]",
                flush=True,
            )
    table = pl.DataFrame(rows)
    table.write_parquet(out / f"results_{args.source}.parquet")
    with pl.Config(tbl_rows=40, tbl_cols=20, tbl_width_chars=220):
        print(table)


if __name__ == "__main__":
    main()
