"""Synthetic workloads (DeepPlace, DeepRM): ranges, splits, load calibration."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import JOB_SEQUENCES, realised_load
from pipelines.synthetic import (
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
    deepplace_templates,
    square_wave,
)

DP = DeepPlaceConfig(n_train_sequences=3, n_test_sequences=3, loads_pct=(30, 80))
DRM = DeepRMConfig(n_train_sequences=3, n_test_sequences=3, loads_pct=(30, 80))


def _load(g: pl.DataFrame, window: int) -> float:
    cpu = [np.array(x) for x in g["cpu_units"].to_list()]
    mem = [np.array(x) for x in g["mem_units"].to_list()]
    return realised_load(g["arrival_step"].to_numpy(), cpu, mem, 10, 8, window)


def test_square_wave_literal() -> None:
    assert square_wave(10, 4, 1, 0, 3.0, 1.0).tolist() == [3, 1, 1, 1, 3, 1, 1, 1, 3, 1]
    assert square_wave(6, 3, 1, 2, 2.0, 0.0).tolist() == [0, 2, 0, 0, 2, 0]


def test_deepplace_templates_follow_the_paper_ranges() -> None:
    cfg = DeepPlaceConfig()
    templates = deepplace_templates(50, "train", cfg, np.random.default_rng(0))
    assert len({t["workload_id"] for t in templates}) == 50
    assert sum(t["is_long_running"] for t in templates) == 25
    for t in templates:
        cpu, mem = t["cpu_units"], t["mem_units"]
        dom, other = (cpu, mem) if cpu.max() >= mem.max() else (mem, cpu)
        assert dom.max() in (3, 4)  # ceil(8 * U(0.3, 0.5))
        assert other.max() in (1, 2)  # ceil(8 * U(0.08, 0.16))
        assert len(cpu) == t["duration_steps"]
        assert len(set(dom.tolist())) == 2  # a square wave: a peak and a trough
        lo, hi = cfg.long_duration_steps if t["is_long_running"] else cfg.short_duration_steps
        assert lo <= t["duration_steps"] <= hi


@pytest.fixture(scope="module")
def deepplace() -> pl.DataFrame:
    return build_deepplace_sequences(DP)[0]


def test_deepplace_frame_split_and_load(deepplace) -> None:
    df = deepplace
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    assert (df["source"] == "deepplace_synthetic").all()
    train = set(df.filter(pl.col("split") == "train")["workload_id"])
    test = set(df.filter(pl.col("split") == "test")["workload_id"])
    assert len(train) <= 50 and len(test) <= 18 and not train & test
    for (load, _, _), g in df.group_by("load_pct", "split", "sequence_id"):
        assert abs(_load(g, DP.arrival_steps) - load / 100) < 0.01
        assert 0.35 <= g["is_long_running"].mean() <= 0.65


def test_deeprm_ranges_and_load() -> None:
    df = build_deeprm_sequences(DRM)
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    short = df.filter(~pl.col("is_long_running"))["duration_steps"]
    long_ = df.filter(pl.col("is_long_running"))["duration_steps"]
    assert short.min() >= 1 and short.max() <= 3 and long_.min() >= 10 and long_.max() <= 15
    assert 0.7 <= short.len() / df.height <= 0.9
    dom = np.maximum(df["cpu_request_units"].to_numpy(), df["mem_request_units"].to_numpy())
    other = np.minimum(df["cpu_request_units"].to_numpy(), df["mem_request_units"].to_numpy())
    assert set(dom.tolist()) <= {2, 3, 4} and set(other.tolist()) == {
        1
    }  # ceil(8*[0.25,0.5]), ceil(8*[0.05,0.1])
    assert (df["cpu_units"].list.n_unique() == 1).all()  # constant demand
    for (load, _, _), g in df.group_by("load_pct", "split", "sequence_id"):
        assert abs(_load(g, DRM.arrival_steps) - load / 100) < 0.02
        assert g["arrival_step"].max() < DRM.arrival_steps
