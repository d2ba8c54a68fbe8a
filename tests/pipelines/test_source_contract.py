"""The contract of a trace source: every entry of `pipelines.sources.SOURCES`, on its fixture folder.

A new source module is listed in `SOURCES` and given a fixture folder below (real-format cuts of its files, see
tests/fixtures/README.md); every test here then runs on it: the registry entry is whole, its raw tables parse to
their declared schema whatever the batch size, its usage build gives the same table in chunks as in one pass,
its workloads and usage conform to the canonical schemas, the long-running rule in force is its own and is
applied as it says, and every raw column is documented.
"""

from __future__ import annotations

import functools
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.column_docs import describe, undocumented
from pipelines.ingest import ingest_shard, raw_table_name
from pipelines.long_running import LongRunningConfig, long_running_tables
from pipelines.raw_schemas import RAW_SCHEMAS
from pipelines.schemas import QUARANTINE, USAGE, WORKLOADS, check_schema
from pipelines.sources import SOURCES
from pipelines.usage import UsageConfig, build_usage_with_report, iter_usage_chunks, scan_usage
from pipelines.workloads import build_workloads

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_ROOTS = {
    "google2011": FIXTURES / "traces",
    "alibaba2018": FIXTURES / "traces",
    "google2011_derived": FIXTURES / "traces",
    "bitbrains": FIXTURES / "bitbrains" / "folders",
}
"""Source -> the trace folder holding its fixture files (in `<root>/<source.folder>/`, the public layout)."""

CONFIGS = [UsageConfig(), UsageConfig("hold", 3), UsageConfig("linear", 2)]
RULE_MEASURE = {"contiguous_bins": "n_run_bins", "observed_bins": "n_observed_bins", "records": "n_records"}
"""Long-running rule -> the column of the judged table it compares with the threshold."""

each_source = pytest.mark.parametrize("source", sorted(SOURCES))


def parse(
    source: str, table: str, path: Path, batch_bytes: int = 1 << 20
) -> tuple[pl.DataFrame, pl.DataFrame]:
    batches = list(SOURCES[source].iter_batches(table, path, batch_bytes))
    return pl.concat([b.rows for b in batches]), pl.concat([b.quarantine for b in batches])


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """source -> raw table -> (ingest stats, data file, quarantine file) per fixture shard, ingested once."""

    @functools.cache
    def ingest(source: str) -> dict[str, list]:
        src, out = SOURCES[source], {}
        folder = tmp_path_factory.mktemp(source)
        for table in src.tables:
            for i, path in enumerate(src.discover(FIXTURE_ROOTS[source], table).values()):
                data, quarantine = folder / f"{table}.{i}.parquet", folder / f"{table}.{i}.q.parquet"
                out.setdefault(table, []).append(
                    (ingest_shard(src, table, path, data, quarantine), data, quarantine)
                )
        return out

    return ingest


@pytest.fixture
def raw(ingested, source) -> dict[str, pl.LazyFrame]:
    """The source's raw tables as the core layer reads them: lazy scans of the ingested Parquet files."""
    return {t: pl.scan_parquet([data for _, data, _ in shards]) for t, shards in ingested(source).items()}


def test_every_source_has_a_fixture_folder():
    assert (
        set(FIXTURE_ROOTS) == set(SOURCES) == {"google2011", "alibaba2018", "google2011_derived", "bitbrains"}
    )
    for name, root in FIXTURE_ROOTS.items():
        assert (root / SOURCES[name].folder).is_dir(), name


@each_source
def test_the_registry_entry_is_whole(source):
    src = SOURCES[source]
    assert src.name == source and set(src.schemas) == set(src.tables) and RAW_SCHEMAS[source] == src.schemas
    assert src.usage.needed is None or src.usage.needed in src.tables
    assert set(src.usage.times) <= set(src.tables) and src.long_running.min_bins > 0
    assert callable(src.workloads) and set(src.column_docs) == set(src.tables)


# ---------------------------------------------------------------- raw tables


@each_source
def test_fixture_shards_ingest_to_the_declared_raw_schema(source, ingested):
    shards = ingested(source)
    assert shards, "the fixture folder holds no shard of any table"
    for table, files in shards.items():
        for stats, data, quarantine in files:
            assert stats.rows_in == stats.rows_written + stats.rows_quarantined > 0, table
            assert pl.read_parquet(data).schema == pl.Schema(RAW_SCHEMAS[source][table]), table
            assert pl.read_parquet(quarantine).schema == pl.Schema(QUARANTINE), table
            assert pl.read_parquet(quarantine).height == stats.rows_quarantined, table
    assert sum(stats.rows_written for files in shards.values() for stats, _, _ in files) > 0


@each_source
def test_reading_in_small_batches_gives_the_rows_of_one_pass(source):
    src = SOURCES[source]
    for table in src.tables:
        for path in src.discover(FIXTURE_ROOTS[source], table).values():
            whole, whole_q = parse(source, table, path)
            small, small_q = parse(source, table, path, batch_bytes=2000)
            assert_frame_equal(small, whole)
            assert_frame_equal(small_q, whole_q)


@each_source
def test_every_raw_column_is_documented_by_its_source(source):
    """Each source documents every column of every raw table itself (no fallback on a shared name)."""
    src = SOURCES[source]
    for table, schema in RAW_SCHEMAS[source].items():
        docs, name = src.column_docs[table], raw_table_name(source, table)
        assert [c for c in schema if not docs.get(c, "").strip()] == [], table
        assert set(docs) <= set(schema), f"{table}: docs of columns it does not have"
        assert undocumented(schema, name) == []
        assert [c for c in schema if describe(c, name) != docs[c]] == []


# ---------------------------------------------------------------- canonical tables


@each_source
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_usage_in_chunks_equals_one_pass(source, cfg, raw):
    usage, counts = pl.collect_all(list(scan_usage(source, raw, cfg)))
    expected = usage.sort("workload_id", "bin_start_s")
    assert expected.height > 0
    for chunking in ({}, {"chunk_s": 1800}):  # the source's own chunking, and short time chunks
        parts = list(iter_usage_chunks(source, raw, cfg, **chunking))
        got = pl.concat([u for u, _ in parts]).sort("workload_id", "bin_start_s")
        assert_frame_equal(got, expected)
        summed = pl.concat([c for _, c in parts]).group_by("count").agg(pl.col("n").sum())
        got_counts = dict(summed.iter_rows())
        assert {k: got_counts[k] for k in counts["count"]} == dict(
            zip(counts["count"], counts["n"], strict=True)
        )
        assert got_counts["bins_out"] == expected.height


@each_source
def test_workloads_and_usage_conform_to_the_canonical_schemas(source, raw):
    workloads = check_schema(build_workloads(source, raw), WORKLOADS, f"{source} workloads")
    usage, _ = build_usage_with_report(source, raw, UsageConfig("hold", 3))
    check_schema(usage, USAGE, f"{source} usage")
    assert workloads.height > 0 and usage.height > 0
    assert set(workloads["source"]) == {source} and set(usage["source"]) == {source}
    assert workloads["workload_id"].n_unique() == workloads.height
    assert usage.select("workload_id", "bin_start_s").n_unique() == usage.height
    assert (usage["bin_start_s"] % 300 == 0).all()


@each_source
def test_the_long_running_rule_in_force_is_the_sources_own(source):
    rule, cfg = SOURCES[source].long_running, LongRunningConfig()
    assert cfg.min_contiguous_bins[source] == rule.min_bins and cfg.rule_of(source) == rule.kind
    assert cfg.max_gap_bins.get(source, 0) == rule.max_gap_bins


@each_source
@pytest.mark.parametrize("kind", sorted(RULE_MEASURE))
def test_the_long_running_rule_is_applied_as_it_says(source, kind, raw):
    """Judged on the measure of its rule: kept at or above the threshold (inclusive), too_short below."""
    workloads, usage = build_workloads(source, raw), build_usage_with_report(source, raw)[0]
    measure = RULE_MEASURE[kind]

    def judge(threshold: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        cfg = LongRunningConfig(min_contiguous_bins={source: threshold}, rule={source: kind})
        kept, _, judged = long_running_tables(workloads, usage, cfg)
        assert set(judged["rule"]) == {kind} and set(judged["min_bins"]) == {threshold}
        assert judged.height == workloads.height
        assert set(kept["workload_id"]) == set(judged.filter(pl.col("reason") == "kept")["workload_id"])
        return kept, judged

    candidates = judge(1)[1].filter(pl.col("reason") == "kept")  # only the threshold can drop these
    assert candidates.height > 0, "no fixture workload passes the other rules"
    ids = set(candidates["workload_id"])
    for threshold in (int(candidates[measure].min()), int(candidates[measure].median()), 2):
        judged = judge(threshold)[1].filter(pl.col("workload_id").is_in(ids))
        assert set(judged["reason"]) <= {"kept", "too_short"}
        assert (judged.filter(pl.col("reason") == "kept")[measure] >= threshold).all()
        assert (judged.filter(pl.col("reason") == "too_short")[measure] < threshold).all()
    assert set(judge(int(candidates[measure].min()))[0]["workload_id"]) == ids
    beyond = judge(int(candidates[measure].max()) + 1)[1].filter(pl.col("workload_id").is_in(ids))
    assert set(beyond["reason"]) == {"too_short"}
