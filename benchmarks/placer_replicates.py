"""Pool `bench_placer.py` replicates of one cell: each `--out` folder holds one seed's OUT/test_returns_m10.parquet
(every policy's return per test sequence; a seed draws its own sequences, fits and training). Prints, for the
learned policy (`forecast_residual_rl`) against its base rule, each replicate's best non-oracle heuristic (chosen
by that replicate's test mean among the request-based heuristics, the hybrid and Google's predictors) and each
forecast rule: the paired difference per replicate and pooled over every test sequence of every replicate, with
its 95 % t-interval and how many sequences are better and worse; the pooled row also counts the replicates whose
own interval is above 0 and below 0 (the pooled interval alone hides seeds that disagree). Then the bar's other
clauses: each policy's mean overshoot and machines used (`footprint`). `--out` writes the comparison rows.
`--versus` pairs each folder's learned policy with another run's on the same test sequences (same source, load
and seed, another configuration): the comparison "versus", ours here - ours there. `--ours
forecast_residual_rl_replay` takes the learned policy as `bench_placer.py --replay-guard` guarded it for ours (the
comparison "forecast_residual_rl" is then ours - the policy unguarded).

    python benchmarks/placer_replicates.py /tmp/placer_s0 /tmp/placer_s1 /tmp/placer_s2 [--machines 10]
        [--versus /tmp/old_s0 /tmp/old_s1 /tmp/old_s2] [--ours forecast_residual_rl_replay] [--out pooled.parquet]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

from models.forecast_placer import paired_interval
from sim.policies import policy_kind

OURS = "forecast_residual_rl"
OVERSHOOT_POINTS = 0.5
"""The bar's overshoot clause: at most Tetris's mean overshoot + this many percentage points."""


def footprint_clauses(over: float, used: float, tetris_over: float, tetris_used: float) -> tuple[bool, bool]:
    """The bar's two footprint clauses for a mean overshoot (%) and mean machines used against Tetris's: (within
    Tetris's overshoot + `OVERSHOOT_POINTS`, no more machines than Tetris)."""
    return over <= tetris_over + OVERSHOOT_POINTS, used <= tetris_used + 1e-9


def comparisons(returns: pl.DataFrame, ours_name: str = OURS) -> tuple[dict[str, np.ndarray], str | None]:
    """({label: ours - other per test sequence}, the best heuristic's name) of one replicate's returns (sequence
    order): the base rule, the best heuristic (by this replicate's mean; label "best heuristic"), every forecast
    rule it holds and, where `ours_name` is another learned row (a guarded policy), every other learned row (the
    plain learned policy, another guard variant)."""
    by_policy = {
        name: part.sort("sequence")["return"].to_numpy()
        for (name,), part in returns.group_by("policy", maintain_order=True)
    }
    if ours_name not in by_policy:
        raise ValueError(f"no {ours_name!r} rows (policies: {sorted(by_policy)})")
    ours = by_policy[ours_name]
    sizes = {name: r.size for name, r in by_policy.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"policies ran different numbers of test sequences: {sizes}")
    ids = {name: tuple(sorted(part["sequence"].to_list())) for (name,), part in returns.group_by("policy")}
    if len(set(ids.values())) != 1:
        raise ValueError(f"policies ran different test sequences: {ids}")
    out, best = {}, None
    bases = [n for n in by_policy if n.startswith("base:")]
    if bases:
        out["base rule"] = ours - by_policy[bases[0]]
    # the learned rows (the policy, and as `bench_placer.py --replay-guard` guards it) are not registered rules
    named = [n for n in by_policy if not n.startswith(OURS) and not n.startswith("base:")]
    for other in (n for n in by_policy if n.startswith(OURS) and n != ours_name):  # unguarded, other guards
        out[other] = ours - by_policy[other]
    heuristics = [n for n in named if policy_kind(n) == "heuristic"]
    if heuristics:
        best = max(heuristics, key=lambda n: by_policy[n].mean())
        out["best heuristic"] = ours - by_policy[best]
    for name in (n for n in named if policy_kind(n) == "forecast"):
        out[name] = ours - by_policy[name]
    return out, best


def versus_diff(returns: pl.DataFrame, other: pl.DataFrame, where: str) -> np.ndarray:
    """Ours in `returns` - ours in `other` per test sequence, after checking that both ran the same test
    sequences: the same sequence ids and Tetris's returns equal (`np.allclose`; ValueError naming `where`)."""

    def by_sequence(frame: pl.DataFrame, name: str) -> pl.DataFrame:
        part = frame.filter(pl.col("policy") == name).sort("sequence")
        if part.height == 0:
            raise ValueError(f"{where}: no {name!r} rows")
        return part

    mine, theirs = by_sequence(returns, OURS), by_sequence(other, OURS)
    tetris_mine, tetris_theirs = by_sequence(returns, "tetris"), by_sequence(other, "tetris")
    ids = [frame["sequence"].to_list() for frame in (mine, theirs, tetris_mine, tetris_theirs)]
    same = all(i == ids[0] for i in ids) and np.allclose(
        tetris_mine["return"].to_numpy(), tetris_theirs["return"].to_numpy()
    )
    if not same:
        raise ValueError(
            f"{where}: the two runs did not test the same sequences (ids or Tetris's returns differ)"
        )
    return mine["return"].to_numpy() - theirs["return"].to_numpy()


def pooled(
    folders: list[Path], n_machines: int, versus: list[Path] | None = None, ours_name: str = OURS
) -> pl.DataFrame:
    """One row per (replicate or "pooled", comparison): mean, 95 % interval, sequences better and worse.
    `versus`: one folder per folder, whose learned policy each is paired with (`versus_diff`)."""
    if versus is not None and len(versus) != len(folders):
        raise ValueError(f"--versus needs one folder per folder: {len(versus)} for {len(folders)}")
    rows, pooled_diffs = [], {}
    for i, folder in enumerate(folders):
        returns = replicate_returns(folder, n_machines)
        diffs, best = comparisons(returns, ours_name)
        if versus is not None:
            other = replicate_returns(versus[i], n_machines)
            diffs["versus"] = versus_diff(returns, other, f"{folder} against {versus[i]}")
        for label, diff in diffs.items():
            pooled_diffs.setdefault(label, []).append(diff)
            rows.append(
                _row(
                    str(folder),
                    returns["seed"][0],  # one seed per file (`replicate_returns`)
                    label if label != "best heuristic" else f"{label} ({best})",
                    diff,
                )
            )
    if not rows:
        raise ValueError(f"no replicates in {folders}")
    for label, diffs in pooled_diffs.items():
        if len(diffs) != len(folders):
            print(f"WARN: {label!r} is in {len(diffs)} of {len(folders)} replicates; pooled over those")
        row = _row("pooled", None, label, np.concatenate(diffs))
        # the replicates' own verdicts: the pooled interval treats 3 x 30 sequences as one sample and so hides
        # how far the seeds disagree (a seed far above can carry the pooled mean over one below)
        verdicts = [paired_interval(d) for d in diffs]
        row["n_replicates_above"] = sum(lo > 0 for _, lo, _ in verdicts)
        row["n_replicates_below"] = sum(hi < 0 for _, _, hi in verdicts)
        rows.append(row)
    return pl.DataFrame(rows)


def replicate_returns(folder: Path, n_machines: int) -> pl.DataFrame:
    """One replicate's OUT/test_returns_m{M}.parquet; FileNotFoundError naming it where it is missing, ValueError
    where it holds more than one seed."""
    path = folder / f"test_returns_m{n_machines}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no per-sequence test returns (run bench_placer.py --out {folder})")
    returns = pl.read_parquet(path)
    seeds = returns["seed"].unique().to_list()
    if len(seeds) != 1:
        raise ValueError(f"{path}: one replicate per file expected, found seeds {seeds}")
    return returns


def footprint(folders: list[Path], n_machines: int, ours_name: str = OURS) -> pl.DataFrame | None:
    """The bar's other two clauses, per replicate and pooled: the mean overshoot (%) and machines used of the
    learned policy, Tetris, the replicate's best heuristic and each forecast rule, and whether ours is within
    Tetris's overshoot + 0.5 point and uses no more machines than Tetris. None where a file predates those columns
    (`bench_placer.py` wrote returns only before 2026-12-05)."""
    rows, per_folder = [], []
    for folder in folders:
        returns = replicate_returns(folder, n_machines)
        if "overshoot_pct" not in returns.columns:
            return None
        _, best = comparisons(returns, ours_name)
        means = {
            name: part.select(pl.col("overshoot_pct", "machines").mean()).row(0)
            for (name,), part in returns.group_by("policy")
        }
        per_folder.append(means)
        # once each: Tetris may be the best heuristic too (its row then says so)
        shown = list(dict.fromkeys([ours_name, "tetris", *([best] if best else [])]))
        if OURS in means and OURS not in shown:  # the unguarded policy beside the guarded one (`--ours`)
            shown.append(OURS)
        shown += sorted(
            n for n in means if n not in shown and not n.startswith(OURS) and policy_kind(n) == "forecast"
        )
        for name in shown:
            rows.append(_footprint_row(str(folder), name, means[name], means["tetris"], best))
    table = pl.DataFrame(rows)
    # from the replicates' means, not the table's rows, whose labels name the best heuristic
    pooled_means = {
        name: tuple(float(np.mean([m[name][i] for m in per_folder])) for i in (0, 1))
        for name in (ours_name, "tetris")
    }
    pooled_row = _footprint_row("pooled", ours_name, pooled_means[ours_name], pooled_means["tetris"], None)
    return pl.concat([table, pl.DataFrame([pooled_row])])


def _footprint_row(
    replicate: str, name: str, mine: tuple[float, float], tetris: tuple[float, float], best: str | None
) -> dict:
    """One `footprint` row: a policy's mean overshoot and machines and the bar's clauses against Tetris's."""
    within, no_more = footprint_clauses(*mine, *tetris)
    return {
        "replicate": replicate,
        "policy": name if name != best else f"{name} (best heuristic)",
        "overshoot_pct": mine[0],
        "machines": mine[1],
        "within_tetris_overshoot_0_5": within,
        "no_more_machines_than_tetris": no_more,
    }


def _row(replicate: str, seed, label: str, diff: np.ndarray) -> dict:
    mean, lo, hi = paired_interval(diff)
    return {
        "replicate": replicate,
        "seed": seed,
        "comparison": label,
        "n_sequences": int(diff.size),
        "mean_x1e6": mean / 1e6,
        "low_x1e6": lo / 1e6,
        "high_x1e6": hi / 1e6,
        "n_better": int((diff > 0).sum()),
        "n_worse": int((diff < 0).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="bench_placer.py --out folders, one per seed")
    ap.add_argument("--machines", type=int, default=10, help="M of the test returns (10, or 50 on DeepPlace)")
    ap.add_argument(
        "--versus",
        nargs="+",
        type=Path,
        default=None,
        help="one folder per folder: another configuration's run on the same seeds, whose learned policy each "
        "folder's is paired with",
    )
    ap.add_argument(
        "--ours",
        default=OURS,
        help="the learned row to judge (forecast_residual_rl_replay: as bench_placer.py --replay-guard guards it)",
    )
    ap.add_argument("--out", default=None, help="write the rows to this parquet file")
    args = ap.parse_args()
    table = pooled(args.folders, args.machines, args.versus, args.ours)
    feet = footprint(args.folders, args.machines, args.ours)
    with pl.Config(tbl_rows=200, tbl_cols=-1, tbl_width_chars=250, float_precision=3, fmt_str_lengths=60):
        print(table)
        if feet is None:
            print("overshoot and machines: not in these files (bench_placer.py before 2026-12-05)")
        else:
            print(feet)
    if args.out:
        table.write_parquet(args.out)


if __name__ == "__main__":
    main()
