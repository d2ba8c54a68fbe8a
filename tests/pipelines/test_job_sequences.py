"""Job sequences: quantisation, time scaling, load calibration, splits and mix."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import (
    JOB_SEQUENCES,
    SequenceConfig,
    build_job_sequences,
    mix_pattern,
    quantise_usage,
    realised_load,
    time_scale,
)


def test_quantise_ceil_gives_any_nonzero_usage_a_unit() -> None:
    frac = [0.0, 1e-9, 0.01, 0.125, 0.13, 0.25, 1.0, 1.3]
    assert quantise_usage(frac, 8, "ceil").tolist() == [0, 0, 1, 1, 2, 2, 8, 8]
    assert quantise_usage(frac, 8, "ceil").dtype == np.int16


def test_quantise_round_is_half_up() -> None:
    assert quantise_usage([0.01, 0.0625, 0.13, 0.1874, 0.25, 1.3], 8, "round").tolist() == [0, 1, 1, 1, 2, 8]


def test_quantise_rejects_negative_and_unknown_mode() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        quantise_usage([0.1, -0.2])
    with pytest.raises(ValueError, match="unknown mode"):
        quantise_usage([0.1], mode="floor")


def test_time_scale_mean_and_max_drop_partial_step() -> None:
    assert time_scale([1, 2, 3, 4, 5, 6, 7], 3).tolist() == [2.0, 5.0]
    assert time_scale([1, 2, 3, 4, 5, 6, 7], 3, how="max").tolist() == [3.0, 6.0]
    assert time_scale([1, 2], 3).tolist() == []
    with pytest.raises(ValueError, match="step_bins"):
        time_scale([1.0], 0)


def test_realised_load_hand_case() -> None:
    # M=1, C=4, window [0, 2): job A (0..1) uses cpu 2+2, job B (1) uses cpu 4 and mem 4 -> 12 / (2*1*4*2)
    cpu = [np.array([2, 2]), np.array([4])]
    mem = [np.array([0, 0]), np.array([4])]
    assert realised_load(np.array([0, 1]), cpu, mem, 1, 4) == pytest.approx(0.75)
    # a longer window dilutes: 12 / (2*1*4*4)
    assert realised_load(np.array([0, 1]), cpu, mem, 1, 4, window_steps=4) == pytest.approx(0.375)


def test_mix_pattern_keeps_every_block_balanced() -> None:
    is_long, is_cpu = mix_pattern(40, 0.5, np.random.default_rng(0))
    assert is_long.sum() == 20
    assert (is_long & is_cpu).sum() == 10 and (~is_long & is_cpu).sum() == 10
    for start in range(0, 40, 4):  # any block of 4 holds 2 long, 1 long cpu and 1 short cpu
        assert is_long[start : start + 4].sum() == 2


def _pool(n_workloads: int = 24, n_bins: int = 1500, seed: int = 3) -> tuple[pl.DataFrame, pl.DataFrame]:
    """USAGE and LONG_RUNNING rows of a synthetic source "s": sine-shaped usage, half cpu-heavy."""
    rng = np.random.default_rng(seed)
    usage, long_running = [], []
    for w in range(n_workloads):
        t = np.arange(n_bins)
        big, small = rng.uniform(0.05, 0.1), rng.uniform(0.01, 0.03)
        cpu, mem = (big, small) if w % 2 else (small, big)
        usage.append(
            pl.DataFrame(
                {
                    "source": "s",
                    "workload_id": f"w{w}",
                    "bin_start_s": (100 + t) * 300,
                    "cpu_frac": cpu * (1 + 0.5 * np.sin(t / 40 + w)),
                    "mem_frac": mem * (1 + 0.5 * np.cos(t / 60 + w)),
                }
            )
        )
        long_running.append(
            {
                "source": "s",
                "workload_id": f"w{w}",
                "run_start_s": 100 * 300,
                "n_run_bins": n_bins,
                "cpu_request_frac": 0.2,
                "mem_request_frac": 0.2,
            }
        )
    return pl.concat(usage), pl.DataFrame(long_running)


CFG = SequenceConfig(n_train_sequences=6, n_test_sequences=4, loads_pct=(30, 80))


@pytest.fixture(scope="module")
def built() -> tuple[pl.DataFrame, dict]:
    usage, long_running = _pool()
    assignments = pl.DataFrame({"workload_id": ["w0", "w1"], "ec_label": [3, 5]})
    return build_job_sequences(usage, long_running, assignments, CFG)


def _load_of(g: pl.DataFrame) -> float:
    cpu = [np.array(x) for x in g["cpu_units"].to_list()]
    mem = [np.array(x) for x in g["mem_units"].to_list()]
    return realised_load(
        g["arrival_step"].to_numpy(), cpu, mem, CFG.n_machines, CFG.capacity_units, CFG.arrival_steps
    )


def test_schema_counts_and_reproducibility(built) -> None:
    df, stats = built
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    n_seq = df.select("load_pct", "split", "sequence_id").unique().height
    assert n_seq == 2 * (6 + 4)
    assert stats["n_jobs"] == df.height and stats["n_sequences_load_unreachable"] == 0
    usage, long_running = _pool()
    again, _ = build_job_sequences(
        usage, long_running, pl.DataFrame({"workload_id": ["w0", "w1"], "ec_label": [3, 5]}), CFG
    )
    assert again.equals(df)


def test_realised_load_matches_target(built) -> None:
    df, _ = built
    for (load, _split, _seq), g in df.group_by("load_pct", "split", "sequence_id"):
        assert abs(_load_of(g) - load / 100) < 0.01, (load, _seq)


def test_train_and_test_workloads_are_disjoint(built) -> None:
    df, stats = built
    train = set(df.filter(pl.col("split") == "train")["workload_id"].to_list())
    test = set(df.filter(pl.col("split") == "test")["workload_id"].to_list())
    assert train and test and not train & test
    assert stats["n_workloads_train"] + stats["n_workloads_test"] == 24


def test_mix_labels_and_units(built) -> None:
    df, _ = built
    assert 0.4 <= df["is_long_running"].mean() <= 0.6
    assert (df["is_long_running"] == (df["duration_steps"] > 30)).all()
    cpu_heavy = (df["cpu_units"].list.mean() > df["mem_units"].list.mean()).mean()
    assert 0.35 <= cpu_heavy <= 0.65
    assert (df["cpu_units"].list.len() == df["duration_steps"]).all()
    assert (df["cpu_request_units"] == df["cpu_units"].list.max()).all()
    assert df["cpu_units"].list.max().max() <= 8
    labels = dict(zip(df["workload_id"].to_list(), df["ec_label"].to_list(), strict=True))
    assert all(labels.get(w, lab) == lab for w, lab in (("w0", 3), ("w1", 5)))
    assert {lab for w, lab in labels.items() if w not in ("w0", "w1")} == {0}
    # arrivals sorted, first at 0, all inside the window
    for _, g in df.group_by("load_pct", "split", "sequence_id"):
        arr = g.sort("job_index")["arrival_step"]
        assert arr[0] == 0 and arr.is_sorted() and arr.max() < CFG.arrival_steps


def test_oversized_usage_is_clipped_and_counted() -> None:
    usage, long_running = _pool(n_workloads=4, n_bins=600)
    usage = usage.with_columns(
        pl.when(pl.col("workload_id") == "w1").then(1.7).otherwise(pl.col("cpu_frac")).alias("cpu_frac")
    )
    cfg = SequenceConfig(n_train_sequences=2, n_test_sequences=2, loads_pct=(50,), usage_scale=(1.0, 1.0))
    df, stats = build_job_sequences(usage, long_running, None, cfg)
    assert stats["n_workloads_clipped"] == 1
    assert df["cpu_units"].list.max().max() <= 8
    if "w1" in df["workload_id"].to_list():
        assert stats["n_jobs_clipped"] > 0


def test_too_few_workloads_is_a_clear_error() -> None:
    usage, long_running = _pool(n_workloads=1, n_bins=600)
    with pytest.raises(ValueError, match="at least 2 long-running workloads"):
        build_job_sequences(usage, long_running, None, CFG)
