"""Job sequences for the simulator and the evaluation of every registered scheduler (TVW-RL "End-to-End
Evaluation", Fig. 4/5). These tables span every trace source and the synthetic workloads; the heuristic
evaluation (`eval__baselines`) is partitioned by load, so that its runs fan out, and read back whole."""

import dataclasses

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetOut,
    Config,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)
from pydantic import Field

from assets.core import long_running_usage
from assets.ec import classifier_path
from assets.io_manager import markdown_preview
from assets.plots import labelling_accuracy_plot, png_markdown, summary_plot_metadata
from assets.resources import Warehouse
from models.ec_labeller import ClassifierLabeller
from models.sim_labeller import SimLabellerConfig, fit_sim_labeller
from models.usage_forecast import (
    FORECAST_PRESETS,
    forecast_tables_by_source,
    forecaster_factory,
    summarise_forecast_table,
)
from pipelines.job_sequences import (
    JOB_SEQUENCES,
    OFFERED_LOAD,
    SequenceConfig,
    build_job_sequences,
    offered_load_check,
    offered_load_table,
)
from pipelines.progress import Progress
from pipelines.synthetic import (
    DEEPPLACE_SOURCE,
    DEEPRM_SOURCE,
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
)
from sim.config import SimConfig
from sim.evaluate import RESULT_KEY, evaluate_policies, split_diversity, summarise
from sim.jobs import JobBatch
from sim.labelling import LABEL_ACCURACY, label_accuracy_by_age, most_frequent_label
from sim.policies import POLICIES, is_learned
from sim.tuning import TUNING_PRESETS, TuningConfig


class JobSequencesConfig(Config):
    n_train_sequences: int = Field(
        default=100, description="training sequences per (source, load) (TVW-RL: 100)"
    )
    n_test_sequences: int = Field(default=30, description="test sequences per (source, load) (TVW-RL: 30)")
    loads_pct: list[int] = Field(
        default=[30, 50, 80], description="average cluster loads (TVW-RL: 30/50/80 %)"
    )
    step_bins: int = Field(default=12, description="5-minute bins per logical step (12: one hour)")
    min_workloads: int = Field(default=2, description="a trace source needs this many long-running workloads")
    arrival_steps: int = Field(
        default=300,
        description="steps during which requests arrive (long against the longest job: 100 steps)",
    )
    load_resource: str = Field(
        default="dominant",
        description="what a load label calibrates: 'dominant' resource's or 'mean' offered load",
    )
    rate_split: str = Field(
        default="own", description="whose expected job work sets a split's arrival rate: 'own' or 'train'"
    )
    load_tolerance: float = Field(
        default=0.1, description="realised offered load must be within this share of the label (check)"
    )
    min_split_workloads: int = Field(
        default=5, description="a split cut from fewer distinct workloads is flagged (warning, failed check)"
    )
    include_synthetic: bool = Field(
        default=True, description="add the DeepPlace and DeepRM synthetic workloads"
    )
    seed: int = Field(default=0, description="seed of arrivals, cuts and splits")


def _read_optional(warehouse: Warehouse, table: str) -> pl.DataFrame | None:
    return warehouse.scan(table).collect() if warehouse.has_table(table) else None


USAGE_SCALE = {
    "source": pl.String,
    "cpu_frac_scale": pl.Float64,  # multiplier applied to cpu_frac before quantising to units of C_d
    "mem_frac_scale": pl.Float64,
    "step_bins": pl.Int32,  # 5-minute bins per logical step
}


EVAL_LOADS = (30, 50, 80)
"""Loads the evaluation is partitioned by: TVW-RL's 30/50/80 %, as the training runs (`assets.rl.RL_LOADS`)."""
EVAL_PARTITIONS = StaticPartitionsDefinition([f"load{load}" for load in EVAL_LOADS])
"""One `eval__baselines` partition per load ('load50'): every policy, source and seed at that load."""


def parse_eval_partition(key: str) -> int:
    """'load50' -> 50; ValueError naming the known keys otherwise."""
    if key not in EVAL_PARTITIONS.get_partition_keys():
        raise ValueError(
            f"unknown evaluation partition {key!r}; known: {EVAL_PARTITIONS.get_partition_keys()}"
        )
    return int(key.removeprefix("load"))


def eval_partition_keys(loads_pct: list[int]) -> list[str]:
    """The `eval__baselines` partitions of the configured loads (`sim__job_sequences.loads_pct`), in order;
    ValueError naming the loads that have no partition (their sequences could never be evaluated)."""
    missing = [load for load in loads_pct if load not in EVAL_LOADS]
    if missing:
        raise ValueError(
            f"sim__job_sequences.loads_pct {loads_pct}: load(s) {missing} have no evaluation partition "
            f"(eval__baselines is partitioned by {list(EVAL_LOADS)} %, as the training runs)"
        )
    return [f"load{load}" for load in loads_pct]


SEQUENCE_CHECKS = [
    AssetCheckSpec(
        "splits_have_enough_workloads",
        asset="sim__job_sequences",
        description="Every (source, load, split) is cut from at least `min_split_workloads` distinct workloads.",
    ),
    AssetCheckSpec(
        "offered_load_matches_label",
        asset="sim__job_sequences",
        description="For every (source, load), the realised offered load of the dominant resource, averaged over "
        "sequences, is within load_tolerance (10 %) of the label.",
    ),
    AssetCheckSpec(
        "train_and_test_share_no_workload",
        asset="sim__job_sequences",
        description="Within a source, no workload feeds both training and test sequences.",
    ),
]


def eval_sim_config(asset: str, config: Config, jobs: pl.DataFrame) -> SimConfig:
    """The simulator an evaluation asset runs: its config's M, safety cap, hold rule (default "always") and
    noise, labels covering every job, oversized jobs clipped and counted. ValueError naming the asset on a
    policy that is neither registered nor an importable "module:attr"."""
    unknown = [p for p in config.policies if p not in POLICIES and ":" not in p]
    if unknown:
        raise ValueError(f"{asset}: unknown policies {unknown}; registered: {sorted(POLICIES)}")
    return SimConfig(
        n_machines=config.n_machines,
        max_steps=config.max_steps,
        hold_rule=getattr(config, "hold_rule", "always"),
        n_labels=max(SimConfig().n_labels, int(jobs["ec_label"].max() or 0) + 1),
        noise_max_units=config.noise_max_units,
        oversize="clip",
    )


def evaluate_by_cluster(
    jobs: pl.DataFrame,
    policies: list[str],
    cfg: SimConfig,
    seeds: list[int],
    make=None,
    log=None,
    **fit_kwargs,
) -> pl.DataFrame:
    """`evaluate_policies` on the test split, each source on the cluster its loads refer to (`source_clusters`:
    DeepRM's synthetic workload on its single machine, the rest on cfg.n_machines). Learned policies built for
    another cluster size are left out of a source whose M differs (their state space would not match). `log`
    (e.g. `context.log.info`) gets the progress lines, one series per cluster size M."""
    clusters = source_clusters(jobs, SequenceConfig(n_machines=cfg.n_machines))
    frames = []
    for m in sorted({m for m, _ in clusters.values()}):
        sources = [s for s, (n, _) in clusters.items() if n == m]
        part = jobs.filter(pl.col("source").is_in(sources))
        names = policies if m == cfg.n_machines else [p for p in policies if not is_learned(p)]
        if names and part.filter(pl.col("split") == "test").height:
            sim = dataclasses.replace(cfg, n_machines=m)
            frames.append(
                evaluate_policies(
                    part,
                    names,
                    sim,
                    seeds=seeds,
                    split="test",
                    make=make,
                    log=log,
                    label=f"evaluate on M={m}",
                    **fit_kwargs,
                )
            )
    if not frames:
        raise ValueError(f"no test sequences to evaluate {policies} on (sources: {sorted(clusters)})")
    return pl.concat(frames, how="diagonal_relaxed").sort(list(RESULT_KEY))


def source_clusters(jobs: pl.DataFrame, seq_cfg: SequenceConfig) -> dict[str, tuple[int, int]]:
    """Per source of `jobs`: (machines M, arrival window in steps) its load labels refer to: DeepRM's synthetic
    workload is defined on its own single-pool cluster, the others on TVW-RL's M = 10."""
    own = {
        DEEPRM_SOURCE: (DeepRMConfig().n_machines, DeepRMConfig().arrival_steps),
        DEEPPLACE_SOURCE: (DeepPlaceConfig().n_machines, DeepPlaceConfig().arrival_steps),
    }
    sources = jobs["source"].unique().to_list()
    return {s: own.get(s, (seq_cfg.n_machines, seq_cfg.arrival_steps)) for s in sources}


def sequence_checks(
    jobs: pl.DataFrame, diversity: pl.DataFrame, by_label: pl.DataFrame | None = None
) -> list[AssetCheckResult]:
    """The SEQUENCE_CHECKS of a `sim__job_sequences` table (`by_label`: `offered_load_check` of its loads)."""
    by_split = jobs.group_by("source", "workload_id").agg(pl.col("split").n_unique().alias("n_splits"))
    shared = by_split.filter(pl.col("n_splits") > 1)
    thin = diversity.filter(pl.col("is_too_few_workloads"))
    return [
        AssetCheckResult(
            check_name="splits_have_enough_workloads",
            passed=thin.height == 0 and jobs.height > 0,
            metadata={"thin_splits": MetadataValue.json(thin.to_dicts()), "n_jobs": jobs.height},
        ),
        AssetCheckResult(
            check_name="offered_load_matches_label",
            passed=by_label is not None
            and by_label.height > 0
            and bool(by_label["is_within_tolerance"].all()),
            metadata={
                "by_label": MetadataValue.json([] if by_label is None else by_label.to_dicts()),
            },
        ),
        AssetCheckResult(
            check_name="train_and_test_share_no_workload",
            passed=shared.height == 0,
            metadata={"n_shared_workloads": shared.height},
        ),
    ]


@multi_asset(
    check_specs=SEQUENCE_CHECKS,
    outs={
        "sim__job_sequences": AssetOut(
            io_manager_key="table_io",
            kinds={"parquet", "polars"},
            description="Job sequences for the simulator, one row per job: per (source, load, split, sequence) "
            "the Poisson arrival step, the EC label, the workload's meta (requests, priority, class) and the "
            "quantised per-step CPU and memory units (C_d = 8) of a window cut from a long-running workload; "
            "train and test sequences never share a workload. Real sources come from `core__long_running`; "
            "`deepplace_synthetic` and `deeprm_synthetic` are the papers' synthetic workloads.",
        ),
        "sim__offered_load": AssetOut(
            io_manager_key="table_io",
            kinds={"parquet", "polars"},
            description="Per job sequence, its realised offered load measured from its jobs alone (total work "
            "per resource / (M x C_d x arrival window)), per resource, their mean and the dominant resource's, "
            "and the peak demand as a fraction of the cluster: what the load label claims, checked.",
        ),
        "sim__usage_scale": AssetOut(
            io_manager_key="table_io",
            kinds={"parquet", "polars"},
            description="Per real source, the multipliers that mapped usage fractions to units (the 95th "
            "percentile of workload peaks -> 6 of 8 units) and the step length: what the simulator's EC "
            "labeller needs to turn observed units back into the classifier's fractions.",
        ),
    },
    deps=["core__usage", "core__long_running", "ec__assignments"],
    group_name="sim",
)
def sim__job_sequences(context: AssetExecutionContext, config: JobSequencesConfig, warehouse: Warehouse):
    unevaluated = [load for load in config.loads_pct if load not in EVAL_LOADS]
    if unevaluated:
        context.log.warning(
            f"loads_pct {unevaluated} %: built, but eval__baselines and the training runs are partitioned by "
            f"{list(EVAL_LOADS)} % only, so these sequences are not evaluated"
        )
    long_running = _read_optional(warehouse, "core__long_running")
    assignments = _read_optional(warehouse, "ec__assignments")
    seq_cfg = SequenceConfig(
        loads_pct=tuple(config.loads_pct),
        step_bins=config.step_bins,
        seed=config.seed,
        n_train_sequences=config.n_train_sequences,
        n_test_sequences=config.n_test_sequences,
        arrival_steps=config.arrival_steps,
        load_resource=config.load_resource,
        rate_split=config.rate_split,
        min_workloads_per_split=config.min_split_workloads,
    )
    frames, notes, scales = [], {}, []
    counts = (
        long_running.group_by("source").len()
        if long_running is not None
        else pl.DataFrame(schema={"source": pl.String, "len": pl.UInt32})
    )
    for source, n in counts.sort("source").iter_rows():
        if n < config.min_workloads:
            context.log.warning(
                f"{source}: {n} long-running workload(s) < {config.min_workloads}; no sequences"
            )
            notes[source] = f"skipped: {n} long-running workloads"
            continue
        lr = long_running.filter(pl.col("source") == source)
        use = long_running_usage(warehouse, source, lr).collect()
        ec = assignments.filter(pl.col("source") == source) if assignments is not None else None
        df, stats = build_job_sequences(use, lr, ec, seq_cfg, log=context.log.info)
        frames.append(df)
        scales.append((source, *stats["usage_scale"][source], config.step_bins))
        notes[source] = {k: v for k, v in stats.items() if isinstance(v, int | float | str)}
        unassigned = stats.get("n_workloads_without_ec_label", {}).get(source, 0)
        notes[source]["n_workloads_without_ec_label"] = unassigned
        if unassigned:
            context.log.warning(f"{source}: {unassigned} workload(s) have no EC label and were given label 0")
    if config.include_synthetic:
        n = dict(
            n_train_sequences=config.n_train_sequences,
            n_test_sequences=config.n_test_sequences,
            loads_pct=tuple(config.loads_pct),
            seed=config.seed,
        )
        dp, _ = build_deepplace_sequences(dataclasses.replace(DeepPlaceConfig(), **n))
        frames += [dp, build_deeprm_sequences(dataclasses.replace(DeepRMConfig(), **n))]
    out = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=JOB_SEQUENCES)
    out = out.select([pl.col(c).cast(t) for c, t in JOB_SEQUENCES.items()])
    diversity = split_diversity(out, config.min_split_workloads)
    thin = diversity.filter(pl.col("is_too_few_workloads"))
    for row in thin.iter_rows(named=True):
        context.log.warning(
            f"{row['source']} {row['load_pct']} % {row['split']}: only {row['n_distinct_workloads']} distinct "
            f"workload(s) (< {config.min_split_workloads}); policies may not be separable on it"
        )
    yield Output(
        out,
        output_name="sim__job_sequences",
        metadata={
            "per_source": MetadataValue.json(notes),
            "split_diversity": MetadataValue.md(markdown_preview(diversity, n=diversity.height)),
            "thin_splits": MetadataValue.json(thin.select("source", "load_pct", "split").to_dicts()),
        },
    )
    clusters = source_clusters(out, seq_cfg)
    loads = offered_load_table(
        out,
        {s: m for s, (m, _) in clusters.items()},
        seq_cfg.capacity_units,
        {s: w for s, (_, w) in clusters.items()},
    )
    by_label = offered_load_check(loads, tolerance=config.load_tolerance)
    for row in by_label.filter(~pl.col("is_within_tolerance")).iter_rows(named=True):
        context.log.warning(
            f"{row['source']} {row['load_pct']} %: realised offered load {row['mean_offered_load']:.3f} "
            f"({row['ratio_to_label']:.2f} x the label)"
        )
    yield Output(
        loads.select([pl.col(c).cast(t) for c, t in OFFERED_LOAD.items()]),
        output_name="sim__offered_load",
        metadata={"by_label": MetadataValue.md(markdown_preview(by_label, n=by_label.height))},
    )
    yield Output(pl.DataFrame(scales, schema=USAGE_SCALE, orient="row"), output_name="sim__usage_scale")
    yield from sequence_checks(out, diversity, by_label)


class EvalConfig(Config):
    policies: list[str] = Field(
        default=sorted(p for p in POLICIES if not is_learned(p)),
        description="registered heuristics to evaluate (learned policies are evaluated by eval__results)",
    )
    seeds: list[int] = Field(default=[0, 1, 2], description="simulator/policy seeds per test sequence")
    n_machines: int = Field(default=10, description="M (TVW-RL: 10)")
    max_steps: int = Field(
        default=1000,
        description="safety cap in logical steps: an episode runs until every job is placed and finished; "
        "hitting the cap is a failure, reported per episode (is_truncated) and charged for unplaced jobs",
    )
    hold_rule: str = Field(
        default="always",
        description="'always' (DeepRM's void action) or 'no_fit' (TVW-RL: hold only when nothing fits)",
    )
    noise_max_units: int = Field(default=0, description="background noise 0..n units (robustness study: 1-3)")
    forecaster_preset: str = Field(
        default="sample",
        description="models.usage_forecast preset of the learned usage forecaster the forecast-driven rules use "
        f"(fitted per source and load on its training sequences; one of {sorted(FORECAST_PRESETS)})",
    )
    tuning_preset: str = Field(
        default="full",
        description=f"grid of knobs the fitted rules try on validation sequences ({sorted(TUNING_PRESETS)}; "
        "sim.tuning.TUNING_PRESETS)",
    )
    validation_share: float = Field(
        default=TuningConfig().validation_share,
        description="share of each (source, load)'s training sequences held out to choose the fitted rules' knobs "
        "(risk level, rho, mode, N, fallback heuristic); test sequences are never used",
    )


def EVAL_CHECKS_FOR(asset: str) -> list[AssetCheckSpec]:  # noqa: N802 (a constant per asset)
    """The checks of an evaluation table (`eval__baselines`, `eval__results`)."""
    return [
        AssetCheckSpec(
            "noop_has_the_worst_return",
            asset=asset,
            description=(
                "At every (source, load), the policy that never places has the lowest mean episode return: withholding "
                "work must never pay."
            ),
        ),
        AssetCheckSpec(
            "utilisation_within_capacity",
            asset=asset,
            description=(
                "No episode reports average utilisation above 1 (usage above capacity is overshoot, not utilisation)."
            ),
        ),
        AssetCheckSpec(
            "only_noop_hits_the_safety_cap",
            asset=asset,
            description=(
                "Every policy but noop finishes every episode before the safety cap (a truncated episode is a failure)."
            ),
        ),
        AssetCheckSpec(
            "one_row_per_episode",
            asset=asset,
            description=(
                "Exactly one row per (source, load, policy, test sequence, seed), and policies differ: not every policy "
                "gives identical numbers in a (source, load)."
            ),
        ),
    ]


EVAL_CHECKS = EVAL_CHECKS_FOR("eval__baselines")


def eval_checks(
    results: pl.DataFrame, n_expected: int, asset: str = "eval__baselines"
) -> list[AssetCheckResult]:
    """The EVAL_CHECKS_FOR(asset) results of an evaluation table."""
    mean = results.group_by("source", "load_pct", "policy").agg(pl.col("episode_return").mean())
    worst = mean.sort("episode_return").group_by("source", "load_pct").first()
    has_noop = "noop" in results["policy"].unique().to_list()
    bad_noop = worst.filter(pl.col("policy") != "noop") if has_noop else worst.head(0)
    util_cols = [c for c in results.columns if c.startswith("avg_util_")]
    over = results.filter(pl.any_horizontal(pl.col(c) > 1.0 + 1e-9 for c in util_cols))
    cut = results.filter((pl.col("policy") != "noop") & (pl.col("is_truncated") > 0))
    per_group = (
        results.drop("policy", "seed", "sequence_id")
        .group_by("source", "load_pct")
        .agg(pl.all().exclude("source", "load_pct").n_unique())
    )
    metric_cols = [c for c in per_group.columns if c not in ("source", "load_pct")]
    identical = per_group.filter(pl.all_horizontal(pl.col(c) <= 1 for c in metric_cols))
    dup = results.height - results.select(RESULT_KEY).unique().height
    return [
        AssetCheckResult(
            asset_key=asset,
            check_name="noop_has_the_worst_return",
            passed=has_noop and bad_noop.height == 0,
            metadata={
                "groups_where_another_policy_is_worst": MetadataValue.json(bad_noop.to_dicts()),
                "noop_evaluated": has_noop,
            },
        ),
        AssetCheckResult(
            asset_key=asset,
            check_name="utilisation_within_capacity",
            passed=over.height == 0,
            metadata={"n_rows_above_1": over.height},
        ),
        AssetCheckResult(
            asset_key=asset,
            check_name="only_noop_hits_the_safety_cap",
            passed=cut.height == 0,
            metadata={
                "n_truncated_episodes": cut.height,
                "policies": MetadataValue.json(sorted(set(cut["policy"].to_list()))),
            },
        ),
        AssetCheckResult(
            asset_key=asset,
            check_name="one_row_per_episode",
            passed=dup == 0 and results.height == n_expected and identical.height == 0,
            metadata={
                "n_rows": results.height,
                "n_expected": n_expected,
                "n_duplicate_keys": dup,
                "groups_with_identical_policies": MetadataValue.json(
                    identical.select("source", "load_pct").to_dicts()
                ),
            },
        ),
    ]


@asset(
    group_name="eval",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    check_specs=EVAL_CHECKS,
    partitions_def=EVAL_PARTITIONS,
)
def eval__baselines(context: AssetExecutionContext, config: EvalConfig, sim__job_sequences: pl.DataFrame):
    """One row per (source, load, policy, test sequence, seed) with every operational metric of TVW-RL
    (avg utilisation clipped at capacity and fragmentation per resource, overshoot %, machines used) plus
    contention, mean wait, jobs never placed, whether the episode hit the safety cap (`is_truncated`, a failure),
    the episode return (<= 0, higher is better) and its components as positive costs (`cost_*`, lower is
    better). Every policy of the `POLICIES` registry is evaluated, `noop` (never places) as the sanity floor.
    One partition per load (`load30`, `load50`, `load80`): each evaluates only the test sequences of its load,
    so the loads run side by side; readers get every partition concatenated."""
    if not context.has_partition_key:
        raise ValueError(
            "eval__baselines is partitioned by load: materialise one partition "
            f"({', '.join(EVAL_PARTITIONS.get_partition_keys())}; e.g. partition_key='load50'), or run eval_job"
        )
    load = parse_eval_partition(context.partition_key)
    # the simulator (EC label count) is sized on every load's sequences: a partition equals its rows of the
    # table evaluated whole
    cfg = eval_sim_config("eval__baselines", config, sim__job_sequences)
    jobs = sim__job_sequences.filter(pl.col("load_pct") == load)
    test = jobs.filter(pl.col("split") == "test")
    if test.is_empty():
        have = sorted(sim__job_sequences.filter(pl.col("split") == "test")["load_pct"].unique().to_list())
        raise ValueError(
            f"eval__baselines[{context.partition_key}]: sim__job_sequences has no test sequences at {load} % "
            f"(loads with test sequences: {have}); evaluate only the loads of sim__job_sequences.loads_pct"
        )
    choices: dict = {}
    results = evaluate_by_cluster(
        jobs,
        config.policies,
        cfg,
        config.seeds,
        log=context.log.info,
        tuning=tuning_of(config),
        forecaster_factory=forecaster_factory(config.forecaster_preset),
        choices=choices,
    )
    n_sequences = test.select("source", "load_pct", "sequence_id").unique().height
    n_expected = results.select("source", "load_pct", "sequence_id", "policy").unique().height * len(
        config.seeds
    )
    context.log.info(
        f"{load} %: {results.height} episodes evaluated ({len(config.policies)} policies, "
        f"{n_sequences} sequences)"
    )
    yield Output(
        results,
        metadata={
            "n_rows": results.height,
            "sim_config": MetadataValue.json(dataclasses.asdict(cfg)),
            "fitted_rule_choices": MetadataValue.json(_choices_json(choices)),
        },
    )
    yield from eval_checks(results, n_expected)


def tuning_of(config: EvalConfig) -> TuningConfig:
    """The fitted rules' TuningConfig of an evaluation config (ValueError naming an unknown preset)."""
    if config.tuning_preset not in TUNING_PRESETS:
        raise ValueError(f"unknown tuning_preset {config.tuning_preset!r}; known: {sorted(TUNING_PRESETS)}")
    return dataclasses.replace(
        TUNING_PRESETS[config.tuning_preset], validation_share=config.validation_share, seed=config.seeds[0]
    )


def _choices_json(choices: dict) -> dict:
    """What validation chose for each fitted rule, per "source load%" (the tried settings left out)."""
    return {
        f"{source} {load}%": {
            name: {k: v for k, v in knobs.items() if k != "tried"} for name, knobs in per_rule.items()
        }
        for (source, load), per_rule in choices.items()
    }


@asset(group_name="eval", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__summary(context: AssetExecutionContext, eval__baselines: pl.DataFrame) -> pl.DataFrame:
    """Mean and 95% interval of every metric per (source, load, policy) over test sequences (seeds averaged
    within a sequence first, so n = sequences); `episode_return` is higher-is-better, `cost_*`, overshoot,
    fragmentation, machines used and waits lower-is-better, utilisation higher-is-better (column `better`). The UI
    shows a TVW-RL Fig. 4/5 style plot per source (`plot_<source>`: utilisation, fragmentation, machines used,
    overshoot, jobs never placed per load). Reads every load partition of `eval__baselines`."""
    # partitions arrive load by load; the summary's per-group order (and so its float sums) follows the key
    summary = summarise(eval__baselines.sort(list(RESULT_KEY)))
    context.add_output_metadata(summary_plot_metadata(summary))
    return summary


class LabellingConfig(Config):
    ages_steps: list[int] = Field(
        default=[0, 1, 2, 4, 8, 16], description="job ages (steps observed) to score"
    )
    n_labels: int = Field(default=16, description="G: labels the simulator accepts")
    n_ages_per_job: int = Field(
        default=SimLabellerConfig.n_ages_per_job,
        description="sim_view labeller: random observed lengths per training job, besides age 0 "
        "(models.sim_labeller.SimLabellerConfig)",
    )
    seed: int = Field(
        default=SimLabellerConfig.seed, description="sim_view labeller: seed of its sampled ages and model"
    )


@asset(
    group_name="eval",
    io_manager_key="table_io",
    deps=["ec__classifier_accuracy"],
    kinds={"parquet", "polars"},
)
def eval__ec_labelling(
    context: AssetExecutionContext,
    config: LabellingConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
) -> pl.DataFrame:
    """TVW-RL Algorithm 1 in the simulator: how often a labeller, labelling test jobs from their meta on arrival
    (age 0) and from meta plus the usage observed so far as they run, agrees with the clustering label, per
    source, load, labeller and job age in steps, beside the best constant label (the most frequent EC of the
    source's training jobs) on the same jobs. Labellers: `sim_view` (`models.sim_labeller`, fitted here on the
    source's training sequences' jobs as the simulator shows them) and `classifier` (the saved EC classifier fed
    the simulator's quantised steps, where it exists). The UI shows accuracy against age, a panel per source and
    a line per load, one plot per labeller."""
    frames = []
    test_all = sim__job_sequences.filter(pl.col("split") == "test")
    train_all = sim__job_sequences.filter(pl.col("split") == "train")
    n_groups = (
        test_all.join(sim__usage_scale.select("source"), on="source").select("source", "load_pct").unique()
    )
    progress = Progress(n_groups.height, "EC labelling", log=context.log.info, unit="groups")
    fit_cfg = SimLabellerConfig(n_ages_per_job=config.n_ages_per_job, seed=config.seed)
    for source, cpu_scale, mem_scale, step_bins in sim__usage_scale.iter_rows():
        test = test_all.filter(pl.col("source") == source)
        train = train_all.filter(pl.col("source") == source)
        top = int(pl.concat([test["ec_label"], train["ec_label"]]).max() or 0)
        cfg = SimConfig(n_labels=max(config.n_labels, top + 1), oversize="clip")
        labellers = {}
        if train["ec_label"].n_unique() >= 2:
            labellers["sim_view"] = fit_sim_labeller(cfg, JobBatch.from_frame(train), fit_cfg)
        else:
            context.log.warning(f"{source}: training jobs hold fewer than 2 EC labels; no sim_view labeller")
        path = classifier_path(warehouse, source)
        if path.exists():
            labellers["classifier"] = ClassifierLabeller(
                path, prefix_bins_per_step=step_bins, usage_scale=(cpu_scale, mem_scale)
            )
        else:
            context.log.warning(f"{source}: no saved EC classifier at {path}; its rows are skipped")
        if not labellers:
            progress.advance(test["load_pct"].n_unique())
            continue
        constant = most_frequent_label(train["ec_label"].to_numpy()) if train.height else None
        for (load,), group in test.group_by("load_pct", maintain_order=True):
            jobs = JobBatch.from_frame(group)
            for name, labeller in labellers.items():
                acc = label_accuracy_by_age(labeller, cfg, jobs, config.ages_steps, constant_label=constant)
                frames.append(
                    acc.with_columns(
                        source=pl.lit(source), load_pct=pl.lit(load, pl.Int32), labeller=pl.lit(name)
                    )
                )
            progress.advance()
    key = {"source": pl.String, "load_pct": pl.Int32, "labeller": pl.String}
    if not frames:
        return pl.DataFrame(schema={**key, **LABEL_ACCURACY})
    out = pl.concat(frames).select(*key, *LABEL_ACCURACY).sort(*key, "age_steps")
    context.add_output_metadata(
        {
            f"plot_{name}": png_markdown(
                labelling_accuracy_plot(rows), f"EC labelling accuracy by job age: {name} labeller"
            )
            for (name,), rows in out.group_by("labeller", maintain_order=True)
        }
    )
    return out


class ForecastTableConfig(Config):
    preset: str = Field(
        default="sample",
        description=f"models.usage_forecast preset of the learned forecaster ({sorted(FORECAST_PRESETS)})",
    )
    origins_per_job: int = Field(
        default=2, description="running origins scored per test job (besides arrival)"
    )
    seed: int = Field(default=0, description="seed of the scored origins")


FORECAST_CHECKS = [
    AssetCheckSpec(
        "q95_covers_93_to_97_pct",
        asset="eval__forecast",
        description="The learned forecaster's 95 % quantile (with EC inputs) covers 93-97 % of the test steps of "
        "every (source, load) (WARN: usage in whole units can leave coverage above nominal).",
    ),
]


@asset(
    group_name="eval",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    check_specs=FORECAST_CHECKS,
)
def eval__forecast(
    context: AssetExecutionContext, config: ForecastTableConfig, sim__job_sequences: pl.DataFrame
):
    """How well each job's usage over the next H steps is forecast (issue "learned placement", item 1): per
    (source, load, forecaster, origin, horizon step, quantile level, resource) the pinball loss and the coverage
    of the quantile on the TEST sequences' jobs, at arrival (nothing observed) and at running origins. Forecasters:
    the learned calibrated one (`models.usage_forecast`) with and without EC inputs (the measured value of the
    ECs), and four baselines: the request, the EC per-age quantile, seasonal-naive and last-period max. Every
    forecaster is fitted on the (source, load)'s TRAINING sequences only."""
    if config.preset not in FORECAST_PRESETS:
        raise ValueError(
            f"eval__forecast: unknown preset {config.preset!r}; known: {sorted(FORECAST_PRESETS)}"
        )
    sim = SimConfig(n_labels=max(SimConfig().n_labels, int(sim__job_sequences["ec_label"].max() or 0) + 1))
    cells = sim__job_sequences.group_by("source", "load_pct").agg(
        has_train=(pl.col("split") == "train").any(), has_test=(pl.col("split") == "test").any()
    )
    usable = cells.filter(pl.col("has_train") & pl.col("has_test")).select("source", "load_pct")
    jobs = sim__job_sequences.join(usable, on=["source", "load_pct"], how="semi")
    # DeepRM's synthetic jobs are flat blocks (nothing to forecast) on its own single-pool cluster
    jobs = jobs.filter(pl.col("source") != DEEPRM_SOURCE)
    table, reports = forecast_tables_by_source(
        jobs,
        sim,
        FORECAST_PRESETS[config.preset],
        origins_per_job=config.origins_per_job,
        seed=config.seed,
        log=context.log.info,
    )
    summary = summarise_forecast_table(table, by=("source", "load_pct"))
    q95 = summary.filter(pl.col("forecaster") == "learned_with_ec")
    cov_col = "coverage_95" if "coverage_95" in q95.columns else None
    bad = q95.filter((pl.col(cov_col) < 0.93) | (pl.col(cov_col) > 0.97)) if cov_col else q95
    yield Output(
        table,
        metadata={
            "n_rows": table.height,
            "summary": MetadataValue.md(markdown_preview(summary, n=summary.height)),
            "fit_s": MetadataValue.json(
                {f"{k[0]} {k[1]}% {k[2]}": round(v["fit_s"], 1) for k, v in reports.items()}
            ),
        },
    )
    yield AssetCheckResult(
        asset_key="eval__forecast",
        check_name="q95_covers_93_to_97_pct",
        passed=cov_col is not None and bad.height == 0 and q95.height > 0,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "outside": MetadataValue.json(bad.to_dicts() if cov_col else []),
            "coverage_column": str(cov_col),
        },
    )


CLUSTER_ASSETS = [sim__job_sequences, eval__baselines, eval__summary, eval__ec_labelling, eval__forecast]
