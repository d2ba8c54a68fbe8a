"""Does a briefly trained DeepRM agent finish the evaluation's episodes? Trains TVW-RL's "DeepRM" baseline with the
sample preset's budget (`models.deeprm.DeepRMTrainConfig(preset="sample").agent_config(source, seed)`, the
budget `DEEPRM_BUDGETS["sample"]`: 15 iterations of 4 x 4 episodes of 20 jobs) on each (source, load, seed) of a `sim__job_sequences` table, runs it greedily on that table's test sequences
in `eval__results`' simulator (M = 10, safety cap 1000 steps, hold rule "always") and prints, per run and in total,
the episodes that hit the cap, jobs never placed and training / evaluation seconds.

`--max-hold-steps none` gives DeepRM's void as published (no wait bound), to compare with the default bound.

Run: .venv/bin/python benchmarks/bench_deeprm_truncation.py <warehouse>/tables/sim__job_sequences/all.parquet
     [--loads 30,50,80] [--seeds 0,1,2] [--max-hold-steps 20|none]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import polars as pl

from models.deeprm import DeepRMAgentConfig, DeepRMAgentPolicy, DeepRMTrainConfig, train_deeprm
from pipelines.synthetic import DEEPRM_SOURCE
from sim.config import SimConfig
from sim.evaluate import evaluate_policies
from sim.jobs import JobBatch


def sample_config(source: str, seed: int, max_hold_steps: int | None) -> DeepRMAgentConfig:
    """The agent `rl__deeprm` trains on `source` under the sample preset (`DeepRMTrainConfig.agent_config`), with
    `max_hold_steps`."""
    cfg = DeepRMTrainConfig(preset="sample").agent_config(source, seed)
    return replace(cfg, max_hold_steps=max_hold_steps)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sequences", type=Path, help="a sim__job_sequences Parquet file")
    parser.add_argument("--loads", default="30,50,80")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-hold-steps", default="20", help="an integer, or 'none' (DeepRM as published)")
    args = parser.parse_args()
    if not args.sequences.exists():
        raise SystemExit(
            f"{args.sequences}: no such file (a warehouse's tables/sim__job_sequences/all.parquet)"
        )
    hold = None if args.max_hold_steps.lower() == "none" else int(args.max_hold_steps)
    seq = pl.read_parquet(args.sequences)
    sources = sorted(s for s in seq["source"].unique().to_list() if s != DEEPRM_SOURCE)
    eval_cfg = SimConfig(
        max_steps=1000,
        hold_rule="always",
        n_labels=max(SimConfig().n_labels, int(seq["ec_label"].max() or 0) + 1),
        oversize="clip",
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for load in (int(x) for x in args.loads.split(",")):
            for seed in (int(x) for x in args.seeds.split(",")):
                for source in sources:
                    part = seq.filter((pl.col("source") == source) & (pl.col("load_pct") == load))
                    train = part.filter(pl.col("split") == "train")
                    if train.is_empty() or part.filter(pl.col("split") == "test").is_empty():
                        continue
                    path = Path(tmp) / f"{source}-{load}-{seed}.pt"
                    start = time.perf_counter()
                    train_deeprm(JobBatch.from_frame(train), sample_config(source, seed, hold), path)
                    train_s = time.perf_counter() - start
                    start = time.perf_counter()
                    res = evaluate_policies(
                        part,
                        ["deeprm_rl"],
                        eval_cfg,
                        seeds=[seed],
                        make=lambda *_, p=path: DeepRMAgentPolicy(p),
                        log=lambda _: None,
                    )
                    row = {
                        "source": source,
                        "load_pct": load,
                        "seed": seed,
                        "n_episodes": res.height,
                        "n_truncated": int(res["is_truncated"].sum()),
                        "n_unplaced": int(res["n_unplaced"].sum()),
                        "train_s": round(train_s, 1),
                        "eval_s": round(time.perf_counter() - start, 1),
                    }
                    print(row, flush=True)
                    rows.append(row)
    table = pl.DataFrame(rows)
    print(f"max_hold_steps={hold}; load average {os.getloadavg()[0]:.1f}")
    print(table.select(pl.exclude("source", "load_pct", "seed")).sum())


if __name__ == "__main__":
    main()
