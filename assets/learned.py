"""What every learned scheduler's assets share: where a trained policy lives in the warehouse, publishing it with
its JSON sidecar, loading it back as a registry scheduler, and the learning-curve frame of a training run.

A trained policy of (policy, source, load %, training seed) is `models/<policy>/<source>/load<L>-seed<S>.pt` under
the warehouse (`policy_path`); its resumable checkpoints live apart, in `load<L>-seed<S>.ckpt/`
(`models.checkpoint.checkpoint_dir`). The file format, the sidecar and the rules (published together only when
training is complete, refused when the sidecar is missing or short of iterations) are `models.checkpoint`'s;
`load_learned` applies them and checks the sidecar against the run asked for before it builds the scheduler, so a
half-trained file, or one copied to the wrong place, is a clear error naming it, not a wrong policy.
"""

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from assets.resources import Warehouse
from models.checkpoint import RUN_KEYS, check_run, check_trained, publish_trained, read_sidecar
from models.deeprm import DeepRMAgentPolicy
from models.dejavu import DejavuPolicy
from models.tvw_rl import TvwRlPolicy

__all__ = [
    "LEARNED_BUILDERS",
    "RUN_KEYS",
    "TRAINING_ASSET",
    "check_sidecar",
    "curve_frame",
    "git_revision",
    "load_learned",
    "policy_path",
    "publish_trained",
    "read_sidecar",
    "stack_curves",
]

LEARNED_BUILDERS = {
    TvwRlPolicy.name: TvwRlPolicy,
    DeepRMAgentPolicy.name: DeepRMAgentPolicy,
    DejavuPolicy.name: DejavuPolicy,
}
"""Registered learned policy name -> the scheduler class built from its trained file (first argument: the path)."""

TRAINING_ASSET = {
    TvwRlPolicy.name: "rl__tvw_rl",
    DeepRMAgentPolicy.name: "rl__deeprm",
    DejavuPolicy.name: "rl__dejavu",
}
"""Learned policy name -> the asset that trains it."""


def policy_path(warehouse: Warehouse, policy: str, source: str, load_pct: int, seed: int) -> Path:
    """`models/<policy>/<source>/load<load_pct>-seed<seed>.pt` under the warehouse."""
    return Path(warehouse.root) / "models" / policy / source / f"load{load_pct}-seed{seed}.pt"


def git_revision() -> str:
    """The project's git revision (with '+dirty' when the tree has changes), or 'unknown' outside a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        ).stdout
        return rev + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def check_sidecar(path: Path, policy: str, source: str, load: int, seed: int) -> dict:
    """The sidecar of the trained policy `path` once it is known complete (`models.checkpoint.check_trained`) and
    of the run asked for; ValueError naming the file otherwise. A RUN_KEYS field the sidecar lacks is not an
    error; one that disagrees is."""
    name = TRAINING_ASSET.get(policy)
    meta = check_trained(path, f"materialise {name}" if name else "retrain it")
    check_run(path, meta, dict(zip(RUN_KEYS, (policy, source, load, seed), strict=True)))
    return meta


def load_learned(name: str, source: str, load: int, seed: int, warehouse: Warehouse, **kwargs):
    """The trained scheduler `name` (a LEARNED_BUILDERS key) of (source, load %, training seed) from the warehouse,
    as the evaluation runs it; `kwargs` go to its class (e.g. TVW-RL's `labeller`). FileNotFoundError naming the
    file and the asset to materialise when it was not trained there; ValueError naming the file when its sidecar
    is missing, records fewer iterations than its config asks for, or says it is another run, or the file is
    damaged."""
    if name not in LEARNED_BUILDERS:
        raise ValueError(f"load_learned: {name!r} is not one of {sorted(LEARNED_BUILDERS)}")
    path = policy_path(warehouse, name, source, load, seed)
    if not path.exists():
        raise FileNotFoundError(f"no trained {name} policy at {path} (materialise {TRAINING_ASSET[name]})")
    check_sidecar(path, name, source, load, seed)
    return LEARNED_BUILDERS[name](path, **kwargs)


def curve_frame(curve: Iterable[Mapping] | pl.DataFrame, source: str, load: int, seed: int) -> pl.DataFrame:
    """One training run's learning curve (the rows a trainer returns) with its source, load_pct and seed."""
    frame = curve if isinstance(curve, pl.DataFrame) else pl.DataFrame(list(curve))
    return frame.with_columns(
        source=pl.lit(source), load_pct=pl.lit(load, pl.Int32), seed=pl.lit(seed, pl.Int64)
    )


def stack_curves(frames: list[pl.DataFrame], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """The `curve_frame`s of a partition's runs as one table with exactly `schema`'s columns, in its order and
    types; a column no run reported is null (e.g. returns during Dejavu's pretraining)."""
    if not frames:
        raise ValueError("stack_curves: no learning curve to stack")
    out = pl.concat(frames, how="diagonal_relaxed")
    missing = [c for c in schema if c not in out.columns]
    out = out.with_columns([pl.lit(None, schema[c]).alias(c) for c in missing])
    return out.select([pl.col(c).cast(t) for c, t in schema.items()])
