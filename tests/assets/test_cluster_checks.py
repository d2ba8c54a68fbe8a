"""Asset checks of the simulator and evaluation tables fail on the cases they exist for."""

import polars as pl
from dagster import AssetCheckSeverity

from assets.checks import results, specs
from pipelines.job_sequences import sequence_check_values
from sim.evaluate import eval_check_values, split_diversity


def eval_checks(table: pl.DataFrame, n_expected: int):
    return results(eval_check_values(table, n_expected), "eval__baselines")


def sequence_checks(jobs: pl.DataFrame, diversity: pl.DataFrame):
    return results(sequence_check_values(jobs, diversity), "sim__job_sequences")


def _results(noop_return: float, util: float = 0.5, truncated_policy: str = "noop") -> pl.DataFrame:
    rows = []
    for policy, ret in (("best_fit", -100.0), ("tetris", -120.0), ("noop", noop_return)):
        for seq in (0, 1):
            rows.append(
                {
                    "source": "s",
                    "load_pct": 30,
                    "policy": policy,
                    "sequence_id": seq,
                    "seed": 0,
                    "avg_util_cpu_frac": util if policy == "best_fit" else 0.4 + 0.01 * seq,
                    "episode_return": ret + seq,
                    "is_truncated": 1.0 if policy == truncated_policy else 0.0,
                }
            )
    return pl.DataFrame(rows)


def _by_name(results):
    return {r.check_name: r.passed for r in results}


def test_eval_checks_pass_on_a_sane_table_and_fail_on_each_defect():
    assert all(_by_name(eval_checks(_results(-1e6), 6)).values())
    assert not _by_name(eval_checks(_results(-1.0), 6))["noop_has_the_worst_return"]
    assert not _by_name(eval_checks(_results(-1e6, util=1.5), 6))["utilisation_within_capacity"]
    assert not _by_name(eval_checks(_results(-1e6, truncated_policy="tetris"), 6))[
        "only_noop_hits_the_safety_cap"
    ]
    assert not _by_name(eval_checks(_results(-1e6), 7))["one_row_per_episode"]


def test_sequence_checks_flag_thin_splits_and_shared_workloads():
    jobs = pl.DataFrame(
        {
            "source": ["s"] * 4,
            "load_pct": [30] * 4,
            "split": ["train", "train", "test", "test"],
            "sequence_id": [0, 0, 0, 0],
            "workload_id": ["a", "b", "c", "a"],
        }
    )
    checks = _by_name(sequence_checks(jobs, split_diversity(jobs, min_workloads=2)))
    assert checks == {
        "splits_have_enough_workloads": True,
        "offered_load_matches_label": False,  # no load measured at all is a failure, not an ok
        "train_and_test_share_no_workload": False,
    }
    checks = _by_name(sequence_checks(jobs, split_diversity(jobs, min_workloads=3)))
    assert not checks["splits_have_enough_workloads"]


def test_results_wrap_values_with_their_severity_and_json_metadata():
    (result,) = results({"c": (False, {"rows": [1, 2], "n": 3})}, "eval__summary", AssetCheckSeverity.WARN)
    assert (result.check_name, result.passed, result.severity) == ("c", False, AssetCheckSeverity.WARN)
    assert result.asset_key.to_user_string() == "eval__summary"
    assert result.metadata["rows"].value == [1, 2] and result.metadata["n"].value == 3


def test_specs_default_to_the_generic_table_check_and_mark_blocking_ones():
    (spec,) = specs("eval__deeprm_fig4")
    assert spec.name == "slowdown_at_least_one" and not spec.blocking
    blocking = {s.name: s.blocking for s in specs("a", {"x": "", "y": ""}, blocking=("x",))}
    assert blocking == {"x": True, "y": False}
