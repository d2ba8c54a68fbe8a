"""What the EC label is worth to `forecast_peak`, served as a deployed scheduler would see it (issue 22).

In `eval__baselines` a rule that reads EC labels sees each test job's clustering label (`ec__assignments`), which
was computed from the workload's whole series, its future included. A deployed scheduler has only TVW-RL's
Algorithm 1: the saved EC classifier's guess from the job's meta and the usage observed so far
(`models.ec_labeller.ClassifierLabeller`, `sim.labelling.ServedLabels`). Per (source, load), on sequences cut
from a warehouse a `tvw-run` filled, every rule fitted on the TRAINING sequences only (`quick` grid), 30 test
sequences, paired by sequence (x1e6, 95 % t-intervals):

- `forecast_peak` with the clustering labels, with the classifier's labels at test time only (fitted and
  validated on clustering labels), on one view (the table fitted on the classifier's label at each age,
  validated and served with them: `FitContext.labeller`, as the pipeline evaluates since 2026-11-26 evening),
  and without labels (`forecast_peak_noec`);
- the best request-based heuristic of the cell by test mean, for scale (not the bar's best heuristic, which
  includes the hybrid and Google's predictors: `bench_placement.py` gives that).

    PYTHONPATH=. python benchmarks/bench_ec_labels.py --warehouse warehouse [--request-mode trace] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.bench_placement import real_sequences, warehouse_labellers
from models.forecast_placer import paired_interval
from pipelines.job_sequences import SequenceConfig
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.labelling import Labeller, ServedLabels
from sim.policies import POLICIES, make_policy
from sim.tuning import REQUEST_HEURISTICS, FitContext, sequence_returns, tuning_preset


def labeller(warehouse: Path, source: str, sequences: pl.DataFrame) -> Labeller:
    """The source's EC labeller as the pipeline serves it for `sequences` (fitted on their training jobs, or the
    classifier trained without their test workloads: `bench_placement.warehouse_labellers`)."""
    served = warehouse_labellers(warehouse, sequences)(source)
    if served is None:
        raise SystemExit(f"{warehouse}: no EC classifier or usage scale for {source}; run tvw-run first")
    return served


def show(name: str, a: np.ndarray, b: np.ndarray) -> None:
    mean, lo, hi = paired_interval(a - b)
    print(
        f"    {name:<44} {mean / 1e6:+.3f} [{lo / 1e6:+.3f}, {hi / 1e6:+.3f}] "
        f"(better on {int((a > b).sum())}, worse on {int((a < b).sum())} of {a.size})",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--sources", default="bitbrains,google2011_derived")
    ap.add_argument("--loads", default="30,50,80")
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=30)
    ap.add_argument("--request-mode", default="peak", choices=("peak", "trace"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    warehouse = Path(args.warehouse)
    loads = tuple(int(x) for x in args.loads.split(","))
    seq_cfg = SequenceConfig(
        loads_pct=loads,
        step_bins=6,
        n_train_sequences=args.n_train,
        n_test_sequences=args.n_test,
        seed=args.seed,
        request_mode=args.request_mode,
    )
    for source in args.sources.split(","):
        frame = real_sequences(warehouse, source, seq_cfg)
        served = labeller(warehouse, source, frame)
        for load in loads:
            t0 = time.perf_counter()
            cell = frame.filter(pl.col("load_pct") == load)
            train, test = (JobBatch.from_frame(cell.filter(pl.col("split") == s)) for s in ("train", "test"))
            cfg = SimConfig(
                n_machines=10,
                max_steps=1000,
                oversize="clip",
                n_labels=max(16, int(cell["ec_label"].max()) + 1),
            )
            ctx = FitContext(cfg, train, tuning_preset("quick", 0.3, args.seed), where=f"{source} {load} %")
            with_ec, no_ec = POLICIES["forecast_peak"].fit(ctx), POLICIES["forecast_peak_noec"].fit(ctx)
            clustered = sequence_returns(with_ec, cfg, test, args.seed)
            classified = sequence_returns(ServedLabels(with_ec, served), cfg, test, args.seed)
            one_ctx = FitContext(
                cfg,
                train,
                tuning_preset("quick", 0.3, args.seed),
                where=f"{source} {load} %",
                labeller=served,
            )
            one_view = sequence_returns(
                ServedLabels(POLICIES["forecast_peak"].fit(one_ctx), served), cfg, test, args.seed
            )
            unlabelled = sequence_returns(no_ec, cfg, test, args.seed)
            heuristics = {
                h: sequence_returns(make_policy(h), cfg, test, args.seed) for h in REQUEST_HEURISTICS
            }
            best = max(heuristics, key=lambda h: heuristics[h].mean())
            print(
                f"{source} {load} % ({args.request_mode} requests; {train.batch_size} train, {test.batch_size} test; "
                f"{time.perf_counter() - t0:.0f} s): best request-based heuristic {best} {heuristics[best].mean() / 1e6:.3f}; "
                f"forecast_peak's choice {ctx.choices.get('forecast_peak', {}).get('level')} / "
                f"{ctx.choices.get('forecast_peak', {}).get('mode')} (one view: "
                f"{one_ctx.choices['forecast_peak'].get('level')} / {one_ctx.choices['forecast_peak'].get('mode')})",
                flush=True,
            )
            show("classifier labels - clustering labels", classified, clustered)
            show("one view - classifier labels at test only", one_view, classified)
            show("no labels - one view", unlabelled, one_view)
            show("clustering labels - best request heuristic", clustered, heuristics[best])
            show("classifier labels - best request heuristic", classified, heuristics[best])
            show("one view - best request heuristic", one_view, heuristics[best])
            show("no labels - best request heuristic", unlabelled, heuristics[best])


if __name__ == "__main__":
    main()
