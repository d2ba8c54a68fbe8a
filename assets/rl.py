"""Learned schedulers as assets: TVW-RL training runs (one partition per load x training seed, every source with
training sequences inside it) and the evaluation of every registered policy, learned ones included.

Trained policies are saved under the warehouse, `models/<policy>/<source>/<partition>.pt`, each with a JSON
sidecar holding its configuration and the git revision it was trained at; `eval__results` loads them from there.
"""

import dataclasses
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
)
from pydantic import Field

from assets.cluster import EVAL_CHECKS_FOR, EVAL_LOADS, eval_checks, eval_sim_config, evaluate_by_cluster
from assets.ec import classifier_path
from assets.learned import curve_frame, git_revision, load_learned, policy_path, publish_trained, stack_curves
from assets.plots import curve_plot, png_markdown, summary_plot_metadata
from assets.resources import Warehouse
from models.checkpoint import checkpoint_file
from models.ec_labeller import ClassifierLabeller
from models.reinforce import ADVANTAGE_MODES, config_dict, policy_payload
from models.tvw_rl import TvwRlConfig, TvwRlPolicy, train_tvw_rl
from pipelines.equivalence import EC_METHODS
from pipelines.synthetic import DEEPPLACE_SOURCE, DEEPRM_SOURCE
from sim.config import SimConfig
from sim.evaluate import evaluate_policies, gap_table, summarise
from sim.jobs import JobBatch
from sim.observation import ObservationConfig
from sim.policies import POLICIES, is_learned, make_policy

RL_LOADS = EVAL_LOADS  # the loads the heuristics are evaluated at
RL_SEEDS = (0, 1, 2)
RL_PARTITIONS = StaticPartitionsDefinition(
    [f"load{load}-seed{seed}" for load in RL_LOADS for seed in RL_SEEDS]
)
"""One training run per (load, training seed); every source with training sequences at that load inside it."""
SYNTHETIC_SOURCES = (DEEPPLACE_SOURCE, DEEPRM_SOURCE)
"""Synthetic workloads have no EC classifier: their job class is known at arrival, so the agent sees it."""

LEARNING_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "mean_return": pl.Float64,  # mean episode return over the iteration's B x N episodes (higher is better)
    "std_return": pl.Float64,
    "loss": pl.Float64,
    "entropy": pl.Float64,  # mean entropy of the masked policy over the iteration's decisions (nats)
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    "wall_s": pl.Float64,  # seconds the iteration took
    "cost_contention": pl.Float64,
    "cost_underutil": pl.Float64,
    "cost_overshoot": pl.Float64,
    "cost_wait": pl.Float64,
    "cost_unplaced": pl.Float64,
}


def parse_rl_partition(key: str) -> tuple[int, int]:
    """'load50-seed1' -> (50, 1)."""
    load, seed = key.split("-")
    return int(load.removeprefix("load")), int(seed.removeprefix("seed"))


class TvwRlTrainConfig(Config):
    preset: str = Field(
        default="paper",
        description="'paper' (TVW-RL: 2000 iterations of 20 x 20), 'study' (200 iterations of 10 x 20 whole sequences, lr 0.01, "
        "gamma 0.95) or 'short' (the embedded sample's 150 iterations of 10 x 8, 100-job episodes)",
    )
    n_iterations: int = Field(default=0, description="override the preset's iterations (0 = keep)")
    learning_rate: float = Field(
        default=0.0, description="override the preset's Adam learning rate (0 = keep)"
    )
    advantage: str = Field(default="normalise", description="advantage scaling: normalise | scale | raw")
    sources: list[str] = Field(
        default=[], description="sources to train on (empty: every source with sequences)"
    )
    labels: str = Field(
        default="predicted", description="EC labels the agent sees: predicted (Algorithm 1 classifier) | true"
    )


TVW_RL_PRESETS = {"paper": TvwRlConfig.paper, "study": TvwRlConfig.study, "short": TvwRlConfig.short}
"""Named TVW-RL training presets (`models.tvw_rl.TvwRlConfig`)."""


def _train_config(config: TvwRlTrainConfig, seed: int, is_synthetic: bool) -> TvwRlConfig:
    if config.preset not in TVW_RL_PRESETS:
        raise ValueError(f"unknown TVW-RL preset {config.preset!r}; known: {sorted(TVW_RL_PRESETS)}")
    base = TVW_RL_PRESETS[config.preset](seed)
    r = base.reinforce
    reinforce = dataclasses.replace(
        r,
        learning_rate=config.learning_rate or r.learning_rate,
        n_iterations=config.n_iterations or r.n_iterations,
        advantage=config.advantage,
        seed=seed,
    )
    labels = "true" if is_synthetic else config.labels
    return TvwRlConfig(
        sim=base.sim, obs=ObservationConfig(labels=labels), reinforce=reinforce, hidden_units=20
    )


def labeller_for(warehouse: Warehouse, source: str, usage_scale: pl.DataFrame) -> ClassifierLabeller | None:
    """TVW-RL Algorithm 1's labeller of a real source (its saved EC classifier and the sequences' usage scale), or
    None where there is none (synthetic sources, or no classifier saved)."""
    path = classifier_path(warehouse, source)
    row = usage_scale.filter(pl.col("source") == source)
    if not path.exists() or row.height == 0:
        return None
    _, cpu_scale, mem_scale, step_bins = row.row(0)
    return ClassifierLabeller(path, prefix_bins_per_step=step_bins, usage_scale=(cpu_scale, mem_scale))


@asset(
    partitions_def=RL_PARTITIONS,
    group_name="rl",
    io_manager_key="table_io",
    kinds={"parquet", "torch"},
)
def rl__tvw_rl(
    context: AssetExecutionContext,
    config: TvwRlTrainConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
) -> Output[pl.DataFrame]:
    """TVW-RL learning curves: one row per (source, load, training seed, iteration) with the mean and spread of the
    episode return, each penalty as a positive cost, the policy's entropy and the wall seconds. One partition is one
    (load, seed); it trains a policy for every source with training sequences at that load (REINFORCE with the
    time-dependent baseline, `models.tvw_rl`), resuming from its checkpoint (`models/tvw_rl/<source>/<partition>
    .ckpt/`) when a run was interrupted. The trained policies are `models/tvw_rl/<source>/<partition>.pt` under
    the warehouse, published with their JSON sidecar (configuration, git revision, iteration counts) only when
    training is complete."""
    load, seed = parse_rl_partition(context.partition_key)
    train = sim__job_sequences.filter((pl.col("split") == "train") & (pl.col("load_pct") == load))
    sources = sorted(train["source"].unique().to_list())
    # DeepRM's workload is defined on its own single-machine cluster: TVW-RL's 10 machines would see a tenth of
    # the load; it stays DeepRM's own study unless asked for by name
    sources = (
        [s for s in sources if s in config.sources]
        if config.sources
        else [s for s in sources if s != DEEPRM_SOURCE]
    )
    if not sources:
        raise ValueError(
            f"rl__tvw_rl {context.partition_key}: no training sequences at load {load} % "
            f"(sources asked: {config.sources or 'all'}); materialise sim__job_sequences first"
        )
    frames, saved = [], {}
    revision = git_revision()
    for source in sources:
        is_synthetic = source in SYNTHETIC_SOURCES
        cfg = _train_config(config, seed, is_synthetic)
        labeller = None if is_synthetic else labeller_for(warehouse, source, sim__usage_scale)
        if labeller is None and cfg.obs.labels == "predicted":
            context.log.warning(f"{source}: no saved EC classifier; the agent sees the clustering labels")
            cfg = TvwRlConfig(sim=cfg.sim, obs=ObservationConfig(labels="true"), reinforce=cfg.reinforce)
        jobs = JobBatch.from_frame(train.filter(pl.col("source") == source))
        path = policy_path(warehouse, "tvw_rl", source, load, seed)
        context.log.info(
            f"{source} load {load} % seed {seed}: training {cfg.reinforce.n_iterations} iterations"
        )
        ckpt = checkpoint_file(path)
        curve = train_tvw_rl(jobs, cfg, labeller, ckpt, log=lambda m, s=source: context.log.info(f"{s}: {m}"))
        payload = policy_payload(ckpt, TvwRlPolicy.name)
        publish_trained(
            path, payload, source, load, seed, config_dict(cfg.sim, cfg.obs, cfg.reinforce), revision
        )
        saved[source] = str(path)
        frames.append(curve_frame(curve, source, load, seed))
    out = stack_curves(frames, LEARNING_CURVE)
    return Output(
        out,
        metadata={
            "policies": MetadataValue.json(saved),
            "git_revision": revision,
            "learning_curve": png_markdown(plot_learning_curves(out), "TVW-RL learning curves"),
            "first_vs_last_return": MetadataValue.json(curve_trend(out).to_dicts()),
        },
    )


def curve_trend(curve: pl.DataFrame, share: float = 0.1) -> pl.DataFrame:
    """Per (source, load, seed): mean return over the first and the last `share` of iterations, and whether it
    rose (returns are negative costs: rising = learning)."""

    def part(first: bool) -> pl.Expr:
        n = (pl.len() * share).ceil().cast(pl.Int64).clip(1)
        col = pl.col("mean_return").sort_by("iteration")
        return (col.head(n) if first else col.tail(n)).mean()

    return (
        curve.group_by("source", "load_pct", "seed")
        .agg(first_return=part(True), last_return=part(False))
        .with_columns(has_improved=pl.col("last_return") > pl.col("first_return"))
        .sort("source", "load_pct", "seed")
    )


def relative_curves(curve: pl.DataFrame, share: float = 0.1) -> pl.DataFrame:
    """`curve` with `return_change_pct`: the mean return's change from the mean over the first `share` of each
    (source, load, seed)'s iterations, in % of its size (positive = the cost fell). Returns at 30 and 80 % load
    differ by a factor of 2 or more, so on one absolute axis a 2 % rise at 80 % looks flat."""
    first = curve_trend(curve, share).select("source", "load_pct", "seed", "first_return")
    return curve.join(first, on=["source", "load_pct", "seed"], how="left").with_columns(
        return_change_pct=(pl.col("mean_return") - pl.col("first_return"))
        / pl.col("first_return").abs().clip(1e-12)
        * 100.0
    )


def plot_learning_curves(curve: pl.DataFrame) -> bytes:
    """PNG: the mean return's change from its first tenth of iterations (%, `relative_curves`) per iteration, one
    panel per source, a line per (load, seed); 1,200 px wide."""
    return curve_plot(
        relative_curves(curve),
        [("return_change_pct", "mean return vs its first 10 %\n(% change; up = cost fell)")],
        "TVW-RL learning curves",
    )


class ResultsConfig(Config):
    policies: list[str] = Field(
        default=sorted(p for p in POLICIES if is_learned(p)),
        description="learned policies to evaluate (the heuristics' rows come from eval__baselines)",
    )
    seeds: list[int] = Field(
        default=list(RL_SEEDS),
        description="seeds: training seed of learned policies, simulator/policy seed of all",
    )
    n_machines: int = Field(default=10, description="M (TVW-RL: 10)")
    max_steps: int = Field(default=1000, description="safety cap in logical steps (hitting it is a failure)")
    noise_max_units: int = Field(default=0, description="background noise 0..n units (robustness study: 1-3)")


@asset(
    group_name="results",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    deps=["rl__tvw_rl", "rl__deeprm", "rl__dejavu"],
    check_specs=EVAL_CHECKS_FOR("eval__results"),
)
def eval__results(
    context: AssetExecutionContext,
    config: ResultsConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
    eval__baselines: pl.DataFrame,
):
    """Every registered policy, learned ones included, on every test sequence of every source and load, with every
    simulator metric (utilisation, fragmentation, overshoot %, machines used and the sequence's
    `machines_lower_bound`, jobs never placed, return and its costs), one row per (source, load, policy, test
    sequence, seed). The heuristics' rows are `eval__baselines` (seed = simulator/policy seed); a learned policy
    runs with the checkpoint trained at that (source, load) with that training seed; one without a checkpoint
    there is left out and listed in the metadata."""
    cfg = eval_sim_config("eval__results", config, sim__job_sequences)
    missing: list[str] = []
    labellers: dict[str, ClassifierLabeller | None] = {}

    def make(name: str, source: str, load: int, seed: int):
        if not is_learned(name):
            return make_policy(name)
        path = policy_path(warehouse, name, source, load, seed)
        if not path.exists():
            missing.append(f"{name} {source} {load}% seed {seed}")
            return None
        if name != "tvw_rl":
            return load_learned(name, source, load, seed, warehouse)
        if source not in labellers:
            labellers[source] = labeller_for(warehouse, source, sim__usage_scale)
        return load_learned(name, source, load, seed, warehouse, labeller=labellers[source])

    learned = evaluate_by_cluster(
        sim__job_sequences, config.policies, cfg, config.seeds, make=make, log=context.log.info
    )
    if config.policies and learned.height == 0:
        raise ValueError(
            f"eval__results: no checkpoint found for any of {config.policies} under {warehouse.root}/models "
            "(materialise rl__tvw_rl first)"
        )
    results = pl.concat([eval__baselines, learned], how="diagonal_relaxed").sort(
        "source", "load_pct", "policy", "sequence_id", "seed"
    )
    if missing:
        context.log.warning(f"{len(missing)} learned policy runs have no checkpoint: {missing[:10]}")
    n_expected = results.height  # learned policies without checkpoints are left out by design
    yield Output(
        results,
        metadata={"n_rows": results.height, "left_out": MetadataValue.json(missing)},
    )
    yield from eval_checks(results, n_expected, asset="eval__results")


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
    ),
]


@asset(
    group_name="results",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    check_specs=GAP_CHECKS,
)
def eval__gap(context: AssetExecutionContext, eval__results: pl.DataFrame):
    """Per (source, load, policy): the mean return against the best NON-ORACLE heuristic of that cell (request-based
    heuristics, the hybrid and Google's peak predictors), the paired difference by test sequence with its 95 %
    interval and how many sequences it wins, the best oracle's return (a yardstick, never "best"), the share of the
    heuristic-to-oracle gap closed, for a forecast-driven rule its information gap (the same rule on the true
    future), and overshoot and machines used beside Tetris's (`sim.evaluate.gap_table`)."""
    gaps = gap_table(eval__results)
    cells = eval__results.select("source", "load_pct").unique().height
    challengers = gaps.filter(pl.col("policy_kind").is_in(["forecast", "learned"]))
    oracle_best = gaps.join(
        eval__results.filter(pl.col("is_oracle"))
        .select("policy")
        .unique()
        .rename({"policy": "best_heuristic"}),
        on="best_heuristic",
        how="semi",
    )
    n_cells = gaps.select("source", "load_pct").unique().height
    wins = challengers.filter(pl.col("is_significantly_better"))
    context.log.info(
        f"eval__gap: {n_cells} cells; forecast-driven or learned policies significantly above the best heuristic "
        f"in {wins.select('source', 'load_pct').unique().height} of them"
    )
    yield Output(
        gaps, metadata={"n_rows": gaps.height, "n_cells": n_cells, "n_significant_wins": wins.height}
    )
    yield AssetCheckResult(
        asset_key="eval__gap",
        check_name="has_a_best_heuristic_per_cell",
        passed=n_cells == cells and challengers.height > 0 and oracle_best.height == 0,
        metadata={"n_cells": n_cells, "n_cells_evaluated": cells, "n_challenger_rows": challengers.height},
    )


ABLATIONS: dict[str, tuple] = {
    "k_underutil": (0.0, 1.0, 2.0, 3.0),  # TVW-RL Table 3
    "k_overshoot": (0.0, 15000.0, 30000.0, 45000.0),
    "k_contention": (0.0, 0.1, 1.0, 10.0),
    "train_noise": (0, 1, 2, 3),  # Table 2: trained with background noise of 0..n units, tested at 0..3
    "shape_noise": (0, 1),  # trained with usage shapes perturbed by -1..1 units (1) or not (0)
    # Table 2: w/o EC (every job labelled 0), or each clustering method's own mapping
    "ec_mapping": ("none", "aggregate", "dtw", "temporal"),
    "advantage": ADVANTAGE_MODES,  # reward scale: does the advantage scaling change which policy wins?
}
"""TVW-RL's ablations (its Tables 2-3, at 50 % load): setting -> values; one training run per value."""
ABLATION_PARTITIONS = StaticPartitionsDefinition([f"{k}={v}" for k, vals in ABLATIONS.items() for v in vals])
ABLATION_RESULTS = {
    "ablation": pl.String,
    "value": pl.String,
    "source": pl.String,
    "load_pct": pl.Int32,
    "eval_noise_units": pl.Int32,  # background noise 0..n units in the test episodes
    "sequence_id": pl.Int32,
    "avg_util_cpu_frac": pl.Float64,
    "avg_util_mem_frac": pl.Float64,
    "avg_frag_cpu_frac": pl.Float64,
    "avg_frag_mem_frac": pl.Float64,
    "avg_overshoot_pct": pl.Float64,
    "machines_used": pl.Float64,
    "n_unplaced": pl.Float64,
    "episode_return": pl.Float64,
}


class AblationConfig(Config):
    source: str = Field(
        default="google2011_derived",
        description="source whose sequences train and test (a real source: the ec_mapping ablation relabels its "
        "workloads with each clustering method's mapping)",
    )
    load_pct: int = Field(default=50, description="load of the ablation (TVW-RL: 50 %)")
    preset: str = Field(default="paper", description="'paper', 'study' or 'short' training preset")
    n_iterations: int = Field(default=0, description="override the preset's iterations (0 = keep)")
    learning_rate: float = Field(default=0.0, description="override the preset's learning rate (0 = keep)")
    seed: int = Field(default=0, description="training seed")


def ablation_test_sim(base: TvwRlConfig, noise_units: int) -> SimConfig:
    """The simulator an ablation run is tested in: the UNABLATED preset's (penalty weights included, so every
    run's return compares with the heuristics' and with the other runs'; a run trained with K_o = 0 is not
    rewarded at test for ignoring overshoot), whole test sequences, background noise 0..`noise_units` units, no
    shape noise, the evaluation's safety cap."""
    return dataclasses.replace(
        base.sim,
        noise_max_units=noise_units,
        is_shape_perturbed=False,
        max_steps=1000,
        jobs_per_episode=None,
        oversize="clip",
    )


def method_labels(warehouse: Warehouse, source: str, method: str) -> pl.DataFrame:
    """(workload_id, ec_label) of `method`'s mapping of `source` (`ec__method_assignments`: one mapping per
    clustering method, at the k that method's choice rule picks); a clear error where there is none."""
    if not warehouse.has_table("ec__method_assignments"):
        raise ValueError(
            f"ec_mapping={method}: no ec__method_assignments table under {warehouse.root}; materialise the EC "
            f"layer for {source} first"
        )
    rows = (
        warehouse.scan("ec__method_assignments")
        .filter((pl.col("source") == source) & (pl.col("method") == method))
        .select("workload_id", "k", "ec_label")
        .collect()
    )
    if rows.height == 0:
        synthetic = " (a synthetic source: its job classes are known, it has no EC mapping)"
        raise ValueError(
            f"ec_mapping={method}: ec__method_assignments has no {method} mapping of {source}"
            f"{synthetic if source in SYNTHETIC_SOURCES else ''}; choose a real source with an EC mapping"
        )
    return rows


def relabel_by_method(
    jobs: pl.DataFrame, value: str, warehouse: Warehouse, source: str, log=print
) -> pl.DataFrame:
    """TVW-RL Table 2's EC-mapping rows: every job of `jobs` labelled 0 ("none": no EC knowledge), or labelled
    with `value`'s mapping (aggregate, dtw or temporal) looked up by workload. Workloads the mapping does not
    cover (kept by the sequences, but skipped by the clustering) get label 0 and are counted in the log."""
    if value == "none":
        return jobs.with_columns(ec_label=pl.lit(0, pl.Int32))
    if value not in EC_METHODS:
        raise ValueError(f"ec_mapping={value!r}: unknown; known: none, {', '.join(sorted(EC_METHODS))}")
    labels = method_labels(warehouse, source, value)
    out = jobs.drop("ec_label").join(
        labels.select("workload_id", pl.col("ec_label").cast(pl.Int32)), on="workload_id", how="left"
    )
    uncovered = out.filter(pl.col("ec_label").is_null())["workload_id"].n_unique()
    log(
        f"ec_mapping={value}: {source} relabelled with the {value} mapping (k = {labels['k'][0]}); "
        f"{uncovered} of {jobs['workload_id'].n_unique()} workloads uncovered -> label 0"
    )
    return out.with_columns(pl.col("ec_label").fill_null(0)).select(jobs.columns)


def ablation_config(base: TvwRlConfig, setting: str, value: str) -> TvwRlConfig:
    """`base` with one ablation setting applied (`ABLATIONS`)."""
    if setting in ("k_underutil", "k_overshoot", "k_contention"):
        return base.with_sim(**{setting: float(value)})
    if setting == "train_noise":
        return base.with_sim(noise_max_units=int(value))
    if setting == "shape_noise":
        return base.with_sim(is_shape_perturbed=bool(int(value)))
    if setting == "ec_mapping":
        return base
    if setting == "advantage":
        return dataclasses.replace(base, reinforce=dataclasses.replace(base.reinforce, advantage=value))
    raise ValueError(f"unknown ablation {setting!r}; known: {sorted(ABLATIONS)}")


@asset(
    partitions_def=ABLATION_PARTITIONS,
    group_name="ablation",
    io_manager_key="table_io",
    kinds={"parquet", "torch"},
)
def rl__ablation(
    context: AssetExecutionContext,
    config: AblationConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
) -> Output[pl.DataFrame]:
    """One TVW-RL ablation run (TVW-RL Tables 2-3): the policy trained with one setting changed (a penalty weight,
    training noise, shape noise, or the EC mapping: none, aggregate, DTW or temporal) on `source` at `load_pct`,
    then evaluated greedily on that source's test sequences at background noise 0..3 units, scored with the
    unablated penalty weights; one row per (noise level, test sequence)."""
    setting, value = context.partition_key.split("=")
    group = sim__job_sequences.filter(
        (pl.col("source") == config.source) & (pl.col("load_pct") == config.load_pct)
    )
    if setting == "ec_mapping":
        group = relabel_by_method(group, value, warehouse, config.source, context.log.info)
    train, test = group.filter(pl.col("split") == "train"), group.filter(pl.col("split") == "test")
    if train.height == 0 or test.height == 0:
        raise ValueError(
            f"rl__ablation {context.partition_key}: no train or test sequences for {config.source} at "
            f"{config.load_pct} %"
        )
    base = _train_config(
        TvwRlTrainConfig(
            preset=config.preset, n_iterations=config.n_iterations, learning_rate=config.learning_rate
        ),
        config.seed,
        is_synthetic=True,
    )
    cfg = ablation_config(base, setting, value)
    path = Path(warehouse.root) / "models" / "tvw_rl_ablation" / config.source / f"{context.partition_key}.pt"
    curve = train_tvw_rl(JobBatch.from_frame(train), cfg, None, path, log=context.log.info)
    policy = TvwRlPolicy(path)
    frames = []
    for noise in range(4):
        sim = ablation_test_sim(base, noise)
        res = evaluate_policies(test, ["tvw_rl"], sim, seeds=[config.seed], make=lambda *_: policy)
        frames.append(res.with_columns(eval_noise_units=pl.lit(noise, pl.Int32)))
    out = pl.concat(frames).with_columns(ablation=pl.lit(setting), value=pl.lit(value))
    trend = curve_trend(
        pl.DataFrame(curve).with_columns(
            source=pl.lit(config.source), load_pct=pl.lit(config.load_pct), seed=pl.lit(config.seed)
        )
    )
    return Output(
        out.select([pl.col(c).cast(t) for c, t in ABLATION_RESULTS.items()]),
        metadata={"first_vs_last_return": MetadataValue.json(trend.to_dicts()), "checkpoint": str(path)},
    )


def ablation_winners(ablations: pl.DataFrame, baselines: pl.DataFrame) -> pl.DataFrame:
    """Per ablation run (ablation, value) at test noise 0: the TVW-RL variant's mean return and utilisation
    beside the heuristics' on the same source, load and test sequences (`eval__baselines`), the policy with the
    best mean return among them all (`winner_by_return`) and the TVW-RL variant's rank by return (1 = best).
    Reading the `advantage` rows together answers whether the advantage scaling changes which policy wins."""
    runs = ablations.filter(pl.col("eval_noise_units") == 0)
    rows = []
    for (setting, value, source, load), run in runs.group_by(
        "ablation", "value", "source", "load_pct", maintain_order=True
    ):
        ids = run["sequence_id"].unique()
        base = baselines.filter(
            (pl.col("source") == source) & (pl.col("load_pct") == load) & pl.col("sequence_id").is_in(ids)
        )
        means = (
            pl.concat(
                [
                    base.select("policy", "episode_return", "avg_util_cpu_frac", "avg_overshoot_pct"),
                    run.select(
                        pl.lit("tvw_rl").alias("policy"),
                        "episode_return",
                        "avg_util_cpu_frac",
                        "avg_overshoot_pct",
                    ),
                ]
            )
            .group_by("policy")
            .agg(pl.all().mean())
            .sort("episode_return", descending=True)
        )
        rank = means["policy"].to_list().index("tvw_rl") + 1
        rows.append(
            {
                "ablation": setting,
                "value": value,
                "source": source,
                "load_pct": load,
                "n_policies": means.height,
                "winner_by_return": means["policy"][0],
                "tvw_rl_rank_by_return": rank,
                "tvw_rl_return": means.filter(pl.col("policy") == "tvw_rl")["episode_return"][0],
                "best_baseline_return": means.filter(pl.col("policy") != "tvw_rl")["episode_return"].max(),
            }
        )
    return pl.DataFrame(rows).sort("ablation", "value")


@asset(group_name="ablation", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__ablations(rl__ablation: pl.DataFrame) -> pl.DataFrame:
    """TVW-RL Tables 2-3 from the ablation runs: per (ablation, value, test noise) the mean over test sequences of
    CPU and memory utilisation (higher is better), fragmentation, overshoot % and machines used (lower is
    better), jobs never placed and the episode return (higher is better)."""
    keys = ("ablation", "value", "eval_noise_units", "sequence_id", "source", "load_pct")
    metrics = [c for c in ABLATION_RESULTS if c not in keys]
    return (
        rl__ablation.group_by("ablation", "value", "eval_noise_units")
        .agg([pl.col(c).mean() for c in metrics], n_sequences=pl.len())
        .sort("ablation", "value", "eval_noise_units")
    )


@asset(group_name="ablation", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__ablation_winners(rl__ablation: pl.DataFrame, eval__baselines: pl.DataFrame) -> pl.DataFrame:
    """Each ablation run against the heuristics (`ablation_winners`): at test noise 0, on the same test
    sequences, the policy with the best mean return and the TVW-RL variant's rank. The `advantage` rows answer
    whether the advantage scaling (normalise / scale / raw) changes which policy wins."""
    return ablation_winners(rl__ablation, eval__baselines)


RL_ASSETS = [
    rl__tvw_rl,
    eval__results,
    eval__results_summary,
    eval__gap,
    rl__ablation,
    eval__ablations,
    eval__ablation_winners,
]
