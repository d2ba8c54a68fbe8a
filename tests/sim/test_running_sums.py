"""Per-machine sums carried between a rollout's decisions (`sim.running_sums`): equal to a recount at every
decision (recall included), recounted on a state from another branch, and the same episodes as without them."""

from __future__ import annotations

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.forecast import ForecastCache, RecallOverlay
from sim.jobs import JobBatch
from sim.policies import make_policy, own_jobs, promote_queued_job
from sim.risk import PersistenceForecaster, RiskAwarePacking, RiskConfig, head_bounds
from sim.running_sums import RunningSums, reads_other_runs
from sim.tuning import sequence_returns

CFG = SimConfig(n_machines=4, max_steps=400)


def _recurring_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Jobs drawn from 4 square-wave templates, re-submitted (recall finds earlier runs), with a gap now and then
    so that time advances between decisions; one template is a one-step job (a run that ends as it starts)."""
    rng = np.random.default_rng(seed)
    templates = []
    for k in range(4):
        dur, period, hi = int(rng.integers(6, 20)), int(rng.integers(3, 7)), int(rng.integers(2, 5))
        dur = 1 if k == 0 else dur
        templates.append([[hi if a % period == 0 else 1, 1] for a in range(dur)])

    def job(t: int, k: int) -> dict:
        return {"arrival_step": t, "usage": templates[k], "ec_label": k, "workload_id": f"w{k}"}

    arrivals = np.cumsum(rng.integers(0, 3, (n_rows, n_jobs)), axis=1)  # 0-2 steps apart
    kinds = rng.integers(0, 4, (n_rows, n_jobs))
    return JobBatch.from_jobs(
        [
            [job(int(t), int(k)) for t, k in zip(a, w, strict=True)]
            for a, w in zip(arrivals, kinds, strict=True)
        ]
    )


class _Levels:
    """A forecaster with a level axis (not a point forecaster): the (mu, delta, delta^2) path."""

    def __init__(self, inner, spread: float = 1.0) -> None:
        self.inner, self.horizon, self.spread = inner, inner.horizon, spread
        self.levels = inner.levels

    def forecast(self, cfg, state, env, job):
        out = self.inner.forecast(cfg, state, env, job).copy()
        out[:, -2:] += self.spread  # the upper levels above the median
        return out


def test_which_forecasters_read_other_runs() -> None:
    assert reads_other_runs(RecallOverlay(PersistenceForecaster()))
    assert reads_other_runs(RecallOverlay(ForecastCache(PersistenceForecaster())))
    assert not reads_other_runs(ForecastCache(PersistenceForecaster()))
    assert not reads_other_runs(PersistenceForecaster())


@pytest.mark.parametrize("recall", [True, False])
@pytest.mark.parametrize("point", [True, False])
def test_carried_bounds_equal_a_recount_at_every_decision(recall: bool, point: bool) -> None:
    inner = PersistenceForecaster(horizon=12)
    forecaster = inner if point else _Levels(inner)
    forecaster = RecallOverlay(forecaster) if recall else forecaster
    rcfg = RiskConfig(level=0.95, rho=0.5, min_observed=2)
    memo, rng = RunningSums(), np.random.default_rng(0)
    picker = make_policy("deeprm_sjf")
    state = own_jobs(core.reset(CFG, _recurring_jobs(4, 40, seed=1), 0))
    n_decisions = 0
    while not state.is_done.all() and n_decisions < 300:
        state = promote_queued_job(state, np.where(state.is_done, 0, picker.pick_job(CFG, state, rng)), True)
        rows = np.flatnonzero(rng.random(state.batch_size) < 0.7)  # a subset, as "deviate" asks
        carried = head_bounds(CFG, state, forecaster, rcfg, rows, memo)
        np.testing.assert_allclose(carried, head_bounds(CFG, state, forecaster, rcfg, rows), rtol=1e-12)
        action = picker.act(CFG, state, rng)
        state, *_ = core.step(CFG, state, action)
        n_decisions += 1
    assert n_decisions > 50 and memo.n_carried > 100  # decisions at an unchanged step carried earlier sums


def test_a_state_of_another_branch_is_recounted() -> None:
    """Two branches of one episode at the same step, with the same batch, place the head on other machines: the
    second branch's bounds are its own, not the first's plus nothing."""
    forecaster = PersistenceForecaster(horizon=12)
    rcfg = RiskConfig(level=0.95)
    jobs = _recurring_jobs(2, 30, seed=2)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    tetris = make_policy("tetris")
    for _ in range(12):
        state, *_ = core.step(CFG, state, tetris.act(CFG, state, rng))
    mask = core.action_mask(CFG, state)
    free = [m for m in range(CFG.n_machines) if mask[:, m].all()]
    assert len(free) >= 2
    memo = RunningSums()
    for m in free[:2]:
        branch, *_ = core.step(CFG, state, np.full(state.batch_size, m))
        np.testing.assert_array_equal(
            head_bounds(CFG, branch, forecaster, rcfg, None, memo), head_bounds(CFG, branch, forecaster, rcfg)
        )


def test_a_rule_decides_the_same_episodes_with_the_carried_sums(monkeypatch) -> None:
    """The risk rule on recall over a forecaster with levels (the path that is not flat), whole episodes with
    and without the carried sums: the same returns."""
    from sim import risk, running_sums

    rule = RiskAwarePacking(
        RecallOverlay(_Levels(PersistenceForecaster(horizon=12))),
        make_policy("deeprm_sjf"),
        RiskConfig(level=0.95, rho=0.5, mode="pack"),
    )
    jobs = _recurring_jobs(6, 40, seed=3)
    assert running_sums.for_thread(("k",), rule.forecaster) is running_sums.for_thread(
        ("k",), rule.forecaster
    )
    with_memo = sequence_returns(rule, CFG, jobs, 0)
    monkeypatch.setattr(risk.running_sums, "for_thread", lambda key, owner: None)
    without = sequence_returns(rule, CFG, jobs, 0)
    np.testing.assert_array_equal(with_memo, without)


def test_an_env_where_a_new_run_shares_a_started_workload_is_flagged() -> None:
    from sim.running_sums import _new_run_of_a_started_workload

    jobs = _recurring_jobs(3, 12, seed=4)
    state = core.reset(CFG, jobs, 0)
    codes = jobs.workload_code
    machine = np.full(codes.shape, -1)
    machine[:, :2] = 0  # jobs 0 and 1 started in every env
    new = np.zeros(codes.shape, dtype=bool)
    partner = [int(np.flatnonzero(codes[b, 2:] == codes[b, 0])[0]) + 2 for b in range(2)]
    for b, j in zip(range(2), partner, strict=True):  # envs 0, 1: a new run of job 0's workload
        machine[b, j], new[b, j] = 1, True
    other = int(np.flatnonzero(~np.isin(codes[2, 2:], codes[2, :2]))[0]) + 2
    machine[2, other], new[2, other] = 1, True  # env 2: a new run of a workload not started before
    state = core.State(**{**state.__dict__, "job_machine": machine, "job_start": np.zeros_like(machine)})
    flagged = _new_run_of_a_started_workload(state, np.arange(3), new)
    assert flagged.tolist() == [True, True, False]


def test_a_one_step_run_placed_since_is_recalled_by_an_earlier_job_and_the_env_recounted() -> None:
    """Job A of workload w and a one-step job B of w start at the same step: once B is placed, A (observed as
    far as B) recalls B's end, so A's forecast drops to 0; the carried sums must see that (the env recounted)."""
    a = {"arrival_step": 0, "usage": [[2, 1], [3, 1], [3, 1], [3, 1]], "ec_label": 0, "workload_id": "w"}
    b = {"arrival_step": 0, "usage": [[2, 1]], "ec_label": 0, "workload_id": "w"}
    c = {"arrival_step": 0, "usage": [[1, 1]] * 3, "ec_label": 1, "workload_id": "v"}
    jobs = JobBatch.from_jobs([[a, b, c]])
    forecaster = RecallOverlay(PersistenceForecaster(horizon=6))
    rcfg = RiskConfig(level=0.95)
    memo = RunningSums()
    state = core.reset(CFG, jobs, 0)
    state, *_ = core.step(CFG, state, np.array([0]))  # A on machine 0
    head_bounds(CFG, state, forecaster, rcfg, None, memo)  # A counted
    state, *_ = core.step(CFG, state, np.array([1]))  # B on machine 1, same step
    carried = head_bounds(CFG, state, forecaster, rcfg, None, memo)
    recount = head_bounds(CFG, state, forecaster, rcfg)
    np.testing.assert_array_equal(carried, recount)
    assert carried[0, 0, 1:, 0].max() <= 1.0  # A's recalled end: machine 0 holds only C's usage from t + 2 on
