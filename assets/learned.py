"""What the learned schedulers' assets share: where a trained policy lives in the warehouse, training one policy
per source of a (load, seed) partition, and loading a trained policy back as a registry scheduler.

A trained policy of (policy, source, load %, training seed) is `models/<policy>/<source>/load<L>-seed<S>.pt` under
the warehouse (`policy_path`), its resumable checkpoints in `load<L>-seed<S>.ckpt/`. The file format, the sidecar
and the rules (published together only when training is complete, refused when the sidecar is missing, short of
iterations or names another run) are `models.checkpoint`'s: a half-trained file, or one copied to the wrong place,
is a clear error naming it, not a wrong policy.
"""

from collections.abc import Callable
from pathlib import Path

import polars as pl
from dagster import AssetExecutionContext, MetadataValue, StaticPartitionsDefinition

from assets.cluster import EVAL_LOADS
from assets.plots import png_markdown
from assets.resources import Warehouse
from models.ablation import curve_trend
from models.checkpoint import check_sidecar, git_revision
from models.learned import RL_SEEDS
from models.training import curve_frame, stack_curves
from sim.policies import make_policy

RL_PARTITIONS = StaticPartitionsDefinition(
    [f"load{load}-seed{seed}" for load in EVAL_LOADS for seed in RL_SEEDS]
)
"""One training run per (load, training seed); every source with training sequences at that load inside it."""

TRAINING_ASSET = {"tvw_rl": "rl__tvw_rl", "deeprm_rl": "rl__deeprm", "dejavu": "rl__dejavu"}
"""Learned policy name -> the asset that trains it (the ones `load_learned` loads)."""


def parse_rl_partition(key: str) -> tuple[int, int]:
    """'load50-seed1' -> (50, 1)."""
    load, seed = key.split("-")
    return int(load.removeprefix("load")), int(seed.removeprefix("seed"))


def policy_path(warehouse: Warehouse, policy: str, source: str, load_pct: int, seed: int) -> Path:
    """`models/<policy>/<source>/load<load_pct>-seed<seed>.pt` under the warehouse."""
    return Path(warehouse.root) / "models" / policy / source / f"load{load_pct}-seed{seed}.pt"


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
    check_sidecar(path, name, source, load, seed, f"materialise {TRAINING_ASSET[name]}")
    return make_policy(name, checkpoint=path, **kwargs)


def train_partition(
    context: AssetExecutionContext,
    warehouse: Warehouse,
    sequences: pl.DataFrame,
    settings,
    policy: str,
    fit: Callable[[str, pl.DataFrame, Path, int, int, str], list | pl.DataFrame],
    schema: dict,
) -> tuple[pl.DataFrame, dict]:
    """Train `policy` on every source of the partition's load that `settings.train_sources` picks: `fit(source,
    training rows, policy file, load, seed, git revision)` trains and publishes one and returns its curve. Returns
    the stacked learning curves (`schema`) and the metadata every training asset reports."""
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
        curve = fit(source, train.filter(pl.col("source") == source), path, load, seed, revision)
        saved[source] = str(path)
        frames.append(curve_frame(curve, source, load, seed))
    out = stack_curves(frames, schema)
    return out, {"policies": MetadataValue.json(saved), "git_revision": revision}


def curve_metadata(curve: pl.DataFrame, png: bytes, title: str, trend: bool = True) -> dict:
    """The learning-curve plot and (`trend`) the first-vs-last return of every run."""
    out = {"learning_curve": png_markdown(png, title)}
    if trend:
        out["first_vs_last_return"] = MetadataValue.json(curve_trend(curve).to_dicts())
    return out
