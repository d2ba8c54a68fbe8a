"""The check of `core__long_running_judged`: every workload judged exactly once, reasons equal to the report."""

import polars as pl

from assets.core import check_judged
from pipelines.long_running import LongRunningConfig, long_running_tables
from pipelines.schemas import USAGE, WORKLOADS

G, A = "google2011", "alibaba2018"


def _tables():
    wl = pl.DataFrame(
        [
            {c: None for c in WORKLOADS} | dict(source=s, workload_id=w, final_state=f, is_partial=p)
            for s, w, f, p in [(G, "a", "running", False), (G, "b", "killed", False), (A, "c", "running", True),
                               (A, "d", "running", False)]
        ],
        schema=WORKLOADS,
    )  # fmt: skip
    use = pl.DataFrame(
        [dict(source=s, workload_id=w, bin_start_s=300 * b, cpu_frac=0.1, mem_frac=0.1, n_samples=1,
              is_filled=False) for s, w, n in [(G, "a", 4), (G, "b", 4), (A, "c", 4), (A, "d", 1)]
         for b in range(n)],
        schema=USAGE,
    )  # fmt: skip
    cfg = LongRunningConfig(min_contiguous_bins={G: 3, A: 3})
    kept, report, judged = long_running_tables(wl, use, cfg)
    return wl, report, judged


def test_consistent_tables_pass():
    wl, report, judged = _tables()
    got = check_judged(judged, wl, report)
    assert got["passed"], got["metadata"]
    assert dict(judged.select("workload_id", "reason").iter_rows()) == {
        "a": "kept", "b": "bad_final_state", "c": "partial", "d": "too_short"
    }  # fmt: skip


def test_duplicate_missing_or_miscounted_rows_fail():
    wl, report, judged = _tables()
    dup = check_judged(pl.concat([judged, judged.head(1)]), wl, report)
    assert not dup["passed"] and dup["metadata"]["n_duplicate_rows"] == 1
    missing = check_judged(judged.filter(pl.col("workload_id") != "d"), wl, report)
    assert not missing["passed"] and missing["metadata"]["n_workloads_missing"] == 1
    relabelled = judged.with_columns(
        pl.when(pl.col("workload_id") == "d").then(pl.lit("kept")).otherwise("reason").alias("reason")
    )
    wrong = check_judged(relabelled, wl, report)
    assert not wrong["passed"]
    assert "alibaba2018/kept: report 0, judged 1" in wrong["metadata"]["reason_count_mismatches"]
