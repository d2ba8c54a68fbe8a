"""The argument parsing of `benchmarks/rule_generalisation.py`: seed ranges and TuningConfig overrides."""

from __future__ import annotations

import pytest


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
