from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from models.usage_forecast import (
    EcAgeQuantileForecaster,
    ForecastConfig,
    LastPeriodMaxForecaster,
    QuantileUsageForecaster,
    RequestForecaster,
    SeasonalNaiveForecaster,
    _Examples,
    _train_network,
    choose_shifts,
    conformal_shifts,
    deal_halves,
    fit_usage_forecaster,
    forecast_table,
    origin_state,
    seasonal_values,
    summarise_forecast_table,
)
from sim.config import SimConfig
from sim.core import relabel
from sim.forecast import UsageForecaster
from sim.jobs import JobBatch

SIM = SimConfig(n_labels=4)
TINY = ForecastConfig(
    horizon=6,
    n_recent=12,
    n_short=4,
    period_steps=6,
    hidden=(32, 32),
    epochs=12,
    patience=3,
    origins_per_job=3,
    max_examples=12000,
    calibration_share=0.4,
    lr=3e-3,
)


def _stationary(n_seq: int, n_jobs: int, seed: int, prefix: str) -> JobBatch:
    """Jobs whose units are iid around a per-job level (label = level bucket): a stationary source."""
    rng = np.random.default_rng(seed)
    seqs = []
    for s in range(n_seq):
        jobs = []
        for i in range(n_jobs):
            level = rng.uniform(1.0, 6.0, size=2)
            dur = int(rng.integers(10, 40))
            units = np.clip(np.round(level + rng.normal(0.0, 0.8, size=(dur, 2))), 0, 8).astype(int)
            jobs.append(
                {
                    "arrival_step": int(rng.integers(0, 50)),
                    "usage": units.tolist(),
                    "ec_label": int(min(level[0] // 1.5, 3)),
                    "request": [8, 8],
                    "workload_id": f"{prefix}-{s}-{i}",
                }
            )
        seqs.append(jobs)
    return JobBatch.from_jobs(seqs)


@pytest.fixture(scope="module")
def data():
    # about 600 calibration and 1000 test jobs (each its own workload): coverage noise well inside 2 points
    train = _stationary(50, 40, seed=0, prefix="train")
    test = _stationary(25, 40, seed=1, prefix="test")
    learned = fit_usage_forecaster(SIM, train, TINY)
    no_ec = fit_usage_forecaster(SIM, train, replace(TINY, use_ec=False))
    baselines = {
        "request": RequestForecaster(6),
        "ec_age_quantile": EcAgeQuantileForecaster.fit(train, SIM.n_labels, 6),
        "seasonal_naive": SeasonalNaiveForecaster(6, period_steps=6),
        "last_period_max": LastPeriodMaxForecaster(6, period_steps=6),
    }
    return train, test, learned, no_ec, baselines


def _running_state(jobs: JobBatch, seed: int):
    rng = np.random.default_rng(seed)
    n_obs = np.where(rng.random(jobs.duration.shape) < 0.3, 0, rng.integers(0, np.maximum(jobs.duration, 1)))
    env, job = np.nonzero(jobs.is_real)
    return n_obs, env, job


def test_every_forecaster_gives_monotone_quantiles_of_the_right_shape(data):
    _, test, learned, no_ec, baselines = data
    n_obs, env, job = _running_state(test, 0)
    state = origin_state(SIM, test, n_obs)
    for f in [learned, no_ec, *baselines.values()]:
        assert isinstance(f, UsageForecaster)
        q = f.forecast(SIM, state, env, job)
        assert q.shape == (len(env), 4, 6, 2)
        assert np.isfinite(q).all() and (q >= 0).all() and (q <= 8).all()
        assert (np.diff(q, axis=1) >= 0).all()
    assert learned.forecast(SIM, state, env, job, horizon=3).shape == (len(env), 4, 3, 2)


def test_coverage_on_a_stationary_source_is_within_two_points_of_nominal(data):
    _, test, learned, _, _ = data
    table = forecast_table(SIM, test, {"learned": learned}, origins_per_job=3, seed=0)
    summary = summarise_forecast_table(table)
    assert summary["coverage_90"][0] == pytest.approx(0.90, abs=0.02)
    assert summary["coverage_95"][0] == pytest.approx(0.95, abs=0.02)
    assert learned.report["calibration_coverage"][0.95] >= 0.95


def test_each_origin_is_covered_on_its_own(data):
    _, test, learned, _, _ = data
    assert learned.shifts.shape == (2, 4, 6, 2)  # arrival, running x levels x steps x resources
    table = forecast_table(SIM, test, {"learned": learned}, origins_per_job=3, seed=0)
    summary = summarise_forecast_table(table, by=("origin",))
    assert sorted(summary["origin"]) == ["arrival", "running"]
    for row in summary.iter_rows(named=True):
        assert row["coverage_95"] == pytest.approx(0.95, abs=0.025), row
    by_origin = learned.report["calibration_coverage_by_origin"]
    assert by_origin["arrival"][0.95] >= 0.95 and by_origin["running"][0.95] >= 0.95


def test_a_job_is_shifted_by_its_own_origins_shifts(data):
    _, test, learned, _, _ = data
    n_obs, env, job = _running_state(test, 5)
    state = origin_state(SIM, test, n_obs)
    arriving = n_obs[env, job] == 0
    assert arriving.any() and (~arriving).any()
    low, high = np.full(learned.shifts.shape[1:], -100.0), np.full(learned.shifts.shape[1:], 100.0)
    q = replace(learned, shifts=np.stack([high, low])).forecast(SIM, state, env, job)
    assert (q[arriving] == 8).all() and (q[~arriving] == 0).all()  # clipped to [0, C]: each origin its own
    q = replace(learned, shifts=np.stack([low, high])).forecast(SIM, state, env, job)
    assert (q[arriving] == 0).all() and (q[~arriving] == 8).all()
    pooled = replace(learned, shifts=high).forecast(SIM, state, env, job)  # one set (L, H, D) for every job
    assert (pooled == 8).all()


def test_conformal_shifts_by_origin_are_each_origins_own_quantile():
    # scores y / s - q: arrivals spread 4x wider than running jobs; one step, one level, one resource
    rng = np.random.default_rng(0)
    n = 4000
    origin = (np.arange(n) % 2).astype(np.int64)
    y = np.where(origin == 0, 4.0, 1.0)[:, None, None] * rng.normal(size=(n, 1, 1)) + 10.0
    ex = _Examples(
        x=np.zeros((n, 1)),
        anchors=np.zeros((n, 1, 1, 1)),
        y=y,
        alive=np.ones((n, 1), dtype=bool),
        scale=np.ones((n, 1)),
        request=np.ones((n, 1)),
        workload=np.array([f"w{i}" for i in range(n)], dtype=object),
        origin=origin,
    )
    q = np.full((n, 1, 1, 1), 10.0)
    pooled = conformal_shifts(q, ex, (0.95,))
    split = conformal_shifts(q, ex, (0.95,), by_origin=True)
    assert pooled.shape == (1, 1, 1) and split.shape == (2, 1, 1, 1)
    for o, sd in ((0, 4.0), (1, 1.0)):
        hit = (y[origin == o, 0, 0] - 10.0 <= split[o, 0, 0, 0]).mean()
        assert hit == pytest.approx(0.95, abs=0.01)
        assert split[o, 0, 0, 0] == pytest.approx(1.645 * sd, rel=0.1)
    assert split[1, 0, 0, 0] < pooled[0, 0, 0] < split[0, 0, 0, 0]
    ex_one = ex.take(np.flatnonzero(origin == 1))  # no arrival example: arrivals take the pooled shift
    one = conformal_shifts(q[origin == 1], ex_one, (0.95,), by_origin=True)
    np.testing.assert_array_equal(one[0], conformal_shifts(q[origin == 1], ex_one, (0.95,)))


def _scores(y: np.ndarray, origin: np.ndarray, workload: np.ndarray) -> _Examples:
    """Calibration examples of one step, one resource, request 1: raw quantile 0, so each score is y."""
    n = len(y)
    return _Examples(
        x=np.zeros((n, 1)),
        anchors=np.zeros((n, 1, 1, 1)),
        y=y[:, None, None],
        alive=np.ones((n, 1), dtype=bool),
        scale=np.ones((n, 1)),
        request=np.ones((n, 1)),
        workload=workload.astype(object),
        origin=origin,
    )


def _choose(ex: _Examples, seed: int = 0, n_deals: int = 5):
    n = len(ex.y)
    levels = (0.5, 0.9, 0.95, 0.99)
    cap = np.full((n, 1), 1e9)
    return choose_shifts(np.zeros((n, 4, 1, 1)), ex, levels, cap, np.array([100]), seed, n_deals=n_deals)


def test_calibration_keeps_per_origin_shifts_unless_pooled_is_significantly_better_on_unseen_workloads():
    rng = np.random.default_rng(0)
    n = 4000
    workload = np.array([f"w{i % 40}" for i in range(n)])  # 40 workloads, both origins in each
    origin = (np.arange(n) % 2).astype(np.int64)
    # arrivals spread 4x wider than running jobs, alike in every workload: each origin's own quantile is better
    y = 500.0 + np.where(origin == 0, 4.0, 1.0) * rng.normal(size=n)
    by_origin, facts = _choose(_scores(y, origin, workload))
    assert by_origin and facts["calibration_choice"] == "per origin"
    assert facts["calibration_cross_fit"]["by_origin_minus_pooled"][1] < 0  # significantly better, too
    assert facts["calibration_cross_fit"]["n_deals"] == 5
    # both origins alike: per origin is not shown worse, so it stays
    y = 500.0 + rng.normal(size=n)
    assert _choose(_scores(y, origin, workload))[0]
    # one deal whose halves hold unlike arrivals (+5 in one, -5 in the other, as calibration templates unlike the
    # held-out ones): each half's arrival shifts miss the other's arrivals, so pooled
    distinct, index = np.unique(workload, return_inverse=True)
    for seed in range(3):
        level = np.where(deal_halves(distinct.size, seed)[index] == 0, 5.0, -5.0)
        y = 500.0 + np.where(origin == 0, level, 0.0) + rng.normal(size=n)
        by_origin, facts = _choose(_scores(y, origin, workload), seed, n_deals=1)
        assert not by_origin and facts["calibration_choice"] == "pooled", (seed, facts)
        assert facts["calibration_cross_fit"]["by_origin_minus_pooled"][0] > 0
    # too few calibration workloads (with alive steps) to cross-fit: per origin, as configured, and said so
    few = _choose(_scores(y[:10], origin[:10], np.array(["a", "b", "c"] * 3 + ["a"])))
    assert few[0] and few[1]["calibration_choice"].startswith("per origin (too few")
    dead = _scores(y, origin, workload)
    dead = replace(dead, alive=np.isin(workload, ["w0", "w1", "w2"])[:, None])  # 3 of 40 workloads alive
    assert _choose(dead)[1]["calibration_choice"].startswith("per origin (too few")


def test_the_deal_of_workloads_into_halves_is_even_and_seeded():
    halves = deal_halves(41, 0)
    assert abs(int(halves.sum()) - 20) <= 1 and set(halves.tolist()) == {0, 1}
    assert (deal_halves(41, 0) == halves).all() and (deal_halves(41, 1) != halves).any()


def test_no_forecast_reads_the_future(data):
    _, test, learned, no_ec, baselines = data
    n_obs, env, job = _running_state(test, 1)
    n_obs = np.minimum(n_obs, test.duration)
    ages = np.arange(test.max_duration)[None, None, :]
    is_future = (ages >= n_obs[..., None])[..., None]
    noise = np.random.default_rng(2).integers(0, 9, size=test.usage.shape)
    alive = (ages < test.duration[..., None])[..., None]
    perturbed = replace(test, usage=np.where(is_future & alive, noise, test.usage).astype(np.int16))
    assert (perturbed.usage != test.usage).any()
    before = origin_state(SIM, test, n_obs)
    after = origin_state(SIM, perturbed, n_obs)
    for f in [learned, no_ec, *baselines.values()]:
        np.testing.assert_array_equal(f.forecast(SIM, before, env, job), f.forecast(SIM, after, env, job))


def test_asking_beyond_the_trained_horizon_names_the_forecaster(data):
    _, test, learned, _, baselines = data
    n_obs, env, job = _running_state(test, 3)
    state = origin_state(SIM, test, n_obs)
    with pytest.raises(ValueError, match=r"QuantileUsageForecaster.*horizon of 7 steps.*1\.\.6"):
        learned.forecast(SIM, state, env, job, horizon=7)
    with pytest.raises(ValueError, match=r"'learned'.*forecasts 6 steps.*horizon of 12"):
        forecast_table(SIM, test, {"learned": learned, **baselines}, horizon=12)


def test_an_empty_training_split_is_an_error():
    empty = JobBatch.from_jobs([[]])
    with pytest.raises(ValueError, match=r"QuantileUsageForecaster\(use_ec=True.*empty training split"):
        fit_usage_forecaster(SIM, empty, TINY)
    with pytest.raises(ValueError, match="EcAgeQuantileForecaster: empty training split"):
        EcAgeQuantileForecaster.fit(empty, SIM.n_labels)


def test_a_nan_loss_names_the_forecaster_epoch_and_iteration():
    rng = np.random.default_rng(0)
    n = 64
    ex = _Examples(
        x=rng.normal(size=(n, 5)),
        anchors=np.ones((n, 2, 6, 2)),
        y=np.full((n, 6, 2), np.nan),
        alive=np.ones((n, 6), dtype=bool),
        scale=np.ones((n, 2)),
        request=np.ones((n, 2)),
        workload=np.array(["w"] * n, dtype=object),
        origin=np.zeros(n, dtype=np.int64),
    )
    with pytest.raises(ValueError, match=r"my-forecaster: training loss is nan at epoch 1, iteration 1"):
        _train_network(ex, ex, TINY, np.array([8, 8]), "my-forecaster")


def test_ec_off_drops_exactly_the_ec_inputs_and_ignores_labels(data):
    _, test, learned, no_ec, _ = data
    # one-hot label (G) and the per-age prior (H x D) are the EC features
    assert len(learned.x_mean) - len(no_ec.x_mean) == SIM.n_labels + TINY.horizon * 2
    n_obs, env, job = _running_state(test, 4)
    state = origin_state(SIM, test, n_obs)
    other = relabel(SIM, state, (test.ec_label + 1) % SIM.n_labels)
    np.testing.assert_array_equal(no_ec.forecast(SIM, state, env, job), no_ec.forecast(SIM, other, env, job))
    assert not np.array_equal(learned.forecast(SIM, state, env, job), learned.forecast(SIM, other, env, job))


def test_the_table_scores_every_forecaster_and_the_request_always_covers(data):
    _, test, learned, _, baselines = data
    table = forecast_table(SIM, test, {"learned": learned, **baselines}, origins_per_job=1, seed=0)
    assert set(table["forecaster"].unique()) == {"learned", *baselines}
    assert set(table["origin"].unique()) == {"arrival", "running"}
    assert table["horizon_step"].max() == 6
    request = table.filter(pl.col("forecaster") == "request")
    assert (request["coverage"] == 1.0).all()  # requests of 8 units (= C) cover everything
    assert (table["pinball_frac"] == table["pinball_units"] / 8).all()


def test_seasonal_values_read_the_most_recent_same_phase_observed_age():
    # window R = 4 holds ages 2..5 (n_observed 6); period 3: target ages 6, 7, 8 read ages 3, 4, 5
    x0 = np.array([[10.0, 11.0, 12.0, 13.0]])[..., None]
    seen = np.ones((1, 4), dtype=bool)
    values, valid = seasonal_values(x0, seen, np.array([6]), 4, np.array([[3]]))
    assert values[0, :, 0].tolist() == [11.0, 12.0, 13.0, 11.0]
    assert valid.all()


def test_same_seed_same_forecaster():
    train = _stationary(4, 20, seed=5, prefix="w")
    cfg = replace(TINY, epochs=2, max_examples=800)
    a, b = fit_usage_forecaster(SIM, train, cfg), fit_usage_forecaster(SIM, train, cfg)
    assert isinstance(a, QuantileUsageForecaster)
    for (wa, ba), (wb, bb) in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(wa, wb)
        np.testing.assert_array_equal(ba, bb)
    np.testing.assert_array_equal(a.shifts, b.shifts)


def test_tables_by_source_fit_on_train_and_score_test_per_load():
    from models.usage_forecast import forecast_tables_by_source
    from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences

    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(
            loads_pct=(30,), n_train_sequences=2, n_test_sequences=1, n_train_jobs=12, n_test_jobs=4
        )
    )
    cfg = replace(TINY, epochs=2, max_examples=600)
    table, reports = forecast_tables_by_source(frame, SimConfig(), cfg, baseline_period=6, origins_per_job=1)
    assert table.columns[:2] == ["source", "load_pct"]
    assert set(table["forecaster"].unique()) == {
        "learned_with_ec",
        "learned_without_ec",
        "remaining_peak_with_ec",
        "remaining_peak_without_ec",
        "request",
        "ec_age_quantile",
        "seasonal_naive",
        "last_period_max",
    }
    assert set(reports) == {
        ("deepplace_synthetic", 30, "learned_with_ec"),
        ("deepplace_synthetic", 30, "learned_without_ec"),
    }
    assert table["n"].sum() > 0
    with pytest.raises(ValueError, match="empty test split"):
        forecast_tables_by_source(frame.filter(pl.col("split") == "train"), SimConfig(), cfg)


@pytest.mark.slow
def test_learned_beats_every_baseline_on_deepplace_and_covers_95_within_the_bar():
    from models.usage_forecast import fit_forecasters
    from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences

    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(loads_pct=(50,), n_train_sequences=20, n_test_sequences=10)
    )
    sim = SimConfig()
    train = JobBatch.from_frame(frame.filter(pl.col("split") == "train"))
    test = JobBatch.from_frame(frame.filter(pl.col("split") == "test"))
    summary = summarise_forecast_table(forecast_table(sim, test, fit_forecasters(sim, train)))
    loss = dict(zip(summary["forecaster"], summary["pinball_frac"], strict=True))
    for baseline in ("request", "ec_age_quantile", "seasonal_naive", "last_period_max"):
        assert loss["learned_with_ec"] < loss[baseline] and loss["learned_without_ec"] < loss[baseline]
    learned = summary.filter(pl.col("forecaster").str.starts_with("learned"))
    assert learned["coverage_95"].is_between(0.93, 0.97).all()


def test_forecast_table_settings_name_an_unknown_preset() -> None:
    from models.usage_forecast import ForecastTableSettings

    with pytest.raises(ValueError, match="unknown forecaster preset 'huge'"):
        ForecastTableSettings(preset="huge")


def test_coverage_check_flags_a_cell_outside_93_to_97_pct() -> None:
    from models.usage_forecast import coverage_check

    summary = pl.DataFrame(
        {
            "source": ["a", "b", "a"],
            "load_pct": [50, 50, 50],
            "forecaster": ["learned_with_ec", "learned_with_ec", "request"],
            "coverage_95": [0.95, 0.99, 0.5],
        }
    )
    passed, metadata = coverage_check(summary)
    assert not passed and metadata["coverage_column"] == "coverage_95"
    assert metadata["outside"] == [
        {"source": "b", "load_pct": 50, "forecaster": "learned_with_ec", "coverage_95": 0.99}
    ]
    assert coverage_check(summary.head(1)) == (True, {"outside": [], "coverage_column": "coverage_95"})
    assert not coverage_check(summary.drop("coverage_95"))[0]  # no 95 % level scored is a failure


def test_the_summary_counts_each_cells_distinct_test_workloads() -> None:
    from models.usage_forecast import with_test_workloads

    summary = pl.DataFrame(
        {
            "source": ["a", "a", "b"],
            "load_pct": [50, 50, 30],
            "forecaster": ["x", "y", "x"],
            "coverage_95": 0.9,
        }
    )
    sequences = pl.DataFrame(
        {
            "source": ["a", "a", "a", "a", "b"],
            "load_pct": [50, 50, 50, 50, 30],
            "split": ["test", "test", "test", "train", "test"],
            "workload_id": ["w1", "w1", "w2", "w3", "w9"],  # w1 twice (two jobs), w3 only in training
        }
    )
    out = with_test_workloads(summary, sequences)
    assert out.height == summary.height
    assert dict(zip(out["source"], out["n_test_workloads"], strict=True)) == {"a": 2, "b": 1}


class _NextLabel:
    """Serves every job the label after its clustering one, at every age: the view is a relabelled batch."""

    def labels(self, cfg: SimConfig, state) -> np.ndarray:
        return (state.jobs.ec_label + 1) % cfg.n_labels

    def label_table(self, cfg: SimConfig, jobs: JobBatch) -> np.ndarray:
        return np.repeat(((jobs.ec_label + 1) % cfg.n_labels)[:, :, None], jobs.max_duration + 1, axis=2)


def _next_labels(jobs: JobBatch) -> JobBatch:
    return replace(jobs, ec_label=(jobs.ec_label + 1) % SIM.n_labels)


def test_split_workloads_keeps_the_days_of_a_job_in_one_part():
    from models.usage_forecast import split_workloads

    train = _stationary(4, 12, seed=3, prefix="s")
    days = replace(  # 48 jobs, 16 Google-like jobs of 3 days each
        train,
        workload_ids=tuple(tuple(f"j{(12 * s + i) // 3}_d{i % 3}" for i in range(12)) for s in range(4)),
    )
    parts = split_workloads(days, TINY, "t")
    by_job: dict[str, set[int]] = {}
    for w, part in parts.items():
        by_job.setdefault(w.split("_")[0], set()).add(part)
    assert len(by_job) == 16 and all(len(p) == 1 for p in by_job.values())
    assert set(parts.values()) == {0, 1, 2}
    # two jobs' days: too few groups for three parts, so the split is by workload, and says so
    two = replace(train, workload_ids=tuple(tuple(f"j{i % 2}_d{s}{i}" for i in range(12)) for s in range(4)))
    report: dict = {}
    parts = split_workloads(two, TINY, "t", report)
    assert report["split_unit"].startswith("workload (") and set(parts.values()) == {0, 1, 2}
    report = {}
    split_workloads(days, TINY, "t", report)
    assert report == {"split_unit": "workload group"}


def test_the_ec_inputs_train_and_score_on_the_labels_a_labeller_serves():
    from models.usage_forecast import _EcInputs, build_examples, profiles_of_part, split_workloads

    train = _stationary(6, 20, seed=7, prefix="s")
    cfg = replace(TINY, epochs=2, max_examples=800)
    parts = split_workloads(train, cfg, "t")
    served = profiles_of_part(train, parts, SIM.n_labels, _NextLabel().label_table(SIM, train))
    shifted = profiles_of_part(_next_labels(train), parts, SIM.n_labels)
    np.testing.assert_allclose(served.fraction, shifted.fraction, rtol=1e-12)
    ec = _EcInputs(shifted, SIM.n_labels)
    with_labeller = build_examples(SIM, train, cfg, ec, "t", _NextLabel())
    on_shifted = build_examples(SIM, _next_labels(train), cfg, ec, "t")
    np.testing.assert_array_equal(with_labeller.x, on_shifted.x)
    assert not np.array_equal(with_labeller.x, build_examples(SIM, train, cfg, ec, "t").x)
    # the per-age quantile baseline and the table read the served labels too
    table = EcAgeQuantileForecaster.fit(
        train, SIM.n_labels, 6, labels_by_age=_NextLabel().label_table(SIM, train)
    )
    np.testing.assert_array_equal(
        table.table, EcAgeQuantileForecaster.fit(_next_labels(train), SIM.n_labels, 6).table
    )
    test = _stationary(3, 20, seed=8, prefix="t")
    scored = forecast_table(SIM, test, {"q": table}, origins_per_job=1, labeller=_NextLabel())
    assert scored.equals(forecast_table(SIM, _next_labels(test), {"q": table}, origins_per_job=1))
    assert not scored.equals(forecast_table(SIM, test, {"q": table}, origins_per_job=1))


def test_validation_keeps_the_ec_inputs_only_where_they_lower_its_loss():
    from models.usage_forecast import fit_choosing_ec, forecaster_factory

    train = _stationary(6, 20, seed=9, prefix="v")
    cfg = replace(TINY, epochs=2, max_examples=800)
    kept = fit_choosing_ec(SIM, train, cfg)
    choice = kept.report["ec_choice"]
    loss = choice["val_pinball_frac"]
    assert choice["kept"] == min(loss, key=loss.get) and kept.cfg.use_ec == (choice["kept"] == "with_ec")
    assert kept.report["best_val_pinball_frac"] == loss[choice["kept"]]
    assert fit_choosing_ec(SIM, train, cfg, ec="off").cfg.use_ec is False
    assert fit_choosing_ec(SIM, train, cfg, ec="on").cfg.use_ec is True
    with pytest.raises(ValueError, match="EC inputs must be one of"):
        fit_choosing_ec(SIM, train, cfg, ec="maybe")
    with pytest.raises(ValueError, match="EC inputs must be one of"):
        forecaster_factory("sample", ec="yes")
