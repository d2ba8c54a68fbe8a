"""What the remaining-peak table's at-peak key (`sim.peak_forecast.fit_peak_quantiles`' `use_at_peak`) changes on
test jobs: per (request mode, load, seed, resource) and level, the table fitted on the training sequences with and
without the key, scored on the cases (`peak_cases`) of the test sequences' jobs that have shown some usage. Slack is
the mean number of units the quantile sits below the job's request (what a rule may pack beyond requests);
exceeded is the share of cases whose remaining peak is above the quantile (each one an overshoot risk where a rule
packed on it). The sequences are `bench_placement.py`'s (the same step, sizes and seed); the tables are keyed by
remaining life, without EC labels (the key's effect alone). Test sequences are read for scoring only.

    python benchmarks/at_peak_key.py --warehouse warehouse [--source bitbrains] [--modes peak,trace] [--loads 80]
        [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.bench_placement import real_sequences
from pipelines.job_sequences import SequenceConfig
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.peak_forecast import fit_peak_quantiles, peak_cases

LEVELS = (0.5, 0.9, 0.95, 0.99)


def key_rows(train: JobBatch, test: JobBatch, cfg: SimConfig) -> list[dict]:
    """One row per (resource, level, keyed): slack and exceeded share on the test jobs' observed cases."""
    cases = peak_cases(test)
    observed = cases["peak_idx"] > 0
    rows = []
    for keyed in (False, True):
        table = fit_peak_quantiles(
            train, cfg, LEVELS, use_labels=False, use_remaining=True, use_at_peak=keyed
        )
        q = table.case_quantiles(cases)  # (L, N)
        for d in range(len(cfg.capacity_units)):
            m = observed & (cases["resource"] == d)
            for li, level in enumerate(LEVELS):
                rows.append(
                    {
                        "resource": ("cpu", "mem")[d] if d < 2 else str(d),
                        "level": level,
                        "at_peak_key": keyed,
                        "slack_units": float(np.clip(cases["request"][m] - q[li, m], 0, None).mean()),
                        "exceeded": float((cases["target"][m] > q[li, m]).mean()),
                        "n_cases": int(m.sum()),
                    }
                )
    return rows


def sequence_args(ap: argparse.ArgumentParser, loads: str) -> None:
    """The arguments both peak-table benchmarks take to cut `bench_placement.py`'s sequences."""
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--source", default="bitbrains")
    ap.add_argument("--loads", default=loads)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=30)


def splits(args: argparse.Namespace, seed: int, mode: str) -> Iterator[tuple[int, JobBatch, JobBatch]]:
    """(load, training, test) batches per load of `bench_placement.py`'s sequences (the same step, sizes and seed)."""
    seq_cfg = SequenceConfig(
        loads_pct=tuple(int(x) for x in args.loads.split(",")),
        step_bins=6,
        n_train_sequences=args.n_train,
        n_test_sequences=args.n_test,
        seed=seed,
        request_mode=mode,
    )
    jobs = real_sequences(Path(args.warehouse), args.source, seq_cfg)
    for (load,), cell in jobs.group_by("load_pct", maintain_order=True):
        train, test = (JobBatch.from_frame(cell.filter(pl.col("split") == s)) for s in ("train", "test"))
        yield int(load), train, test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sequence_args(ap, loads="80")
    ap.add_argument("--modes", default="peak,trace")
    args = ap.parse_args()
    cfg = SimConfig(n_machines=10, max_steps=1000, oversize="clip")
    frames = []
    for mode in args.modes.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            t0 = time.perf_counter()
            for load, train, test in splits(args, seed, mode):
                rows = key_rows(train, test, cfg)
                frames.append(pl.DataFrame(rows).with_columns(mode=pl.lit(mode), load_pct=load, seed=seed))
            print(f"{mode} requests, seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    table = pl.concat(frames)
    wide = (
        table.filter(pl.col("level") >= 0.9)
        .pivot(
            on="at_peak_key",
            index=["mode", "load_pct", "seed", "resource", "level"],
            values=["slack_units", "exceeded"],
        )
        .sort("mode", "load_pct", "seed", "resource", "level")
    )
    with pl.Config(tbl_rows=200, tbl_cols=12, tbl_width_chars=200, float_precision=4):
        print(wide)


if __name__ == "__main__":
    main()
