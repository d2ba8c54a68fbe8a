"""Files in a source's folder that no table reads are reported by the raw run (log warning and metadata)."""

import logging
import shutil
from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.definitions import build_definitions

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces" / "google-2011-derived"


def test_raw_run_reports_unread_files_by_name(tmp_path):
    folder = tmp_path / "traces" / "google-2011-derived"
    folder.mkdir(parents=True)
    publisher_name = "data_resource_JobId_6336594489_5minutes.csv.gz"
    shutil.copy(FIXTURES / "job6336594489_5min_sum.csv.gz", folder / publisher_name)
    stray = "data_resource_usage_tenMinutes_6176858948.csv"  # a 10-minute series: not this source's step
    (folder / stray).write_text("600,1\n")
    defs = build_definitions(tmp_path / "traces", tmp_path / "warehouse")
    asset = defs.get_assets_def("raw_google2011_derived__job_sums")
    assert asset.partitions_def.get_partition_keys() == [publisher_name]

    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [asset], instance=instance, resources=defs.resources, partition_key=publisher_name
        )
        warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert result.success
    (mat,) = result.asset_materializations_for_node("raw_google2011_derived__job_sums")
    assert mat.metadata["dagster/row_count"].value == 50
    assert mat.metadata["n_unread_files"].value == 1
    text = mat.metadata["unread_files"].value
    assert stray in text and "job<id>_5min_sum.csv[.gz]" in text
    assert any(stray in w and "not read" in w for w in warnings), warnings
