"""Equivalence classes (TVW-RL "Workload Equivalence-Class (EC) Mapping") in steps that fan out: one method's k
sweep and its Table 1 rows (a partition per source and method), then the choice over every row of the source, the
labels and each method's own mapping (a partition per source; each table selectable alone), then ClassifyToEC
(Algorithm 1) on the chosen labels. The logic and why the tables equal one computation: `models.ec_mapping`."""

import time
import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path

import polars as pl
from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetIn,
    AssetOut,
    BetaWarning,
    DimensionPartitionMapping,
    IdentityPartitionMapping,
    MetadataValue,
    MultiPartitionMapping,
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)

from assets import checks
from assets.column_docs import table_schema
from assets.core import SOURCE_PARTITIONS
from assets.plots import classifier_accuracy_plot, ec_profiles_plot, png_markdown
from assets.resources import Warehouse
from assets.settings import dataclass_config
from models import ec_mapping as ecm
from models.ec_classifier import (
    ACCURACY_CHECK_DOCS,
    ACCURACY_ROWS,
    ClassifierRunSettings,
    accuracy_and_model,
    accuracy_check_values,
    too_few_labelled,
)
from models.ec_labeller import classifier_labellers
from models.ec_serving import serving_path
from models.sim_labeller import served_labellers
from pipelines import equivalence as eq
from pipelines.features import SeriesSet, series_matrix
from pipelines.long_running import fill_window_gaps, long_running_usage
from sim.tuning import ChoiceMemo

EC_RUN = dataclass_config(ecm.EcRunSettings)
"""Config of ec__method_sweep, ec__method_gain and ec__mapping (`models.ec_mapping.EcRunSettings`)."""
CLASSIFIER_RUN = dataclass_config(ClassifierRunSettings)
"""Config of ec__classifier_accuracy (`models.ec_classifier.ClassifierRunSettings`)."""
CLASSIFIER_ACCURACY = {"source": pl.String, **ACCURACY_ROWS}

METHOD_PARTITIONS = StaticPartitionsDefinition(list(eq.EC_METHODS))
"""The EC distance methods (`pipelines.equivalence.EC_METHODS`)."""
SOURCE_METHOD_PARTITIONS = MultiPartitionsDefinition(
    {"source": SOURCE_PARTITIONS, "method": METHOD_PARTITIONS}
)
"""The EC method sweep fans out: a partition is (trace source, distance method), key '<method>|<source>'."""
with warnings.catch_warnings():  # both mappings are marked beta in Dagster 1.13; they are the documented way
    warnings.simplefilter("ignore", BetaWarning)
    SOURCE_OF = MultiToSingleDimensionPartitionMapping(partition_dimension_name="source")
    EVERY_METHOD_OF_SOURCE = MultiPartitionMapping(
        {
            "source": DimensionPartitionMapping("source", IdentityPartitionMapping()),
            "method": DimensionPartitionMapping("method", AllPartitionMapping()),
        }
    )
"""SOURCE_OF: a (source, method) partition reads its source's; EVERY_METHOD_OF_SOURCE: every method's of its
source (the table order, by which every mapping's random controls are drawn)."""


def _out(name: str, schema: dict, docs_of: str | None = None, **kwargs) -> AssetOut:
    """A table output: described by `models.ec_mapping.EC_DESCRIPTIONS`, columns by `assets.column_docs`."""
    columns = {"dagster/column_schema": table_schema(schema, docs_of or name)}
    return AssetOut(
        io_manager_key="table_io", description=ecm.EC_DESCRIPTIONS[name], metadata=columns, **kwargs
    )


def _source_and_method(context: AssetExecutionContext) -> tuple[str, str]:
    dims = SOURCE_METHOD_PARTITIONS.get_partition_key_from_str(str(context.partition_key)).keys_by_dimension
    return dims["source"], dims["method"]


def _usable_series(
    warehouse: Warehouse, source: str, long_running: pl.DataFrame, settings: ecm.EcRunSettings
) -> tuple[SeriesSet | None, str | None]:
    """The series every EC step clusters or scores, or why there is nothing to cluster."""
    if long_running.is_empty():
        return None, "no long-running workloads"
    # a kept window may bridge short gaps (pipelines.long_running.LongRunningConfig.max_gap_bins): filled here
    usage = fill_window_gaps(long_running_usage(warehouse, source, long_running), long_running)
    series = series_matrix(usage, long_running, None, max_bins=settings.series_max_bins)
    if series.n < settings.ec.k_min + 1:
        return series, f"{series.n} usable long-running workloads, fewer than k_min + 1"
    return series, None


def _bullets(lines: list[str]) -> MetadataValue:
    return MetadataValue.md("\n".join(f"- {n}" for n in lines))


@multi_asset(
    outs={
        "ec__sweep_silhouette": _out("ec__sweep_silhouette", eq.EC_SILHOUETTE, "ec__silhouette"),
        "ec__sweep_labels": _out("ec__sweep_labels", eq.EC_SWEEP_LABELS),
    },
    partitions_def=SOURCE_METHOD_PARTITIONS,
    group_name="ec",
    deps=[AssetDep("core__usage", partition_mapping=SOURCE_OF)],
    ins={"core__long_running": AssetIn(partition_mapping=SOURCE_OF)},
    check_specs=[*checks.specs("ec__sweep_silhouette"), *checks.specs("ec__sweep_labels")],
)
def ec__method_sweep(
    context: AssetExecutionContext, config: EC_RUN, warehouse: Warehouse, core__long_running: pl.DataFrame
):
    source, method = _source_and_method(context)
    settings = config.build()
    cfg = settings.ec
    series, why = None, f"method {method} is not configured (methods: {list(cfg.methods)})"
    if method in cfg.methods:
        series, why = _usable_series(warehouse, source, core__long_running, settings)
    silhouette, labels, note = (
        pl.DataFrame(schema=eq.EC_SILHOUETTE),
        pl.DataFrame(schema=eq.EC_SWEEP_LABELS),
        {},
    )
    if why:
        context.log.warning(f"{source} {method}: {why}; nothing clustered")
        metadata = note = {"note": MetadataValue.text(why)}
    else:
        sweep = eq.sweep_methods(series, source, replace(cfg, methods=(method,)), log=context.log.info)
        if sweep.warnings:
            context.log.warning(
                f"{source}: {len(sweep.warnings)} k/feature skips:\n" + "\n".join(sweep.warnings)
            )
        metadata = {"best_k": sweep.best_k[method] or 0, "notes": _bullets(sweep.notes)}
        metadata |= {"seconds": round(sweep.timings_s[method], 2), **sweep.counts}
        silhouette, labels = sweep.silhouette, eq.sweep_labels_frame(sweep, method)
    yield Output(silhouette, "ec__sweep_silhouette", metadata=metadata)
    yield Output(labels, "ec__sweep_labels", metadata=note)
    yield from checks.table_results("ec__sweep_silhouette", silhouette, may_be_empty=bool(why))
    all_skipped = bool(silhouette["is_skipped"].all())  # nothing clustered, or every k skipped
    yield from checks.table_results("ec__sweep_labels", labels, may_be_empty=all_skipped)


def _method_gain(context: AssetExecutionContext, settings, warehouse: Warehouse, silhouette, labels, lr):
    """(Table 1 rows of the partition's method, their metadata), or (no rows, None) with nothing to score."""
    source, method = _source_and_method(context)
    methods = settings.ec.methods
    if method not in methods:
        context.log.warning(f"{source} {method}: not configured (methods {list(methods)}); no rows")
        return pl.DataFrame(schema=ecm.METHOD_GAIN), None
    silhouette = ecm.of_source(silhouette, source, methods)
    keys = list(ecm.rules_of(silhouette, methods))
    if not any(m == method for m, _ in keys):
        context.log.warning(f"{source} {method}: no mapping to score (nothing clustered, or every k skipped)")
        return pl.DataFrame(schema=ecm.METHOD_GAIN), None
    series, why = _usable_series(warehouse, source, lr, settings)
    if why:
        raise ValueError(f"{source}: the stored sweeps have mappings but now {why}: re-run ec_sweep_job")
    note = ecm.unreachable_choice(len(keys), settings.gain)
    if note:
        context.log.warning(f"{source}: {note}")
    labels = labels.filter(pl.col("source") == source)
    rows, seconds, control_index = ecm.method_gain_rows(
        series, source, method, silhouette, labels, settings, log=context.log.info
    )
    return rows, {
        **{k: round(v, 2) for k, v in seconds.items()},
        "control_index": MetadataValue.json(control_index),
    }


@asset(
    partitions_def=SOURCE_METHOD_PARTITIONS,
    group_name="ec",
    io_manager_key="table_io",
    deps=[AssetDep("core__usage", partition_mapping=SOURCE_OF)],
    ins={
        "ec__sweep_silhouette": AssetIn(partition_mapping=EVERY_METHOD_OF_SOURCE),
        "ec__sweep_labels": AssetIn(),
        "core__long_running": AssetIn(partition_mapping=SOURCE_OF),
    },
    metadata={"dagster/column_schema": table_schema(ecm.METHOD_GAIN, "ec__method_comparison")},
    description=ecm.EC_DESCRIPTIONS["ec__method_gain"],
    check_specs=checks.specs("ec__method_gain"),
)
def ec__method_gain(
    context: AssetExecutionContext,
    config: EC_RUN,
    warehouse: Warehouse,
    ec__sweep_silhouette: pl.DataFrame,
    ec__sweep_labels: pl.DataFrame,
    core__long_running: pl.DataFrame,
):
    args = (ec__sweep_silhouette, ec__sweep_labels, core__long_running)
    rows, metadata = _method_gain(context, config.build(), warehouse, *args)
    yield Output(rows, metadata=metadata or {})
    yield from checks.table_results("ec__method_gain", rows, may_be_empty=metadata is None)


class _Emitter:
    """Yields only what the run selected: each of the EC tables (and its checks) can be materialised alone."""

    def __init__(self, context: AssetExecutionContext) -> None:
        self.outputs = set(context.selected_output_names)
        self.checks = {key.name for key in context.selected_asset_check_keys}

    def output(self, name: str, df: pl.DataFrame, metadata: dict | None = None):
        if name in self.outputs:
            yield Output(df, output_name=name, metadata=metadata or {})

    def check(self, name: str, passed: bool, metadata: dict):
        if name in self.checks:
            table = ecm.EC_MAPPING_CHECKS[name][0]
            yield AssetCheckResult(asset_key=table, check_name=name, passed=bool(passed), metadata=metadata)


def _empty_outputs(context: AssetExecutionContext, emit: _Emitter, why: str, done: tuple[str, ...] = ()):
    """Empty tables (and passing checks saying why) for every output not yet emitted (`done`)."""
    context.log.warning(f"{context.partition_key}: {why}; EC tables are empty for this source")
    for name, schema in ecm.EC_MAPPING_SCHEMAS.items():
        if name not in done:
            yield from emit.output(name, pl.DataFrame(schema=schema), {"note": MetadataValue.text(why)})
    for check, (table, _) in ecm.EC_MAPPING_CHECKS.items():
        if table not in done:
            yield from emit.check(check, True, {"note": MetadataValue.text(f"nothing clustered: {why}")})


@multi_asset(
    outs={name: _out(name, schema, is_required=False) for name, schema in ecm.EC_MAPPING_SCHEMAS.items()},
    partitions_def=SOURCE_PARTITIONS,
    group_name="ec",
    deps=["core__usage"],
    ins={
        "ec__sweep_silhouette": AssetIn(partition_mapping=SOURCE_OF),
        "ec__sweep_labels": AssetIn(partition_mapping=SOURCE_OF),
        "ec__method_gain": AssetIn(partition_mapping=SOURCE_OF),
    },
    can_subset=True,
    check_specs=[
        AssetCheckSpec(name, asset=table, description=description)
        for name, (table, description) in ecm.EC_MAPPING_CHECKS.items()
    ],
)
def ec__mapping(
    context: AssetExecutionContext,
    config: EC_RUN,
    warehouse: Warehouse,
    core__long_running: pl.DataFrame,
    ec__sweep_silhouette: pl.DataFrame,
    ec__sweep_labels: pl.DataFrame,
    ec__method_gain: pl.DataFrame,
):
    """Gathers the method sweeps and their Table 1 rows (ec_sweep_job, ec_gain_job), chooses the mapping and
    labels the workloads; clusters and fits nothing itself."""
    source, settings, emit = context.partition_key, config.build(), _Emitter(context)
    cfg, alpha = settings.ec, settings.gain.alpha
    series, why = _usable_series(warehouse, source, core__long_running, settings)
    for reason, n in series.skipped.group_by("reason").len().iter_rows() if series is not None else []:
        context.log.warning(f"{source}: {n} workload(s) skipped: {reason}")
    if why:
        yield from _empty_outputs(context, emit, why)
        return
    t_start = time.perf_counter()
    silhouette = ecm.of_source(ec__sweep_silhouette, source, cfg.methods)
    notes = eq.series_notes(series, cfg)
    yield from emit.output(
        "ec__silhouette",
        silhouette,
        {
            "plot": png_markdown(eq.plot_silhouette(silhouette), "silhouette against k"),
            "best_k": MetadataValue.json(eq.best_k(silhouette)),
            "notes": _bullets(notes),
        },
    )
    yield from emit.check("silhouette_row_per_method_and_k", *ecm.silhouette_check(silhouette, cfg))
    rules = ecm.rules_of(silhouette, cfg.methods)
    if not rules:
        yield from _empty_outputs(context, emit, "every k was skipped for every method", ("ec__silhouette",))
        return

    # Table 1 rows of every method, in table order, and the choice
    comparison, choice = ecm.comparison_and_choice(ec__method_gain, source, rules, alpha)
    (context.log.info if choice.method else context.log.warning)(f"{source}: {ecm.choice_message(choice)}")
    yield from emit.output(
        "ec__method_comparison",
        comparison,
        {
            **ecm.choice_summary(comparison, choice, settings.gain.n_seeds),
            "plot": png_markdown(
                eq.plot_gain_and_stability(comparison), "median paired gain and time stability against k"
            ),
            "table": MetadataValue.md(ecm.table_markdown(comparison)),
            "window_and_sampling": _bullets(notes),
            "forecaster": MetadataValue.json(ecm.forecaster_summary(settings)),
            "n_init": cfg.n_init,
        },
    )
    yield from emit.check("at_most_one_chosen_mapping", *ecm.chosen_check(comparison, choice))

    # labels of the chosen mapping and of each method's own choice, from the stored sweeps
    labels = ec__sweep_labels.filter(pl.col("source") == source)
    assignments, profiles = ecm.assignments_and_profiles(labels, choice, series, source)
    meta = {"method": str(choice.method), "k": choice.k or 0, "choice_basis": choice.basis}
    yield from emit.output("ec__assignments", assignments, meta)
    yield from emit.check(
        "labels_cover_every_kept_workload",
        *ecm.coverage_check(assignments, series, core__long_running, choice),
    )
    if "ec__profiles" in emit.outputs:
        plot = {"plot": png_markdown(ec_profiles_plot(profiles), "EC profiles")} if profiles.height else {}
        yield from emit.output("ec__profiles", profiles, plot)
    yield from emit.check("profiles_have_every_chosen_ec", *ecm.profiles_check(profiles, choice))
    per_method, picks = ecm.method_assignments(comparison, labels, cfg.methods, series.workload_ids, alpha)
    yield from emit.output(
        "ec__method_assignments",
        per_method,
        {"mappings": MetadataValue.json(picks), "seconds_choice": round(time.perf_counter() - t_start, 2)},
    )
    yield from emit.check(
        "chosen_mapping_equals_ec_assignments", *ecm.method_assignments_check(per_method, assignments, choice)
    )


def classifier_path(warehouse: Warehouse, source: str) -> Path:
    return Path(warehouse.root) / "models" / f"ec_classifier__{source}.pt"


def labellers(warehouse: Warehouse, usage_scale: pl.DataFrame, kind: str = "served"):
    """source -> the labeller serving its EC labels in the simulator, or None (`models.sim_labeller.served_labellers`;
    kind="classifier": the EC classifier's serving copy, trained without the test workloads, `models.ec_serving`)."""
    saved = partial(classifier_path, warehouse)
    classifier = classifier_labellers(lambda source: serving_path(saved(source)), usage_scale)
    return classifier if kind == "classifier" else served_labellers(saved, classifier)


def choice_memo(warehouse: Warehouse) -> ChoiceMemo:
    """`models/fit_choices/`: the fitted rules' validation choices, shared by eval__baselines and the placer's base."""
    return ChoiceMemo(Path(warehouse.root) / "models" / "fit_choices")


@asset(
    partitions_def=SOURCE_PARTITIONS,
    group_name="ec",
    io_manager_key="table_io",
    deps=["core__usage"],
    metadata={"dagster/column_schema": table_schema(CLASSIFIER_ACCURACY, "ec__classifier_accuracy")},
    description=ecm.EC_DESCRIPTIONS["ec__classifier_accuracy"],
    check_specs=checks.specs("ec__classifier_accuracy", ACCURACY_CHECK_DOCS),
)
def ec__classifier_accuracy(
    context: AssetExecutionContext,
    config: CLASSIFIER_RUN,
    warehouse: Warehouse,
    ec__assignments: pl.DataFrame,
    core__workloads: pl.DataFrame,
    core__long_running: pl.DataFrame,
):
    source, settings = context.partition_key, config.build()
    labelled = ec__assignments.join(core__workloads, on=["source", "workload_id"], how="inner")
    why = too_few_labelled(labelled, settings)
    if why:
        context.log.warning(f"{source}: {why}")
        yield Output(pl.DataFrame(schema=CLASSIFIER_ACCURACY))
        yield from checks.results(
            accuracy_check_values(pl.DataFrame(), why), severity=AssetCheckSeverity.WARN
        )
        return
    usage = fill_window_gaps(long_running_usage(warehouse, source, core__long_running), core__long_running)
    series = series_matrix(usage, core__long_running, None, max_bins=max((*settings.prefix_lengths, 1)))
    run = accuracy_and_model(labelled, series, settings, source)
    table = run.table.with_columns(source=pl.lit(source))
    path = classifier_path(warehouse, source)
    run.model.save(path, card=run.card)
    metadata = {
        "plot": png_markdown(classifier_accuracy_plot(table), "EC classifier accuracy against m"),
        "model_path": MetadataValue.path(str(path)),
        "model_card": MetadataValue.json(run.card),
        "n_labelled": run.n_labelled,
        "n_groups": run.n_groups,
        "split": table["split"][0],
    }
    yield Output(table.select(list(CLASSIFIER_ACCURACY)), metadata=metadata)
    yield from checks.results(accuracy_check_values(table), severity=AssetCheckSeverity.WARN)


EC_ASSETS = [ec__method_sweep, ec__method_gain, ec__mapping, ec__classifier_accuracy]
