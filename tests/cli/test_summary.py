"""tvw-run's closing summary survives a warehouse whose partitions were written by different code versions."""

from pathlib import Path

import polars as pl

from assets.resources import Warehouse
from cli.summary import source_summary


def test_a_table_whose_partitions_disagree_is_named_not_a_crash(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    row = {"source": "a", "is_chosen": True, "method": "dtw", "k": 3, "choice_basis": "beats_control"}
    wh.write("ec__method_comparison", pl.DataFrame([row]), "a")
    # a partition written by a later version: one more column
    wh.write("ec__method_comparison", pl.DataFrame([{**row, "source": "b", "eg_diff_pct": 1.0}]), "b")
    wh.write(
        "core__workloads", pl.DataFrame({"source": ["a", "a", "b"], "workload_id": ["1", "2", "3"]}), "a"
    )
    lines = source_summary(Path(wh.root), ["a", "b"], ("per_source", "ec"))
    text = "\n".join(lines)
    assert "WARNING ec__method_comparison: its partitions cannot be read together" in text
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:3]}
    assert rows["a"][0] == "2" and rows["b"][0] == "1"  # the readable tables still count


def test_a_run_of_the_early_layers_is_not_warned_about_tables_it_did_not_make(tmp_path):
    wh = Warehouse(root=str(tmp_path / "wh"))
    wh.write("core__workloads", pl.DataFrame({"source": ["a"] * 3, "workload_id": ["1", "2", "3"]}), "a")
    wh.write("core__long_running", pl.DataFrame({"source": ["a"] * 3, "workload_id": ["1", "2", "3"]}), "a")
    early = "\n".join(source_summary(Path(wh.root), ["a"], ("raw", "per_source")))
    assert "WARNING" not in early
    full = "\n".join(source_summary(Path(wh.root), ["a"], ("per_source", "ec")))
    assert "WARNING a: 3 kept, too few to map to equivalence classes" in full


def test_a_source_without_equivalence_classes_is_told_why(tmp_path):
    """Where the EC comparison chose no mapping (no method beat its random control), the warning says so
    instead of blaming the number of workloads."""
    wh = Warehouse(root=str(tmp_path / "wh"))
    ids = [str(i) for i in range(84)]
    wh.write("core__workloads", pl.DataFrame({"source": ["a"] * 84, "workload_id": ids}), "a")
    wh.write("core__long_running", pl.DataFrame({"source": ["a"] * 84, "workload_id": ids}), "a")
    reason = "no mapping chosen: none of the 9 rows beats its random control"
    row = {"source": "a", "is_chosen": False, "method": "dtw", "k": 3, "choice_basis": "none"}
    wh.write("ec__method_comparison", pl.DataFrame([{**row, "choice_reason": reason}]), "a")
    text = "\n".join(source_summary(Path(wh.root), ["a"], ("per_source", "ec")))
    assert f"WARNING a: 84 kept, no equivalence classes: {reason}" in text
    assert "too few" not in text
