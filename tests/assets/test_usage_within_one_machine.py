"""core__usage on the derived fixture: bins above one machine warn (WARN check), are counted, and are kept."""

import shutil
from pathlib import Path

from dagster import AssetCheckSeverity, DagsterInstance, materialize

from assets.definitions import build_definitions
from assets.resources import Warehouse

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces" / "google-2011-derived"


def test_usage_above_one_machine_warns_and_is_kept(tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(FIXTURES, traces / "google-2011-derived")
    defs = build_definitions(traces, tmp_path / "warehouse")
    with DagsterInstance.ephemeral() as instance:
        for table, shard in [
            ("job_sums", "job6336594489_5min_sum.csv.gz"),
            ("job_days", "GCD_VMs.tiny.tar.gz"),
        ]:
            raw = defs.get_assets_def(f"raw_google2011_derived__{table}")
            assert materialize(
                [raw], instance=instance, resources=defs.resources, partition_key=shard
            ).success
        result = materialize(
            [defs.get_assets_def("core__usage")],
            instance=instance,
            resources=defs.resources,
            partition_key="google2011_derived",
        )
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["usage_contract"].passed
    within = checks["usage_within_one_machine"]
    assert not within.passed and within.severity == AssetCheckSeverity.WARN
    meta = {k: v.value for k, v in within.metadata.items()}
    # the 20,000-task job's total (49 running steps of 50, tens of machines each) is above one machine; no job-day is
    assert meta["n_cpu_bins_above_one_machine"] == 49 and meta["n_mem_bins_above_one_machine"] == 49
    assert meta["n_workloads_above_one_machine"] == 1 and meta["n_bins"] == 3506
    assert checks["usage_contract"].metadata["n_mem_bins_above_one_machine"].value == 49
    usage = Warehouse(root=str(tmp_path / "warehouse")).scan("core__usage", ["google2011_derived"]).collect()
    assert usage.height == 3506 and usage["cpu_frac"].max() == meta["max_cpu_frac"] > 100
