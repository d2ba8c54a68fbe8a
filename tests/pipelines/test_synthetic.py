"""Synthetic workloads (DeepPlace, DeepRM): the papers' shapes and ranges, splits, offered load."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import JOB_SEQUENCES, offered_load_check, offered_load_table
from pipelines.synthetic import (
    DEEPPLACE_SOURCE,
    DEEPRM_SOURCE,
    SYNTHETIC_SOURCES,
    SYNTHETIC_WORKLOADS,
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
    cluster_of,
    deepplace_templates,
    deeprm_arrival_plan,
    deeprm_mean_work,
    sample_units,
    square_wave,
)

DP = DeepPlaceConfig(n_train_sequences=12, n_test_sequences=6, loads_pct=(30, 80))
DRM = DeepRMConfig(n_train_sequences=40, n_test_sequences=20, loads_pct=(30, 80))


def test_square_wave_literal() -> None:
    assert square_wave(10, 4, 1, 0, 3.0, 1.0).tolist() == [3, 1, 1, 1, 3, 1, 1, 1, 3, 1]
    assert square_wave(6, 3, 1, 2, 2.0, 0.0).tolist() == [0, 2, 0, 0, 2, 0]
    # a step holds the wave's mean over the step: period 2, width 0.5 -> half of step 0 high
    assert square_wave(4, 2.0, 0.5, 0.0, 4.0, 0.0).tolist() == [2.0, 0.0, 2.0, 0.0]


@pytest.mark.parametrize("period", [1.6, 2.0, 2.7, 5.3])
def test_square_wave_is_high_a_quarter_of_the_time_at_any_period(period: float) -> None:
    length = int(round(period * 100))  # whole periods
    wave = square_wave(length, period, period / 4, 0.3, 1.0, 0.0)
    assert wave.mean() == pytest.approx(0.25, abs=1e-9)


def test_deepplace_templates_follow_the_paper_ranges() -> None:
    cfg = DeepPlaceConfig()
    templates = deepplace_templates(2000, "train", cfg, np.random.default_rng(0))
    assert sum(t["is_long_running"] for t in templates) == 1000
    peaks_dom, peaks_other = [], []
    for t in templates:
        cpu, mem = t["cpu_units"], t["mem_units"]
        assert len(cpu) == t["duration_steps"]
        lo, hi = cfg.long_duration_steps if t["is_long_running"] else cfg.short_duration_steps
        assert lo <= t["duration_steps"] <= hi
        # long jobs: period >= 6.2 steps, so some step is high throughout (short ones may be averaged down)
        if t["is_long_running"]:
            dom, other = (cpu, mem) if t["ec_label"] in (1, 2) else (mem, cpu)
            peaks_dom.append(dom.max())
            peaks_other.append(other.max())
    # high levels: U(0.3, 0.5) and U(0.08, 0.16) of 8 units, rounded to nearest: no upward bias
    assert set(peaks_dom) <= {2, 3, 4} and set(peaks_other) <= {1, 2}
    assert np.mean(peaks_dom) == pytest.approx(0.4 * 8, abs=0.15)
    assert np.mean(peaks_other) == pytest.approx(0.12 * 8, abs=0.15)


def test_deepplace_low_level_is_the_config_value() -> None:
    # the dominant resource sits at trough_ratio x its high level off the peak (rounded)
    cfg = DeepPlaceConfig(trough_ratio=0.5, dominant_frac=(0.5, 0.5), long_duration_steps=(80, 80))
    t = deepplace_templates(2, "train", cfg, np.random.default_rng(1))[0]
    dom = t["cpu_units"] if t["cpu_units"].max() == 4 else t["mem_units"]
    assert dom.max() == 4 and dom.min() == 2 and np.median(dom) == 2


@pytest.fixture(scope="module")
def deepplace() -> tuple[pl.DataFrame, dict]:
    return build_deepplace_sequences(DP)


def test_deepplace_frame_split_and_offered_load(deepplace) -> None:
    df, stats = deepplace
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    assert (df["source"] == DEEPPLACE_SOURCE).all()
    train = set(df.filter(pl.col("split") == "train")["workload_id"])
    test = set(df.filter(pl.col("split") == "test")["workload_id"])
    assert len(train) <= 50 and len(test) <= 18 and not train & test
    assert stats["n_distinct_workloads"][DEEPPLACE_SOURCE]["test"] == len(test)
    table = offered_load_table(df, DP.n_machines, DP.capacity_units, DP.arrival_steps)
    chk = offered_load_check(table, tolerance=0.1, by_split=True)
    assert chk["is_within_tolerance"].all(), chk
    for _, g in df.group_by("load_pct", "split", "sequence_id"):
        assert 0.35 <= g["is_long_running"].mean() <= 0.65
        assert g["arrival_step"].max() < DP.arrival_steps


def test_deepplace_validation_sequences_draw_held_out_templates(deepplace) -> None:
    """The last 4 of 12 training sequences per load draw 15 of the 50 training templates (each class's last
    30 %), which the other training sequences never draw."""
    df, stats = deepplace
    train = df.filter(pl.col("split") == "train")
    is_val = pl.col("sequence_id") >= DP.n_train_sequences - 4
    val_ids = set(train.filter(is_val)["workload_id"].to_list())
    fit_ids = set(train.filter(~is_val)["workload_id"].to_list())
    assert val_ids and fit_ids and not val_ids & fit_ids
    assert stats["validation_workloads"][DEEPPLACE_SOURCE] == 15
    assert set(train.filter(is_val)["ec_label"].unique().to_list()) == {1, 2, 3, 4}
    with pytest.raises(ValueError, match="validation_share must be in"):
        build_deepplace_sequences(DeepPlaceConfig(validation_share=-0.1))


def test_sample_units_is_unbiased() -> None:
    x = np.full(200_000, 0.6)
    got = sample_units(x, np.random.default_rng(0))
    assert set(np.unique(got).tolist()) == {0, 1} and got.mean() == pytest.approx(0.6, abs=0.005)
    assert sample_units([2.0, 3.0], np.random.default_rng(0)).tolist() == [2, 3]


def test_deeprm_plan_reachable_loads() -> None:
    cfg = DeepRMConfig()
    # E[duration] = 0.8 * 2 + 0.2 * 12.5 = 4.1 steps; E[demand] = (0.375 + 0.075) / 2 of the cluster
    assert deeprm_mean_work(cfg) == pytest.approx(4.1 * 0.225 * 8)
    plan = deeprm_arrival_plan(cfg)
    assert plan["max_offered_load_pct"] == pytest.approx(92.25)
    assert plan["arrival_probability"][80] == pytest.approx(80 / 92.25)
    assert all(plan["is_reachable"].values())
    with pytest.raises(ValueError, match="at most 92.2 % is reachable"):
        build_deeprm_sequences(DeepRMConfig(loads_pct=(130,), n_train_sequences=1, n_test_sequences=0))
    # demands are fractions of the whole cluster: on 10 machines a job would need up to 40 units of 8
    with pytest.raises(ValueError, match="exceed one machine"):
        deeprm_arrival_plan(DeepRMConfig(n_machines=10))


@pytest.fixture(scope="module")
def deeprm() -> pl.DataFrame:
    return build_deeprm_sequences(DRM)


def test_deeprm_ranges(deeprm) -> None:
    df = deeprm
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    short = df.filter(~pl.col("is_long_running"))["duration_steps"]
    long_ = df.filter(pl.col("is_long_running"))["duration_steps"]
    assert short.min() >= 1 and short.max() <= 3 and long_.min() >= 10 and long_.max() <= 15
    assert 0.75 <= short.len() / df.height <= 0.85
    assert (df["cpu_units"].list.n_unique() == 1).all()  # constant demand
    dom = np.maximum(df["cpu_request_units"].to_numpy(), df["mem_request_units"].to_numpy())
    other = np.minimum(df["cpu_request_units"].to_numpy(), df["mem_request_units"].to_numpy())
    # fractions of the whole (one-machine) cluster of 8 units, sampled in units without bias
    assert set(dom.tolist()) <= {2, 3, 4} and set(other.tolist()) <= {0, 1}
    assert dom.mean() == pytest.approx(0.375 * 8, abs=0.1)
    assert other.mean() == pytest.approx(0.075 * 8, abs=0.05)


def test_deeprm_has_at_most_one_arrival_per_step(deeprm) -> None:
    per_step = deeprm.group_by("load_pct", "split", "sequence_id", "arrival_step").len()
    assert per_step["len"].max() == 1
    assert deeprm["arrival_step"].max() < DRM.arrival_steps
    # the Bernoulli rate: the share of steps with an arrival is the plan's probability
    plan = deeprm_arrival_plan(DRM)
    n_seq = DRM.n_train_sequences + DRM.n_test_sequences
    for load in DRM.loads_pct:
        share = deeprm.filter(pl.col("load_pct") == load).height / (n_seq * DRM.arrival_steps)
        assert share == pytest.approx(plan["arrival_probability"][load], abs=0.03)


def test_deeprm_offered_load_matches_the_label(deeprm) -> None:
    table = offered_load_table(deeprm, DRM.n_machines, DRM.capacity_units, DRM.arrival_steps)
    chk = offered_load_check(table, tolerance=0.1)
    assert chk["is_within_tolerance"].all(), chk
    assert (table["source"] == DEEPRM_SOURCE).all()


def test_the_registry_states_each_workloads_cluster_and_builds_it_with_the_runs_counts() -> None:
    assert tuple(SYNTHETIC_WORKLOADS) == SYNTHETIC_SOURCES
    assert cluster_of(DEEPRM_SOURCE, 10, 300) == (1, 50) and cluster_of(DEEPPLACE_SOURCE, 7, 9) == (10, 300)
    assert cluster_of("bitbrains", 7, 9) == (7, 9)
    assert [w.has_usage_shape for w in SYNTHETIC_WORKLOADS.values()] == [True, False]
    for source, workload in SYNTHETIC_WORKLOADS.items():
        jobs = workload.build(2, 1, (50,), 3)
        assert set(jobs["source"]) == {source} and set(jobs["load_pct"]) == {50}
        counts = dict(jobs.group_by("split").agg(pl.col("sequence_id").n_unique()).iter_rows())
        assert counts == {"train": 2, "test": 1}
    again = SYNTHETIC_WORKLOADS[DEEPRM_SOURCE].build(2, 1, (50,), 3)
    expected = build_deeprm_sequences(
        DeepRMConfig(n_train_sequences=2, n_test_sequences=1, loads_pct=(50,), seed=3)
    )
    assert again.equals(expected)
