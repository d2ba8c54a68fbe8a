"""Job sequences for the simulator and the evaluation of every registered scheduler (TVW-RL "End-to-End
Evaluation", Fig. 4/5). Not partitioned: these tables span every trace source and the synthetic workloads."""

import dataclasses

import polars as pl
from dagster import AssetExecutionContext, AssetOut, Config, MetadataValue, Output, asset, multi_asset
from pydantic import Field

from assets.core import long_running_usage
from assets.ec import classifier_path, png_markdown
from assets.resources import Warehouse
from pipelines.job_sequences import JOB_SEQUENCES, SequenceConfig, build_job_sequences
from pipelines.synthetic import (
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
)
from sim.config import SimConfig
from sim.evaluate import evaluate_policies, plot_results, summarise
from sim.jobs import JobBatch
from sim.labelling import LABEL_ACCURACY, ClassifierLabeller, label_accuracy_by_age
from sim.policies import POLICIES


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


@multi_asset(
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
    long_running = _read_optional(warehouse, "core__long_running")
    assignments = _read_optional(warehouse, "ec__assignments")
    seq_cfg = SequenceConfig(
        loads_pct=tuple(config.loads_pct),
        step_bins=config.step_bins,
        seed=config.seed,
        n_train_sequences=config.n_train_sequences,
        n_test_sequences=config.n_test_sequences,
    )
    frames, notes, scales = [], {}, []
    counts = long_running.group_by("source").len() if long_running is not None else pl.DataFrame()
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
        df, stats = build_job_sequences(use, lr, ec, seq_cfg)
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
    yield Output(
        out.select([pl.col(c).cast(t) for c, t in JOB_SEQUENCES.items()]),
        output_name="sim__job_sequences",
        metadata={"per_source": MetadataValue.json(notes)},
    )
    yield Output(pl.DataFrame(scales, schema=USAGE_SCALE, orient="row"), output_name="sim__usage_scale")


class EvalConfig(Config):
    policies: list[str] = Field(default=sorted(POLICIES), description="registered policies to evaluate")
    seeds: list[int] = Field(default=[0, 1, 2], description="simulator/policy seeds per test sequence")
    n_machines: int = Field(default=10, description="M (TVW-RL: 10)")
    max_steps: int = Field(default=200, description="episode cap in logical steps (TVW-RL: 200)")
    noise_max_units: int = Field(default=0, description="background noise 0..n units (robustness study: 1-3)")


@asset(group_name="eval", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__baselines(
    context: AssetExecutionContext, config: EvalConfig, sim__job_sequences: pl.DataFrame
) -> pl.DataFrame:
    """One row per (source, load, policy, test sequence, seed) with every operational metric of TVW-RL
    (avg utilisation and fragmentation per resource, overshoot %, machines used) plus contention, mean wait and
    the total penalty with its components. Every policy of the `POLICIES` registry is evaluated."""
    unknown = [p for p in config.policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"eval__baselines: unknown policies {unknown}; registered: {sorted(POLICIES)}")
    n_labels = max(8, int(sim__job_sequences["ec_label"].max() or 0) + 1)
    cfg = SimConfig(
        n_machines=config.n_machines,
        max_steps=config.max_steps,
        n_labels=n_labels,
        noise_max_units=config.noise_max_units,
        oversize="clip",
    )
    results = evaluate_policies(sim__job_sequences, config.policies, cfg, seeds=config.seeds, split="test")
    context.log.info(f"{results.height} episodes evaluated")
    return results


@asset(group_name="eval", io_manager_key="table_io", kinds={"parquet", "polars"})
def eval__summary(context: AssetExecutionContext, eval__baselines: pl.DataFrame) -> pl.DataFrame:
    """Mean and 95% interval of every metric per (source, load, policy), over test sequences and seeds; the
    UI shows the TVW-RL Fig. 4/5 style plot (utilisation, fragmentation, machines used, overshoot per load)."""
    summary = summarise(eval__baselines)
    context.add_output_metadata({"plot": png_markdown(plot_results(summary), "metrics per load and policy")})
    return summary


class LabellingConfig(Config):
    ages_steps: list[int] = Field(
        default=[0, 1, 2, 4, 8, 16], description="job ages (steps observed) to score"
    )
    n_labels: int = Field(default=16, description="G: labels the simulator accepts")


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
    """TVW-RL Algorithm 1 in the simulator: how often the saved EC classifier, labelling test jobs from their meta
    on arrival (age 0) and from meta plus the usage observed so far as they run, agrees with the clustering label,
    per source and job age in steps."""
    frames = []
    for source, cpu_scale, mem_scale, step_bins in sim__usage_scale.iter_rows():
        path = classifier_path(warehouse, source)
        if not path.exists():
            context.log.warning(f"{source}: no saved EC classifier at {path}; skipped")
            continue
        test = sim__job_sequences.filter((pl.col("source") == source) & (pl.col("split") == "test"))
        labeller = ClassifierLabeller(
            path, prefix_bins_per_step=step_bins, usage_scale=(cpu_scale, mem_scale)
        )
        cfg = SimConfig(n_labels=max(config.n_labels, int(test["ec_label"].max() or 0) + 1), oversize="clip")
        for (load,), group in test.group_by("load_pct", maintain_order=True):
            acc = label_accuracy_by_age(labeller, cfg, JobBatch.from_frame(group), config.ages_steps)
            frames.append(acc.with_columns(source=pl.lit(source), load_pct=pl.lit(load, pl.Int32)))
    if not frames:
        return pl.DataFrame(schema={"source": pl.String, "load_pct": pl.Int32, **LABEL_ACCURACY})
    return (
        pl.concat(frames)
        .select("source", "load_pct", *LABEL_ACCURACY)
        .sort("source", "load_pct", "age_steps")
    )


CLUSTER_ASSETS = [sim__job_sequences, eval__baselines, eval__summary, eval__ec_labelling]
