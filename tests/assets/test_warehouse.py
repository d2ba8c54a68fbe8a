"""The warehouse: chunked partitions replace the previous version whole, views see every file, checks count."""

import polars as pl
import pytest

from assets.core import check_usage_invariants
from assets.resources import Warehouse
from pipelines.schemas import USAGE, empty_frame


def _usage(bins: list[int], cpu: list[float]) -> pl.DataFrame:
    n = len(bins)
    return pl.DataFrame(
        {
            "source": ["s"] * n,
            "workload_id": ["w"] * n,
            "bin_start_s": bins,
            "cpu_frac": cpu,
            "mem_frac": [0.1] * n,
            "n_samples": [1] * n,
            "is_filled": [False] * n,
        },
        schema=USAGE,
    )


def test_chunks_replace_previous_version_and_views_see_them(tmp_path):
    wh = Warehouse(root=str(tmp_path))
    wh.write_chunks("core__usage", "s", [_usage([0], [0.1]), _usage([300], [0.2])], empty_frame(USAGE))
    assert wh.query("select count(*) as n from core__usage")["n"][0] == 2
    wh.write_chunks("core__usage", "s", [_usage([0, 300, 600], [0.1, 0.2, 0.3])], empty_frame(USAGE))
    assert len(wh.partition_files("core__usage", "s")) == 1
    assert wh.query("select count(*) as n from core__usage")["n"][0] == 3


def test_a_crash_mid_write_keeps_the_previous_version(tmp_path):
    wh = Warehouse(root=str(tmp_path))
    wh.write_chunks("core__usage", "s", [_usage([0], [0.1])], empty_frame(USAGE))

    def failing():
        yield _usage([0, 300], [0.5, 0.5])
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        wh.write_chunks("core__usage", "s", failing(), empty_frame(USAGE))
    assert wh.scan("core__usage", ["s"]).collect()["cpu_frac"].to_list() == [0.1]
    assert not list((tmp_path / ".staging").glob("*"))


def test_empty_partition_keeps_its_schema(tmp_path):
    wh = Warehouse(root=str(tmp_path))
    _, rows = wh.write_chunks("core__usage", "s", iter([]), empty_frame(USAGE))
    assert rows == 0
    assert wh.scan("core__usage", ["s"]).collect().schema == pl.Schema(USAGE)


def test_usage_invariants_count_each_broken_rule(tmp_path):
    bad = pl.concat([_usage([0, 0, 301], [0.1, 0.2, -0.5])])
    path = tmp_path / "u.parquet"
    bad.write_parquet(path)
    assert check_usage_invariants([path]) == {
        "n_off_grid": 1,
        "n_bad_values": 1,
        "n_filled_with_samples": 0,
        "n_duplicate_bins": 1,
    }


def test_a_crash_between_the_swap_renames_is_repaired(tmp_path):
    wh = Warehouse(root=str(tmp_path))
    folder, _ = wh.write_chunks("core__usage", "s", [_usage([0], [0.1])], empty_frame(USAGE))
    staging = tmp_path / ".staging"
    staging.mkdir(exist_ok=True)
    folder.rename(staging / "core__usage.s.deadbeef.old")  # the first rename happened, the second did not
    assert wh.scan("core__usage", ["s"]).collect()["cpu_frac"].to_list() == [0.1]
