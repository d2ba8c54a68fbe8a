"""The compiled in-place step (`core.step(..., in_place=True)`, `sim.compiled_step`) gives exactly what the numpy step
gives: every output of every call and every field of the state after it, bit for bit, on random valid actions over
configurations that reach every branch (holds, several idle windows in one call, noise, shape perturbation,
overshoots, truncation with jobs left unplaced, K_u = 0), and the `Trace` both fill."""

import dataclasses

import numpy as np
import pytest

from sim import compiled_step, core
from sim.config import SimConfig
from sim.jobs import JobBatch


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


def state_arrays(state: core.State) -> dict[str, np.ndarray]:
    return {k: v for k, v in dataclasses.asdict(state).items() if isinstance(v, np.ndarray)}


def run(cfg: SimConfig, jobs: JobBatch, seed: int, in_place: bool, trace: core.Trace | None = None):
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


CONFIGS = {
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


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_compiled_step_equals_numpy_step(name):
    cfg = CONFIGS[name]
    assert compiled_step.supports(cfg, None)
    jobs = random_jobs(np.random.default_rng(7), 6, 16, 9, 6, 300 if "gaps" in name else 40)
    traces = [core.make_trace(cfg, jobs.batch_size) for _ in range(2)]
    numpy_calls = run(cfg, jobs, 3, False, traces[0])
    compiled_calls = run(cfg, jobs, 3, True, traces[1])
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
    calls = run(cfg, jobs, 0, in_place=True)
    assert not any(shared for _, _, shared in calls)
    reference = run(cfg, jobs, 0, in_place=False)
    assert np.array_equal(calls[-1][1]["penalty_totals"], reference[-1][1]["penalty_totals"])
