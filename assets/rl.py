"""Learned schedulers as assets: TVW-RL training runs (one partition per load x training seed), the evaluation of
every registered policy, learned ones included (trained files from `assets.learned.policy_path`), and TVW-RL's
ablations (`models.ablation`)."""

import dataclasses
import functools
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
)

from assets.cluster import EVAL_CHECKS_FOR, eval_checks
from assets.ec import classifier_path
from assets.learned import RL_PARTITIONS, curve_metadata, policy_maker, train_partition
from assets.plots import plot_learning_curves, summary_plot_metadata
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models import ablation, tvw_rl
from models.ec_labeller import ClassifierLabeller
from models.learned import ResultsConfig, gap_check
from models.tvw_rl import LEARNING_CURVE, TvwRlPolicy, TvwRlTrainConfig
from pipelines.synthetic import is_synthetic
from sim.evaluate import eval_sim_config, evaluate_by_cluster, gap_table, summarise
from sim.jobs import JobBatch
from sim.observation import ObservationConfig

TVW_RL_TRAIN = dataclass_config(TvwRlTrainConfig)
RESULTS = dataclass_config(ResultsConfig)
ABLATION = dataclass_config(ablation.AblationConfig)
ABLATION_PARTITIONS = StaticPartitionsDefinition(list(ablation.ABLATION_KEYS))
"""One TVW-RL ablation run per (setting, value) of `models.ablation.ABLATIONS`."""


def labeller_for(warehouse: Warehouse, source: str, usage_scale: pl.DataFrame) -> ClassifierLabeller | None:
    """TVW-RL Algorithm 1's labeller of a real source (its saved EC classifier and the sequences' usage scale), or
    None where there is none (synthetic sources, or no classifier saved)."""
    path = classifier_path(warehouse, source)
    row = usage_scale.filter(pl.col("source") == source)
    if not path.exists() or row.height == 0:
        return None
    _, cpu_scale, mem_scale, step_bins = row.row(0)
    return ClassifierLabeller(path, prefix_bins_per_step=step_bins, usage_scale=(cpu_scale, mem_scale))


@asset(partitions_def=RL_PARTITIONS, group_name="rl", io_manager_key="table_io", kinds={"parquet", "torch"})
def rl__tvw_rl(
    context: AssetExecutionContext,
    config: TVW_RL_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
) -> Output[pl.DataFrame]:
    """TVW-RL learning curves: one row per (source, load, training seed, iteration) with the mean and spread of the
    episode return, each penalty as a positive cost, the policy's entropy and the wall seconds. One partition is one
    (load, seed); it trains a policy for every source with training sequences at that load (REINFORCE with the
    time-dependent baseline, `models.tvw_rl`; DeepRM's single-machine workload only when named), resuming from its
    checkpoint (`models/tvw_rl/<source>/<partition>.ckpt/`) when a run was interrupted. The trained policies are
    `models/tvw_rl/<source>/<partition>.pt` under the warehouse, published with their JSON sidecar (configuration,
    git revision, iteration counts) only when training is complete."""
    settings = config.build()

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> list[dict]:
        cfg = settings.run_config(seed, is_label_known=is_synthetic(source))
        labeller = None if is_synthetic(source) else labeller_for(warehouse, source, sim__usage_scale)
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
    return Output(
        out, metadata=meta | curve_metadata(out, plot_learning_curves(out), "TVW-RL learning curves")
    )


@asset(
    group_name="results",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    deps=["rl__tvw_rl", "rl__deeprm", "rl__dejavu"],
    check_specs=EVAL_CHECKS_FOR("eval__results"),
)
def eval__results(
    context: AssetExecutionContext,
    config: RESULTS,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
    eval__baselines: pl.DataFrame,
):
    """Every registered policy, learned ones included, on every test sequence of every source and load, with every
    simulator metric, one row per (source, load, policy, test sequence, seed): the heuristics' rows from
    `eval__baselines`, a learned policy's with the file trained at that (source, load) with that training seed
    (one without such a file is left out and listed in the metadata)."""
    settings = config.build()
    cfg = eval_sim_config("eval__results", settings, sim__job_sequences)
    missing: list[str] = []
    labeller_of = functools.cache(lambda source: labeller_for(warehouse, source, sim__usage_scale))
    make = policy_maker(warehouse, missing, labeller_of)
    policies, seeds = list(settings.policies), list(settings.seeds)
    learned = evaluate_by_cluster(sim__job_sequences, policies, cfg, seeds, make=make, log=context.log.info)
    if policies and learned.height == 0:
        raise ValueError(
            f"eval__results: no checkpoint found for any of {policies} under {warehouse.root}/models "
            "(materialise rl__tvw_rl first)"
        )
    results = pl.concat([eval__baselines, learned], how="diagonal_relaxed").sort(
        "source", "load_pct", "policy", "sequence_id", "seed"
    )
    if missing:
        context.log.warning(f"{len(missing)} learned policy runs have no checkpoint: {missing[:10]}")
    yield Output(results, metadata={"n_rows": results.height, "left_out": MetadataValue.json(missing)})
    yield from eval_checks(results, results.height, asset="eval__results")


@asset(group_name="results", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__results_summary(context: AssetExecutionContext, eval__results: pl.DataFrame) -> pl.DataFrame:
    """Mean and 95 % interval of every metric of `eval__results` per (source, load, policy) over test sequences
    (seeds averaged within a sequence first); the UI shows the Fig. 4/5-style plot."""
    summary = summarise(eval__results)
    context.add_output_metadata(summary_plot_metadata(summary))
    return summary


GAP_CHECKS = [
    AssetCheckSpec(
        "has_a_best_heuristic_per_cell",
        asset="eval__gap",
        description="Every (source, load) evaluated has a best non-oracle heuristic and at least one forecast-driven "
        "or learned policy compared with it; an oracle is never the best heuristic.",
    )
]


@asset(group_name="results", io_manager_key="table_io", kinds={"parquet", "polars"}, check_specs=GAP_CHECKS)
def eval__gap(context: AssetExecutionContext, eval__results: pl.DataFrame):
    """Per (source, load, policy): the mean return against the best NON-ORACLE heuristic of that cell, the paired
    difference by test sequence with its 95 % interval and how many sequences it wins, the best oracle's return (a
    yardstick, never "best"), the share of the heuristic-to-oracle gap closed, a forecast-driven rule's information
    gap, and overshoot and machines used beside Tetris's (`sim.evaluate.gap_table`)."""
    gaps = gap_table(eval__results)
    passed, check, counts = gap_check(eval__results, gaps)
    context.log.info(
        f"eval__gap: {counts['n_cells']} cells; forecast-driven or learned policies significantly above the best "
        f"heuristic in {counts['n_cells_won']} of them"
    )
    meta = {"n_rows": gaps.height} | {k: counts[k] for k in ("n_cells", "n_significant_wins")}
    yield Output(gaps, metadata=meta)
    yield AssetCheckResult(
        asset_key="eval__gap", check_name="has_a_best_heuristic_per_cell", passed=passed, metadata=check
    )


def relabel_by_method(
    jobs: pl.DataFrame, value: str, warehouse: Warehouse, source: str, log=print
) -> pl.DataFrame:
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
)
def rl__ablation(
    context: AssetExecutionContext, config: ABLATION, warehouse: Warehouse, sim__job_sequences: pl.DataFrame
) -> Output[pl.DataFrame]:
    """One TVW-RL ablation run (TVW-RL Tables 2-3): the policy trained with one setting changed (a penalty weight,
    training noise, shape noise, or the EC mapping: none, aggregate, DTW or temporal) on `source` at `load_pct`,
    then evaluated greedily on that source's test sequences at background noise 0..3 units, scored with the
    unablated penalty weights; one row per (noise level, test sequence)."""
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
    return Output(out, metadata={"first_vs_last_return": trend, "checkpoint": str(path)})


@asset(group_name="ablation", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__ablations(rl__ablation: pl.DataFrame) -> pl.DataFrame:
    """TVW-RL Tables 2-3 from the ablation runs: per (ablation, value, test noise) the mean over test sequences of
    CPU and memory utilisation (higher is better), fragmentation, overshoot % and machines used (lower is
    better), jobs never placed and the episode return (higher is better)."""
    return ablation.ablation_table(rl__ablation)


@asset(group_name="ablation", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__ablation_winners(rl__ablation: pl.DataFrame, eval__baselines: pl.DataFrame) -> pl.DataFrame:
    """Each ablation run against the heuristics (`models.ablation.ablation_winners`): at test noise 0, on the same
    test sequences, the policy with the best mean return and the TVW-RL variant's rank. The `advantage` rows
    answer whether the advantage scaling (normalise / scale / raw) changes which policy wins."""
    return ablation.ablation_winners(rl__ablation, eval__baselines)


RL_ASSETS = [
    rl__tvw_rl,
    eval__results,
    eval__results_summary,
    eval__gap,
    rl__ablation,
    eval__ablations,
    eval__ablation_winners,
]
