"""benchmarks/placer_replicates.py: bench_placer replicates pooled by sequence, each against its own best heuristic."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest


def _replicate(folder: Path, seed: int, returns: dict[str, list[float]]) -> Path:
    folder.mkdir()
    rows = [
        {"n_machines": 10, "seed": seed, "policy": name, "sequence": i, "return": r}
        for name, rets in returns.items()
        for i, r in enumerate(rets)
    ]
    pl.DataFrame(rows).write_parquet(folder / "test_returns_m10.parquet")
    return folder


def test_each_replicate_is_paired_with_its_own_best_heuristic_and_pooled_over_all_sequences(
    tmp_path, benchmark_module
) -> None:
    # replicate 0: SJF is the best heuristic; replicate 1: Tetris is; forecast_peak is a forecast rule, not a
    # heuristic, and beats both
    a = _replicate(
        tmp_path / "s0",
        0,
        {
            "forecast_residual_rl": [-5.0e6, -6.0e6, -7.0e6],
            "base:hybrid_observed": [-6.0e6, -6.0e6, -8.0e6],
            "tetris": [-9.0e6, -9.0e6, -9.0e6],
            "deeprm_sjf": [-6.5e6, -6.5e6, -6.5e6],
            "forecast_peak": [-1.0e6, -1.0e6, -1.0e6],
        },
    )
    b = _replicate(
        tmp_path / "s1",
        1,
        {
            "forecast_residual_rl": [-4.0e6, -4.5e6],
            "base:hybrid_observed": [-4.0e6, -4.5e6],
            "tetris": [-3.0e6, -3.5e6],
            "deeprm_sjf": [-8.0e6, -8.0e6],
            "forecast_peak": [-2.0e6, -2.0e6],
        },
    )
    table = benchmark_module("placer_replicates").pooled([a, b], 10)
    rows = {(r["replicate"], r["comparison"]): r for r in table.iter_rows(named=True)}
    assert rows[(str(a), "best heuristic (deeprm_sjf)")]["mean_x1e6"] == pytest.approx((1.5 + 0.5 - 0.5) / 3)
    assert rows[(str(b), "best heuristic (tetris)")]["mean_x1e6"] == pytest.approx(-1.0)
    pooled = rows[("pooled", "best heuristic")]
    diffs = np.array([1.5, 0.5, -0.5, -1.0, -1.0])
    assert pooled["n_sequences"] == 5 and pooled["mean_x1e6"] == pytest.approx(diffs.mean())
    assert (pooled["n_better"], pooled["n_worse"]) == (2, 3)
    assert pooled["low_x1e6"] < diffs.mean() < pooled["high_x1e6"]
    assert rows[("pooled", "forecast_peak")]["mean_x1e6"] == pytest.approx((-4 - 5 - 6 - 2 - 2.5) / 5)
    assert rows[("pooled", "base rule")]["n_sequences"] == 5
    # replicate 0 ties SJF (its interval spans 0), replicate 1 is 1e6 below Tetris on both sequences
    assert (pooled["n_replicates_above"], pooled["n_replicates_below"]) == (0, 1)


def test_a_replicate_without_the_learned_policy_or_with_unequal_sequences_is_refused(
    tmp_path, benchmark_module
) -> None:
    module = benchmark_module("placer_replicates")
    missing = _replicate(tmp_path / "m", 0, {"tetris": [-1.0, -2.0]})
    with pytest.raises(ValueError, match="forecast_residual_rl"):
        module.pooled([missing], 10)
    uneven = _replicate(tmp_path / "u", 0, {"forecast_residual_rl": [-1.0, -2.0], "tetris": [-1.0]})
    with pytest.raises(ValueError, match="different numbers of test sequences"):
        module.pooled([uneven], 10)
    shifted = _replicate(tmp_path / "s", 0, {"forecast_residual_rl": [-1.0, -2.0], "tetris": [-1.0, -2.0]})
    frame = pl.read_parquet(shifted / "test_returns_m10.parquet")
    frame.with_columns(
        pl.when(pl.col("policy") == "tetris").then(pl.col("sequence") + 1).otherwise(pl.col("sequence"))
    ).write_parquet(shifted / "test_returns_m10.parquet")
    with pytest.raises(ValueError, match="different test sequences"):
        module.pooled([shifted], 10)
    with pytest.raises(FileNotFoundError, match="test_returns_m50"):
        module.pooled([missing], 50)
