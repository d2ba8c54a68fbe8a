"""Bad values and bad bytes through the real runner: `tvw-run --layers raw,per_source` on an Alibaba trace folder
whose container_usage shard holds inf, nan, 1e300, a 250 % utilisation and an invalid UTF-8 byte.

tests/assets/test_bad_values_usage.py checks the same shard asset by asset (in-process `materialize`, ephemeral
instance) and tests/pipelines/test_bad_values.py every source's ingest function; this test adds the path a user
takes: worker processes, the profile, the run summary and exit status."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

pytestmark = pytest.mark.slow


def test_tvw_run_quarantines_the_bad_lines_and_ingests_every_other(tmp_path, tvw):
    usage_test = tvw.load_file(
        tvw.ROOT / "tests" / "assets" / "test_bad_values_usage.py", "_reliability_bad_values_usage"
    )
    traces = tmp_path / "traces" / "alibaba-2018"
    shutil.copytree(tvw.FIXTURES / "alibaba-2018", traces)
    n_lines = usage_test.corrupt_container_usage(traces / "container_usage.tar.gz")
    wh = tmp_path / "wh"
    # c_1, the one container the sample's rule (200 records) keeps, loses 5 of its 200 records to quarantine
    extra = ("--allow-empty", "alibaba2018")
    cmd = tvw.command(tmp_path / "traces", wh, "sample", "raw,per_source", "alibaba2018", 2, *extra)
    done = tvw.run(cmd, tmp_path / "home")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out and "FAILED" not in out, out

    from assets.resources import Warehouse

    warehouse = Warehouse(root=str(wh))
    quarantine = warehouse.scan("raw_quarantine").collect().filter(pl.col("table") == "container_usage")
    bad = quarantine.filter(pl.col("line_number").is_in(list(usage_test.BAD))).sort("line_number")
    assert bad["line_number"].to_list() == sorted(usage_test.BAD)  # file, line, reason for each bad line
    assert set(bad["source_file"]) == {"container_usage.tar.gz"}
    assert [r.split(":")[0] for r in bad["reason"]] == [
        "non-finite cpu_util_pct",
        "non-finite cpu_util_pct",
        "cpu_util_pct out of range [0, 100]",
        "cpu_util_pct out of range [0, 100]",
        "invalid UTF-8",
    ]
    # the fixture's own quarantine is its 100 empty-container_id lines; every other line is in the raw table
    assert quarantine.height == 100 + len(usage_test.BAD)
    rows = warehouse.scan("raw_alibaba2018__container_usage").collect().height
    assert rows + quarantine.height == n_lines

    usage = warehouse.scan("core__usage", ["alibaba2018"]).collect()
    assert usage.height > 0
    for column in ("cpu_frac", "mem_frac"):
        values = usage[column].drop_nulls()
        assert values.is_finite().all() and values.min() >= 0 and values.max() <= 1, column
