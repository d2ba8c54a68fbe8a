"""TVW-RL's training rollout on a real source with its EC labeller (issue 22, item 8): decisions/s of the rollout
that `rl__tvw_rl` and `benchmarks/run_tvw_rl_paper.py` train with (the paper's 20 sequences x 20 trajectories,
observations, the source's saved EC classifier, the paper's network), with the labeller reading its per-batch label
table (`ClassifierLabeller.label_table`: one prediction per job and age) against predicting every shown job at every
decision (what it did before), and the same rollout with the true labels (no labeller). The variants alternate in
one process (the machine is shared: compare within a run) and must give identical episodes.

    PYTHONPATH=. python benchmarks/bench_labelled_rollout.py --warehouse warehouse [--source bitbrains] [--load 50]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.bench_placement import real_sequences
from benchmarks.run_tvw_rl_paper import labeller
from models.ec_labeller import ClassifierLabeller
from models.forecaster import torch_threads
from models.tvw_rl import TvwRlConfig, build_net, make_act
from pipelines.job_sequences import SequenceConfig
from sim.core import observed_labels
from sim.jobs import JobBatch
from sim.labelling import labelled_jobs, observed_steps
from sim.rollout import rollout


class PerDecisionLabeller(ClassifierLabeller):
    """The labeller as it was: every shown job predicted again at every decision."""

    def labels(self, cfg, state):
        out = observed_labels(state).astype(np.int64, copy=True)
        bi, ji = np.nonzero(labelled_jobs(cfg, state))
        if bi.size:
            out[bi, ji] = self.predict_jobs(cfg, state.jobs, bi, ji, observed_steps(state)[bi, ji])
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--source", default="bitbrains")
    ap.add_argument("--load", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    warehouse = Path(args.warehouse)
    frame = real_sequences(
        warehouse,
        args.source,
        SequenceConfig(loads_pct=(args.load,), step_bins=6, n_train_sequences=40, n_test_sequences=2),
    )
    train = JobBatch.from_frame(frame.filter(pl.col("split") == "train"))
    table_lab = labeller(warehouse, args.source, frame)
    if table_lab is None:
        raise SystemExit(f"no EC classifier for {args.source} under {warehouse}: run tvw-run first")
    paper = TvwRlConfig.paper(0)
    cfg = dataclasses.replace(paper, sim=dataclasses.replace(paper.sim, n_labels=16))
    true_obs = dataclasses.replace(cfg.obs, labels="true")
    net = build_net(cfg)
    r = cfg.reinforce
    variants = {"label table": (cfg.obs, table_lab)}
    if isinstance(table_lab, ClassifierLabeller):  # the served labeller may be the simulator-view one instead
        variants["per decision"] = (
            cfg.obs,
            PerDecisionLabeller(
                table_lab.classifier,
                table_lab.prefix_bins_per_step,
                table_lab.usage_scale,
                table_lab.n_threads,
            ),
        )
    variants["true labels"] = (true_obs, None)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    label_s: dict[str, list[float]] = {name: [] for name in variants}
    print(
        f"{args.source} {args.load} %: {r.n_sequences} sequences x {r.n_trajectories} trajectories, "
        f"{cfg.sim.jobs_per_episode} jobs per episode, M = {cfg.sim.n_machines}; labeller "
        f"{type(table_lab).__name__}"
    )
    with torch_threads(1):
        for rep in range(args.repeats):
            rows = np.random.default_rng([0, rep]).integers(0, train.batch_size, size=r.n_sequences)
            returns = {}
            for name, (obs, lab) in variants.items():
                timings: dict[str, float] = {}
                t0 = time.perf_counter()
                batch = rollout(
                    cfg.sim,
                    obs,
                    train.select(rows),
                    r.n_trajectories,
                    make_act(net),
                    rep,
                    lab,
                    timings=timings,
                )
                wall = time.perf_counter() - t0
                rates[name].append(float(batch.alive.sum()) / wall)
                label_s[name].append(timings.get("label", 0.0))
                returns[name] = batch.episode_returns
            if "per decision" in returns and not np.array_equal(
                returns["label table"], returns["per decision"]
            ):
                raise SystemExit(f"repeat {rep}: the label table changed the episodes")
    for name in variants:
        print(
            f"  {name:>13}: {np.median(rates[name]):9,.0f} decisions/s (median of {args.repeats}; "
            f"{min(rates[name]):,.0f}-{max(rates[name]):,.0f}), labelling {np.median(label_s[name]):.3f} s per rollout"
        )
    if "per decision" in rates:
        ratio = np.median(np.array(rates["label table"]) / np.array(rates["per decision"]))
        print(
            f"  label table / per decision: {ratio:.2f}x, identical episodes in {args.repeats} of {args.repeats}"
        )


if __name__ == "__main__":
    main()
