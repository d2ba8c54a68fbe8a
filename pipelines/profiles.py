"""Profiles: the configuration in force for a run, and the environment an entry point reads.

A profile is a YAML file: `ops:` (each asset's config, in its settings dataclass's field names), `sources:` (per
source the layers it is run through and why, for a sample that cannot feed the later ones) and optionally
`extends:` (a profile whose settings these override, key by key). Every error is a `ProfileError` naming the
file and the key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

PROFILE_KEYS = ("extends", "ops", "sources")
DEFAULT_PROFILE = "quick"


class ProfileError(ValueError):
    """A profile names an op, key or value the assets do not accept; the message names it."""


def read_profile(profile: str, named: Mapping[str, Path]) -> dict:
    """`{"ops": ..., "sources": ...}` of a named profile (`named`: name -> YAML file) or of a YAML file's path,
    with what it extends merged in."""
    path = Path(named.get(profile, profile))
    if not path.is_file():
        raise ProfileError(
            f"unknown profile {profile!r}: use one of {', '.join(named)} or a YAML file's path"
        )
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict) or set(config) - set(PROFILE_KEYS):
        extra = sorted(set(config) - set(PROFILE_KEYS)) if isinstance(config, dict) else config
        raise ProfileError(f"{path}: unknown top-level key(s) {extra}; allowed: {', '.join(PROFILE_KEYS)}")
    for key in ("ops", "sources"):
        if not isinstance(config.get(key) or {}, dict):
            raise ProfileError(f"{path}: `{key}:` must be a mapping")
    loaded = {"ops": dict(config.get("ops") or {}), "sources": _sources(path, config.get("sources") or {})}
    base = config.get("extends")
    if base is None:
        return loaded
    parent = read_profile(str(base) if str(base) in named else str(path.parent / str(base)), named)
    return {"ops": merge(parent["ops"], loaded["ops"]), "sources": {**parent["sources"], **loaded["sources"]}}


def _sources(path: Path, sources: dict) -> dict:
    from pipelines.sources import SOURCES

    for name, entry in sources.items():
        if name not in SOURCES:
            raise ProfileError(f"{path}: sources.{name}: unknown source; known: {', '.join(SOURCES)}")
        if (
            not isinstance(entry, dict)
            or set(entry) != {"layers", "reason"}
            or not isinstance(entry["layers"], list)
        ):
            raise ProfileError(f"{path}: sources.{name}: expected `layers: [...]` and `reason: ...`")
    return dict(sources)


def merge(base: dict, over: dict) -> dict:
    """`over`'s settings on top of `base`'s, key by key (nested mappings merged, other values replaced)."""
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge(out[key], value) if nested else value
    return out


def with_shared_entries(ops: dict, shared: Mapping[str, Sequence[str]]) -> dict:
    """`ops` with each `shared` op's entry copied to the ops it configures too (an entry those ops have of
    their own is kept)."""
    out = dict(ops)
    for op, also in shared.items():
        if op in ops:
            out = {**dict.fromkeys(also, ops[op]), **out}
    return out


def expand_shared(ops: Mapping, shared: Mapping[str, Sequence[str]]) -> tuple[dict, dict[str, str]]:
    """(`with_shared_entries(ops, shared)`, copied op -> the op whose entry it got): errors in a copy are then
    named as the profile writes them."""
    written_as = {
        copy: op for op, copies in shared.items() if op in ops for copy in copies if copy not in ops
    }
    return with_shared_entries(dict(ops), shared), written_as


@dataclasses.dataclass(frozen=True)
class Environment:
    """What an entry point (`tvw-run`, the UI) reads from the environment, once."""

    traces: Path
    """TVW_TRACE_DIR: the trace folder (default: the embedded sample in `data/`)."""
    warehouse: Path
    """TVW_WAREHOUSE_DIR: where the Parquet tables and `tvw.duckdb` go (default: `warehouse/`)."""
    profile: str
    """TVW_PROFILE: the profile in force (default: `quick`, whatever the trace folder)."""
    scheduler: str | None
    """TVW_DASK_SCHEDULER: a Dask scheduler's address, or None (steps run in the run's own process)."""


def environment(project_root: Path) -> Environment:
    env = os.environ
    return Environment(
        traces=Path(env.get("TVW_TRACE_DIR", project_root / "data")).resolve(),
        warehouse=Path(env.get("TVW_WAREHOUSE_DIR", project_root / "warehouse")).resolve(),
        profile=env.get("TVW_PROFILE") or DEFAULT_PROFILE,
        scheduler=env.get("TVW_DASK_SCHEDULER") or None,
    )
