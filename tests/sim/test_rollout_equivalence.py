"""Closing idle steps as one window (vectorised over its steps) gives exactly what closing one step at a time gives,
and the compiled in-place step exactly what the numpy step gives.

A hand-computed episode pins the numbers (hold, an idle gap of several steps with an overshoot inside it, jobs
finishing, the last job's tail); seeded rollouts compare the windowed simulator with the same simulator forced to
close one step per pass (`sim.core._MAX_WINDOW = 1`, the step-by-step loop), array for array, bit for bit.
"""

import dataclasses

import numpy as np
import pytest

from sim import compiled_step, core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.observation import ObservationConfig, encode
from sim.rollout import random_valid_act, rollout

CFG = SimConfig(n_machines=2, capacity_units=(4, 4), history_steps=4, queue_size=2, n_labels=2, max_steps=20)


def hand_jobs() -> JobBatch:
    return JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[2, 1], [3, 1], [3, 1], [3, 1]], ec_label=0),
                dict(arrival_step=0, usage=[[1, 2], [1, 4], [1, 4]], ec_label=1),
                dict(arrival_step=7, usage=[[4, 4], [1, 1], [1, 1]], ec_label=0),
            ]
        ]
    )


def sequential_sum(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total


def run_hand_episode():
    state = core.reset(CFG, hand_jobs(), 0)
    trace = core.make_trace(CFG, 1)
    out = []
    for action in (0, 2, 0, 1):  # place job 0 on m0, hold, place job 1 on m0, place job 2 on m1
        before = state
        state, reward, term, _, info = core.step(CFG, state, np.array([action]), trace)
        out.append((before, state, float(reward[0]), bool(term[0]), info))
    return out, trace


def test_hand_episode_hold_idle_gap_overshoot_and_finish():
    calls, trace = run_hand_episode()
    (_, s1, r1, _, i1), (_, s2, r2, _, i2), (_, s3, r3, _, i3), (_, s4, r4, t4, i4) = calls
    # placing job 0 closes nothing; job 1 still waits
    assert (r1, int(i1["n_steps_closed"][0]), int(s1.t[0])) == (0.0, 0, 0)
    # hold closes step 0: m0 uses (2, 1) of (4, 4): P_U = -(2^3 + 3^3); job 1 waits: P_W = -50
    assert (r2, int(i2["n_steps_closed"][0]), int(s2.t[0])) == (-85.0, 1, 1)
    # job 1 on m0 at t=1 empties the queue: steps 1..6 close in one call until job 2 arrives at 7.
    # step 1: (3,1)+(1,2) = (4,3), overlap 3*1+1*2 = 5, P_U = -1; step 2: (3,1)+(1,4) = (4,5), overlap 7, memory
    # short: both jobs charged once (2 K_o); step 3: the same usage, no new charge; steps 4..6: both finished.
    contention = sequential_sum([-0.1 * 5, -0.1 * 7, -0.1 * 7])
    assert i3["penalty_contention"][0] == contention
    assert (i3["penalty_underutil"][0], i3["penalty_overshoot"][0], i3["penalty_wait"][0]) == (
        -1.0,
        -60000.0,
        0.0,
    )
    assert r3 == contention + -1.0 + -60000.0
    assert (int(i3["n_steps_closed"][0]), int(s3.t[0])) == (6, 7)
    assert s3.has_overshot[0, :2].tolist() == [[False, True], [False, True]]
    # job 2 on m1 at t=7 runs (4,4), (1,1), (1,1): the episode ends when it finishes at 10
    assert (r4, int(i4["n_steps_closed"][0]), int(s4.t[0]), t4) == (-108.0, 3, 10, True)
    assert s4.penalty_totals[0].tolist() == [contention, -144.0, -60000.0, -50.0, 0.0]
    assert trace.usage[0, :4, 0].tolist() == [[2, 1], [4, 3], [4, 5], [4, 5]]
    assert trace.usage[0, 7:10, 1].tolist() == [[4, 4], [1, 1], [1, 1]]
    assert trace.queue_length[0, :10].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert trace.contention[0, :5].tolist() == [0, 5, 7, 7, 0]
    assert trace.penalties[0, 2].tolist() == [-0.1 * 7, 0.0, -60000.0, 0.0, 0.0]


def test_hand_episode_features_show_closed_steps_and_the_current_one():
    calls, _ = run_hand_episode()
    obs = ObservationConfig(labels="true")
    after_hold = calls[1][1]  # t = 1, job 0 on m0 at age 1
    x = encode(CFG, obs, after_hold)[0]
    history = x[: 4 * 2 * 2].reshape(4, 2, 2)
    assert history.tolist() == [
        [[0, 0], [0, 0]],
        [[0, 0], [0, 0]],
        [[0.5, 0.25], [0, 0]],
        [[0.75, 0.25], [0, 0]],
    ]
    by_label = x[16 : 16 + 2 * 2 * 2].reshape(2, 2, 2)
    assert by_label.tolist() == [[[0.75, 0.0], [0.25, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]
    # at t = 7 the last h - 1 closed steps are 4..6 (all idle) and step 3 dropped out; step 3 had (4, 5) on m0
    x7 = encode(CFG, obs, calls[2][1])[0]
    assert not x7[:16].any()
    assert calls[2][1].past[0, 0, 0].tolist() == [1.0, 1.0]  # row 0 is step t - h = 3, clipped at C_d


def step_with_trace(cfg, jobs, seed):
    """Random valid actions (biased towards placing) with a trace; every call's outputs and the final state."""
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    trace = core.make_trace(cfg, jobs.batch_size)
    obs = ObservationConfig(labels="true")
    outs = []
    while not state.is_done.all():
        mask = core.action_mask(cfg, state)
        scores = rng.random(mask.shape) * mask
        scores[:, -1] *= 0.3
        outs.append(encode(cfg, obs, state))
        state, reward, term, trunc, info = core.step(cfg, state, scores.argmax(axis=1), trace, mask=mask)
        outs += [reward, term, trunc, *info.values()]
    final = [v for v in dataclasses.asdict(state).values() if isinstance(v, np.ndarray)]
    traced = [
        trace.usage,
        trace.background,
        trace.is_active,
        trace.queue_length,
        trace.contention,
        trace.penalties,
    ]
    return outs + final + traced


def random_jobs(rng, n_seqs, n_jobs, max_dur, max_units, spread) -> JobBatch:
    seqs = []
    for _ in range(n_seqs):
        arrivals = np.sort(rng.integers(0, spread + 1, size=n_jobs))
        seqs.append(
            [
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(
                        0, max_units + 1, size=(int(rng.integers(1, max_dur + 1)), 2)
                    ).tolist(),
                    ec_label=int(rng.integers(0, 4)),
                )
                for a in arrivals
            ]
        )
    return JobBatch.from_jobs(seqs)


CONFIGS = {
    "hold_always_m3": SimConfig(n_machines=3, max_steps=80, history_steps=3),
    "no_fit_m10": SimConfig(n_machines=10, max_steps=120, hold_rule="no_fit"),
    "overshoot_none": SimConfig(n_machines=2, max_steps=80, placement_check="none", history_steps=5),
    "noise_perturbed_truncated": SimConfig(
        n_machines=2, max_steps=25, noise_max_units=2, is_shape_perturbed=True, history_steps=4
    ),
    "request_m50": SimConfig(n_machines=50, max_steps=100, hold_rule="no_fit", placement_check="request"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_windowed_steps_equal_one_step_at_a_time(name, monkeypatch):
    cfg = CONFIGS[name]
    jobs = random_jobs(np.random.default_rng(7), 5, 14, 9, 5, 40)
    windowed = step_with_trace(cfg, jobs, 3)
    monkeypatch.setattr(core, "_MAX_WINDOW", 1)
    single = step_with_trace(cfg, jobs, 3)
    assert len(windowed) == len(single)
    for a, b in zip(windowed, single, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    rewards = np.concatenate([v for v in windowed if v.dtype == np.float64 and v.ndim == 1])
    assert rewards.min() < 0  # the case is not trivially empty


@pytest.mark.parametrize("hold_rule", ["always", "no_fit"])
def test_rollout_windowed_equals_one_step_at_a_time(hold_rule, monkeypatch):
    cfg = SimConfig(n_machines=10, max_steps=150, hold_rule=hold_rule, history_steps=6)
    jobs = random_jobs(np.random.default_rng(11), 3, 20, 12, 4, 60)
    obs = ObservationConfig(labels="true", queue_request="peak")
    windowed = rollout(cfg, obs, jobs, 4, random_valid_act, seed=5)
    monkeypatch.setattr(core, "_MAX_WINDOW", 1)
    single = rollout(cfg, obs, jobs, 4, random_valid_act, seed=5)
    for field in ("features", "masks", "actions", "rewards", "alive", "penalty_totals", "is_truncated"):
        assert np.array_equal(getattr(windowed, field), getattr(single, field)), field
    assert windowed.rewards.shape[0] < int(jobs.n_jobs.max()) + 150  # idle gaps were skipped, not decided


# The compiled in-place step (`core.step(..., in_place=True)`, `sim.compiled_step`) gives exactly what the numpy
# step gives: every output of every call and every field of the state after it, bit for bit, on random valid
# actions over configurations that reach every branch (holds, several idle windows in one call, noise, shape
# perturbation, overshoots, truncation with jobs left unplaced, K_u = 0), and the `Trace` both fill.


def state_arrays(state: core.State) -> dict[str, np.ndarray]:
    return {k: v for k, v in dataclasses.asdict(state).items() if isinstance(v, np.ndarray)}


def run_steps(cfg: SimConfig, jobs: JobBatch, seed: int, in_place: bool, trace: core.Trace | None = None):
    """Random valid actions (biased towards placing, drawn from `seed` alone, so both runs draw the same): every
    call's outputs and the state's arrays after it."""
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    calls = []
    while not state.is_done.all():
        mask = core.action_mask(cfg, state)
        scores = rng.random(mask.shape) * mask
        scores[:, -1] *= 0.3
        before = state.timeline
        state, reward, term, trunc, info = core.step(
            cfg, state, scores.argmax(axis=1), trace, mask=mask, in_place=in_place
        )
        calls.append(((reward, term, trunc, *info.values()), state_arrays(state), state.timeline is before))
    return calls


COMPILED_CONFIGS = {
    "hold_always_m3": SimConfig(n_machines=3, max_steps=200, history_steps=3),
    "no_fit_m10_long_gaps": SimConfig(n_machines=10, max_steps=400, hold_rule="no_fit"),
    "overshoot_none": SimConfig(n_machines=2, max_steps=200, placement_check="none", history_steps=5),
    "noise_perturbed_truncated": SimConfig(
        n_machines=2, max_steps=25, noise_max_units=2, is_shape_perturbed=True, history_steps=4
    ),
    "request_m50_no_underutil": SimConfig(
        n_machines=50, max_steps=300, hold_rule="no_fit", placement_check="request", k_underutil=0.0
    ),
    "k_u_2_truncated_no_fit": SimConfig(
        n_machines=2, max_steps=30, k_underutil=2.0, hold_rule="no_fit", placement_check="none"
    ),
}


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(COMPILED_CONFIGS))
def test_compiled_step_equals_numpy_step(name, threads, on_threads):
    cfg = COMPILED_CONFIGS[name]
    assert compiled_step.supports(cfg, None)
    calls = on_threads(threads, compiled_step, "_kernel_parallel")
    jobs = random_jobs(np.random.default_rng(7), 6, 16, 9, 6, 300 if "gaps" in name else 40)
    traces = [core.make_trace(cfg, jobs.batch_size) for _ in range(2)]
    numpy_calls = run_steps(cfg, jobs, 3, False, traces[0])
    compiled_calls = run_steps(cfg, jobs, 3, True, traces[1])
    assert calls["_kernel_parallel"] > 0  # one span on the caller's side, one per thread on numba's
    for a, b in zip(dataclasses.astuple(traces[0]), dataclasses.astuple(traces[1]), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
        assert np.array_equal(np.signbit(a), np.signbit(b))  # -0.0 where the numpy step writes -0.0
    assert len(numpy_calls) == len(compiled_calls)
    for (out_a, state_a, shared_a), (out_b, state_b, shared_b) in zip(
        numpy_calls, compiled_calls, strict=True
    ):
        assert not shared_a and shared_b  # the numpy step copied; the compiled one wrote in place
        for a, b in zip(out_a, out_b, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            assert state_a[key].dtype == state_b[key].dtype and np.array_equal(state_a[key], state_b[key]), (
                key
            )
    totals = compiled_calls[-1][1]["penalty_totals"]
    closed = np.concatenate([out[8] for out, _, _ in compiled_calls])  # info's n_steps_closed
    # the cases are not trivially empty: penalties charged, and (per config) idle windows or truncation reached
    assert totals.sum() < 0
    if "gaps" in name:  # one call closed several windows (a window is at most the ring's width)
        assert closed.max() > jobs.max_duration
    if "truncated" in name:
        assert compiled_calls[-1][1]["is_truncated"].any() and (totals[:, 4] < 0).any()
    if "overshoot" in name or "truncated" in name:
        assert (totals[:, 2] < 0).any()


def test_unsupported_configurations_take_the_numpy_step():
    jobs = random_jobs(np.random.default_rng(1), 2, 6, 5, 4, 10)
    cfg = SimConfig(n_machines=3, max_steps=100, k_underutil=2.5)
    assert not compiled_step.supports(cfg, None)
    calls = run_steps(cfg, jobs, 0, in_place=True)
    assert not any(shared for _, _, shared in calls)
    reference = run_steps(cfg, jobs, 0, in_place=False)
    assert np.array_equal(calls[-1][1]["penalty_totals"], reference[-1][1]["penalty_totals"])
