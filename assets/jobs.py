"""Asset jobs: one per layer (and one per raw table). A job's assets share one partitioning, so each run is
one partition: a shard, a trace source, a (source, EC method), a load, a (load, training seed), or the whole
cluster layer. Every job carries the profile's config (for its own ops) as its default, and the profile's name
as the `tvw/profile` tag."""

from dagster import AssetsDefinition, AssetSelection, define_asset_job

from assets.core import SOURCE_PARTITIONS

PER_SOURCE_GROUPS = ("core",)
EC_CONFIG_OPS = ("ec__method_sweep", "ec__method_gain")
"""Ops configured by the profile's `ec__mapping` entry (all three take `assets.ec.EcRunConfig`): a profile
configures the EC layer once, and its sweep, gain and choice steps agree on methods, k range and seeds."""
GLOBAL_GROUPS = ("sim", "eval")
PROFILE_TAG = "tvw/profile"


def raw_job_name(raw_asset_name: str) -> str:
    return f"{raw_asset_name}_job"


def _ops_config(assets: list[AssetsDefinition], groups: tuple[str, ...], profile_config: dict) -> dict:
    """The profile's `ops:` entries for the ops whose assets are in `groups` (Dagster rejects unknown ops)."""
    return ops_config_of(_op_names(assets, groups), profile_config)


def _op_names(assets: list[AssetsDefinition], groups: tuple[str, ...]) -> set[str]:
    return {a.node_def.name for a in assets if set(a.group_names_by_key.values()) & set(groups)}


def with_shared_ec_config(ops: dict) -> dict:
    """The profile's `ops:` with its `ec__mapping` entry copied to the EC sweep and gain ops (an entry the
    profile gives one of them itself is kept)."""
    if "ec__mapping" not in ops:
        return dict(ops)
    return {**dict.fromkeys(EC_CONFIG_OPS, ops["ec__mapping"]), **ops}


def ops_config_of(names: set[str], profile_config: dict) -> dict:
    """`{"ops": ...}` with the profile's entries for the ops in `names` (`with_shared_ec_config`), or {}."""
    shared = with_shared_ec_config(profile_config.get("ops", {}))
    ops = {k: v for k, v in shared.items() if k in names}
    return {"ops": ops} if ops else {}


def build_jobs(assets: list[AssetsDefinition], profile_config: dict, profile: str) -> list:
    """`raw_<source>__<table>_job` per raw table (partition: a shard file), `per_source_job` (canonical
    tables of one source; partition: the source), `ec_sweep_job` (one EC method's k sweep; partition: source x
    method), `ec_gain_job` (that method's Table 1 rows; source x method), `ec_job` (the EC choice, labels and
    classifier of one source), `cluster_job` (job sequences, EC labelling in the simulator), `eval_job` (the heuristics on every source at one load; partition: the load),
    `eval_summary_job` (their summary), `rl_job`, `results_job` and `ablation_job`."""
    tags = {PROFILE_TAG: profile}
    raw_assets = [a for a in assets if all(k.path[-1].startswith("raw_") for k in a.keys)]
    raw = [
        define_asset_job(
            raw_job_name(a.key.path[-1]),
            selection=AssetSelection.assets(a),
            partitions_def=a.partitions_def,
            description=f"Ingest one shard of `{a.key.path[-1]}` (a run per shard file).",
            tags=tags,
        )
        for a in raw_assets
    ]
    per_source = define_asset_job(
        "per_source_job",
        selection=AssetSelection.groups(*PER_SOURCE_GROUPS),
        partitions_def=SOURCE_PARTITIONS,
        description="Canonical tables and the long-running filter for one trace source.",
        config=_ops_config(assets, PER_SOURCE_GROUPS, profile_config) or None,
        tags=tags,
    )
    from assets.ec import (
        SOURCE_METHOD_PARTITIONS,
        ec__classifier_accuracy,
        ec__mapping,
        ec__method_gain,
        ec__method_sweep,
    )

    ec_sweep = define_asset_job(
        "ec_sweep_job",
        selection=AssetSelection.assets(ec__method_sweep),
        partitions_def=SOURCE_METHOD_PARTITIONS,
        description="One EC distance method's k sweep on one source (a run per source and method).",
        config=ops_config_of({"ec__method_sweep"}, profile_config) or None,
        tags=tags,
    )
    ec_gain = define_asset_job(
        "ec_gain_job",
        selection=AssetSelection.assets(ec__method_gain),
        partitions_def=SOURCE_METHOD_PARTITIONS,
        description="Table 1 (prediction gain over forecaster seeds, random control) of one EC method's mappings "
        "on one source; reads every method's sweep of the source (the common k).",
        config=ops_config_of({"ec__method_gain"}, profile_config) or None,
        tags=tags,
    )
    ec = define_asset_job(
        "ec_job",
        selection=AssetSelection.assets(ec__mapping, ec__classifier_accuracy),
        partitions_def=SOURCE_PARTITIONS,
        description="The EC mapping of one source (chosen from the methods' Table 1 rows), each method's own "
        "mapping, the EC profiles and the EC classifier.",
        config=ops_config_of({"ec__mapping", "ec__classifier_accuracy"}, profile_config) or None,
        tags=tags,
    )
    from assets.cluster import EVAL_PARTITIONS, eval__baselines, eval__summary

    evaluation = AssetSelection.assets(eval__baselines, eval__summary)
    cluster = define_asset_job(
        "cluster_job",
        selection=AssetSelection.groups(*GLOBAL_GROUPS) - evaluation,
        description="Job sequences for the simulator, and how well the EC classifier labels their jobs.",
        config=ops_config_of(
            _op_names(assets, GLOBAL_GROUPS) - {"eval__baselines", "eval__summary"}, profile_config
        )
        or None,
        tags=tags,
    )
    eval_job = define_asset_job(
        "eval_job",
        selection=AssetSelection.assets(eval__baselines),
        partitions_def=EVAL_PARTITIONS,
        description="Every heuristic scheduler on every source's test sequences at one load (a run per load).",
        config=ops_config_of({"eval__baselines"}, profile_config) or None,
        tags=tags,
    )
    eval_summary = define_asset_job(
        "eval_summary_job",
        selection=AssetSelection.assets(eval__summary),
        description="Means and intervals of the heuristics' metrics over every load evaluated.",
        tags=tags,
    )
    from assets.rl import ABLATION_PARTITIONS, RL_PARTITIONS, rl__ablation, rl__tvw_rl
    from assets.rl_baselines import rl__deeprm, rl__dejavu

    rl = define_asset_job(
        "rl_job",
        selection=AssetSelection.assets(rl__tvw_rl, rl__deeprm, rl__dejavu),
        partitions_def=RL_PARTITIONS,
        description="Train the learned schedulers (TVW-RL, DeepRM's agent, Dejavu) for one (load, training seed) "
        "on every source with training sequences.",
        config=_ops_config(assets, ("rl",), profile_config) or None,
        tags=tags,
    )
    results = define_asset_job(
        "results_job",
        selection=AssetSelection.groups("results"),
        description="Every registered policy, learned ones included, on every test sequence; the summary.",
        config=_ops_config(assets, ("results",), profile_config) or None,
        tags=tags,
    )
    ablation = define_asset_job(
        "ablation_job",
        selection=AssetSelection.assets(rl__ablation),
        partitions_def=ABLATION_PARTITIONS,
        description="One TVW-RL ablation run (TVW-RL Tables 2-3); launched on demand, not by tvw-run.",
        config=_ops_config(assets, ("ablation",), profile_config) or None,
        tags=tags,
    )
    return [*raw, per_source, ec_sweep, ec_gain, ec, cluster, eval_job, eval_summary, rl, results, ablation]
