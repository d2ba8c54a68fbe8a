"""Does packing beyond requests pay? Every heuristic, the hybrid, Google's peak predictors, the forecast-driven
rules and the oracles on fresh job sequences at the issue's scale, with the gap table against the best heuristic.

Sequences: the real sources' long-running workloads from a warehouse that a `tvw-run` (layers raw .. cluster)
filled, cut into `--n-train` training and `--n-test` test sequences per load by the project's own builder
(`pipelines.job_sequences`, train and test from disjoint workloads), plus DeepPlace's synthetic workload. Every
rule is fitted per (source, load) on the TRAINING sequences only (validation carved from them, `sim.tuning`);
the learned forecaster (`models.usage_forecast`, the "sample" preset) is fitted on the same training part.

Prints, per cell: the best non-oracle heuristic, each rule's paired difference in return against it with the 95 %
interval, the share of the heuristic-to-oracle gap it closes, overshoot and machines used beside Tetris's, the
fitting and evaluation seconds; and writes the gap table and the raw results as Parquet under `--out`, with what
validation chose for every fitted rule and every setting it tried (`choices.json`).

    python benchmarks/bench_placement.py --warehouse warehouse [--sources bitbrains,deepplace_synthetic]
        [--loads 30,50,80] [--n-train 100] [--n-test 30] [--labels served|clustering] [--out /tmp/placement]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import polars as pl

from models.ec_labeller import classifier_labellers
from models.sim_labeller import SimLabellerConfig, fit_source_labeller
from pipelines.job_sequences import SequenceConfig, build_job_sequences
from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim.config import SimConfig
from sim.evaluate import evaluate_policies, gap_table
from sim.tuning import CHOICE_DETAILS, TUNING_PRESETS, TuningConfig

HEURISTICS = ["tetris", "best_fit", "first_fit", "kube_default", "deeprm_sjf", "deeprm_packer", "noop"]
RULES = [
    "hybrid_observed",
    "hybrid_observed_nodur",
    "n_sigma_observed",
    "max_pct_n_sigma_observed",
    "forecast_risk",
    "forecast_risk_nodur",
    "forecast_recall_hybrid",
    "forecast_recall_hybrid_nodur",
    "forecast_risk_recall",
    "forecast_peak",
    "forecast_peak_adaptive",
    "forecast_peak_nodur",
    "forecast_peak_noec",
    "forecast_machine_peak",
    "forecast_machine_peak_noec",
    "forecast_risk_truth",
    "forecast_risk_truth_running",
    "forecast_risk_truth_arriving",
    "forecast_peak_truth_running",
    "forecast_peak_truth_arriving",
    "foresight_peak_aware",
]


def real_sequences(warehouse: Path, source: str, cfg: SequenceConfig) -> pl.DataFrame:
    """`sim__job_sequences` rows of one real source from the warehouse's core tables and EC labels."""
    tables = warehouse / "tables"
    lr = pl.read_parquet(tables / "core__long_running" / f"{source}.parquet")
    usage = (
        pl.scan_parquet(str(tables / "core__usage" / source / "*.parquet"))
        .join(lr.select("source", "workload_id").lazy(), on=["source", "workload_id"], how="semi")
        .collect()
    )
    ec_path = tables / "ec__assignments" / f"{source}.parquet"
    assignments = pl.read_parquet(ec_path) if ec_path.exists() else None
    frame, _ = build_job_sequences(usage, lr, assignments, cfg, log=lambda msg: None)
    return frame


def warehouse_labellers(warehouse: Path, sequences: pl.DataFrame, kind: str = "served"):
    """source -> the EC labeller of a warehouse a `tvw-run` filled, as the pipeline serves it for `sequences`
    (this benchmark's own), or None for a source without one. kind="served" (the pipeline's default): a
    simulator-view labeller fitted on the training rows of `sequences` (`models.sim_labeller.fit_source_labeller`),
    else the classifier below; kind="classifier": the saved classifier's model trained without the workload groups
    of their test sequences (`models.ec_serving`, saved in a temporary folder; columns source, split and
    workload_id suffice), with the warehouse's usage scale (`models.ec_labeller.classifier_labellers`)."""
    # imported here: they need duckdb, which cutting sequences does not (the GPU machine has none)
    from models.ec_serving import serving_classifiers, serving_path
    from pipelines.warehouse import ParquetWarehouse

    scale_path = warehouse / "tables" / "sim__usage_scale" / "all.parquet"
    scale = pl.read_parquet(scale_path) if scale_path.exists() else pl.DataFrame(schema={"source": pl.String})
    out = Path(tempfile.mkdtemp(prefix="tvw_serving_"))
    saved = lambda source: warehouse / "models" / f"ec_classifier__{source}.pt"  # noqa: E731
    serving_classifiers(ParquetWarehouse(warehouse), sequences, saved, log=print, out_dir=out)
    classifier = classifier_labellers(lambda source: serving_path(out / saved(source).name), scale)
    if kind == "classifier":
        return classifier

    @functools.cache
    def served(source: str):
        labeller, _, n_train = fit_source_labeller(sequences, source, SimLabellerConfig())
        if labeller is not None:
            print(f"{source}: simulator-view EC labeller on {n_train} training-sequence jobs serves labels")
        return classifier(source) if labeller is None else labeller

    return served


def forecaster_factory(preset: str):
    from models.usage_forecast import FORECAST_PRESETS, fit_usage_forecaster

    def fit(train, sim_cfg):
        return fit_usage_forecaster(sim_cfg, train, FORECAST_PRESETS[preset])

    return fit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--sources", default="bitbrains,google2011_derived,deepplace_synthetic")
    ap.add_argument("--loads", default="30,50,80")
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=30)
    ap.add_argument(
        "--step-bins", type=int, default=6, help="5-minute bins per step (the sample profile's 6)"
    )
    ap.add_argument("--policies", default=",".join(HEURISTICS + RULES))
    ap.add_argument("--forecaster", default="sample", help="models.usage_forecast preset ('' = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tuning", default="full", help=f"sim.tuning preset {sorted(TUNING_PRESETS)}")
    ap.add_argument(
        "--overshoot-budget",
        default=str(TuningConfig.overshoot_budget_pct),
        help="TuningConfig.overshoot_budget_pct: validation overshoot allowed above Tetris's, in points "
        "('none' = choose on return alone)",
    )
    ap.add_argument(
        "--cross-fit",
        action="store_true",
        help="TuningConfig.cross_fit: choose on both folds of the training split (the rule refitted on the "
        "validation part and validated on the fit part too)",
    )
    ap.add_argument(
        "--cross-fit-sequences",
        type=int,
        default=None,
        help="TuningConfig.cross_fit_sequences: at most this many fit-part sequences validate the second fold "
        "(default: all; the validation part's size caps cross-fitting at about twice the plain choice's cost)",
    )
    ap.add_argument(
        "--choice-z",
        type=float,
        default=0.0,
        help="TuningConfig.choice_z: choose each rule's setting by the lower bound mean - z x se of its paired "
        "validation gain over the fallback (0: the best mean return)",
    )
    ap.add_argument(
        "--peak-calibrated",
        action="store_true",
        help="TuningConfig.peak_calibrated: forecast_peak also tries each level's bound calibrated for co-peaking "
        "(the quantile of the machine's sum, fit_rho) beside the sum of quantiles",
    )
    ap.add_argument(
        "--no-at-peak-key",
        action="store_true",
        help="TuningConfig.peak_at_peak_key off: the peak rules' remaining-peak table without the at-peak key (the "
        "table before 2026-12-03, for comparison)",
    )
    ap.add_argument(
        "--request-mode",
        default="peak",
        choices=["peak", "trace"],
        help="real sources' requests: the window's peak usage (TVW-RL's setting) or the trace's own request",
    )
    ap.add_argument(
        "--labels",
        default="served",
        choices=("served", "classifier", "clustering"),
        help="EC labels the policies see on a real source: the simulator-view labeller fitted on the training "
        "sequences (as the pipeline serves them by default), the saved classifier's model trained without the "
        "test sequences' workloads, or the clustering labels computed from each workload's whole series",
    )
    ap.add_argument(
        "--fallbacks",
        default=None,
        help="TuningConfig.fallbacks: the request-based heuristics a fitted rule may fall back on, comma-separated "
        "(default: the preset's, every request heuristic; e.g. leave out kube_default, which spreads jobs)",
    )
    ap.add_argument(
        "--machines-budget",
        type=float,
        default=None,
        help="TuningConfig.machines_budget: validation machines allowed above Tetris's (default: none, "
        "machines are not a criterion)",
    )
    ap.add_argument("--out", default="/tmp/tvw_placement")
    args = ap.parse_args()
    loads = tuple(int(x) for x in args.loads.split(","))
    policies = args.policies.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seq_cfg = SequenceConfig(
        loads_pct=loads,
        step_bins=args.step_bins,
        n_train_sequences=args.n_train,
        n_test_sequences=args.n_test,
        seed=args.seed,
        request_mode=args.request_mode,
    )
    factory = forecaster_factory(args.forecaster) if args.forecaster else None
    frames = []
    all_choices: dict[
        str, dict
    ] = {}  # "source load%" -> what validation chose per fitted rule, "tried" included
    for source in args.sources.split(","):
        t0 = time.perf_counter()
        if source == "deepplace_synthetic":
            dp = replace(
                DeepPlaceConfig(),
                n_train_sequences=args.n_train,
                n_test_sequences=args.n_test,
                loads_pct=loads,
                seed=args.seed,
            )
            jobs, _ = build_deepplace_sequences(dp)
            serve = None  # the generator's classes, known at arrival
        else:
            jobs = real_sequences(Path(args.warehouse), source, seq_cfg)
            serve = None
            if args.labels != "clustering":
                serve = warehouse_labellers(Path(args.warehouse), jobs, args.labels)
        print(f"{source}: {jobs.height} jobs in sequences ({time.perf_counter() - t0:.1f} s)", flush=True)
        for load in loads:
            cell = jobs.filter(pl.col("load_pct") == load)
            cfg = SimConfig(
                n_machines=10,
                max_steps=1000,
                oversize="clip",
                n_labels=max(16, int(cell["ec_label"].max() or 0) + 1),
            )
            t1 = time.perf_counter()
            choices: dict = {}
            res = evaluate_policies(
                cell,
                policies,
                cfg,
                seeds=[args.seed],
                tuning=replace(
                    TUNING_PRESETS[args.tuning],
                    seed=args.seed,
                    overshoot_budget_pct=None
                    if args.overshoot_budget.lower() == "none"
                    else float(args.overshoot_budget),
                    cross_fit=args.cross_fit,
                    cross_fit_sequences=args.cross_fit_sequences,
                    choice_z=args.choice_z,
                    peak_calibrated=args.peak_calibrated,
                    peak_at_peak_key=not args.no_at_peak_key,
                    machines_budget=args.machines_budget,
                    **({"fallbacks": tuple(args.fallbacks.split(","))} if args.fallbacks else {}),
                ),
                forecaster_factory=factory,
                choices=choices,
                log=lambda msg: print("   ", msg, flush=True) if "left out" in msg else None,
                serve_labels=serve,
            )
            frames.append(res)
            all_choices[f"{source} {load}%"] = choices.get((source, load), {})
            gaps = gap_table(res)
            print(
                f"\n== {source} {load} %: fitted and evaluated in {time.perf_counter() - t1:.0f} s",
                flush=True,
            )
            show = gaps.filter(pl.col("policy").is_in(RULES) | (pl.col("policy") == pl.col("best_heuristic")))
            with pl.Config(tbl_rows=40, tbl_cols=12, tbl_width_chars=200, float_precision=3):
                print(
                    show.select(
                        "policy",
                        "best_heuristic",
                        (pl.col("mean_return") / 1e6).alias("return_1e6"),
                        (pl.col("diff_vs_best_heuristic") / 1e6).alias("diff_1e6"),
                        (pl.col("diff_ci_low") / 1e6).alias("lo_1e6"),
                        (pl.col("diff_ci_high") / 1e6).alias("hi_1e6"),
                        "n_sequences_better",
                        "gap_closed_frac",
                        "avg_overshoot_pct",
                        "tetris_overshoot_pct",
                        "machines_used",
                        "tetris_machines_used",
                    )
                )
            for name, choice in choices.get((source, load), {}).items():
                knobs = {k: v for k, v in choice.items() if k not in CHOICE_DETAILS}
                print(f"   {name}: {knobs}")
    (out / "choices.json").write_text(json.dumps(all_choices, default=str))
    results = pl.concat(frames, how="diagonal_relaxed")
    results.write_parquet(out / "results.parquet")
    gap_table(results).write_parquet(out / "gap_table.parquet")
    print(f"\nwrote {out}/results.parquet, gap_table.parquet and choices.json")


if __name__ == "__main__":
    main()
