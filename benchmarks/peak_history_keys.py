"""Is there more in a running job's own history than the remaining-peak table's keys already use? With the window's
peak as the request (TVW-RL's setting) a job whose peak so far is below its request is certain to reach it, so
the only cases where a flat remaining-peak bound may sit below the request are those of jobs that have reached it.
For those cases of the test sequences' jobs this prints, per (seed, load) and level, the slack (mean units the
bound sits below the request: what a rule may pack beyond requests) and the exceeded share of bounds fitted on
the training sequences' cases with the table's keys (resource, request, peak so far, at its peak now, age bucket,
remaining-life bucket) and with two more keys from the job's own history: how often it has sat at its peak so far
(the share of its observed steps, buckets 0 / 5 / 15 / 40 %) and how many steps ago it last did (0 / 1 / 3 / 8 /
24 or more). A cell below 30 training cases backs off to the table's keys, then to the request. It also prints
the slack the true remaining peak would give (the ceiling of any flat bound). Empirical quantiles per cell, as
`sim.peak_forecast.fit_peak_quantiles` fits them, without EC labels; test sequences are read for scoring only.

    python benchmarks/peak_history_keys.py --warehouse warehouse [--source bitbrains] [--loads 50,80]
        [--seeds 0,1,2] [--request-mode peak|trace]
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from benchmarks.at_peak_key import sequence_args, splits
from sim.jobs import JobBatch
from sim.peak_forecast import AGE_GRID, peak_cases, remaining_bucket

TABLE_KEYS = ["d", "req", "peak", "at_peak", "age_b", "rem_b"]
"""The keys `forecast_peak`'s table uses (labels aside), with durations known."""
HISTORY_KEYS = {
    "+ share at peak": ["share_b"],
    "+ steps since": ["since_b"],
    "+ both": ["share_b", "since_b"],
}
SHARE_EDGES = np.array([0.0, 0.05, 0.15, 0.4])
SINCE_EDGES = np.array([0, 1, 3, 8, 24])
MIN_CASES = 30


def history_cases(jobs: JobBatch) -> pl.DataFrame:
    """The remaining-peak table's training cases (`peak_cases`) past age 0, with the two history keys: per case,
    from the usage observed before its age."""
    cases = peak_cases(jobs)
    is_real = jobs.is_real
    b_idx, j_idx = np.nonzero(is_real & (jobs.duration > 0))  # peak_cases' jobs, in its order
    u = jobs.usage[b_idx, j_idx].astype(np.int64)  # (N, T, D)
    prefix = np.maximum.accumulate(u, axis=1)
    n_at = np.ones_like(u)  # steps so far at the current peak so far
    since = np.zeros_like(u)  # steps since the last one at it
    for a in range(1, u.shape[1]):
        up, eq = u[:, a] > prefix[:, a - 1], u[:, a] == prefix[:, a - 1]
        n_at[:, a] = np.where(up, 1, np.where(eq, n_at[:, a - 1] + 1, n_at[:, a - 1]))
        since[:, a] = np.where(up | eq, 0, since[:, a - 1] + 1)
    dur = jobs.duration[b_idx, j_idx]
    share, steps_since = [], []  # in peak_cases' order: by age, then resource
    for a in AGE_GRID:
        rows = np.flatnonzero(dur > a)
        if rows.size == 0:
            break
        for d in range(u.shape[2]):
            share.append(n_at[rows, max(a - 1, 0), d] / max(a, 1))
            steps_since.append(since[rows, max(a - 1, 0), d])
    return pl.DataFrame(
        {
            "d": cases["resource"],
            "req": cases["request"],
            "peak": cases["peak_idx"] - 1,
            "at_peak": cases["at_peak"],
            "age_b": cases["bucket"],
            "rem_b": remaining_bucket(cases["remaining"]),
            "share_b": np.searchsorted(SHARE_EDGES, np.concatenate(share), side="right") - 1,
            "since_b": np.searchsorted(SINCE_EDGES, np.concatenate(steps_since), side="right") - 1,
            "target": cases["target"],
        }
    ).filter(pl.col("peak") >= 0)  # age 0: nothing observed


def quantiles(train: pl.DataFrame, keys: list[str], level: float, name: str) -> pl.DataFrame:
    return (
        train.group_by(keys)
        .agg(pl.col("target").quantile(level, "higher").alias(name), pl.len().alias(f"n_{name}"))
        .filter(pl.col(f"n_{name}") >= MIN_CASES)
    )


def score(
    train: pl.DataFrame, test: pl.DataFrame, extra: list[str], level: float, reached_only: bool
) -> tuple[float, float]:
    """(slack, exceeded share) of the bound on the test cases (those that have reached their request only, with
    `reached_only`)."""
    scored = test.join(quantiles(train, TABLE_KEYS, level, "q_table"), on=TABLE_KEYS, how="left")
    if extra:
        scored = scored.join(
            quantiles(train, TABLE_KEYS + extra, level, "q"), on=TABLE_KEYS + extra, how="left"
        )
    bound = pl.coalesce(*(["q"] if extra else []), "q_table", pl.max_horizontal("req", "peak"))
    scored = scored.with_columns(bound=bound)
    if reached_only:
        scored = scored.filter(pl.col("peak") >= pl.col("req"))
    slack = scored.select((pl.col("req") - pl.col("bound")).clip(0).mean()).item()
    exceeded = scored.select((pl.col("target") > pl.col("bound")).mean()).item()
    return float(slack), float(exceeded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sequence_args(ap, loads="50,80")
    ap.add_argument(
        "--request-mode",
        default="peak",
        choices=("peak", "trace"),
        help="with the trace's own requests every observed case is scored (a job may never reach its request)",
    )
    args = ap.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for load, train_jobs, test_jobs in splits(args, seed, args.request_mode):
            train, test = history_cases(train_jobs), history_cases(test_jobs)
            if train.is_empty() or test.is_empty():
                raise SystemExit(f"{args.source} {load} % seed {seed}: no cases in a split")
            reached_only = args.request_mode == "peak"
            reached = test.filter(pl.col("peak") >= pl.col("req")) if reached_only else test
            truth = reached.select((pl.col("req") - pl.col("target")).clip(0).mean()).item()
            for level in (0.95, 0.99):
                row = {"seed": seed, "load_pct": load, "level": level, "n_reached": reached.height}
                for name, extra in {"table": [], **HISTORY_KEYS}.items():
                    row[f"slack {name}"], row[f"exceeded {name}"] = score(
                        train, test, extra, level, reached_only
                    )
                row["slack of the truth"] = truth
                rows.append(row)
            what = "test cases at their request" if reached_only else "test cases"
            print(f"seed {seed}, {load} %: {reached.height:,} {what}", flush=True)
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=250, float_precision=4):
        print(pl.DataFrame(rows))


if __name__ == "__main__":
    main()
