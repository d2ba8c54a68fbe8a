"""Learned schedulers as assets: TVW-RL training runs (one partition per load x training seed), the evaluation of
every registered policy, learned ones included (trained files from `assets.learned.policy_path`), and TVW-RL's
ablations (`models.ablation`)."""

import dataclasses
from pathlib import Path

import polars as pl
from dagster import AssetExecutionContext, MetadataValue, Output, StaticPartitionsDefinition, asset

from assets import checks
from assets.cluster import EVAL_PARTITIONS
from assets.ec import choice_memo, labellers
from assets.learned import (
    RESULTS_DEPS,
    RESULTS_TABLE,
    RL_TRAINING,
    curve_metadata,
    policy_maker,
    train_partition,
)
from assets.plots import curve_plot, plot_learning_curves, summary_plot_metadata
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models import ablation, forecast_placer, tvw_rl
from models.forecast_placer import PLACER_CURVE, PlacerTrainConfig, placer_sim_config
from models.learned import GAP_CHECK_DOCS, ResultsConfig, evaluate_learned, gap_check
from models.training import CURVE_CHECK_DOCS, curve_check_values
from models.tvw_rl import LEARNING_CURVE, TvwRlPolicy, TvwRlTrainConfig
from pipelines.synthetic import is_synthetic
from sim.evaluate import (
    EVAL_CHECK_DOCS,
    SUMMARY_CHECK_DOCS,
    eval_check_values,
    gap_table,
    summarise,
    summary_check_values,
)
from sim.jobs import JobBatch
from sim.observation import ObservationConfig

TVW_RL_TRAIN = dataclass_config(TvwRlTrainConfig)
PLACER_TRAIN = dataclass_config(PlacerTrainConfig)
RESULTS = dataclass_config(ResultsConfig)
ABLATION = dataclass_config(ablation.AblationConfig)
RESULTS_CHECKS = checks.specs("eval__results", EVAL_CHECK_DOCS)
ABLATION_PARTITIONS = StaticPartitionsDefinition(list(ablation.ABLATION_KEYS))
"""One TVW-RL ablation run per (setting, value) of `models.ablation.ABLATIONS`."""


@asset(**RL_TRAINING, check_specs=checks.specs("rl__tvw_rl", CURVE_CHECK_DOCS))
def rl__tvw_rl(
    context: AssetExecutionContext,
    config: TVW_RL_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
):
    """TVW-RL learning curves, one row per (source, load, training seed, iteration): return (mean, spread), each
    penalty as a positive cost, entropy, wall seconds. A partition is one (load, seed) and trains a policy per
    source there (`models.tvw_rl`), resuming from `models/tvw_rl/<source>/<partition>.ckpt/`; the policies
    (`<partition>.pt`, with their JSON sidecar) are published only when complete."""
    settings, labeller_of = config.build(), labellers(warehouse, sim__usage_scale)

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> list[dict]:
        cfg = settings.run_config(seed, is_label_known=is_synthetic(source))
        labeller = None if is_synthetic(source) else labeller_of(source)
        if labeller is None and cfg.obs.labels == "predicted":
            context.log.warning(f"{source}: no saved EC classifier; the agent sees the clustering labels")
            cfg = dataclasses.replace(cfg, obs=ObservationConfig(labels="true"))
        context.log.info(
            f"{source} load {load} % seed {seed}: training {cfg.reinforce.n_iterations} iterations"
        )
        log = lambda m: context.log.info(f"{source}: {m}")  # noqa: E731
        return tvw_rl.train_and_publish(
            JobBatch.from_frame(rows), cfg, labeller, path, (source, load, seed), revision, log
        )

    out, meta = train_partition(
        context, warehouse, sim__job_sequences, settings, TvwRlPolicy.name, fit, LEARNING_CURVE
    )
    yield Output(
        out, metadata=meta | curve_metadata(out, plot_learning_curves(out), "TVW-RL learning curves")
    )
    yield from checks.results(curve_check_values(out))


@asset(**RL_TRAINING, check_specs=checks.specs("rl__forecast_residual", CURVE_CHECK_DOCS))
def rl__forecast_residual(
    context: AssetExecutionContext,
    config: PLACER_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
):
    """Our learned scheduler (`forecast_residual_rl`, `models.forecast_placer`): per source of the partition's
    (load, training seed), forecaster and base rule fitted on the training sequences, then the residual trained
    on them, all with the EC labels the evaluation serves; one row per stage and iteration (validation return,
    imitation of the base rule, entropy, seconds), the policy in `models/forecast_residual_rl/<source>/`."""
    settings, labeller_of = config.build(), labellers(warehouse, sim__usage_scale)
    cfg, memo = placer_sim_config(settings, sim__job_sequences), choice_memo(warehouse)

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> pl.DataFrame:
        log = lambda m: context.log.info(f"forecast_residual_rl {source}: {m}")  # noqa: E731
        jobs, run, served = JobBatch.from_frame(rows), (source, load, seed), labeller_of(source)
        return forecast_placer.train_and_publish(settings, cfg, jobs, path, run, revision, log, served, memo)

    name = forecast_placer.ForecastResidualPolicy.name
    out, meta = train_partition(
        context, warehouse, sim__job_sequences, settings, name, fit, PLACER_CURVE, name
    )
    panels = [("validation_return", "validation return"), ("imitation_accuracy", "base rule imitation")]
    plot = curve_plot(out, panels, "forecast_residual_rl: base rule (0), then BC and PG")
    yield Output(out, metadata=meta | curve_metadata(out, plot, "forecast_residual_rl stages", trend=False))
    yield from checks.results(curve_check_values(out))


@asset(**RESULTS_TABLE, partitions_def=EVAL_PARTITIONS, deps=RESULTS_DEPS, check_specs=RESULTS_CHECKS)
def eval__results(
    context: AssetExecutionContext,
    config: RESULTS,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
    eval__baselines: pl.DataFrame,
):
    """Every registered policy, learned ones included, with every simulator metric, one row per (source, load,
    policy, test sequence, seed), one partition per load (as `eval__baselines`): the heuristics' rows from
    `eval__baselines`, a learned policy's with the file trained at that (source, load) and training seed (one
    without such a file is left out, listed in metadata)."""
    missing, labeller_of = [], labellers(warehouse, sim__usage_scale)
    make = policy_maker(warehouse, missing, labeller_of)
    args = (sim__job_sequences, context.partition_key, eval__baselines, config.build(), make, labeller_of)
    results = evaluate_learned(*args, log=context.log.info)
    if missing:
        context.log.warning(f"{len(missing)} learned policy runs have no checkpoint: {missing[:10]}")
    yield Output(results, metadata={"n_rows": results.height, "left_out": MetadataValue.json(missing)})
    yield from checks.results(eval_check_values(results, results.height))


@asset(**RESULTS_TABLE, check_specs=checks.specs("eval__results_summary", SUMMARY_CHECK_DOCS))
def eval__results_summary(eval__results: pl.DataFrame):
    """Mean and 95 % interval of every metric of `eval__results` per (source, load, policy) over test sequences
    (seeds averaged within a sequence first); the UI shows the Fig. 4/5-style plot."""
    summary = summarise(eval__results)
    yield Output(summary, metadata=summary_plot_metadata(summary))
    yield from checks.results(summary_check_values(summary))


@asset(**RESULTS_TABLE, check_specs=checks.specs("eval__gap", GAP_CHECK_DOCS))
def eval__gap(context: AssetExecutionContext, eval__results: pl.DataFrame):
    """Per (source, load, policy): the mean return against the best NON-ORACLE heuristic of the cell, the paired
    difference by test sequence (95 % interval, wins), the best oracle's return, the share of the heuristic-to-
    oracle gap closed, overshoot and machines used beside Tetris's (`sim.evaluate.gap_table`)."""
    gaps = gap_table(eval__results)
    passed, check, counts = gap_check(eval__results, gaps)
    context.log.info(
        f"eval__gap: {counts['n_cells']} cells; forecast-driven or learned policies significantly above the best "
        f"heuristic in {counts['n_cells_won']} of them"
    )
    meta = {"n_rows": gaps.height} | {k: counts[k] for k in ("n_cells", "n_significant_wins")}
    yield Output(gaps, metadata=meta)
    yield from checks.results({"has_a_best_heuristic_per_cell": (passed, check)})


def relabel_by_method(jobs: pl.DataFrame, value: str, warehouse: Warehouse, source: str, log=print):
    """`models.ablation.relabel_jobs` with `value`'s mapping of `source` from `ec__method_assignments` (one
    mapping per clustering method, at the k its choice rule picks); a clear error where there is no table."""

    def labels_of(method: str) -> pl.DataFrame:
        if not warehouse.has_table("ec__method_assignments"):
            raise ValueError(
                f"ec_mapping={method}: no ec__method_assignments table under {warehouse.root}; materialise the EC "
                f"layer for {source} first"
            )
        rows = warehouse.scan("ec__method_assignments").filter(
            (pl.col("source") == source) & (pl.col("method") == method)
        )
        return rows.select("workload_id", "k", "ec_label").collect()

    return ablation.relabel_jobs(jobs, value, labels_of, source, log)


@asset(
    partitions_def=ABLATION_PARTITIONS,
    group_name="ablation",
    io_manager_key="table_io",
    kinds={"parquet", "torch"},
    check_specs=checks.specs("rl__ablation"),
)
def rl__ablation(
    context: AssetExecutionContext, config: ABLATION, warehouse: Warehouse, sim__job_sequences: pl.DataFrame
):
    """One TVW-RL ablation run (Tables 2-3, `models.ablation`): the policy trained with one setting changed, on
    `source` at `load_pct`, tested greedily at background noise 0..3 units with the unablated penalty weights;
    one row per (noise level, test sequence)."""
    settings, key = config.build(), context.partition_key
    group = sim__job_sequences.filter(
        (pl.col("source") == settings.source) & (pl.col("load_pct") == settings.load_pct)
    )
    setting, value = ablation.parse_ablation(key)
    if setting == "ec_mapping":
        group = relabel_by_method(group, value, warehouse, settings.source, context.log.info)
    path = Path(warehouse.root) / "models" / "tvw_rl_ablation" / settings.source / f"{key}.pt"
    out, curve = ablation.run_ablation(group, key, settings, path, log=context.log.info)
    trend = MetadataValue.json(ablation.curve_trend(curve).to_dicts())
    yield Output(out, metadata={"first_vs_last_return": trend, "checkpoint": str(path)})
    yield from checks.table_results("rl__ablation", out)


ABLATION_TABLE = {"group_name": "ablation", "io_manager_key": "table_io", "kinds": {"parquet", "polars"}}


@asset(**ABLATION_TABLE, check_specs=checks.specs("eval__ablations"))
def eval__ablations(rl__ablation: pl.DataFrame):
    """TVW-RL Tables 2-3: per (ablation, value, test noise) the mean over test sequences of utilisation,
    fragmentation, overshoot %, machines used, jobs never placed and the episode return."""
    table = ablation.ablation_table(rl__ablation)
    yield Output(table)
    yield from checks.table_results("eval__ablations", table)


@asset(**ABLATION_TABLE, check_specs=checks.specs("eval__ablation_winners"))
def eval__ablation_winners(rl__ablation: pl.DataFrame, eval__baselines: pl.DataFrame):
    """Each ablation run against the heuristics at test noise 0 on the same test sequences: the best policy by
    mean return and the TVW-RL variant's rank (`models.ablation.ablation_winners`)."""
    table = ablation.ablation_winners(rl__ablation, eval__baselines)
    yield Output(table)
    yield from checks.table_results("eval__ablation_winners", table)


RL_ASSETS = [rl__tvw_rl, rl__forecast_residual, eval__results, eval__results_summary, eval__gap]
RL_ASSETS += [rl__ablation, eval__ablations, eval__ablation_winners]
