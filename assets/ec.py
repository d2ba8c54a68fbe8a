"""Equivalence classes (TVW-RL "Workload Equivalence-Class (EC) Mapping"), one partition per trace source.

`ec__mapping` clusters the long-running workloads with three distances (aggregate baseline, temporal features,
DTW), picks k per method by silhouette, scores each method's mapping with the prediction-gain proxy (Table 1) and
keeps the best one. `ec__classifier` trains ClassifyToEC (Algorithm 1) on the chosen labels.
"""

import base64
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
from dagster import AssetExecutionContext, AssetOut, Config, MetadataValue, Output, asset, multi_asset
from pydantic import Field

from assets.core import SOURCE_PARTITIONS, long_running_usage
from assets.resources import Warehouse
from models.ec_classifier import (
    ACCURACY_ROWS,
    ClassifierConfig,
    classifier_accuracy_table,
    meta_matrix,
    train_classifier,
    usage_prefixes,
)
from models.forecaster import ForecasterConfig
from models.prediction_gain import MAPPING_ROWS, GainConfig, choose_mapping, mapping_gain_table
from pipelines.equivalence import (
    EC_ASSIGNMENTS,
    EC_PROFILES,
    EC_SILHOUETTE,
    DtwConfig,
    EcConfig,
    assignments_frame,
    plot_profiles,
    plot_silhouette,
    profiles_frame,
    sweep_methods,
)
from pipelines.features import series_matrix

METHOD_COMPARISON = {"source": pl.String, **MAPPING_ROWS, "is_chosen": pl.Boolean}
CLASSIFIER_ACCURACY = {"source": pl.String, **ACCURACY_ROWS}


def png_markdown(png: bytes, alt: str) -> MetadataValue:
    """A PNG shown inline in the Dagster UI."""
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


class EcRunConfig(Config):
    k_min: int = Field(default=3, description="smallest number of ECs tried (TVW-RL: 3)")
    k_max: int = Field(default=15, description="largest number of ECs tried (TVW-RL: 15)")
    n_init: int = Field(default=50, description="initialisations per k, best kept (TVW-RL: 50)")
    methods: list[str] = Field(default=["aggregate", "temporal", "dtw"], description="distances to compare")
    seed: int = Field(default=0, description="seed of every random choice in clustering and forecasting")
    series_length: int | None = Field(
        default=None, description="bins per series; None = shortest kept window"
    )
    dtw_window_frac: float | None = Field(
        default=None, description="Sakoe-Chiba radius / length; None = full DTW"
    )
    dtw_downsample: int = Field(default=1, description="average blocks of this many bins before DTW")
    dtw_exact_max_n: int = Field(default=500, description="exact DTW matrix up to this many workloads")
    dtw_sample_size: int = Field(default=300, description="above that: medoids found on a sample this big")
    forecaster_epochs: int = Field(default=4, description="LSTNet epochs per fit (prediction-gain proxy)")
    forecaster_max_train_windows: int = Field(default=2000, description="training windows drawn per fit")


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
        series_length=c.series_length,
        dtw=dtw,
    )


def _gain_config(c: EcRunConfig) -> GainConfig:
    fc = ForecasterConfig(
        epochs=c.forecaster_epochs, max_train_windows=c.forecaster_max_train_windows, seed=c.seed
    )
    return GainConfig(forecaster=fc)


def _empty_outputs(context: AssetExecutionContext, why: str):
    context.log.warning(f"{context.partition_key}: {why}; EC tables are empty for this source")
    note = {"note": MetadataValue.text(why)}
    for name, schema in (
        ("ec__silhouette", EC_SILHOUETTE),
        ("ec__method_comparison", METHOD_COMPARISON),
        ("ec__assignments", EC_ASSIGNMENTS),
        ("ec__profiles", EC_PROFILES),
    ):
        yield Output(pl.DataFrame(schema=schema), output_name=name, metadata=note)


@multi_asset(
    outs={
        "ec__silhouette": AssetOut(
            io_manager_key="table_io",
            description="Mean silhouette for every (method, k), k = 3..15; the k with the highest value is "
            "each method's choice. Skipped k (too few workloads, identical points) carry the reason.",
        ),
        "ec__method_comparison": AssetOut(
            io_manager_key="table_io",
            description="TVW-RL Table 1: per distance method at its silhouette-chosen k, the fraction f of "
            "workloads in ECs whose own forecaster beats the EC-agnostic one, and the effective prediction "
            "gain EG (%). The row with the best EG is the chosen mapping (`is_chosen`).",
        ),
        "ec__assignments": AssetOut(
            io_manager_key="table_io",
            description="The chosen EC mapping: the EC label of every long-running workload.",
        ),
        "ec__profiles": AssetOut(
            io_manager_key="table_io",
            description="Each EC's representative usage series (medoid for DTW, members' mean otherwise).",
        ),
    },
    partitions_def=SOURCE_PARTITIONS,
    group_name="ec",
    deps=["core__usage"],
)
def ec__mapping(
    context: AssetExecutionContext,
    config: EcRunConfig,
    warehouse: Warehouse,
    core__long_running: pl.DataFrame,
):
    source = context.partition_key
    cfg = _ec_config(config)
    if core__long_running.is_empty():
        yield from _empty_outputs(context, "no long-running workloads")
        return
    usage = long_running_usage(warehouse, source, core__long_running)
    series = series_matrix(usage, core__long_running, cfg.series_length)
    for row in series.skipped.group_by("reason").len().iter_rows():
        context.log.warning(f"{source}: {row[1]} workload(s) skipped: {row[0]}")
    if series.n < cfg.k_min + 1:
        yield from _empty_outputs(context, f"{series.n} usable long-running workloads, fewer than k_min + 1")
        return
    sweep = sweep_methods(series, source, cfg)
    if sweep.warnings:
        context.log.warning(f"{source}: {len(sweep.warnings)} k/feature skips:\n" + "\n".join(sweep.warnings))
    yield Output(
        sweep.silhouette,
        output_name="ec__silhouette",
        metadata={
            "plot": png_markdown(plot_silhouette(sweep.silhouette), "silhouette against k"),
            "best_k": MetadataValue.json({m: k for m, k in sweep.best_k.items()}),
            "notes": MetadataValue.md("\n".join(f"- {n}" for n in sweep.notes)),
            **{f"seconds_{m}": round(t, 2) for m, t in sweep.timings_s.items()},
            **sweep.counts,
        },
    )

    mappings = {(m, k): sweep.labels[m][k] for m, k in sweep.best_k.items() if k is not None}
    if not mappings:
        yield from _empty_outputs(context, "every k was skipped for every method")
        return
    table = mapping_gain_table(series.values, mappings, _gain_config(config))
    method, k = choose_mapping(table)
    comparison = table.with_columns(
        source=pl.lit(source), is_chosen=(pl.col("method") == method) & (pl.col("k") == k)
    ).select(list(METHOD_COMPARISON))
    yield Output(comparison, output_name="ec__method_comparison", metadata={"chosen": f"{method}, k={k}"})

    profiles = profiles_frame(sweep, series, method, k)
    yield Output(
        assignments_frame(sweep, method, k),
        output_name="ec__assignments",
        metadata={"method": method, "k": k},
    )
    yield Output(
        profiles,
        output_name="ec__profiles",
        metadata={"plot": png_markdown(plot_profiles(profiles), "EC profiles")},
    )


class ClassifierRunConfig(Config):
    prefix_lengths: list[int] = Field(
        default=[0, 6, 12, 24], description="usage bins m fed to the classifier"
    )
    saved_prefix_bins: int = Field(
        default=12,
        description="m of the saved model: it labels an incoming workload from meta alone (its usage bins are "
        "missing, as Algorithm 1's ClassifyToEC with resource_usage = null) and a running one from its first m bins",
    )
    epochs: int = Field(default=200, description="training epochs")
    seed: int = Field(default=0, description="seed of initialisation, shuffling and the split")
    min_per_class: int = Field(default=5, description="train only with at least this many workloads per EC")


def classifier_path(warehouse: Warehouse, source: str) -> Path:
    return Path(warehouse.root) / "models" / f"ec_classifier__{source}.pt"


@asset(
    partitions_def=SOURCE_PARTITIONS,
    group_name="ec",
    io_manager_key="table_io",
    deps=["core__usage"],
    description="Held-out accuracy and macro-F1 of the EC classifier (TVW-RL Algorithm 1, ClassifyToEC: two "
    "dense ReLU layers and a softmax) per usage-prefix length m, with the majority-class baseline. The "
    "model trained on all labelled workloads is saved beside the warehouse for the simulator.",
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
    usage = long_running_usage(warehouse, source, core__long_running)
    series = series_matrix(usage, core__long_running, None)
    order = {w: i for i, w in enumerate(series.workload_ids.tolist())}
    labels_df = labels_df.filter(pl.col("workload_id").is_in(list(order)))
    idx = np.array([order[w] for w in labels_df["workload_id"]])
    meta, values, labels = meta_matrix(labels_df), series.values[idx], labels_df["ec_label"].to_numpy()
    cfg = ClassifierConfig(epochs=config.epochs, seed=config.seed)
    table = classifier_accuracy_table(meta, values, labels, config.prefix_lengths, cfg)

    m = config.saved_prefix_bins
    final = train_classifier(
        meta, usage_prefixes(values, m) if m else None, labels, replace(cfg, prefix_bins=m)
    )
    path = classifier_path(warehouse, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    final.save(path)
    context.add_output_metadata({"model_path": MetadataValue.path(str(path)), "n_labelled": len(labels)})
    return table.with_columns(source=pl.lit(source)).select(list(CLASSIFIER_ACCURACY))


EC_ASSETS = [ec__mapping, ec__classifier_accuracy]
