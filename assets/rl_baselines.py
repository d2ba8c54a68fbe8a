"""The learned baselines as assets: DeepRM's agent (`models.deeprm`) and Dejavu (`models.dejavu`) trained per
(load, training seed) like TVW-RL (`assets.rl.RL_PARTITIONS`), and DeepRM's Figure 4 on its own workload.

Trained policies are saved where `eval__results` looks for them, `models/<policy>/<source>/<partition>.pt` under
the warehouse (`assets.learned.policy_path`, policy "deeprm_rl" or "dejavu"), each with a JSON sidecar holding its
configuration, the git revision, its iteration counts and the run's identity, both published together once training
is complete (`models.checkpoint.publish_policy`; resumable checkpoints live apart, in `<partition>.ckpt/`);
`assets.learned.load_learned` reads one back as a registry scheduler.

`eval__dejavu_metrics` reports Dejavu's own metrics (utilisation, RBD1, RBD2, completion and turnaround time) for
the trained Dejavu agents and the heuristics they compete with.

Which sources each agent trains on (every source with training sequences at the partition's load, or those named
in its config):
- DeepRM: TVW-RL's "DeepRM" baseline (`DeepRMAgentConfig.tvw_baseline`: TVW-RL's 10-machine cluster) on every
  source but `deeprm_synthetic`; on `deeprm_synthetic`, DeepRM's own setup (one pool of 8 units per resource), the
  agent of DeepRM's Figure 4 (`eval__deeprm_fig4`).
- Dejavu: every source but `deeprm_synthetic` (Dejavu places pods on nodes; DeepRM's single-pool workload has
  one node, where placement has no choice).
"""

import dataclasses
import time
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    MetadataValue,
    Output,
    asset,
)
from pydantic import Field

from assets.cluster import eval_sim_config
from assets.learned import (
    LEARNED_BUILDERS,
    check_sidecar,
    curve_frame,
    git_revision,
    load_learned,
    policy_path,
    publish_trained,
    stack_curves,
)
from assets.plots import curve_plot, png_markdown, source_grid
from assets.resources import Warehouse
from assets.rl import RL_PARTITIONS, ResultsConfig, curve_trend, parse_rl_partition
from models import deeprm, dejavu
from models.checkpoint import checkpoint_dir, checkpoint_file
from models.deeprm import DeepRMAgentConfig, DeepRMAgentPolicy, train_deeprm
from models.dejavu import DEJAVU_METRICS, DejavuConfig, DejavuPolicy
from models.reinforce import policy_payload
from pipelines.synthetic import DEEPRM_SOURCE, DeepRMConfig, build_deeprm_sequences
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import is_learned, make_policy

PRESETS = ("paper", "short", "sample")
"""Training presets of both agents: "paper" (the papers' budgets, for a big machine), "short" (a few minutes per
source on 2 cores, still learning visibly) and "sample" (the embedded sample's run: a partition in about a minute
on a quiet 2-core machine; a smoke run of the whole layer, not a trained agent worth comparing)."""

DEEPRM_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "mean_return": pl.Float64,  # mean episode return (negative slowdown and unused-resource cost; higher is better)
    "std_return": pl.Float64,
    "mean_slowdown": pl.Float64,  # mean over episodes of total slowdown / jobs
    "cost_slowdown": pl.Float64,  # the reward's components as positive costs (`models.deeprm.REWARD_COMPONENTS`)
    "cost_unused": pl.Float64,
    "cost_unplaced": pl.Float64,
    "loss": pl.Float64,
    "entropy": pl.Float64,  # mean entropy of the masked policy (nats)
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    "wall_s": pl.Float64,  # seconds the iteration took
}

DEJAVU_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "is_pretraining": pl.Boolean,  # DQfD pretraining on demonstrations only (no episode, returns null)
    "mean_return": pl.Float64,  # mean competitive return (Algorithm 2) of the iteration's episodes (RL phase)
    "std_return": pl.Float64,
    "mean_sim_return": pl.Float64,  # mean simulator return of those episodes (TVW-RL's penalties)
    "cost_contention": pl.Float64,  # the simulator's penalties of those episodes as positive costs
    "cost_underutil": pl.Float64,
    "cost_overshoot": pl.Float64,
    "cost_wait": pl.Float64,
    "cost_unplaced": pl.Float64,
    "epsilon": pl.Float64,  # exploration of the RL iteration
    "loss": pl.Float64,  # DQfD loss (Eq. 11), mean over the iteration's updates
    "loss_dq": pl.Float64,
    "loss_n_step": pl.Float64,
    "loss_supervised": pl.Float64,
    "loss_l2": pl.Float64,
    "wall_s": pl.Float64,  # seconds the iteration took
}


# --- configuration -----------------------------------------------------------------------------------------


class DeepRMTrainConfig(Config):
    preset: str = Field(
        default="paper",
        description="'paper' (DeepRM: 1000 iterations of 100 x 20; TVW-RL's baseline: 2000 of 20 x 20), "
        "'short' or 'sample'",
    )
    n_iterations: int = Field(default=0, description="override the preset's iterations (0 = keep)")
    sources: list[str] = Field(
        default=[], description="sources to train on (empty: every source with sequences)"
    )


class DejavuTrainConfig(Config):
    preset: str = Field(
        default="paper",
        description="'paper' (10^6 demonstrations, 750k pretraining updates, 3750 RL iterations), 'short' or 'sample'",
    )
    n_pretrain_iterations: int = Field(
        default=-1, description="override the preset's pretraining iterations (-1 = keep)"
    )
    n_rl_iterations: int = Field(default=-1, description="override the preset's RL iterations (-1 = keep)")
    n_demo_decisions: int = Field(
        default=0, description="override the preset's demonstrator decisions (0 = keep)"
    )
    sources: list[str] = Field(
        default=[], description="sources to train on (empty: every source with sequences)"
    )


def _check_preset(preset: str, asset_name: str) -> None:
    if preset not in PRESETS:
        raise ValueError(f"{asset_name}: unknown preset {preset!r}; known: {PRESETS}")


def deeprm_config(preset: str, source: str, seed: int, n_iterations: int = 0) -> DeepRMAgentConfig:
    """The DeepRM agent trained on `source` under `preset`: DeepRM's own setup on its synthetic workload, TVW-RL's
    baseline (10 machines, 40 jobs per episode; 20 in the short presets) elsewhere."""
    _check_preset(preset, "rl__deeprm")
    if source == DEEPRM_SOURCE:
        base = DeepRMAgentConfig.paper() if preset == "paper" else DeepRMAgentConfig.short(seed)
    else:
        base = DeepRMAgentConfig.tvw_baseline(seed)
        if preset != "paper":
            base = base.with_sim(jobs_per_episode=20)
    r = base.reinforce
    if preset == "short":
        r = dataclasses.replace(r, n_iterations=60, n_sequences=8, n_trajectories=8, checkpoint_every=10)
    elif preset == "sample":
        r = dataclasses.replace(r, n_iterations=15, n_sequences=4, n_trajectories=4, checkpoint_every=5)
    r = dataclasses.replace(r, seed=seed, n_iterations=n_iterations or r.n_iterations)
    return dataclasses.replace(base, reinforce=r)


def dejavu_configs(config: DejavuTrainConfig, seed: int, n_labels: int) -> tuple[DejavuConfig, SimConfig]:
    """(agent, training simulator) of a Dejavu run: TVW-RL's cluster (M = 10) with the evaluation's safety cap
    (1000 steps) and label count (`n_labels`: the network's input must match `eval__results`' simulator,
    `assets.cluster.eval_sim_config`). Episodes: whole sequences ("paper", as evaluated), their first 150 jobs
    ("short"), 20 ("sample"). Long episodes let the cluster fill up by requests as it does in the evaluation's
    whole sequences, where kube_default holds often; measured on DeepPlace 50 % with the short preset's budget
    (one seed, 6 whole test sequences): 60-job episodes gave a return 14 % below kube_default's, 150-job episodes
    5 % (the agent's overshoot 0.026 % vs 0.018 % of steps; kube_default 0)."""
    _check_preset(config.preset, "rl__dejavu")
    if config.preset == "paper":
        dcfg = DejavuConfig(seed=seed)
    elif config.preset == "short":
        dcfg = DejavuConfig.short(
            seed=seed,
            hidden_units=(128, 128),
            n_demo_decisions=3000,
            n_pretrain_iterations=40,
            n_rl_iterations=6,
            updates_per_iteration=100,
            episodes_per_iteration=8,
            target_update_every=200,
            epsilon_decay_iterations=3,
        )
    else:
        dcfg = DejavuConfig.short(
            seed=seed,
            n_demo_decisions=600,
            n_pretrain_iterations=4,
            n_rl_iterations=2,
            updates_per_iteration=50,
            episodes_per_iteration=4,
            epsilon_decay_iterations=1,
            checkpoint_every=2,
        )
    changes = {
        k: v
        for k, v in (
            ("n_pretrain_iterations", config.n_pretrain_iterations),
            ("n_rl_iterations", config.n_rl_iterations),
        )
        if v >= 0
    }
    if config.n_demo_decisions:
        changes["n_demo_decisions"] = config.n_demo_decisions
    dcfg = dataclasses.replace(dcfg, **changes)
    jobs_per_episode = {"paper": None, "short": 150, "sample": 20}[config.preset]
    sim = SimConfig(max_steps=1000, jobs_per_episode=jobs_per_episode, n_labels=n_labels)
    return dcfg, sim


def eval_label_count(jobs: pl.DataFrame) -> int:
    """n_labels of `assets.cluster.eval_sim_config` for the sequences `jobs`."""
    return max(SimConfig().n_labels, int(jobs["ec_label"].max() or 0) + 1)


def _sources(
    train: pl.DataFrame, wanted: list[str], exclude: tuple[str, ...], asset_name: str, key: str
) -> list[str]:
    have = sorted(train["source"].unique().to_list())
    sources = [s for s in have if s in wanted] if wanted else [s for s in have if s not in exclude]
    if not sources:
        raise ValueError(
            f"{asset_name} {key}: no training sequences for sources {wanted or 'all'} at this load "
            f"(sources with sequences: {have}); materialise sim__job_sequences first"
        )
    return sources


# --- DeepRM -------------------------------------------------------------------------------------------------


@asset(partitions_def=RL_PARTITIONS, group_name="rl", io_manager_key="table_io", kinds={"parquet", "torch"})
def rl__deeprm(
    context: AssetExecutionContext,
    config: DeepRMTrainConfig,
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
    load, seed = parse_rl_partition(context.partition_key)
    _check_preset(config.preset, "rl__deeprm")
    train = sim__job_sequences.filter((pl.col("split") == "train") & (pl.col("load_pct") == load))
    sources = _sources(train, config.sources, (), "rl__deeprm", context.partition_key)
    revision = git_revision()
    frames, saved = [], {}
    for source in sources:
        cfg = deeprm_config(config.preset, source, seed, config.n_iterations)
        path = policy_path(warehouse, DeepRMAgentPolicy.name, source, load, seed)
        context.log.info(
            f"deeprm {source} load {load} % seed {seed}: {cfg.reinforce.n_iterations} iterations"
        )
        start = time.perf_counter()
        ckpt = checkpoint_file(path)
        curve = train_deeprm(
            JobBatch.from_frame(train.filter(pl.col("source") == source)),
            cfg,
            ckpt,
            log=lambda m, s=source: context.log.info(f"deeprm {s}: {m}"),
        )
        context.log.info(f"deeprm {source}: trained in {time.perf_counter() - start:.1f} s")
        payload = policy_payload(ckpt, DeepRMAgentPolicy.name)
        publish_trained(path, payload, source, load, seed, deeprm.checkpoint_config(cfg), revision)
        saved[source] = str(path)
        frames.append(curve_frame(curve, source, load, seed))
    out = stack_curves(frames, DEEPRM_CURVE)
    plot = curve_plot(
        out, [("mean_return", "mean return"), ("mean_slowdown", "mean slowdown")], "DeepRM learning curves"
    )
    return Output(
        out,
        metadata={
            "policies": MetadataValue.json(saved),
            "git_revision": revision,
            "learning_curve": png_markdown(plot, "DeepRM learning curves"),
            "first_vs_last_return": MetadataValue.json(curve_trend(out).to_dicts()),
        },
    )


# --- Dejavu -------------------------------------------------------------------------------------------------


def _dejavu_curve(rows: list[dict]) -> pl.DataFrame:
    """The learning-curve rows of `models.dejavu.train` with DEJAVU_CURVE's names (`stack_curves` adds the
    columns a run did not report, as nulls)."""
    return pl.DataFrame(rows).rename(
        {"mean_competitive_return": "mean_return", "std_competitive_return": "std_return"}, strict=False
    )


@asset(partitions_def=RL_PARTITIONS, group_name="rl", io_manager_key="table_io", kinds={"parquet", "torch"})
def rl__dejavu(
    context: AssetExecutionContext,
    config: DejavuTrainConfig,
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
    load, seed = parse_rl_partition(context.partition_key)
    train = sim__job_sequences.filter((pl.col("split") == "train") & (pl.col("load_pct") == load))
    sources = _sources(train, config.sources, (DEEPRM_SOURCE,), "rl__dejavu", context.partition_key)
    dcfg, sim_cfg = dejavu_configs(config, seed, eval_label_count(sim__job_sequences))
    revision = git_revision()
    frames, saved = [], {}
    for source in sources:
        path = policy_path(warehouse, DejavuPolicy.name, source, load, seed)
        ckpt_dir = checkpoint_dir(path)
        context.log.info(
            f"dejavu {source} load {load} % seed {seed}: {dcfg.n_pretrain_iterations} pretraining + "
            f"{dcfg.n_rl_iterations} RL iterations"
        )
        start = time.perf_counter()
        trainer = dejavu.train(
            dcfg,
            sim_cfg,
            JobBatch.from_frame(train.filter(pl.col("source") == source)),
            checkpoint_dir=ckpt_dir,
            log=lambda m, s=source: context.log.info(f"{s}: {m}"),
        )
        context.log.info(f"dejavu {source}: trained in {time.perf_counter() - start:.1f} s")
        latest = dejavu.latest_checkpoint(ckpt_dir)
        config_json = {"dejavu": dataclasses.asdict(dcfg), "sim": dataclasses.asdict(sim_cfg)}
        publish_trained(path, dejavu.policy_payload(ckpt_dir), source, load, seed, config_json, revision)
        for old in ckpt_dir.glob("dejavu_iter*.pt"):
            if old != latest:
                old.unlink()  # a resumed run needs only the latest
        saved[source] = str(path)
        frames.append(curve_frame(_dejavu_curve(trainer.curve), source, load, seed))
    out = stack_curves(frames, DEJAVU_CURVE)
    plot = curve_plot(
        out,
        [("loss", "DQfD loss"), ("loss_supervised", "margin loss"), ("mean_return", "competitive return")],
        "Dejavu learning curves (pretraining, then RL)",
    )
    return Output(
        out,
        metadata={
            "policies": MetadataValue.json(saved),
            "git_revision": revision,
            "learning_curve": png_markdown(plot, "Dejavu learning curves"),
        },
    )


# --- DeepRM Figure 4 ---------------------------------------------------------------------------------------

FIG4_TABLE = {
    "load_pct": pl.Int32,
    "policy": pl.String,
    "n_sequences": pl.Int64,  # test jobsets at the load
    "n_jobs": pl.Int64,
    "mean_slowdown": pl.Float64,  # mean over jobsets of the jobset's mean job slowdown (1 = no wait)
    "slowdown_ci95": pl.Float64,  # half-width of its 95 % t-interval over jobsets
    "n_unplaced": pl.Int64,  # jobs never placed (0 unless the safety cap cut an episode)
    "trained_at_load_pct": pl.Int64,  # the DeepRM agent's training load (null for the heuristics)
}


class DeepRMFig4Config(Config):
    loads_pct: list[int] = Field(
        default=[30, 50, 70, 90],
        description="offered loads of the figure, % (DeepRM: 10-190 %; its workload generator reaches 92 %)",
    )
    n_test_sequences: int = Field(default=30, description="test jobsets per load (DeepRM: 100)")
    sequence_seed: int = Field(
        default=0,
        description="seed of the jobsets (sim__job_sequences' seed: the same test jobsets at its loads)",
    )
    training_seed: int = Field(default=0, description="training seed of the DeepRM agent evaluated")
    seed: int = Field(default=0, description="simulator and tie-break seed of the test episodes")


@asset(group_name="results", io_manager_key="table_io", kinds={"parquet", "polars"}, deps=["rl__deeprm"])
def eval__deeprm_fig4(
    context: AssetExecutionContext, config: DeepRMFig4Config, warehouse: Warehouse
) -> Output[pl.DataFrame]:
    """DeepRM Figure 4 on DeepRM's own synthetic workload: mean job slowdown with its 95 % interval over test
    jobsets, per (load, policy), for the trained DeepRM agent (`rl__deeprm` on `deeprm_synthetic`; at each load the
    agent trained at the nearest training load, `trained_at_load_pct`), DeepRM's heuristics SJF, Packer, Tetris
    and Tetris*, and a random choice of job. The jobsets are built here at the figure's loads by
    `pipelines.synthetic.build_deeprm_sequences` (with sim__job_sequences' seed they are its test jobsets at its
    loads); the UI shows the slowdown-vs-load plot."""
    root = Path(warehouse.root) / "models" / DeepRMAgentPolicy.name / DEEPRM_SOURCE
    found = sorted(root.glob(f"load*-seed{config.training_seed}.pt"))
    checkpoints = {parse_rl_partition(p.stem)[0]: p for p in found}
    for load, p in checkpoints.items():  # a half-trained or unpublished file is an error naming it
        check_sidecar(p, DeepRMAgentPolicy.name, DEEPRM_SOURCE, load, config.training_seed)
    if not checkpoints:
        raise ValueError(
            f"eval__deeprm_fig4: no DeepRM agent trained on {DEEPRM_SOURCE} with seed {config.training_seed} under "
            f"{root} (materialise rl__deeprm with the deeprm_synthetic source first)"
        )
    plan = DeepRMConfig(
        n_train_sequences=0,
        n_test_sequences=config.n_test_sequences,
        loads_pct=tuple(config.loads_pct),
        seed=config.sequence_seed,
    )
    table, png = deeprm.slowdown_vs_load(build_deeprm_sequences(plan), checkpoints, seed=config.seed)
    table = table.select([pl.col(c).cast(t) for c, t in FIG4_TABLE.items()])
    context.log.info(f"eval__deeprm_fig4: agents trained at {sorted(checkpoints)} % loads")
    return Output(
        table,
        metadata={
            "plot": png_markdown(png, "DeepRM Fig. 4: job slowdown vs load"),
            "checkpoints": MetadataValue.json({str(k): str(v) for k, v in checkpoints.items()}),
            "n_rows": table.height,
        },
    )


# --- Dejavu's own metrics -----------------------------------------------------------------------------------

DEJAVU_METRICS_TABLE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "policy": pl.String,
    "n_sequences": pl.Int64,  # test sequences the means are over (seeds averaged within a sequence first)
    "n_seeds": pl.Int64,
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    **{c: pl.Float64 for m in DEJAVU_METRICS for c in (m, f"{m}_ci95")},
}

DEJAVU_COMPETITORS = ["dejavu", "kube_default", "best_fit", "tetris"]
"""Dejavu and the heuristics it is measured against: kube_default (its demonstrator and competitive baseline),
Best-Fit and Tetris."""


class DejavuMetricsConfig(ResultsConfig):
    """`eval__results`' simulator and seeds; the policies are Dejavu and its competitors."""

    policies: list[str] = Field(
        default=DEJAVU_COMPETITORS,
        description="policies to measure: registered heuristics, and the learned dejavu / deeprm_rl",
    )


def _dejavu_metrics_plot(table: pl.DataFrame) -> bytes:
    """PNG: one row per Dejavu metric, one column per source, a line per policy over load (95 % error bars)."""

    def draw(ax, part: pl.DataFrame, metric: str) -> None:
        for (name,), g in part.group_by("policy", maintain_order=True):
            g = g.sort("load_pct")
            ax.errorbar(g["load_pct"], g[metric], yerr=g[f"{metric}_ci95"], marker="o", capsize=2, label=name)

    rows = [(m, m) for m in DEJAVU_METRICS]
    return source_grid(
        table,
        rows,
        draw,
        xlabel="load (%)",
        title="Dejavu's metrics (section IV-D)",
        panel_height_in=2.2,
        sharex=True,
    )


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
    config: DejavuMetricsConfig,
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
    cfg = eval_sim_config("eval__dejavu_metrics", config, sim__job_sequences)
    unsupported = [
        p for p in config.policies if is_learned(p) and p not in (DejavuPolicy.name, DeepRMAgentPolicy.name)
    ]
    if unsupported:
        raise ValueError(
            f"eval__dejavu_metrics: learned policies {unsupported} are not measured here "
            f"(learned ones it loads: {[DejavuPolicy.name, DeepRMAgentPolicy.name]})"
        )
    jobs = sim__job_sequences.filter(pl.col("source") != DEEPRM_SOURCE)

    def make(name: str, source: str, load: int, seed: int):
        if name not in LEARNED_BUILDERS:
            return make_policy(name)
        if not policy_path(warehouse, name, source, load, seed).exists():
            return None
        return load_learned(name, source, load, seed, warehouse)

    episodes, missing = dejavu.evaluate_dejavu_metrics(jobs, config.policies, cfg, config.seeds, make)
    if DejavuPolicy.name in config.policies and not (
        episodes.height and (episodes["policy"] == DejavuPolicy.name).any()
    ):
        raise ValueError(
            f"eval__dejavu_metrics: no trained Dejavu policy under {Path(warehouse.root) / 'models' / 'dejavu'} for "
            f"seeds {config.seeds} (materialise rl__dejavu first)"
        )
    if missing:
        context.log.warning(f"{len(missing)} learned policy runs have no trained file: {missing[:10]}")
    table = dejavu.summarise_dejavu_metrics(episodes).select(
        [pl.col(c).cast(t) for c, t in DEJAVU_METRICS_TABLE.items()]
    )
    yield Output(
        table,
        metadata={
            "n_rows": table.height,
            "n_episodes": episodes.height,
            "left_out": MetadataValue.json(missing),
            "plot": png_markdown(_dejavu_metrics_plot(table), "Dejavu's metrics by load"),
        },
    )
    cut = table.filter(pl.col("n_truncated") > 0)
    yield AssetCheckResult(
        asset_key="eval__dejavu_metrics",
        check_name="no_episode_hits_the_safety_cap",
        passed=cut.height == 0,
        metadata={
            "n_truncated_episodes": int(cut["n_truncated"].sum()),
            "groups": MetadataValue.json(cut.select("source", "load_pct", "policy").to_dicts()),
        },
    )


RL_BASELINE_ASSETS = [rl__deeprm, rl__dejavu, eval__deeprm_fig4, eval__dejavu_metrics]
