"""Compare two warehouses table by table: the same tables, rows, columns and numbers?

    python benchmarks/compare_warehouses.py BEFORE_WAREHOUSE AFTER_WAREHOUSE [--rtol 1e-9] [--ignore REGEX]

Made for refactors (issue 18): run the same profile on the code before and after, then compare. Each table is read
whole from its Parquet files, both sides sorted by every column that is not a float, and compared cell by cell
(floats within `rtol`, NaN equal to NaN). Columns that record when, where or how long (wall times, paths, git
revisions) are left out by `--ignore`. One line per table; exit status 1 when any table differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import polars as pl

DEFAULT_IGNORE = r"(seconds|_s$|_ms$|time_s|wall|path|revision|written|created|file|elapsed|per_s$|rss)"


def read_table(root: Path, table: str) -> pl.DataFrame:
    files = sorted((root / "tables" / table).rglob("*.parquet"))
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed") if files else pl.DataFrame()


def tables(root: Path) -> set[str]:
    base = root / "tables"
    return (
        {p.name for p in base.iterdir() if p.is_dir() and any(p.rglob("*.parquet"))}
        if base.is_dir()
        else set()
    )


def compare(a: pl.DataFrame, b: pl.DataFrame, rtol: float, ignore: re.Pattern) -> str | None:
    """None when equal, else what differs."""
    if a.height != b.height:
        return f"rows {a.height} vs {b.height}"
    cols_a = {c for c in a.columns if not ignore.search(c)}
    cols_b = {c for c in b.columns if not ignore.search(c)}
    if cols_a != cols_b:
        return f"columns only before {sorted(cols_a - cols_b)}, only after {sorted(cols_b - cols_a)}"
    cols = sorted(cols_a)
    nested = [c for c in cols if a.schema[c].is_nested() or b.schema[c].is_nested()]
    a = a.with_columns(pl.col(c).map_elements(repr, return_dtype=pl.String) for c in nested)
    b = b.with_columns(pl.col(c).map_elements(repr, return_dtype=pl.String) for c in nested)
    floats = [c for c in cols if a.schema[c].is_float()]
    keys = [c for c in cols if c not in floats and a.schema[c].is_(b.schema[c])]
    a, b = a.select(cols), b.select(cols)
    if keys:
        a, b = a.sort(keys, nulls_last=True), b.sort(keys, nulls_last=True)
    for c in cols:
        if c in floats:
            x, y = a[c].to_numpy().astype(float), b[c].to_numpy().astype(float)
            if not np.allclose(x, y, rtol=rtol, atol=rtol, equal_nan=True):
                worst = np.nanmax(np.abs(x - y)) if np.isfinite(x - y).any() else float("nan")
                return f"column {c}: values differ (largest difference {worst:.3g})"
        elif (
            not a[c].cast(pl.String, strict=False).equals(b[c].cast(pl.String, strict=False), null_equal=True)
        ):
            return f"column {c}: values differ"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--rtol", type=float, default=1e-9)
    p.add_argument("--ignore", default=DEFAULT_IGNORE, help="regex of column names not compared")
    args = p.parse_args(argv)
    ignore = re.compile(args.ignore)
    before, after = tables(args.before), tables(args.after)
    differs = 0
    for table in sorted(before | after):
        if table not in after or table not in before:
            print(f"  {table:<34} only {'before' if table in before else 'after'}")
            differs += table in before
            continue
        what = compare(read_table(args.before, table), read_table(args.after, table), args.rtol, ignore)
        print(f"  {table:<34} {'same' if what is None else 'DIFFERS: ' + what}")
        differs += what is not None
    print(f"{len(before & after)} tables in both; {differs} differ or are missing after")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
