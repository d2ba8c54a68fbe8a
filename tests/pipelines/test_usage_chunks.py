"""iter_usage_chunks: the chunks, concatenated, are exactly the one-pass scan_usage table and counts."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.usage import UsageConfig, iter_usage_chunks, scan_usage, usage_chunk_bounds

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
@pytest.mark.parametrize("source", ["google2011", "alibaba2018", "google2011_derived"])
def test_chunks_equal_one_pass(tmp_path, source, cfg):
    raw = {"google2011": lambda: google_raw(tmp_path), "alibaba2018": alibaba_raw,
           "google2011_derived": derived_raw}[source]()  # fmt: skip
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
