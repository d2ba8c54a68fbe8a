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


def test_the_footprint_checks_ours_against_tetris_overshoot_and_machines(tmp_path, benchmark_module) -> None:
    """Per replicate and pooled: ours within Tetris's overshoot + 0.5 point and no more machines, the best
    heuristic named; files without the columns give None."""
    module = benchmark_module("placer_replicates")
    folders = []
    for seed, (ours_over, ours_used) in enumerate([(0.4, 9.0), (1.2, 10.5)]):
        folder = _replicate(
            tmp_path / f"f{seed}",
            seed,
            {"forecast_residual_rl": [-1.0, -2.0], "tetris": [-3.0, -3.0], "deeprm_sjf": [-2.5, -2.5]},
        )
        frame = pl.read_parquet(folder / "test_returns_m10.parquet")
        over = {"forecast_residual_rl": ours_over, "tetris": 0.5, "deeprm_sjf": 0.1}
        used = {"forecast_residual_rl": ours_used, "tetris": 10.0, "deeprm_sjf": 10.0}
        frame.with_columns(
            pl.col("policy").replace_strict(over, return_dtype=pl.Float64).alias("overshoot_pct"),
            pl.col("policy").replace_strict(used, return_dtype=pl.Float64).alias("machines"),
        ).write_parquet(folder / "test_returns_m10.parquet")
        folders.append(folder)
    table = module.footprint(folders, 10)
    rows = {(r["replicate"], r["policy"]): r for r in table.iter_rows(named=True)}
    first, second = (
        rows[(str(folders[0]), "forecast_residual_rl")],
        rows[(str(folders[1]), "forecast_residual_rl")],
    )
    assert first["within_tetris_overshoot_0_5"] and first["no_more_machines_than_tetris"]
    assert not second["within_tetris_overshoot_0_5"] and not second["no_more_machines_than_tetris"]
    assert (str(folders[0]), "deeprm_sjf (best heuristic)") in rows
    pooled = rows[("pooled", "forecast_residual_rl")]
    assert pooled["overshoot_pct"] == pytest.approx(0.8) and pooled["machines"] == pytest.approx(9.75)
    assert pooled["within_tetris_overshoot_0_5"] and pooled["no_more_machines_than_tetris"]
    old = _replicate(tmp_path / "old", 0, {"forecast_residual_rl": [-1.0], "tetris": [-2.0]})
    assert module.footprint([old], 10) is None


def test_versus_pairs_the_learned_policy_with_another_runs_on_the_same_sequences(
    tmp_path, benchmark_module
) -> None:
    module = benchmark_module("placer_replicates")
    new = _replicate(
        tmp_path / "new",
        0,
        {"forecast_residual_rl": [-1.0e6, -2.0e6, -2.5e6], "tetris": [-3.0e6, -3.0e6, -4.0e6]},
    )
    old = _replicate(
        tmp_path / "old",
        0,
        {"forecast_residual_rl": [-2.0e6, -2.5e6, -2.5e6], "tetris": [-3.0e6, -3.0e6, -4.0e6]},
    )
    rows = {
        (r["replicate"], r["comparison"]): r for r in module.pooled([new], 10, [old]).iter_rows(named=True)
    }
    versus = rows[("pooled", "versus")]
    assert versus["mean_x1e6"] == pytest.approx(0.5) and (versus["n_better"], versus["n_worse"]) == (2, 0)
    other = _replicate(
        tmp_path / "other",
        1,
        {"forecast_residual_rl": [-2.0e6, -2.5e6, -2.5e6], "tetris": [-3.0e6, -3.5e6, -4.0e6]},
    )
    with pytest.raises(ValueError, match="same sequences"):
        module.pooled([new], 10, [other])
    with pytest.raises(ValueError, match="one folder per folder"):
        module.pooled([new], 10, [old, other])


def test_the_guarded_policy_is_judged_as_ours_and_against_the_unguarded_one(
    tmp_path, benchmark_module
) -> None:
    """`--ours forecast_residual_rl_replay` (bench_placer.py --replay-guard's row): the guarded policy is ours
    against the best heuristic, the comparison "forecast_residual_rl" is ours - the unguarded policy, neither
    learned row counts as a heuristic, and the footprint shows both."""
    module = benchmark_module("placer_replicates")
    folder = _replicate(
        tmp_path / "g",
        0,
        {
            "forecast_residual_rl": [-1.0e6, -2.0e6],
            "forecast_residual_rl_replay": [-1.5e6, -2.0e6],
            "tetris": [-3.0e6, -3.0e6],
        },
    )
    rows = {
        r["comparison"]: r
        for r in module.pooled([folder], 10, ours_name="forecast_residual_rl_replay").iter_rows(named=True)
        if r["replicate"] == "pooled"
    }
    assert rows["forecast_residual_rl"]["mean_x1e6"] == pytest.approx(-0.25)
    assert rows["best heuristic"]["mean_x1e6"] == pytest.approx(1.25)  # against Tetris, the only heuristic
    with pytest.raises(ValueError, match="forecast_residual_rl_replay"):
        module.pooled(
            [_replicate(tmp_path / "n", 0, {"tetris": [-1.0]})], 10, ours_name="forecast_residual_rl_replay"
        )
    frame = pl.read_parquet(folder / "test_returns_m10.parquet")
    frame.with_columns(overshoot_pct=pl.lit(0.1), machines=pl.lit(10.0)).write_parquet(
        folder / "test_returns_m10.parquet"
    )
    shown = module.footprint([folder], 10, "forecast_residual_rl_replay")["policy"].to_list()
    assert {"forecast_residual_rl_replay", "forecast_residual_rl", "tetris (best heuristic)"} <= set(shown)
    # Tetris as the best heuristic: one row for it, and the pooled row still finds its means
    feet = module.footprint([folder], 10, "forecast_residual_rl_replay")
    assert shown.count("tetris (best heuristic)") == 1 and "tetris" not in shown
    pooled = feet.filter(pl.col("replicate") == "pooled").row(0, named=True)
    assert pooled["overshoot_pct"] == pytest.approx(0.1) and pooled["within_tetris_overshoot_0_5"]
    # a second guard variant as ours: judged against the unguarded policy and the first guard alike
    late = _replicate(
        tmp_path / "late",
        0,
        {
            "forecast_residual_rl": [-1.0e6, -2.0e6],
            "forecast_residual_rl_replay": [-1.5e6, -2.0e6],
            "forecast_residual_rl_replay_late": [-1.0e6, -1.9e6],
            "tetris": [-3.0e6, -3.0e6],
        },
    )
    rows = {
        r["comparison"]: r["mean_x1e6"]
        for r in module.pooled([late], 10, ours_name="forecast_residual_rl_replay_late").iter_rows(named=True)
        if r["replicate"] == "pooled"
    }
    assert rows["forecast_residual_rl"] == pytest.approx(0.05)
    assert rows["forecast_residual_rl_replay"] == pytest.approx(0.3)
    assert rows["best heuristic"] == pytest.approx(1.55)
