"""Job sequences for the simulator and the evaluation of every registered scheduler (TVW-RL "End-to-End
Evaluation", Fig. 4/5). Not partitioned: these tables span every trace source and the synthetic workloads."""

import dataclasses

import polars as pl
from dagster import AssetExecutionContext, Config, MetadataValue, asset
from pydantic import Field

from assets.core import long_running_usage
from assets.ec import png_markdown
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
from sim.policies import POLICIES

SYNTHETIC_SOURCES = ("deepplace_synthetic", "deeprm_synthetic")


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


@asset(
    deps=["core__usage", "core__long_running", "ec__assignments"],
    group_name="sim",
    io_manager_key="table_io",
    kinds={"parquet", "polars"},
)
def sim__job_sequences(
    context: AssetExecutionContext, config: JobSequencesConfig, warehouse: Warehouse
) -> pl.DataFrame:
    """Job sequences for the simulator, one row per job: per (source, load, split, sequence) the Poisson
    arrival step, the EC label and the quantised per-step CPU and memory units (C_d = 8) of a window cut from
    a long-running workload; train and test sequences never share a workload. Real sources come from
    `core__long_running`; `deepplace_synthetic` and `deeprm_synthetic` are the papers' synthetic workloads."""
    long_running = _read_optional(warehouse, "core__long_running")
    assignments = _read_optional(warehouse, "ec__assignments")
    seq_cfg = SequenceConfig(
        loads_pct=tuple(config.loads_pct),
        step_bins=config.step_bins,
        seed=config.seed,
        n_train_sequences=config.n_train_sequences,
        n_test_sequences=config.n_test_sequences,
    )
    frames, notes = [], {}
    counts = long_running.group_by("source").len() if long_running is not None else pl.DataFrame()
    for source, n in counts.iter_rows():
        if n < config.min_workloads:
            context.log.warning(
                f"{source}: {n} long-running workload(s) < {config.min_workloads}; no sequences"
            )
            notes[source] = f"skipped: {n} long-running workloads"
            continue
        lr = long_running.filter(pl.col("source") == source)
        use = long_running_usage(warehouse, source, lr)
        ec = assignments.filter(pl.col("source") == source) if assignments is not None else None
        df, stats = build_job_sequences(use, lr, ec, seq_cfg)
        frames.append(df)
        notes[source] = {k: v for k, v in stats.items() if isinstance(v, int | float | str)}
    if config.include_synthetic:
        n = dict(n_train_sequences=config.n_train_sequences, n_test_sequences=config.n_test_sequences)
        dp, _ = build_deepplace_sequences(
            dataclasses.replace(DeepPlaceConfig(), seed=config.seed, **n, loads_pct=tuple(config.loads_pct))
        )
        rm = build_deeprm_sequences(
            dataclasses.replace(DeepRMConfig(), seed=config.seed, **n, loads_pct=tuple(config.loads_pct))
        )
        frames += [dp, rm]
    out = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=JOB_SEQUENCES)
    context.add_output_metadata({"per_source": MetadataValue.json(notes)})
    return out.select([pl.col(c).cast(t) for c, t in JOB_SEQUENCES.items()])


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


CLUSTER_ASSETS = [sim__job_sequences, eval__baselines, eval__summary]
