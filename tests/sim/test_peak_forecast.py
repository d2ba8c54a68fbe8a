"""The remaining-peak quantile table (`sim.peak_forecast`) and the rule on it (`forecast_peak` in `sim.policies`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.peak_forecast import (
    AGE_EDGES,
    REMAINING_EDGES,
    RemainingPeakQuantiles,
    age_bucket,
    fit_peak_quantiles,
    peak_cases,
)
from sim.policies import POLICIES, decide, make_policy, policy_kind
from sim.risk import RiskAwarePacking, RiskConfig, head_bounds
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400, n_labels=4)


def _sequences(n_rows: int, n_jobs: int, seed: int, job) -> JobBatch:
    """`n_rows` sequences of `n_jobs` jobs arriving 0-2 steps apart, each job's other fields from `job(rng)`."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 3))
            seq.append({"arrival_step": t, **job(rng)})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def _jobs(n_rows: int, n_jobs: int, seed: int, request: int = 6) -> JobBatch:
    """Jobs requesting `request` units that use 1 unit, except label-2 jobs that spike to 5 in their second half:
    a request far above usage (as a trace's own requests are), and a class that tells who spikes."""

    def job(rng) -> dict:
        dur, label = int(rng.integers(6, 24)), int(rng.integers(0, 3))
        usage = [[5 if label == 2 and a >= dur // 2 else 1] * 2 for a in range(dur)]
        return {"usage": usage, "ec_label": label, "request": [request, request]}

    return _sequences(n_rows, n_jobs, seed, job)


def test_cases_count_every_job_at_every_age_below_its_duration() -> None:
    jobs = _jobs(2, 10, seed=0)
    cases = peak_cases(jobs)
    grid = np.array([0, 1, 2, 3, 4, 6, 8, 12, 16])
    expected = sum(int((grid < d).sum()) for d in jobs.duration[jobs.duration > 0]) * 2  # 2 resources
    assert cases["target"].size == expected
    # the target is the peak from the case's age on: a label-2 job always still has its spike ahead at age 0
    first = (cases["peak_idx"] == 0) & (cases["label"] == 2)
    assert (cases["target"][first] == 5).all()


def test_quantiles_cover_nominally_on_a_stationary_source() -> None:
    """Jobs with i.i.d. peaks: the fitted level-p quantile of a fresh job's peak covers about p of fresh jobs."""
    rng = np.random.default_rng(3)

    def batch(seed: int) -> JobBatch:
        r = np.random.default_rng(seed)
        rows = [
            [
                {
                    "arrival_step": j,
                    "usage": [[int(r.integers(1, 9)), 1]] * 3,
                    "request": [8, 8],
                    "ec_label": 0,
                }
                for j in range(200)
            ]
            for _ in range(5)
        ]
        return JobBatch.from_jobs(rows)

    cfg = SimConfig(n_machines=4, max_steps=400)
    table = fit_peak_quantiles(batch(int(rng.integers(1 << 30))), cfg, use_labels=False)
    test = peak_cases(batch(7))
    new = test["peak_idx"] == 0
    for level in (0.5, 0.9):
        q = table.lookup(level, np.full((1, 2), 8), np.full((1, 2), np.nan), np.zeros(1), np.zeros(1))[0, 0]
        covered = (test["target"][new & (test["resource"] == 0)] <= q).mean()
        assert abs(covered - level) <= 0.1, (level, q, covered)


def test_labels_sharpen_the_forecast_and_backoff_fills_thin_cells() -> None:
    jobs = _jobs(6, 40, seed=1)
    with_ec = fit_peak_quantiles(jobs, CFG, use_labels=True, min_count=5)
    without = fit_peak_quantiles(jobs, CFG, use_labels=False, min_count=5)
    req, none, age0 = np.full((3, 2), 6), np.full((3, 2), np.nan), np.zeros(3)
    labels = np.array([0, 1, 2])
    q_ec = with_ec.lookup(0.95, req, none, age0, labels)
    assert (q_ec[:2] == 1).all() and (q_ec[2] == 5).all()  # the class says who will spike
    assert (without.lookup(0.95, req, none, age0, labels) == 5).all()  # without it every job may
    # a request never seen in training: request-based (max of request and the observed peak)
    assert (
        with_ec.lookup(0.95, np.full((1, 2), 3), np.full((1, 2), 2.0), np.ones(1), np.zeros(1)) == 3
    ).all()
    assert 0.0 < with_ec.share_own_cell <= 1.0
    with pytest.raises(ValueError, match="not fitted"):
        with_ec.lookup(0.42, req, none, age0, labels)


def _once_or_flat(n_rows: int, n_jobs: int, seed: int, share_flat: float) -> JobBatch:
    """Jobs whose request is their peak, 2 units (TVW-RL's requests): most touch it at their first step and use 1
    after; a `share_flat` of them sit at 2 for their whole life."""

    def job(rng) -> dict:
        dur, flat = int(rng.integers(12, 30)), bool(rng.random() < share_flat)
        return {
            "usage": [[2 if flat or a == 0 else 1] * 2 for a in range(dur)],
            "ec_label": 0,
            "request": [2, 2],
        }

    return _sequences(n_rows, n_jobs, seed, job)


def test_the_at_peak_key_keeps_a_job_sitting_at_its_peak_at_its_request() -> None:
    """A job that sits at its peak is not forecast from the many that touched theirs once: without the key the 0.9
    quantile of a flat job's remaining peak is 1 (below its request: it overshoots on every step), with the key it
    is 2, and a job that has left its peak keeps the low quantile; the key's cases are the last observed step's."""
    train = _once_or_flat(30, 30, seed=1, share_flat=0.05)
    cases = peak_cases(train)
    age1 = (cases["bucket"] == 1) & (cases["peak_idx"] > 0)  # one observed step: every job is at its peak
    assert cases["at_peak"][age1].all() and not cases["at_peak"][cases["peak_idx"] == 0].any()
    plain = fit_peak_quantiles(train, CFG, (0.5, 0.9), use_labels=False, min_count=5)
    keyed = fit_peak_quantiles(train, CFG, (0.5, 0.9), use_labels=False, min_count=5, use_at_peak=True)
    assert keyed.values.shape[3] == 2 * plain.values.shape[3]
    req, peak, age, label = np.full((2, 2), 2), np.full((2, 2), 2.0), np.full(2, 8), np.zeros(2, dtype=int)
    now = np.array([[True, True], [False, False]])  # a flat job at its peak, a job that touched it once
    assert (plain.lookup(0.9, req, peak, age, label) == 1).all()
    np.testing.assert_array_equal(keyed.lookup(0.9, req, peak, age, label, at_peak=now), [[2, 2], [1, 1]])
    # the table's own loss on held-out jobs of the same kind falls with the key
    held_out = _once_or_flat(10, 30, seed=2, share_flat=0.05)
    assert keyed.pinball_loss(held_out) < plain.pinball_loss(held_out)
    with pytest.raises(ValueError, match="at its peak now; pass at_peak"):
        keyed.lookup(0.9, req, peak, age, label)
    with pytest.raises(ValueError, match="use_at_peak=False"):
        replace(keyed, use_at_peak=False)  # e.g. a checkpoint's values with the wrong flag


def test_age_buckets() -> None:
    assert age_bucket(np.array([0, 1, 2, 3, 4, 63, 64, 10_000])).tolist() == [0, 1, 2, 2, 3, 6, 7, 7]
    assert len(AGE_EDGES) == 8


def test_empty_training_split_is_a_clear_error() -> None:
    empty = JobBatch.from_jobs([[]])
    with pytest.raises(ValueError, match="empty training split"):
        fit_peak_quantiles(empty, CFG)


def _late_spike_jobs(n_rows: int, seed: int) -> JobBatch:
    """Jobs of 10-40 steps using 1 unit; half of them use 5 units at the step 6 before their end: a job that has
    not spiked yet will, if it is a spiker, exactly when 6 or more steps are left."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq = []
        for j in range(30):
            dur = int(rng.integers(10, 41))
            usage = [[1, 1] for _ in range(dur)]
            if rng.random() < 0.5:
                usage[dur - 6] = [5, 5]
            seq.append({"arrival_step": j, "usage": usage, "ec_label": 0, "request": [6, 6]})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def test_a_known_end_sharpens_the_remaining_peak() -> None:
    """Keyed by remaining life, an unspiked job with 4 steps left is forecast at its usage (its spike, if any,
    would be behind it) and one with 20 left at the spike; without the key both read the same cell."""
    train = _late_spike_jobs(60, seed=1)
    keyed = fit_peak_quantiles(train, CFG, (0.5, 0.9), use_labels=False, use_remaining=True)
    plain = fit_peak_quantiles(train, CFG, (0.5, 0.9), use_labels=False)
    assert (
        keyed.use_remaining and keyed.values.shape[-1] == len(REMAINING_EDGES) and plain.values.shape[-1] == 1
    )
    req, peak, age, left = np.full((2, 2), 6), np.full((2, 2), 1.0), np.array([8, 8]), np.array([4, 20])
    np.testing.assert_array_equal(keyed.lookup(0.9, req, peak, age, np.zeros(2), left), [[1, 1], [5, 5]])
    np.testing.assert_array_equal(plain.lookup(0.9, req, peak, age, np.zeros(2)), [[5, 5], [5, 5]])
    with pytest.raises(ValueError, match="remaining"):
        keyed.lookup(0.9, req, peak, age, np.zeros(2))
    # a table saved before the axis existed reads as one remaining-life cell
    old = replace(plain, values=plain.values[..., 0])
    np.testing.assert_array_equal(old.values, plain.values)


def test_the_remaining_life_key_is_kept_where_validation_loss_says_so_and_only_with_known_ends() -> None:
    """forecast_peak fits the table with and without the remaining-life key and keeps the one with the lower
    pinball loss on its validation sequences; the refitted rule keeps that structure; _nodur never reads ends."""
    tuning = TuningConfig(peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,))
    for jobs, keyed in ((_late_spike_jobs(60, seed=2), True), (_jobs(12, 30, seed=6), None)):
        ctx = FitContext(CFG, jobs, tuning, where="toy")
        rule = POLICIES["forecast_peak"].fit(ctx)
        POLICIES["forecast_peak_nodur"].fit(ctx)
        chosen, nodur = ctx.choices["forecast_peak"], ctx.choices["forecast_peak_nodur"]
        loss = chosen["peak_table_validation_pinball"]
        assert chosen["peak_table_remaining_life"] is (loss["remaining_life"] < loss["without"])
        assert nodur["peak_table_remaining_life"] is False and nodur["peak_table_validation_pinball"] == {}
        assert chosen["peak_table_at_peak_key"] is True  # TuningConfig.peak_at_peak_key's default
        if keyed is not None:
            assert chosen["peak_table_remaining_life"] is keyed
        if chosen["forecaster"] == "peak_quantile":
            assert rule.forecaster.table.use_remaining is chosen["peak_table_remaining_life"]
        fit, validation = ctx.split()
        table = fit_peak_quantiles(fit, CFG, (0.5, 0.9), use_remaining=True)
        assert table.pinball_loss(validation) == pytest.approx(loss["remaining_life"])


def test_every_level_of_the_table_as_a_usage_forecaster() -> None:
    """`RemainingPeakQuantiles` (the forecast table's rows for forecast_peak) gives each level's point forecast,
    non-decreasing along the levels, flat over its horizon."""
    jobs = _jobs(2, 20, seed=4)
    table = fit_peak_quantiles(_jobs(4, 40, seed=5), CFG, (0.5, 0.9, 0.99), use_labels=False, min_count=5)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        state, act = decide(make_policy("tetris"), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    bi, ji = np.nonzero(jobs.is_real)
    q = RemainingPeakQuantiles(table, horizon=7).forecast(CFG, state, bi, ji)
    assert q.shape == (bi.size, 3, 7, 2)
    for i, level in enumerate(table.levels):
        point = table.forecaster(level, horizon=7).point(CFG, state, bi, ji)
        np.testing.assert_array_equal(q[:, i], point)
    assert (np.diff(q, axis=1) >= 0).all() and (np.diff(q, axis=1) > 0).any()


@pytest.mark.parametrize("at_peak", [False, True])
def test_forecast_reads_no_future_usage(at_peak: bool) -> None:
    """Changing a running job's usage after now changes neither its forecast nor the rule's bounds (with the
    at-peak key too: it reads the last observed step)."""
    jobs = _jobs(2, 20, seed=4)
    table = fit_peak_quantiles(_jobs(4, 40, seed=5), CFG, min_count=5, use_at_peak=at_peak)
    forecaster = table.forecaster(0.9, horizon=30)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    policy = make_policy("tetris")
    for _ in range(25):
        state, act = decide(policy, CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    bi, ji = np.nonzero(jobs.is_real)
    assert core.jobs_running(state).any()
    before = forecaster.point(CFG, state, bi, ji)
    bounds = head_bounds(CFG, state, forecaster, RiskConfig(level=0.9))
    # every age not observed yet (all of a queued job's) replaced by other usage
    n_obs = np.where(state.job_machine >= 0, state.t[:, None] - state.job_start + 1, 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    usage = np.where(future[..., None], np.int16(7), state.jobs.usage)
    changed = replace(state, jobs=replace(state.jobs, usage=usage))
    assert not np.array_equal(changed.jobs.usage, state.jobs.usage)
    np.testing.assert_array_equal(forecaster.point(CFG, changed, bi, ji), before)
    np.testing.assert_array_equal(head_bounds(CFG, changed, forecaster, RiskConfig(level=0.9)), bounds)


def test_rule_packs_beyond_requests_without_overshoot_and_is_fitted_on_training_only() -> None:
    """Requests 6 of 8 units: request-based packing puts one job per machine; the peak rule, knowing that labels
    0 and 1 never use more than 1 unit, packs several, and validation picks it only where it pays."""
    train, test = _jobs(24, 40, seed=6), _jobs(3, 40, seed=7)
    ctx = FitContext(CFG, train, TuningConfig(peak_levels=(0.95,), peak_modes=("pack", "guard")), where="toy")
    rule = POLICIES["forecast_peak"].fit(ctx)
    assert policy_kind("forecast_peak") == "forecast"
    assert ctx.choices["forecast_peak"]["use_labels"] is True
    tetris = make_policy("tetris")
    totals = {}
    for name, policy in (("tetris", tetris), ("peak", rule)):
        state = core.reset(CFG, test, 0)
        rng = np.random.default_rng(0)
        while not state.is_done.all():
            state, act = decide(policy, CFG, state, rng)
            state, *_ = core.step(CFG, state, act)
        totals[name] = state.penalty_totals
    assert (totals["peak"][:, 2] == 0).all()  # no overshoot: the spiking class is kept at its spike
    assert totals["peak"].sum() > totals["tetris"].sum()  # a higher return than request-based packing
    assert isinstance(rule, RiskAwarePacking)


def test_guard_mode_never_uses_an_unsafe_machine_where_requests_understate_usage() -> None:
    """Requests of 1 unit for jobs that use up to 4 (as Google's requests can be below usage): request-based
    packing overshoots, so "pack" (which falls back to it) can; "guard" on the exact future never does."""
    from sim.forecast import ExactForecaster

    rng = np.random.default_rng(8)
    rows = []
    for _ in range(3):
        seq, t = [], 0
        for _ in range(40):
            t += int(rng.integers(0, 2))
            dur = int(rng.integers(6, 20))
            usage = [[int(rng.integers(1, 5)), 1] for _ in range(dur)]
            seq.append({"arrival_step": t, "usage": usage, "ec_label": 0, "request": [1, 1]})
        rows.append(seq)
    jobs = JobBatch.from_jobs(rows)
    overshoot = {}
    for name, policy in (
        ("tetris", make_policy("tetris")),
        *(
            (
                mode,
                RiskAwarePacking(
                    ExactForecaster(horizon=jobs.max_duration),
                    risk=RiskConfig(mode=mode),
                    name=f"exact_{mode}",
                ),
            )
            for mode in ("pack", "guard")
        ),
    ):
        state = core.reset(CFG, jobs, 0)
        rng_p = np.random.default_rng(0)
        while not state.is_done.all():
            state, act = decide(policy, CFG, state, rng_p)
            state, *_ = core.step(CFG, state, act)
        assert state.is_terminated.all()
        overshoot[name] = float(state.penalty_totals[:, 2].sum())
    assert overshoot["tetris"] < 0  # the setting does overshoot by requests
    assert overshoot["guard"] == 0


def test_served_labels_feed_the_rule_the_labellers_labels() -> None:
    """`ServedLabels` relabels every state the rule sees: with the jobs' own labels it is the rule itself, and a
    labeller that hides the spiking class (every job label 0) costs the rule what that class told it."""
    from sim.labelling import ServedLabels, TrueLabeller
    from sim.tuning import sequence_returns

    train, test = _jobs(30, 30, seed=5), _jobs(8, 30, seed=6)
    ctx = FitContext(CFG, train, TuningConfig(seed=0, peak_levels=(0.9,), peak_modes=("pack",)), where="toy")
    rule = POLICIES["forecast_peak"].fit(ctx)
    own = sequence_returns(rule, CFG, test, 0)
    np.testing.assert_array_equal(sequence_returns(ServedLabels(rule, TrueLabeller()), CFG, test, 0), own)

    class Blind:
        def labels(self, cfg, state):
            return np.zeros_like(state.jobs.ec_label)

    seen: list[np.ndarray] = []

    class Spy:
        def act(self, cfg, state, rng):
            seen.append(core.observed_labels(state).copy())
            return rule.act(cfg, state, rng)

    blind = sequence_returns(ServedLabels(Spy(), Blind()), CFG, test, 0)
    assert seen and all((labels == 0).all() for labels in seen)
    assert not np.array_equal(blind, own)


def _case_ages(jobs: JobBatch) -> list[tuple[int, int]]:
    """(age, number of cases) in `peak_cases`' order: per age of AGE_GRID, its jobs x 2 resources."""
    from sim.peak_forecast import AGE_GRID

    dur = jobs.duration[jobs.is_real]
    dur = dur[dur > 0]
    return [(a, 2 * int((dur > a).sum())) for a in AGE_GRID if (dur > a).any()]


def test_serving_ages_differ_by_one_between_the_forecast_and_the_labeller() -> None:
    """What `peak_cases` relies on: a running job's forecast count of observed steps (`n_observed`, start .. t)
    is the labeller's (`observed_steps`, start .. t - 1) plus one, at every decision of a rollout."""
    from sim.forecast import n_observed
    from sim.labelling import observed_steps

    cfg, rng = CFG, np.random.default_rng(0)
    state, seen = core.reset(cfg, _jobs(2, 20, 0), 0), 0
    while not state.is_done.all():
        b, j = np.nonzero(core.jobs_running(state))
        np.testing.assert_array_equal(n_observed(state, b, j), observed_steps(state)[b, j] + 1)
        seen += b.size
        state, actions = decide(make_policy("tetris"), cfg, state, rng)
        state, *_ = core.step(cfg, state, actions)
    assert seen > 0


def test_the_table_is_fitted_on_the_labels_served_at_each_age() -> None:
    """Given the labels a labeller serves by age, each case takes the label served at its age (the last one past
    the labeller's ages); the jobs' own labels at every age give the clustering-label table; a wrong shape is a
    clear error."""
    jobs = _jobs(4, 20, seed=2)
    own = np.repeat(jobs.ec_label[..., None], 3, axis=2)
    base, same = peak_cases(jobs), peak_cases(jobs, own)
    for key in base:
        np.testing.assert_array_equal(base[key], same[key])
    # served: label 3 on arrival (meta only), the clustering label once the labeller has seen a step; a case at
    # age a >= 1 (a steps in the forecast's count, start .. t) sees the labeller's age a - 1 (start .. t - 1)
    by_age = own.copy()
    by_age[..., 0] = 3
    served = peak_cases(jobs, by_age)
    age = np.concatenate([np.full(n, a) for a, n in _case_ages(jobs)])
    assert (served["label"][age <= 1] == 3).all()
    np.testing.assert_array_equal(served["label"][age >= 2], base["label"][age >= 2])
    # a fresh job's table entry for label 3 is then the quantile over every class (label 3 hides who spikes)
    table = fit_peak_quantiles(jobs, CFG, use_labels=True, min_count=5, labels_by_age=by_age)
    fresh = table.lookup(0.95, np.full((2, 2), 6), np.full((2, 2), np.nan), np.zeros(2), np.array([3, 2]))
    assert (fresh == 5).all()
    with pytest.raises(ValueError, match="labels_by_age has shape"):
        peak_cases(jobs, own[:1])


def test_a_fit_context_with_a_labeller_validates_and_fits_on_its_labels() -> None:
    """Train, validate and serve on one view: a FitContext's labeller labels the validation episodes and keys
    the remaining-peak table; a labeller that hides the spiking class gives the unlabelled rule's table."""
    from sim.labelling import labelled_jobs

    class Blind:
        """Label 0 for every job at every age (an `AgeLabeller`-like labeller with a label table)."""

        calls = 0

        def labels(self, cfg, state):
            Blind.calls += 1
            out = core.observed_labels(state).copy()
            out[labelled_jobs(cfg, state)] = 0
            return out

        def label_table(self, cfg, jobs):
            return np.zeros((*jobs.ec_label.shape, 2), dtype=np.int64)

    train = _jobs(30, 30, seed=5)
    tuning = TuningConfig(seed=0, peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,))
    ctx = FitContext(CFG, train, tuning, where="toy", labeller=Blind())
    POLICIES["forecast_peak"].fit(ctx)
    assert Blind.calls > 0  # validation episodes were served the labeller's labels
    table = ctx.cached(("peak_table", True, True), lambda: None)
    assert table is not None
    req, none, left = (
        np.full((3, 2), 6),
        np.full((3, 2), np.nan),
        np.full(3, 20),
    )  # fresh jobs, 20 steps to go
    # every fresh job was label 0 in training: any label reads the all-class quantile (the spike is possible)
    fresh = np.zeros((3, 2), dtype=bool)  # nothing observed: not at a peak
    assert (table.lookup(0.9, req, none, np.zeros(3), np.array([0, 1, 2]), left, fresh) == 5).all()
    plain = FitContext(CFG, train, tuning, where="toy")
    POLICIES["forecast_peak"].fit(plain)
    own = plain.cached(("peak_table", True, True), lambda: None)
    assert (own.lookup(0.9, req, none, np.zeros(3), np.array([0, 1, 2]), left, fresh)[:2] == 1).all()


def test_policies_that_say_they_read_no_labels_decide_the_same_on_any_labels() -> None:
    """`ServedLabels` skips relabelling for a policy whose `reads_labels` is False: each such policy (the
    heuristics, the observed-usage rules, the unlabelled quantile rule) decides the same when every state it sees
    carries random labels; the labelled quantile rule says it reads them, and does."""
    from sim.core import relabel
    from sim.labelling import picks_by_labels, reads_labels
    from sim.tuning import sequence_returns

    class Shuffled:
        """Random labels at every call: what a policy that reads none must not notice."""

        def __init__(self, policy) -> None:
            self.policy, self.rng = policy, np.random.default_rng(9)

        def _state(self, cfg, state):
            return relabel(cfg, state, self.rng.integers(0, cfg.n_labels, state.jobs.ec_label.shape))

        def pick_job(self, cfg, state, rng):
            if not hasattr(self.policy, "pick_job"):
                return np.zeros(state.batch_size, dtype=np.int64)
            return self.policy.pick_job(cfg, self._state(cfg, state), rng)

        def act(self, cfg, state, rng):
            return self.policy.act(cfg, self._state(cfg, state), rng)

    train, test = _jobs(30, 30, seed=5), _jobs(6, 30, seed=6)
    tuning = TuningConfig(
        seed=0, peak_levels=(0.9,), peak_modes=("pack",), min_observed=(0,), n_sigmas=(2.0,)
    )
    ctx = FitContext(CFG, train, tuning, where="toy")
    fitted = ["hybrid_observed", "n_sigma_observed", "max_pct_n_sigma_observed", "forecast_peak_noec"]
    heuristics = ["tetris", "best_fit", "first_fit", "kube_default", "deeprm_sjf", "deeprm_packer", "noop"]
    policies = {n: make_policy(n) for n in heuristics} | {n: POLICIES[n].fit(ctx) for n in fitted}
    for name, policy in policies.items():
        assert not reads_labels(policy), name
        np.testing.assert_array_equal(
            sequence_returns(Shuffled(policy), CFG, test, 0), sequence_returns(policy, CFG, test, 0), name
        )
    labelled = RiskAwarePacking(
        fit_peak_quantiles(train, CFG, use_labels=True).forecaster(0.9, 24),
        risk=RiskConfig(level=0.9, mode="pack"),
    )
    assert reads_labels(labelled)
    assert not np.array_equal(
        sequence_returns(Shuffled(labelled), CFG, test, 0), sequence_returns(labelled, CFG, test, 0)
    )
    # its job pick is its fallback's (DeepRM's SJF here), which reads none: served without relabelling, the same
    picker = RiskAwarePacking(labelled.forecaster, make_policy("deeprm_sjf"), labelled.risk)
    assert reads_labels(picker) and not picks_by_labels(picker) and picks_by_labels(Shuffled(picker))

    class PickShuffled(Shuffled):
        def act(self, cfg, state, rng):
            return self.policy.act(cfg, state, rng)

    np.testing.assert_array_equal(
        sequence_returns(PickShuffled(picker), CFG, test, 0), sequence_returns(picker, CFG, test, 0)
    )


def test_the_kept_rule_is_refitted_on_every_training_sequence_with_the_knobs_validation_chose() -> None:
    """`TuningConfig.refit`: the knobs are chosen on validation as before, then the kept rule's table is fitted on
    the whole training split (validation workloads included); off, it is the table of the fit part."""
    train = _jobs(12, 30, seed=6)
    tuning = TuningConfig(peak_levels=(0.5, 0.9), peak_modes=("pack",), min_observed=(0,))
    on = FitContext(CFG, train, replace(tuning, refit=True), where="toy")
    off = FitContext(CFG, train, tuning, where="toy")  # the default: the rule validated is the rule kept
    rule_on, rule_off = POLICIES["forecast_peak"].fit(on), POLICIES["forecast_peak"].fit(off)
    chosen_on, chosen_off = on.choices["forecast_peak"], off.choices["forecast_peak"]
    knobs = ("forecaster", "level", "mode", "fallback", "validation_return")
    assert [chosen_on.get(k) for k in knobs] == [chosen_off.get(k) for k in knobs]  # the same choice
    assert chosen_on["refitted_on_all_training"] is True and chosen_off["refitted_on_all_training"] is False
    fit_part = on.split()[0]
    assert fit_part.batch_size < train.batch_size
    keyed = chosen_on["peak_table_remaining_life"]
    all_cases = fit_peak_quantiles(train, CFG, use_remaining=keyed).n_cases
    assert chosen_on["peak_table_cases"] == all_cases > chosen_off["peak_table_cases"]
    if chosen_on["forecaster"] == "peak_quantile":
        assert rule_on.forecaster.table.n_cases == all_cases
        assert (
            rule_off.forecaster.table.n_cases
            == fit_peak_quantiles(fit_part, CFG, use_remaining=keyed).n_cases
        )
    assert on.refitted().split()[0] is train and on.refitted().fallback_choice() == on.fallback_choice()
    key = ("peak_table", True, True)  # the table's structure chosen on validation, not again in-sample
    assert on.refitted().structure_choice(key, dict) == on.structure_choice(key, dict) != {}


def test_calibrated_co_peaking_candidates_carry_fit_rhos_calibration() -> None:
    """`TuningConfig.peak_calibrated`: beside each level's sum of quantiles, the rule tries the bound whose co-peaking
    `fit_rho` calibrated on the fit part (the quantile of the machine's sum); without labels a third of the jobs
    spike at unknown times, so the sum of quantiles over-covers and the calibration sums deviations with rho < 1.
    The kept rule is a candidate validation ranked first, and the flag off adds no candidate."""
    from sim.risk import _peak_candidates, _peak_table
    from sim.tuning import fit_rho

    train = _jobs(16, 40, seed=21)
    tuning = TuningConfig(seed=0, peak_levels=(0.9,), peak_modes=("pack",), rhos=(0.0, 0.5, 1.0))
    on = FitContext(CFG, train, replace(tuning, peak_calibrated=True), where="toy")
    knobs = [k for k, _ in _peak_candidates(on, "forecast_peak_noec", True, False)]
    table, _ = _peak_table(on, False, True)
    rho, kappa, coverage, _ = fit_rho(
        CFG,
        on.split()[0],
        RemainingPeakQuantiles(table, on.horizon()),
        RiskConfig(level=0.9),
        tuning.rhos,
        on.best_fallback(),
        0,
    )
    joint = [k for k in knobs if k["forecaster"] == "peak_quantiles_joint"]
    assert rho < 1.0 and coverage[rho] >= 0.9
    assert [(k["level"], k["mode"], k["rho"], k["inflation"]) for k in joint] == [(0.9, "pack", rho, kappa)]
    rule = POLICIES["forecast_peak_noec"].fit(on)
    chosen = on.choices["forecast_peak_noec"]
    assert chosen["forecaster"] in {k["forecaster"] for k in knobs}
    if chosen["forecaster"] == "peak_quantiles_joint":
        assert (rule.risk.rho, rule.risk.inflation) == (rho, kappa)
    off = FitContext(CFG, train, tuning, where="toy")
    assert not [k for k, _ in _peak_candidates(off, "forecast_peak_noec", True, False) if "rho" in k]
