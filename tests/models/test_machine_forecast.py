"""The machine's summed-peak forecast (`models.machine_forecast`) and the rule on it (`sim.risk.MachinePeakPacking`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

import models  # noqa: F401  (registers the rules)
from models.machine_forecast import (
    FEATURES,
    Cases,
    MachinePeakConfig,
    collect_cases,
    exceed_probability,
    fit_machine_peak_rule,
    fit_model,
    machine_features,
    machine_targets,
)
from sim import core
from sim.config import SimConfig
from sim.core import action_mask, queue_head
from sim.jobs import JobBatch
from sim.policies import POLICIES, decide, make_policy, policy_kind, valid_machines
from sim.risk import MachinePeakPacking, jobs_per_machine, packing_gain
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=4, max_steps=400)
SMALL = MachinePeakConfig(
    levels=(0.5, 0.9), period_steps=8, n_recent=3, rounds=2, max_iter=20, min_samples_leaf=5
)


def _square_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Sequences of jobs whose usage follows a rounded sine around a level (1-5 units, both resources in phase
    opposition), each at its own period and phase: peaks that co-occur only now and then; request = peak."""
    rng = np.random.default_rng(seed)
    sequences = []
    for _ in range(n_rows):
        arrivals = np.cumsum(rng.integers(0, 3, size=n_jobs))
        jobs = []
        for j, arrival in enumerate(arrivals):
            ages = np.arange(int(rng.integers(8, 30)))
            wave = np.sin(2 * np.pi * (ages / rng.integers(4, 9) + rng.uniform()))
            level, swing = rng.integers(1, 3), rng.integers(1, 3)
            cpu = np.clip(np.rint(level + swing * wave), 1, 5).astype(int)
            mem = np.clip(np.rint(level - swing * wave), 1, 5).astype(int)
            usage = np.stack([cpu, mem], axis=1).tolist()
            jobs.append(
                {"arrival_step": int(arrival), "usage": usage, "ec_label": j % 3, "workload_id": f"w{j % 7}"}
            )
        sequences.append(jobs)
    return JobBatch.from_jobs(sequences)


def _midway(n_decisions: int = 14):
    state = core.reset(CFG, _square_jobs(3, 24, seed=5), 0)
    rng = np.random.default_rng(0)
    tetris = make_policy("tetris")
    for _ in range(n_decisions):
        state, act = decide(tetris, CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    return state


def _perturb_future(state, seed: int, keep_head_first_step: bool = False):
    """The same state with every job's usage at ages not yet observed replaced by noise (the head's included;
    with `keep_head_first_step`, all but the head's first step, which the simulator's mask reads for every
    policy)."""
    jobs = state.jobs
    rng = np.random.default_rng(seed)
    is_placed = state.job_machine >= 0
    n_obs = np.where(is_placed, np.clip(state.t[:, None] - state.job_start + 1, 0, None), 0)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    noise = rng.integers(0, 9, size=jobs.usage.shape).astype(jobs.usage.dtype)
    usage = np.where(future[..., None], noise, jobs.usage)
    if keep_head_first_step:
        rows, head = np.arange(state.batch_size), np.minimum(state.next_job, jobs.max_jobs - 1)
        usage[rows, head, 0] = jobs.usage[rows, head, 0]
    return replace(state, jobs=replace(jobs, usage=usage))


@dataclass(frozen=True)
class _ExactBound:
    """ORACLE, for the tests only: the realised peak share (`machine_targets`) as every level's bound."""

    horizon: int
    levels: tuple[float, ...] = (0.9, 0.95)

    def assess(self, cfg, state, rows, level, with_exceed=False):
        peak = machine_targets(cfg, state, rows, self.horizon)
        return peak, ((peak > 1.0).any(axis=2).astype(float) if with_exceed else None)


def _rollout(policy, jobs: JobBatch, seed: int = 0):
    rng = np.random.default_rng(seed)
    state = core.reset(CFG, jobs, seed)
    while not state.is_done.all():
        state, act = decide(policy, CFG, state, rng)
        mask = action_mask(CFG, state)
        assert mask[np.arange(state.batch_size), act].all(), "an invalid action"
        state, *_ = core.step(CFG, state, act)
    return state


def test_features_never_read_the_future(perturb_committed) -> None:
    """No feature of a machine, and not the gain of the expected-value rule, moves when every job's unobserved
    usage (the head's whole life included) and the placed jobs' committed future in the state do."""
    state = _midway()
    rows = np.arange(state.batch_size)
    assert (state.job_machine >= 0).any(axis=1).all() and queue_head(state).has_job.any()
    for use_labels in (False, True):
        a = machine_features(CFG, state, rows, 30, SMALL, use_labels)
        b = machine_features(
            CFG, perturb_committed(_perturb_future(state, 7), 8), rows, 30, SMALL, use_labels
        )
        assert a.shape == (3, CFG.n_machines, CFG.n_resources, len(FEATURES) - (0 if use_labels else 1))
        assert np.array_equal(a, b)
        assert np.isfinite(a).all()
    np.testing.assert_array_equal(
        packing_gain(CFG, state, rows),
        packing_gain(CFG, perturb_committed(_perturb_future(state, 7), 8), rows),
    )
    # the target reads the head's future: perturbing it moves it
    moved = machine_targets(CFG, _perturb_future(state, 7), rows, 30)
    assert not np.array_equal(machine_targets(CFG, state, rows, 30), moved)


def test_targets_are_the_realised_peak_share_of_the_running_jobs_and_the_head() -> None:
    state = _midway()
    jobs, horizon = state.jobs, 12
    got = machine_targets(CFG, state, np.arange(state.batch_size), horizon)
    cap = np.asarray(CFG.capacity_units, dtype=float)
    head = queue_head(state)
    for b in range(state.batch_size):
        for m in range(CFG.n_machines):
            total = np.zeros((horizon + 1, CFG.n_resources))
            for j in range(jobs.max_jobs):
                if state.job_machine[b, j] != m:
                    continue
                for k in range(horizon + 1):
                    age = state.t[b] + k - state.job_start[b, j]
                    if 0 <= age < jobs.duration[b, j]:
                        total[k] += jobs.usage[b, j, age]
            if head.has_job[b]:
                idx = state.next_job[b]
                for k in range(min(horizon + 1, jobs.duration[b, idx])):
                    total[k] += jobs.usage[b, idx, k]
            np.testing.assert_allclose(got[b, m], total.max(axis=0) / cap)


def test_the_rule_on_an_exact_bound_never_overshoots_and_packs_beyond_requests() -> None:
    """A synthetic source whose machine forecast is exact: no overshoot at any level (risk 0 <= epsilon), valid
    actions only, and fewer unused units than request-based Tetris."""
    jobs = _square_jobs(3, 30, seed=1)
    tetris = _rollout(make_policy("tetris"), jobs)
    for mode, epsilon in (("deviate", None), ("pack", None), ("guard", None), ("pack", 0.0)):
        rule = MachinePeakPacking(
            _ExactBound(jobs.max_duration), level=0.9, mode=mode, name="t", epsilon=epsilon
        )
        state = _rollout(rule, jobs)
        assert state.is_terminated.all()
        assert (state.penalty_totals[:, 2] == 0).all()  # overshoot component
        if mode == "pack":
            # the underutilisation component (negative)
            assert state.penalty_totals[:, 1].sum() > tetris.penalty_totals[:, 1].sum()


@dataclass(frozen=True)
class _ConstantChance:
    """A bound that calls every machine beyond capacity (share 2) with the same chance of exceeding."""

    chance: float
    levels: tuple[float, ...] = (0.5,)

    def assess(self, cfg, state, rows, level, with_exceed=False):
        shape = (len(rows), cfg.n_machines)
        return np.full((*shape, cfg.n_resources), 2.0), (np.full(shape, self.chance) if with_exceed else None)


@pytest.mark.parametrize("n_decisions", [2, 14])  # some machines idle, all in use
def test_packing_gain_is_the_underutilisation_saved_against_an_empty_machine(n_decisions: int) -> None:
    state = _midway(n_decisions)
    rows = np.arange(state.batch_size)
    got = packing_gain(CFG, state, rows)
    cap = np.asarray(CFG.capacity_units, dtype=float)
    head = queue_head(state)
    usage = core.current_usage(CFG, state)
    n_jobs = jobs_per_machine(state)
    assert (got > 0).any() and ((got == 0).any() == (n_decisions == 2))
    for b in rows:
        for m in range(CFG.n_machines):
            running = [
                j
                for j in range(state.jobs.max_jobs)
                if state.job_machine[b, j] == m
                and state.job_start[b, j] <= state.t[b] < state.job_start[b, j] + state.jobs.duration[b, j]
            ]
            assert n_jobs[b, m] == len(running)
            if not running:
                assert got[b, m] == 0.0
                continue
            last_end = max(state.job_start[b, j] + state.jobs.duration[b, j] for j in running)
            steps = min(int(head.duration[b]), int(last_end - state.t[b]))
            per_step, k_u = 0.0, CFG.k_underutil
            for d in range(CFG.n_resources):
                r, unused = float(head.request[b, d]), max(cap[d] - usage[b, m, d], 0.0)
                per_step += (cap[d] - r) ** k_u + unused**k_u - max(unused - r, 0.0) ** k_u
            assert got[b, m] == pytest.approx(per_step * steps)
    # no packing pressure, no gain
    np.testing.assert_array_equal(packing_gain(replace(CFG, k_underutil=0.0), state, rows), 0.0)


def test_the_expected_cost_rule_admits_a_machine_while_the_charge_stays_within_the_gain() -> None:
    state = _midway()
    rng = np.random.default_rng(0)
    bound = _ConstantChance(0.02)

    def act(**knobs):
        return MachinePeakPacking(bound, level=0.5, mode="pack", name="t", **knobs).act(CFG, state, rng)

    # a tiny scale admits only what the requests admit; a huge one every machine in use
    assert np.array_equal(act(cost_scale=1e-12), act(epsilon=0.0))
    assert np.array_equal(act(cost_scale=1e12), act(epsilon=0.5))
    assert not np.array_equal(act(epsilon=0.0), act(epsilon=0.5))  # the state tells the two apart
    # in between: the tightest machine in use (by requests' share) whose requests fit or whose expected charge
    # stays within cost_scale x its gain; Tetris where there is none
    from sim.policies import free_by_requests, valid_machines

    rows = np.arange(state.batch_size)
    cap = np.asarray(CFG.capacity_units, dtype=float)
    charge = 0.02 * CFG.k_overshoot * (jobs_per_machine(state) + 1)
    gain = packing_gain(CFG, state, rows)
    head = queue_head(state).request[:, None, :]
    by_requests = ((cap - free_by_requests(CFG, state) + head) / cap).max(axis=2)
    base = make_policy("tetris").act(CFG, state, rng)
    admitted_counts = []
    for scale in (0.3, 1.0, 3.0):
        admitted = valid_machines(CFG, state) & core.machines_used(state)
        admitted &= (by_requests <= 1.0) | (charge <= scale * gain)
        expected = np.where(
            admitted.any(axis=1), np.argmax(np.where(admitted, by_requests, -np.inf), axis=1), base
        )
        assert np.array_equal(act(cost_scale=scale), expected)
        admitted_counts.append(int(admitted.sum()))
    assert admitted_counts[0] < admitted_counts[-1]  # the scales admit different machines here


def test_exceed_probability_is_the_convolution_of_the_jobs_observed_histograms() -> None:
    """Against enumeration: two cells, one with two jobs (observed values {1, 3} and {2, 2, 4}) and the head's
    request 2, one with one job (never observed above 1) and no head; capacity 6."""
    window = np.array([[np.nan, 1, 3], [2, 2, 4], [np.nan, np.nan, 1]])[:, :, None]
    seen = ~np.isnan(window)
    got = exceed_probability(window, seen, np.array([0, 0, 1]), 2, np.array([[2], [0]]), (6,))
    # cell 0: 2 + {1, 3} + {2, 2, 4} > 6 for (1, 4), (3, 2), (3, 2), (3, 4): 1/2 * 1/3 + 1/2 * 1 = 2/3
    np.testing.assert_allclose(got[:, 0], [2 / 3, 0.0])


def _stationary_cases(n_sequences: int, per_sequence: int, seed: int, noise: float = 0.05) -> Cases:
    rng = np.random.default_rng(seed)
    n = n_sequences * per_sequence
    x = rng.uniform(0, 1, size=(n, 2, len(FEATURES) - 1))
    x[:, :, 0] = [0, 1]  # the resource column
    y = 0.5 * x[:, :, 2] + 0.2 * x[:, :, 3] + rng.normal(0, noise, size=(n, 2)) * (1 + x[:, :, 4])
    return Cases(x, y, np.repeat(np.arange(n_sequences), per_sequence))


def test_conformal_shift_covers_the_nominal_share_of_fresh_stationary_cases() -> None:
    """Quantile coverage on a synthetic stationary source within 2 points of nominal, jointly over resources."""
    mcfg = MachinePeakConfig(levels=(0.8, 0.9, 0.95), max_iter=40)
    model = fit_model(_stationary_cases(40, 200, seed=0), horizon=10, mcfg=mcfg, use_labels=False)
    fresh = _stationary_cases(20, 400, seed=1)
    for level in model.levels:
        covered = (fresh.y <= model.predict(fresh.x, level) + 1e-12).all(axis=1).mean()
        assert abs(covered - level) <= 0.02, (level, covered)


def test_held_out_calibration_cases_set_the_shift_for_workloads_unlike_the_fit_ones() -> None:
    """Cases of other workloads (here: three times the noise) calibrate the bound for them; the fit cases' own
    last sequences do not."""
    mcfg = MachinePeakConfig(levels=(0.8, 0.9), max_iter=40)
    seen = _stationary_cases(40, 200, seed=0)
    unseen = dict(n_sequences=20, per_sequence=200, noise=0.15)
    held_out = fit_model(seen, 10, mcfg, False, calibration=_stationary_cases(seed=1, **unseen))
    in_sample = fit_model(seen, 10, mcfg, False)
    assert held_out.report["calibration"] == "held-out sequences"
    assert held_out.report["n_calibration_sequences"] == 20
    assert held_out.report["n_fit_cases"] == len(seen) and in_sample.report["n_fit_cases"] < len(seen)
    fresh = _stationary_cases(seed=2, **unseen)
    for level in mcfg.levels:
        covered = (fresh.y <= held_out.predict(fresh.x, level) + 1e-12).all(axis=1).mean()
        short = (fresh.y <= in_sample.predict(fresh.x, level) + 1e-12).all(axis=1).mean()
        assert abs(covered - level) <= 0.02 and short < level - 0.05, (level, covered, short)
    with pytest.raises(ValueError, match="no calibration cases"):
        fit_model(seen, 10, mcfg, False, calibration=Cases(seen.x[:0], seen.y[:0], seen.sequence[:0]))


def test_the_fitted_rule_chooses_on_validation_reports_its_model_and_acts_validly(perturb_committed) -> None:
    train = _square_jobs(8, 20, seed=2)
    ctx = FitContext(CFG, train, TuningConfig(fallbacks=("tetris", "first_fit"), seed=0), where="toy")
    rule = fit_machine_peak_rule(ctx, "forecast_machine_peak_noec", use_labels=False, mcfg=SMALL)
    assert callable(POLICIES["forecast_machine_peak_noec"].fit)
    assert (
        policy_kind("forecast_machine_peak") == "forecast"
        and policy_kind("forecast_machine_peak_noec") == "forecast"
    )
    assert isinstance(rule, MachinePeakPacking) and rule.bound is not None and not rule.reads_labels
    choice = ctx.choices["forecast_machine_peak_noec"]
    assert choice["mode"] in ("deviate", "pack", "guard") and choice["level"] in rule.bound.levels
    n_exceed = len(SMALL.epsilons) + len(SMALL.cost_scales) if rule.bound.classifier is not None else 0
    assert len(choice["tried"]) == 2 * (sum(q >= 0.8 for q in rule.bound.levels) + n_exceed)
    report = choice["machine_peak_model"]
    assert [r["round"] for r in report["rounds"]] == [0, 1] and report["n_cases"] > 0
    # calibrated on the validation part's cases (workloads the fit part never uses)
    assert report["calibration"] == "held-out sequences"
    assert all(r["calibration_cases"] > 0 for r in report["rounds"])
    assert report["n_calibration_cases"] == sum(r["calibration_cases"] for r in report["rounds"])
    assert set(report["exceed"]) >= {"exceed_rate_fit", "exceed_rate_calibration", "fitted"}
    _rollout(rule, _square_jobs(2, 25, seed=3))
    # the fitted rule reads only the observed past: the same decision on a perturbed future
    state = _midway()
    assert np.array_equal(
        rule.act(CFG, state, np.random.default_rng(0)),
        rule.act(
            CFG,
            perturb_committed(_perturb_future(state, 3, keep_head_first_step=True), 4),
            np.random.default_rng(0),
        ),
    )
    # with labels, the model reads the head's label and says so
    labelled = fit_machine_peak_rule(ctx, "forecast_machine_peak", mcfg=SMALL)
    assert labelled.reads_labels and labelled.bound.use_labels


def test_a_fit_part_too_small_to_calibrate_leaves_the_fallback_with_a_warning() -> None:
    ctx = FitContext(
        CFG, _square_jobs(1, 20, seed=7), TuningConfig(fallbacks=("tetris",), seed=0), where="one"
    )
    with pytest.warns(UserWarning, match="calibration needs at least 2.*the rule is its fallback"):
        rule = fit_machine_peak_rule(ctx, "forecast_machine_peak", mcfg=SMALL)
    assert rule.bound is None and ctx.choices["forecast_machine_peak"]["model"] is None
    assert ctx.choices["forecast_machine_peak"]["fallback"] == "tetris"


def test_without_a_classifier_the_chance_is_the_base_rate_and_thin_calibration_never_packs() -> None:
    cases = _stationary_cases(4, 30, seed=2)  # 30 calibration cases: too few for q = 0.99
    cases.y = np.minimum(cases.y, 0.95)  # never above capacity: one outcome
    model = fit_model(cases, 10, MachinePeakConfig(levels=(0.5, 0.99), max_iter=5), use_labels=False)
    assert model.shift[0.99] == float("inf") and np.isfinite(model.shift[0.5])
    assert model.classifier is None and model.exceed_rate == 0.0
    np.testing.assert_allclose(model.exceed(cases.x[:3]), 0.0)


def test_collect_cases_counts_one_case_per_decision_and_machine_in_use() -> None:
    jobs = _square_jobs(2, 15, seed=4)
    cases = collect_cases(CFG, jobs, make_policy("tetris"), jobs.max_duration, SMALL, use_labels=False)
    assert cases.x.shape == (len(cases), CFG.n_resources, len(FEATURES) - 1)
    assert cases.y.shape == (len(cases), CFG.n_resources) and set(np.unique(cases.sequence)) <= {0, 1}
    assert (cases.y > 0).all()  # a machine in use with the head on it uses something
    assert len(cases.thinned(10)) == 10


def test_a_job_pickers_cases_are_of_the_job_it_places() -> None:
    """DeepRM's SJF moves the shortest visible job to the head: the cases describe that job, not the FIFO head."""
    jobs = _square_jobs(3, 30, seed=9)
    sjf = make_policy("deeprm_sjf")
    cases = collect_cases(CFG, jobs, sjf, jobs.max_duration, SMALL, use_labels=False)
    got = cases.x[:, 0, FEATURES.index("head_duration")]
    expected, fifo = [], []
    rng = np.random.default_rng(0)
    state = core.reset(CFG, jobs, 0)
    while not state.is_done.all():
        before = queue_head(state).duration.copy()
        state, act = decide(sjf, CFG, state, rng)
        candidate = valid_machines(CFG, state) & core.machines_used(state)
        r, _ = np.nonzero(candidate & queue_head(state).has_job[:, None])
        expected.append(queue_head(state).duration[r])
        fifo.append(before[r])
        state, *_ = core.step(CFG, state, act)
    horizon = jobs.max_duration
    expected, fifo = (np.minimum(np.concatenate(v), horizon) / horizon for v in (expected, fifo))
    np.testing.assert_allclose(got, expected)
    assert not np.allclose(got, fifo)  # the pick did move other jobs to the head


def test_only_cases_beyond_requests_are_fitted_and_those_whose_requests_fit_never_exceed() -> None:
    """Requests = peaks here: a case whose requests fit never exceeds, so the default keeps the others only."""
    jobs = _square_jobs(4, 30, seed=8)
    cases = collect_cases(CFG, jobs, make_policy("first_fit"), jobs.max_duration, SMALL, use_labels=False)
    by_requests = cases.x[:, :, FEATURES.index("sum_request_with_head")]
    fits = (by_requests <= 1.0 + 1e-9).all(axis=1)
    assert fits.any() and (~fits).any()
    assert (cases.y[fits] <= 1.0 + 1e-9).all() and (cases.y[~fits] > 1.0 + 1e-9).any()
    beyond = cases.beyond_requests()
    assert len(beyond) == int((~fits).sum()) and np.array_equal(beyond.y, cases.y[~fits])
    ctx = FitContext(
        CFG, _square_jobs(8, 20, seed=2), TuningConfig(fallbacks=("tetris",), seed=0), where="toy"
    )
    rounds = {}
    for fit_cases in ("beyond_requests", "all"):
        fit_machine_peak_rule(ctx, fit_cases, use_labels=False, mcfg=replace(SMALL, fit_cases=fit_cases))
        rounds[fit_cases] = ctx.choices[fit_cases]["machine_peak_model"]["rounds"]
    for a, b in zip(rounds["beyond_requests"], rounds["all"], strict=True):
        assert a["cases"] < a["cases_collected"]
        assert b["cases"] == b["cases_collected"]
    assert rounds["beyond_requests"][0]["cases_collected"] == rounds["all"][0]["cases_collected"]
    assert [r["rule_level"] for r in rounds["all"]] == [None, 0.9]  # SMALL's levels: 0.9 nearest to 0.95
    fit_machine_peak_rule(ctx, "low", use_labels=False, mcfg=replace(SMALL, round_level=0.6))
    assert [r["rule_level"] for r in ctx.choices["low"]["machine_peak_model"]["rounds"]] == [None, 0.5]


def test_the_default_build_is_its_fallback() -> None:
    jobs = _square_jobs(2, 20, seed=6)
    a = _rollout(make_policy("forecast_machine_peak"), jobs)
    b = _rollout(make_policy("tetris"), jobs)
    assert np.array_equal(a.job_machine, b.job_machine)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="levels must be ascending"):
        MachinePeakConfig(levels=(0.9, 0.5))
    with pytest.raises(ValueError, match="round_level must be in"):
        MachinePeakConfig(round_level=1.0)
    with pytest.raises(ValueError, match="calibrate_on must be one of"):
        MachinePeakConfig(calibrate_on="test")
    with pytest.raises(ValueError, match="fit_cases must be one of"):
        MachinePeakConfig(fit_cases="some")
    with pytest.raises(ValueError, match="n_recent"):
        MachinePeakConfig(period_steps=4, n_recent=6)
    with pytest.raises(ValueError, match="no cases"):
        fit_model(Cases(np.zeros((0, 2, 5)), np.zeros((0, 2)), np.zeros(0, dtype=np.int64)), 10, SMALL, False)
    with pytest.raises(ValueError, match="at least 2"):
        fit_model(_stationary_cases(1, 50, seed=0), 10, SMALL, False)
    with pytest.raises(ValueError, match="mode must be one of"):
        MachinePeakPacking(mode="squeeze")
    with pytest.raises(ValueError, match="_ExactBound"):
        MachinePeakPacking(_ExactBound(10), level=0.5)
    with pytest.raises(ValueError, match="epsilon must be in"):
        MachinePeakPacking(_ExactBound(10), level=0.9, epsilon=1.5)
    with pytest.raises(ValueError, match="cost_scale must be a positive"):
        MachinePeakPacking(_ExactBound(10), level=0.9, cost_scale=0.0)
    with pytest.raises(ValueError, match="not both"):
        MachinePeakPacking(_ExactBound(10), level=0.9, epsilon=0.1, cost_scale=1.0)
    with pytest.raises(ValueError, match="cost_scales must be positive"):
        MachinePeakConfig(cost_scales=(1.0, -2.0))
