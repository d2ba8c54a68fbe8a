"""What learned schedulers' assets share: each policy's file (`models/<policy>/<source>/load<L>-seed<S>.pt`
in the warehouse, resumable checkpoints in `load<L>-seed<S>.ckpt/`), training one policy per source of a (load,
seed) partition, loading a complete trained policy of the run asked for back as a scheduler (`load_learned`)."""

import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import polars as pl

from assets.plots import png_markdown
from assets.resources import Warehouse
from models.ablation import curve_trend
from models.checkpoint import check_sidecar, git_revision
from models.learned import RL_SEEDS, TRAINED_AS, parse_rl_partition, rl_partition_keys
from models.training import curve_frame, stack_curves
from sim.evaluate import EVAL_LOADS
from sim.policies import is_learned, make_policy

RL_PARTITIONS = dg.StaticPartitionsDefinition(rl_partition_keys(EVAL_LOADS, RL_SEEDS))
"""One training run per (load, training seed); every source with training sequences at that load inside it."""
RL_TRAINING = {
    "partitions_def": RL_PARTITIONS,
    "group_name": "rl",
    "io_manager_key": "table_io",
    "kinds": {"parquet", "torch"},
}
"""What every training asset is: a learning-curve table per (load, seed) partition, trained files beside it."""
RESULTS_TABLE = {"group_name": "results", "io_manager_key": "table_io", "kinds": {"parquet", "polars"}}
"""What every results table is."""

TRAINING_ASSET = {
    "tvw_rl": "rl__tvw_rl",
    "deeprm_rl": "rl__deeprm",
    "dejavu": "rl__dejavu",
    "forecast_residual_rl": "rl__forecast_residual",
}
TRAINING_ASSET |= {name: TRAINING_ASSET[trained] for name, trained in TRAINED_AS.items()}
"""Learned policy name -> the asset that trains its file (the ones `load_learned` loads; see `TRAINED_AS`)."""
LOAD_OF_RUN = dg.StaticPartitionMapping({k: k.split("-")[0] for k in RL_PARTITIONS.get_partition_keys()})
RESULTS_DEPS = [dg.AssetDep(n, partition_mapping=LOAD_OF_RUN) for n in sorted(set(TRAINING_ASSET.values()))]
"""eval__results[load<L>] waits for every training run (load<L>-seed<S>) of every learned policy."""


def policy_path(warehouse: Warehouse, policy: str, source: str, load_pct: int, seed: int) -> Path:
    """`models/<policy>/<source>/load<load_pct>-seed<seed>.pt` under the warehouse (<policy>: as `TRAINED_AS`)."""
    trained = TRAINED_AS.get(policy, policy)
    return Path(warehouse.root) / "models" / trained / source / f"load{load_pct}-seed{seed}.pt"


def load_learned(name: str, source: str, load: int, seed: int, warehouse: Warehouse, **kwargs):
    """The trained scheduler `name` (a TRAINING_ASSET key) of (source, load %, training seed), as the evaluation
    runs it; `kwargs` go to its class (e.g. TVW-RL's `labeller`). FileNotFoundError naming the file and the asset
    to materialise when it was not trained there; ValueError naming the file when it is not a complete policy of
    that run (`models.checkpoint.check_sidecar`)."""
    if name not in TRAINING_ASSET:
        raise ValueError(f"load_learned: {name!r} is not one of {sorted(TRAINING_ASSET)}")
    path = policy_path(warehouse, name, source, load, seed)
    if not path.exists():
        raise FileNotFoundError(f"no trained {name} policy at {path} (materialise {TRAINING_ASSET[name]})")
    check_sidecar(path, TRAINED_AS.get(name, name), source, load, seed, f"materialise {TRAINING_ASSET[name]}")
    return make_policy(name, checkpoint=path, **kwargs)


def policy_maker(warehouse: Warehouse, missing: list[str] | None = None, labeller_of: Callable | None = None):
    """`make(name, source, load, seed)` of the evaluations: a heuristic from the registry, a learned policy from
    its trained file (TVW-RL with `labeller_of(source)`), None (listed in `missing`) where none was trained."""

    def make(name: str, source: str, load: int, seed: int):
        if not is_learned(name):
            return make_policy(name)
        if not policy_path(warehouse, name, source, load, seed).exists():
            if missing is not None:
                missing.append(f"{name} {source} {load}% seed {seed}")
            return None
        extra = {"labeller": labeller_of(source)} if labeller_of and name == "tvw_rl" else {}
        return load_learned(name, source, load, seed, warehouse, **extra)

    return make


def train_partition(
    context: dg.AssetExecutionContext,
    warehouse: Warehouse,
    sequences: pl.DataFrame,
    settings,
    policy: str,
    fit: Callable[[str, pl.DataFrame, Path, int, int, str], list | pl.DataFrame],
    schema: dict,
    timed: str = "",
) -> tuple[pl.DataFrame, dict]:
    """Train `policy` on every source of the partition's load that `settings.train_sources` picks: `fit(source,
    training rows, policy file, load, seed, git revision)` trains and publishes one and returns its curve (with
    `timed`, its wall time is logged under that name). Returns the stacked learning curves (`schema`) and the
    metadata every training asset reports."""
    load, seed = parse_rl_partition(context.partition_key)
    train = sequences.filter((pl.col("split") == "train") & (pl.col("load_pct") == load))
    have = sorted(train["source"].unique().to_list())
    sources = settings.train_sources(have)
    if not sources:
        raise ValueError(
            f"{context.op_def.name} {context.partition_key}: no training sequences for sources "
            f"{list(settings.sources) or 'all'} at load {load} % (sources with sequences: {have}); "
            "materialise sim__job_sequences first"
        )
    revision = git_revision()
    frames, saved = [], {}
    for source in sources:
        path = policy_path(warehouse, policy, source, load, seed)
        start = time.perf_counter()
        curve = fit(source, train.filter(pl.col("source") == source), path, load, seed, revision)
        if timed:
            context.log.info(f"{timed} {source}: trained in {time.perf_counter() - start:.1f} s")
        saved[source] = str(path)
        frames.append(curve_frame(curve, source, load, seed))
    out = stack_curves(frames, schema)
    return out, {"policies": dg.MetadataValue.json(saved), "git_revision": revision}


def curve_metadata(curve: pl.DataFrame, png: bytes, title: str, trend: bool = True) -> dict:
    """The learning-curve plot and (`trend`) the first-vs-last return of every run."""
    out = {"learning_curve": png_markdown(png, title)}
    if trend:
        out["first_vs_last_return"] = dg.MetadataValue.json(curve_trend(curve).to_dicts())
    return out
