"""The agent's observation: only what a real scheduler knows, network-ready, and the lock-step rollout."""

import dataclasses

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.labelling import TrueLabeller
from sim.observation import ObservationConfig, encode, feature_layout, n_features
from sim.rollout import random_valid_act, returns_to_go, rollout, time_baseline

CFG = SimConfig(n_machines=2, capacity_units=(4, 4), history_steps=3, n_labels=3, queue_size=2)
TRUE = ObservationConfig(labels="true")


def _jobs(first_usage, meta=None):
    """Job a runs on machine 0 from step 0; job b arrives at 1 and waits in the queue."""
    a = dict(arrival_step=0, usage=first_usage, ec_label=2, workload_id="a")
    b = dict(arrival_step=1, usage=[[1, 1]] * 4, ec_label=1, workload_id="b")
    if meta is not None:
        a["meta"], b["meta"] = meta, meta
    return JobBatch.from_jobs([[a, b]])


def _blocks(cfg, x):
    out, offset = {}, 0
    for name, shape in feature_layout(cfg).items():
        size = int(np.prod(shape))
        out[name] = x[:, offset : offset + size].reshape(-1, *shape)
        offset += size
    return out


def _after_one_step(jobs):
    state = core.reset(CFG, jobs, 0)
    state, *_ = core.step(CFG, state, [0])  # a on machine 0; queue empty -> step 0 closes, b arrives at 1
    return state


def test_features_are_scaled_and_laid_out_with_the_current_step_last():
    state = _after_one_step(_jobs([[2, 1], [3, 1], [4, 4], [1, 1]]))
    x = encode(CFG, TRUE, state)
    assert x.shape == (1, n_features(CFG)) and x.dtype == np.float32
    assert (x >= 0).all() and (x <= 1).all()
    b = _blocks(CFG, x)
    # machine 0, cpu: step -1 (before the start) 0, step 0 used 2 of 4, now (t = 1) 3 of 4
    assert b["history"][0, :, 0, 0].tolist() == pytest.approx([0.0, 0.5, 0.75])
    assert b["by_label"][0, 0, 0].tolist() == pytest.approx([0.0, 0.0, 0.75])  # label 2 runs there now
    assert b["queue"][0, 0, :3].tolist() == [0.0, 1.0, 0.0]  # b's label one-hot
    assert b["queue"][0, 1].sum() == 0  # empty slot


def test_the_future_of_a_job_never_reaches_the_features():
    # the same past and present (2 then 3 units) but a different future (4 vs 1 units at step 2)
    early = encode(CFG, TRUE, _after_one_step(_jobs([[2, 1], [3, 1], [4, 4], [1, 1]])))
    other = encode(CFG, TRUE, _after_one_step(_jobs([[2, 1], [3, 1], [1, 1], [1, 1]])))
    assert np.array_equal(early, other)
    # the queue shows the trace's request (meta), not the waiting job's peak
    meta = (0.3, 0.6, None, None)
    x = _blocks(CFG, encode(CFG, TRUE, _after_one_step(_jobs([[2, 1]] * 4, meta))))
    assert x["queue"][0, 0, 3:].tolist() == pytest.approx([0.3, 0.6, 1.0])
    x = _blocks(CFG, encode(CFG, TRUE, _after_one_step(_jobs([[2, 1]] * 4))))
    assert x["queue"][0, 0, 3:].tolist() == [0.0, 0.0, 0.0]  # no trace request known: flag 0
    peak = ObservationConfig(labels="true", queue_request="peak")
    x = _blocks(CFG, encode(CFG, peak, _after_one_step(_jobs([[2, 1]] * 4))))
    assert x["queue"][0, 0, 3:].tolist() == pytest.approx([0.25, 0.25, 1.0])  # the oracle ablation


def test_predicted_labels_are_the_default_and_must_come_from_a_labeller():
    state = _after_one_step(_jobs([[2, 1]] * 4))
    with pytest.raises(ValueError, match="no labeller has set them"):
        encode(CFG, ObservationConfig(), state)
    labelled = core.relabel(CFG, state, np.array([[0, 0]]))
    assert _blocks(CFG, encode(CFG, ObservationConfig(), labelled))["queue"][0, 0, :3].tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="queue_request"):
        ObservationConfig(queue_request="future")


def _random_jobs(rng, n_seq):
    return JobBatch.from_jobs(
        [
            [
                dict(
                    arrival_step=int(rng.integers(0, 6)),
                    usage=rng.integers(1, 4, size=(int(rng.integers(1, 6)), 2)).tolist(),
                    ec_label=int(rng.integers(0, 3)),
                )
                for _ in range(6)
            ]
            for _ in range(n_seq)
        ]
    )


def test_rollout_is_lockstep_without_autoreset_and_rewards_add_up():
    cfg = dataclasses.replace(CFG, n_machines=3)
    jobs = _random_jobs(np.random.default_rng(0), 3)
    out = rollout(cfg, TRUE, jobs, 4, random_valid_act, seed=5)
    n_k, n_e = out.actions.shape
    assert n_e == 12 and out.features.shape == (n_k, 12, n_features(cfg))
    assert np.allclose(out.episode_returns, out.penalty_totals.sum(axis=1))
    # once an env is done it stays done (no autoreset) and earns nothing
    assert (np.diff(out.alive.astype(int), axis=0) <= 0).all()
    assert (out.rewards[~out.alive] == 0).all()
    # every action taken by a live env was valid
    k, e = np.nonzero(out.alive)
    assert out.masks[k, e, out.actions[k, e]].all()
    again = rollout(cfg, TRUE, jobs, 4, random_valid_act, seed=5)
    assert np.array_equal(out.actions, again.actions)
    with pytest.raises(ValueError, match="needs a labeller"):
        rollout(cfg, ObservationConfig(), jobs, 2, random_valid_act, seed=0)
    labelled = rollout(cfg, ObservationConfig(), jobs, 2, random_valid_act, seed=0, labeller=TrueLabeller())
    assert labelled.actions.shape[1] == 6


def test_time_baseline_is_the_mean_return_of_the_sequence_trajectories_alive_at_each_step():
    rewards = np.array([[-1.0, -3.0, -2.0, -2.0], [-1.0, 0.0, -4.0, -6.0]])
    alive = np.array([[True, True, True, True], [True, False, True, True]])
    v = returns_to_go(rewards)
    assert v.tolist() == [[-2.0, -3.0, -6.0, -8.0], [-1.0, 0.0, -4.0, -6.0]]
    b = time_baseline(v, alive, n_trajectories=2)
    # sequence 0 = envs 0, 1; sequence 1 = envs 2, 3; at k = 1 env 1 is done
    assert b.tolist() == [[-2.5, -2.5, -7.0, -7.0], [-1.0, -1.0, -5.0, -5.0]]
