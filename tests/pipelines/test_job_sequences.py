"""Job sequences: quantisation, time scaling, load calibration, splits and mix."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from pipelines.job_sequences import (
    JOB_SEQUENCES,
    OFFERED_LOAD,
    SEQUENCE_CHECK_DOCS,
    SequenceConfig,
    _build_pool,
    _step_frame,
    arrival_rate_per_step,
    build_job_sequences,
    draw_job_stream,
    expected_job_work,
    expected_window_work,
    jobs_to_frame,
    mix_pattern,
    n_validation_sequences,
    offered_load_check,
    offered_load_table,
    poisson_arrivals,
    quantise_usage,
    realised_load,
    sequence_check_values,
    split_diversity,
    split_sizes,
    stratified_holdout,
    time_scale,
)
from pipelines.sequence_run import SequenceRunSettings, build_sequence_run


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


def test_expected_window_work_hand_case() -> None:
    # d = 1: windows 1, 2, 3 (mean 2); d = 2: windows 3, 5 (mean 4); d uniform in {1, 2}
    assert expected_window_work([1, 2, 3], (1, 2)) == pytest.approx(3.0)
    # durations longer than the series are clipped to it: the whole series
    assert expected_window_work([1, 2, 3], (5, 9)) == pytest.approx(6.0)


def test_arrival_rate_is_load_times_capacity_over_work() -> None:
    # M = 2, C = 4: 8 units per step; 50 % of it = 4 unit-steps per step
    assert arrival_rate_per_step(50, (20.0, 40.0), 2, 4) == pytest.approx(4 / 40)
    assert arrival_rate_per_step(50, (20.0, 40.0), 2, 4, "mean") == pytest.approx(4 / 30)
    with pytest.raises(ValueError, match="load_resource"):
        arrival_rate_per_step(50, (20.0, 40.0), 2, 4, "peak")


def test_poisson_arrivals_stay_in_the_window_with_the_rate() -> None:
    arr = poisson_arrivals(2.5, 4000, np.random.default_rng(0))
    assert np.all(np.diff(arr) >= 0) and arr.min() >= 0 and arr.max() < 4000
    assert len(arr) / 4000 == pytest.approx(2.5, rel=0.03)
    assert np.bincount(arr).max() > 1  # several requests may arrive in one step


def test_offered_load_table_hand_case() -> None:
    rows = [
        # sequence 0: two jobs; cpu work 2+2+4 = 8, mem work 0+0+4 = 4; window 2 on M=1, C=4 -> 8 units x 2 steps
        dict(sequence_id=0, job_index=0, arrival_step=0, workload_id="a", cpu=[2, 2], mem=[0, 0]),
        dict(sequence_id=0, job_index=1, arrival_step=1, workload_id="b", cpu=[4], mem=[4]),
        # sequence 1: one job arriving at the window's end
        dict(sequence_id=1, job_index=0, arrival_step=2, workload_id="a", cpu=[1], mem=[3]),
    ]
    jobs = jobs_to_frame(
        [
            {
                "source": "s",
                "load_pct": 50,
                "split": "test",
                "ec_label": 0,
                "duration_steps": len(r["cpu"]),
                "cpu_units": r.pop("cpu"),
                "mem_units": r.pop("mem"),
                "cpu_request_units": 0,
                "mem_request_units": 0,
                "is_long_running": False,
                **r,
            }
            for r in rows
        ]
    )
    t = offered_load_table(jobs, 1, 4, {"s": 2})
    assert t.schema == pl.Schema(OFFERED_LOAD)
    r0, r1 = t.rows(named=True)
    assert (r0["n_jobs"], r0["n_distinct_workloads"], r0["n_jobs_after_window"]) == (2, 2, 0)
    assert (r0["work_cpu_unit_steps"], r0["work_mem_unit_steps"]) == (8, 4)
    assert r0["offered_load_cpu"] == pytest.approx(8 / 8) and r0["offered_load_mem"] == pytest.approx(4 / 8)
    assert r0["offered_load_mean"] == pytest.approx(0.75)
    # cpu has the larger total work over the source's sequences (9 vs 7): the dominant resource
    assert r0["dominant_resource"] == "cpu" and r0["offered_load_dominant"] == pytest.approx(1.0)
    # step 1: job a (2 cpu) and job b (4 cpu) both run: 6 of 4 units
    assert r0["peak_demand_cpu"] == pytest.approx(1.5) and r0["peak_demand_dominant"] == pytest.approx(1.5)
    assert (r1["n_jobs_after_window"], r1["offered_load_cpu"], r1["peak_demand_mem"]) == (1, 1 / 8, 0.75)
    chk = offered_load_check(t)
    assert chk.row(0, named=True)["mean_offered_load"] == pytest.approx((1.0 + 1 / 8) / 2)
    assert not chk.row(0, named=True)["is_within_tolerance"]
    with pytest.raises(ValueError, match="no window_steps given for source 's'"):
        offered_load_table(jobs, 1, 4, {"other": 2})


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


CFG = SequenceConfig(n_train_sequences=12, n_test_sequences=6, loads_pct=(30, 80))


@pytest.fixture(scope="module")
def built() -> tuple[pl.DataFrame, dict]:
    usage, long_running = _pool()
    assignments = pl.DataFrame({"workload_id": ["w0", "w1"], "ec_label": [3, 5]})
    return build_job_sequences(usage, long_running, assignments, CFG)


def test_schema_counts_and_reproducibility(built) -> None:
    df, stats = built
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    n_seq = df.select("load_pct", "split", "sequence_id").unique().height
    assert n_seq == 2 * (12 + 6)
    assert stats["n_jobs"] == df.height
    usage, long_running = _pool()
    lines: list[str] = []
    again, _ = build_job_sequences(
        usage,
        long_running,
        pl.DataFrame({"workload_id": ["w0", "w1"], "ec_label": [3, 5]}),
        CFG,
        log=lines.append,
    )
    assert again.equals(df)
    # progress per source: the first and the last of its 2 x (12 + 6) sequences at least
    assert lines[0].startswith("s job sequences: 1/36 sequences")
    assert lines[-1].startswith("s job sequences: 36/36 sequences")


def test_offered_load_matches_the_label(built) -> None:
    """Offered load = rate x mean job work / capacity, measured from the jobs alone, is the label
    within 10 % on average per load (the dominant resource; the other resource gets less)."""
    df, stats = built
    table = offered_load_table(df, CFG.n_machines, CFG.capacity_units, CFG.arrival_steps)
    chk = offered_load_check(table, tolerance=0.1)
    assert chk["is_within_tolerance"].all(), chk
    assert (table["offered_load_mean"] <= table["offered_load_dominant"] + 1e-12).all()
    # each split at the label (rate_split="own"), one arrival rate per (source, load, split), proportional to the load
    per_split = offered_load_check(table, tolerance=0.1, by_split=True)
    assert per_split["is_within_tolerance"].all(), per_split
    rates = stats["arrival_rate_per_step"]["s"]
    assert rates[80]["test"] == pytest.approx(rates[30]["test"] * 80 / 30)
    # more jobs at a higher load, from the rate alone
    n_jobs = table.group_by("load_pct").agg(pl.col("n_jobs").mean()).sort("load_pct")["n_jobs"].to_list()
    assert n_jobs[1] / n_jobs[0] == pytest.approx(80 / 30, rel=0.15)


def test_expected_job_work_matches_the_draw() -> None:
    usage, long_running = _pool(n_workloads=8, n_bins=900)
    cfg = SequenceConfig(usage_scale=(40.0, 40.0))
    steps = _step_frame(usage, long_running, cfg)
    pool = _build_pool(
        steps, pl.DataFrame(schema={"workload_id": pl.String, "ec_label": pl.Int32}), (40.0, 40.0)
    )
    jobs = draw_job_stream(pool, 20000, cfg, np.random.default_rng(5))
    drawn = np.mean([(j["cpu_units"].sum(), j["mem_units"].sum()) for j in jobs], axis=0)
    assert expected_job_work(pool, cfg) == pytest.approx(drawn, rel=0.02)


def test_realised_load_is_the_window_mean_not_the_label(built) -> None:
    """The window-mean demand (ramp-up from empty included) stays below the offered load."""
    df, _ = built
    g = df.filter((pl.col("load_pct") == 80) & (pl.col("split") == "train") & (pl.col("sequence_id") == 0))
    cpu = [np.array(x) for x in g["cpu_units"].to_list()]
    mem = [np.array(x) for x in g["mem_units"].to_list()]
    window_mean = realised_load(g["arrival_step"].to_numpy(), cpu, mem, 10, 8, CFG.arrival_steps)
    offered = offered_load_table(g, 10, 8, CFG.arrival_steps)["offered_load_mean"][0]
    assert window_mean < offered


def test_train_and_test_workloads_are_disjoint(built) -> None:
    df, stats = built
    train = set(df.filter(pl.col("split") == "train")["workload_id"].to_list())
    test = set(df.filter(pl.col("split") == "test")["workload_id"].to_list())
    assert train and test and not train & test
    assert stats["n_workloads_train"] + stats["n_workloads_test"] == 24


def test_validation_sequences_come_from_held_out_training_workloads(built) -> None:
    """The last ceil(0.3 x 12) = 4 training sequences of each load draw only held-out training workloads (CPU- and
    memory-dominant alike), which no other training sequence uses; the training split still offers its label."""
    df, stats = built
    n_val = n_validation_sequences(CFG.n_train_sequences, CFG.validation_share)
    assert n_val == 4
    train = df.filter(pl.col("split") == "train")
    is_val = pl.col("sequence_id") >= CFG.n_train_sequences - n_val
    val_ids = set(train.filter(is_val)["workload_id"].to_list())
    fit_ids = set(train.filter(~is_val)["workload_id"].to_list())
    assert val_ids and fit_ids and not val_ids & fit_ids
    assert stats["validation_workloads"]["s"] == 5 and len(val_ids) <= 5
    heavy = {f"w{i}" for i in range(1, 24, 2)}  # _pool: odd workloads are cpu-heavy
    assert val_ids & heavy and val_ids - heavy
    assert stats["n_workloads_train"] + stats["n_workloads_test"] == 24
    rates = stats["arrival_rate_per_step"]["s"][80]
    assert set(rates) == {"train", "validation", "test"}
    table = offered_load_table(df, CFG.n_machines, CFG.capacity_units, CFG.arrival_steps)
    assert offered_load_check(table, tolerance=0.1, by_split=True)["is_within_tolerance"].all()


def test_days_of_one_job_stay_in_one_part() -> None:
    """Job-day workloads ('<job>_d<k>') are split by job: no job has days in two of test, fit and validation; a
    source of singleton groups is split as before (the ids renamed, the same draws)."""
    usage, long_running = _pool(n_workloads=36, n_bins=600)
    rename = {f"w{w}": f"j{w // 3}_d{w % 3}" for w in range(36)}  # 12 jobs of 3 days each
    days = [f.with_columns(pl.col("workload_id").replace(rename)) for f in (usage, long_running)]
    cfg = replace(CFG, n_train_sequences=10, n_test_sequences=4, loads_pct=(50,), min_workloads_per_split=2)
    df, stats = build_job_sequences(*days, None, cfg)
    n_val = n_validation_sequences(cfg.n_train_sequences, cfg.validation_share)
    part = pl.when(pl.col("split") == "test").then(pl.lit("test"))
    part = part.when(pl.col("sequence_id") >= cfg.n_train_sequences - n_val).then(pl.lit("validation"))
    parts = df.select(
        part.otherwise(pl.lit("fit")).alias("part"), job=pl.col("workload_id").str.extract(r"^(j\d+)")
    )
    assert parts.group_by("job").agg(pl.col("part").n_unique())["part"].max() == 1
    assert parts["part"].n_unique() == 3 and stats["validation_workloads"]["s"] % 3 == 0
    assert stats["n_workloads_test"] % 3 == 0  # whole jobs: round(0.3 x 12) = 4 jobs of 3 days
    singles, single_stats = build_job_sequences(usage, long_running, None, cfg)
    assert single_stats["n_workloads_test"] == 11 and singles.height > 0


def test_validation_counts_and_holdout_edges() -> None:
    assert [n_validation_sequences(n, 0.3) for n in (0, 1, 2, 10, 100)] == [0, 0, 1, 3, 30]
    assert n_validation_sequences(10, 0.0) == 0
    mask = stratified_holdout(np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1]), 0.4)
    assert mask.tolist() == [False, False, False, False, False, False, True, True, True, True]
    assert not stratified_holdout(np.zeros(6), 0.3, min_each=5).any()  # too few to give both parts 5
    assert not stratified_holdout(np.zeros(10), 0.0).any()
    # one training sequence has no validation sequence: no workload is held out of training
    usage, long_running = _pool(n_workloads=24, n_bins=900)
    one = SequenceConfig(n_train_sequences=1, n_test_sequences=1, loads_pct=(50,))
    df, stats = build_job_sequences(usage, long_running, None, one)
    with pytest.raises(ValueError, match="validation_share must be in"):
        build_job_sequences(usage, long_running, None, SequenceConfig(validation_share=1.2))
    assert stats["validation_workloads"]["s"] == 0 and set(stats["arrival_rate_per_step"]["s"][50]) == {
        "train",
        "test",
    }


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
    # arrivals sorted and inside the window [0, arrival_steps)
    for _, g in df.group_by("load_pct", "split", "sequence_id"):
        arr = g.sort("job_index")["arrival_step"]
        assert arr.min() >= 0 and arr.is_sorted() and arr.max() < CFG.arrival_steps


def test_oversized_usage_is_clipped_and_counted() -> None:
    usage, long_running = _pool(n_workloads=4, n_bins=600)
    usage = usage.with_columns(
        pl.when(pl.col("workload_id") == "w1").then(1.7).otherwise(pl.col("cpu_frac")).alias("cpu_frac")
    )
    cfg = SequenceConfig(
        n_train_sequences=2,
        n_test_sequences=2,
        loads_pct=(50,),
        usage_scale=(1.0, 1.0),
        oversized_rule="keep",
    )
    df, stats = build_job_sequences(usage, long_running, None, cfg)
    assert stats["oversized_workloads"] == {"s": ["w1"]} and stats["n_workloads_set_aside"] == 0
    assert stats["n_workloads_clipped"] == 1
    assert df["cpu_units"].list.max().max() <= 8
    if "w1" in df["workload_id"].to_list():
        assert stats["n_jobs_clipped"] > 0


def test_too_few_workloads_is_a_clear_error() -> None:
    usage, long_running = _pool(n_workloads=1, n_bins=600)
    with pytest.raises(ValueError, match="at least 2 long-running workloads"):
        build_job_sequences(usage, long_running, None, CFG)


def test_small_sources_keep_two_workloads_per_split() -> None:
    cfg = SequenceConfig()  # at least 5 per split where the source has 10
    assert split_sizes(4, cfg) == (2, 2)  # round(4 * 0.3) = 1 test workload would replay one workload
    assert split_sizes(3, cfg) == (2, 1) and split_sizes(2, cfg) == (1, 1)
    assert split_sizes(12, cfg) == (7, 5) and split_sizes(24, cfg) == (17, 7)
    assert split_sizes(4, SequenceConfig(min_workloads_per_split=1)) == (3, 1)
    with pytest.raises(ValueError, match="at least 2"):
        split_sizes(1, cfg)


def test_distinct_workloads_per_split_are_counted_and_flagged() -> None:
    cfg = SequenceConfig(
        n_train_sequences=2, n_test_sequences=2, loads_pct=(50,), arrival_steps=100, min_workloads_per_split=2
    )
    usage, long_running = _pool(n_workloads=4, n_bins=600)
    _, stats = build_job_sequences(usage, long_running, None, cfg)
    assert stats["n_distinct_workloads"]["s"] == {"test": 2, "train": 2}
    assert stats["splits_with_few_workloads"] == ""
    usage, long_running = _pool(n_workloads=3, n_bins=600)
    _, stats = build_job_sequences(usage, long_running, None, cfg)
    assert stats["n_distinct_workloads_test"] == 1 and stats["splits_with_few_workloads"] == "s/test:1"


def test_train_rate_is_shared_by_both_splits() -> None:
    usage, long_running = _pool(n_workloads=6, n_bins=900)
    cfg = SequenceConfig(n_train_sequences=1, n_test_sequences=1, loads_pct=(50,), rate_split="train")
    _, stats = build_job_sequences(usage, long_running, None, cfg)
    rates = stats["arrival_rate_per_step"]["s"][50]
    assert rates["train"] == rates["test"]
    with pytest.raises(ValueError, match="rate_split"):
        build_job_sequences(usage, long_running, None, SequenceConfig(rate_split="test"))


def _with_oversized_vm(n_workloads: int = 6) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The pool, plus Bitbrains-style VM "big": provisioned with 511.5 GiB on 64 GiB machines (a memory request of
    7.99 machines), using 0.3 of a machine."""
    usage, long_running = _pool(n_workloads=n_workloads, n_bins=600)
    big_usage = usage.filter(pl.col("workload_id") == "w0").with_columns(
        workload_id=pl.lit("big"), cpu_frac=pl.lit(0.3), mem_frac=pl.lit(0.3)
    )
    big = long_running.filter(pl.col("workload_id") == "w0").with_columns(
        workload_id=pl.lit("big"), mem_request_frac=pl.lit(511.5 / 64)
    )
    return pl.concat([usage, big_usage]), pl.concat([long_running, big])


SMALL = SequenceConfig(n_train_sequences=2, n_test_sequences=1, loads_pct=(50,), min_workloads_per_split=2)


def test_a_workload_larger_than_one_machine_is_named_and_set_aside() -> None:
    usage, long_running = _with_oversized_vm()
    df, stats = build_job_sequences(usage, long_running, None, SMALL)
    assert "big" not in df["workload_id"].to_list()
    assert stats["oversized_workloads"] == {"s": ["big"]}
    assert (stats["n_workloads_oversized"], stats["n_workloads_set_aside"]) == (1, 1)
    # rows in = rows out + set aside
    kept = stats["n_workloads_train"] + stats["n_workloads_test"] + stats["n_workloads_without_steps"]
    assert stats["n_workloads_in"] == 7 and kept + stats["n_workloads_set_aside"] == 7
    # without it, the sequences are those of the pool alone
    alone, _ = build_job_sequences(*_pool(n_workloads=6, n_bins=600), None, SMALL)
    assert df.equals(alone)


def test_an_oversized_workload_can_be_capped_to_one_machine_instead() -> None:
    usage, long_running = _with_oversized_vm()
    usage = usage.with_columns(
        cpu_frac=pl.when(pl.col("workload_id") == "big").then(3.0).otherwise(pl.col("cpu_frac"))
    )
    cfg = SequenceConfig(**{**SMALL.__dict__, "oversized_rule": "cap", "request_mode": "trace"})
    df, stats = build_job_sequences(usage, long_running, None, cfg)
    assert stats["oversized_workloads"] == {"s": ["big"]} and stats["n_workloads_set_aside"] == 0
    big = df.filter(pl.col("workload_id") == "big")
    assert big.height > 0 and big["mem_request_frac"].max() == pytest.approx(511.5 / 64)  # the meta as traced
    assert big["cpu_request_units"].max() <= 8 and big["mem_request_units"].max() <= 8
    with pytest.raises(ValueError, match="oversized_rule"):
        build_job_sequences(usage, long_running, None, SequenceConfig(oversized_rule="shrink"))


def test_the_sequence_run_skips_small_sources_and_adds_the_synthetic_workloads() -> None:
    usage, long_running = _with_oversized_vm()
    tiny = long_running.head(1).with_columns(source=pl.lit("tiny"))
    settings = SequenceRunSettings(**{**SMALL.__dict__, "min_workloads": 2, "include_synthetic": True})
    run = build_sequence_run(pl.concat([long_running, tiny]), None, lambda source, lr: usage, settings)
    assert run.per_source["tiny"] == "skipped: 1 long-running workloads"
    assert run.per_source["s"]["n_workloads_set_aside"] == 1 and run.oversized == {"s": ["big"]}
    assert set(run.jobs["source"]) == {"s", "deepplace_synthetic", "deeprm_synthetic"}
    assert run.jobs.schema == pl.Schema(JOB_SEQUENCES) and run.offered_load.schema == pl.Schema(OFFERED_LOAD)
    assert run.usage_scale["source"].to_list() == ["s"]
    assert any(w.startswith("tiny: 1 long-running") for w in run.warnings)
    assert any("larger than one machine" in w and "big" in w for w in run.warnings)
    # the synthetic workloads' loads are measured on their own clusters: DeepRM's single machine
    deeprm = run.offered_load.filter(pl.col("source") == "deeprm_synthetic")
    assert set(deeprm["n_machines"]) == {1}


def test_sequence_check_values_flag_thin_splits_shared_workloads_and_no_load() -> None:
    jobs = pl.DataFrame(
        {
            "source": ["s"] * 4,
            "load_pct": [30] * 4,
            "split": ["train", "train", "test", "test"],
            "sequence_id": [0, 0, 0, 0],
            "workload_id": ["a", "j_d1", "j_d2", "a"],
        }
    )
    values = sequence_check_values(jobs, split_diversity(jobs, min_workloads=2))
    assert set(values) == set(SEQUENCE_CHECK_DOCS)
    assert values["splits_have_enough_workloads"] == (True, {"thin_splits": [], "n_jobs": 4})
    assert values["offered_load_matches_label"] == (False, {"by_label": []})  # nothing measured is a failure
    shared = {"n_shared_workloads": 1, "n_shared_groups": 2}  # 'a', and job j's days on both sides
    assert values["train_and_test_share_no_workload"] == (False, shared)
    only_days = jobs.with_columns(workload_id=pl.Series(["a", "j_d1", "j_d2", "c"]))
    assert sequence_check_values(only_days, split_diversity(only_days, min_workloads=2))[
        "train_and_test_share_no_workload"
    ] == (False, {"n_shared_workloads": 0, "n_shared_groups": 1})
    assert not sequence_check_values(jobs, split_diversity(jobs, min_workloads=3))[
        "splits_have_enough_workloads"
    ][0]


def test_exact_units_are_the_step_means_before_quantisation(built) -> None:
    df, _ = built
    for cols in (("cpu_units", "cpu_units_exact"), ("mem_units", "mem_units_exact")):
        units = np.concatenate(df[cols[0]].to_list())
        exact = np.concatenate(df[cols[1]].to_list())
        assert exact.dtype == np.float64 and len(exact) == len(units)  # Float32 lists come out as float
        assert (exact >= 0).all() and (exact <= CFG.capacity_units).all()
        assert (quantise_usage(exact / CFG.capacity_units, CFG.capacity_units) == units).all()
    assert (df["cpu_units_exact"].list.len() == df["duration_steps"]).all()


def test_exact_units_columns_are_optional_in_rows_and_in_old_frames() -> None:
    from sim.jobs import JobBatch

    row = {
        "source": "s",
        "load_pct": 30,
        "split": "test",
        "sequence_id": 0,
        "job_index": 0,
        "arrival_step": 0,
        "workload_id": "w",
        "ec_label": 1,
        "duration_steps": 2,
        "cpu_units": [1, 2],
        "mem_units": [1, 1],
        "cpu_request_units": 2,
        "mem_request_units": 1,
        "is_long_running": False,
    }
    with_exact = {**row, "job_index": 1, "cpu_units_exact": [0.25, 1.5], "mem_units_exact": [0.5, 0.75]}
    df = jobs_to_frame([row, with_exact])
    assert df.schema == pl.Schema(JOB_SEQUENCES)
    assert df["cpu_units_exact"].to_list() == [None, [0.25, 1.5]]
    jobs = JobBatch.from_frame(df)
    assert np.isnan(jobs.usage_exact[0, 0]).all()
    assert jobs.usage_exact[0, 1].tolist() == [[0.25, 0.5], [1.5, 0.75]]
    old = JobBatch.from_frame(df.drop("cpu_units_exact", "mem_units_exact"))  # a table written before them
    assert old.usage_exact is None and (old.usage == jobs.usage).all()


def test_synthetic_sources_keep_their_real_valued_usage() -> None:
    from pipelines.synthetic import SYNTHETIC_WORKLOADS, DeepPlaceConfig

    deepplace = SYNTHETIC_WORKLOADS["deepplace_synthetic"].build(2, 1, (30,), 0)
    units = np.concatenate(deepplace["cpu_units"].to_list())
    exact = np.concatenate(deepplace["cpu_units_exact"].to_list())
    mode, cap = DeepPlaceConfig().quantise_mode, DeepPlaceConfig().capacity_units
    assert (quantise_usage(exact / cap, cap, mode) == units).all() and (exact != np.round(exact)).any()
    deeprm = SYNTHETIC_WORKLOADS["deeprm_synthetic"].build(2, 1, (30,), 0)
    units = np.concatenate(deeprm["mem_units"].to_list())
    exact = np.concatenate(deeprm["mem_units_exact"].to_list())
    assert (np.abs(units - exact) < 1).all()  # DeepRM's demand before its unbiased random rounding
