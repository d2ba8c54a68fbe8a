"""TVW-RL operational metrics on hand-made traces (T = 2 steps, M = 2 machines, D = 1, C = 4)."""

import numpy as np
import pytest

from sim import core, metrics
from sim.config import SimConfig
from sim.jobs import JobBatch


def make(usage, active, background=None, waits=(0,), placed=(True, False), penalties=None):
    usage = np.asarray(usage)[..., None]
    return metrics.EpisodeTrace(
        usage=usage,
        background=np.zeros_like(usage) if background is None else np.asarray(background)[..., None],
        is_active=np.asarray(active, dtype=bool),
        capacity=np.array([4]),
        contention=np.array([0, 4]),
        penalties=np.zeros((usage.shape[0], 5)) if penalties is None else np.asarray(penalties, dtype=float),
        wait_steps=np.asarray(waits),
        is_machine_placed=np.asarray(placed),
        n_unplaced=0,
    )


EP = make(usage=[[2, 0], [3, 1]], active=[[True, False], [True, True]])


def test_avg_util():
    # (2 + 0 + 3 + 1) / (T=2 * max|A|=2 * C=4)
    assert metrics.avg_util(EP, 0) == pytest.approx(6 / 16)


def test_avg_frag():
    # t0: A={0}, U=[2] -> 2/2 = 1; t1: U=[1, 3] -> 3/4; 1 - (1 + 0.75) / 2
    assert metrics.avg_frag(EP, 0) == pytest.approx(0.125)


def test_avg_frag_step_without_unused_units_counts_as_unfragmented():
    ep = make(usage=[[4, 0], [3, 1]], active=[[True, False], [True, True]])
    # t0: no unused unit -> ratio 1; t1: 3/4
    assert metrics.avg_frag(ep, 0) == pytest.approx(0.125)


def test_avg_overshoot_pct_and_noise_in_unused():
    ep = make(usage=[[2, 0], [3, 1]], active=[[True, False], [True, True]], background=[[0, 0], [2, 0]])
    # S: t1 m0 = 3 + 2 - 4 = 1; 100 * 1 / (T=2 * M=2 * C=4)
    assert metrics.avg_overshoot_pct(ep) == pytest.approx(6.25)
    assert metrics.unused_units(ep)[1, :, 0].tolist() == [0, 3]
    assert metrics.avg_util(ep, 0) == pytest.approx(6 / 16)  # noise is not workload usage


def test_counts_and_episode_metrics():
    ep = make(
        usage=[[2, 0], [3, 1]],
        active=[[True, False], [True, True]],
        waits=(0, 3),
        placed=(True, True),
        penalties=[[-1, -2, 0, -50, 0], [-0.4, 0, -30000, 0, 0]],
    )
    assert metrics.machines_used(ep) == 2
    assert metrics.mean_wait(ep) == 1.5
    assert metrics.contention_score(ep) == 4.0
    out = metrics.episode_metrics(ep)
    assert out["episode_return"] == pytest.approx(-30053.4)
    assert out["cost_overshoot"] == 30000.0
    assert out["episode_return"] == pytest.approx(-sum(v for k, v in out.items() if k.startswith("cost_")))
    assert out["is_truncated"] == 0.0
    assert out["avg_util_cpu_frac"] == pytest.approx(6 / 16)
    assert set(out) >= {
        "avg_frag_cpu_frac",
        "avg_overshoot_pct",
        "machines_used",
        "mean_wait_steps",
        "n_steps",
    }


def test_episode_trace_from_a_simulated_episode():
    cfg = SimConfig(n_machines=2, capacity_units=(4,), k_underutil=3.0)
    seq = [
        dict(arrival_step=0, usage=[[2], [3]], ec_label=0),
        dict(arrival_step=1, usage=[[1]], ec_label=0),
    ]
    state = core.reset(cfg, JobBatch.from_jobs([seq], n_resources=1), 0)
    trace = core.make_trace(cfg, 1)
    state, *_ = core.step(cfg, state, [0], trace)  # t=0 closed, job 1 arrives
    state, *_ = core.step(cfg, state, [1], trace)
    ep = metrics.episode_trace(trace, state, 0)
    assert ep.usage[:, :, 0].tolist() == [[2, 0], [3, 1]]
    assert ep.is_active.tolist() == [[True, False], [True, True]]
    assert ep.wait_steps.tolist() == [0, 0]
    assert metrics.avg_util(ep, 0) == pytest.approx(6 / 16)
    assert metrics.avg_frag(ep, 0) == pytest.approx(0.125)
    assert metrics.episode_return(ep) == pytest.approx(state.penalty_totals[0].sum())
    assert metrics.episode_return(ep) == -(2.0**3 + 1.0**3 + 3.0**3)


def test_utilisation_is_clipped_at_capacity_and_overshoot_reported_apart():
    # one machine at 6 of 4 units both steps: served 4 per step, util 1.0 (not 1.5), shortage 2 per step
    ep = make(usage=[[6, 0], [6, 0]], active=[[True, False], [True, False]], placed=(True, False))
    assert metrics.avg_util(ep, 0) == pytest.approx(1.0)
    assert metrics.avg_overshoot_pct(ep) == pytest.approx(100 * 4 / (2 * 2 * 4))


def test_machines_lower_bound_is_the_busiest_step_over_capacity():
    # two jobs of 3 cpu overlap at step 1 (6 of C = 4 -> 2 machines); mem never exceeds one machine
    jobs = JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[3], [3]], ec_label=0),
                dict(arrival_step=1, usage=[[3]], ec_label=0),
            ],
            [dict(arrival_step=0, usage=[[1]], ec_label=0)],
        ],
        n_resources=1,
    )
    assert metrics.machines_lower_bound(jobs, (4,)).tolist() == [2, 1]
