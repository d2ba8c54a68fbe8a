"""The runs of one `tvw-run`, read from the definitions: which job and partition, which layer, and which runs each
must wait for. Nothing here lists layers or assets: the jobs' tags name their layer (`tvw/layer`), the jobs'
partitions are the runs, and the asset graph's upstream keys and partition mappings are the waits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from dagster import AssetKey, Definitions, JobDefinition

LAYER_TAG = "tvw/layer"
SOURCE_TAG = "tvw/source"
ON_DEMAND_TAG = "tvw/on_demand"
"""A job tagged so is planned only when its layer is asked for by name (`--layers ablation`)."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run to make: a named job, its partition when the job is partitioned, its layer and source."""

    layer: str
    job: str
    partition: str | None
    source: str | None
    input_bytes: int = 0

    @property
    def label(self) -> str:
        return f"{self.job}[{self.partition}]" if self.partition else self.job


@dataclasses.dataclass(frozen=True)
class Plan:
    """The runs in launch order (a run's waits come before it) and, per run, the runs it waits for."""

    runs: list[RunSpec]
    waits: dict[RunSpec, frozenset[RunSpec]]

    def layers(self) -> list[str]:
        return list(dict.fromkeys(r.layer for r in self.runs))


def _jobs(defs: Definitions) -> list[JobDefinition]:
    return [defs.resolve_job_def(j.name) for j in defs.jobs if j.name != "__ASSET_JOB"]


def job_layers(defs: Definitions) -> list[str]:
    """Every layer a job names, in the order of the definitions' jobs (on-demand layers included)."""
    return list(dict.fromkeys(j.tags[LAYER_TAG] for j in _jobs(defs) if LAYER_TAG in j.tags))


def default_layers(defs: Definitions) -> list[str]:
    """The layers `tvw-run` makes when none is named: every layer but the on-demand ones."""
    return list(
        dict.fromkeys(
            j.tags[LAYER_TAG] for j in _jobs(defs) if LAYER_TAG in j.tags and ON_DEMAND_TAG not in j.tags
        )
    )


def partition_source(job: JobDefinition, key: str | None) -> str | None:
    """The trace source a run belongs to: the job's source tag, the partition's `source` dimension, or the
    partition key itself when the job is partitioned by source."""
    if SOURCE_TAG in job.tags:
        return job.tags[SOURCE_TAG]
    if key is None:
        return None
    if isinstance(job.partitions_def, _multi()):
        return job.partitions_def.get_partition_key_from_str(key).keys_by_dimension.get("source")
    return key if job.tags.get("tvw/partitioned_by") == "source" else None


def offered_load(partition: str | None) -> int:
    """The load a partition key names ('load80-seed0' -> 80; 0 when none): a layer's runs at higher load go first,
    since their episodes are longer (the default `tvw-run`'s longest run evaluates the highest load)."""
    found = re.search(r"load(\d+)", partition or "")
    return int(found[1]) if found else 0


def _multi():
    from dagster import MultiPartitionsDefinition

    return MultiPartitionsDefinition


def plan(
    defs: Definitions,
    layers: Iterable[str],
    sources: Iterable[str],
    partitions: Mapping[str, list[str]] | None = None,
    sizes: Mapping[tuple[str, str], int] | None = None,
) -> Plan:
    """Every run of the jobs of `layers`, for `sources` (a run of another source is left out; a run of no source,
    e.g. the cluster layer, is kept). `partitions` narrows a job's partitions (job name -> keys, e.g. the loads a
    profile evaluates); `sizes` ((job, partition) -> input bytes) orders a layer's runs largest first, then
    by offered load, highest first (`offered_load`; the sort is stable: otherwise the definitions' order)."""
    layers, sources = list(layers), set(sources)
    partitions, sizes = dict(partitions or {}), dict(sizes or {})
    graph = defs.resolve_asset_graph()
    runs: list[RunSpec] = []
    made_by: dict[tuple[AssetKey, str | None], RunSpec] = {}
    keys_of: dict[RunSpec, tuple[JobDefinition, set[AssetKey]]] = {}
    for layer in layers:
        in_layer = []
        for job in _jobs(defs):
            if job.tags.get(LAYER_TAG) != layer:
                continue
            keys = set(job.asset_layer.selected_asset_keys)
            pdef = job.partitions_def
            part_keys: list[str | None] = (
                list(partitions.get(job.name, pdef.get_partition_keys())) if pdef is not None else [None]
            )
            for key in part_keys:
                source = partition_source(job, key)
                if source is not None and source not in sources:
                    continue
                spec = RunSpec(layer, job.name, key, source, sizes.get((job.name, key or ""), 0))
                in_layer.append(spec)
                keys_of[spec] = (job, keys)
                for asset_key in keys:
                    made_by[(asset_key, key)] = spec
        runs += sorted(in_layer, key=lambda r: (-r.input_bytes, -offered_load(r.partition)))
    waits = {spec: frozenset(_upstream_runs(graph, spec, *keys_of[spec], made_by)) for spec in runs}
    return Plan(runs, waits)


def _upstream_runs(graph, spec: RunSpec, job: JobDefinition, keys: set[AssetKey], made_by) -> set[RunSpec]:
    """The planned runs that make a partition of an asset upstream of one this run makes (partition mappings
    applied; an unpartitioned asset waits for every planned partition of its upstream asset)."""
    found: set[RunSpec] = set()
    for key in keys:
        node = graph.get(key)
        for parent in node.parent_keys:
            if parent in keys:
                continue  # made in the same run
            parent_def = graph.get(parent).partitions_def
            for q in _upstream_partitions(
                graph, key, parent, node.partitions_def, parent_def, spec.partition
            ):
                if (parent, q) in made_by:
                    found.add(made_by[(parent, q)])
            if parent_def is not None and (node.partitions_def is None or spec.partition is None):
                found |= {run for (k, _), run in made_by.items() if k == parent}
    found.discard(spec)
    # a run of one source never waits for another source's runs (core's tables read every raw shard through an
    # all-partitions mapping, but only their own source's rows): one bad shard stops only its own source
    return {run for run in found if run.source is None or spec.source is None or run.source == spec.source}


def _upstream_partitions(
    graph, key, parent, child_def, parent_def, partition: str | None
) -> list[str | None]:
    if parent_def is None:
        return [None]
    if child_def is None or partition is None:
        return []  # handled by the caller: every planned partition
    mapping = graph.get_partition_mapping(key, parent)
    subset = child_def.subset_with_partition_keys([partition])
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(subset, child_def, parent_def)
    return list(result.partitions_subset.get_partition_keys())


def ready(spec: RunSpec, plan: Plan, done: set[RunSpec]) -> bool:
    """Whether every run `spec` waits for has finished successfully."""
    return plan.waits[spec] <= done


def blocked_by_failure(spec: RunSpec, plan: Plan, failed: set[RunSpec]) -> bool:
    """Whether a run `spec` waits for (directly or not) failed: it will not be launched."""
    seen, todo = set(), list(plan.waits[spec])
    while todo:
        run = todo.pop()
        if run in failed:
            return True
        if run not in seen:
            seen.add(run)
            todo += plan.waits[run]
    return False
