"""The job sequences of one run: every trace source's (`pipelines.job_sequences`) and the synthetic workloads'
(`pipelines.synthetic`) beside them, with their offered load and what a reader should know about them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipelines.job_sequences import (
    JOB_SEQUENCES,
    OFFERED_LOAD,
    USAGE_SCALE,
    SequenceConfig,
    build_job_sequences,
    n_validation_sequences,
    offered_load_check,
    offered_load_table,
    split_diversity,
)
from pipelines.synthetic import SYNTHETIC_WORKLOADS, cluster_of


@dataclass(frozen=True)
class SequenceRunSettings(SequenceConfig):
    """The job sequences of every trace source (`SequenceConfig`: how they are cut, scaled, mixed and timed),
    the synthetic workloads beside them, and the tolerance of the offered-load check."""

    min_workloads: int = 2
    """A trace source needs this many long-running workloads; one with fewer gets no sequences (noted, logged)."""
    load_tolerance: float = 0.1
    """Realised offered load, averaged over a (source, load)'s sequences, must be within this share of the label
    (check)."""
    include_synthetic: bool = True
    """Add the synthetic workloads (`pipelines.synthetic.SYNTHETIC_WORKLOADS`), each on its own cluster."""
    served_labeller: str = "sim_view"
    """What serves EC labels to every policy in the simulator: "sim_view" (`models.sim_labeller`, trained on the
    simulator's view of the training sequences' jobs, saved beside the sequences) or "classifier" (the EC
    classifier's serving copy, `models.ec_serving`)."""


@dataclass(frozen=True)
class SequenceRun:
    """What `build_sequence_run` gives: the tables and what the asset reports about them."""

    jobs: pl.DataFrame
    """JOB_SEQUENCES rows of every source."""
    offered_load: pl.DataFrame
    """OFFERED_LOAD rows, one per sequence."""
    usage_scale: pl.DataFrame
    """USAGE_SCALE rows, one per trace source with sequences."""
    per_source: dict[str, Any]
    """Per trace source, the builder's scalar stats, or why it was skipped."""
    oversized: dict[str, list[str]]
    """Per trace source built, the ids of its workloads larger than one machine (`oversized_workloads`)."""
    diversity: pl.DataFrame
    """`split_diversity` of `jobs`."""
    by_label: pl.DataFrame
    """`offered_load_check` of `offered_load`."""
    warnings: list[str]
    """What a reader should know: sources skipped, thin splits, loads off their label."""


def build_sequence_run(
    long_running: pl.DataFrame | None,
    assignments: pl.DataFrame | None,
    usage_of: Callable[[str, pl.DataFrame], pl.DataFrame],
    settings: SequenceRunSettings,
    log: Callable[[str], None] | None = None,
) -> SequenceRun:
    """`build_job_sequences` per trace source of `long_running` with at least `settings.min_workloads` workloads
    (in source order; `usage_of(source, its long_running rows)` gives its USAGE rows), then the synthetic
    workloads; the offered load of every sequence, each source on the cluster its labels refer to
    (`pipelines.synthetic.cluster_of`), and its check against the labels."""
    frames, per_source, oversized, scales, warnings = [], {}, {}, [], []
    sources = sorted(set(long_running["source"].to_list())) if long_running is not None else []
    for source in sources:
        lr = long_running.filter(pl.col("source") == source)
        if lr.height < settings.min_workloads:
            warnings.append(
                f"{source}: {lr.height} long-running workload(s) < {settings.min_workloads}; no sequences"
            )
            per_source[source] = f"skipped: {lr.height} long-running workloads"
            continue
        ec = assignments.filter(pl.col("source") == source) if assignments is not None else None
        df, stats = build_job_sequences(usage_of(source, lr), lr, ec, settings, log=log)
        frames.append(df)
        scales.append((source, *stats["usage_scale"][source], settings.step_bins))
        per_source[source] = {k: v for k, v in stats.items() if isinstance(v, int | float | str)}
        oversized[source] = stats["oversized_workloads"].get(source, [])
        held_out = stats["validation_workloads"].get(source, 0)
        per_source[source]["n_validation_workloads"] = held_out
        if not held_out and n_validation_sequences(settings.n_train_sequences, settings.validation_share):
            warnings.append(
                f"{source}: too few training workloads to hold some out, so its validation sequences share the "
                "fit sequences' workloads (fitted rules are validated in sample)"
            )
        unassigned = stats.get("n_workloads_without_ec_label", {}).get(source, 0)
        per_source[source]["n_workloads_without_ec_label"] = unassigned
        if unassigned:
            warnings.append(f"{source}: {unassigned} workload(s) have no EC label and were given label 0")
        if oversized[source]:
            warnings.append(
                f"{source}: {len(oversized[source])} workload(s) larger than one machine "
                f"(oversized_rule={settings.oversized_rule!r}): {oversized[source][:10]}"
            )
    if settings.include_synthetic:
        counts = (settings.n_train_sequences, settings.n_test_sequences, settings.loads_pct, settings.seed)
        frames += [
            workload.build(*counts, validation_share=settings.validation_share)
            for workload in SYNTHETIC_WORKLOADS.values()
        ]
    jobs = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=JOB_SEQUENCES)
    jobs = jobs.select([pl.col(c).cast(t) for c, t in JOB_SEQUENCES.items()])
    diversity = split_diversity(jobs, settings.min_workloads_per_split)
    for row in diversity.filter(pl.col("is_too_few_workloads")).iter_rows(named=True):
        warnings.append(
            f"{row['source']} {row['load_pct']} % {row['split']}: only {row['n_distinct_workloads']} distinct "
            f"workload(s) (< {settings.min_workloads_per_split}); policies may not be separable on it"
        )
    clusters = {
        s: cluster_of(s, settings.n_machines, settings.arrival_steps) for s in jobs["source"].unique()
    }
    loads = offered_load_table(
        jobs,
        {s: m for s, (m, _) in clusters.items()},
        settings.capacity_units,
        {s: w for s, (_, w) in clusters.items()},
    )
    by_label = offered_load_check(loads, tolerance=settings.load_tolerance)
    for row in by_label.filter(~pl.col("is_within_tolerance")).iter_rows(named=True):
        warnings.append(
            f"{row['source']} {row['load_pct']} %: realised offered load {row['mean_offered_load']:.3f} "
            f"({row['ratio_to_label']:.2f} x the label)"
        )
    return SequenceRun(
        jobs=jobs,
        offered_load=loads.select([pl.col(c).cast(t) for c, t in OFFERED_LOAD.items()]),
        usage_scale=pl.DataFrame(scales, schema=USAGE_SCALE, orient="row"),
        per_source=per_source,
        oversized=oversized,
        diversity=diversity,
        by_label=by_label,
        warnings=warnings,
    )
