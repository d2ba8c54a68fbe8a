"""Evaluation runner: one finite row per (source, load, policy, sequence, seed); summary intervals; the plot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import jobs_to_frame
from sim.config import SimConfig
from sim.evaluate import RESULT_KEY, evaluate_policies, learn_group_profiles, plot_results, summarise
from sim.jobs import JobBatch
from sim.policies import POLICIES, BestFit
from sim.profiles import EcProfiles, learn_profiles

CFG = SimConfig(n_machines=3, max_steps=40)


def _tiny_frame() -> pl.DataFrame:
    """Two sources x one load x 2 test sequences (+ 1 train sequence that must be ignored)."""
    rows = []
    for source in ("a", "b"):
        for split, n_seq in (("test", 2), ("train", 1)):
            for seq in range(n_seq):
                for j in range(4):
                    cpu = np.array([1 + (j + seq) % 3] * (3 + j), dtype=np.int16)
                    mem = np.array([2] * (3 + j), dtype=np.int16)
                    rows.append(
                        {
                            "source": source,
                            "load_pct": 50,
                            "split": split,
                            "sequence_id": seq,
                            "job_index": j,
                            "arrival_step": j // 2,
                            "workload_id": f"{source}{seq}-{j}",
                            "ec_label": 1 + j % 2,
                            "duration_steps": 3 + j,
                            "cpu_units": cpu,
                            "mem_units": mem,
                            "cpu_request_units": int(cpu.max()),
                            "mem_request_units": 2,
                            "is_long_running": False,
                        }
                    )
    return jobs_to_frame(rows)


@pytest.fixture(scope="module")
def results() -> pl.DataFrame:
    return evaluate_policies(_tiny_frame(), ["best_fit", "deeprm_sjf", "ec_peak_aware"], CFG, seeds=(0, 1))


def _scaled(frame: pl.DataFrame, split: str) -> pl.DataFrame:
    """`frame` with the usage of `split` rows halved (floor), other rows unchanged."""
    halve = pl.when(pl.col("split") == split)
    return frame.with_columns(
        halve.then(pl.col(c).list.eval(pl.element() // 2)).otherwise(pl.col(c)).alias(c)
        for c in ("cpu_units", "mem_units")
    )


def test_profiles_come_from_the_train_split_only() -> None:
    frame = _tiny_frame()
    prof = learn_group_profiles(frame, "a", 50, CFG)
    train = JobBatch.from_frame(frame.filter((pl.col("split") == "train") & (pl.col("source") == "a")))
    assert np.array_equal(prof.fraction, learn_profiles(train, CFG.n_labels, 6).fraction)
    assert np.array_equal(learn_group_profiles(_scaled(frame, "test"), "a", 50, CFG).fraction, prof.fraction)
    assert not np.array_equal(
        learn_group_profiles(_scaled(frame, "train"), "a", 50, CFG).fraction, prof.fraction
    )
    assert learn_group_profiles(frame.filter(pl.col("split") == "test"), "a", 50, CFG) is None


def test_evaluate_hands_each_group_its_train_profiles(monkeypatch) -> None:
    seen: list[EcProfiles | None] = []

    @dataclass(frozen=True)
    class Recorder:
        profiles: EcProfiles | None = None
        name: str = "recorder"

        def __post_init__(self) -> None:
            seen.append(self.profiles)

        def act(self, cfg, state, rng):
            return BestFit().act(cfg, state, rng)

    monkeypatch.setitem(POLICIES, "recorder", Recorder)
    frame = _tiny_frame()
    evaluate_policies(frame, ["recorder", "best_fit"], CFG)
    assert len(seen) == 2  # one per (source, load)
    for source, got in zip(("a", "b"), seen, strict=True):
        assert np.array_equal(got.fraction, learn_group_profiles(frame, source, 50, CFG).fraction)
    seen.clear()
    evaluate_policies(frame.filter(pl.col("split") == "test"), ["recorder"], CFG)
    assert seen == [None, None]


def test_one_finite_row_per_key(results) -> None:
    assert results.height == 2 * 1 * 3 * 2 * 2  # sources x loads x policies x test sequences x seeds
    assert results.select(RESULT_KEY).unique().height == results.height
    metrics = [c for c in results.columns if c not in RESULT_KEY]
    for name in (
        "avg_util_cpu_frac",
        "avg_frag_mem_frac",
        "avg_overshoot_pct",
        "machines_used",
        "total_penalty",
    ):
        assert name in metrics
    assert np.isfinite(results.select(metrics).to_numpy()).all()
    assert (results["n_unplaced"] == 0).all()
    assert set(results["sequence_id"].to_list()) == {0, 1}


def test_summary_interval_is_t_based() -> None:
    res = pl.DataFrame(
        {
            "source": ["s"] * 3,
            "load_pct": [50] * 3,
            "policy": ["p"] * 3,
            "sequence_id": [0, 1, 2],
            "seed": [0, 0, 0],
            "machines_used": [1.0, 2.0, 3.0],
        }
    )
    row = summarise(res).row(0, named=True)
    # mean 2, std 1, t(0.975, 2) = 4.302653 -> half width 4.302653 / sqrt(3)
    assert row["n"] == 3 and row["mean"] == pytest.approx(2.0)
    assert row["ci_high"] - 2.0 == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
    assert row["ci_low"] == pytest.approx(4.0 - row["ci_high"])


def test_summary_and_plot(results) -> None:
    summary = summarise(results)
    assert summary.select("source", "load_pct", "policy").unique().height == 2 * 3
    assert (summary["ci_low"] <= summary["mean"]).all() and (summary["mean"] <= summary["ci_high"]).all()
    png = plot_results(summary)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_no_test_sequences_is_an_error() -> None:
    with pytest.raises(ValueError, match="no job sequences"):
        evaluate_policies(_tiny_frame().filter(pl.col("split") == "train"), ["best_fit"], CFG)
