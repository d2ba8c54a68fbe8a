"""Choosing among fitted rules by replaying the episode's observed past (`sim.replay_select`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import POLICIES, BestFit, FirstFit, Tetris, play
from sim.replay_select import (
    ReplaySelect,
    block_gain_z,
    checkpoint_times,
    fit_replay_select,
    prefix_batch,
    prefix_batches,
    replay,
    replay_guard,
    select,
    validation_prior,
)
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400, n_labels=4)


def _job(rng: np.random.Generator, arrival: int, p_rise: float) -> dict:
    dur, rises, low = int(rng.integers(6, 30)), rng.random() < p_rise, int(rng.integers(1, 3))
    usage = [[4 if rises and a >= 3 else low, low] for a in range(dur)]
    return {"arrival_step": arrival, "usage": usage, "ec_label": 0, "request": [5, 5]}


def _jobs(n_rows: int, n_jobs: int, seed: int, p_rise: float = 0.3) -> JobBatch:
    """Jobs arriving 0-2 steps apart, requesting 5 of 8 units and using 1-2 units, a share `p_rise` of them rising
    to 4 from their fourth step."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(0, 3, size=(n_rows, n_jobs)), axis=1)
    return JobBatch.from_jobs([[_job(rng, int(t), p_rise) for t in row] for row in arrivals])


def test_checkpoints_double_up_to_the_largest_gap_and_bad_schedules_are_clear_errors() -> None:
    assert checkpoint_times(300, 32, 128).tolist() == [32, 64, 128, 256]
    assert checkpoint_times(700, 32, 128).tolist() == [32, 64, 128, 256, 384, 512, 640]
    assert checkpoint_times(20, 32, 128).size == 0
    with pytest.raises(ValueError, match="first .0. and max_gap"):
        checkpoint_times(100, 0, 128)


def test_the_prefix_reads_no_usage_that_was_not_observed_by_the_checkpoint() -> None:
    jobs = _jobs(2, 40, seed=1)
    until = 20
    state = play(Tetris(), CFG, jobs, 0, max_decisions=60)  # some jobs placed, some queued or not arrived
    assert state.t.min() >= until
    before = [prefix_batch(state, e, until) for e in range(2)]
    start = state.job_start
    perturbed = jobs.usage.copy()
    for e in range(2):
        for j in range(int(jobs.n_jobs[e])):
            s = start[e, j]
            first_unseen = until - s if 0 <= s < until else 0
            perturbed[e, j, max(first_unseen, 0) :] = np.where(
                perturbed[e, j, max(first_unseen, 0) :] > 0, 7, 0
            )
    changed = replace(state, jobs=replace(state.jobs, usage=perturbed))
    assert (perturbed != jobs.usage).any()
    for e in range(2):
        after = prefix_batch(changed, e, until)
        assert np.array_equal(after.usage, before[e].usage)
        assert np.array_equal(after.arrival_step, before[e].arrival_step)
        assert (after.arrival_step[0, : int(after.n_jobs[0])] < until).all()


def test_replaying_the_rule_that_was_played_gives_the_episode_s_own_penalties() -> None:
    jobs = _jobs(3, 60, seed=2)
    until = 24
    for policy in (FirstFit(), BestFit(), Tetris()):
        full = core.make_trace(CFG, jobs.batch_size)
        end = play(policy, CFG, jobs, 0, full)
        assert end.is_done.all()
        state = play(policy, CFG, jobs, 0, max_decisions=200)
        assert (state.t >= until).all()
        prefix = prefix_batches(state, np.arange(jobs.batch_size), until)
        steps, overshoot = replay(CFG, policy, prefix, until, 0)
        returns = steps.sum(axis=1)
        assert steps == pytest.approx(full.penalties[:, :until, :4].sum(axis=2))
        assert returns == pytest.approx(full.penalties[:, :until].sum(axis=(1, 2)))
        assert (returns < 0).all()


def test_select_keeps_the_fitted_rule_unless_an_eligible_one_beats_it_by_the_margin() -> None:
    returns = np.array([[-100.0, -120.0, -90.0], [-100.0, -120.0, -99.0], [-100.0, -120.0, -90.0]])
    overshoot = np.array([[0.0, 0.0, 0.1], [0.0, 0.0, 0.1], [0.9, 0.0, 0.1]])
    chosen = select(returns, overshoot, reference=1, budget_pct=0.25, margin=0.05)
    # row 0: 10 % better, beyond the margin; row 1: 1 % better, within it; row 2: the fitted rule overshoots
    assert chosen.tolist() == [2, 0, 2]
    overshoot[2, 2] = 0.5  # now only the reference is eligible
    assert select(returns, overshoot, 1, 0.25, 0.05)[2] == 1
    assert select(returns, overshoot, 1, 0.25, 0.0)[1] == 2


def test_it_plays_the_fitted_rule_until_the_replay_shows_it_overshooting_then_the_reference() -> None:
    """First-Fit first, Tetris the reference, on jobs that mostly rise from 1-2 units to 4 after they are placed:
    before the first checkpoint the selector is First-Fit exactly; from it on the replay shows First-Fit
    overshooting beyond Tetris's + 0.25 point, so the envs play Tetris and overshoot less than First-Fit does."""
    jobs = _jobs(2, 60, seed=3, p_rise=0.8)
    policy = ReplaySelect((FirstFit(), Tetris()), ("first_fit", "tetris"), reference=1, first=12, max_gap=12)
    mine, theirs = core.make_trace(CFG, 2), core.make_trace(CFG, 2)
    state = play(policy, CFG, jobs, 0, mine)
    ff = play(FirstFit(), CFG, jobs, 0, theirs)
    early = (ff.job_start >= 0) & (ff.job_start < 12)
    assert early.any()
    assert np.array_equal(state.job_machine[early], ff.job_machine[early])
    assert np.array_equal(state.job_start[early], ff.job_start[early])
    assert (policy._memo["choice"] == 1).all()
    from sim.metrics import overshoot_pct_per_episode

    assert (overshoot_pct_per_episode(mine, state) < overshoot_pct_per_episode(theirs, ff)).all()


def test_a_validation_prior_holds_back_a_candidate_that_validation_found_worse() -> None:
    """On jobs that never rise First-Fit, packing on usage, beats Tetris, packing on requests, on every replayed
    past: with a flat prior the selector switches to it; a prior worth enough steps of a large validation deficit
    keeps Tetris. The fitted prior is 0 for the first candidate and never a credit."""
    jobs = _jobs(2, 60, seed=3, p_rise=0.0)
    knobs = {"reference": 0, "first": 12, "max_gap": 12, "z": 0.0}
    flat = ReplaySelect((Tetris(), FirstFit()), ("tetris", "first_fit"), **knobs)
    play(flat, CFG, jobs, 0)
    assert flat.tally["first_fit"] > 0
    held = ReplaySelect(
        (Tetris(), FirstFit()), ("tetris", "first_fit"), prior=(0.0, -1e9), prior_steps=1.0, **knobs
    )
    play(held, CFG, jobs, 0)
    assert held.tally["first_fit"] == 0 and held.tally["tetris"] > 0
    with pytest.raises(ValueError, match="a prior per candidate"):
        ReplaySelect((Tetris(), FirstFit()), prior_steps=10.0)
    with pytest.raises(ValueError, match="prior_steps must be >= 0"):
        ReplaySelect((Tetris(), FirstFit()), prior=(0.0, 0.0), prior_steps=-1.0)
    train = _jobs(24, 40, seed=7, p_rise=0.4)
    tuning = TuningConfig(peak_levels=(0.5,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    prior = validation_prior(ctx, (Tetris(), FirstFit(), BestFit()))
    assert prior[0] == 0.0 and all(np.isfinite(p) and p <= 0.0 for p in prior)
    fitted = fit_replay_select(ctx, "with_prior", prior_steps=64.0)
    assert len(fitted.prior) == len(fitted.candidates) and fitted.prior[0] == 0.0


def test_a_selector_needs_two_candidates_and_a_reference_among_them() -> None:
    with pytest.raises(ValueError, match="at least 2 candidates"):
        ReplaySelect((FirstFit(),))
    with pytest.raises(ValueError, match="reference 3"):
        ReplaySelect((FirstFit(), BestFit()), reference=3)


def test_the_fitted_selector_offers_the_rule_its_fallback_and_takes_valid_actions() -> None:
    train, test = _jobs(24, 40, seed=7, p_rise=0.4), _jobs(3, 40, seed=8, p_rise=0.02)
    tuning = TuningConfig(peak_levels=(0.5,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    rule = POLICIES["forecast_peak_replay"].fit(ctx)
    chosen = ctx.choices["forecast_peak_replay"]
    names = chosen["replay_candidates"]
    assert names[0] == "forecast_peak" and names[-2:] == ["first_fit", "best_fit"]
    assert len(rule.candidates) == len(names) and "hybrid_observed" not in names
    with_hybrid = fit_replay_select(ctx, "with_hybrid", hybrid=True)
    assert with_hybrid.names[-3:] == ("hybrid_observed", "first_fit", "best_fit")
    assert len(with_hybrid.candidates) == len(names) + 1
    assert (
        "hybrid_observed" not in ctx.choices
    )  # the hybrid the replay fits leaves the choices table as it was
    state = play(rule, CFG, test, 0)  # invalid_action="raise": a masked action would stop it
    assert state.is_done.all()


def test_the_fitted_selector_offers_the_table_s_bolder_and_more_cautious_levels() -> None:
    """Fitted at 0.9, the rule's table (0.5 and the grid's levels) offers 0.5 below it and 0.99 above it."""
    train = _jobs(24, 40, seed=7, p_rise=0.4)
    tuning = TuningConfig(peak_levels=(0.9, 0.99), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy")
    rule = POLICIES["forecast_peak_replay"].fit(ctx)
    fitted = ctx.choices["forecast_peak_replay"]
    if fitted.get("forecaster") != "peak_quantile" or fitted.get("level") != 0.9:
        pytest.skip(
            f"validation kept {fitted.get('forecaster')} at {fitted.get('level')}: no levels around 0.9"
        )
    assert {"forecast_peak@0.5", "forecast_peak@0.99"} <= set(rule.names) and fitted[
        "replay_bolder_from"
    ] == 0.5
    levels = {
        c.risk.level
        for c, n in zip(rule.candidates, rule.names, strict=True)
        if n.startswith("forecast_peak@")
    }
    assert levels == {0.5, 0.99}
    timid = fit_replay_select(ctx, "timid", bolder=None)
    assert "forecast_peak@0.5" not in timid.names and "forecast_peak@0.99" in timid.names
    spared = fit_replay_select(ctx, "spared", prior_steps=64.0, prior_on_levels=False)
    by_name = dict(zip(spared.names, spared.prior, strict=True))
    assert by_name["forecast_peak@0.5"] == by_name["forecast_peak@0.99"] == by_name["forecast_peak"] == 0.0
    assert by_name["first_fit"] <= 0.0 and ctx.choices["spared"]["replay_prior_on_levels"] is False


def test_a_gain_from_one_lucky_block_is_not_a_clear_gain_but_a_steady_one_is() -> None:
    steps = np.zeros((1, 3, 32))
    steps[0, 1, 5] = 1000.0  # one block far better (an overshoot the first candidate was charged)
    steps[0, 2] = 10.0 + 0.5 * np.sin(np.arange(32))  # every step a little better
    z = block_gain_z(steps, 8)
    assert z[0, 0] == 0.0
    assert z[0, 1] == pytest.approx(1.0)  # mean 250, se 250 over 4 blocks
    assert z[0, 2] > 10
    returns, overshoot = steps.sum(axis=2), np.zeros((1, 3))
    assert select(returns, overshoot, 0, 0.25, 0.0).tolist() == [1]  # by return alone: the lucky one
    assert select(returns, overshoot, 0, 0.25, 0.0, z, 2.0).tolist() == [2]
    overshoot[0, 0] = 1.0  # the fitted rule not eligible: the best eligible return, whatever z says
    assert select(returns, overshoot, 1, 0.25, 0.0, z, 50.0).tolist() == [1]


def test_a_replay_guard_plays_the_policy_until_its_replay_overshoots_then_an_eligible_rule() -> None:
    """`replay_guard` around a policy that packs beyond requests (First-Fit standing for a learned scheduler): its
    base's request-based fallback is the overshoot reference, then the base, the other rules, First-Fit and
    Best-Fit; before the first checkpoint it plays the policy exactly, and on jobs that mostly rise after they are
    placed it overshoots less than the policy alone."""
    from sim.metrics import overshoot_pct_per_episode
    from sim.risk import PersistenceForecaster, RiskAwarePacking, RiskConfig

    hybrid = RiskAwarePacking(PersistenceForecaster(), Tetris(), RiskConfig(0.9), name="hybrid")
    guard = replay_guard(FirstFit(), hybrid, (BestFit(),), ("stand_in", "other"), first=12, max_gap=12)
    assert guard.names == ("stand_in", "tetris", "hybrid", "other", "first_fit", "best_fit")
    assert isinstance(guard.candidates[1], Tetris) and guard.candidates[2] is hybrid and guard.reference == 1
    assert guard.name == "stand_in_replay"
    with pytest.raises(ValueError, match="2 names for the policy and 0 other rules"):
        replay_guard(FirstFit(), hybrid, (), ("stand_in", "other"))
    jobs = _jobs(2, 60, seed=3, p_rise=0.8)
    mine, theirs = core.make_trace(CFG, 2), core.make_trace(CFG, 2)
    state = play(guard, CFG, jobs, 0, mine)
    alone = play(FirstFit(), CFG, jobs, 0, theirs)
    early = (alone.job_start >= 0) & (alone.job_start < 12)
    assert early.any() and np.array_equal(state.job_machine[early], alone.job_machine[early])
    assert (guard._memo["choice"] != 0).all()  # left the policy at a checkpoint
    assert (overshoot_pct_per_episode(mine, state) < overshoot_pct_per_episode(theirs, alone)).all()
    for knob in ({"margin": 0.1}, {"z": 3.0}):
        with pytest.raises(ValueError, match="margin and z apply only with on_return"):
            replay_guard(FirstFit(), hybrid, **knob)


def test_a_replay_guard_leaves_a_policy_within_the_overshoot_budget_whatever_the_returns() -> None:
    """Without `on_return` a better replayed return is no reason to leave the policy: jobs that never rise (Tetris,
    the stand-in here, never overshoots) keep every env on it at every checkpoint, though First-Fit's replayed
    returns are better; `on_return` switches where the gain is clear."""
    jobs = _jobs(2, 60, seed=3, p_rise=0.0)
    guard = replay_guard(Tetris(), Tetris(), first=12, max_gap=12)
    play(guard, CFG, jobs, 0)
    assert set(guard.tally) == {"tetris"}
    by_return = replay_guard(Tetris(), Tetris(), on_return=True, first=12, max_gap=12)
    play(by_return, CFG, jobs, 0)
    assert set(by_return.tally) - {"tetris"}  # another candidate's replayed gain was clear somewhere


def test_select_with_an_infinite_margin_switches_on_overshoot_only() -> None:
    returns = np.array([[-10.0, -5.0, -1.0], [0.0, -5.0, -1.0]])
    overshoot = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.1]])
    assert select(returns, overshoot, 1, 0.5, np.inf).tolist() == [0, 2]
    assert select(returns, overshoot, 1, 0.5, 0.0).tolist() == [2, 2]


class _Named:
    """A stand-in candidate that `_replaying` knows by its name."""

    def __init__(self, name: str) -> None:
        self.name = name


def _replaying(monkeypatch, per_step: dict, overshoot: dict | None = None) -> None:
    """Every replay of a `_Named` candidate gives its `per_step` returns (the same for 2 envs) up to the checkpoint
    and its `overshoot` % (0 where not given)."""

    def fake_replay(cfg, candidate, prefix, until, seed):
        over = (overshoot or {}).get(candidate.name, 0.0)
        return np.tile(per_step[candidate.name][:until], (2, 1)), np.full(2, over)

    monkeypatch.setattr("sim.replay_select.replay", fake_replay)


def test_a_window_compares_the_recent_steps_of_the_replay(monkeypatch) -> None:
    """`ReplaySelect.window`: a candidate that lost early (its few overshoots while the machines fill) and gains
    steadily since is kept out by a comparison since step 0 and played by one over the replay's last `window`
    steps; eligibility by overshoot still reads the whole replay, so an over-budget candidate stays out however
    well it did lately; a negative window is refused."""
    until = 256
    per_step = {
        "own": np.full(until, -10.0),
        "late": np.where(np.arange(until) < 128, -40.0, -8.0),  # -5,120 - 1,024 against -2,560
        "over": np.full(until, -1.0),
    }
    overshoot = {"own": 0.0, "late": 0.2, "over": 3.0}
    _replaying(monkeypatch, per_step, overshoot)
    candidates = (_Named("own"), _Named("own"), _Named("late"), _Named("over"))
    whole = ReplaySelect(candidates, reference=1, budget_pct=0.75, z=2.0)
    recent = replace(whole, window=128)
    assert whole._replayed_choice(CFG, None, until).tolist() == [0, 0]
    # "over" gains more but is not eligible
    assert recent._replayed_choice(CFG, None, until).tolist() == [2, 2]
    with pytest.raises(ValueError, match="window and recent must be >= 0"):
        replace(whole, window=-1)


def test_recent_switches_on_a_recent_gain_only_where_the_whole_replay_agrees(monkeypatch) -> None:
    """`ReplaySelect.recent`: a candidate that gains steadily over the replay's last steps is played where its return
    over the whole replay leads the fitted rule's as well, and not where an early loss still outweighs that gain
    (a quiet stretch alone is no reason to switch); a recent gain that is not steady (one lucky block) is no reason
    either; the whole replay's choice stands as it would without `recent`; `window` and `recent` together are
    refused."""
    until = 256
    per_step = {
        "own": np.full(until, -10.0),
        "late": np.where(np.arange(until) < 128, -40.0, -8.0),  # behind over the whole replay, ahead lately
        # even, blocks of 8 steps alternately 160 behind and ahead, then 2 a step ahead: ahead over both, yet no
        # steady gain since step 0
        "ahead": np.where(np.arange(until) < 192, -10.0 + 20.0 * (-1.0) ** (np.arange(until) // 8), -8.0),
        "lucky": np.where(np.arange(until) == until - 1, 100.0, -10.0),  # one block's gain, ahead over both
    }
    _replaying(monkeypatch, per_step)

    def choice(*names: str, **knobs) -> list[int]:
        candidates = tuple(_Named(n) for n in ("own", "own", *names))
        return (
            ReplaySelect(candidates, reference=1, z=2.0, **knobs)._replayed_choice(CFG, None, until).tolist()
        )

    assert choice("late", recent=64) == [0, 0]  # its early loss outweighs the recent gain
    assert choice("late", "ahead", recent=64) == [3, 3]
    assert choice("ahead") == [0, 0]  # since step 0 its gain is not clear (block_gain_z)
    assert choice("ahead", recent=64) == [2, 2]
    assert choice("lucky", recent=64) == [0, 0]
    with pytest.raises(ValueError, match="exclude each other"):
        choice("ahead", window=64, recent=64)


def test_switch_reasons_name_why_the_fitted_rule_was_left(monkeypatch) -> None:
    """`ReplaySelect.why` counts each switch away from the fitted rule by its cause: its replayed overshoot beyond
    the budget, a better return over the whole replay, or only `recent`'s confirmed recent gain; staying is not
    counted."""
    until = 256
    per_step = {
        "own": np.full(until, -10.0),
        "ref": np.full(until, -10.0),
        "better": np.full(until, -5.0),
        "ahead": np.where(np.arange(until) < 192, -10.0 + 20.0 * (-1.0) ** (np.arange(until) // 8), -8.0),
    }

    def why(names: tuple[str, ...], overshoot: dict | None = None, **knobs) -> dict:
        _replaying(monkeypatch, per_step, overshoot)
        guard = ReplaySelect(tuple(_Named(n) for n in ("own", "ref", *names)), reference=1, z=2.0, **knobs)
        guard._replayed_choice(CFG, None, until)
        return dict(guard.why)

    assert why(("better",)) == {"return": 2}
    assert why(("better",), {"own": 1.0}) == {"overshoot": 2}  # beyond the reference's 0 + 0.5 point
    assert why(("ahead",), recent=64) == {"recent": 2}
    assert why(("ahead",)) == {}  # kept: no switch to count
