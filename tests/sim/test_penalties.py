"""TVW-RL penalties on tiny hand-computed clusters (one resource unless said otherwise)."""

import numpy as np
import pytest

from sim import core, penalties
from sim.config import SimConfig
from sim.jobs import JobBatch

HOLD1 = 1  # hold action with one machine


def one_resource(usages, arrivals=None, labels=None):
    arrivals = arrivals or [0] * len(usages)
    labels = labels or [0] * len(usages)
    seq = [
        dict(arrival_step=a, usage=[[u] for u in prof], ec_label=lab)
        for a, prof, lab in zip(arrivals, usages, labels, strict=True)
    ]
    return JobBatch.from_jobs([seq], n_resources=1)


def only(**weights):
    base = dict(k_contention=0.0, k_underutil=0.0, k_overshoot=0.0, k_wait=0.0)
    base.update(weights)
    return base


def test_contention_score_reference_pair():
    assert penalties.contention_score([np.array([1, 2]), np.array([2, 1])], [0, 0]) == 4.0
    assert penalties.contention_score([np.array([1, 2, 3]), np.array([2, 1])], [0, 1]) == 2 * 2 + 3 * 1


def test_contention_penalty_two_jobs_same_start_is_minus_0_4():
    cfg = SimConfig(n_machines=1, capacity_units=(8,), **only(k_contention=0.1))
    state = core.reset(cfg, one_resource([[1, 2], [2, 1]]), 0)
    state, r1, *_ = core.step(cfg, state, [0])
    state, r2, term, _, info = core.step(cfg, state, [0])  # queue empties: runs to the end
    assert r1[0] == 0.0
    assert info["penalty_contention"][0] == pytest.approx(-0.4)
    assert term[0]


def test_contention_is_credited_when_the_overlap_is_realised():
    cfg = SimConfig(n_machines=1, capacity_units=(8,), **only(k_contention=0.1))
    state = core.reset(cfg, one_resource([[1, 2, 3], [2, 1]], arrivals=[0, 1]), 0)
    trace = core.make_trace(cfg, 1)
    state, *_ = core.step(cfg, state, [0], trace)  # A at t=0, queue empty -> closes t=0
    state, *_ = core.step(cfg, state, [0], trace)  # B at t=1, runs to the end
    np.testing.assert_allclose(trace.penalties[0, :3, 0], [0.0, -0.4, -0.3])
    np.testing.assert_array_equal(trace.contention[0, :3], [0, 4, 3])
    assert state.penalty_totals[0, 0] == pytest.approx(-0.1 * 7)


def test_underutil_counts_only_used_machines_in_raw_units():
    cfg = SimConfig(n_machines=2, capacity_units=(8,), **only(k_underutil=3.0))
    state = core.reset(cfg, one_resource([[1, 2], [2, 1]]), 0)
    state, *_ = core.step(cfg, state, [0])
    state, reward, *_ = core.step(cfg, state, [0])
    # machine 0 uses 3 of 8 units in both steps: 2 * 5^3; machine 1 is unused and not charged
    assert reward[0] == -2 * 125.0


def test_underutil_two_resources_sum_over_d():
    cfg = SimConfig(n_machines=1, capacity_units=(8, 8), **only(k_underutil=3.0))
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[6, 4]], ec_label=0)]])
    state = core.reset(cfg, jobs, 0)
    _, reward, *_ = core.step(cfg, state, [0])
    assert reward[0] == -(2.0**3 + 4.0**3)


def test_overshoot_charged_once_per_workload_and_resource():
    cfg = SimConfig(n_machines=1, capacity_units=(4,), **only(k_overshoot=30000.0))
    state = core.reset(cfg, one_resource([[3, 3, 3], [1, 2, 2]]), 0)
    trace = core.make_trace(cfg, 1)
    state, *_ = core.step(cfg, state, [0], trace)
    state, reward, term, *_ = core.step(cfg, state, [0], trace)
    # t=0: 4 units, fine; t=1: 5 > 4, both jobs overshoot first time; t=2: 5 > 4 again, no new charge
    np.testing.assert_allclose(trace.penalties[0, :3, 2], [0.0, -60000.0, 0.0])
    assert state.penalty_totals[0, 2] == -60000.0
    assert state.has_overshot[0, :2, 0].all()
    assert term[0]


def test_wait_penalty_three_waiting_jobs_is_minus_150():
    cfg = SimConfig(n_machines=1, capacity_units=(8,), **only(k_wait=50.0))
    state = core.reset(cfg, one_resource([[1], [1], [1]]), 0)
    state, reward, _, _, info = core.step(cfg, state, [HOLD1])
    assert reward[0] == -150.0
    assert info["penalty_wait"][0] == -150.0
    assert info["n_steps_closed"][0] == 1


def test_underutil_exponent_zero_switches_the_penalty_off():
    # K_u = 0 means "no under-utilisation penalty" (TVW-RL Table 3), not 0^0 = 1 per used machine
    cfg = SimConfig(n_machines=2, capacity_units=(2,), **only())
    state = core.reset(cfg, one_resource([[1, 1]]), 0)
    _, reward, _, _, info = core.step(cfg, state, [0])
    assert reward[0] == 0.0


def test_penalty_functions_directly():
    unused = np.array([[[2], [5]]])
    np.testing.assert_allclose(penalties.underutil_penalty(unused, np.array([[True, False]]), 3.0), [-8.0])
    np.testing.assert_allclose(penalties.wait_penalty(np.array([3, 0]), 50.0), [-150.0, 0.0])
    np.testing.assert_allclose(penalties.overshoot_penalty(np.array([2]), 30000.0), [-60000.0])
    np.testing.assert_allclose(penalties.contention_penalty(np.array([4]), 0.1), [-0.4])
