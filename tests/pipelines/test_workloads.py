"""build_workloads / build_usage on hand-made raw frames, one source at a time, with exact expected rows."""

from __future__ import annotations

import math

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import USAGE, WORKLOADS
from pipelines.usage import (
    UsageConfig,
    build_usage,
    build_usage_with_report,
    count_bins_above_one_machine,
    fill_gaps,
)
from pipelines.workloads import build_workloads

S = 1_000_000  # µs per second
NAN = float("nan")


def raw_frame(source: str, table: str, rows: list[dict]) -> pl.LazyFrame:
    """A raw table in its schema from partial rows (missing fields are null)."""
    schema = RAW_SCHEMAS[source][table]
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=schema).lazy()


def usage_frame(source: str, rows: list[tuple]) -> pl.DataFrame:
    """Expected USAGE rows: (workload_id, bin_start_s, cpu_frac, mem_frac, n_samples, is_filled)."""
    cols = ["workload_id", "bin_start_s", "cpu_frac", "mem_frac", "n_samples", "is_filled"]
    df = pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], schema={c: USAGE[c] for c in cols})
    return df.select(pl.lit(source).alias("source"), *cols)


def workload_frame(source: str, rows: list[tuple]) -> pl.DataFrame:
    """Expected WORKLOADS rows, all columns but `source` in schema order."""
    cols = [c for c in WORKLOADS if c != "source"]
    df = pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], schema={c: WORKLOADS[c] for c in cols})
    return df.select(pl.lit(source).alias("source"), *cols)


def sorted_usage(usage: pl.DataFrame) -> pl.DataFrame:
    return usage.sort("workload_id", "bin_start_s")


def counts_of(report: pl.DataFrame) -> dict[str, int]:
    return dict(zip(report["count"], report["n"], strict=True))


# google2011 ------------------------------------------------------------------------------------------------


def google_usage_rows() -> list[dict]:
    def row(job, task, start_s, end_s, machine, cpu, mem):
        return dict(job_id=job, task_index=task, start_time_us=start_s * S, end_time_us=end_s * S,
                    machine_id=machine, cpu_rate_frac=cpu, canonical_mem_frac=mem)  # fmt: skip

    return [
        row(1, 0, 600, 900, 10, 0.1, 0.2),
        row(1, 0, 900, 1200, 10, 0.2, 0.2),
        row(1, 0, 1200, 1260, 11, 0.4, 0.1),  # two windows in bin 1200: weights 60 s and 240 s
        row(1, 0, 1260, 1500, 11, 0.1, 0.4),
        row(1, 0, 1500, 1800, 11, 0.3, 0.3),
        row(1, 1, 600, 900, 12, 0.05, 0.05),
        row(1, 1, 1500, 1800, 12, 0.05, 0.05),
        row(2, 0, 1500, 1800, 20, 0.1, 0.1),
        row(2, 1, 1500, 1800, 21, 0.1, 0.1),
        row(2, 2, 600, 900, 22, 0.1, 0.1),
    ]


def google_event_rows() -> list[dict]:
    def ev(t_s, job, task, etype, machine=None, cpu=None, mem=None, prio=None, cls=None, missing=None):
        return dict(time_us=int(t_s * S), job_id=job, task_index=task, event_type=etype, machine_id=machine,
                    cpu_request_frac=cpu, mem_request_frac=mem, priority=prio, scheduling_class=cls,
                    missing_info=missing)  # fmt: skip

    return [
        ev(0, 1, 0, 0, None, 0.125, 0.25, 9, 2),
        ev(0, 1, 0, 1, 10, 0.125, 0.25, 9, 2),
        ev(0, 1, 1, 1, 12, None, None, 9, 1, missing=2),  # synthesized, empty requests
        ev(300, 1, 1, 8, 12, 0.5, 0.5, 9, 1),  # UPDATE_RUNNING carries the requests
        ev(700, 1, 1, 3, 12, None, None, 9, 1),  # FAIL ...
        ev(800, 1, 1, 1, 12, None, None, 9, 1),  # ... rescheduled: still "failed"
        ev(1400, 2, 1, 0, None, 0.01, 0.02, 0, 0),
        ev(1450, 2, 1, 1, 21, 0.01, 0.02, 0, 0),
        ev(0, 2, 2, 1, 22, 0.03, 0.04, 1, 0),
        ev(0, 3, 0, 0, None, 0.2, 0.2, 2, 3),
        ev(0, 3, 0, 1, 30, 0.2, 0.2, 2, 3),
        ev(1000, 3, 0, 5, 30, 0.2, 0.2, 2, 3),  # KILL, never any usage
    ]


def google_raw(with_events: bool = True) -> dict[str, pl.LazyFrame]:
    raw = {"task_usage": raw_frame("google2011", "task_usage", google_usage_rows())}
    if with_events:
        raw["task_events"] = raw_frame("google2011", "task_events", google_event_rows())
    return raw


def test_google_workloads_states_requests_and_partial():
    # data covers [600, 1800] s: 2/0 starts after the first window with no SUBMIT/SCHEDULE -> partial;
    # 2/1 too but its SUBMIT is there -> whole; 2/2 stops reporting at 900 s without a terminal event -> partial.
    expected = workload_frame("google2011", [
        ("1/0", "11", 600.0, 1800.0, 5, 0.125, 0.25, 9, 2, "running", False),
        ("1/1", "12", 600.0, 1800.0, 2, 0.5, 0.5, 9, 1, "failed", False),
        ("2/0", "20", 1500.0, 1800.0, 1, None, None, None, None, "unknown", True),
        ("2/1", "21", 1500.0, 1800.0, 1, 0.01, 0.02, 0, 0, "running", False),
        ("2/2", "22", 600.0, 900.0, 1, 0.03, 0.04, 1, 0, "running", True),
        ("3/0", "30", None, None, 0, 0.2, 0.2, 2, 3, "killed", False),
    ])  # fmt: skip
    assert_frame_equal(build_workloads("google2011", google_raw()), expected)


def test_google_workloads_without_task_events_are_unknown():
    got = build_workloads("google2011", google_raw(with_events=False))
    assert got["workload_id"].to_list() == ["1/0", "1/1", "2/0", "2/1", "2/2"]
    assert got["final_state"].to_list() == ["unknown"] * 5
    assert got["is_partial"].to_list() == [False, False, True, True, True]
    assert got["cpu_request_frac"].null_count() == 5


def test_google_usage_bins_with_time_weighted_mean():
    expected = usage_frame("google2011", [
        ("1/0", 600, 0.1, 0.2, 1, False),
        ("1/0", 900, 0.2, 0.2, 1, False),
        ("1/0", 1200, (60 * 0.4 + 240 * 0.1) / 300, (60 * 0.1 + 240 * 0.4) / 300, 2, False),
        ("1/0", 1500, 0.3, 0.3, 1, False),
        ("1/1", 600, 0.05, 0.05, 1, False),
        ("1/1", 1500, 0.05, 0.05, 1, False),
        ("2/0", 1500, 0.1, 0.1, 1, False),
        ("2/1", 1500, 0.1, 0.1, 1, False),
        ("2/2", 600, 0.1, 0.1, 1, False),
    ])  # fmt: skip
    assert_frame_equal(sorted_usage(build_usage("google2011", google_raw(), UsageConfig())), expected)
    assert_frame_equal(build_usage("google2011", google_raw(), UsageConfig(sort_rows=True)), expected)


def test_google_usage_drops_and_counts_bad_rows():
    rows = [
        dict(job_id=1, task_index=0, start_time_us=600 * S, end_time_us=900 * S, cpu_rate_frac=0.1, canonical_mem_frac=0.1),
        dict(job_id=1, task_index=0, start_time_us=900 * S, end_time_us=1200 * S, cpu_rate_frac=NAN, canonical_mem_frac=0.1),
        dict(job_id=1, task_index=0, start_time_us=1200 * S, end_time_us=1500 * S, cpu_rate_frac=0.1, canonical_mem_frac=None),
        dict(job_id=1, task_index=0, start_time_us=1500 * S, end_time_us=1800 * S, cpu_rate_frac=-0.1, canonical_mem_frac=0.1),
        dict(job_id=1, task_index=0, start_time_us=1900 * S, end_time_us=1800 * S, cpu_rate_frac=0.1, canonical_mem_frac=0.1),
        # zero-length windows only: plain mean instead of 0/0
        dict(job_id=2, task_index=0, start_time_us=600 * S, end_time_us=600 * S, cpu_rate_frac=0.2, canonical_mem_frac=0.4),
        dict(job_id=2, task_index=0, start_time_us=700 * S, end_time_us=700 * S, cpu_rate_frac=0.4, canonical_mem_frac=0.2),
    ]  # fmt: skip
    usage, report = build_usage_with_report(
        "google2011", {"task_usage": raw_frame("google2011", "task_usage", rows)}, UsageConfig()
    )
    expected = usage_frame("google2011", [("1/0", 600, 0.1, 0.1, 1, False), ("2/0", 600, 0.3, 0.3, 2, False)])
    assert_frame_equal(sorted_usage(usage), expected)
    assert counts_of(report) == {
        "rows_in": 7, "rows_dropped_no_workload_id": 0, "rows_dropped_null_usage": 1, "rows_dropped_nan_usage": 1,
        "rows_dropped_infinite_usage": 0, "rows_dropped_negative_usage": 1, "rows_dropped_bad_window": 1, "bins_out": 2, "bins_filled": 0,
    }  # fmt: skip


def test_google_eviction_then_finish_stays_evicted():
    def event(t_s, kind):
        return dict(time_us=t_s * S, job_id=7, task_index=0, machine_id=1, event_type=kind, priority=9)

    rows = [event(0, 0), event(0, 1), event(600, 2), event(900, 1), event(1800, 4)]
    raw = {"task_events": raw_frame("google2011", "task_events", rows)}
    assert build_workloads("google2011", raw)["final_state"].to_list() == ["evicted"]
    finished = [event(0, 0), event(0, 1), event(1800, 4)]
    raw = {"task_events": raw_frame("google2011", "task_events", finished)}
    assert build_workloads("google2011", raw)["final_state"].to_list() == ["finished"]


def test_google_without_usage_table_gives_empty_usage_and_no_usage_workloads():
    raw = {"task_events": raw_frame("google2011", "task_events", google_event_rows())}
    assert build_usage("google2011", raw).height == 0
    workloads = build_workloads("google2011", raw)
    assert workloads["n_usage_records"].to_list() == [0] * 5
    assert workloads["final_state"].to_list() == ["running", "failed", "running", "running", "killed"]


# alibaba2018 -----------------------------------------------------------------------------------------------


def alibaba_raw() -> dict[str, pl.LazyFrame]:
    src = "alibaba2018"
    machines = [
        dict(machine_id="m_1", time_s=0, cpu_num=96),
        dict(machine_id="m_1", time_s=500, cpu_num=96),
        dict(machine_id="m_2", time_s=0, cpu_num=64),
    ]
    meta = [
        dict(container_id="c_1", machine_id="m_1", time_s=0, status="started", cpu_request_centicores=400.0, mem_size_pct=1.56),
        dict(container_id="c_1", machine_id="m_1", time_s=500, status="started", cpu_request_centicores=400.0, mem_size_pct=1.56),
        dict(container_id="c_2", machine_id="m_2", time_s=0, status="started", cpu_request_centicores=800.0, mem_size_pct=3.13),
        dict(container_id="c_2", machine_id="m_2", time_s=900, status="stopped", cpu_request_centicores=800.0, mem_size_pct=3.13),
        dict(container_id="c_3", machine_id="m_9", time_s=0, status="allocated", cpu_request_centicores=100.0, mem_size_pct=2.0),
    ]  # fmt: skip

    def use(cid, t, cpu, mem, machine="m_1"):
        return dict(container_id=cid, machine_id=machine, time_s=t, cpu_util_pct=cpu, mem_util_pct=mem)

    usage = [
        use("", 0, 1.0, 1.0),  # empty id: no workload
        use(None, 0, 1.0, 1.0),
        use("c_1", 0, 50.0, 40.0),
        use("c_1", 10, 30.0, 60.0),
        use("c_1", 20, None, 60.0),  # invalid marker nulled by ingest
        use("c_1", 300, 20.0, 20.0),
        use("c_2", 600, 10.0, 10.0, "m_2"),
        use("c_3", 0, 100.0, 100.0, "m_9"),
        use("c_4", 320, 25.0, 50.0),  # no container_meta
    ]
    return {
        "machine_meta": raw_frame(src, "machine_meta", machines),
        "container_meta": raw_frame(src, "container_meta", meta),
        "container_usage": raw_frame(src, "container_usage", usage),
    }


def test_alibaba_workloads():
    expected = workload_frame("alibaba2018", [
        ("c_1", "m_1", 0.0, 300.0, 4, 4 / 96, 0.0156, None, None, "running", False),
        ("c_2", "m_2", 600.0, 600.0, 1, 8 / 64, 0.0313, None, None, "finished", False),
        ("c_3", "m_9", 0.0, 0.0, 1, 1 / 96, 0.02, None, None, "running", False),
        ("c_4", "m_1", 320.0, 320.0, 1, None, None, None, None, "unknown", True),
    ])  # fmt: skip
    assert_frame_equal(build_workloads("alibaba2018", alibaba_raw()), expected)


def test_alibaba_usage_normalisation_and_counts():
    usage, report = build_usage_with_report("alibaba2018", alibaba_raw(), UsageConfig())
    expected = usage_frame("alibaba2018", [
        ("c_1", 0, 0.40 * 4 / 96, 0.50 * 0.0156, 2, False),  # mean of 50 % and 30 % of 4 cores on a 96-core machine
        ("c_1", 300, 0.20 * 4 / 96, 0.20 * 0.0156, 1, False),
        ("c_2", 600, 0.10 * 8 / 64, 0.10 * 0.0313, 1, False),
        ("c_3", 0, 1.00 * 1 / 96, 1.00 * 0.02, 1, False),  # machine m_9 unknown: 96 cores assumed
        ("c_4", 300, 0.25, 0.50, 1, False),  # no meta: percent of the machine
    ])  # fmt: skip
    assert_frame_equal(sorted_usage(usage), expected)
    assert counts_of(report) == {
        "rows_in": 9, "rows_dropped_no_workload_id": 2, "rows_dropped_null_usage": 1, "rows_dropped_nan_usage": 0,
        "rows_dropped_infinite_usage": 0, "rows_dropped_negative_usage": 0, "rows_dropped_bad_window": 0, "workloads_without_meta": 1,
        "workloads_default_cpu_num": 1, "bins_out": 5, "bins_filled": 0,
    }  # fmt: skip


# google2011_derived ----------------------------------------------------------------------------------------


def derived_raw(days: list[dict] | None = None) -> dict[str, pl.LazyFrame]:
    src = "google2011_derived"
    sums = [
        dict(job_id=7, time_s=878_856, n_tasks=2, cpu_rate_sum_frac=0.5, canonical_mem_sum_frac=0.25),
        dict(job_id=7, time_s=879_156, n_tasks=4, cpu_rate_sum_frac=1.0, canonical_mem_sum_frac=2.0),
        dict(job_id=7, time_s=879_200, n_tasks=0, cpu_rate_sum_frac=0.0, canonical_mem_sum_frac=0.0),
    ]
    if days is None:
        days = [
            dict(job_id=5, day_index=1, step=0, cpu_pct=10.0, mem_pct=20.0),
            dict(job_id=5, day_index=1, step=1, cpu_pct=30.0, mem_pct=40.0),
            dict(job_id=5, day_index=2, step=0, cpu_pct=50.0, mem_pct=60.0),
        ]
    return {"job_sums": raw_frame(src, "job_sums", sums), "job_days": raw_frame(src, "job_days", days)}


def test_derived_usage_whole_job_totals_and_day_offsets():
    """Both tables on one scale: the whole job's total as a fraction of one machine (job_sums are not divided
    by n_tasks, job_days percent / 100); a job above one machine (mem 2.0) is kept as it is."""
    usage, report = build_usage_with_report("google2011_derived", derived_raw(), UsageConfig())
    expected = usage_frame("google2011_derived", [
        ("5_d1", 0, 0.1, 0.2, 1, False),
        ("5_d1", 300, 0.3, 0.4, 1, False),
        ("5_d2", 86_400, 0.5, 0.6, 1, False),
        ("job7", 878_700, 0.5, 0.25, 1, False),
        ("job7", 879_000, 1.0, 2.0, 1, False),
    ])  # fmt: skip
    assert_frame_equal(sorted_usage(usage), expected)
    assert counts_of(report)["rows_dropped_null_usage"] == 1  # n_tasks = 0: no task running, a gap


def test_derived_bins_above_one_machine_are_counted_not_dropped():
    usage = build_usage("google2011_derived", derived_raw())
    assert count_bins_above_one_machine(usage.lazy()) == {
        "n_bins": 5,
        "n_cpu_bins_above_one_machine": 0,  # 1.0 is one machine exactly: not above
        "n_mem_bins_above_one_machine": 1,  # job7 at 879_000: 2.0
        "n_workloads_above_one_machine": 1,
        "max_cpu_frac": 1.0,
        "max_mem_frac": 2.0,
    }


def test_derived_workloads():
    expected = workload_frame("google2011_derived", [
        ("5_d1", None, 0.0, 600.0, 2, None, None, None, None, "running", False),
        ("5_d2", None, 86_400.0, 86_700.0, 1, None, None, None, None, "running", False),
        ("job7", None, 878_700.0, 879_300.0, 3, None, None, None, None, "running", False),
    ])  # fmt: skip
    assert_frame_equal(build_workloads("google2011_derived", derived_raw()), expected)


# gap filling -----------------------------------------------------------------------------------------------


def gappy_raw() -> dict[str, pl.LazyFrame]:
    """One job-day with bins at steps 0, 2, 5: a 1-bin gap then a 2-bin gap."""
    days = [
        dict(job_id=1, day_index=1, step=0, cpu_pct=10.0, mem_pct=10.0),
        dict(job_id=1, day_index=1, step=2, cpu_pct=30.0, mem_pct=30.0),
        dict(job_id=1, day_index=1, step=5, cpu_pct=60.0, mem_pct=90.0),
    ]
    return {"job_days": raw_frame("google2011_derived", "job_days", days)}


def cpu_by_bin(usage: pl.DataFrame) -> dict[int, tuple[float, int, bool]]:
    usage = sorted_usage(usage)
    return {
        b: (c, n, f)
        for b, c, n, f in usage.select("bin_start_s", "cpu_frac", "n_samples", "is_filled").iter_rows()
    }


@pytest.mark.parametrize("policy", ["none", "hold", "linear"])
def test_fill_nothing_when_max_fill_bins_is_zero(policy):
    usage = build_usage("google2011_derived", gappy_raw(), UsageConfig(policy, 0, sort_rows=True))
    assert usage["bin_start_s"].to_list() == [0, 600, 1500]
    assert not usage["is_filled"].any()


def test_fill_none_ignores_max_fill_bins():
    usage = build_usage("google2011_derived", gappy_raw(), UsageConfig("none", 5, sort_rows=True))
    assert usage["bin_start_s"].to_list() == [0, 600, 1500]


def test_fill_hold_fills_short_gap_only():
    usage, report = build_usage_with_report("google2011_derived", gappy_raw(), UsageConfig("hold", 1))
    assert cpu_by_bin(usage) == {
        0: (0.1, 1, False),
        300: (0.1, 0, True),
        600: (0.3, 1, False),
        1500: (0.6, 1, False),
    }
    assert counts_of(report)["bins_filled"] == 1


def test_fill_linear_interpolates_across_gaps():
    usage = build_usage("google2011_derived", gappy_raw(), UsageConfig("linear", 2))
    got = cpu_by_bin(usage)
    assert list(got) == [0, 300, 600, 900, 1200, 1500]
    assert [got[b][2] for b in got] == [False, True, False, True, True, False]
    for b, want in {300: 0.2, 900: 0.4, 1200: 0.5}.items():
        assert math.isclose(got[b][0], want) and got[b][1] == 0
    mem_1200 = usage.filter(pl.col("bin_start_s") == 1200)["mem_frac"][0]
    assert math.isclose(mem_1200, 0.3 + (0.9 - 0.3) * 2 / 3)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -0.5])
@pytest.mark.parametrize("policy", ["hold", "linear"])
def test_fill_never_reads_a_bad_bin(policy, bad):
    """A bin with a non-finite or negative value that reached the table (it should not: the ingest quarantines
    it) is never copied or interpolated into a gap: the gaps beside it stay gaps."""
    usage = pl.DataFrame(
        {
            "source": ["s"] * 4,
            "workload_id": ["w"] * 4,
            "bin_start_s": [0, 600, 1200, 1800],
            "cpu_frac": [0.1, bad, 0.3, 0.4],
            "mem_frac": [0.1, 0.2, 0.3, 0.4],
            "n_samples": pl.Series([1, 1, 1, 1], dtype=pl.Int32),
        }
    )
    filled = fill_gaps(usage.lazy(), UsageConfig(policy, 1)).collect().sort("bin_start_s")
    got = dict(zip(filled["bin_start_s"], filled["is_filled"], strict=True))
    # 300 sits between 0.1 and the bad bin (linear reads both), 900 after the bad bin (both policies read it)
    assert 900 not in got and (300 in got) == (policy == "hold")
    assert got[1500] is True


def test_usage_config_rejects_bad_values():
    with pytest.raises(ValueError, match="fill_policy"):
        UsageConfig("zero", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_fill_bins"):
        UsageConfig("hold", -1)


def test_unknown_source_is_an_error():
    with pytest.raises(ValueError, match="unknown source"):
        build_workloads("google2019", {})
    with pytest.raises(ValueError, match="unknown source"):
        build_usage("google2019", {})
