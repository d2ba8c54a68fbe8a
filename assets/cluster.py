"""Job sequences for the simulator and the evaluation of every registered scheduler (TVW-RL "End-to-End
Evaluation", Fig. 4/5). These tables span every trace source and the synthetic workloads; the heuristic
evaluation (`eval__baselines`) is partitioned by load, so that its runs fan out, and read back whole."""

import dataclasses
from typing import Any

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetOut,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)

from assets.core import long_running_usage
from assets.ec import classifier_path
from assets.plots import labelling_accuracy_plot, png_markdown, summary_plot_metadata
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models.ec_labeller import ClassifierLabeller
from models.sim_labeller import LabellingSettings, labelling_accuracy
from models.usage_forecast import (
    COVERAGE_CHECK_DOCS,
    ForecastTableSettings,
    coverage_check,
    forecast_evaluation,
    forecaster_factory,
)
from pipelines.job_sequences import (
    SEQUENCE_CHECK_DOCS,
    sequence_check_values,
)
from pipelines.sequence_run import SequenceRunSettings, build_sequence_run
from pipelines.warehouse import markdown_preview
from sim.evaluate import (  # the evaluation's partitions and runs, re-exported for the other eval assets
    EVAL_CHECK_DOCS,
    EVAL_LOADS,
    RESULT_KEY,
    EvalSettings,
    eval_check_values,
    eval_partition_keys,
    eval_sim_config,
    evaluate_by_cluster,
    fitted_rule_choices,
    parse_eval_partition,
    sequences_at_load,
    summarise,
)

JobSequencesConfig = dataclass_config(SequenceRunSettings)
EvalConfig = dataclass_config(EvalSettings)
LabellingConfig = dataclass_config(LabellingSettings)
ForecastTableConfig = dataclass_config(ForecastTableSettings)

EVAL_PARTITIONS = StaticPartitionsDefinition(eval_partition_keys(EVAL_LOADS))
"""One `eval__baselines` partition per load ('load50'): every policy, source and seed at that load."""


def check_specs(asset: str, docs: dict[str, str]) -> list[AssetCheckSpec]:
    """One AssetCheckSpec of `asset` per check name -> description."""
    return [AssetCheckSpec(name, asset=asset, description=doc) for name, doc in docs.items()]


def check_results(
    values: dict[str, tuple[bool, dict[str, Any]]], asset: str | None = None, **kwargs
) -> list[AssetCheckResult]:
    """AssetCheckResults of (passed, metadata) per check name; lists and mappings become JSON metadata."""
    return [
        AssetCheckResult(
            check_name=name,
            passed=bool(passed),
            metadata={k: MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in meta.items()},
            **({"asset_key": asset} if asset else {}),
            **kwargs,
        )
        for name, (passed, meta) in values.items()
    ]


SEQUENCE_CHECKS = check_specs("sim__job_sequences", SEQUENCE_CHECK_DOCS)


def sequence_checks(
    jobs: pl.DataFrame, diversity: pl.DataFrame, by_label: pl.DataFrame | None = None
) -> list[AssetCheckResult]:
    """The SEQUENCE_CHECKS of a `sim__job_sequences` table (`pipelines.job_sequences.sequence_check_values`)."""
    return check_results(sequence_check_values(jobs, diversity, by_label))


def _table(description: str) -> AssetOut:
    return AssetOut(io_manager_key="table_io", kinds={"parquet", "polars"}, description=description)


@multi_asset(
    check_specs=SEQUENCE_CHECKS,
    outs={
        "sim__job_sequences": _table(
            "Job sequences for the simulator, one row per job: per (source, load, split, sequence) the arrival step, "
            "EC label, workload meta and quantised per-step CPU and memory units (C_d = 8) of a window cut from a "
            "long-running workload of `core__long_running` (`pipelines.job_sequences`; workloads larger than one "
            "machine named, set aside by `oversized_rule`) or a synthetic workload (`pipelines.synthetic`)."
        ),
        "sim__offered_load": _table(
            "Per job sequence, its realised offered load measured from its jobs alone (total work per resource / "
            "(M x C_d x arrival window)), per resource, their mean and the dominant resource's, and the peak "
            "demand as a fraction of the cluster: what the load label claims, checked."
        ),
        "sim__usage_scale": _table(
            "Per real source, the multipliers that mapped usage fractions to units (95th percentile of workload "
            "peaks -> 6 of 8 units) and the step length: what the EC labeller needs to turn units back into fractions."
        ),
    },
    deps=["core__usage", "core__long_running", "ec__assignments"],
    group_name="sim",
)
def sim__job_sequences(context: AssetExecutionContext, config: JobSequencesConfig, warehouse: Warehouse):
    settings = config.build()
    unevaluated = [load for load in settings.loads_pct if load not in EVAL_LOADS]
    if unevaluated:
        context.log.warning(
            f"loads_pct {unevaluated} %: built, but eval__baselines and the training runs are partitioned by "
            f"{list(EVAL_LOADS)} % only, so these sequences are not evaluated"
        )
    run = build_sequence_run(
        warehouse.scan("core__long_running").collect() if warehouse.has_table("core__long_running") else None,
        warehouse.scan("ec__assignments").collect() if warehouse.has_table("ec__assignments") else None,
        lambda source, lr: long_running_usage(warehouse, source, lr).collect(),
        settings,
        log=context.log.info,
    )
    for warning in run.warnings:
        context.log.warning(warning)
    thin = run.diversity.filter(pl.col("is_too_few_workloads"))
    metadata = {
        "per_source": MetadataValue.json(run.per_source),
        "split_diversity": MetadataValue.md(markdown_preview(run.diversity, n=run.diversity.height)),
        "thin_splits": MetadataValue.json(thin.select("source", "load_pct", "split").to_dicts()),
        "oversized_workloads": MetadataValue.json(run.oversized),
    }
    yield Output(run.jobs, output_name="sim__job_sequences", metadata=metadata)
    by_label = MetadataValue.md(markdown_preview(run.by_label, n=run.by_label.height))
    yield Output(run.offered_load, output_name="sim__offered_load", metadata={"by_label": by_label})
    yield Output(run.usage_scale, output_name="sim__usage_scale")
    yield from sequence_checks(run.jobs, run.diversity, run.by_label)


def EVAL_CHECKS_FOR(asset: str) -> list[AssetCheckSpec]:  # noqa: N802 (a constant per asset)
    """The checks of an evaluation table (`eval__baselines`, `eval__results`)."""
    return check_specs(asset, EVAL_CHECK_DOCS)


EVAL_CHECKS = EVAL_CHECKS_FOR("eval__baselines")


def eval_checks(
    results: pl.DataFrame, n_expected: int, asset: str = "eval__baselines"
) -> list[AssetCheckResult]:
    """The EVAL_CHECKS_FOR(asset) results of an evaluation table (`sim.evaluate.eval_check_values`)."""
    return check_results(eval_check_values(results, n_expected), asset=asset)


@asset(
    group_name="eval",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
    check_specs=EVAL_CHECKS,
    partitions_def=EVAL_PARTITIONS,
)
def eval__baselines(context: AssetExecutionContext, config: EvalConfig, sim__job_sequences: pl.DataFrame):
    """One row per (source, load, policy, test sequence, seed) with every metric of `sim.metrics` (TVW-RL's
    utilisation, fragmentation, overshoot %, machines used; waits, jobs never placed, `is_truncated`, the return
    and its costs `cost_*`) for the registered heuristics (`noop`, never placing, is the floor). One partition per
    load (`load30`, `load50`, `load80`), side by side; readers get every partition concatenated."""
    if not context.has_partition_key:
        raise ValueError(
            "eval__baselines is partitioned by load: materialise one partition "
            f"({', '.join(EVAL_PARTITIONS.get_partition_keys())}; e.g. partition_key='load50'), or run eval_job"
        )
    settings = config.build()
    load = parse_eval_partition(context.partition_key)
    # the simulator (EC label count) is sized on every load's sequences: a partition equals its rows of the
    # table evaluated whole
    cfg = eval_sim_config("eval__baselines", settings, sim__job_sequences)
    jobs = sequences_at_load(sim__job_sequences, load, f"eval__baselines[{context.partition_key}]")
    choices: dict = {}
    results = evaluate_by_cluster(
        jobs,
        settings.policies,
        cfg,
        settings.seeds,
        log=context.log.info,
        tuning=settings.tuning(),
        forecaster_factory=forecaster_factory(settings.forecaster_preset),
        choices=choices,
    )
    n_sequences = (
        jobs.filter(pl.col("split") == "test").select("source", "load_pct", "sequence_id").unique().height
    )
    episodes = results.select("source", "load_pct", "sequence_id", "policy").unique().height
    context.log.info(
        f"{load} %: {results.height} episodes evaluated ({len(settings.policies)} policies, "
        f"{n_sequences} sequences)"
    )
    metadata = {
        "n_rows": results.height,
        "sim_config": MetadataValue.json(dataclasses.asdict(cfg)),
        "fitted_rule_choices": MetadataValue.json(fitted_rule_choices(choices)),
    }
    yield Output(results, metadata=metadata)
    yield from eval_checks(results, episodes * len(settings.seeds))


@asset(group_name="eval", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__summary(context: AssetExecutionContext, eval__baselines: pl.DataFrame) -> pl.DataFrame:
    """Mean and 95% interval of every metric per (source, load, policy) over test sequences (`sim.evaluate.summarise`:
    seeds averaged within a sequence first; column `better` says which way is better), from every load partition of
    `eval__baselines`; a TVW-RL Fig. 4/5 style plot per source (`plot_<source>`)."""
    # partitions arrive load by load; the summary's per-group order (and so its float sums) follows the key
    summary = summarise(eval__baselines.sort(list(RESULT_KEY)))
    context.add_output_metadata(summary_plot_metadata(summary))
    return summary


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
    """TVW-RL Algorithm 1 in the simulator: how often a labeller agrees with the clustering label on test jobs,
    per source, load, labeller (`sim_view`, fitted on the training jobs; `classifier`, the saved EC classifier) and
    job age in steps, beside the best constant label (`models.sim_labeller.labelling_accuracy`); a plot of
    accuracy against age per labeller."""

    def classifier_for(source: str, step_bins: int, scale: tuple[float, float]):
        path = classifier_path(warehouse, source)
        if not path.exists():
            context.log.warning(f"{source}: no saved EC classifier at {path}; its rows are skipped")
            return None
        return ClassifierLabeller(path, prefix_bins_per_step=step_bins, usage_scale=scale)

    out = labelling_accuracy(
        sim__job_sequences,
        sim__usage_scale,
        config.build(),
        classifier_for,
        log=context.log.info,
        warn=context.log.warning,
    )
    context.add_output_metadata(
        {
            f"plot_{name}": png_markdown(
                labelling_accuracy_plot(rows), f"EC labelling accuracy by job age: {name} labeller"
            )
            for (name,), rows in out.group_by("labeller", maintain_order=True)
        }
    )
    return out


FORECAST_CHECKS = check_specs("eval__forecast", COVERAGE_CHECK_DOCS)


@asset(group_name="eval", io_manager_key="table_io", kinds={"parquet", "polars"}, check_specs=FORECAST_CHECKS)
def eval__forecast(
    context: AssetExecutionContext, config: ForecastTableConfig, sim__job_sequences: pl.DataFrame
):
    """How well each test job's usage over the next H steps is forecast: per (source, load, forecaster, origin,
    horizon step, quantile level, resource) the pinball loss and coverage, for the learned forecaster with and
    without EC inputs and four baselines, all fitted on training sequences (`models.usage_forecast`)."""
    table, reports, summary = forecast_evaluation(sim__job_sequences, config.build(), log=context.log.info)
    fit_s = {f"{k[0]} {k[1]}% {k[2]}": round(v["fit_s"], 1) for k, v in reports.items()}
    metadata = {
        "n_rows": table.height,
        "summary": MetadataValue.md(markdown_preview(summary, n=summary.height)),
        "fit_s": MetadataValue.json(fit_s),
    }
    yield Output(table, metadata=metadata)
    values = {"q95_covers_93_to_97_pct": coverage_check(summary)}
    yield from check_results(values, asset="eval__forecast", severity=AssetCheckSeverity.WARN)


CLUSTER_ASSETS = [sim__job_sequences, eval__baselines, eval__summary, eval__ec_labelling, eval__forecast]
