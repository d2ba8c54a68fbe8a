"""How much does the EC labeller gain from unquantised usage? `SimViewLabeller` on the quantised view (the integer
units the simulator steps on) against the exact view (the unquantised step means, `cpu_units_exact` /
`mem_units_exact`), beside the best constant label, by job age, on the TEST sequences of each real source.

Sequences: rebuilt from a warehouse's core tables (`core__long_running`, `core__usage`, `ec__assignments`) by the
project's builder with the sample profile's settings (30-minute steps, 10 training and 5 test sequences per load,
loads 30/50/80 %), as `benchmarks/bench_placement.py:real_sequences` does; the rebuilt quantised columns are compared
with the warehouse's `sim__job_sequences` (when it has the source) and the match is printed. Both labellers are fitted
on the source's training sequences with the same config and seed; accuracy pools the three loads. Nothing is written
into the warehouse; the rebuilt sequences are cached as Parquet under `--out`.

    PYTHONPATH=. python benchmarks/bench_sim_labeller.py --warehouse /work/clone3/warehouse [--sources bitbrains,google2011_derived]
        [--out /tmp/tvw_sim_labeller]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import polars as pl

from benchmarks.bench_placement import real_sequences
from models.sim_labeller import SimLabellerConfig, fit_sim_labeller
from pipelines.job_sequences import SequenceConfig
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.labelling import label_accuracy_by_age, most_frequent_label

AGES = (0, 1, 2, 4, 8, 16)
VIEWS = ("units", "exact")
QUANTISED = ["cpu_units", "mem_units", "cpu_request_units", "mem_request_units", "duration_steps", "ec_label"]


def sequences_of(warehouse: Path, source: str, cfg: SequenceConfig, out: Path) -> pl.DataFrame:
    """The source's sequences with the unquantised columns, cached under `out`."""
    path = out / f"{source}.parquet"
    if path.exists():
        return pl.read_parquet(path)
    frame = real_sequences(warehouse, source, cfg)
    frame.write_parquet(path)
    return frame


def matches_warehouse(warehouse: Path, source: str, frame: pl.DataFrame) -> str:
    """Whether the rebuilt quantised columns equal the warehouse's `sim__job_sequences` rows of `source`."""
    path = warehouse / "tables" / "sim__job_sequences" / "all.parquet"
    if not path.exists():
        return "no warehouse sim__job_sequences to compare"
    key = ["source", "load_pct", "split", "sequence_id", "job_index", "workload_id"]
    old = pl.read_parquet(path).filter(pl.col("source") == source).select(*key, *QUANTISED).sort(key)
    new = frame.select(*key, *QUANTISED).sort(key)
    return "identical" if old.equals(new) else f"DIFFERENT ({old.height} vs {new.height} rows)"


def accuracy_table(frame: pl.DataFrame, labeller_cfg: SimLabellerConfig) -> pl.DataFrame:
    """Per age, the test jobs' accuracy of each view's labeller and of the best constant label (pooled loads)."""
    train, test = frame.filter(pl.col("split") == "train"), frame.filter(pl.col("split") == "test")
    top = int(frame["ec_label"].max() or 0)
    cfg = SimConfig(n_labels=max(16, top + 1), oversize="clip")
    train_jobs = JobBatch.from_frame(train)
    constant = most_frequent_label(train["ec_label"].to_numpy())
    test_jobs = [JobBatch.from_frame(g) for _, g in test.group_by("load_pct", maintain_order=True)]
    rows = []
    for view in VIEWS:
        t0 = time.perf_counter()
        labeller = fit_sim_labeller(cfg, train_jobs, dataclasses.replace(labeller_cfg, usage_view=view))
        for jobs in test_jobs:
            acc = label_accuracy_by_age(labeller, cfg, jobs, AGES, constant_label=constant)
            rows.append(acc.with_columns(view=pl.lit(view)))
        print(f"  {view}: fitted and scored in {time.perf_counter() - t0:.1f} s", flush=True)
    acc = pl.concat(rows)
    by = acc.group_by("view", "age_steps").agg(
        pl.sum("n_jobs"), pl.sum("n_correct"), pl.sum("n_constant_correct")
    )
    wide = by.pivot(on="view", index="age_steps", values="n_correct").join(
        by.filter(pl.col("view") == "units").select("age_steps", "n_jobs", "n_constant_correct"),
        on="age_steps",
    )
    return wide.select(
        "age_steps",
        "n_jobs",
        (pl.col("units") / pl.col("n_jobs")).alias("acc_quantised"),
        (pl.col("exact") / pl.col("n_jobs")).alias("acc_exact"),
        (pl.col("n_constant_correct") / pl.col("n_jobs")).alias("acc_best_constant"),
    ).sort("age_steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--sources", default="bitbrains,google2011_derived")
    ap.add_argument("--loads", default="30,50,80")
    ap.add_argument("--n-train", type=int, default=10, help="training sequences per load (the sample's 10)")
    ap.add_argument("--n-test", type=int, default=5, help="test sequences per load (the sample's 5)")
    ap.add_argument("--step-bins", type=int, default=6, help="5-minute bins per step (the sample's 6)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sequences (the sample's 0)")
    ap.add_argument("--labeller-seeds", default="0", help="seeds of the labellers' sampled ages, e.g. 0,1,2")
    ap.add_argument("--out", default="/tmp/tvw_sim_labeller")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seq_cfg = SequenceConfig(
        loads_pct=tuple(int(x) for x in args.loads.split(",")),
        step_bins=args.step_bins,
        n_train_sequences=args.n_train,
        n_test_sequences=args.n_test,
        seed=args.seed,
    )
    seeds = [int(x) for x in args.labeller_seeds.split(",")]
    pl.Config.set_tbl_rows(50)
    pl.Config.set_tbl_cols(-1)
    pl.Config.set_tbl_width_chars(200)
    pl.Config.set_float_precision(3)
    for source in args.sources.split(","):
        t0 = time.perf_counter()
        frame = sequences_of(Path(args.warehouse), source, seq_cfg, out)
        print(
            f"{source}: {frame.height} jobs ({time.perf_counter() - t0:.1f} s); quantised columns vs the "
            f"warehouse's sim__job_sequences: {matches_warehouse(Path(args.warehouse), source, frame)}",
            flush=True,
        )
        tables = [
            accuracy_table(frame, SimLabellerConfig(seed=s)).with_columns(labeller_seed=pl.lit(s))
            for s in seeds
        ]
        table = pl.concat(tables)
        table.write_parquet(out / f"{source}_accuracy.parquet")
        acc = ["acc_quantised", "acc_exact"]
        summary = table.group_by("age_steps", "n_jobs", "acc_best_constant").agg(
            *[pl.mean(c) for c in acc],
            *[pl.min(c).alias(f"{c}_min") for c in acc],
            *[pl.max(c).alias(f"{c}_max") for c in acc],
        )
        print(f"{source}: mean over labeller seeds {seeds} (min, max beside)", flush=True)
        print(summary.sort("age_steps"), flush=True)


if __name__ == "__main__":
    main()
