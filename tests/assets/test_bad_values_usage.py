"""The issue's bar: an Alibaba container_usage shard with inf, nan, 1e300, a 250 % utilisation and an invalid UTF-8
byte yields a core__usage of finite in-range values (hold gap filling on), those lines quarantined, every other
line ingested; and the usage contract is an ERROR check that a non-finite value fails."""

import io
import shutil
import tarfile
from pathlib import Path

import polars as pl
from dagster import AssetCheckSeverity, DagsterInstance, materialize

from assets.definitions import build_definitions
from assets.resources import Warehouse
from pipelines.usage import check_usage_invariants

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces" / "alibaba-2018"
BAD = {150: "inf", 160: "nan", 170: "1e300", 180: "250", 190: "3\xff"}
"""1-based line -> cpu_util_pct written there (lines of container c_1)."""


def corrupt_container_usage(path: Path) -> int:
    """Rewrite the fixture tarball at `path` with `BAD` in cpu_util_pct; returns its number of lines."""
    with tarfile.open(FIXTURES / "container_usage.tar.gz", "r:gz") as tar:
        info = next(m for m in tar if m.isfile())
        lines = tar.extractfile(info).read().split(b"\n")
    for n, value in BAD.items():
        fields = lines[n - 1].split(b",")
        fields[3] = value.encode("latin-1")
        lines[n - 1] = b",".join(fields)
    data = b"\n".join(lines)
    info.size = len(data)
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(info, io.BytesIO(data))
    return data.count(b"\n")


def test_bad_values_never_reach_core_usage(tmp_path):
    traces = tmp_path / "traces" / "alibaba-2018"
    traces.mkdir(parents=True)
    for name in ("container_meta.csv.gz", "machine_meta.csv.gz"):
        shutil.copy(FIXTURES / name, traces / name)
    n_lines = corrupt_container_usage(traces / "container_usage.tar.gz")
    defs = build_definitions(tmp_path / "traces", tmp_path / "warehouse")
    run_config = {"ops": {"core__usage": {"config": {"usage": {"fill_policy": "hold", "max_fill_bins": 12}}}}}
    with DagsterInstance.ephemeral() as instance:
        for table, shard in [
            ("container_usage", "container_usage.tar.gz"),
            ("container_meta", "container_meta.csv.gz"),
            ("machine_meta", "machine_meta.csv.gz"),
        ]:
            raw = materialize(
                [defs.get_assets_def(f"raw_alibaba2018__{table}")],
                instance=instance,
                resources=defs.resources,
                partition_key=shard,
            )
            assert raw.success
            if table == "container_usage":
                meta = raw.asset_materializations_for_node("raw_alibaba2018__container_usage")[0].metadata
        usage_run = materialize(
            [defs.get_assets_def("core__usage")],
            instance=instance,
            resources=defs.resources,
            partition_key="alibaba2018",
            run_config=run_config,
        )
    assert usage_run.success
    checks = {c.check_name: c for c in usage_run.get_asset_check_evaluations()}
    assert checks["usage_contract"].passed and checks["usage_contract"].severity == AssetCheckSeverity.ERROR

    wh = Warehouse(root=str(tmp_path / "warehouse"))
    quarantine = wh.scan("raw_quarantine").collect().filter(pl.col("table") == "container_usage")
    new = quarantine.filter(pl.col("line_number").is_in(list(BAD)))
    assert new.sort("line_number")["reason"].to_list() == [
        "non-finite cpu_util_pct: inf",
        "non-finite cpu_util_pct: NaN",
        "cpu_util_pct out of range [0, 100]: 1e+300",
        "cpu_util_pct out of range [0, 100]: 250.0",
        "invalid UTF-8: b'\\xff' at byte 20",
    ]
    assert set(new["source_file"]) == {"container_usage.tar.gz"}
    # every other line ingested: the fixture's own quarantine is its 100 empty-container_id lines
    assert quarantine.height == 100 + len(BAD)
    assert meta["rows_in"].value == n_lines
    assert meta["rows_written"].value == n_lines - quarantine.height
    assert meta["quarantined_by_reason"].value == {
        "empty container_id": 100,
        "cpu_util_pct out of range [0, 100]": 2,
        "non-finite cpu_util_pct": 2,
        "invalid UTF-8": 1,
    }
    usage = wh.scan("core__usage", ["alibaba2018"]).collect()
    assert usage.height > 0 and usage["is_filled"].any()  # hold filling ran next to the quarantined lines
    for c in ("cpu_frac", "mem_frac"):
        assert usage[c].is_finite().all() and usage[c].min() >= 0 and usage[c].max() <= 1


def test_usage_contract_counts_infinite_fractions(tmp_path):
    frame = pl.DataFrame(
        {
            "source": ["s"] * 4,
            "workload_id": ["a", "b", "c", "d"],
            "bin_start_s": [0, 0, 0, 0],
            "cpu_frac": [0.5, float("inf"), float("nan"), 0.1],
            "mem_frac": [0.5, 0.5, 0.5, -0.1],
            "n_samples": [1, 1, 1, 1],
            "is_filled": [False] * 4,
        }
    )
    frame.write_parquet(tmp_path / "u.parquet")
    assert check_usage_invariants([tmp_path / "u.parquet"])["n_bad_values"] == 3
