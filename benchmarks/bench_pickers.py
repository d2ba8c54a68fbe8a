"""Job-picking heuristics (Tetris, DeepRM's SJF and Packer move a queued job to the head before each placement):
episode time when the episode reorders its own batch in place (`sim.policies.decide(..., in_place=True)`, what
`sim.tuning.sequence_returns` and the evaluation do) against copying every per-job array at each pick (the
`in_place=False` default of `decide`), on the same batch in this one run, and checks that the returns agree.

The batch is DeepPlace's workload at 50 % (M = 10): `--sequences` sequences, each repeated `--repeats` times, as
a training rollout batches them (default 14 x 20 = 280 envs).

    PYTHONPATH=. python benchmarks/bench_pickers.py [--sequences 14] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import polars as pl

from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import decide, make_policy
from sim.tuning import sequence_returns


def copying_returns(policy, cfg: SimConfig, jobs: JobBatch, seed: int) -> np.ndarray:
    rng, state = np.random.default_rng(seed), core.reset(cfg, jobs, seed)
    while not state.is_done.all():
        state, actions = decide(policy, cfg, state, rng)
        state, *_ = core.step(cfg, state, actions)
    return state.penalty_totals.sum(axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dp = replace(DeepPlaceConfig(), n_train_sequences=args.sequences, n_test_sequences=0, loads_pct=(50,))
    frame, _ = build_deepplace_sequences(dp)
    jobs = JobBatch.from_frame(frame.filter(pl.col("split") == "train"))
    jobs = jobs.select(np.repeat(np.arange(jobs.batch_size), args.repeats))
    cfg = SimConfig(n_machines=10, max_steps=1000, oversize="clip")
    print(
        f"DeepPlace 50 %: {jobs.batch_size} envs, {jobs.max_jobs} job slots, {jobs.max_duration} steps per job"
    )
    for name in ("tetris", "deeprm_sjf", "deeprm_packer"):
        t0 = time.perf_counter()
        fast = sequence_returns(make_policy(name), cfg, jobs, 0)
        t_fast = time.perf_counter() - t0
        t0 = time.perf_counter()
        slow = copying_returns(make_policy(name), cfg, jobs, 0)
        t_slow = time.perf_counter() - t0
        same = "identical returns" if np.array_equal(fast, slow) else "RETURNS DIFFER"
        print(
            f"  {name:<14} in place {t_fast:6.1f} s, copying {t_slow:6.1f} s: {t_slow / t_fast:.1f}x ({same})"
        )


if __name__ == "__main__":
    main()
