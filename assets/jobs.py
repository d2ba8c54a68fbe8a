"""Asset jobs: one per layer. A job's assets share one partitioning (a trace source, or none)."""

from dagster import AssetSelection, define_asset_job

from assets.core import SOURCE_PARTITIONS

PER_SOURCE_GROUPS = ("core", "ec")
GLOBAL_GROUPS = ("sim", "eval")


def build_jobs() -> list:
    """`per_source_job` (canonical tables and equivalence classes of one source; its partition is the
    source), `cluster_job` (job sequences and evaluation over every source)."""
    per_source = define_asset_job(
        "per_source_job",
        selection=AssetSelection.groups(*PER_SOURCE_GROUPS),
        partitions_def=SOURCE_PARTITIONS,
        description="Canonical tables, long-running filter and equivalence classes for one trace source.",
    )
    cluster = define_asset_job(
        "cluster_job",
        selection=AssetSelection.groups(*GLOBAL_GROUPS),
        description="Job sequences for the simulator and the evaluation of every scheduler.",
    )
    return [per_source, cluster]
