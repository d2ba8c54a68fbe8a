"""Job sequences for the simulator and the evaluation of every registered scheduler (TVW-RL "End-to-End
Evaluation", Fig. 4/5). These tables span every trace source and the synthetic workloads; the heuristic
evaluation (`eval__baselines`) is partitioned by load, so that its runs fan out, and read back whole."""

import dataclasses
from functools import partial

import polars as pl
from dagster import (
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetOut,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)

from assets import checks
from assets.ec import choice_memo, classifier_path, labellers
from assets.plots import labelling_accuracy_plot, png_markdown, summary_plot_metadata
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models.ec_serving import (
    SERVING_CHECK_DOCS,
    SERVING_TABLE_DOCS,
    serving_check_values,
    serving_classifiers,
    with_served_labeller,
)
from models.sim_labeller import LabellingSettings, labelling_accuracy, serving_sim_labellers
from models.usage_forecast import (
    COVERAGE_CHECK_DOCS,
    ForecastTableSettings,
    coverage_check,
    fit_facts,
    forecast_evaluation,
    forecaster_factory,
)
from pipelines.job_sequences import (
    OFFERED_LOAD_CHECK_DOCS,
    SEQUENCE_CHECK_DOCS,
    SEQUENCE_TABLE_DOCS,
    offered_load_check_values,
    sequence_check_values,
)
from pipelines.long_running import long_running_usage
from pipelines.sequence_run import SequenceRunSettings, build_sequence_run
from pipelines.synthetic import is_synthetic
from pipelines.warehouse import markdown_preview
from sim.evaluate import (  # the evaluation's partitions and runs, re-exported for the other eval assets
    EVAL_CHECK_DOCS,
    EVAL_LOADS,
    RESULT_KEY,
    SUMMARY_CHECK_DOCS,
    EvalSettings,
    eval_check_values,
    eval_partition_keys,
    eval_sim_config,
    evaluate_by_cluster,
    fitted_rule_choices,
    parse_eval_partition,
    sequences_at_load,
    summarise,
    summary_check_values,
)

JobSequencesConfig = dataclass_config(SequenceRunSettings)
EvalConfig = dataclass_config(EvalSettings)
LabellingConfig = dataclass_config(LabellingSettings)
ForecastTableConfig = dataclass_config(ForecastTableSettings)

EVAL_PARTITIONS = StaticPartitionsDefinition(eval_partition_keys(EVAL_LOADS))
"""One `eval__baselines` partition per load ('load50'): every policy, source and seed at that load."""
EVAL_TABLE = {"group_name": "eval", "io_manager_key": "table_io", "kinds": {"parquet", "polars"}}
"""What every evaluation table is."""


SEQUENCE_CHECKS = [
    *checks.specs("sim__job_sequences", SEQUENCE_CHECK_DOCS),
    *checks.specs("sim__offered_load", OFFERED_LOAD_CHECK_DOCS),
    *checks.specs("sim__usage_scale"),
    *checks.specs("sim__ec_serving", SERVING_CHECK_DOCS),
]


def _table(description: str) -> AssetOut:
    return AssetOut(io_manager_key="table_io", kinds={"parquet", "polars"}, description=description)


@multi_asset(
    check_specs=SEQUENCE_CHECKS,
    outs={name: _table(text) for name, text in {**SEQUENCE_TABLE_DOCS, **SERVING_TABLE_DOCS}.items()},
    deps=["core__usage", "core__long_running", "ec__assignments", "ec__classifier_accuracy"],
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
    yield from checks.results(
        sequence_check_values(run.jobs, run.diversity, run.by_label), "sim__job_sequences"
    )
    yield from checks.results(offered_load_check_values(run.offered_load), "sim__offered_load")
    only_synthetic = all(map(is_synthetic, run.jobs["source"].unique()))
    yield from checks.table_results("sim__usage_scale", run.usage_scale, may_be_empty=only_synthetic)
    saved = partial(classifier_path, warehouse)
    serving = serving_classifiers(warehouse, run.jobs, saved, context.log.info)
    served = serving_sim_labellers(run.jobs, saved, settings.served_labeller, context.log.info)
    yield Output(serving := with_served_labeller(serving, served), output_name="sim__ec_serving")
    yield from checks.results(serving_check_values(serving), "sim__ec_serving")


EVAL_CHECKS = checks.specs("eval__baselines", EVAL_CHECK_DOCS)


@asset(**EVAL_TABLE, check_specs=EVAL_CHECKS, partitions_def=EVAL_PARTITIONS)
def eval__baselines(
    context: AssetExecutionContext,
    config: EvalConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
):
    """One row per (source, load, policy, test sequence, seed) with every `sim.metrics` metric (utilisation,
    overshoot %, machines, waits, `is_truncated`, return, ...) for the registered heuristics (noop: the floor),
    labels served by the EC classifier (`evaluate_policies`' serve_labels). One partition per load."""
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
    fit = {"tuning": settings.tuning(), "forecaster_factory": forecaster_factory(settings.forecaster_preset)}
    fit["choice_memo"] = choice_memo(warehouse)
    served = labellers(warehouse, sim__usage_scale)
    args = (jobs, settings.policies, cfg, settings.seeds)
    results = evaluate_by_cluster(*args, log=context.log.info, choices=choices, serve_labels=served, **fit)
    n_sequences = (
        jobs.filter(pl.col("split") == "test").select("source", "load_pct", "sequence_id").unique().height
    )
    episodes = results.select("source", "load_pct", "sequence_id", "policy").unique().height
    context.log.info(
        f"{load} %: {results.height} episodes ({len(settings.policies)} policies, {n_sequences} sequences)"
    )
    metadata = {
        "n_rows": results.height,
        "sim_config": MetadataValue.json(dataclasses.asdict(cfg)),
        "fitted_rule_choices": MetadataValue.json(fitted_rule_choices(choices)),
    }
    yield Output(results, metadata=metadata)
    yield from checks.results(eval_check_values(results, episodes * len(settings.seeds)), "eval__baselines")


@asset(**EVAL_TABLE, check_specs=checks.specs("eval__summary", SUMMARY_CHECK_DOCS))
def eval__summary(eval__baselines: pl.DataFrame):
    """Mean and 95% interval of every metric per (source, load, policy) over test sequences of every load of
    `eval__baselines` (`sim.evaluate.summarise`); a TVW-RL Fig. 4/5 style plot per source (`plot_<source>`)."""
    # partitions arrive load by load; the summary's per-group order (and so its float sums) follows the key
    summary = summarise(eval__baselines.sort(list(RESULT_KEY)))
    yield Output(summary, metadata=summary_plot_metadata(summary))
    yield from checks.results(summary_check_values(summary))


@asset(**EVAL_TABLE, deps=["ec__classifier_accuracy"], check_specs=checks.specs("eval__ec_labelling"))
def eval__ec_labelling(
    context: AssetExecutionContext,
    config: LabellingConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
):
    """TVW-RL Algorithm 1 in the simulator: how often a labeller (`sim_view`, `classifier`) agrees with the
    clustering label on test jobs, per source, load, labeller and job age, beside the best constant label
    (`models.sim_labeller.labelling_accuracy`)."""
    classifiers = labellers(warehouse, sim__usage_scale, kind="classifier")
    args = (sim__job_sequences, sim__usage_scale, config.build(), classifiers)
    out = labelling_accuracy(*args, log=context.log.info, warn=context.log.warning)
    title = "EC labelling accuracy by job age: {} labeller"
    by_labeller = out.group_by("labeller", maintain_order=True)
    plots = {
        f"plot_{n}": png_markdown(labelling_accuracy_plot(r), title.format(n)) for (n,), r in by_labeller
    }
    yield Output(out, metadata=plots)
    yield from checks.table_results("eval__ec_labelling", out)


FORECAST_CHECKS = checks.specs("eval__forecast", COVERAGE_CHECK_DOCS)


@asset(**EVAL_TABLE, deps=["ec__classifier_accuracy"], check_specs=FORECAST_CHECKS)
def eval__forecast(
    context: AssetExecutionContext,
    config: ForecastTableConfig,
    warehouse: Warehouse,
    sim__job_sequences: pl.DataFrame,
    sim__usage_scale: pl.DataFrame,
):
    """Pinball loss and coverage of each test job's usage forecast per (source, load, forecaster, origin, horizon
    step, level, resource): the learned forecaster with and without EC inputs (fitted and scored on the labels
    the EC classifier serves) and four baselines, all fitted on training sequences (`models.usage_forecast`)."""
    labels = labellers(warehouse, sim__usage_scale)
    table, reports, summary = forecast_evaluation(
        sim__job_sequences, config.build(), context.log.info, labels
    )
    metadata = {
        "n_rows": table.height,
        "summary": MetadataValue.md(markdown_preview(summary, n=summary.height)),
        "fits": MetadataValue.json(fit_facts(reports)),
    }
    yield Output(table, metadata=metadata)
    values = {"q95_covers_93_to_97_pct": coverage_check(summary)}
    yield from checks.results(values, "eval__forecast", AssetCheckSeverity.WARN)


CLUSTER_ASSETS = [sim__job_sequences, eval__baselines, eval__summary, eval__ec_labelling, eval__forecast]
