"""benchmarks/placement_replicates.py: replicates pooled by sequence against each replicate's own best heuristic."""

from pathlib import Path

import pytest

KINDS = {"tetris": "heuristic", "sjf": "heuristic", "rule": "forecast", "truth": "oracle"}


def _replicate(path: Path, results_frame, returns: dict[str, list[float]]) -> str:
    rows = [(policy, seq, ret) for policy, rets in returns.items() for seq, ret in enumerate(rets)]
    machines = {"tetris": 7.0, "sjf": 8.0, "rule": 6.0, "truth": 9.0}
    results_frame(rows, KINDS, overshoot={"tetris": 0.5}, machines=machines).write_parquet(path)
    return str(path)


def test_pooled_pairs_each_replicate_with_its_own_best_heuristic_and_never_the_oracle(
    tmp_path, results_frame, benchmark_module
) -> None:
    # replicate 0: SJF is the best heuristic; replicate 1: Tetris is; the oracle is far above both
    a = _replicate(
        tmp_path / "a.parquet",
        results_frame,
        {
            "tetris": [-10e6, -11e6, -12e6],
            "sjf": [-9e6, -10e6, -11e6],
            "rule": [-8e6, -9e6, -12e6],
            "truth": [-1e6] * 3,
        },
    )
    b = _replicate(
        tmp_path / "b.parquet",
        results_frame,
        {
            "tetris": [-5e6, -6e6, -7e6],
            "sjf": [-6e6, -7e6, -8e6],
            "rule": [-4e6, -5e6, -6e6],
            "truth": [-2e6] * 3,
        },
    )
    mod = benchmark_module("placement_replicates")
    table = mod.pooled([a, b], ["rule"])
    row = table.row(0, named=True)
    # differences: replicate 0 against SJF +1, +1, -1; replicate 1 against Tetris +1, +1, +1
    assert row["n_pairs"] == 6 and row["n_replicates"] == 2
    assert row["diff"] == pytest.approx(4e6 / 6)
    assert row["lo"] < row["diff"] < row["hi"]
    assert (row["n_better"], row["n_worse"]) == (5, 1)
    assert row["best_heuristics"] == "sjf,tetris"
    assert row["replicates_above"] == 1  # replicate 1: three identical +1 differences, a zero-width interval
    # gap closed: replicate 0 (−9.67 − −10) / (−1 − −10), replicate 1 (−5 − −6) / (−2 − −6); their mean
    assert row["gap_closed"] == pytest.approx(((1 / 3) / 9 + 1 / 4) / 2)
    assert row["tetris_overshoot_pct"] == pytest.approx(0.5) and row["machines"] == pytest.approx(6.0)
    line = mod.report_lines(table)[0]
    assert line.startswith("s 50 % rule - best (sjf,tetris): +0.667 [")  # x1e6
    assert "5 / 1 of 6 better / worse" in line and "replicates above / below 1 / 0 of 2" in line
    assert "machines 6.00 (Tetris 7.00)" in line and "(oracle - best +6.500)" in line  # (9 + 4) / 2
