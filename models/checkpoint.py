"""One file format for every learned policy: resumable checkpoints while it trains, a trained policy when it is done.

Two kinds of file, never the same one:

* the **checkpoint** (`checkpoint_file(policy)`, in `<policy stem>.ckpt/`): what a training run needs to resume
  (weights, optimiser, generators, curve, ...), written every few iterations by the trainer (`save_atomic`);
* the **trained policy** (`<policy>.pt`) and its JSON **sidecar** (`<policy>.json`): published together by
  `publish_policy`, once, when training has run all its iterations.

A policy file holds at least `policy_format` (POLICY_FORMAT), `policy`, `config`, `iteration` and `n_iterations`, plus its
weights; its sidecar names the run (RUN_KEYS), the configuration, the git revision, and the same two iteration
counts. `publish_policy` refuses a payload whose iteration is short of n_iterations, writes both files to temporary
names, removes any previous policy, then renames the sidecar and last the policy: a reader that finds the policy
finds its sidecar. `check_trained` is the loader's gate: it refuses (ValueError naming the file) a policy without a
sidecar, with a sidecar that records no iteration counts, or whose iteration count is short of its config's.

Every file is written to a temporary name in the same folder, flushed to disk, then renamed (`save_atomic`): a
killed run never leaves half a file under a final name. Loads use `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import torch

POLICY_FORMAT = "tvw-policy/1"
"""`format` of a trained policy file (and of its sidecar)."""
RUN_KEYS = ("policy", "source", "load_pct", "seed")
"""Sidecar fields that name the training run; the loader compares them with the run asked for."""
ITERATION_KEYS = ("iteration", "n_iterations")
"""Iterations the policy was trained for, and the number its configuration asks for (sidecar and policy file)."""


def checkpoint_dir(policy: Path) -> Path:
    """The folder of the resumable checkpoints of the trained policy file `policy`: `<stem>.ckpt/`."""
    return Path(policy).with_suffix(".ckpt")


def checkpoint_file(policy: Path) -> Path:
    """The one resumable checkpoint of a trainer that keeps a single one (TVW-RL, DeepRM)."""
    return checkpoint_dir(policy) / "checkpoint.pt"


def iteration_file(folder: Path, stem: str, iteration: int) -> Path:
    """The checkpoint of `iteration` of a trainer that keeps one per checkpointed iteration (Dejavu):
    `<folder>/<stem>_iter<iteration, 7 digits>.pt`, so the names sort by iteration."""
    return Path(folder) / f"{stem}_iter{iteration:07d}.pt"


def latest_iteration_file(folder: Path, stem: str) -> Path | None:
    """The `iteration_file` of the highest iteration in `folder`, or None."""
    found = sorted(Path(folder).glob(f"{stem}_iter*.pt")) if Path(folder).exists() else []
    return found[-1] if found else None


def prune_iterations(folder: Path, stem: str) -> None:
    """Remove every `iteration_file` of `folder` but the latest (a resumed run needs only that one)."""
    latest = latest_iteration_file(folder, stem)
    for old in Path(folder).glob(f"{stem}_iter*.pt"):
        if old != latest:
            old.unlink()


def resume_message(policy: str, iteration: int, n_iterations: int) -> str:
    """The line a trainer logs when it resumes from a checkpoint."""
    return f"resuming {policy} from iteration {iteration} of {n_iterations}"


# ---------------------------------------------------------------- atomic writes, safe reads


def _write_atomic(path: Path, data: bytes) -> None:
    """`data` to a temporary file beside `path`, flushed to disk, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _torch_bytes(payload: Mapping) -> bytes:
    buf = io.BytesIO()
    torch.save(dict(payload), buf)
    return buf.getvalue()


def save_atomic(path: Path, payload: Mapping) -> Path:
    """`torch.save(payload)` to `path`, written under a temporary name and renamed (never half a file)."""
    _write_atomic(Path(path), _torch_bytes(payload))
    return Path(path)


def read_payload(path: Path, what: str = "checkpoint") -> dict:
    """The dict saved in `path` (weights_only=True, on the CPU). FileNotFoundError naming the file when it is
    missing; ValueError naming it when it is corrupt, truncated or not a dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged zip or pickle
        raise ValueError(f"{what} {path} is corrupt or truncated: {type(err).__name__}: {err}") from err
    if not isinstance(payload, dict):
        raise ValueError(f"{what} {path} holds a {type(payload).__name__}, not a tvw {what}")
    return payload


def config_diff(saved: Mapping, wanted: Mapping, prefix: str = "") -> list[str]:
    """Dotted names, with both values, of the fields that differ between two nested config dicts."""
    out = []
    for k in sorted(set(saved) | set(wanted)):
        a, b = wanted.get(k), saved.get(k)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += config_diff(b, a, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {b!r} in the checkpoint, {a!r} now")
    return out


def check_config(path: Path, saved: Mapping, wanted: Mapping, what: str = "checkpoint") -> None:
    """ValueError naming the file (and the fields differing) when the config `saved` in it is not `wanted`: a
    run resumes only from a checkpoint of the same configuration."""
    diff = config_diff(saved, wanted)
    if diff:
        raise ValueError(
            f"{what} {path} was trained with another configuration (fields differing: {diff}); "
            "delete it or train with the same configuration"
        )


# ---------------------------------------------------------------- sidecars


def sidecar_path(policy: Path) -> Path:
    """The JSON sidecar of the trained policy file `policy` (same name, suffix .json)."""
    return Path(policy).with_suffix(".json")


def make_sidecar(
    policy: str,
    source: str | None,
    load_pct: int | None,
    seed: int,
    config: Mapping,
    revision: str,
    iteration: int,
    n_iterations: int,
) -> dict:
    """The sidecar of one trained policy: the run (RUN_KEYS), its iteration counts, git revision and config. A
    `source` or `load_pct` of None (a policy trained outside a (source, load) run, e.g. by a benchmark) is left
    out: `check_run` does not compare a field the sidecar lacks."""
    sidecar = {
        "format": POLICY_FORMAT,
        "policy": policy,
        "source": source,
        "load_pct": None if load_pct is None else int(load_pct),
        "seed": int(seed),
        "iteration": int(iteration),
        "n_iterations": int(n_iterations),
        "git_revision": revision,
        "config": dict(config),
    }
    return {k: v for k, v in sidecar.items() if v is not None or k not in ("source", "load_pct")}


def write_sidecar(policy: Path, sidecar: Mapping) -> Path:
    """Write `sidecar` as the JSON next to `policy` (atomically); returns the sidecar's path."""
    path = sidecar_path(policy)
    _write_atomic(path, json.dumps(dict(sidecar), indent=2, default=str).encode())
    return path


def read_sidecar(policy: Path) -> dict | None:
    """The sidecar of the trained policy `policy` as a dict, None when there is none; ValueError naming the file
    when it is not a JSON object."""
    path = sidecar_path(policy)
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def check_run(policy: Path, meta: Mapping, want: Mapping) -> None:
    """ValueError naming the file when a RUN_KEYS field of the sidecar `meta` disagrees with `want`."""
    bad = {k: meta[k] for k, v in want.items() if k in meta and meta[k] != v}
    if bad:
        raise ValueError(
            f"{policy}: its sidecar {sidecar_path(policy).name} describes another run ({bad}, wanted {dict(want)})"
        )


# ---------------------------------------------------------------- publishing and checking a trained policy


def _short_of(meta: Mapping) -> tuple[int, int] | None:
    """(iteration, n_iterations) when the counts in `meta` say training stopped early, else None."""
    done, planned = int(meta["iteration"]), int(meta["n_iterations"])
    return (done, planned) if done < planned else None


def publish_policy(path: Path, payload: Mapping, sidecar: Mapping) -> Path:
    """Publish the trained policy `path` (`payload`, torch) and its sidecar together (module docstring).

    ValueError naming the file when `payload` or `sidecar` lacks ITERATION_KEYS, when they disagree, or when the
    iteration count is short of n_iterations (a half-trained network is never published)."""
    path = Path(path)
    for name, meta in (("policy", payload), ("sidecar", sidecar)):
        missing = [k for k in ITERATION_KEYS if k not in meta]
        if missing:
            raise ValueError(f"publish_policy {path}: the {name} lacks {missing}")
    counts = {k: int(payload[k]) for k in ITERATION_KEYS}
    if counts != {k: int(sidecar[k]) for k in ITERATION_KEYS}:
        raise ValueError(f"publish_policy {path}: policy {counts} and sidecar iteration counts differ")
    if short := _short_of(payload):
        raise ValueError(f"publish_policy {path}: trained {short[0]} of {short[1]} iterations; not published")
    policy_bytes = _torch_bytes({"policy_format": POLICY_FORMAT, **payload})
    side = sidecar_path(path)
    side_tmp, policy_tmp = side.with_name(side.name + ".tmp"), path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(side_tmp, json.dumps(dict(sidecar), indent=2, default=str).encode())
    _write_atomic(policy_tmp, policy_bytes)
    # the policy goes first and comes last: whoever finds it finds the sidecar written with it
    path.unlink(missing_ok=True)
    os.replace(side_tmp, side)
    os.replace(policy_tmp, path)
    return path


def check_trained(path: Path, retrain: str = "retrain it", payload: Mapping | None = None) -> dict:
    """The sidecar of the trained policy `path` once it is known complete. ValueError naming the file (and
    `retrain`, what to do) when the sidecar is missing, records no iteration counts, or the policy's iteration
    count (sidecar and file) is short of its configuration's; FileNotFoundError when the policy is missing.
    `payload`: the file's dict when the caller has read it already (`read_payload`; not read again)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trained policy at {path} ({retrain})")
    meta = read_sidecar(path)
    if meta is None:
        raise ValueError(
            f"{path}: no sidecar {sidecar_path(path).name}: not a published policy (an unfinished or "
            f"foreign file); {retrain}"
        )
    if any(k not in meta for k in ITERATION_KEYS):
        raise ValueError(
            f"{path}: its sidecar records no iteration count (written before policies were published apart "
            f"from checkpoints): it may be half-trained; {retrain}"
        )
    if short := _short_of(meta):
        raise ValueError(f"{path}: trained {short[0]} of its config's {short[1]} iterations; {retrain}")
    if payload is None:
        payload = read_payload(path, "trained policy")
    if payload.get("iteration") != meta["iteration"]:
        raise ValueError(
            f"{path}: the file holds iteration {payload.get('iteration')!r}, its sidecar says "
            f"{meta['iteration']}: not the policy the sidecar was written for; {retrain}"
        )
    return meta


def publish_trained(
    path: Path,
    payload: Mapping,
    source: str | None,
    load_pct: int | None,
    seed: int,
    config: Mapping,
    revision: str,
) -> Path:
    """`publish_policy` of `payload` (a trainer's `policy_payload`) with the sidecar of its run: the policy name
    and iteration counts come from the payload, the run (source, load %, seed; `make_sidecar` leaves out a None),
    config and revision from the caller."""
    sidecar = make_sidecar(
        payload["policy"],
        source,
        load_pct,
        seed,
        config,
        revision,
        payload["iteration"],
        payload["n_iterations"],
    )
    return publish_policy(path, payload, sidecar)


def check_sidecar(
    path: Path, policy: str, source: str, load: int, seed: int, retrain: str = "retrain it"
) -> dict:
    """The sidecar of the trained policy `path` once it is known complete (`check_trained`) and of the run asked
    for; ValueError naming the file (and `retrain`) otherwise. A RUN_KEYS field the sidecar lacks is not an error;
    one that disagrees is."""
    meta = check_trained(path, retrain)
    check_run(path, meta, dict(zip(RUN_KEYS, (policy, source, load, seed), strict=True)))
    return meta


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
