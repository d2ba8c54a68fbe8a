"""`benchmarks/rule_generalisation.py`: seed ranges, TuningConfig overrides, and how much a split's jobs rise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.jobs import JobBatch


def test_seed_ranges_and_lists_expand_in_order(benchmark_module) -> None:
    seed_list = benchmark_module("rule_generalisation").seed_list
    assert seed_list("3-5,9") == [3, 4, 5, 9]
    assert seed_list("7") == [7]


def test_tuning_overrides_are_literals_of_known_fields(benchmark_module) -> None:
    tuning_overrides = benchmark_module("rule_generalisation").tuning_overrides
    assert tuning_overrides(["overshoot_budget_pct=0.5", "peak_levels=(0.9, 0.99)"]) == {
        "overshoot_budget_pct": 0.5,
        "peak_levels": (0.9, 0.99),
    }
    with pytest.raises(SystemExit, match="no field 'nope'"):
        tuning_overrides(["nope=1"])
    with pytest.raises(SystemExit, match="not a Python literal"):
        tuning_overrides(["overshoot_budget_pct=half"])


def test_usage_rises_counts_real_live_steps_only(benchmark_module) -> None:
    """Two real jobs and a padding slot: one rises by 2 units on its CPU, the other is flat while alive and
    'rises' only after its end and in its padding, which must not count."""
    usage_rises = benchmark_module("rule_generalisation").usage_rises
    usage = np.zeros((1, 3, 4, 2), dtype=np.int16)
    usage[0, 0, :, 0] = [1, 3, 2, 0]  # rises by 2 on CPU; memory flat at 0
    usage[0, 1, :, :] = 2
    usage[0, 1, 3, :] = 7  # after its end (duration 3)
    usage[0, 2, :, :] = 9  # the padding slot (n_jobs = 2)
    jobs = JobBatch(
        arrival_step=np.zeros((1, 3), dtype=np.int64),
        duration=np.array([[4, 3, 4]]),
        usage=usage,
        request=np.full((1, 3, 2), 4, dtype=np.int16),
        ec_label=np.zeros((1, 3), dtype=np.int64),
        n_jobs=np.array([2]),
    )
    share, mean_rise = usage_rises(jobs)
    assert share == 0.25  # 1 of (2 jobs x 2 resources)
    assert mean_rise == 0.5  # (2 + 0 + 0 + 0) / 4
    with pytest.raises(ValueError, match="no job"):
        usage_rises(JobBatch(**{**vars(jobs), "n_jobs": np.array([0])}))


def test_the_stratified_pool_weights_runs_equally_and_pairs_within_them(benchmark_module, tmp_path) -> None:
    """Two runs whose gains differ: the pool is the mean of the run means (not of the pooled pairs), and a run
    holding only one side of the pair, or a row that is not a returns row, is a clear error naming the file."""
    module = benchmark_module("rule_generalisation")
    wide, narrow = np.array([0.0, 2.0, 4.0, 6.0]), np.array([1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0, 1.0])
    mean, lo, hi = module.stratified_pool([wide, narrow])
    assert mean == pytest.approx((3.0 + 1.0) / 2)  # the pooled pairs' mean would be 1.667
    se = np.sqrt(wide.var(ddof=1) / 4 + narrow.var(ddof=1) / 8) / 2
    assert (lo, hi) == pytest.approx((mean - 1.96 * se, mean + 1.96 * se))
    with pytest.raises(ValueError, match="at least two pairs"):
        module.stratified_pool([np.array([1.0])])
    path = tmp_path / "returns.jsonl"
    rows = [("a", 1, [1e6, 2e6]), ("b", 1, [0.0, 0.0]), ("a", 2, [1e6, 1e6])]
    path.write_text(
        "".join(
            json.dumps(
                {"source": "s", "load": 50, "seed": s, "rule": r, "returns": v, "overshoot_pct": [0, 0]}
            )
            + "\n"
            for r, s, v in rows
        )
    )
    with pytest.raises(SystemExit, match=r"returns.jsonl: \('s', 50, 10, 2\) holds only one"):
        module.pool_returns(str(path), "a - b")
    path.write_text(path.read_text() + "{}\n")
    with pytest.raises(SystemExit, match="line 4: not a returns row"):
        module.pool_returns(str(path), "a - b")
    with pytest.raises(SystemExit, match="expected 'A - B'"):
        module.pool_returns(str(path), "a-b")


def test_pooled_runs_at_another_cluster_size_are_their_own_runs(benchmark_module, tmp_path, capsys) -> None:
    """A returns row with "machines" (a `--machines 50` run) is a run of its own beside the same seed at M = 10
    (a row without it): the two never overwrite each other, and each (source, load, M) is pooled apart."""
    module = benchmark_module("rule_generalisation")
    path = tmp_path / "returns.jsonl"
    rows = [
        {"rule": "a", "returns": [1e6, 3e6]},
        {"rule": "b", "returns": [0.0, 0.0]},
        {"rule": "a", "returns": [-1e6, -3e6], "machines": 50},
        {"rule": "b", "returns": [0.0, 0.0], "machines": 50},
    ]
    path.write_text(
        "".join(
            json.dumps({"source": "s", "load": 30, "seed": 5, "overshoot_pct": [0, 0]} | r) + "\n"
            for r in rows
        )
    )
    module.pool_returns(str(path), "a - b")
    out = capsys.readouterr().out
    assert "s 30 % M = 10 seed 5: a - b +2.000" in out
    assert "s 30 % M = 50 seed 5: a - b -2.000" in out
    assert "all: a - b +0.000" in out and "over 2 runs" in out
