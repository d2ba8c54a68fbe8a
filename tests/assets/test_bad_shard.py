"""A broken shard fails its own partition only: every other partition and earlier output stays intact."""

import shutil
from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.definitions import build_definitions
from assets.resources import Warehouse

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _raw(defs, name):
    return defs.get_assets_def(name)


def test_truncated_shard_fails_alone(tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(FIXTURES / "traces" / "google-2011", traces / "google-2011")
    good = "part-00000-of-00500.csv.gz"
    bad = "part-00001-of-00500.csv.gz"
    shutil.copy(FIXTURES / "bad" / "truncated.csv.gz", traces / "google-2011" / "task_events" / bad)
    root = tmp_path / "warehouse"
    defs = build_definitions(traces, root)
    asset = _raw(defs, "raw_google2011__task_events")
    assert asset.partitions_def.get_partition_keys() == [good, bad]

    with DagsterInstance.ephemeral() as instance:
        first = materialize([asset], instance=instance, resources=defs.resources, partition_key=good)
        assert first.success
        wh = Warehouse(root=str(root))
        before = wh.partition_path("raw_google2011__task_events", good).read_bytes()

        broken = materialize(
            [asset], instance=instance, resources=defs.resources, partition_key=bad, raise_on_error=False
        )
        assert not broken.success
        message = str(broken.all_events[-1].message) + "".join(
            str(getattr(e.event_specific_data, "error", "")) for e in broken.all_events if e.is_failure
        )
        assert bad in message  # the error names the file

        assert wh.partition_path("raw_google2011__task_events", good).read_bytes() == before
        assert not wh.partition_path("raw_google2011__task_events", bad).exists()
        assert [p.name for p in wh.table_files("raw_google2011__task_events")] == [
            "part-00000-of-00500.parquet"
        ]


def test_core_tables_of_a_source_with_a_failed_shard_say_it_is_partial(tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(FIXTURES / "traces" / "google-2011", traces / "google-2011")
    bad = "part-00001-of-00500.csv.gz"
    shutil.copy(FIXTURES / "bad" / "truncated.csv.gz", traces / "google-2011" / "task_usage" / bad)
    defs = build_definitions(traces, tmp_path / "warehouse")
    with DagsterInstance.ephemeral() as instance:
        for table in ("task_usage", "task_events"):
            asset = _raw(defs, f"raw_google2011__{table}")
            for key in asset.partitions_def.get_partition_keys():
                materialize(
                    [asset],
                    instance=instance,
                    resources=defs.resources,
                    partition_key=key,
                    raise_on_error=False,
                )
        core = [_raw(defs, "core__workloads"), _raw(defs, "core__usage")]
        result = materialize(core, instance=instance, resources=defs.resources, partition_key="google2011")
    assert result.success
    for name in ("core__workloads", "core__usage"):
        meta = result.asset_materializations_for_node(name)[0].metadata
        assert meta["is_partial_source"].value is True
        assert meta["missing_raw_shards"].value["task_usage"] == [bad]
