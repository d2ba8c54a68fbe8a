"""benchmarks/bench_placer.py's training budget: a budget and an iteration count apply together."""

import math
from pathlib import Path

import pytest


def test_the_budget_applies_with_an_iteration_count_and_bad_budgets_are_refused(
    benchmark_module, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(
        str(Path(__file__).resolve().parents[2])
    )  # the script imports `benchmarks.` modules, as run
    budget = benchmark_module("bench_placer").training_budget
    assert budget(None, None) == 150.0  # neither: the default budget
    assert budget(None, 40) >= 1e9  # an iteration count alone: no budget, replicates as before
    assert budget(85.0, 40) == 85.0 and budget(85.0, None) == 85.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="--budget must be a finite number of seconds > 0"):
            budget(bad, 40)
