"""Asset jobs: selections of groups or assets, one per layer (and one per raw table). A job's assets share one
partitioning, so each run is one partition: a shard, a trace source, a (source, EC method), a load, a (load,
training seed), or the whole cluster layer. A job's config is its assets' defaults, i.e. the profile's
(`assets.settings.apply_profile`); its tags name the profile, its layer (`tvw-run` plans from them and from the
asset graph) and, for the raw jobs, the source.
"""

import re

from dagster import (
    AssetsDefinition,
    AssetSelection,
    Definitions,
    JobDefinition,
    MultiPartitionsDefinition,
    define_asset_job,
)

from assets.core import SOURCE_PARTITIONS
from assets.raw import NO_SHARD
from assets.settings import resolved_config
from pipelines.settings import find_setting

EC_CONFIG_OPS = ("ec__method_sweep", "ec__method_gain")
"""Ops configured by the profile's `ec__mapping` entry (all three take one config class): a profile configures the
EC layer once, and its sweep, gain and choice steps agree on methods, k range and seeds."""
PROFILE_TAG, LAYER_TAG, SOURCE_TAG, ON_DEMAND_TAG = "tvw/profile", "tvw/layer", "tvw/source", "tvw/on_demand"

SHARED_CONFIG = {"ec__mapping": EC_CONFIG_OPS}
"""The profile's `ops:` with its `ec__mapping` entry copied to the EC sweep and gain ops (an entry the profile
gives one of them itself is kept)."""


SWEEP = ("ec__method_sweep", "ec__sweep_silhouette", "ec__sweep_labels")
BASELINE_METRICS = ["eval__deeprm_fig4", "eval__dejavu_metrics"]  # the papers' agents' results: own job
# fmt: off
LAYER_JOBS = [
    # job, layer, (groups, + assets, - assets), partitioned like (an asset, or "source"), description
    ("per_source_job", "per_source", (["core"], [], []), "source",
     "Canonical tables and the long-running filter for one trace source."),
    ("ec_sweep_job", "ec_sweep", ([], SWEEP, []), "ec__method_sweep",
     "One EC distance method's k sweep on one source (a run per source and method)."),
    ("ec_gain_job", "ec_gain", ([], ["ec__method_gain"], []), "ec__method_gain",
     "Table 1 (prediction gain over forecaster seeds, random control) of one EC method's mappings."),
    ("ec_job", "ec", (["ec"], [], [*SWEEP, "ec__method_gain"]), "source",
     "The EC mapping of one source (chosen from every method's Table 1 rows), profiles and classifier."),
    ("cluster_job", "cluster", (["sim"], [], []), None,
     "Job sequences for the simulator, their usage scale and offered load."),
    ("eval_job", "eval", ([], ["eval__baselines"], []), "eval__baselines",
     "Every heuristic scheduler on every source's test sequences at one load (a run per load)."),
    ("forecast_eval_job", "eval", (["eval"], [], ["eval__baselines", "eval__summary"]), None,
     "EC labelling in the simulator and the usage forecasts' table (its own run: it goes beside eval_job's)."),
    ("eval_summary_job", "eval", ([], ["eval__summary"], []), None,
     "Means and intervals of the heuristics' metrics over every load evaluated."),
    ("rl_job", "rl", (["rl"], [], ["rl__forecast_residual"]), "rl__tvw_rl",
     "Train the papers' learned schedulers for one (load, training seed) on every source with training sequences."),
    ("placer_job", "rl", ([], ["rl__forecast_residual"], []), "rl__forecast_residual",
     "Train our learned scheduler for one (load, training seed) (its own runs: they go beside rl_job's)."),
    ("results_job", "results", ([], ["eval__results"], []), "eval__results",
     "Every learned policy on every test sequence of one load, beside the heuristics' rows (a run per load)."),
    ("results_summary_job", "results", (["results"], [], [*BASELINE_METRICS, "eval__results"]), None,
     "Summary, gap table and leaderboard over every load's results."),
    ("baseline_metrics_job", "results", ([], BASELINE_METRICS, []), None,
     "DeepRM's Fig. 4 and Dejavu's own metrics (beside results_job: they need only their agents' runs)."),
    ("ablation_job", "ablation", ([], ["rl__ablation"], []), "rl__ablation",
     "One TVW-RL ablation run (Tables 2-3); on demand: `tvw-run --layers ablation`."),
    ("ablation_summary_job", "ablation", (["ablation"], [], ["rl__ablation"]), None,
     "The ablation runs' tables and their winners against the heuristics (after every ablation run)."),
]
# fmt: on
"""The layer jobs: a selection of groups and assets each; adding a layer is a row here (the runner reads it)."""
ON_DEMAND = {"ablation"}


def build_jobs(assets: list[AssetsDefinition], profile: str) -> list:
    """`raw_<source>__<table>_job` per raw table (a run per shard file), then LAYER_JOBS, every job tagged with
    the profile, its layer and (raw jobs) its source."""

    def keys(names):
        return AssetSelection.assets(*[k for a in assets for k in a.keys if k.path[-1] in names])

    def partitions(like):
        if like in (None, "source"):
            return SOURCE_PARTITIONS if like else None
        return next(a.partitions_def for a in assets if a.node_def.name == like)

    raw = [
        define_asset_job(
            f"{a.key.path[-1]}_job",
            selection=AssetSelection.assets(a),
            partitions_def=a.partitions_def,
            description=f"Ingest one shard of `{a.key.path[-1]}` (a run per shard file).",
            tags={PROFILE_TAG: profile, LAYER_TAG: "raw", SOURCE_TAG: a.key.path[-1][4:].split("__")[0]},
        )
        for a in assets
        if all(k.path[-1].startswith("raw_") for k in a.keys)
    ]
    return raw + [
        define_asset_job(
            name,
            selection=(AssetSelection.groups(*groups) | keys(plus)) - keys(minus),
            partitions_def=partitions(like),
            description=description,
            tags={PROFILE_TAG: profile, LAYER_TAG: layer}
            | ({"tvw/partitioned_by": "source"} if like == "source" else {})
            | ({ON_DEMAND_TAG: "true"} if layer in ON_DEMAND else {}),
        )
        for name, layer, (groups, plus, minus), like, description in LAYER_JOBS
    ]


PLANNED_BY = {
    "ec_sweep_job": {"method": ("ec__mapping", "methods")},
    "ec_gain_job": {"method": ("ec__mapping", "methods")},
    "eval_job": {"load": ("sim__job_sequences", "loads_pct")},
    "results_job": {"load": ("sim__job_sequences", "loads_pct")},
    "rl_job": {"load": ("sim__job_sequences", "loads_pct"), "seed": ("eval__results", "seeds")},
    "placer_job": {"load": ("sim__job_sequences", "loads_pct"), "seed": ("eval__results", "seeds")},
}
"""Jobs whose runs are only the partitions the profile asks for: partition part -> the (op, setting) listing it."""


def planned_partitions(defs: Definitions) -> dict[str, list[str]]:
    """Per job of PLANNED_BY: the partitions of the EC methods, loads and training seeds in force; per raw job, its
    shards (none when the trace folder has none). Other jobs run every partition. ValueError for a configured
    value no partition has."""
    assets = {a.node_def.name: a for a in defs.assets if isinstance(a, AssetsDefinition)}
    jobs = [defs.resolve_job_def(j.name) for j in defs.jobs]
    out = {
        j.name: [k for k in j.partitions_def.get_partition_keys() if k != NO_SHARD]
        for j in jobs
        if SOURCE_TAG in j.tags
    }
    for job in (j for j in jobs if j.name in PLANNED_BY):
        keys = job.partitions_def.get_partition_keys()
        parts = {k: _parts(job, k) for k in keys}
        wanted = {
            part: {str(v) for v in find_setting(resolved_config(assets[op]), name)}
            for part, (op, name) in PLANNED_BY[job.name].items()
        }
        for part, values in wanted.items():
            unknown = values - {p[part] for p in parts.values()}
            if unknown:
                op, name = PLANNED_BY[job.name][part]
                raise ValueError(
                    f"{op}.{name}: {sorted(unknown)} has no `{job.name}` partition; known: {keys}"
                )
        out[job.name] = [k for k in keys if all(parts[k][part] in v for part, v in wanted.items())]
    return out


def _parts(job: JobDefinition, key: str) -> dict[str, str]:
    """A partition key's named parts: a multi-partition's dimensions, or 'load50-seed0' -> {load: 50, seed: 0}."""
    if isinstance(job.partitions_def, MultiPartitionsDefinition):
        return dict(job.partitions_def.get_partition_key_from_str(key).keys_by_dimension)
    return {m[1]: m[2] for m in re.finditer(r"([a-z]+)(\d+)", key)}
