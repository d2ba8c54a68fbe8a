"""Equivalence classes (TVW-RL "Workload Equivalence-Class (EC) Mapping"), in three steps that fan out.

1. `ec__method_sweep` (a partition per source and distance method): clusters the training part (first
   `train_frac`) of every long-running workload's series with one distance (aggregate baseline, temporal
   features or DTW) for every k, and stores the silhouette rows and each k's labels (`ec__sweep_silhouette`,
   `ec__sweep_labels`).
2. `ec__method_gain` (a partition per source and method): scores the method at EVERY k of its sweep with the
   prediction-gain proxy over several forecaster seeds against random-partition controls (Table 1; several
   control draws per seed, averaged), with the ARI across clustering seeds and the stability over time (ARI
   between the clusterings of the two halves of every workload's window, with a shuffled reference).
3. `ec__mapping` (a partition per source): gathers them, corrects the paired sign-test p-values for every row
   of the source (Holm) and chooses the row with the largest median paired gain EG - control EG among those
   whose adjusted p is below 0.05 (ties: time stability, then smaller k); when none passes it chooses NOTHING
   (a warning, the reason in the metadata, empty EC labels). It also writes each method's own mapping
   (`ec__method_assignments`, for the EC-mapping ablation). `ec__classifier_accuracy` trains ClassifyToEC
   (Algorithm 1) on the chosen labels and measures it over repeated splits by workload group.

The tables equal those of one computation over every method: each mapping's random control is drawn with its
position among all the source's mappings. The `ec__mapping` tables can be selected alone (the others are then
not written), e.g. `dagster asset materialize -m assets.definitions --select ec__silhouette --partition <source>`.
"""

import re
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetIn,
    AssetOut,
    BetaWarning,
    Config,
    DimensionPartitionMapping,
    IdentityPartitionMapping,
    MetadataValue,
    MultiPartitionKey,
    MultiPartitionMapping,
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    Output,
    StaticPartitionsDefinition,
    asset,
    multi_asset,
)
from pydantic import Field

from assets.column_docs import table_schema
from assets.core import SOURCE_PARTITIONS, long_running_usage
from assets.plots import classifier_accuracy_plot, png_markdown
from assets.resources import Warehouse
from models.ec_classifier import (
    ACCURACY_ROWS,
    ClassifierConfig,
    classifier_accuracy_table,
    meta_matrix,
    train_classifier,
    usage_prefixes,
)
from models.forecaster import ForecasterConfig, paper_scale
from models.prediction_gain import (
    MAPPING_ROWS,
    P_HOLM,
    GainConfig,
    choose_mapping,
    mapping_gain_table,
    min_holm_p,
    with_holm,
)
from pipelines.equivalence import (
    EC_ASSIGNMENTS,
    EC_METHODS,
    EC_PROFILES,
    EC_SILHOUETTE,
    DtwConfig,
    EcConfig,
    ari_of_labels,
    assignments_frame,
    best_k,
    method_inputs,
    plot_gain_and_stability,
    plot_profiles,
    plot_silhouette,
    profiles_of,
    series_notes,
    sweep_methods,
    time_stability,
)
from pipelines.features import SeriesSet, series_matrix
from pipelines.long_running import fill_window_gaps

CLASSIFIER_ACCURACY = {"source": pl.String, **ACCURACY_ROWS}

"""Column descriptions of the EC tables (shown in the Dagster UI as the column schema)."""


def column_schema(schema: dict, table: str | None = None) -> dict:
    """Definition-time column schema with the descriptions of `assets.column_docs` (the one place for them)."""
    return {"dagster/column_schema": table_schema(schema, table)}


class EcRunConfig(Config):
    k_min: int = Field(default=3, description="smallest number of ECs tried (TVW-RL: 3)")
    k_max: int = Field(default=15, description="largest number of ECs tried (TVW-RL: 15)")
    n_init: int = Field(default=50, description="initialisations per k; silhouette averaged (TVW-RL: 50)")
    methods: list[str] = Field(default=["aggregate", "temporal", "dtw"], description="distances to compare")
    seed: int = Field(default=0, description="seed of every random choice in clustering and forecasting")
    train_frac: float = Field(
        default=0.7,
        description="leading fraction of each series that the clustering sees and the forecasters train on; "
        "the rest is the held-out window the proxy scores (never clustered)",
    )
    series_max_bins: int | None = Field(
        default=None,
        description="None = each workload's whole kept window (series of different lengths); N = its first N "
        "bins (a documented window)",
    )
    ari_seeds: int = Field(default=3, description="other clustering seeds the ARI across seeds is over")
    stability_shuffles: int = Field(
        default=200,
        description="label shuffles behind the reference (95th percentile) of the time-stability ARI",
    )
    dtw_window_frac: float | None = Field(
        default=None, description="Sakoe-Chiba radius / length; None = full DTW"
    )
    dtw_downsample: int = Field(default=1, description="average blocks of this many bins before DTW")
    dtw_exact_max_n: int = Field(default=500, description="exact DTW matrix up to this many workloads")
    dtw_sample_size: int = Field(default=300, description="above that: medoids found on a sample this big")
    forecaster_preset: str = Field(
        default="small",
        description="'small' (fast LSTNet for the proxy sweep) or 'paper' (Lai et al. 2018's settings, "
        "models.forecaster.paper_scale); the forecaster_* fields below override single settings",
    )
    forecaster_seeds: int = Field(
        default=10,
        description="forecaster seeds per mapping (means, intervals, paired sign test); the sign test's "
        "smallest p is 2^-seeds, so with m rows (every k of every method) a row can pass Holm only when "
        "m * 2^-seeds < alpha: 10 seeds allow up to 51 rows",
    )
    control_draws: int = Field(
        default=5,
        description="random-control permutations per forecaster seed, their EG averaged into the seed's "
        "control; each costs the mapping's fits again",
    )
    alpha: float = Field(
        default=0.05, description="family-wise level of the choice: Holm-adjusted sign-test p below it"
    )
    forecaster_epochs: int | None = Field(default=None, description="LSTNet epochs per fit; None = preset's")
    forecaster_min_steps: int | None = Field(
        default=None, description="least Adam steps per fit; None = preset's"
    )
    forecaster_window: int | None = Field(
        default=None, description="LSTNet input window, bins; None = preset's"
    )
    forecaster_hidden_size: int | None = Field(
        default=None, description="LSTNet GRU state size (hidRNN); None = preset's"
    )
    forecaster_conv_channels: int | None = Field(
        default=None, description="LSTNet convolution channels (hidCNN); None = preset's"
    )
    forecaster_max_train_windows: int | None = Field(
        default=None, description="training windows drawn per fit; None = preset's"
    )
    forecaster_max_eval_bins: int | None = Field(
        default=None,
        description="held-out bins scored per workload (first after the training part); None = all",
    )
    min_ec_members: int = Field(
        default=2, description="ECs with fewer workloads get G = 0 (too small for their own forecaster)"
    )


def _ec_config(c: EcRunConfig) -> EcConfig:
    dtw = DtwConfig(
        window_frac=c.dtw_window_frac,
        downsample=c.dtw_downsample,
        exact_max_n=c.dtw_exact_max_n,
        sample_size=c.dtw_sample_size,
        seed=c.seed,
    )
    return EcConfig(
        k_min=c.k_min,
        k_max=c.k_max,
        n_init=c.n_init,
        methods=tuple(c.methods),
        seed=c.seed,
        train_frac=c.train_frac,
        dtw=dtw,
    )


def forecaster_config(c: EcRunConfig) -> ForecasterConfig:
    """The preset with the configured overrides and the run's seed."""
    presets = {"small": ForecasterConfig, "paper": paper_scale}
    if c.forecaster_preset not in presets:
        raise ValueError(f"forecaster_preset must be one of {sorted(presets)}; got {c.forecaster_preset!r}")
    base = presets[c.forecaster_preset]()
    overrides = {
        "epochs": c.forecaster_epochs,
        "min_steps": c.forecaster_min_steps,
        "max_train_windows": c.forecaster_max_train_windows,
        "hidden_size": c.forecaster_hidden_size,
        "conv_channels": c.forecaster_conv_channels,
    }
    if c.forecaster_window is not None:
        overrides["window"] = c.forecaster_window
        overrides["ar_window"] = min(base.ar_window, c.forecaster_window)
    return replace(base, seed=c.seed, **{k: v for k, v in overrides.items() if v is not None})


def _gain_config(c: EcRunConfig) -> GainConfig:
    return GainConfig(
        forecaster=forecaster_config(c),
        train_frac=c.train_frac,
        n_seeds=c.forecaster_seeds,
        n_control_draws=c.control_draws,
        max_eval_bins=c.forecaster_max_eval_bins,
        min_members=c.min_ec_members,
        alpha=c.alpha,
    )


METHOD_PARTITIONS = StaticPartitionsDefinition(list(EC_METHODS))
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
"""SOURCE_OF: a (source, method) partition reads its source's partition, a source's partition every method's.
EVERY_METHOD_OF_SOURCE: a (source, method) partition reads every method's of its source (the table order, by
which every mapping's random controls are drawn)."""

EC_SWEEP_LABELS = {
    "source": pl.String,
    "workload_id": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "ec_label": pl.Int64,
    "is_medoid": pl.Boolean,
}
"""`ec__sweep_labels`: the kept labels of every k a method clustered (skipped k have none)."""
METHOD_GAIN = {
    "source": pl.String,
    **MAPPING_ROWS,
    "silhouette": pl.Float64,
    "silhouette_sd": pl.Float64,
    "ari_across_seeds": pl.Float64,
    "ari_across_seeds_min": pl.Float64,
    "ari_time_halves": pl.Float64,
    "ari_time_halves_shuffled_95": pl.Float64,
}
"""`ec__method_gain`: Table 1 rows of one method's mappings (ec__method_comparison without the choice)."""
METHOD_COMPARISON = {
    **METHOD_GAIN,
    P_HOLM: pl.Float64,
    "beats_control": pl.Boolean,
    "is_chosen": pl.Boolean,
    "choice_basis": pl.String,
    "choice_reason": pl.String,
}
EC_MAPPING_TABLES = (
    "ec__silhouette",
    "ec__method_comparison",
    "ec__assignments",
    "ec__profiles",
    "ec__method_assignments",
)
EC_MAPPING_SCHEMAS = dict(
    zip(
        EC_MAPPING_TABLES,
        (EC_SILHOUETTE, METHOD_COMPARISON, EC_ASSIGNMENTS, EC_PROFILES, EC_ASSIGNMENTS),
        strict=True,
    )
)


def _source_and_method(context: AssetExecutionContext) -> tuple[str, str]:
    key = context.partition_key
    dims = key.keys_by_dimension if isinstance(key, MultiPartitionKey) else None
    if dims is None:
        dims = SOURCE_METHOD_PARTITIONS.get_partition_key_from_str(str(key)).keys_by_dimension
    return dims["source"], dims["method"]


def _usable_series(
    warehouse: Warehouse, source: str, long_running: pl.DataFrame, config: EcRunConfig
) -> tuple[SeriesSet | None, str | None]:
    """The series every EC step clusters or scores, or why there is nothing to cluster."""
    if long_running.is_empty():
        return None, "no long-running workloads"
    # a kept window may bridge short gaps (pipelines.long_running.LongRunningConfig.max_gap_bins): filled here
    usage = fill_window_gaps(long_running_usage(warehouse, source, long_running), long_running)
    series = series_matrix(usage, long_running, None, max_bins=config.series_max_bins)
    if series.n < config.k_min + 1:
        return series, f"{series.n} usable long-running workloads, fewer than k_min + 1"
    return series, None


def _of_source(table: pl.DataFrame, source: str, methods: tuple[str, ...]) -> pl.DataFrame:
    """The rows of `source`, of the configured methods only, in their configured order (a stored partition of
    a method not configured now is left out)."""
    rows = table.filter(pl.col("source") == source)
    return pl.concat([rows.filter(pl.col("method") == m) for m in methods], how="vertical_relaxed")


def _labelled_ks(silhouette: pl.DataFrame, methods: tuple[str, ...]) -> dict[str, set[int]]:
    """Method -> the k it has labels for (the k not skipped), every configured method present."""
    kept = silhouette.filter(~pl.col("is_skipped"))
    return {m: set(kept.filter(pl.col("method") == m)["k"].to_list()) for m in methods}


def k_rules(best: dict[str, int | None], labelled: dict[str, set[int]]) -> dict[tuple[str, int], str]:
    """The mappings Table 1 scores, in table order: every (method, k) with labels, methods in configured order
    and k ascending -> "silhouette_best" (the method's k of highest mean silhouette) or "sweep". A mapping's
    position in this order is the index its random controls are drawn with (`mapping_gain_table`'s
    control_index), whichever step scores it."""
    return {
        (method, k): "silhouette_best" if k == best.get(method) else "sweep"
        for method, ks in labelled.items()
        for k in sorted(ks)
    }


def _rules_of(silhouette: pl.DataFrame, config: EcRunConfig) -> dict[tuple[str, int], str]:
    methods = tuple(config.methods)
    best = {m: best_k(silhouette.filter(pl.col("method") == m)).get(m) for m in methods}
    return k_rules(best, _labelled_ks(silhouette, methods))


def _labels_array(labels: pl.DataFrame, method: str, k: int, workload_ids: np.ndarray) -> pl.DataFrame:
    """The stored labels of (method, k), in the order of `workload_ids` (the series order); raises naming the
    mapping when the stored sweep does not cover exactly these workloads (a sweep older than the series)."""
    rows = labels.filter((pl.col("method") == method) & (pl.col("k") == k))
    stored = rows["workload_id"].to_list()
    if stored != workload_ids.tolist():
        raise ValueError(
            f"ec__sweep_labels ({method}, k={k}) of {rows['source'][0] if rows.height else '?'} holds "
            f"{len(stored)} workloads, not the {len(workload_ids)} usable long-running ones in the same order: "
            "re-run ec_sweep_job for this source"
        )
    return rows


def _medoids(rows: pl.DataFrame) -> np.ndarray | None:
    """Workload indices of the medoids in label order (DTW), None for K-Means methods (no medoid stored)."""
    idx = np.flatnonzero(rows["is_medoid"].to_numpy())
    if not len(idx):
        return None
    return idx[np.argsort(rows["ec_label"].to_numpy()[idx], kind="stable")]


class _Emitter:
    """Yields only what the run selected: each of the EC tables (and its checks) can be materialised alone."""

    def __init__(self, context: AssetExecutionContext) -> None:
        self.outputs = set(context.selected_output_names)
        self.checks = {key.name for key in context.selected_asset_check_keys}

    def output(self, name: str, df: pl.DataFrame, metadata: dict | None = None):
        if name in self.outputs:
            yield Output(df, output_name=name, metadata=metadata or {})

    def check(self, asset: str, name: str, passed: bool, metadata: dict):
        if name in self.checks:
            yield AssetCheckResult(asset_key=asset, check_name=name, passed=bool(passed), metadata=metadata)


def _empty_outputs(context: AssetExecutionContext, emit: _Emitter, why: str, done: tuple[str, ...] = ()):
    """Empty tables (and passing checks saying why) for every output not yet emitted (`done`)."""
    context.log.warning(f"{context.partition_key}: {why}; EC tables are empty for this source")
    note = {"note": MetadataValue.text(why)}
    for name, schema in EC_MAPPING_SCHEMAS.items():
        if name not in done:
            yield from emit.output(name, pl.DataFrame(schema=schema), note)
    for table, check in CHECKS:
        if table not in done:
            yield from emit.check(
                table, check, True, {"note": MetadataValue.text(f"nothing clustered: {why}")}
            )


CHECKS = (
    ("ec__silhouette", "silhouette_row_per_method_and_k"),
    ("ec__assignments", "labels_cover_every_kept_workload"),
    ("ec__method_comparison", "at_most_one_chosen_mapping"),
    ("ec__method_assignments", "chosen_mapping_equals_ec_assignments"),
)


@multi_asset(
    outs={
        "ec__sweep_silhouette": AssetOut(
            io_manager_key="table_io",
            description="One method's k sweep on one source (a partition per source and method): mean "
            "silhouette over the initialisations, with its sd, for every k, on the training part of each "
            "series. ec__silhouette gathers every method's rows.",
            metadata=column_schema(EC_SILHOUETTE, "ec__silhouette"),
        ),
        "ec__sweep_labels": AssetOut(
            io_manager_key="table_io",
            description="One method's k sweep on one source: the kept (lowest-cost) labels of every k that "
            "was not skipped, one row per (k, workload), in the series order; DTW marks each EC's medoid.",
            metadata=column_schema(EC_SWEEP_LABELS, "ec__sweep_labels"),
        ),
    },
    partitions_def=SOURCE_METHOD_PARTITIONS,
    group_name="ec",
    deps=[AssetDep("core__usage", partition_mapping=SOURCE_OF)],
    ins={"core__long_running": AssetIn(partition_mapping=SOURCE_OF)},
)
def ec__method_sweep(
    context: AssetExecutionContext,
    config: EcRunConfig,
    warehouse: Warehouse,
    core__long_running: pl.DataFrame,
):
    source, method = _source_and_method(context)
    cfg = _ec_config(config)
    series, why = None, f"method {method} is not configured (methods: {list(cfg.methods)})"
    if method in cfg.methods:
        series, why = _usable_series(warehouse, source, core__long_running, config)
    if why:
        context.log.warning(f"{source} {method}: {why}; nothing clustered")
        note = {"note": MetadataValue.text(why)}
        yield Output(pl.DataFrame(schema=EC_SILHOUETTE), "ec__sweep_silhouette", metadata=note)
        yield Output(pl.DataFrame(schema=EC_SWEEP_LABELS), "ec__sweep_labels", metadata=note)
        return
    sweep = sweep_methods(series, source, replace(cfg, methods=(method,)), log=context.log.info)
    if sweep.warnings:
        context.log.warning(f"{source}: {len(sweep.warnings)} k/feature skips:\n" + "\n".join(sweep.warnings))
    yield Output(
        sweep.silhouette,
        "ec__sweep_silhouette",
        metadata={
            "best_k": sweep.best_k[method] or 0,
            "notes": MetadataValue.md("\n".join(f"- {n}" for n in sweep.notes)),
            "seconds": round(sweep.timings_s[method], 2),
            **sweep.counts,
        },
    )
    yield Output(sweep_labels_frame(sweep, method), "ec__sweep_labels")


def sweep_labels_frame(sweep, method: str) -> pl.DataFrame:
    """`ec__sweep_labels` rows of one method's sweep: every k with labels, workloads in the series order."""
    frames = []
    for k in sorted(sweep.labels[method]):
        labels = sweep.labels[method][k]
        is_medoid = np.zeros(len(labels), dtype=bool)
        medoids = sweep.medoids.get(method, {}).get(k)
        if medoids is not None:
            is_medoid[medoids] = True
        frames.append(
            assignments_frame(sweep, method, k).with_columns(is_medoid=pl.Series(is_medoid, dtype=pl.Boolean))
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=EC_SWEEP_LABELS)


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
    metadata=column_schema(METHOD_GAIN, "ec__method_comparison"),
    description="TVW-RL Table 1 rows of one method's mappings on one source (a partition per source and "
    "method): the method at every k of its sweep, each over forecaster seeds against random controls (several "
    "draws per seed), with the silhouette, the ARI across clustering seeds and the stability over time (ARI "
    "between the clusterings of the two halves of each workload's window, and its shuffled 95 % reference). "
    "The random controls of a mapping are drawn with its position among every method's mappings (this step "
    "reads every method's sweep of its source), so the rows equal those of one table over all methods. "
    "ec__method_comparison gathers them, adds the Holm-adjusted p-values and marks the choice.",
)
def ec__method_gain(
    context: AssetExecutionContext,
    config: EcRunConfig,
    warehouse: Warehouse,
    ec__sweep_silhouette: pl.DataFrame,
    ec__sweep_labels: pl.DataFrame,
    core__long_running: pl.DataFrame,
) -> pl.DataFrame:
    source, method = _source_and_method(context)
    cfg = _ec_config(config)
    if method not in cfg.methods:
        context.log.warning(f"{source} {method}: not configured (methods {list(cfg.methods)}); no rows")
        return pl.DataFrame(schema=METHOD_GAIN)
    silhouette = _of_source(ec__sweep_silhouette, source, cfg.methods)
    rules = _rules_of(silhouette, config)
    keys = list(rules)
    own = [key for key in keys if key[0] == method]
    if not own:
        context.log.warning(f"{source} {method}: no mapping to score (nothing clustered, or every k skipped)")
        return pl.DataFrame(schema=METHOD_GAIN)
    series, why = _usable_series(warehouse, source, core__long_running, config)
    if why:
        raise ValueError(f"{source}: the stored sweeps have mappings but now {why}: re-run ec_sweep_job")
    gain_cfg = _gain_config(config)
    if min_holm_p(gain_cfg.n_seeds, len(keys)) >= gain_cfg.alpha:
        context.log.warning(
            f"{source}: {len(keys)} rows with forecaster_seeds={gain_cfg.n_seeds}: the smallest Holm-adjusted "
            f"sign-test p is {min_holm_p(gain_cfg.n_seeds, len(keys)):.3g} >= alpha {gain_cfg.alpha}, so no "
            "mapping can be chosen; use more seeds or fewer k"
        )
    labels = ec__sweep_labels.filter(pl.col("source") == source)
    mappings = {key: _labels_array(labels, *key, series.workload_ids)["ec_label"].to_numpy() for key in own}
    t0 = time.perf_counter()
    table = mapping_gain_table(
        series.series_list(),
        mappings,
        gain_cfg,
        rules,
        log=context.log.info,
        label=f"{source} {method} Table 1 ({gain_cfg.n_seeds} forecaster seeds)",
        control_index={key: keys.index(key) for key in own},
    )
    t_forecast = time.perf_counter() - t0
    t0 = time.perf_counter()
    inputs = method_inputs(series, method, cfg) if config.ari_seeds else None
    aris = []
    for key in own:
        a = (
            ari_of_labels(mappings[key], inputs, method, key[1], cfg, config.ari_seeds)
            if inputs is not None
            else []
        )
        aris.append((*key, float(np.mean(a)) if a else None, float(np.min(a)) if a else None))
    ari = pl.DataFrame(
        aris,
        schema={
            "method": pl.String,
            "k": pl.Int64,
            "ari_across_seeds": pl.Float64,
            "ari_across_seeds_min": pl.Float64,
        },
        orient="row",
    )
    t_ari = time.perf_counter() - t0
    t0 = time.perf_counter()
    stability = time_stability(series, method, [k for _, k in own], cfg, config.stability_shuffles)
    sil = silhouette.select("method", "k", "silhouette", "silhouette_sd")
    rows = (
        table.with_columns(source=pl.lit(source))
        .join(sil, on=["method", "k"], how="left")
        .join(ari, on=["method", "k"], how="left")
        .join(stability, on=["method", "k"], how="left")
        .select(list(METHOD_GAIN))
    )
    context.add_output_metadata(
        {
            "seconds_forecaster": round(t_forecast, 2),
            "seconds_ari": round(t_ari, 2),
            "seconds_time_stability": round(time.perf_counter() - t0, 2),
            "control_index": MetadataValue.json({f"{m} k={k}": keys.index((m, k)) for m, k in own}),
        }
    )
    return rows


@multi_asset(
    outs={
        "ec__silhouette": AssetOut(
            io_manager_key="table_io",
            is_required=False,
            description="Mean silhouette (averaged over the initialisations, with its sd) for every (method, k), "
            "k = 3..15, on the training part of each series; the k with the highest mean is each method's "
            "silhouette-best k. Skipped k (too few workloads, identical points) carry the reason.",
            metadata=column_schema(EC_SILHOUETTE, "ec__silhouette"),
        ),
        "ec__method_comparison": AssetOut(
            io_manager_key="table_io",
            is_required=False,
            description="TVW-RL Table 1 with seeds, one row per distance method and k of its sweep: the effective "
            "prediction gain EG (%) and the fraction f of workloads in ECs whose own forecaster beats the "
            "EC-agnostic one, as means with 95 % intervals over forecaster seeds, beside random controls (same "
            "class sizes, labels shuffled; several draws per seed, averaged) and the PAIRED difference EG - "
            "control EG per seed (same seed, same EC-agnostic model): its mean with a t-interval and its median "
            "with a distribution-free sign-test interval, the sign-test p-value and its Holm adjustment over "
            "every row of the source. The chosen row (`is_chosen`) has the largest median paired gain among the "
            "rows whose adjusted p is below 0.05 (ties: the higher time stability `ari_time_halves`, then the "
            "smaller k); the mean EG is reported but never chosen by (one seed with a poor EC-agnostic model "
            "can multiply it). When no row passes, none is chosen and `choice_reason` says why.",
            metadata=column_schema(METHOD_COMPARISON, "ec__method_comparison"),
        ),
        "ec__assignments": AssetOut(
            io_manager_key="table_io",
            is_required=False,
            description="The chosen EC mapping: the EC label of every usable long-running workload (empty when "
            "no mapping is chosen).",
            metadata=column_schema(EC_ASSIGNMENTS, "ec__assignments"),
        ),
        "ec__profiles": AssetOut(
            io_manager_key="table_io",
            is_required=False,
            description="Each EC's representative usage series (medoid for DTW, members' mean otherwise).",
            metadata=column_schema(EC_PROFILES, "ec__profiles"),
        ),
        "ec__method_assignments": AssetOut(
            io_manager_key="table_io",
            is_required=False,
            description="One EC mapping per distance method (for the EC-mapping ablation, TVW-RL Table 2): the "
            "mapping the choice rule picks among that method's rows of ec__method_comparison (Holm-adjusted over "
            "every row of the source): the largest median paired gain among its rows that pass; if none does, the "
            "method at its silhouette-best k. The chosen method's rows equal ec__assignments (same labels, same "
            "order); the metadata says how each mapping was picked.",
            metadata=column_schema(EC_ASSIGNMENTS, "ec__method_assignments"),
        ),
    },
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
        AssetCheckSpec(
            "silhouette_row_per_method_and_k",
            asset="ec__silhouette",
            description="a row for every configured method and every k in k_min..k_max",
        ),
        AssetCheckSpec(
            "labels_cover_every_kept_workload",
            asset="ec__assignments",
            description="every kept long-running workload has exactly one label, except those skipped for "
            "unusable series",
        ),
        AssetCheckSpec(
            "at_most_one_chosen_mapping",
            asset="ec__method_comparison",
            description="at most one chosen row (none when no row passes the Holm-corrected test); a chosen row "
            "passes it",
        ),
        AssetCheckSpec(
            "chosen_mapping_equals_ec_assignments",
            asset="ec__method_assignments",
            description="at most one mapping per method, and the chosen method's rows equal ec__assignments",
        ),
    ],
)
def ec__mapping(
    context: AssetExecutionContext,
    config: EcRunConfig,
    warehouse: Warehouse,
    core__long_running: pl.DataFrame,
    ec__sweep_silhouette: pl.DataFrame,
    ec__sweep_labels: pl.DataFrame,
    ec__method_gain: pl.DataFrame,
):
    """Gathers the method sweeps and their Table 1 rows (ec_sweep_job, ec_gain_job), chooses the mapping and
    labels the workloads; clusters and fits nothing itself."""
    source = context.partition_key
    cfg = _ec_config(config)
    emit = _Emitter(context)
    series, why = _usable_series(warehouse, source, core__long_running, config)
    if series is not None:
        for row in series.skipped.group_by("reason").len().iter_rows():
            context.log.warning(f"{source}: {row[1]} workload(s) skipped: {row[0]}")
    if why:
        yield from _empty_outputs(context, emit, why)
        return
    t_start = time.perf_counter()
    silhouette = _of_source(ec__sweep_silhouette, source, cfg.methods)
    best = best_k(silhouette)
    notes = series_notes(series, cfg)
    yield from emit.output(
        "ec__silhouette",
        silhouette,
        {
            "plot": png_markdown(plot_silhouette(silhouette), "silhouette against k"),
            "best_k": MetadataValue.json(best),
            "notes": MetadataValue.md("\n".join(f"- {n}" for n in notes)),
        },
    )
    yield from emit.check(*CHECKS[0], *_silhouette_check(silhouette, cfg))
    rules = _rules_of(silhouette, config)
    if not rules:
        yield from _empty_outputs(context, emit, "every k was skipped for every method", ("ec__silhouette",))
        return

    # Table 1 rows of every method, in table order, and the choice
    gain_cfg = _gain_config(config)
    comparison = with_holm(_gathered_rows(ec__method_gain, source, rules), gain_cfg.alpha)
    choice = choose_mapping(comparison, gain_cfg.alpha)
    comparison = comparison.with_columns(
        is_chosen=pl.lit(False)
        if choice.method is None  # no mapping chosen: no row is
        else (pl.col("method") == choice.method) & (pl.col("k") == choice.k),
        choice_basis=pl.lit(choice.basis),
        choice_reason=pl.lit(choice.reason),
    ).select(list(METHOD_COMPARISON))
    if choice.method is None:
        context.log.warning(
            f"{source}: NO EC MAPPING CHOSEN: {choice.reason}. ec__assignments and ec__profiles are empty; "
            "the job sequences give every workload EC label 0 and no EC classifier is trained"
        )
    else:
        context.log.info(f"{source}: EC mapping choice ({choice.basis}): {choice.reason}")
    yield from emit.output(
        "ec__method_comparison",
        comparison,
        {
            "chosen": f"{choice.method}, k={choice.k}" if choice.method else "none",
            "choice_basis": choice.basis,
            "choice_reason": MetadataValue.text(choice.reason),
            "n_rows": comparison.height,
            "n_rows_passing_holm": int(comparison["beats_control"].sum()),
            "smallest_reachable_holm_p": min_holm_p(gain_cfg.n_seeds, comparison.height),
            "plot": png_markdown(
                plot_gain_and_stability(comparison), "median paired gain and time stability against k"
            ),
            "table": MetadataValue.md(_table_markdown(comparison)),
            "window_and_sampling": MetadataValue.md("\n".join(f"- {n}" for n in notes)),
            "forecaster": MetadataValue.json(
                {
                    **{k: v for k, v in vars(gain_cfg.forecaster).items()},
                    "preset": config.forecaster_preset,
                    "n_seeds": gain_cfg.n_seeds,
                    "n_control_draws": gain_cfg.n_control_draws,
                    "train_frac": gain_cfg.train_frac,
                    "max_eval_bins": gain_cfg.max_eval_bins,
                }
            ),
            "n_init": cfg.n_init,
        },
    )
    yield from emit.check(*CHECKS[2], *_chosen_check(comparison, choice))

    # labels of the chosen mapping and of each method's own choice, from the stored sweeps
    labels = ec__sweep_labels.filter(pl.col("source") == source)
    chosen_rows = (
        _labels_array(labels, choice.method, choice.k, series.workload_ids) if choice.method else None
    )
    labels_df = (
        chosen_rows.select(list(EC_ASSIGNMENTS))
        if chosen_rows is not None
        else pl.DataFrame(schema=EC_ASSIGNMENTS)
    )
    yield from emit.output(
        "ec__assignments",
        labels_df,
        {"method": str(choice.method), "k": choice.k or 0, "choice_basis": choice.basis},
    )
    yield from emit.check(*CHECKS[1], *_coverage_check(labels_df, series, core__long_running, choice))
    if "ec__profiles" in emit.outputs:
        profiles = (
            profiles_of(
                source,
                series,
                choice.method,
                choice.k,
                chosen_rows["ec_label"].to_numpy(),
                _medoids(chosen_rows),
            )
            if choice.method
            else pl.DataFrame(schema=EC_PROFILES)
        )
        plot = {"plot": png_markdown(plot_profiles(profiles), "EC profiles")} if profiles.height else {}
        yield from emit.output("ec__profiles", profiles, plot)
    per_method, picks = _method_assignments(
        comparison, labels, cfg.methods, series.workload_ids, gain_cfg.alpha
    )
    yield from emit.output(
        "ec__method_assignments",
        per_method,
        {"mappings": MetadataValue.json(picks), "seconds_choice": round(time.perf_counter() - t_start, 2)},
    )
    yield from emit.check(*CHECKS[3], *_method_assignments_check(per_method, labels_df, choice))


def _gathered_rows(gain: pl.DataFrame, source: str, rules: dict[tuple[str, int], str]) -> pl.DataFrame:
    """The stored Table 1 rows of `source` in table order (the order of `rules`); raises naming the mappings
    the stored ec__method_gain partitions lack or hold beyond them (a gain step older than the sweeps)."""
    rows = gain.filter(pl.col("source") == source)
    order = {key: i for i, key in enumerate(rules)}
    have = [tuple(r) for r in rows.select("method", "k").iter_rows()]
    missing, extra = sorted(set(order) - set(have)), sorted(set(have) - set(order))
    if missing or extra or len(have) != len(set(have)):
        raise ValueError(
            f"ec__method_gain of {source}: mappings {missing} missing, {extra} not in Table 1 now "
            f"({len(have)} rows for {len(order)} mappings): re-run ec_gain_job for {source} after ec_sweep_job"
        )
    position = pl.Series([order[key] for key in have], dtype=pl.Int64)
    return rows.with_columns(_position=position).sort("_position").drop("_position")


def _method_assignments(
    comparison: pl.DataFrame,
    labels: pl.DataFrame,
    methods: tuple[str, ...],
    workload_ids: np.ndarray,
    alpha: float = 0.05,
) -> tuple[pl.DataFrame, dict[str, str]]:
    """`ec__method_assignments`: per method, the mapping `choose_mapping` picks from that method's rows of the
    comparison (their Holm-adjusted p-values are over every row of the source), or the method's silhouette-best
    k where none of its rows passes: every method with a scored mapping has one, for the EC-mapping ablation.
    The labels in the series order; `picks` says how each was picked."""
    frames, picks = [], {}
    for method in methods:
        rows = comparison.filter(pl.col("method") == method)
        if rows.height == 0:
            picks[method] = "no mapping scored"
            continue
        pick = choose_mapping(rows, alpha)
        k = pick.k if pick.method else _silhouette_best(rows)
        picks[method] = f"k={k} ({pick.basis if pick.method else 'silhouette_best: no row passes'})"
        frames.append(_labels_array(labels, method, k, workload_ids).select(list(EC_ASSIGNMENTS)))
    return (pl.concat(frames) if frames else pl.DataFrame(schema=EC_ASSIGNMENTS)), picks


def _silhouette_best(rows: pl.DataFrame) -> int:
    return int(rows.filter(pl.col("k_rule") == "silhouette_best")["k"][0])


def _method_assignments_check(per_method: pl.DataFrame, chosen: pl.DataFrame, choice) -> tuple[bool, dict]:
    mappings = per_method.select("method", "k").unique()
    one_each = mappings.height == mappings["method"].n_unique()
    of_chosen = per_method.filter(pl.col("method") == choice.method) if choice.method else per_method.clear()
    equal = of_chosen.equals(chosen)
    return one_each and equal, {
        "n_mappings": mappings.height,
        "is_one_mapping_per_method": one_each,
        "is_chosen_equal_to_ec_assignments": equal,
    }


def _table_markdown(df: pl.DataFrame) -> str:
    lines = [
        "| method | k | rule | EG % (95 % CI) | f (95 % CI) | control EG % (95 % CI) | paired EG - control: mean "
        "(95 % CI), p | median (95 % sign-test CI), seeds + / - | sign p, Holm p | beats control | ARI seeds "
        "| ARI halves (shuffled 95 %) | chosen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in df.iter_rows(named=True):
        ari = "" if r["ari_across_seeds"] is None else f"{r['ari_across_seeds']:.2f}"
        halves = (
            ""
            if r["ari_time_halves"] is None
            else f"{r['ari_time_halves']:.2f} ({r['ari_time_halves_shuffled_95']:.2f})"
        )
        lines.append(
            f"| {r['method']} | {r['k']} | {r['k_rule']} | {r['eg_pct']:.2f} ({r['eg_pct_ci_low']:.2f}, "
            f"{r['eg_pct_ci_high']:.2f}) | {r['f_frac']:.2f} ({r['f_frac_ci_low']:.2f}, {r['f_frac_ci_high']:.2f}) "
            f"| {r['control_eg_pct']:.2f} ({r['control_eg_pct_ci_low']:.2f}, {r['control_eg_pct_ci_high']:.2f}) "
            f"| {r['eg_diff_pct']:.2f} ({r['eg_diff_pct_ci_low']:.2f}, {r['eg_diff_pct_ci_high']:.2f}), "
            f"{r['eg_diff_p_value']:.3f} | {r['eg_diff_pct_median']:.2f} ({r['eg_diff_pct_median_ci_low']:.2f}, "
            f"{r['eg_diff_pct_median_ci_high']:.2f}), +{r['n_seeds_diff_positive']} "
            f"-{r['n_seeds_diff_negative']} of {r['n_seeds']} "
            f"| {r['eg_diff_sign_p_value']:.3g}, {r[P_HOLM]:.3g} "
            f"| {r['beats_control']} | {ari} | {halves} | {r['is_chosen']} |"
        )
    return "\n".join(lines)


def _silhouette_check(sil: pl.DataFrame, cfg: EcConfig) -> tuple[bool, dict]:
    want = {(m, k) for m in cfg.methods for k in range(cfg.k_min, cfg.k_max + 1)}
    have = [tuple(r) for r in sil.select("method", "k").iter_rows()]
    missing = sorted(want - set(have))
    extra = len(have) - len(set(have))
    return not missing and not extra, {
        "n_rows": len(have),
        "missing": str(missing[:10]),
        "n_duplicates": extra,
    }


def _chosen_check(comparison: pl.DataFrame, choice) -> tuple[bool, dict]:
    chosen = comparison.filter(pl.col("is_chosen"))
    expected = 0 if choice.method is None else 1
    beats = bool(chosen["beats_control"].all()) if chosen.height else None
    ok = chosen.height == expected and (choice.method is None or bool(beats))
    return ok, {"n_chosen": chosen.height, "choice_basis": choice.basis, "chosen_beats_control": str(beats)}


def _coverage_check(labels_df: pl.DataFrame, series, long_running: pl.DataFrame, choice) -> tuple[bool, dict]:
    kept = set(long_running["workload_id"].to_list())
    skipped = set(series.skipped["workload_id"].to_list())
    labelled = labels_df["workload_id"].to_list()
    meta = {
        "n_kept": len(kept),
        "n_labelled": len(labelled),
        "n_skipped_series": len(skipped),
        "choice_basis": choice.basis,
    }
    if choice.method is None:
        return True, {
            **meta,
            "note": MetadataValue.text(
                "no mapping chosen (no row passes the Holm-corrected test): nothing labelled"
            ),
        }
    ok = (
        len(labelled) == len(set(labelled))
        and set(labelled) | skipped == kept
        and not set(labelled) & skipped
    )
    return ok, meta


class ClassifierRunConfig(Config):
    prefix_lengths: list[int] = Field(
        default=[0, 6, 12, 24, 48], description="usage bins m fed to the classifier"
    )
    saved_prefix_bins: int = Field(
        default=12,
        description="m of the saved model: it labels an incoming workload from meta alone (its usage bins are "
        "missing, as Algorithm 1's ClassifyToEC with resource_usage = null) and a running one from its first m bins",
    )
    epochs: int = Field(default=200, description="training epochs")
    n_splits: int = Field(
        default=10, description="repeated splits by workload group the accuracies and intervals are over"
    )
    seed: int = Field(default=0, description="seed of initialisation, shuffling and the splits")
    min_per_class: int = Field(default=5, description="train only with at least this many workloads per EC")
    group_pattern: str = Field(
        default=r"^(.+)_d\d+$",
        description="regex whose first group names a workload's group (windows of one longer workload, e.g. "
        "the derived Google job-days '<job>_d<k>'); a group is wholly in train or in test. A workload id "
        "that does not match is its own group",
    )


def workload_groups(workload_ids: list[str], pattern: str) -> np.ndarray:
    """The group of each workload: the pattern's first group where it matches, else the id itself."""
    rx = re.compile(pattern)
    return np.array([(m.group(1) if (m := rx.match(w)) else w) for w in workload_ids])


def classifier_path(warehouse: Warehouse, source: str) -> Path:
    return Path(warehouse.root) / "models" / f"ec_classifier__{source}.pt"


@asset(
    partitions_def=SOURCE_PARTITIONS,
    group_name="ec",
    io_manager_key="table_io",
    deps=["core__usage"],
    metadata=column_schema(CLASSIFIER_ACCURACY, "ec__classifier_accuracy"),
    description="Held-out accuracy and macro-F1 of the EC classifier (TVW-RL Algorithm 1, ClassifyToEC: two "
    "dense ReLU layers and a softmax) per usage-prefix length m (the workload's age in bins), as means over "
    "repeated seeded splits by workload group (all days of a job on one side; `split` states it) with 95 % "
    "corrected resampled t-intervals, beside two constant baselines on the same splits with their intervals: "
    "the training split's majority EC and the best constant guess of each test split. The model trained on "
    "all labelled workloads is saved beside the warehouse for the simulator; its card (in the file and in this "
    "asset's metadata) carries these numbers.",
)
def ec__classifier_accuracy(
    context: AssetExecutionContext,
    config: ClassifierRunConfig,
    warehouse: Warehouse,
    ec__assignments: pl.DataFrame,
    core__workloads: pl.DataFrame,
    core__long_running: pl.DataFrame,
) -> pl.DataFrame:
    source = context.partition_key
    labels_df = ec__assignments.join(core__workloads, on=["source", "workload_id"], how="inner")
    n_classes = labels_df["ec_label"].n_unique()
    if n_classes < 2 or labels_df.height < config.min_per_class * n_classes:
        context.log.warning(
            f"{source}: {labels_df.height} labelled workloads in {n_classes} EC(s): fewer than 2 ECs or than "
            f"{config.min_per_class} per EC; no classifier trained"
        )
        return pl.DataFrame(schema=CLASSIFIER_ACCURACY)
    usage = fill_window_gaps(long_running_usage(warehouse, source, core__long_running), core__long_running)
    series = series_matrix(usage, core__long_running, None, max_bins=max(config.prefix_lengths + [1]))
    order = {w: i for i, w in enumerate(series.workload_ids.tolist())}
    labels_df = labels_df.filter(pl.col("workload_id").is_in(list(order)))
    idx = np.array([order[w] for w in labels_df["workload_id"]])
    values = [series.series_list()[i] for i in idx]
    meta, labels = meta_matrix(labels_df), labels_df["ec_label"].to_numpy()
    groups = workload_groups(labels_df["workload_id"].to_list(), config.group_pattern)
    cfg = ClassifierConfig(epochs=config.epochs, seed=config.seed, n_splits=config.n_splits)
    table = classifier_accuracy_table(meta, values, labels, config.prefix_lengths, cfg, groups=groups)

    m = config.saved_prefix_bins
    final = train_classifier(
        meta, usage_prefixes(values, m) if m else None, labels, replace(cfg, prefix_bins=m)
    )
    card = _classifier_card(table, source, m, len(labels), len(np.unique(groups)))
    path = classifier_path(warehouse, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    final.save(path, card=card)
    context.add_output_metadata(
        {
            "plot": png_markdown(
                classifier_accuracy_plot(table.with_columns(source=pl.lit(source))),
                "EC classifier accuracy against m",
            ),
            "model_path": MetadataValue.path(str(path)),
            "model_card": MetadataValue.json(card),
            "n_labelled": len(labels),
            "n_groups": len(np.unique(groups)),
            "split": table["split"][0],
        }
    )
    return table.with_columns(source=pl.lit(source)).select(list(CLASSIFIER_ACCURACY))


def _classifier_card(table: pl.DataFrame, source: str, prefix_bins: int, n: int, n_groups: int) -> dict:
    """What the saved classifier is and how well its kind did: trained on all n labelled workloads of the
    source, with the accuracy table's numbers (every m; the saved model's m marked)."""
    return {
        "source": source,
        "trained_on": f"all {n} labelled workloads ({n_groups} groups) of {source}",
        "prefix_bins": prefix_bins,
        "split": table["split"][0] if table.height else "",
        "accuracy_by_prefix_bins": [
            {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "split"}
            for r in table.iter_rows(named=True)
        ],
    }


EC_ASSETS = [ec__method_sweep, ec__method_gain, ec__mapping, ec__classifier_accuracy]
