"""Generic checks of a table that any layer can fail on a degenerate result: empty where data went in, a NaN or
an infinity in a numeric column, a value outside the range its unit allows. Pure: a frame in, plain values out
(`(passed, metadata)`); the assets wrap them in Dagster check results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

CheckValues = dict[str, tuple[bool, dict[str, Any]]]
"""Check name -> (passed, metadata): what every check function of the lower packages returns."""


def non_finite_counts(df: pl.DataFrame, columns: Sequence[str] | None = None) -> dict[str, int]:
    """Per float column (`columns`, default every float column) the number of NaN or infinite values (nulls
    are missing values, not counted); only columns with at least one."""
    names = [
        c
        for c in (columns if columns is not None else df.columns)
        if c in df.columns and df.schema[c].is_float()
    ]
    if not names or df.is_empty():
        return {}
    counts = df.select((~pl.col(c).is_finite()).sum().alias(c) for c in names).row(0, named=True)
    return {c: int(n) for c, n in counts.items() if n}


def out_of_range_counts(
    df: pl.DataFrame, bounds: Mapping[str, tuple[float | None, float | None]]
) -> dict[str, int]:
    """Per column of `bounds` (column -> (low, high), None open) the number of values outside [low, high]."""
    out = {}
    for c, (low, high) in bounds.items():
        if c not in df.columns:
            continue
        bad = pl.lit(False)
        if low is not None:
            bad = bad | (pl.col(c) < low)
        if high is not None:
            bad = bad | (pl.col(c) > high)
        if df.schema[c].is_float():  # NaN is the finiteness check's, not a range violation
            bad = bad & pl.col(c).is_not_nan()
        n = int(df.select(bad.fill_null(False).sum()).item()) if df.height else 0
        if n:
            out[c] = n
    return out


def table_check(
    df: pl.DataFrame,
    *,
    may_be_empty: bool = False,
    finite: Sequence[str] | None = None,
    bounds: Mapping[str, tuple[float | None, float | None]] | None = None,
    unique: Sequence[str] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """(passed, metadata) of a table: rows (unless `may_be_empty`: the layer had nothing to work on), no NaN or
    infinity in the float columns (`finite`, default all), every `bounds` column within its range, and, with
    `unique`, one row per value of those key columns. A column named here but missing from the table fails."""
    missing = sorted({*(finite or ()), *(bounds or {}), *(unique or ())} - set(df.columns))
    if missing:
        return False, {"n_rows": df.height, "missing_columns": missing}
    bad = non_finite_counts(df, finite)
    outside = out_of_range_counts(df, bounds or {})
    n_dup = df.height - df.select(unique).n_unique() if unique and df.height else 0
    passed = (df.height > 0 or may_be_empty) and not bad and not outside and n_dup == 0
    meta: dict[str, Any] = {"n_rows": df.height, "non_finite": bad, "out_of_range": outside}
    if unique:
        meta["n_duplicate_keys"] = n_dup
    return passed, meta


@dataclass(frozen=True)
class TableCheck:
    """One generic check of an asset's table (`table_check`'s arguments, under a check name)."""

    name: str
    description: str
    may_be_empty: bool = False
    finite: tuple[str, ...] | None = None
    bounds: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)
    unique: tuple[str, ...] | None = None


POSITIVE = (1e-12, None)
TABLE_CHECKS = {
    "core__workloads": TableCheck(
        "one_row_per_workload",
        "Rows where the source has raw tables, one per (source, workload_id), finite non-negative requests.",
        bounds={"cpu_request_frac": (0, None), "mem_request_frac": (0, None), "n_usage_records": (0, None)},
        unique=("source", "workload_id"),
    ),
    "core__long_running": TableCheck(
        "one_window_per_kept_workload",
        "One row per kept workload, each with a contiguous window of at least one bin (a source may keep none).",
        may_be_empty=True,
        bounds={"n_run_bins": (1, None)},
        unique=("source", "workload_id"),
    ),
    "ec__sweep_silhouette": TableCheck(
        "silhouette_within_minus_one_and_one",
        "Rows where the method ran, one per (source, method, k) (skipped k included), silhouettes in [-1, 1].",
        bounds={"silhouette": (-1, 1), "silhouette_kept": (-1, 1), "k": (1, None)},
        unique=("source", "method", "k"),
    ),
    "ec__sweep_labels": TableCheck(
        "one_label_per_workload_and_k",
        "Rows unless every k was skipped, one label per (workload, method, k), no negative label.",
        bounds={"ec_label": (0, None)},
        unique=("source", "workload_id", "method", "k"),
    ),
    "ec__method_gain": TableCheck(
        "gain_rows_are_finite",
        "Rows where the method has a mapping to score, no NaN or infinite silhouette, and k at least 1.",
        finite=("silhouette",),
        bounds={"k": (1, None)},
    ),
    "sim__usage_scale": TableCheck(
        "usage_scale_is_positive",
        "One row per real source with sequences, finite positive CPU and memory scales, steps of 1+ bins.",
        bounds={"cpu_frac_scale": POSITIVE, "mem_frac_scale": POSITIVE, "step_bins": (1, None)},
        unique=("source",),
    ),
    "eval__ec_labelling": TableCheck(
        "accuracy_within_zero_and_one",
        "Every accuracy (labeller and constant) in [0, 1] (NaN only at an age no job reaches); no rows only where "
        "no labeller could be built (fewer than 2 EC labels in training and no saved classifier).",
        may_be_empty=True,
        finite=(),
        bounds={"accuracy": (0, 1), "constant_accuracy": (0, 1), "n_jobs": (0, None)},
    ),
    "rl__ablation": TableCheck(
        "ablation_run_is_finite",
        "The run was tested (rows), every metric finite, utilisation in [0, 1].",
        bounds={"avg_util_cpu_frac": (0, 1), "avg_util_mem_frac": (0, 1)},
    ),
    "eval__ablations": TableCheck(
        "ablation_table_is_finite",
        "Rows for the ablation runs, every mean finite, utilisation in [0, 1].",
        bounds={"avg_util_cpu_frac": (0, 1), "avg_util_mem_frac": (0, 1)},
    ),
    "eval__ablation_winners": TableCheck(
        "every_run_has_a_winner",
        "Rows for the ablation runs, each compared with at least one heuristic (2+ policies), finite returns.",
        bounds={"tvw_rl_rank_by_return": (1, None), "n_policies": (2, None)},
    ),
    "eval__deeprm_fig4": TableCheck(
        "slowdown_at_least_one",
        "Rows for the policies and loads, one per (load, policy), every mean slowdown finite and at least 1.",
        bounds={"mean_slowdown": (1, None)},
        unique=("load_pct", "policy"),
    ),
}
"""The generic checks of the assets whose degenerate results a table scan finds, by asset name."""


def table_check_docs(asset: str) -> dict[str, str]:
    """Check name -> description of `asset`'s TABLE_CHECKS entry."""
    check = TABLE_CHECKS[asset]
    return {check.name: check.description}


def table_check_values(asset: str, df: pl.DataFrame, may_be_empty: bool | None = None) -> CheckValues:
    """`asset`'s TABLE_CHECKS entry on its table; `may_be_empty` (when given) says whether this run had data."""
    c = TABLE_CHECKS[asset]
    empty_ok = c.may_be_empty if may_be_empty is None else may_be_empty
    return {c.name: table_check(df, may_be_empty=empty_ok, finite=c.finite, bounds=c.bounds, unique=c.unique)}
