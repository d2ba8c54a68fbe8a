"""Pool `bench_placement.py` replicates (one `results.parquet` per seed: each draws its own workloads, sequences
and fits) into one row per (source, load, policy): the paired difference against each replicate's best non-oracle
heuristic over every test sequence of every replicate, with its 95 % t-interval, how many sequences are better
and worse, in how many replicates the policy is significantly above / below, the share of the heuristic-to-oracle
gap it closes (mean over replicates), and its overshoot and machines beside Tetris's.

    python benchmarks/placement_replicates.py /tmp/tr0/bitbrains/results.parquet /tmp/tr1/bitbrains/... \
        [--policies forecast_peak,forecast_peak_noec] [--out pooled.parquet]
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl
from scipy import stats

from sim.evaluate import gap_table


def pooled(paths: list[str], policies: list[str] | None) -> pl.DataFrame:
    """The pooled table (module docstring); a replicate is one results file."""
    rows = []
    per_rep = []
    for rep, path in enumerate(paths):
        results = pl.read_parquet(path)
        gaps = gap_table(results).with_columns(pl.lit(rep).alias("replicate"))
        seq = results.group_by("source", "load_pct", "policy", "sequence_id").agg(
            pl.col("episode_return").mean()
        )
        best = gaps.select("source", "load_pct", "best_heuristic").unique()
        base = seq.join(
            best, left_on=["source", "load_pct", "policy"], right_on=["source", "load_pct", "best_heuristic"]
        )
        paired = seq.join(
            base.select("source", "load_pct", "sequence_id", pl.col("episode_return").alias("best_return")),
            on=["source", "load_pct", "sequence_id"],
        ).with_columns(
            (pl.col("episode_return") - pl.col("best_return")).alias("diff"), pl.lit(rep).alias("replicate")
        )
        rows.append(paired)
        per_rep.append(gaps)
    diffs = pl.concat(rows)
    gaps = pl.concat(per_rep, how="diagonal_relaxed")
    if policies:
        diffs = diffs.filter(pl.col("policy").is_in(policies))
    out = []
    for (source, load, policy), g in diffs.group_by("source", "load_pct", "policy", maintain_order=True):
        d = g["diff"].to_numpy()
        mean = float(d.mean())
        half = (
            float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else np.nan
        )
        mine = gaps.filter(
            (pl.col("source") == source) & (pl.col("load_pct") == load) & (pl.col("policy") == policy)
        )
        out.append(
            {
                "source": source,
                "load_pct": load,
                "policy": policy,
                "n_replicates": mine.height,
                "best_heuristics": ",".join(sorted(set(mine["best_heuristic"]))),
                "diff": mean,
                "lo": mean - half,
                "hi": mean + half,
                "n_better": int((d > 0).sum()),
                "n_worse": int((d < 0).sum()),
                "n_pairs": int(d.size),
                "replicates_above": int(mine["is_significantly_better"].sum()),
                "replicates_below": int(mine["is_significantly_worse"].sum()),
                "gap_closed": _mean_or_none(mine["gap_closed_frac"]),  # None: the replicates ran no oracle
                "oracle_minus_best": _mean_or_none(mine["oracle_return"] - mine["best_heuristic_return"]),
                "overshoot_pct": float(mine["avg_overshoot_pct"].mean()),
                "tetris_overshoot_pct": float(mine["tetris_overshoot_pct"].mean()),
                "machines": float(mine["machines_used"].mean()),
                "tetris_machines": float(mine["tetris_machines_used"].mean()),
            }
        )
    return pl.DataFrame(out).sort("source", "load_pct", "policy")


def _mean_or_none(values: pl.Series) -> float | None:
    mean = values.mean()
    return None if mean is None else float(mean)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="one bench_placement results.parquet per replicate")
    ap.add_argument("--policies", default="", help="comma-separated policies to show (default: all)")
    ap.add_argument("--out", default="", help="write the pooled table as Parquet here")
    args = ap.parse_args()
    table = pooled(args.results, [p for p in args.policies.split(",") if p] or None)
    if args.out:
        table.write_parquet(args.out)
    for line in report_lines(table):
        print(line)


def report_lines(table: pl.DataFrame) -> list[str]:
    """One line per pooled row, as the README quotes them (x1e6): the paired difference with its interval, the
    sequences better and worse, the replicates above and below, the gap closed and the oracle's lead (means over
    the replicates), overshoot and machines beside Tetris's."""
    lines = []
    for r in table.iter_rows(named=True):
        gap = "-" if r["gap_closed"] is None else f"{r['gap_closed']:.2f}"
        oracle = "-" if r["oracle_minus_best"] is None else f"{r['oracle_minus_best'] / 1e6:+.3f}"
        lines.append(
            f"{r['source']} {r['load_pct']} % {r['policy']} - best ({r['best_heuristics']}): "
            f"{r['diff'] / 1e6:+.3f} [{r['lo'] / 1e6:+.3f}, {r['hi'] / 1e6:+.3f}] x1e6, "
            f"{r['n_better']} / {r['n_worse']} of {r['n_pairs']} better / worse, replicates above / below "
            f"{r['replicates_above']} / {r['replicates_below']} of {r['n_replicates']}, gap closed {gap} (oracle - best {oracle}), "
            f"overshoot {r['overshoot_pct']:.3f} % (Tetris {r['tetris_overshoot_pct']:.3f} %), machines "
            f"{r['machines']:.2f} (Tetris {r['tetris_machines']:.2f})"
        )
    return lines


if __name__ == "__main__":
    main()
