"""Evaluation runner: one finite row per (source, load, policy, sequence, seed); summary intervals; the plot."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import jobs_to_frame
from pipelines.synthetic import DEEPPLACE_SOURCE, DEEPRM_SOURCE, DeepRMConfig
from sim.config import SimConfig
from sim.evaluate import (
    DESCRIPTOR_COLUMNS,
    EVAL_CHECK_DOCS,
    RESULT_KEY,
    EvalSettings,
    eval_check_values,
    eval_partition_keys,
    evaluate_policies,
    learn_group_profiles,
    parse_eval_partition,
    sequences_at_load,
    source_clusters,
    split_diversity,
    summarise,
)
from sim.jobs import JobBatch
from sim.policies import POLICIES, BestFit, is_learned, make_policy
from sim.profiles import EcProfiles, learn_profiles
from sim.tuning import TUNING_PRESETS

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


@dataclass(frozen=True)
class _NextLabel:
    """A labeller that serves every job the label after its clustering one, at every age (`label_table`)."""

    def labels(self, cfg: SimConfig, state) -> np.ndarray:
        return (state.jobs.ec_label + 1) % cfg.n_labels

    def label_table(self, cfg: SimConfig, jobs: JobBatch) -> np.ndarray:
        return np.repeat(((jobs.ec_label + 1) % cfg.n_labels)[:, :, None], jobs.max_duration + 1, axis=2)


def test_profiles_are_fitted_on_the_labels_the_labeller_serves() -> None:
    frame = _tiny_frame()
    plain = learn_group_profiles(frame, "a", 50, CFG)
    served = learn_group_profiles(frame, "a", 50, CFG, labeller=_NextLabel())
    for label in np.flatnonzero(plain.n_jobs):
        nxt = (label + 1) % CFG.n_labels
        assert served.fraction[nxt] == pytest.approx(plain.fraction[label])
        assert served.n_jobs[nxt] == plain.n_jobs[label]


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


def test_a_factory_builds_only_learned_policies(monkeypatch) -> None:
    """With `make` given (as eval__results does), a profile-taking heuristic still gets its group's profiles and
    the factory is asked only for learned policies."""
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
    asked: list[str] = []

    def make(name: str, source: str, load: int, seed: int):
        asked.append(name)
        return None if is_learned(name) else make_policy(name)  # no checkpoint for the learned one

    frame = _tiny_frame()
    res = evaluate_policies(frame, ["recorder", "tvw_rl"], CFG, make=make)
    assert set(asked) == {"tvw_rl"}
    assert set(res["policy"]) == {"recorder"}
    assert len(seen) == 2 and all(got is not None for got in seen)
    for source, got in zip(("a", "b"), seen, strict=True):
        assert np.array_equal(got.fraction, learn_group_profiles(frame, source, 50, CFG).fraction)


def test_progress_counts_every_batch() -> None:
    lines: list[str] = []
    evaluate_policies(_tiny_frame(), ["best_fit", "noop"], CFG, seeds=(0, 1, 2), log=lines.append)
    assert lines[0].startswith("evaluate: 1/12 batches") and lines[-1].startswith("evaluate: 12/12 batches")


def test_one_finite_row_per_key(results) -> None:
    assert results.height == 2 * 1 * 3 * 2 * 2  # sources x loads x policies x test sequences x seeds
    assert results.select(RESULT_KEY).unique().height == results.height
    metrics = [c for c in results.columns if c not in RESULT_KEY and c not in DESCRIPTOR_COLUMNS]
    for name in (
        "avg_util_cpu_frac",
        "avg_frag_mem_frac",
        "avg_overshoot_pct",
        "machines_used",
        "episode_return",
        "cost_unplaced",
        "is_truncated",
    ):
        assert name in metrics
    assert np.isfinite(results.select(metrics).to_numpy()).all()
    assert (results["n_unplaced"] == 0).all()
    assert set(results["sequence_id"].to_list()) == {0, 1}
    # every row says what its policy is: no oracle among these heuristics, none learned, M of the cluster
    assert not results["is_oracle"].any() and not results["is_learned"].any()
    assert set(results["policy_kind"].to_list()) == {"heuristic"}
    assert set(results["n_machines"].to_list()) == {CFG.n_machines}


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


def test_summary_and_its_directions(results) -> None:
    summary = summarise(results)
    assert summary.select("source", "load_pct", "policy").unique().height == 2 * 3
    assert (summary["ci_low"] <= summary["mean"]).all() and (summary["mean"] <= summary["ci_high"]).all()
    better = dict(summary.select("metric", "better").unique().iter_rows())
    assert better["episode_return"] == "higher" and better["avg_util_cpu_frac"] == "higher"
    assert better["machines_used"] == "lower" and better["cost_wait"] == "lower"
    assert better["n_steps"] == "" and better["machines_lower_bound"] == ""


def test_no_test_sequences_is_an_error() -> None:
    with pytest.raises(ValueError, match="no job sequences"):
        evaluate_policies(_tiny_frame().filter(pl.col("split") == "train"), ["best_fit"], CFG)


def test_seeds_are_averaged_within_a_sequence_before_the_interval() -> None:
    # a deterministic policy: identical rows for both seeds must not count as extra samples
    res = pl.DataFrame(
        {
            "source": ["s"] * 6,
            "load_pct": [50] * 6,
            "policy": ["p"] * 6,
            "sequence_id": [0, 0, 1, 1, 2, 2],
            "seed": [0, 1] * 3,
            "machines_used": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0],
        }
    )
    row = summarise(res).row(0, named=True)
    assert row["n"] == 3 and row["n_seeds"] == 2
    assert row["ci_high"] - 2.0 == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)


def test_split_diversity_flags_a_split_of_one_workload() -> None:
    frame = _tiny_frame()
    one = frame.filter(pl.col("source") == "a").with_columns(workload_id=pl.lit("w"))
    div = split_diversity(pl.concat([one, frame.filter(pl.col("source") == "b")]), min_workloads=2)
    flagged = div.filter(pl.col("is_too_few_workloads"))
    assert flagged["source"].unique().to_list() == ["a"] and flagged["n_distinct_workloads"].to_list() == [
        1,
        1,
    ]


@pytest.mark.slow
def test_noop_has_the_worst_return_on_the_synthetic_workloads() -> None:
    from pipelines.synthetic import (
        DeepPlaceConfig,
        DeepRMConfig,
        build_deepplace_sequences,
        build_deeprm_sequences,
    )

    dp, _ = build_deepplace_sequences(DeepPlaceConfig(n_train_sequences=1, n_test_sequences=3))
    drm = build_deeprm_sequences(DeepRMConfig(n_train_sequences=1, n_test_sequences=3))
    drm = drm[0] if isinstance(drm, tuple) else drm
    # the heuristics: an untrained learned policy is no scheduler (an untrained Dejavu holds every job)
    heuristics = sorted(p for p in POLICIES if not is_learned(p))
    # the fitted rules (hybrid, peak predictors, forecast rules without a forecaster factory) on the quick grid
    from sim.tuning import TUNING_PRESETS

    frame = pl.concat([dp, drm], how="diagonal_relaxed")
    res = evaluate_policies(frame, heuristics, SimConfig(), tuning=TUNING_PRESETS["quick"])
    mean = res.group_by("source", "load_pct", "policy").agg(pl.col("episode_return").mean())
    worst = mean.sort("episode_return").group_by("source", "load_pct").first()
    assert worst.height == 6 and (worst["policy"] == "noop").all()
    others = res.filter(pl.col("policy") != "noop")
    assert (others["is_truncated"] == 0).all() and (others["avg_util_cpu_frac"] <= 1.0).all()


def test_eval_settings_name_an_unknown_tuning_preset_and_give_the_preset_grid() -> None:
    with pytest.raises(ValueError, match="unknown tuning_preset 'fast'"):
        EvalSettings(tuning_preset="fast")
    tuning = EvalSettings(tuning_preset="quick", validation_share=0.5, seeds=(7, 1)).tuning()
    assert tuning == dataclasses.replace(TUNING_PRESETS["quick"], validation_share=0.5, seed=7)


def test_eval_partitions_are_the_papers_loads() -> None:
    assert eval_partition_keys([80, 30]) == ["load80", "load30"]
    assert parse_eval_partition("load50") == 50
    with pytest.raises(ValueError, match=r"load\(s\) \[40\] have no evaluation partition"):
        eval_partition_keys([30, 40])
    with pytest.raises(ValueError, match="unknown evaluation partition 'load40'"):
        parse_eval_partition("load40")


def test_each_synthetic_workload_runs_on_its_own_cluster() -> None:
    jobs = pl.DataFrame({"source": ["bitbrains", DEEPRM_SOURCE, DEEPPLACE_SOURCE]})
    assert source_clusters(jobs, 10, 300) == {
        "bitbrains": (10, 300),
        DEEPRM_SOURCE: (DeepRMConfig().n_machines, DeepRMConfig().arrival_steps),
        DEEPPLACE_SOURCE: (10, 300),
    }


def test_a_load_without_test_sequences_is_named() -> None:
    frame = _tiny_frame()
    assert sequences_at_load(frame, 50, "here").height == frame.height
    with pytest.raises(ValueError, match=r"here: sim__job_sequences has no test sequences at 80 % .*\[50\]"):
        sequences_at_load(frame, 80, "here")


def test_eval_check_values_fail_on_the_defect_each_exists_for() -> None:
    rows = [
        {"source": "s", "load_pct": 30, "policy": p, "sequence_id": q, "seed": 0, "avg_util_cpu_frac": u + 0.01 * q,
         "episode_return": r + q, "is_truncated": t}
        for p, r, u, t in (("tetris", -100.0, 0.5, 0.0), ("noop", -1e6, 0.0, 1.0))
        for q in (0, 1)
    ]  # fmt: skip
    sane = pl.DataFrame(rows)
    values = eval_check_values(sane, 4)
    assert set(values) == set(EVAL_CHECK_DOCS) and all(passed for passed, _ in values.values())
    worse = sane.with_columns(episode_return=pl.when(pl.col("policy") == "tetris").then(-1e7).otherwise(-1.0))
    assert eval_check_values(worse, 4)["noop_has_the_worst_return"] == (
        False,
        {"groups_where_another_policy_is_worst": [{"source": "s", "load_pct": 30, "policy": "tetris",
         "episode_return": -1e7}], "noop_evaluated": True},
    )  # fmt: skip
    assert eval_check_values(sane, 5)["one_row_per_episode"][1]["n_expected"] == 5
    assert not eval_check_values(sane, 5)["one_row_per_episode"][0]


def test_in_sample_validation_is_logged():
    """Builder and tuner agree on the validation share: validation is workload-disjoint, nothing logged; a tuning
    share that takes more sequences than the builder held out puts fit workloads into validation: logged."""
    from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences

    dp = dataclasses.replace(
        DeepPlaceConfig(), loads_pct=(50,), n_train_sequences=5, n_test_sequences=1, arrival_steps=30
    )
    frame, _ = build_deepplace_sequences(dp)
    cfg = SimConfig(n_machines=10, max_steps=200, oversize="clip", n_labels=8)
    for share, warned in ((0.3, False), (0.5, True)):
        lines: list[str] = []
        tuning = dataclasses.replace(TUNING_PRESETS["quick"], validation_share=share, min_observed=(0,))
        evaluate_policies(frame, ["hybrid_observed"], cfg, tuning=tuning, log=lines.append)
        assert any("validation is in sample" in line for line in lines) is warned


def test_served_labels_reach_every_policy_of_the_sources_that_have_a_labeller(monkeypatch) -> None:
    """`serve_labels(source)` relabels what each policy sees on that source (a classifier's labels instead of
    the clustering labels the sequences carry); a source without a labeller keeps its own labels."""
    seen: dict[str, set[int]] = {"a": set(), "b": set()}

    @dataclass(frozen=True)
    class Recorder:
        name: str = "recorder"

        def act(self, cfg, state, rng):
            from sim.core import observed_labels

            source = state.jobs.sequence_keys[0][0]
            seen[source] |= set(np.unique(observed_labels(state)[:, : state.jobs.max_jobs]).tolist())
            return BestFit().act(cfg, state, rng)

    class Sevens:
        def labels(self, cfg, state):
            return np.full_like(state.jobs.ec_label, 7)

    monkeypatch.setitem(POLICIES, "recorder", Recorder)
    frame = _tiny_frame()
    plain = evaluate_policies(frame, ["recorder", "best_fit"], CFG)
    served = evaluate_policies(
        frame, ["recorder", "best_fit"], CFG, serve_labels=lambda s: Sevens() if s == "a" else None
    )
    assert seen["a"] == {1, 2, 7} and seen["b"] == {1, 2}  # source a saw 7s when served, b never did
    # labels are not physics: a rule that ignores them decides the same
    assert plain.drop("policy").equals(served.drop("policy"))
