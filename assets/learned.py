"""What every learned scheduler's assets share: where a trained policy lives in the warehouse, the JSON sidecar
written next to it, loading it back as a registry scheduler, and the learning-curve frame of a training run.

A trained policy of (policy, source, load %, training seed) is `models/<policy>/<source>/load<L>-seed<S>.pt` under
the warehouse (`policy_path`); its sidecar `...json` (`write_sidecar`) holds the policy name, source, load, seed,
git revision and the configuration it was trained with. `load_learned` checks the sidecar against the run asked
for before it builds the scheduler, so a file copied to the wrong place is a clear error, not a wrong policy.
"""

import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from assets.resources import Warehouse
from models.deeprm import DeepRMAgentPolicy
from models.dejavu import DejavuPolicy
from models.tvw_rl import TvwRlPolicy

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

RUN_KEYS = ("policy", "source", "load_pct", "seed")
"""Sidecar fields that name the training run; `load_learned` compares them with the run asked for."""


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


def write_sidecar(
    path: Path, policy: str, source: str, load: int, seed: int, config: Mapping, revision: str
) -> Path:
    """Write the JSON next to the trained policy `path` (same name, suffix .json): what it is (RUN_KEYS), the
    configuration it was trained with and the git revision; returns the sidecar's path."""
    payload = {
        "policy": policy,
        "source": source,
        "load_pct": int(load),
        "seed": int(seed),
        "git_revision": revision,
        "config": dict(config),
    }
    sidecar = path.with_suffix(".json")
    sidecar.write_text(json.dumps(payload, indent=2, default=str))
    return sidecar


def read_sidecar(path: Path) -> dict | None:
    """The sidecar of the trained policy `path` as a dict, None when there is none; ValueError naming the file
    when it is not a JSON object."""
    sidecar = path.with_suffix(".json")
    if not sidecar.exists():
        return None
    try:
        meta = json.loads(sidecar.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{sidecar}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise ValueError(f"{sidecar}: expected a JSON object, got {type(meta).__name__}")
    return meta


def check_sidecar(path: Path, policy: str, source: str, load: int, seed: int) -> None:
    """ValueError naming the file when the sidecar of `path` describes another run. A RUN_KEYS field the sidecar
    lacks is not an error (sidecars written before it was recorded); one that disagrees is."""
    meta = read_sidecar(path)
    if meta is None:
        return
    want = dict(zip(RUN_KEYS, (policy, source, load, seed), strict=True))
    bad = {k: meta[k] for k, v in want.items() if k in meta and meta[k] != v}
    if bad:
        raise ValueError(
            f"{path}: its sidecar {path.with_suffix('.json').name} describes another run ({bad}, wanted {want})"
        )


def load_learned(name: str, source: str, load: int, seed: int, warehouse: Warehouse, **kwargs):
    """The trained scheduler `name` (a LEARNED_BUILDERS key) of (source, load %, training seed) from the warehouse,
    as the evaluation runs it; `kwargs` go to its class (e.g. TVW-RL's `labeller`). FileNotFoundError naming the
    file and the asset to materialise when it was not trained there; ValueError when its sidecar says it is
    another run or the file is damaged."""
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
