"""iter_usage_chunks: the chunks (time or workload ranges), concatenated, are exactly the one-pass scan_usage table
and counts; workload chunks read each raw row about once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import USAGE, USAGE_COUNTS
from pipelines.sources import SOURCES
from pipelines.sources.mapping import TimeChunks, WorkloadChunks
from pipelines.usage import (
    UsageConfig,
    above_one_machine_line,
    build_usage_with_report,
    check_usage_files,
    check_usage_invariants,
    count_bins_above_one_machine,
    iter_usage_chunks,
    scan_usage,
    sum_counts,
    usage_chunk_bounds,
    workload_chunk_bounds,
)

S = 1_000_000  # µs per second
CONFIGS = [
    UsageConfig(),
    UsageConfig("hold", 1),
    UsageConfig("hold", 3),
    UsageConfig("linear", 2),
    UsageConfig("linear", 15),  # fills reach across more than one whole chunk
]


def raw_frame(source: str, table: str, cols: dict) -> pl.DataFrame:
    schema = RAW_SCHEMAS[source][table]
    n = len(next(iter(cols.values())))
    return pl.DataFrame({c: cols.get(c, [None] * n) for c in schema}, schema=schema)


def google_raw(tmp_path) -> dict[str, pl.LazyFrame]:
    """20 tasks, windows over ~6 h with random gaps, 2 split windows per bin, some bad rows; written as two
    shards cut mid-bin and overlapping in time (a task's records fall in both files)."""
    rng = np.random.default_rng(1)
    task = np.repeat(np.arange(20), 70)
    start_s = 600 + 300 * np.tile(np.arange(70), 20) + rng.integers(0, 3, task.size) * 60
    keep = rng.random(task.size) > 0.3
    task, start_s = task[keep], start_s[keep]
    end_s = start_s + rng.choice([0, 60, 240], task.size)
    cpu = rng.random(task.size).round(3)
    cpu[[3, 50]] = [np.nan, -0.1]
    mem = rng.random(task.size).round(3)
    mem[7] = None
    end_s[11] = start_s[11] - 1  # bad window
    df = raw_frame(
        "google2011",
        "task_usage",
        dict(start_time_us=start_s * S, end_time_us=end_s * S, job_id=task // 5, task_index=task % 5,
             cpu_rate_frac=cpu, canonical_mem_frac=mem),
    ).with_columns(pl.col("canonical_mem_frac").fill_nan(None))  # fmt: skip
    order = np.argsort(start_s, kind="stable")
    df = df[order]
    cut = df.height // 2
    df[: cut + 40].write_parquet(tmp_path / "part-0.parquet")
    df[cut + 40 :].write_parquet(tmp_path / "part-1.parquet")
    return {"task_usage": pl.scan_parquet([tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"])}


def alibaba_raw() -> dict[str, pl.LazyFrame]:
    """Containers sampled irregularly on a 10 s grid (gaps of up to ~1 h), some without meta or machine."""
    rng = np.random.default_rng(2)
    ids, times = [], []
    for c in range(12):
        t = 86_400 + np.cumsum(rng.choice([10, 300, 450, 900, 3600], 80, p=[0.3, 0.2, 0.3, 0.15, 0.05]))
        ids += [f"c_{c}"] * t.size
        times += t.tolist()
    n = len(ids)
    ids[5] = ""
    usage = raw_frame(
        "alibaba2018",
        "container_usage",
        dict(container_id=ids, machine_id=["m_1"] * n, time_s=times,
             cpu_util_pct=rng.integers(1, 90, n).astype(float), mem_util_pct=rng.integers(1, 90, n).astype(float)),
    )  # fmt: skip
    meta = raw_frame(
        "alibaba2018",
        "container_meta",
        dict(container_id=[f"c_{c}" for c in range(8)], machine_id=["m_1"] * 4 + ["m_9"] * 4,
             time_s=[0] * 8, cpu_request_centicores=[400.0] * 7 + [None], mem_size_pct=[1.5] * 8),
    )  # fmt: skip
    machines = raw_frame("alibaba2018", "machine_meta", dict(machine_id=["m_1"], time_s=[0], cpu_num=[96]))
    return {"container_usage": usage.lazy(), "container_meta": meta.lazy(), "machine_meta": machines.lazy()}


def derived_raw() -> dict[str, pl.LazyFrame]:
    rng = np.random.default_rng(3)
    t = np.sort(rng.choice(np.arange(0, 200) * 300, 120, replace=False))
    sums = raw_frame(
        "google2011_derived",
        "job_sums",
        dict(job_id=[7] * t.size, time_s=t, n_tasks=[4] * t.size,
             cpu_rate_sum_frac=rng.random(t.size), canonical_mem_sum_frac=rng.random(t.size)),
    )  # fmt: skip
    steps = np.sort(rng.choice(288, 200, replace=False))
    days = raw_frame(
        "google2011_derived",
        "job_days",
        dict(job_id=[9] * 400, day_index=[1] * 200 + [2] * 200, step=np.concatenate([steps, steps]),
             cpu_pct=rng.random(400) * 100, mem_pct=rng.random(400) * 100),
    )  # fmt: skip
    return {"job_sums": sums.lazy(), "job_days": days.lazy()}


def bitbrains_raw() -> dict[str, pl.LazyFrame]:
    """6 VMs sampled about every 300 s (jitter of a few seconds) with random gaps, one stretch of memory 0."""
    rng = np.random.default_rng(4)
    frames = []
    for vm in range(6):
        t = 1_372_636_800 + 300 * np.arange(80) + rng.integers(0, 4, 80)
        t = t[rng.random(80) > 0.25]
        mem = rng.random(t.size) * 4e6
        mem[:5] = 0.0
        frames.append(
            raw_frame(
                "bitbrains",
                "vm_usage",
                dict(vm_set=["rnd"] * t.size, vm_id=[str(vm)] * t.size, month=["2013-7"] * t.size,
                     timestamp_s=t, cpu_cores=[2] * t.size, cpu_capacity_mhz=[5200.0] * t.size,
                     cpu_usage_mhz=rng.random(t.size) * 5200, mem_capacity_kb=[8e6] * t.size, mem_usage_kb=mem),
            )
        )  # fmt: skip
    return {"vm_usage": pl.concat(frames).lazy()}


SYNTHETIC = {"alibaba2018": alibaba_raw, "google2011_derived": derived_raw, "bitbrains": bitbrains_raw}
"""Crafted gappy series per source (Google's, written as two overlapping shards, needs `tmp_path`)."""


def one_pass(source: str, raw: dict, cfg: UsageConfig) -> tuple[pl.DataFrame, dict[str, int]]:
    usage, counts = pl.collect_all(list(scan_usage(source, raw, cfg)))
    totals = dict(zip(counts["count"], counts["n"], strict=True))
    totals |= {"bins_out": usage.height, "bins_filled": int(usage["is_filled"].sum())}
    return usage.sort("workload_id", "bin_start_s"), totals


def chunked(
    source: str, raw: dict, cfg: UsageConfig, chunk_s: int
) -> tuple[list[pl.DataFrame], dict[str, int]]:
    parts = list(iter_usage_chunks(source, raw, cfg, chunk_s))
    counts = pl.concat([c for _, c in parts]).group_by("count").agg(pl.col("n").sum())
    return [u for u, _ in parts], dict(counts.iter_rows())


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_chunks_equal_one_pass(tmp_path, source, cfg):
    """The time-chunk driver on long gappy series (fills across chunk bounds); every registered source's fixture
    is also checked in tests/pipelines/test_source_contract.py."""
    raw = google_raw(tmp_path) if source == "google2011" else SYNTHETIC[source]()
    expected, expected_counts = one_pass(source, raw, cfg)
    parts, counts = chunked(source, raw, cfg, chunk_s=1800)
    assert len(parts) >= 5
    got = pl.concat(parts).sort("workload_id", "bin_start_s")
    assert_frame_equal(got, expected)
    assert counts == expected_counts
    assert expected_counts["bins_filled"] > 0 or cfg.fill_policy == "none"
    # chunks hold disjoint, increasing ranges of bins
    ranges = [(p["bin_start_s"].min(), p["bin_start_s"].max()) for p in parts if p.height]
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_gap_across_a_chunk_boundary_is_filled_once_in_the_right_chunk():
    usage = raw_frame(
        "alibaba2018",
        "container_usage",
        dict(container_id=["c"] * 3, time_s=[0, 900, 1210], cpu_util_pct=[25.0, 100.0, 50.0],
             mem_util_pct=[20.0, 20.0, 20.0]),
    )  # fmt: skip
    parts = list(
        iter_usage_chunks("alibaba2018", {"container_usage": usage.lazy()}, UsageConfig("linear", 2), 600)
    )
    # read chunks end at 600, 1200, 1800; emitted ranges are shifted down by 2 bins: <0, [0, 600), [600, ...)
    bins = [p[0].sort("bin_start_s").select("bin_start_s", "cpu_frac", "is_filled").rows() for p in parts]
    assert bins == [
        [],
        [(0, 0.25, False), (300, 0.5, True)],
        [(600, 0.75, True), (900, 1.0, False), (1200, 0.5, False)],
    ]
    assert [dict(zip(c["count"], c["n"], strict=True))["bins_filled"] for _, c in parts] == [0, 1, 1]


def test_chunk_bounds_skip_empty_chunks_and_bad_chunk_size_is_an_error():
    usage = raw_frame("alibaba2018", "container_usage", dict(container_id=["a", "a"], time_s=[100, 90_000]))
    raw = {"container_usage": usage.lazy()}
    assert usage_chunk_bounds("alibaba2018", raw, 3600) == [3600, 93_600]
    assert len(list(iter_usage_chunks("alibaba2018", raw, UsageConfig(), 3600))) == 2
    with pytest.raises(ValueError, match="multiple of 300"):
        next(iter_usage_chunks("alibaba2018", raw, UsageConfig(), 1000))


def test_missing_usage_table_gives_one_empty_chunk():
    parts = list(iter_usage_chunks("google2011", {}, UsageConfig()))
    assert len(parts) == 1 and parts[0][0].height == 0
    assert dict(zip(parts[0][1]["count"], parts[0][1]["n"], strict=True)) == {"bins_out": 0, "bins_filled": 0}


# ---------------------------------------------------------------- workload chunks (raw usage sorted by workload)


def alibaba_sorted_parquet(tmp_path, rows_per_group: int = 40) -> tuple[dict[str, pl.LazyFrame], Path]:
    """alibaba_raw's container_usage sorted by container_id (as the official file is), written with small row
    groups so that row-group statistics matter."""
    raw = alibaba_raw()
    path = tmp_path / "container_usage.parquet"
    usage = raw["container_usage"].collect().sort("container_id", "time_s", maintain_order=True)
    usage.write_parquet(path, row_group_size=rows_per_group, statistics=True)
    return {**raw, "container_usage": pl.scan_parquet(path)}, path


def row_groups_read(path: Path, column: str, lo, hi) -> int:
    """Rows of the row groups whose [min, max] statistics of `column` meet [lo, hi) (None: open): what a reader
    that prunes on statistics reads for that range."""
    meta = pq.ParquetFile(path).metadata
    j = meta.schema.to_arrow_schema().get_field_index(column)
    n = 0
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(j).statistics
        if (hi is None or st.min < hi) and (lo is None or st.max >= lo):
            n += meta.row_group(g).num_rows
    return n


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_workload_chunks_equal_one_pass(tmp_path, cfg):
    raw, _ = alibaba_sorted_parquet(tmp_path)
    expected, expected_counts = one_pass("alibaba2018", raw, cfg)
    parts = list(iter_usage_chunks("alibaba2018", raw, cfg, chunk_rows=150))
    assert len(parts) >= 5
    got = pl.concat([u for u, _ in parts]).sort("workload_id", "bin_start_s")
    assert_frame_equal(got, expected)
    counts = pl.concat([c for _, c in parts]).group_by("count").agg(pl.col("n").sum())
    assert dict(counts.iter_rows()) == expected_counts
    # each workload lies in exactly one chunk, and the chunks come in key order
    ids = [set(u["workload_id"]) for u, _ in parts]
    assert sum(len(s) for s in ids) == len(set().union(*ids))
    nonempty = [s for s in ids if s]
    assert all(max(a) < min(b) for a, b in zip(nonempty, nonempty[1:], strict=False))


def test_alibaba_default_chunking_is_by_container_and_equals_one_pass(tmp_path):
    raw, _ = alibaba_sorted_parquet(tmp_path)
    assert isinstance(SOURCES["alibaba2018"].usage.chunking, WorkloadChunks)
    assert isinstance(SOURCES["google2011"].usage.chunking, TimeChunks)
    expected, _ = one_pass("alibaba2018", raw, UsageConfig("hold", 3))
    got, _ = build_usage_with_report("alibaba2018", raw, UsageConfig("hold", 3))
    assert_frame_equal(got.sort("workload_id", "bin_start_s"), expected)


def test_workload_chunks_read_each_raw_row_once(tmp_path):
    raw, path = alibaba_sorted_parquet(tmp_path)
    n_rows = pq.ParquetFile(path).metadata.num_rows
    rows_per_group = 40
    starts = workload_chunk_bounds("alibaba2018", raw, chunk_rows=150)
    ranges = list(zip([None, *starts], [*starts, None], strict=True))
    parts = list(iter_usage_chunks("alibaba2018", raw, UsageConfig(), chunk_rows=150))
    assert len(parts) == len(ranges) >= 5
    # every raw row is binned in exactly one chunk: the chunks' rows_in add up to the table
    rows_in = [int(c.filter(pl.col("count") == "rows_in")["n"].sum()) for _, c in parts]
    assert sum(rows_in) == n_rows and all(n > 0 for n in rows_in)
    # and is read about once: a chunk reads only the row groups its container range meets
    read = [row_groups_read(path, "container_id", lo, hi) for lo, hi in ranges]
    assert sum(read) <= n_rows + (len(ranges) - 1) * rows_per_group
    assert all(r >= n for r, n in zip(read, rows_in, strict=True))
    # time chunks of the same table meet most row groups (every container spans hours): rows are read many times
    ends = usage_chunk_bounds("alibaba2018", raw, 3600)
    assert len(ends) >= 5
    t_ranges = list(zip([None, *ends[:-1]], [*ends[:-1], None], strict=True))
    read_t = [row_groups_read(path, "time_s", lo, hi) for lo, hi in t_ranges]
    assert sum(read_t) > 4 * n_rows


def test_chunking_arguments_are_checked():
    raw = alibaba_raw()
    with pytest.raises(ValueError, match="give one"):
        next(iter_usage_chunks("alibaba2018", raw, UsageConfig(), chunk_s=3600, chunk_rows=100))
    with pytest.raises(ValueError, match="no workload key"):
        next(iter_usage_chunks("google2011", {"task_usage": pl.LazyFrame()}, UsageConfig(), chunk_rows=100))
    with pytest.raises(ValueError, match="must be positive"):
        next(iter_usage_chunks("alibaba2018", raw, UsageConfig(), chunk_rows=0))


def test_chunk_driver_logs_progress():
    lines: list[str] = []
    parts = list(
        iter_usage_chunks("alibaba2018", alibaba_raw(), UsageConfig(), chunk_rows=150, log=lines.append)
    )
    assert lines and lines[-1].startswith(
        f"alibaba2018 usage (workload chunks of ~150 rows): {len(parts)}/{len(parts)}"
    )


def test_bins_above_one_machine_counted_per_resource_over_chunk_files(tmp_path):
    """Counted over a partition's chunk files (as the usage check reads them), per resource and workload."""
    rows = [  # (workload, bin, cpu, mem)
        ("a", 0, 0.5, 1.25), ("a", 300, 1.5, 1.0), ("b", 0, 1.0, 0.2), ("c", 0, 0.1, 0.1), ("c", 300, 2.5, 3.0),
    ]  # fmt: skip
    frame = pl.DataFrame(rows, schema=["workload_id", "bin_start_s", "cpu_frac", "mem_frac"], orient="row")
    files = []
    for i, part in enumerate(frame.iter_slices(2)):
        files.append(tmp_path / f"chunk-{i}.parquet")
        part.write_parquet(files[-1])
    assert count_bins_above_one_machine(files) == {
        "n_bins": 5,
        "n_cpu_bins_above_one_machine": 2,
        "n_mem_bins_above_one_machine": 2,
        "n_workloads_above_one_machine": 2,
        "max_cpu_frac": 2.5,
        "max_mem_frac": 3.0,
    }
    assert count_bins_above_one_machine([])["n_bins"] == 0


def test_the_usage_checks_over_chunk_files(tmp_path):
    """`usage_contract` fails on a duplicate bin, an off-grid bin, a non-finite value and a filled bin with samples;
    `usage_within_one_machine` on a bin above one machine; the log line and the summed counts."""
    good = pl.DataFrame(
        {"source": ["s"] * 2, "workload_id": ["a", "a"], "bin_start_s": [0, 300], "cpu_frac": [0.5, 0.4],
         "mem_frac": [0.1, 0.2], "n_samples": [1, 0], "is_filled": [False, True]},
        schema=USAGE,
    )  # fmt: skip
    good.write_parquet(tmp_path / "good.parquet")
    checks = check_usage_files([tmp_path / "good.parquet"])
    assert checks["usage_contract"]["passed"] and checks["usage_within_one_machine"]["passed"]
    bad = good.vstack(good.head(1)).vstack(
        pl.DataFrame(
            {"source": ["s"] * 3, "workload_id": ["b"] * 3, "bin_start_s": [10, 300, 600],
             "cpu_frac": [0.1, float("inf"), 1.5], "mem_frac": [0.1, 0.1, 0.1], "n_samples": [1, 2, 1],
             "is_filled": [False, True, False]},
            schema=USAGE,
        )
    )  # fmt: skip
    bad.write_parquet(tmp_path / "bad.parquet")
    checks = check_usage_files([tmp_path / "bad.parquet"])
    assert not checks["usage_contract"]["passed"] and not checks["usage_within_one_machine"]["passed"]
    assert check_usage_invariants([tmp_path / "bad.parquet"]) == {
        "n_off_grid": 1, "n_bad_values": 1, "n_filled_with_samples": 1, "n_duplicate_bins": 1
    }  # fmt: skip
    assert checks["usage_contract"]["metadata"]["n_duplicate_bins"] == 1
    assert above_one_machine_line("s", checks["usage_within_one_machine"]["metadata"]).startswith(
        "s: 2 bins above one machine of CPU (max cpu_frac inf), 0 of memory"
    )
    counts = [
        pl.DataFrame(
            {"source": ["s"] * 2, "count": ["rows_in", "bins_out"], "n": [3, 2]}, schema=USAGE_COUNTS
        )
    ]
    assert sum_counts(counts * 2) == {"rows_in": 6, "bins_out": 4} and sum_counts([]) == {}
