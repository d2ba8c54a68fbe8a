"""The Definitions load, every job resolves, every asset has a description."""

from pathlib import Path

import pytest

from assets.definitions import build_definitions
from pipelines.sources import SOURCES

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="module")
def defs(tmp_path_factory):
    return build_definitions(FIXTURES, tmp_path_factory.mktemp("warehouse"))


def test_every_job_resolves(defs):
    for name in ("per_source_job", "cluster_job", "eval_job", "eval_summary_job", "rl_job", "results_job"):
        assert defs.resolve_job_def(name).name == name


def test_the_evaluation_fans_out_by_load(defs):
    job = defs.resolve_job_def("eval_job")
    assert job.partitions_def.get_partition_keys() == ["load30", "load50", "load80"]
    assert {n.name for n in job.graph.nodes} == {"eval__baselines"}
    assert "eval__baselines" not in {n.name for n in defs.resolve_job_def("cluster_job").graph.nodes}


def test_every_raw_table_has_a_job_partitioned_by_its_shards(defs):
    for source in SOURCES.values():
        for table in source.tables:
            asset = defs.get_assets_def(f"raw_{source.name}__{table}")
            job = defs.resolve_job_def(f"raw_{source.name}__{table}_job")
            assert job.partitions_def.get_partition_keys() == asset.partitions_def.get_partition_keys()


def test_every_asset_has_a_description(defs):
    graph = defs.resolve_asset_graph()
    missing = [k.to_user_string() for k in graph.get_all_asset_keys() if not graph.get(k).description]
    assert missing == []


def test_every_source_table_has_a_raw_asset(defs):
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    for source in SOURCES.values():
        for table in source.tables:
            assert f"raw_{source.name}__{table}" in keys


def test_raw_partitions_are_the_fixture_shards(defs):
    asset = defs.get_assets_def("raw_google2011__task_events")
    keys = asset.partitions_def.get_partition_keys()
    assert keys == sorted(p.name for p in (FIXTURES / "google-2011" / "task_events").glob("part-*.csv.gz"))


def test_every_asset_has_a_check(defs):
    graph = defs.resolve_asset_graph()
    checked = {k.asset_key for k in graph.asset_check_keys}
    unchecked = [k.to_user_string() for k in graph.get_all_asset_keys() if k not in checked]
    assert unchecked == []
