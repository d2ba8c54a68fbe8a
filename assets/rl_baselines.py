"""The learned baselines as assets: DeepRM's agent (`models.deeprm`) and Dejavu (`models.dejavu`) trained per
(load, training seed) like TVW-RL (`assets.learned.RL_PARTITIONS`), DeepRM's Figure 4 on its own workload, and
Dejavu's own metrics for the trained Dejavu agents and the heuristics they compete with.

Trained policies are `models/<policy>/<source>/<partition>.pt` under the warehouse (policy "deeprm_rl" or
"dejavu"), published with their JSON sidecar once training is complete; resumable checkpoints live apart, in
`<partition>.ckpt/`. Which sources each agent trains on: `models.deeprm.DeepRMTrainConfig`,
`models.dejavu.DejavuTrainConfig`.
"""

import time
from pathlib import Path

import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, MetadataValue, Output, asset

from assets.cluster import eval_sim_config
from assets.learned import (
    RL_PARTITIONS,
    TRAINING_ASSET,
    curve_metadata,
    load_learned,
    policy_path,
    train_partition,
)
from assets.plots import curve_plot, dejavu_metrics_plot, png_markdown
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models import deeprm, dejavu
from models.checkpoint import check_sidecar, checkpoint_dir, checkpoint_file, publish_trained
from models.deeprm import DEEPRM_CURVE, FIG4_SOURCE, FIG4_TABLE, DeepRMFig4Config, DeepRMTrainConfig
from models.dejavu import DEJAVU_CURVE, DEJAVU_METRICS_TABLE, DejavuMetricsConfig, DejavuTrainConfig
from models.reinforce import policy_payload
from pipelines.synthetic import build_deeprm_sequences
from sim.jobs import JobBatch
from sim.policies import is_learned, make_policy

__all__ = ["RL_PARTITIONS", "load_learned"]

DEEPRM_TRAIN = dataclass_config(DeepRMTrainConfig)
DEJAVU_TRAIN = dataclass_config(DejavuTrainConfig)
DEEPRM_FIG4 = dataclass_config(DeepRMFig4Config)
DEJAVU_METRICS = dataclass_config(DejavuMetricsConfig)


@asset(partitions_def=RL_PARTITIONS, group_name="rl", io_manager_key="table_io", kinds={"parquet", "torch"})
def rl__deeprm(
    context: AssetExecutionContext,
    config: DEEPRM_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
) -> Output[pl.DataFrame]:
    """DeepRM agent learning curves: one row per (source, load, training seed, iteration) with the mean and
    spread of the episode return, the mean job slowdown, each reward component as a positive cost, the policy's
    entropy and the wall seconds. One partition is one (load, seed); it trains DeepRM's agent (REINFORCE with the
    time-dependent baseline, the chosen job placed by Best-Fit) on every source with training sequences at that
    load: TVW-RL's "DeepRM" baseline on TVW-RL's cluster, DeepRM's own setup on `deeprm_synthetic`. Resumes from
    its checkpoint (`models/deeprm_rl/<source>/<partition>.ckpt/`) when a run was interrupted; the trained
    policies are `models/deeprm_rl/<source>/<partition>.pt` under the warehouse, published with their JSON sidecar
    (configuration, git revision, iteration counts) only when training is complete."""
    settings = config.build()

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> list[dict]:
        cfg = settings.agent_config(source, seed)
        context.log.info(
            f"deeprm {source} load {load} % seed {seed}: {cfg.reinforce.n_iterations} iterations"
        )
        start, ckpt = time.perf_counter(), checkpoint_file(path)
        log = lambda m: context.log.info(f"deeprm {source}: {m}")  # noqa: E731
        curve = deeprm.train_deeprm(JobBatch.from_frame(rows), cfg, ckpt, log=log)
        context.log.info(f"deeprm {source}: trained in {time.perf_counter() - start:.1f} s")
        payload = policy_payload(ckpt, deeprm.DeepRMAgentPolicy.name)
        publish_trained(path, payload, source, load, seed, deeprm.checkpoint_config(cfg), revision)
        return curve

    out, meta = train_partition(
        context, warehouse, sim__job_sequences, settings, "deeprm_rl", fit, DEEPRM_CURVE
    )
    panels = [("mean_return", "mean return"), ("mean_slowdown", "mean slowdown")]
    plot = curve_plot(out, panels, "DeepRM learning curves")
    return Output(out, metadata=meta | curve_metadata(out, plot, "DeepRM learning curves"))


@asset(partitions_def=RL_PARTITIONS, group_name="rl", io_manager_key="table_io", kinds={"parquet", "torch"})
def rl__dejavu(
    context: AssetExecutionContext,
    config: DEJAVU_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
) -> Output[pl.DataFrame]:
    """Dejavu learning curves: one row per (source, load, training seed, iteration): DQfD pretraining on
    kube_default's selective demonstrations (loss and its parts), then RL with the competitive reward (mean and
    spread of the competitive return, the simulator's return and each of its penalties as a positive cost,
    epsilon, loss), and the wall seconds. One partition is one (load, seed); it trains Dejavu on every source with
    training sequences at that load except `deeprm_synthetic`, resuming from the latest checkpoint of
    `models/dejavu/<source>/<partition>.ckpt/`; the trained policies are `models/dejavu/<source>/<partition>.pt`
    (weights and configs, no replay), published with their JSON sidecar (configuration, git revision, iteration
    counts) only when training is complete."""
    settings = config.build()

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> pl.DataFrame:
        dcfg, sim_cfg = settings.configs(seed, dejavu.eval_label_count(sim__job_sequences))
        context.log.info(
            f"dejavu {source} load {load} % seed {seed}: {dcfg.n_pretrain_iterations} pretraining + "
            f"{dcfg.n_rl_iterations} RL iterations"
        )
        start, ckpt_dir = time.perf_counter(), checkpoint_dir(path)
        log = lambda m: context.log.info(f"{source}: {m}")  # noqa: E731
        trainer = dejavu.train(dcfg, sim_cfg, JobBatch.from_frame(rows), checkpoint_dir=ckpt_dir, log=log)
        context.log.info(f"dejavu {source}: trained in {time.perf_counter() - start:.1f} s")
        dejavu.publish_dejavu(ckpt_dir, path, (source, load, seed), dcfg, sim_cfg, revision)
        return dejavu.dejavu_curve(trainer.curve)

    out, meta = train_partition(context, warehouse, sim__job_sequences, settings, "dejavu", fit, DEJAVU_CURVE)
    panels = [
        ("loss", "DQfD loss"),
        ("loss_supervised", "margin loss"),
        ("mean_return", "competitive return"),
    ]
    plot = curve_plot(out, panels, "Dejavu learning curves (pretraining, then RL)")
    return Output(out, metadata=meta | curve_metadata(out, plot, "Dejavu learning curves", trend=False))


@asset(group_name="results", io_manager_key="table_io", kinds={"parquet", "polars"}, deps=["rl__deeprm"])
def eval__deeprm_fig4(
    context: AssetExecutionContext, config: DEEPRM_FIG4, warehouse: Warehouse
) -> Output[pl.DataFrame]:
    """DeepRM Figure 4 on DeepRM's own synthetic workload: mean job slowdown with its 95 % interval over test
    jobsets, per (load, policy), for the trained DeepRM agent (`rl__deeprm` on `deeprm_synthetic`; at each load the
    agent trained at the nearest training load, `trained_at_load_pct`), DeepRM's heuristics SJF, Packer, Tetris
    and Tetris*, and a random choice of job. The jobsets are built here at the figure's loads by
    `pipelines.synthetic.build_deeprm_sequences` (with sim__job_sequences' seed they are its test jobsets at its
    loads); the UI shows the slowdown-vs-load plot."""
    settings, name = config.build(), deeprm.DeepRMAgentPolicy.name
    root = Path(warehouse.root) / "models" / name / FIG4_SOURCE
    checkpoints = deeprm.trained_by_load(root, settings.training_seed)
    for load, p in checkpoints.items():  # a half-trained or unpublished file is an error naming it
        check_sidecar(
            p, name, FIG4_SOURCE, load, settings.training_seed, f"materialise {TRAINING_ASSET[name]}"
        )
    if not checkpoints:
        raise ValueError(
            f"eval__deeprm_fig4: no DeepRM agent trained on {FIG4_SOURCE} with seed {settings.training_seed} "
            f"under {root} (materialise rl__deeprm with the deeprm_synthetic source first)"
        )
    sequences = build_deeprm_sequences(settings.sequence_plan())
    table, png = deeprm.slowdown_vs_load(sequences, checkpoints, seed=settings.seed)
    table = table.select([pl.col(c).cast(t) for c, t in FIG4_TABLE.items()])
    context.log.info(f"eval__deeprm_fig4: agents trained at {sorted(checkpoints)} % loads")
    metadata = {
        "plot": png_markdown(png, "DeepRM Fig. 4: job slowdown vs load"),
        "checkpoints": MetadataValue.json({str(k): str(v) for k, v in checkpoints.items()}),
        "n_rows": table.height,
    }
    return Output(table, metadata=metadata)


DEJAVU_METRICS_CHECKS = [
    AssetCheckSpec(
        "no_episode_hits_the_safety_cap",
        asset="eval__dejavu_metrics",
        description="Every policy measured finishes every test episode before the safety cap (a truncated episode "
        "would make its completion time the cap and its turnaround a mean over the jobs it did place).",
    ),
]


@asset(
    group_name="results",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    deps=["rl__dejavu"],
    check_specs=DEJAVU_METRICS_CHECKS,
)
def eval__dejavu_metrics(
    context: AssetExecutionContext,
    config: DEJAVU_METRICS,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
):
    """Dejavu's own metrics (Dejavu section IV-D) per (source, load, policy) on the test sequences, for the
    trained Dejavu agents (`rl__dejavu`, one per training seed) and the heuristics they compete with (kube_default,
    Best-Fit, Tetris): the cluster's utilisation until the last placement, RBD1 (imbalance across nodes) and RBD2
    (imbalance across a node's resources) after each placement, completion time (the step the last job ends) and
    turnaround time (finish - arrival), each a mean over test sequences with its 95 % half-width (`_ci95`), seeds
    averaged within a sequence first. In the evaluation's simulator (`eval__results`' M, cap and hold rule); every
    source but `deeprm_synthetic` (one node: placement has no choice). A learned run with no trained file is left
    out and listed in the metadata."""
    settings = config.build()
    cfg = eval_sim_config("eval__dejavu_metrics", settings, sim__job_sequences)
    jobs = sim__job_sequences.filter(~pl.col("source").is_in(dejavu.SINGLE_NODE_SOURCES))

    def make(name: str, source: str, load: int, seed: int):
        if not is_learned(name):
            return make_policy(name)
        if not policy_path(warehouse, name, source, load, seed).exists():
            return None
        return load_learned(name, source, load, seed, warehouse)

    policies = list(settings.policies)
    episodes, missing = dejavu.evaluate_dejavu_metrics(jobs, policies, cfg, list(settings.seeds), make)
    if "dejavu" in policies and not (episodes.height and (episodes["policy"] == "dejavu").any()):
        raise ValueError(
            f"eval__dejavu_metrics: no trained Dejavu policy under {Path(warehouse.root) / 'models' / 'dejavu'} for "
            f"seeds {list(settings.seeds)} (materialise rl__dejavu first)"
        )
    if missing:
        context.log.warning(f"{len(missing)} learned policy runs have no trained file: {missing[:10]}")
    summary = dejavu.summarise_dejavu_metrics(episodes)
    table = summary.select([pl.col(c).cast(t) for c, t in DEJAVU_METRICS_TABLE.items()])
    plot = png_markdown(dejavu_metrics_plot(table), "Dejavu's metrics by load")
    metadata = {
        "n_rows": table.height,
        "n_episodes": episodes.height,
        "left_out": MetadataValue.json(missing),
    }
    yield Output(table, metadata=metadata | {"plot": plot})
    passed, check = dejavu.truncation_check(table)
    check["groups"] = MetadataValue.json(check["groups"])
    yield AssetCheckResult(
        asset_key="eval__dejavu_metrics",
        check_name="no_episode_hits_the_safety_cap",
        passed=passed,
        metadata=check,
    )


RL_BASELINE_ASSETS = [rl__deeprm, rl__dejavu, eval__deeprm_fig4, eval__dejavu_metrics]
