"""The online rise-rate signal (`sim.rise_shift`) and the rule whose level follows it (`forecast_peak_adaptive`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.peak_forecast import fit_peak_quantiles
from sim.policies import POLICIES, decide, make_policy, play
from sim.rise_shift import (
    MASK_FLOOR,
    NEVER,
    RiseAmount,
    RiseRate,
    ShiftAdaptedPeakForecaster,
    adapted_level,
    arrival_exceed_steps,
    episode_counts,
    exceed_counts,
    first_rise_steps,
    fit_exceed_rate,
    fit_overshoot_rate,
    fit_rise_amount,
    fit_rise_rate,
    overshoot_counts,
    rate_ratio,
    rise_so_far,
)
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400, n_labels=4)


def _jobs(n_rows: int, n_jobs: int, seed: int, p_rise: float, top: int | tuple[int, int] = 4) -> JobBatch:
    """Jobs requesting 6 of 8 units that use 1 unit, a share `p_rise` of them rising to `top` from their fourth
    step (a (low, high) pair: a height drawn in low .. high per rising job)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 3))
            dur, rises = int(rng.integers(6, 20)), rng.random() < p_rise
            height = top if isinstance(top, int) else int(rng.integers(top[0], top[1] + 1))
            usage = [[height if rises and a >= 3 else 1, 1] for a in range(dur)]
            seq.append({"arrival_step": t, "usage": usage, "ec_label": 0, "request": [6, 6]})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def _run(jobs: JobBatch, n_steps: int) -> core.State:
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    for _ in range(n_steps):
        state, act = decide(make_policy("tetris"), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    return state


def test_first_rise_is_the_first_step_above_step_zero_in_any_resource() -> None:
    jobs = JobBatch.from_jobs(
        [
            [
                {
                    "arrival_step": 0,
                    "usage": [[2, 2], [2, 1], [1, 3], [5, 5]],
                    "request": [6, 6],
                    "ec_label": 0,
                },
                {"arrival_step": 0, "usage": [[3, 3], [3, 3], [2, 1]], "request": [6, 6], "ec_label": 0},
            ]
        ]
    )
    np.testing.assert_array_equal(first_rise_steps(jobs)[0, :2], [2, NEVER])
    rate = fit_rise_rate(jobs)
    # one rise (job 0 at step 2: at risk at steps 1 and 2), job 1 at risk at steps 1 and 2 without one
    assert (rate.events, rate.exposure) == (1, 4) and rate.hazard == pytest.approx(0.25)


def test_a_split_that_never_rises_or_holds_no_job_is_a_clear_error() -> None:
    flat = JobBatch.from_jobs(
        [[{"arrival_step": 0, "usage": [[1, 1]] * 4, "request": [6, 6], "ec_label": 0}]]
    )
    with pytest.raises(ValueError, match="never rise"):
        fit_rise_rate(flat)
    with pytest.raises(ValueError, match="prior_events"):
        RiseRate(hazard=0.1, events=1, exposure=10, prior_events=0.0)


def test_the_episode_counts_read_no_future_usage() -> None:
    """Changing every unobserved step (a queued job's all of them) changes neither the counts nor the ratio."""
    jobs = _jobs(3, 30, seed=1, p_rise=0.5)
    state = _run(jobs, 12)
    rate = fit_rise_rate(_jobs(4, 30, seed=2, p_rise=0.5))
    events, exposure = episode_counts(state)
    assert events.sum() > 0 and (exposure > 0).all()
    n_obs = np.where(state.job_machine >= 0, state.t[:, None] - state.job_start + 1, 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    changed = replace(state, jobs=replace(jobs, usage=np.where(future[..., None], np.int16(7), jobs.usage)))
    assert not np.array_equal(changed.jobs.usage, jobs.usage)
    got = episode_counts(changed)
    np.testing.assert_array_equal(got[0], events)
    np.testing.assert_array_equal(got[1], exposure)
    np.testing.assert_array_equal(rate_ratio(rate, changed), rate_ratio(rate, state))


def test_the_ratio_starts_at_one_and_tracks_a_quieter_episode() -> None:
    rate = fit_rise_rate(_jobs(6, 40, seed=3, p_rise=0.5))
    np.testing.assert_allclose(rate_ratio(rate, core.reset(CFG, _jobs(2, 40, seed=4, p_rise=0.05), 0)), 1.0)
    quiet = rate_ratio(rate, _run(_jobs(2, 40, seed=4, p_rise=0.05), 60))
    busy = rate_ratio(rate, _run(_jobs(2, 40, seed=4, p_rise=0.5), 60))
    assert (quiet < 0.6).all() and (np.abs(busy - 1.0) < 0.4).all()


def test_the_adapted_level_is_rounded_up_to_the_grid_within_its_floor_and_top() -> None:
    grid = (0.5, 0.75, 0.8, 0.9, 0.95, 0.99)
    got = adapted_level(0.9, np.array([1.0, 0.5, 0.45, 2.0, 0.1, 50.0]), grid)
    # 1 - 0.1 / ratio: 0.9, 0.8, 0.778 (up to 0.8), 0.95, -0.0 (floor 0.5), 0.998 (the top)
    np.testing.assert_array_equal(np.asarray(grid)[got], [0.9, 0.8, 0.8, 0.95, 0.5, 0.99])
    low = (0.1, 0.2, 0.3, *grid)
    got = adapted_level(0.9, np.array([1.0, 0.13, 0.1, 0.05]), low, floor=0.2)
    # 1 - 0.1 / ratio: 0.9, 0.23 (up to 0.3), 0.0 and -1.0 (the floor 0.2, not the grid's 0.1)
    np.testing.assert_array_equal(np.asarray(low)[got], [0.9, 0.3, 0.2, 0.2])
    # the default floor (the median) leaves the lower levels unused
    np.testing.assert_array_equal(np.asarray(low)[adapted_level(0.9, np.array([0.05]), low)], [0.5])


def test_at_the_training_rate_the_forecaster_is_the_fixed_level_one() -> None:
    train = _jobs(6, 40, seed=5, p_rise=0.3)
    table = fit_peak_quantiles(train, CFG, (0.5, 0.75, 0.9, 0.99), use_labels=False, min_count=5)
    state = _run(_jobs(2, 40, seed=6, p_rise=0.3), 15)
    bi, ji = np.nonzero(state.jobs.is_real)
    even = RiseRate(hazard=1e9, events=1, exposure=1)  # so large a training rate that every ratio is ~0
    adaptive = ShiftAdaptedPeakForecaster(table, even, level=0.9, horizon=5)
    np.testing.assert_array_equal(adaptive.env_levels(state), [0.5, 0.5])
    np.testing.assert_array_equal(
        adaptive.flat(CFG, state, bi, ji), table.forecaster(0.5, horizon=5).flat(CFG, state, bi, ji)
    )
    fresh = core.reset(CFG, state.jobs, 0)  # nothing observed: ratio 1, the fitted level
    rate = fit_rise_rate(train)
    np.testing.assert_array_equal(
        ShiftAdaptedPeakForecaster(table, rate, level=0.9, horizon=5).flat(CFG, fresh, bi, ji),
        table.forecaster(0.9, horizon=5).flat(CFG, fresh, bi, ji),
    )


def test_at_the_mask_floor_a_quiet_env_leaves_its_arriving_job_to_the_mask() -> None:
    """Floor 0: where an env's target level is at or below 0, its arriving (unplaced) jobs are forecast at 0 and
    its running jobs at the table's lowest level; at a busy env, and at any other floor, nothing changes."""
    from sim import compiled_decision
    from sim.risk import RiskAwarePacking, RiskConfig

    train = _jobs(6, 40, seed=5, p_rise=0.3)
    table = fit_peak_quantiles(train, CFG, (0.1, 0.5, 0.75, 0.9), use_labels=False, min_count=5)
    state = _run(_jobs(2, 40, seed=6, p_rise=0.3), 15)
    bi, ji = np.nonzero(state.jobs.is_real)
    placed = state.job_machine[bi, ji] >= 0
    assert placed.any() and (~placed).any()
    quiet = RiseRate(hazard=1e9, events=1, exposure=1)  # every ratio ~0: target level far below 0
    at_mask = ShiftAdaptedPeakForecaster(table, quiet, level=0.9, horizon=5, floor=MASK_FLOOR)
    assert at_mask.at_mask(state).all()
    flat = at_mask.flat(CFG, state, bi, ji)
    assert (flat[~placed] == 0).all()
    np.testing.assert_array_equal(
        flat[placed], table.forecaster(0.1, horizon=5).flat(CFG, state, bi, ji)[placed]
    )
    # the kernel leaves such a decision to the numpy path
    rule = RiskAwarePacking(at_mask, make_policy("tetris"), RiskConfig(level=0.9, mode="pack"), "r")
    out = np.zeros(state.batch_size, dtype=np.int64)
    assert compiled_decision.risk_act_args(CFG, state, rule, out) is None
    # the default floor never goes below the table: nothing left to the mask
    default = ShiftAdaptedPeakForecaster(table, quiet, level=0.9, horizon=5)
    assert not default.at_mask(state).any() and (default.flat(CFG, state, bi, ji)[~placed] > 0).any()
    # at the training rate (ratio ~1) the mask floor changes nothing
    busy = ShiftAdaptedPeakForecaster(table, fit_rise_rate(train), level=0.9, horizon=5, floor=MASK_FLOOR)
    fresh = core.reset(CFG, state.jobs, 0)
    assert not busy.at_mask(fresh).any()
    with pytest.raises(ValueError, match="floor"):
        ShiftAdaptedPeakForecaster(table, quiet, level=0.9, horizon=5, floor=-0.1)


def test_the_adaptive_rule_is_fitted_on_training_only_and_takes_valid_actions() -> None:
    """Fitted on a busy training split, the rule packs tighter than forecast_peak on a quiet test split, its
    choices are forecast_peak's with the training rate beside them, and it never takes a masked action."""
    train, test = _jobs(24, 40, seed=7, p_rise=0.4), _jobs(3, 40, seed=8, p_rise=0.02)
    tuning = TuningConfig(peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    rule = POLICIES["forecast_peak_adaptive"].fit(ctx)
    peak = POLICIES["forecast_peak"].fit(ctx)
    chosen = ctx.choices["forecast_peak_adaptive"]
    if not chosen["rise_adapted"]:
        pytest.skip("validation kept the hybrid for forecast_peak on this toy split")
    assert chosen["level"] == ctx.choices["forecast_peak"]["level"]
    assert chosen["rise_rate_train"] == pytest.approx(fit_rise_rate(ctx.split()[0]).hazard)
    levels = []
    state = core.reset(CFG, test, 0)
    rng = np.random.default_rng(0)
    while not state.is_done.all():
        mask = core.action_mask(CFG, state)
        levels.append(rule.forecaster.env_levels(state))
        act = rule.act(CFG, state, rng)
        assert mask[np.arange(state.batch_size), act][~state.is_done].all()
        state, *_ = core.step(CFG, state, act)
    assert min(lv.min() for lv in levels) < 0.9  # the quiet episode packs below the fitted level
    assert peak.name == "forecast_peak" and rule.name == "forecast_peak_adaptive"


def test_a_training_split_that_never_rises_keeps_the_fitted_level_and_says_so() -> None:
    train = _jobs(24, 40, seed=9, p_rise=0.0)
    ctx = FitContext(
        CFG, train, TuningConfig(peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,)), where="toy"
    )
    peak = POLICIES["forecast_peak"].fit(ctx)
    with pytest.warns(UserWarning, match="never rise"):
        rule = POLICIES["forecast_peak_adaptive"].fit(ctx)
    chosen = ctx.choices["forecast_peak_adaptive"]
    assert chosen["rise_adapted"] is False
    if chosen.get("forecaster") == "peak_quantile":
        assert "never rise" in chosen["rise_not_adapted_why"]
        assert rule.forecaster == peak.forecaster and rule.name == "forecast_peak_adaptive"


def test_a_guard_that_reads_no_rise_rate_still_adapts_on_a_split_that_never_rises() -> None:
    """The overshoot guard's ratio is its episode's overshoot rate over validation's: a training split whose jobs
    never rise has no rise rate, which the guard does not read (at the mask floor it does, and keeps the level)."""
    train = _jobs(24, 40, seed=9, p_rise=0.0)
    tuning = TuningConfig(peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    peak = POLICIES["forecast_peak"].fit(ctx)
    if ctx.choices["forecast_peak"].get("forecaster") != "peak_quantile":
        pytest.skip("validation kept the hybrid: no level to adapt")
    rule = POLICIES["forecast_peak_overshoot_guard"].fit(ctx)
    chosen = ctx.choices["forecast_peak_overshoot_guard"]
    assert chosen["rise_adapted"] is True and chosen["rise_rate_train"] is None
    guard = getattr(rule.forecaster, "inner", rule.forecaster)  # under recall, where validation kept it
    assert isinstance(guard, ShiftAdaptedPeakForecaster)
    assert guard.rate is None and guard.overshoot is not None and not guard.reads_rise_rate
    state = play(rule, CFG, _jobs(2, 40, seed=10, p_rise=0.5), 0)  # invalid_action="raise"
    assert state.is_done.all() and peak.forecaster is not rule.forecaster
    with pytest.warns(UserWarning, match="never rise"):
        masked = POLICIES["forecast_peak_exceed_guard_mask"].fit(ctx)
    assert ctx.choices["forecast_peak_exceed_guard_mask"]["rise_adapted"] is False and masked is not None
    with pytest.raises(ValueError, match="rate is None"):
        replace(guard, overshoot=None)


def test_first_rises_follow_their_jobs_when_the_queue_is_reordered() -> None:
    """A job picker reorders the queue in place (`JobBatch.rotate_in_place`): each job's first rise moves with it,
    so a reordered batch counts what a fresh computation on it counts."""
    jobs = _jobs(2, 12, seed=10, p_rise=0.5).owned_copy()
    before = first_rise_steps(jobs).copy()
    assert np.unique(before[:, 2:9]).size > 1
    jobs.rotate_in_place(np.array([0, 1]), np.array([2, 3]), np.array([8, 6]))
    fresh = replace(jobs, usage=jobs.usage.copy())  # the same jobs, nothing kept
    np.testing.assert_array_equal(first_rise_steps(jobs), first_rise_steps(fresh))
    assert not np.array_equal(first_rise_steps(jobs), before)


def test_a_floor_neither_0_nor_on_the_adapted_grid_is_a_clear_error() -> None:
    from sim.risk import fit_peak_adaptive

    ctx = FitContext(CFG, _jobs(4, 20, seed=11, p_rise=0.3), TuningConfig(), where="toy")
    with pytest.raises(ValueError, match="forecast_peak_adaptive@0.05: floor 0.05"):
        fit_peak_adaptive(ctx, "forecast_peak_adaptive@0.05", floor=0.05)


def _amount(train: JobBatch, level: float = 0.9) -> tuple:
    grid = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)
    table = fit_peak_quantiles(train, CFG, grid, use_labels=False, min_count=5)
    return table, fit_rise_amount(train, table, level)


def test_the_rise_so_far_and_the_fitted_amount_on_a_known_batch() -> None:
    """A job 1 -> 3 from step 2 and another flat: rises so far 0, 0, 0, 2, 2 and 0; the training tail grows with
    the scale and is 1 at scale 1."""
    jobs = JobBatch.from_jobs(
        [
            [
                {
                    "arrival_step": 0,
                    "usage": [[1, 1], [1, 1], [3, 1], [2, 1]],
                    "request": [6, 6],
                    "ec_label": 0,
                },
                {"arrival_step": 0, "usage": [[2, 2]] * 4, "request": [6, 6], "ec_label": 0},
            ]
        ]
    )
    np.testing.assert_array_equal(rise_so_far(jobs)[0, 0, :5], [0, 0, 0, 2, 2])
    assert not rise_so_far(jobs)[0, 1].any()
    train = _jobs(8, 40, seed=11, p_rise=0.3)
    table, amount = _amount(train)
    factors = dict(zip(amount.scales, amount.tail_factors, strict=True))
    assert factors[1.0] == 1.0 and factors[2.0] > 1.0 >= factors[0.25]
    assert all(b >= a for a, b in zip(amount.tail_factors[:-1], amount.tail_factors[1:], strict=True))
    assert amount.mean_rise == pytest.approx(3.0)  # 1 -> 4 in the first resource
    np.testing.assert_allclose(np.asarray(amount.expected)[4:], 3.0)
    with pytest.raises(ValueError, match="rises"):
        fit_rise_amount(_jobs(2, 10, seed=12, p_rise=0.0), table, 0.9)


def test_the_episode_scale_reads_no_future_usage_and_tracks_bigger_rises() -> None:
    """The scale is 1 before anything is observed, about 1 at the training amount, above it where the jobs rise
    twice as far, and unchanged by any unobserved step."""
    _, amount = _amount(_jobs(8, 40, seed=13, p_rise=0.4))
    np.testing.assert_allclose(amount.scale(core.reset(CFG, _jobs(2, 40, seed=14, p_rise=0.4), 0)), 1.0)
    same = amount.scale(_run(_jobs(2, 40, seed=14, p_rise=0.4), 60))
    big_state = _run(_jobs(2, 40, seed=14, p_rise=0.4, top=7), 60)
    big = amount.scale(big_state)
    assert (np.abs(same - 1.0) < 0.05).all() and (big > 1.2).all()  # 2 unshrunk (6 units against 3)
    jobs = big_state.jobs
    n_obs = np.where(big_state.job_machine >= 0, big_state.t[:, None] - big_state.job_start + 1, 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    changed = replace(
        big_state, jobs=replace(jobs, usage=np.where(future[..., None], np.int16(8), jobs.usage))
    )
    np.testing.assert_array_equal(amount.scale(changed), big)


def test_the_amount_multiplies_the_rate_ratio_and_raises_the_level_of_a_far_rising_episode() -> None:
    train = _jobs(8, 40, seed=15, p_rise=0.4)
    table, amount = _amount(train)
    rate = fit_rise_rate(train)
    state = _run(_jobs(2, 40, seed=16, p_rise=0.1, top=7), 100)  # rising less often, but further
    plain = ShiftAdaptedPeakForecaster(table, rate, level=0.9, horizon=5)
    assert (plain.env_levels(state) < 0.9).all()
    scaled = replace(plain, amount=amount)
    np.testing.assert_allclose(
        scaled.ratio(state), plain.ratio(state) * amount.tail_factor(amount.scale(state))
    )
    assert (scaled.env_levels(state) > plain.env_levels(state)).all()
    with pytest.raises(ValueError, match="tail factors"):
        replace(amount, tail_factors=amount.tail_factors[:-1])
    assert isinstance(amount, RiseAmount)


def test_the_amount_rule_is_fitted_on_training_only_and_takes_valid_actions() -> None:
    train, test = _jobs(24, 40, seed=17, p_rise=0.3), _jobs(3, 40, seed=18, p_rise=0.3, top=7)
    tuning = TuningConfig(peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    rule = POLICIES["forecast_peak_adaptive_amount"].fit(ctx)
    chosen = ctx.choices["forecast_peak_adaptive_amount"]
    if not chosen["rise_adapted"]:
        pytest.skip("validation kept the hybrid for forecast_peak on this toy split")
    assert chosen["rise_amount_train"] == pytest.approx(rule.forecaster.amount.mean_rise)
    state = core.reset(CFG, test, 0)
    rng = np.random.default_rng(0)
    while not state.is_done.all():
        mask = core.action_mask(CFG, state)
        act = rule.act(CFG, state, rng)
        assert mask[np.arange(state.batch_size), act][~state.is_done].all()
        state, *_ = core.step(CFG, state, act)


def test_the_first_exceedance_of_the_arrival_forecast_and_its_training_rate() -> None:
    """Each job's first step above its arrival forecast (the label-free level-q quantile of its whole-life peak
    from its request) is found by hand; a batch whose jobs never exceed gives a clear error."""
    train = _jobs(8, 40, seed=19, p_rise=0.4, top=(2, 6))
    table, _ = _amount(train)
    got = arrival_exceed_steps(train, table, 0.75)
    b, j = np.nonzero(train.is_real)
    forecast = table.lookup(
        0.75, train.request[b, j], np.full((b.size, 2), np.nan), np.zeros(b.size), np.full(b.size, -1)
    )
    for k in range(0, b.size, 37):
        over = (train.usage[b[k], j[k], : train.duration[b[k], j[k]]] > forecast[k]).any(axis=1)
        assert got[b[k], j[k]] == (int(np.argmax(over)) if over.any() else NEVER)
    rate = fit_exceed_rate(train, table, 0.75)
    assert 0 < rate.events < b.size and rate.hazard == pytest.approx(rate.events / rate.exposure)
    flat = _jobs(8, 40, seed=19, p_rise=0.3)  # every rise to 4: the 0.75 quantile is 4, never exceeded
    with pytest.raises(ValueError, match="exceeds"):
        fit_exceed_rate(flat, _amount(flat)[0], 0.75)


def test_the_exceedance_ratio_reads_no_future_usage_and_raises_the_level_of_a_far_rising_episode() -> None:
    train = _jobs(8, 40, seed=20, p_rise=0.4, top=(2, 6))
    table, _ = _amount(train)
    rate = fit_exceed_rate(train, table, 0.75)
    adaptive = ShiftAdaptedPeakForecaster(table, fit_rise_rate(train), level=0.75, horizon=5, exceed=rate)
    fresh = core.reset(CFG, _jobs(2, 40, seed=21, p_rise=0.4, top=7), 0)
    np.testing.assert_allclose(adaptive.ratio(fresh), 1.0)
    state = _run(_jobs(2, 40, seed=21, p_rise=0.4, top=7), 80)  # as often, but every rise to 7
    same = _run(_jobs(2, 40, seed=21, p_rise=0.4, top=(2, 6)), 80)
    assert (adaptive.ratio(state) > 1.3).all() and (adaptive.env_levels(state) > 0.75).all()
    assert (np.abs(adaptive.ratio(same) - 1.0) < 0.6).all()
    jobs = state.jobs
    n_obs = np.where(state.job_machine >= 0, state.t[:, None] - state.job_start + 1, 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    changed = replace(state, jobs=replace(jobs, usage=np.where(future[..., None], np.int16(8), jobs.usage)))
    for got, want in zip(exceed_counts(changed, table, 0.75), exceed_counts(state, table, 0.75), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(adaptive.ratio(changed), adaptive.ratio(state))


def test_the_guard_never_packs_tighter_than_the_fitted_level() -> None:
    """`raise_only`: a quiet episode (jobs exceeding their arrival forecasts less often than the training ones)
    keeps the fitted level where the two-sided rule goes below it; a far-rising one moves up as the two-sided."""
    train = _jobs(8, 40, seed=22, p_rise=0.4, top=(2, 6))
    table, _ = _amount(train)
    two_sided = ShiftAdaptedPeakForecaster(
        table, fit_rise_rate(train), level=0.75, horizon=5, exceed=fit_exceed_rate(train, table, 0.75)
    )
    guard = replace(two_sided, raise_only=True)
    quiet = _run(_jobs(2, 40, seed=23, p_rise=0.05, top=(2, 6)), 80)
    assert (two_sided.env_levels(quiet) < 0.75).all()
    np.testing.assert_array_equal(guard.env_levels(quiet), [0.75, 0.75])
    busy = _run(_jobs(2, 40, seed=23, p_rise=0.4, top=7), 80)
    assert (two_sided.ratio(busy) > 1).all()
    np.testing.assert_array_equal(guard.ratio(busy), two_sided.ratio(busy))


def test_the_guard_at_the_mask_floor_goes_down_only_where_jobs_seldom_rise() -> None:
    """`raise_only` with `MASK_FLOOR`: an env whose rise rate ratio is far below 1 - q is at the mask (arriving
    jobs forecast at 0), however its exceedance ratio stands; at the training rise rate nothing is."""
    train = _jobs(8, 40, seed=24, p_rise=0.4, top=(2, 6))
    table, _ = _amount(train)
    exceed = fit_exceed_rate(train, table, 0.75)
    state = _run(_jobs(2, 40, seed=25, p_rise=0.4, top=(2, 6)), 40)
    bi, ji = np.nonzero(state.jobs.is_real)
    arriving = state.job_machine[bi, ji] < 0
    quiet_rate = RiseRate(hazard=1e9, events=1, exposure=1)  # every rise ratio ~0
    guard = ShiftAdaptedPeakForecaster(
        table, quiet_rate, level=0.75, horizon=5, floor=MASK_FLOOR, exceed=exceed, raise_only=True
    )
    assert guard.at_mask(state).all()
    assert (guard.flat(CFG, state, bi, ji)[arriving] == 0).all()
    np.testing.assert_array_equal(guard.env_levels(state), [0.5, 0.5])  # the grid's lowest level
    usual = replace(guard, rate=fit_rise_rate(train))
    assert not usual.at_mask(state).any() and (usual.env_levels(state) >= 0.75).all()


def _play(name: str, jobs: JobBatch, n_steps: int) -> core.State:
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    for _ in range(n_steps):
        state, act = decide(make_policy(name), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    return state


def test_the_overshoot_counts_see_closed_steps_only() -> None:
    """Two batches equal up to each job's 20th step give the same counts for 15 steps of First-Fit (which
    overshoots here: jobs admitted at 1 unit rise to 7)."""
    jobs = _jobs(2, 40, seed=26, p_rise=0.5, top=7)
    later = np.arange(jobs.max_duration)[None, None, :, None] >= 20
    other = replace(jobs, usage=np.where(later, np.int16(8), jobs.usage))
    a, b = _play("first_fit", jobs, 15), _play("first_fit", other, 15)
    got, want = overshoot_counts(a), overshoot_counts(b)
    assert got[0].sum() > 0
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_validation_overshoot_rate_and_the_guard_that_follows_it() -> None:
    """A rule that never overshoots counts one event (the floor); one that does counts its own. An episode that
    overshoots more often than validation raises the guard's level; the guard never goes below the fitted one."""
    val = _jobs(3, 40, seed=27, p_rise=0.3, top=(2, 6))
    safe = fit_overshoot_rate(CFG, make_policy("tetris"), val, seed=0)
    assert safe.events == 0 and safe.hazard == pytest.approx(1 / safe.exposure)
    loose = fit_overshoot_rate(
        CFG, make_policy("first_fit"), _jobs(3, 40, seed=27, p_rise=0.5, top=7), seed=0
    )
    assert loose.events > 0
    with pytest.raises(ValueError, match="no job"):
        fit_overshoot_rate(CFG, make_policy("tetris"), JobBatch.from_jobs([[]]), seed=0)
    # a budget above the rule's own overshoot scales its rate up (the rate at the budget); one below leaves it
    rising = _jobs(3, 40, seed=27, p_rise=0.5, top=7)
    below = fit_overshoot_rate(CFG, make_policy("first_fit"), rising, seed=0, budget_pct=1e-4)
    above = fit_overshoot_rate(CFG, make_policy("first_fit"), rising, seed=0, budget_pct=500.0)
    assert below.hazard == pytest.approx(loose.hazard) and above.hazard > 2 * loose.hazard
    with pytest.raises(ValueError, match="budget_pct"):
        fit_overshoot_rate(CFG, make_policy("first_fit"), rising, seed=0, budget_pct=0.0)
    train = _jobs(8, 40, seed=28, p_rise=0.4, top=(2, 6))
    table, _ = _amount(train)
    guard = ShiftAdaptedPeakForecaster(
        table, fit_rise_rate(train), level=0.75, horizon=5, overshoot=safe, raise_only=True
    )
    busy = _play("first_fit", _jobs(2, 40, seed=29, p_rise=0.5, top=7), 60)
    assert overshoot_counts(busy)[0].min() > 0
    assert (guard.ratio(busy) > 1).all() and (guard.env_levels(busy) > 0.75).all()
    calm = _play("tetris", _jobs(2, 40, seed=29, p_rise=0.5, top=7), 60)
    np.testing.assert_array_equal(guard.env_levels(calm), [0.75, 0.75])
