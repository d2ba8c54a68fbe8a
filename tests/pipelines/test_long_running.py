"""filter_long_running on hand-made workloads and usage: one case per reason, precedence, runs, report sums."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.long_running import (
    REASONS,
    LongRunningConfig,
    check_judged,
    check_report,
    chunked_longest_runs,
    fill_window_gaps,
    filter_long_running,
    judge_long_running,
    long_running_tables,
    longest_runs,
)
from pipelines.schemas import LONG_RUNNING, USAGE, WORKLOADS

CFG = LongRunningConfig(min_contiguous_bins={"google2011": 3, "alibaba2018": 2, "google2011_derived": 3})


def workloads(rows: list[tuple[str, str, str, bool]]) -> pl.DataFrame:
    """(source, workload_id, final_state, is_partial) -> WORKLOADS frame (other columns null/0)."""
    data = [
        {c: None for c in WORKLOADS}
        | dict(source=s, workload_id=w, final_state=f, is_partial=p, n_usage_records=0)
        for s, w, f, p in rows
    ]
    return pl.DataFrame(data, schema=WORKLOADS)


def usage(rows: list[tuple[str, str, list[int]]], filled: set[tuple[str, int]] = frozenset()) -> pl.DataFrame:
    """(source, workload_id, bins in units of 300 s) -> USAGE frame; bins in `filled` are gap-filled."""
    data = [
        dict(
            source=s,
            workload_id=w,
            bin_start_s=b * 300,
            cpu_frac=0.1,
            mem_frac=0.1,
            n_samples=0 if (w, b) in filled else 1,
            is_filled=(w, b) in filled,
        )  # fmt: skip
        for s, w, bins in rows
        for b in bins
    ]
    return pl.DataFrame(data, schema=USAGE)


G = "google2011"
WORKLOADS_ALL = workloads([
    (G, "kept", "running", False),
    (G, "no_usage", "running", False),
    (G, "killed", "killed", False),
    (G, "evicted", "evicted", False),
    (G, "partial", "running", True),
    (G, "short", "running", False),
    (G, "filled", "finished", False),
    (G, "killed_no_usage", "killed", True),
    (G, "failed_partial", "failed", True),
    (G, "tie", "unknown", False),
])  # fmt: skip
USAGE_ALL = usage(
    [
        (G, "kept", [0, 1, 2]),
        (G, "killed", [0, 1, 2, 3]),
        (G, "evicted", [0, 1, 2]),
        (G, "partial", [0, 1, 2]),
        (G, "short", [0, 1, 3, 4]),  # longest run 2 < 3
        (G, "filled", [0, 1, 3, 4, 5]),  # 3..5 with 4 filled: run of 3 from bin 3
        (G, "failed_partial", [0, 1, 2]),
        (G, "tie", [5, 6, 7, 0, 1, 2]),  # two runs of 3, unsorted: the earliest wins
        (G, "orphan", [0, 1, 2]),  # not a workload
    ],
    filled={("filled", 4)},
)


def reasons(report: pl.DataFrame) -> dict[str, int]:
    return dict(zip(report["reason"], report["n_workloads"], strict=True))


def test_each_reason_and_precedence():
    kept, report = filter_long_running(WORKLOADS_ALL, USAGE_ALL, CFG)
    assert reasons(report) == {
        "no_usage": 2,  # no_usage, killed_no_usage (no_usage wins over the bad state)
        "bad_final_state": 3,  # killed, evicted, failed_partial (bad state wins over partial)
        "partial": 1,
        "too_short": 1,
        "kept": 3,  # kept, filled, tie
        "usage_without_workload": 1,
    }
    five = report.filter(pl.col("reason") != "usage_without_workload")["n_workloads"].sum()
    assert five == WORKLOADS_ALL.height
    assert kept.schema == pl.Schema(LONG_RUNNING)
    assert kept.select("workload_id", "run_start_s", "n_run_bins").rows() == [
        ("filled", 900, 3),
        ("kept", 0, 3),
        ("tie", 0, 3),
    ]


def test_report_lists_every_reason_even_when_zero():
    _, report = filter_long_running(
        workloads([(G, "a", "running", False)]), usage([(G, "a", [0, 1, 2])]), CFG
    )
    assert report.rows() == [
        (G, "no_usage", 0),
        (G, "bad_final_state", 0),
        (G, "partial", 0),
        (G, "too_short", 0),
        (G, "kept", 1),
    ]


def test_drop_partial_false_keeps_partial_workloads_and_lost_is_dropped():
    cfg = LongRunningConfig(min_contiguous_bins={G: 3}, drop_partial=False)
    wl = workloads([(G, "partial", "running", True), (G, "lost", "lost", False)])
    kept, report = filter_long_running(wl, usage([(G, "partial", [0, 1, 2]), (G, "lost", [0, 1, 2])]), cfg)
    assert kept["workload_id"].to_list() == ["partial"]
    assert reasons(report)["bad_final_state"] == 1


def test_thresholds_are_per_source_and_at_least_is_inclusive():
    a = "alibaba2018"
    wl = workloads([(G, "g2", "running", False), (a, "a2", "running", False), (a, "a1", "running", False)])
    use = usage([(G, "g2", [0, 1]), (a, "a2", [0, 1]), (a, "a1", [4])])
    kept, report = filter_long_running(wl, use, CFG)
    assert kept["workload_id"].to_list() == ["a2"]  # Alibaba needs 2 bins, Google 3
    assert report.filter(pl.col("reason") == "too_short").rows() == [(a, "too_short", 1), (G, "too_short", 1)]


def test_paper_defaults():
    cfg = LongRunningConfig()
    assert cfg.min_contiguous_bins == {
        "google2011": 6000, "alibaba2018": 2000, "google2011_derived": 6000, "bitbrains": 6000
    }  # fmt: skip
    # TVW-RL: "6000 continuous ... records" for Google; "at least 2000 ... records" for Alibaba (observed_bins)
    assert cfg.rule == {
        "google2011": "contiguous_bins", "alibaba2018": "observed_bins", "google2011_derived": "contiguous_bins",
        "bitbrains": "contiguous_bins",
    }  # fmt: skip
    assert set(cfg.drop_states) >= {"evicted", "killed", "failed"}
    kept, report = filter_long_running(
        workloads([(G, "a", "running", False)]), usage([(G, "a", list(range(5999)))])
    )
    assert kept.height == 0 and reasons(report)["too_short"] == 1
    kept, _ = filter_long_running(
        workloads([(G, "a", "running", False)]), usage([(G, "a", list(range(6000)))])
    )
    assert kept["n_run_bins"].to_list() == [6000]


def test_duplicate_bins_are_an_error():
    use = usage([(G, "a", [0, 1, 1, 2])])
    with pytest.raises(ValueError, match="duplicate.*'a'"):
        filter_long_running(workloads([(G, "a", "running", False)]), use, CFG)


def test_source_without_threshold_is_an_error():
    with pytest.raises(ValueError, match="no threshold.*google2019"):
        filter_long_running(workloads([("google2019", "a", "running", False)]), usage([]), CFG)


def test_accepts_lazy_usage():
    kept, _ = filter_long_running(WORKLOADS_ALL, USAGE_ALL.lazy(), CFG)
    assert kept["workload_id"].to_list() == ["filled", "kept", "tie"]


def test_partitioned_run_search_gives_the_same_result():
    one = filter_long_running(WORKLOADS_ALL, USAGE_ALL, CFG)
    three = filter_long_running(WORKLOADS_ALL, USAGE_ALL.lazy(), CFG, n_partitions=3)
    assert one[0].equals(three[0]) and one[1].equals(three[1])


def test_runs_across_chunk_boundaries_are_joined():
    use = usage(
        [
            (G, "long", list(range(0, 9))),  # one run of 9 bins over three 3-bin chunks
            (G, "tie", [0, 1, 3, 4, 5, 6, 8, 9, 10, 11]),  # runs 2, 4 (from 3), 4 (from 8): earliest wins
            (G, "late", [2, 7, 8, 9, 10, 11]),  # a one-bin run ending a chunk, then a run of 5
            (G, "gap", [0, 1, 2, 9, 10]),  # absent from the chunk in between
        ]
    )
    runs = {
        r["workload_id"]: (r["run_start_s"] // 300, r["n_run_bins"])
        for r in chunked_longest_runs(use.lazy(), 900).iter_rows(named=True)
    }
    assert runs == {"long": (0, 9), "tie": (3, 4), "late": (7, 5), "gap": (0, 3)}


@pytest.mark.parametrize("chunk_s", [300, 600, 1500, None])
def test_chunked_run_search_equals_one_pass(chunk_s):
    rng = np.random.default_rng(0)
    rows = [
        (G, f"w{i}", sorted(rng.choice(60, int(rng.integers(1, 60)), replace=False).tolist()))
        for i in range(40)
    ]
    use = usage(rows)
    ref = longest_runs(use).collect().sort("workload_id")
    got = chunked_longest_runs(use.lazy(), chunk_s) if chunk_s else longest_runs(use).collect()
    assert got.sort("workload_id").equals(ref)
    wl = workloads([(G, f"w{i}", "running", False) for i in range(40)])
    cfg = LongRunningConfig(min_contiguous_bins={G: 8})
    assert filter_long_running(wl, use, cfg, chunk_s=chunk_s)[0].equals(
        filter_long_running(wl, use, cfg, chunk_s=None)[0]
    )


def test_duplicates_are_found_by_the_chunked_search():
    with pytest.raises(ValueError, match="duplicate"):
        filter_long_running(
            workloads([(G, "a", "running", False)]), usage([(G, "a", [0, 5, 5])]), CFG, chunk_s=300
        )


def test_observed_rule_counts_sampled_bins_anywhere_contiguous_rule_the_longest_run():
    a = "alibaba2018"
    wl = workloads(
        [(a, "gappy", "running", False), (G, "gappy", "running", False), (a, "filled", "running", False)]
    )
    bins = [0, 1, 3, 4, 7, 9]  # 6 observed bins, longest run 2
    use = usage(
        [(a, "gappy", bins), (G, "gappy", bins), (a, "filled", [0, 1, 2, 3, 4, 5])],
        filled={("filled", 1), ("filled", 2)},
    )
    cfg = LongRunningConfig(
        min_contiguous_bins={a: 5, G: 5}, rule={a: "observed_bins", G: "contiguous_bins"}, max_gap_bins={}
    )
    kept, report = filter_long_running(wl, use, cfg)
    # Alibaba's gappy container has 6 >= 5 records; the same bins fail Google's 5 contiguous
    assert kept.select("source", "workload_id", "run_start_s", "n_run_bins").rows() == [(a, "gappy", 0, 2)]
    judged = judge_long_running(wl, use, cfg)
    got = {(r["source"], r["workload_id"]): r for r in judged.iter_rows(named=True)}
    assert got[(a, "filled")]["n_observed_bins"] == 4 and got[(a, "filled")]["n_run_bins"] == 6
    assert got[(a, "filled")]["reason"] == "too_short"  # filled bins are not records
    assert (got[(G, "gappy")]["reason"], got[(G, "gappy")]["rule"], got[(G, "gappy")]["min_bins"]) == (
        "too_short",
        "contiguous_bins",
        5,
    )
    assert reasons(report.filter(pl.col("source") == a)) == {
        "no_usage": 0, "bad_final_state": 0, "partial": 0, "too_short": 1, "kept": 1
    }  # fmt: skip
    # the same data with the contiguous rule for Alibaba keeps only the filled container (run of 6)
    strict = LongRunningConfig(min_contiguous_bins={a: 5, G: 5}, rule={a: "contiguous_bins"}, max_gap_bins={})
    assert filter_long_running(wl, use, strict)[0]["workload_id"].to_list() == ["filled"]
    # bridging gaps of up to 2 missing bins: the gappy container's window spans bins 0..9 (gap 7..9: 1 bin)
    bridged = LongRunningConfig(
        min_contiguous_bins={a: 5, G: 5}, rule={a: "observed_bins"}, max_gap_bins={a: 2}
    )
    assert filter_long_running(wl, use, bridged)[0].select("workload_id", "n_run_bins").rows() == [
        ("gappy", 10)
    ]


def test_observed_bins_add_up_across_chunks_and_partitions():
    a = "alibaba2018"
    wl = workloads([(a, "x", "running", False)])
    use = usage([(a, "x", [0, 1, 2, 50, 51, 200, 201, 202, 203])], filled={("x", 51)})
    cfg = LongRunningConfig(min_contiguous_bins={a: 8}, rule={a: "observed_bins"}, max_gap_bins={})
    for chunk_s, parts in ((None, 1), (3600, 1), (900, 2)):
        judged = judge_long_running(wl, use, cfg, n_partitions=parts, chunk_s=chunk_s)
        assert judged.select("n_observed_bins", "n_run_bins", "reason").row(0) == (8, 4, "kept")
    # gaps of up to 47 bins bridged: 0..51 is one window (across 900 s chunks too), 200..203 another
    wide = LongRunningConfig(min_contiguous_bins={a: 8}, rule={a: "records"}, max_gap_bins={a: 47})
    for chunk_s, parts in ((None, 1), (3600, 1), (900, 2)):
        judged = judge_long_running(wl, use, wide, n_partitions=parts, chunk_s=chunk_s)
        assert judged.select("n_records", "n_run_bins", "reason").row(0) == (8, 52, "kept")


def test_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="unknown rule"):
        LongRunningConfig(rule={G: "bins"})
    with pytest.raises(ValueError, match="max_gap_bins must be >= 0"):
        LongRunningConfig(max_gap_bins={G: -1})


def test_default_rules_alibaba_counts_records_google_needs_a_contiguous_run():
    """The paper's defaults on hand-made series: Alibaba 2000 records anywhere, Google 6000 in one run."""
    a = "alibaba2018"
    every_other = list(range(0, 4000, 2))  # 2000 records, no two consecutive
    wl = workloads([
        (a, "every_other", "running", False),
        (a, "one_record_short", "running", False),
        (a, "mostly_filled", "running", False),
        (G, "every_other", "running", False),
        (G, "one_run", "running", False),
        (G, "one_bin_short", "running", False),
    ])  # fmt: skip
    use = usage(
        [
            (a, "every_other", every_other),
            (a, "one_record_short", every_other[1:]),
            (a, "mostly_filled", list(range(2500))),  # one run of 2500, but 1000 of its bins are gap-filled
            (G, "every_other", list(range(0, 12000, 2))),  # 6000 records, longest run 1
            (G, "one_run", list(range(100)) + list(range(200, 6200))),  # a run of exactly 6000 after a gap
            (G, "one_bin_short", list(range(5999)) + list(range(6000, 9000))),  # runs of 5999 and 3000
        ],
        filled={("mostly_filled", b) for b in range(1, 2001, 2)},
    )
    gap_free = LongRunningConfig(max_gap_bins={})
    judged = judge_long_running(wl, use, gap_free)
    got = {
        (r["source"], r["workload_id"]): (r["reason"], r["rule"], r["min_bins"], r["n_run_bins"], r["n_observed_bins"])
        for r in judged.iter_rows(named=True)
    }  # fmt: skip
    assert got == {
        (a, "every_other"): ("kept", "observed_bins", 2000, 1, 2000),
        (a, "one_record_short"): ("too_short", "observed_bins", 2000, 1, 1999),
        (a, "mostly_filled"): ("too_short", "observed_bins", 2000, 2500, 1500),
        (G, "every_other"): ("too_short", "contiguous_bins", 6000, 1, 6000),
        (G, "one_run"): ("kept", "contiguous_bins", 6000, 6000, 6100),
        (G, "one_bin_short"): ("too_short", "contiguous_bins", 6000, 5999, 8999),
    }
    # the kept window is the longest gap-free run under either rule
    kept, _ = filter_long_running(wl, use, gap_free)
    assert kept.select("source", "workload_id", "run_start_s", "n_run_bins").rows() == [
        (a, "every_other", 0, 1),
        (G, "one_run", 200 * 300, 6000),
    ]
    # with the default bound, Alibaba's kept window bridges the 1-bin gaps: the whole span of its records
    kept, _ = filter_long_running(wl, use)
    assert kept.select("workload_id", "run_start_s", "n_run_bins").rows()[0] == ("every_other", 0, 3999)
    # Alibaba under the contiguous rule: only the gap-filled run passes (filled bins count as present there)
    strict = LongRunningConfig(rule={a: "contiguous_bins", G: "contiguous_bins"}, max_gap_bins={})
    assert set(filter_long_running(wl, use, strict)[0]["workload_id"]) == {"mostly_filled", "one_run"}


def test_long_running_tables_agree_with_each_other():
    kept, report, judged = long_running_tables(WORKLOADS_ALL, USAGE_ALL, CFG)
    assert judged.height == WORKLOADS_ALL.height
    assert judged.select("source", "workload_id").n_unique() == judged.height
    assert set(judged.filter(pl.col("reason") == "kept")["workload_id"]) == set(kept["workload_id"])
    per_reason = dict(judged.group_by("reason").len().iter_rows())
    assert {r: n for r, n in reasons(report).items() if n and r in REASONS} == per_reason
    kept2, report2 = filter_long_running(WORKLOADS_ALL, USAGE_ALL, CFG)
    assert kept.equals(kept2) and report.equals(report2)
    assert judged.equals(judge_long_running(WORKLOADS_ALL, USAGE_ALL, CFG))


def test_alibaba_counts_records_not_bins_and_its_window_spans_the_bridged_gaps():
    """A container with 2,100 records in every other bin (1,050 bins holding two records each): the paper's
    2000-record rule keeps it, the bin count (1,050) does not; its window bridges the 1-bin gaps, and
    fill_window_gaps completes the window with interpolated bins flagged is_filled."""
    a = "alibaba2018"
    bins = list(range(0, 2100, 2))  # 1,050 bins, gaps of one bin
    wl = workloads([(a, "c1", "running", False)])
    use = usage([(a, "c1", bins)]).with_columns(
        n_samples=pl.lit(2, pl.Int32), cpu_frac=pl.col("bin_start_s") / 300 / 2100
    )
    by_records = LongRunningConfig(min_contiguous_bins={a: 2000}, rule={a: "records"})
    by_bins = LongRunningConfig(min_contiguous_bins={a: 2000}, rule={a: "observed_bins"})
    judged = judge_long_running(wl, use, by_records)
    assert judged.select("reason", "n_records", "n_observed_bins", "n_run_bins").row(0) == (
        "kept",
        2100,
        1050,
        2099,
    )
    assert judge_long_running(wl, use, by_bins)["reason"].to_list() == ["too_short"]
    kept, _ = filter_long_running(wl, use, by_records)
    filled = fill_window_gaps(use, kept).collect()
    assert filled.height == 2099 and filled["is_filled"].sum() == 1049
    assert filled["bin_start_s"].to_list() == [300 * b for b in range(2099)]
    # a filled bin lies halfway between its neighbours (linear), and carries no record
    row = filled.filter(pl.col("bin_start_s") == 300).row(0, named=True)
    assert row["cpu_frac"] == pytest.approx(1 / 2100) and row["n_samples"] == 0 and row["is_filled"]
    # gap-free (bound 0): the window is one bin, as before
    gap_free = LongRunningConfig(min_contiguous_bins={a: 2000}, rule={a: "records"}, max_gap_bins={})
    assert filter_long_running(wl, use, gap_free)[0]["n_run_bins"].to_list() == [1]


# ---------------------------------------------------------------- the checks of core__long_running_judged / _report


def _judged_tables():
    a = "alibaba2018"
    cases = [(G, "a", "running", False, 4), (G, "b", "killed", False, 4), (a, "c", "running", True, 4),
             (a, "d", "running", False, 1)]  # fmt: skip
    wl = pl.DataFrame(
        [{c: None for c in WORKLOADS} | dict(source=s, workload_id=w, final_state=f, is_partial=p)
         for s, w, f, p, _ in cases],
        schema=WORKLOADS,
    )  # fmt: skip
    use = pl.DataFrame(
        [dict(source=s, workload_id=w, bin_start_s=300 * b, cpu_frac=0.1, mem_frac=0.1, n_samples=1,
              is_filled=False) for s, w, _, _, n in cases for b in range(n)],
        schema=USAGE,
    )  # fmt: skip
    _, report, judged = long_running_tables(wl, use, LongRunningConfig(min_contiguous_bins={G: 3, a: 3}))
    return wl, report, judged


def test_consistent_tables_pass():
    wl, report, judged = _judged_tables()
    got = check_judged(judged, wl, report)
    assert got["passed"], got["metadata"]
    assert dict(judged.select("workload_id", "reason").iter_rows()) == {
        "a": "kept", "b": "bad_final_state", "c": "partial", "d": "too_short"
    }  # fmt: skip


def test_duplicate_missing_or_miscounted_rows_fail():
    wl, report, judged = _judged_tables()
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


def test_report_check_counts_the_five_reasons_not_the_orphans():
    wl, report, _ = _judged_tables()
    assert check_report(report, wl.height) == {
        "passed": True,
        "metadata": {"n_reported": 4, "n_workloads": 4, "n_usage_ids_without_workload": 0},
    }
    assert not check_report(report, wl.height + 1)["passed"]
