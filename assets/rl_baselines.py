"""The learned baselines as assets: DeepRM's agent (`models.deeprm`) and Dejavu (`models.dejavu`) trained per
(load, training seed) like TVW-RL (`assets.learned`: where trained policies live, how they are published and
loaded back), DeepRM's Figure 4 on its own workload, and Dejavu's own metrics."""

from pathlib import Path

import polars as pl
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets import checks
from assets.learned import RESULTS_TABLE, RL_TRAINING, curve_metadata, policy_maker, train_partition
from assets.plots import curve_plot, dejavu_metrics_plot, png_markdown
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models import deeprm, dejavu
from models.checkpoint import check_sidecar
from models.deeprm import DEEPRM_CURVE, FIG4_SOURCE, FIG4_TABLE, DeepRMFig4Config, DeepRMTrainConfig
from models.dejavu import DEJAVU_CURVE, DEJAVU_METRICS_TABLE, DejavuMetricsConfig, DejavuTrainConfig
from models.training import CURVE_CHECK_DOCS, curve_check_values
from pipelines.synthetic import build_deeprm_sequences
from sim.evaluate import eval_sim_config
from sim.jobs import JobBatch

DEEPRM_TRAIN = dataclass_config(DeepRMTrainConfig)
DEJAVU_TRAIN = dataclass_config(DejavuTrainConfig)
DEEPRM_FIG4 = dataclass_config(DeepRMFig4Config)
DEJAVU_METRICS = dataclass_config(DejavuMetricsConfig)


@asset(**RL_TRAINING, check_specs=checks.specs("rl__deeprm", CURVE_CHECK_DOCS))
def rl__deeprm(
    context: AssetExecutionContext,
    config: DEEPRM_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
):
    """DeepRM agent learning curves, one row per (source, load, training seed, iteration): return, mean job
    slowdown, each reward component as a positive cost, entropy, wall seconds. A partition is one (load, seed)
    (`models.deeprm.DeepRMTrainConfig`), resuming from `models/deeprm_rl/<source>/<partition>.ckpt/`; the
    policies (`<partition>.pt`, with their JSON sidecar) are published only when complete."""
    settings = config.build()

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> list[dict]:
        cfg = settings.agent_config(source, seed)
        context.log.info(
            f"deeprm {source} load {load} % seed {seed}: {cfg.reinforce.n_iterations} iterations"
        )
        log = lambda m: context.log.info(f"deeprm {source}: {m}")  # noqa: E731
        return deeprm.train_and_publish(
            JobBatch.from_frame(rows), cfg, path, (source, load, seed), revision, log
        )

    out, meta = train_partition(
        context, warehouse, sim__job_sequences, settings, "deeprm_rl", fit, DEEPRM_CURVE, "deeprm"
    )
    panels = [("mean_return", "mean return"), ("mean_slowdown", "mean slowdown")]
    plot = curve_plot(out, panels, "DeepRM learning curves")
    yield Output(out, metadata=meta | curve_metadata(out, plot, "DeepRM learning curves"))
    yield from checks.results(curve_check_values(out))


@asset(**RL_TRAINING, check_specs=checks.specs("rl__dejavu", CURVE_CHECK_DOCS))
def rl__dejavu(
    context: AssetExecutionContext,
    config: DEJAVU_TRAIN,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
):
    """Dejavu learning curves, one row per (source, load, training seed, iteration): DQfD pretraining on
    kube_default's demonstrations (loss and its parts), then RL with the competitive reward (returns, penalties,
    epsilon, loss), wall seconds. A partition is one (load, seed), single-node sources left out
    (`models.dejavu.DejavuTrainConfig`); trained policies (`<partition>.pt`) are published when complete."""
    settings = config.build()

    def fit(source: str, rows: pl.DataFrame, path: Path, load: int, seed: int, revision: str) -> pl.DataFrame:
        dcfg, sim_cfg = settings.configs(seed, dejavu.eval_label_count(sim__job_sequences))
        context.log.info(
            f"dejavu {source} load {load} % seed {seed}: {dcfg.n_pretrain_iterations} pretraining + "
            f"{dcfg.n_rl_iterations} RL iterations"
        )
        log = lambda m: context.log.info(f"{source}: {m}")  # noqa: E731
        jobs = JobBatch.from_frame(rows)
        return dejavu.train_and_publish(dcfg, sim_cfg, jobs, path, (source, load, seed), revision, log)

    out, meta = train_partition(
        context, warehouse, sim__job_sequences, settings, "dejavu", fit, DEJAVU_CURVE, "dejavu"
    )
    panels = [
        ("loss", "DQfD loss"),
        ("loss_supervised", "margin loss"),
        ("mean_return", "competitive return"),
    ]
    plot = curve_plot(out, panels, "Dejavu learning curves (pretraining, then RL)")
    yield Output(out, metadata=meta | curve_metadata(out, plot, "Dejavu learning curves", trend=False))
    yield from checks.results(curve_check_values(out))


@asset(**RESULTS_TABLE, deps=["rl__deeprm"], check_specs=checks.specs("eval__deeprm_fig4"))
def eval__deeprm_fig4(context: AssetExecutionContext, config: DEEPRM_FIG4, warehouse: Warehouse):
    """DeepRM Figure 4 on DeepRM's own workload: mean job slowdown (95 % interval over test jobsets) per (load,
    policy) for the DeepRM agent trained at the nearest load (`rl__deeprm` on `deeprm_synthetic`), SJF, Packer,
    Tetris, Tetris* and a random job, on jobsets built by `pipelines.synthetic.build_deeprm_sequences`."""
    settings, name = config.build(), deeprm.DeepRMAgentPolicy.name
    root = Path(warehouse.root) / "models" / name / FIG4_SOURCE
    checkpoints = deeprm.trained_by_load(root, settings.training_seed)
    for load, p in checkpoints.items():  # a half-trained or unpublished file is an error naming it
        check_sidecar(p, name, FIG4_SOURCE, load, settings.training_seed, "materialise rl__deeprm")
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
    yield Output(table, metadata=metadata)
    yield from checks.table_results("eval__deeprm_fig4", table)


TRUNCATION_CHECK = {
    "no_episode_hits_the_safety_cap": "Every policy measured finishes every test episode before the safety cap "
    "(a truncated episode would make its completion time the cap and its turnaround a mean over the jobs it did "
    "place)."
}


@asset(
    **RESULTS_TABLE, deps=["rl__dejavu"], check_specs=checks.specs("eval__dejavu_metrics", TRUNCATION_CHECK)
)
def eval__dejavu_metrics(
    context: AssetExecutionContext,
    config: DEJAVU_METRICS,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
):
    """Dejavu's own metrics (its section IV-D) per (source, load, policy) on the test sequences, for Dejavu,
    kube_default, Best-Fit and Tetris: utilisation, RBD1/RBD2, completion and turnaround time, means with 95 %
    half-widths (`_ci95`), single-node sources left out (`models.dejavu.evaluate_dejavu_metrics`)."""
    settings = config.build()
    cfg = eval_sim_config("eval__dejavu_metrics", settings, sim__job_sequences)
    jobs = sim__job_sequences.filter(~pl.col("source").is_in(dejavu.SINGLE_NODE_SOURCES))
    policies = list(settings.policies)
    make = policy_maker(warehouse)
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
    yield from checks.results({"no_episode_hits_the_safety_cap": dejavu.truncation_check(table)})


RL_BASELINE_ASSETS = [rl__deeprm, rl__dejavu, eval__deeprm_fig4, eval__dejavu_metrics]
