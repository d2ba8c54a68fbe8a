"""Batched simulator core: dynamics, masks, observation, purity, batching, determinism, errors."""

import dataclasses

import numpy as np
import polars as pl
import pytest

from sim import core, penalties
from sim.config import SimConfig
from sim.jobs import JobBatch


def random_jobs(rng, n_seqs, n_jobs=6, max_dur=6, max_units=4, spread=6):
    seqs = []
    for _ in range(n_seqs):
        seqs.append(
            [
                dict(
                    arrival_step=int(rng.integers(0, spread)),
                    usage=rng.integers(
                        0, max_units + 1, size=(int(rng.integers(1, max_dur + 1)), 2)
                    ).tolist(),
                    ec_label=int(rng.integers(0, 8)),
                )
                for _ in range(n_jobs)
            ]
        )
    return JobBatch.from_jobs(seqs)


def random_valid(mask, rng):
    return np.array([rng.choice(np.flatnonzero(row)) for row in mask])


def snapshot(state):
    return {f: (np.copy(v) if isinstance(v, np.ndarray) else v) for f, v in dataclasses.asdict(state).items()}


def test_two_placements_within_one_step_then_time_advances():
    cfg = SimConfig(n_machines=2, capacity_units=(8, 8))
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]] * 3, ec_label=0)] * 2])
    state = core.reset(cfg, jobs, 0)
    state, _, _, _, info = core.step(cfg, state, [0])
    assert state.t[0] == 0 and state.next_job[0] == 1 and info["n_steps_closed"][0] == 0
    state, _, term, _, info = core.step(cfg, state, [1])
    # queue empty: runs the remaining 3 steps of both jobs and terminates
    assert info["n_steps_closed"][0] == 3 and term[0] and state.t[0] == 3


def test_reset_skips_to_first_arrival_and_empty_sequence_is_done():
    cfg = SimConfig(n_machines=1)
    jobs = JobBatch.from_jobs([[dict(arrival_step=4, usage=[[1, 1]], ec_label=0)], []])
    state = core.reset(cfg, jobs, 0)
    assert state.t.tolist() == [4, 0]
    assert state.is_terminated.tolist() == [False, True]
    assert core.action_mask(cfg, state).tolist() == [[True, True], [False, True]]


def test_mask_first_step_rule_and_hold_always_valid():
    cfg = SimConfig(n_machines=2, capacity_units=(4, 4))
    jobs = JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[3, 1], [1, 1]], ec_label=0),
                dict(arrival_step=0, usage=[[2, 1]], ec_label=1),
            ]
        ]
    )
    state, *_ = core.step(cfg, core.reset(cfg, jobs, 0), [0])
    # machine 0 has 1 free cpu unit now, the head needs 2 in its first step
    assert core.action_mask(cfg, state).tolist() == [[False, True, True]]
    req_cfg = dataclasses.replace(cfg, placement_check="request")
    none_cfg = dataclasses.replace(cfg, placement_check="none")
    assert core.action_mask(req_cfg, state).tolist() == [[False, True, True]]
    assert core.action_mask(none_cfg, state).tolist() == [[True, True, True]]


def test_invalid_action_raises_naming_env_and_action_or_holds():
    cfg = SimConfig(n_machines=2, capacity_units=(4, 4))
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[4, 4]], ec_label=0)] * 2] * 2)
    state, *_ = core.step(cfg, core.reset(cfg, jobs, 0), [0, 0])
    with pytest.raises(ValueError, match=r"env 1: action 0 is invalid"):
        core.step(cfg, state, [1, 0])
    with pytest.raises(ValueError, match=r"env 0: action 3 outside 0..2"):
        core.step(cfg, state, [3, 2])
    hold_cfg = dataclasses.replace(cfg, invalid_action="hold")
    new, _, _, _, info = core.step(hold_cfg, state, [0, 1])
    assert info["is_placed"].tolist() == [False, True]
    assert new.next_job.tolist() == [1, 2]  # env 0 held (t advanced), env 1 placed its last job


def test_oversized_job_raises_with_sequence_and_job_or_is_clipped():
    cfg = SimConfig(n_machines=1, capacity_units=(4, 4))
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1], [5, 1]], ec_label=0, workload_id="w7")]])
    with pytest.raises(
        ValueError, match=r"job 0 \(workload w7\): usage \[5, 1\] units exceeds machine capacity"
    ):
        core.reset(cfg, jobs, 0)
    state = core.reset(dataclasses.replace(cfg, oversize="clip"), jobs, 0)
    assert state.n_clipped.tolist() == [2]  # one usage step and the request
    assert state.jobs.usage[0, 0, :, 0].tolist() == [1, 4]


def test_label_outside_n_labels_raises():
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]], ec_label=8)]])
    with pytest.raises(ValueError, match="ec_label 8 outside 0..7"):
        core.reset(SimConfig(n_labels=8), jobs, 0)


def test_step_does_not_mutate_input_state():
    rng = np.random.default_rng(1)
    cfg = SimConfig(n_machines=3, noise_max_units=1)
    state = core.reset(cfg, random_jobs(rng, 4), 0)
    for _ in range(5):
        before = snapshot(state)
        new, *_ = core.step(cfg, state, random_valid(core.action_mask(cfg, state), rng))
        after = snapshot(state)
        for name, value in before.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, after[name], err_msg=name)
        state = new


def run_episode(cfg, jobs, seed, policy_seed, with_trace=False, max_calls=10_000):
    rng = np.random.default_rng(policy_seed)
    state = core.reset(cfg, jobs, seed)
    trace = core.make_trace(cfg, jobs.batch_size) if with_trace else None
    rewards, obs = [], []
    for _ in range(max_calls):
        if state.is_done.all():
            break
        ob = core.observe(cfg, state)
        obs.append(ob)
        state, reward, *_ = core.step(cfg, state, random_valid(ob["action_mask"].astype(bool), rng), trace)
        rewards.append(reward)
    return state, np.array(rewards), obs, trace


def test_random_valid_policy_always_ends_episodes_and_trace_matches_totals():
    rng = np.random.default_rng(2)
    cfg = SimConfig(n_machines=3, capacity_units=(6, 6), max_steps=500, noise_max_units=2)
    jobs = random_jobs(rng, 16, n_jobs=8)
    state, rewards, _, trace = run_episode(cfg, jobs, 3, 4, with_trace=True)
    assert state.is_terminated.all()
    assert (state.next_job == jobs.n_jobs).all()
    np.testing.assert_allclose(trace.penalties.sum(axis=1), state.penalty_totals)
    np.testing.assert_allclose(rewards.sum(axis=0), state.penalty_totals.sum(axis=1))


def test_truncation_at_max_steps():
    cfg = SimConfig(n_machines=1, max_steps=3)
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]] * 10, ec_label=0)]])
    state, *_ = core.step(cfg, core.reset(cfg, jobs, 0), [0])
    assert state.is_truncated[0] and not state.is_terminated[0] and state.t[0] == 3


def test_episode_contention_equals_pairwise_inner_products():
    rng = np.random.default_rng(5)
    cfg = SimConfig(n_machines=2, capacity_units=(8, 8), placement_check="none", max_steps=500)
    jobs = random_jobs(rng, 3, n_jobs=7)
    state, _, _, trace = run_episode(cfg, jobs, 0, 1, with_trace=True)
    for b in range(3):
        expected = 0.0
        for m in range(2):
            on_m = np.flatnonzero(state.job_machine[b] == m)
            for d in range(2):
                profs = [jobs.usage[b, j, : jobs.duration[b, j], d] for j in on_m]
                expected += penalties.contention_score(profs, list(state.job_start[b, on_m]))
        assert trace.contention[b].sum() == expected


def test_batched_env_equals_single_envs_side_by_side():
    rng = np.random.default_rng(6)
    cfg = SimConfig(
        n_machines=3, capacity_units=(6, 6), noise_max_units=2, is_shape_perturbed=True, max_steps=60
    )
    jobs = random_jobs(rng, 5, max_units=5)
    seeds = [11, 12, 13, 14, 15]
    batched = core.reset(cfg, jobs, seeds)
    singles = [core.reset(cfg, jobs.select([b]), [seeds[b]]) for b in range(5)]
    for _ in range(40):
        actions = random_valid(core.action_mask(cfg, batched), rng)
        obs_b = core.observe(cfg, batched)
        batched, reward_b, term_b, trunc_b, _ = core.step(cfg, batched, actions)
        for b in range(5):
            obs_s = core.observe(cfg, singles[b])
            for key in obs_b:
                np.testing.assert_array_equal(obs_b[key][b], obs_s[key][0], err_msg=key)
            singles[b], reward_s, term_s, trunc_s, _ = core.step(cfg, singles[b], actions[b : b + 1])
            assert reward_b[b] == reward_s[0]
            assert (term_b[b], trunc_b[b]) == (term_s[0], trunc_s[0])


def test_same_seed_same_rollout_and_other_seed_differs():
    rng = np.random.default_rng(7)
    cfg = SimConfig(n_machines=3, noise_max_units=3, is_shape_perturbed=True, max_steps=80)
    jobs = random_jobs(rng, 4)
    _, r1, o1, _ = run_episode(cfg, jobs, 42, 0)
    _, r2, o2, _ = run_episode(cfg, jobs, 42, 0)
    np.testing.assert_array_equal(r1, r2)
    for a, b in zip(o1, o2, strict=True):
        np.testing.assert_array_equal(a["machines"], b["machines"])
    _, r3, _, _ = run_episode(cfg, jobs, 43, 0)
    assert r1.shape != r3.shape or not np.array_equal(r1, r3)


def test_observation_image_queue_and_scheduled_column():
    cfg = SimConfig(n_machines=2, capacity_units=(4, 4), history_steps=3, queue_size=1, max_instances=2)
    seq = [
        dict(arrival_step=0, usage=[[1, 2], [2, 1]], ec_label=1),
        dict(arrival_step=0, usage=[[2, 1], [1, 1]], ec_label=1),
        dict(arrival_step=0, usage=[[1, 1]], ec_label=2),
        dict(arrival_step=0, usage=[[3, 3]], ec_label=0),
    ]
    state = core.reset(cfg, JobBatch.from_jobs([seq]), 0)
    state, *_ = core.step(cfg, state, [0])
    state, *_ = core.step(cfg, state, [0])
    obs = core.observe(cfg, state)
    # label 1 shade 0 -> 1 + 1*2 + 0 = 3; second instance shade 1 -> 4; rows t-2, t-1 empty
    assert obs["machines"][0, 0, 0].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [3, 4, 4, 0]]
    assert obs["machines"][0, 0, 1].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [3, 3, 4, 0]]
    assert obs["machines"][0, 1].sum() == 0
    assert obs["scheduled"].tolist() == [[2, 0]]
    assert obs["queue"].tolist() == [[[3, 1, 1]]]  # label 2 + 1, request (1, 1)
    assert obs["backlog"].tolist() == [1]
    assert obs["action_mask"].tolist() == [[1, 1, 1]]
    state, *_ = core.step(cfg, state, [2])  # hold: t = 1
    obs = core.observe(cfg, state)
    assert obs["machines"][0, 0, 0, 1:].tolist() == [[3, 4, 4, 0], [3, 3, 4, 0]]
    assert obs["scheduled"].tolist() == [[0, 0]]


def test_noise_pixels_follow_workload_pixels():
    cfg = SimConfig(n_machines=1, capacity_units=(4, 4), history_steps=1, noise_max_units=3)
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]], ec_label=0)] * 2])
    state, *_ = core.step(cfg, core.reset(cfg, jobs, 0), [0])
    row = core.observe(cfg, state)["machines"][0, 0, 0, 0]
    noise = int(state.noise[0, 0, 0, 0])
    expected = [1] + [cfg.noise_pixel] * min(noise, 3)
    assert row.tolist() == expected + [0] * (4 - len(expected))
    assert core.current_usage(cfg, state)[0, 0, 0] == 1 + noise


def test_views_for_heuristics():
    cfg = SimConfig(n_machines=2, capacity_units=(8, 8))
    seq = [
        dict(arrival_step=0, usage=[[1, 2], [3, 1], [2, 2]], ec_label=1, request=[3, 2]),
        dict(arrival_step=0, usage=[[2, 1]], ec_label=4),
        dict(arrival_step=0, usage=[[1, 1], [4, 4]], ec_label=5),
    ]
    state = core.reset(cfg, JobBatch.from_jobs([seq]), 0)
    state, *_ = core.step(cfg, state, [1])
    state, *_ = core.step(cfg, state, [1])
    assert core.current_usage(cfg, state)[0].tolist() == [[0, 0], [3, 3]]
    assert core.committed_future_usage(state, 4)[0, 1].tolist() == [[3, 3, 2, 0], [3, 1, 2, 0]]
    assert core.placed_requests(state)[0].tolist() == [[0, 0], [5, 3]]
    head = core.queue_head(state)
    assert head.has_job.tolist() == [True] and head.ec_label.tolist() == [5]
    assert head.request.tolist() == [[4, 4]] and head.usage[0, :2].tolist() == [[1, 1], [4, 4]]
    assert core.machines_used(state).tolist() == [[False, True]]
    assert core.jobs_running(state).tolist() == [[True, True, False]]
    assert core.queue_length(state).tolist() == [1]


def test_job_batch_from_frame_orders_and_validates():
    def row(seq, idx, arrival, cpu, mem, wid):
        return dict(
            source="google2011", load_pct=50, split="train", sequence_id=seq, job_index=idx, arrival_step=arrival,
            workload_id=wid, ec_label=1, duration_steps=len(cpu), cpu_units=cpu, mem_units=mem,
            cpu_request_units=None, mem_request_units=None, is_long_running=True,
        )  # fmt: skip

    schema = {"arrival_step": pl.Int64, "ec_label": pl.Int32, "duration_steps": pl.Int32,
              "cpu_units": pl.List(pl.Int16), "mem_units": pl.List(pl.Int16),
              "cpu_request_units": pl.Int16, "mem_request_units": pl.Int16}  # fmt: skip
    rows = [row(1, 0, 3, [1, 2], [2, 2], "a"), row(1, 1, 1, [3], [1], "b"), row(0, 0, 0, [1], [1], "c")]
    jobs = JobBatch.from_frame(pl.DataFrame(rows, schema_overrides=schema))
    assert jobs.n_jobs.tolist() == [1, 2]
    assert jobs.arrival_step[1].tolist() == [1, 3]
    assert jobs.request[1].tolist() == [[3, 1], [2, 2]]
    assert jobs.workload_ids[1] == ("b", "a")
    bad = [row(0, 0, 0, [1, 2], [1], "z")]
    with pytest.raises(ValueError, match=r"job 0 \(workload z\): duration_steps=2 but len\(cpu_units\)=2"):
        JobBatch.from_frame(pl.DataFrame(bad, schema_overrides=schema))


def _return_of(cfg, jobs, actions_fn):
    state = core.reset(cfg, jobs, 0)
    while not state.is_done.all():
        state, *_ = core.step(cfg, state, actions_fn(state))
    return float(state.penalty_totals.sum()), state


def test_holding_a_small_job_until_the_cap_is_worse_than_placing_it():
    # the review's case: one small job, paper weights; holding used to cost 50 per step only (-10,000 at the
    # 200-step cap) while running it costs the under-utilisation of its machine (-27,950)
    cfg = SimConfig(n_machines=1, max_steps=200)
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]] * 20, ec_label=0)]])
    placed, s_placed = _return_of(cfg, jobs, lambda s: np.zeros(1, dtype=np.int64))
    held, s_held = _return_of(cfg, jobs, lambda s: np.ones(1, dtype=np.int64))
    assert s_placed.is_terminated[0] and s_held.is_truncated[0]
    assert held < placed
    assert s_held.penalty_totals[0, core.PENALTY_NAMES.index("unplaced")] < 0


def test_episode_runs_until_every_job_finished_not_a_fixed_step_count():
    cfg = SimConfig(n_machines=1)
    jobs = JobBatch.from_jobs([[dict(arrival_step=250, usage=[[1, 1]] * 300, ec_label=0)]])
    _, state = _return_of(cfg, jobs, lambda s: np.zeros(1, dtype=np.int64))
    assert state.is_terminated[0] and not state.is_truncated[0] and state.t[0] == 550


def test_hold_rule_no_fit_allows_holding_only_when_nothing_fits():
    cfg = SimConfig(n_machines=2, capacity_units=(4, 4), hold_rule="no_fit")
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[4, 4]], ec_label=0)] * 3])
    state = core.reset(cfg, jobs, 0)
    assert core.action_mask(cfg, state).tolist() == [[True, True, False]]
    state, *_ = core.step(cfg, state, [0])
    state, *_ = core.step(cfg, state, [1])
    assert core.action_mask(cfg, state).tolist() == [[False, False, True]]  # both full: hold is the only move
    with pytest.raises(ValueError, match="invalid"):
        core.step(cfg, core.reset(cfg, jobs, 0), [2])


def test_jobs_per_episode_keeps_the_first_jobs_by_arrival():
    cfg = SimConfig(n_machines=2, jobs_per_episode=2)
    jobs = JobBatch.from_jobs([[dict(arrival_step=a, usage=[[1, 1]], ec_label=0) for a in (3, 0, 1, 2)]])
    state = core.reset(cfg, jobs, 0)
    assert state.jobs.n_jobs.tolist() == [2] and state.jobs.arrival_step[0, :2].tolist() == [0, 1]
    _, state = _return_of(cfg, jobs, lambda s: np.zeros(1, dtype=np.int64))
    assert state.is_terminated[0] and state.t[0] == 2


def test_unplaced_charge_bounds_the_cost_of_any_placement_of_the_job():
    cfg = SimConfig()
    charge = penalties.unplaced_charge(
        np.array([10]), cfg.capacity_units, cfg.k_contention, cfg.k_underutil, cfg.k_overshoot, cfg.k_wait
    )
    # alone on a machine, overshooting both resources at once, waiting all along: still cheaper
    worst_own = 2 * cfg.k_overshoot + 10 * (2 * 8**3 + cfg.k_wait + cfg.k_contention * 2 * 64)
    assert charge[0] >= worst_own
