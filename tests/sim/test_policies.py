"""Heuristic schedulers: valid actions over whole episodes, and the expected machine on hand-made states."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from pipelines.synthetic import (
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
)
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import (
    POLICIES,
    DeepRMPacker,
    DeepRMSJF,
    ECProfilePeakAware,
    accepts_profiles,
    decide,
    kube_scores,
    make_policy,
    own_jobs,
    promote_queued_job,
)
from sim.profiles import EcProfiles, ProfileConfig, learn_profiles
from sim.tuning import sequence_returns

CFG3 = SimConfig(n_machines=3, max_steps=60)


def _job(cpu, mem, wid: str, arrival: int = 0) -> dict:
    return {
        "arrival_step": arrival,
        "usage": [[c, m] for c, m in zip(cpu, mem, strict=True)],
        "ec_label": 1,
        "workload_id": wid,
    }


def _state_after(placements: list[int], jobs: list[dict]) -> core.State:
    """Reset one env with `jobs` (all arriving at 0) and place the first ones on the given machines."""
    state = core.reset(CFG3, JobBatch.from_jobs([jobs]), 0)
    for machine in placements:
        state, *_ = core.step(CFG3, state, np.array([machine]))
    return state


@pytest.fixture()
def three_machines() -> core.State:
    # m0 runs (2 cpu, 2 mem), m1 (6, 1), m2 (0, 4); the head asks for (2, 1): cpu-dominant
    jobs = [
        _job([2] * 5, [2] * 5, "a"),
        _job([6] * 5, [1] * 5, "b"),
        _job([0] * 5, [4] * 5, "c"),
        _job([2] * 5, [1] * 5, "head"),
    ]
    return _state_after([0, 1, 2], jobs)


@pytest.mark.parametrize(
    ("name", "machine"),
    [
        ("first_fit", 0),  # lowest index that fits
        ("best_fit", 1),  # fewest free cpu units now: 2
        ("tetris", 0),  # machine by machine: m0 is the first with room for a queued job (by requests)
        ("kube_default", 0),  # least-allocated + balanced: m0 150, m1 100, m2 137.5
        ("foresight_peak_aware", 0),  # lowest resulting peak share: m0 4/8, m1 8/8, m2 5/8
        ("ec_peak_aware", 0),  # no profiles: by requests, the same peak shares
    ],
)
def test_hand_made_state_picks_expected_machine(three_machines, name: str, machine: int) -> None:
    action = make_policy(name).act(CFG3, three_machines, np.random.default_rng(0))
    assert action.tolist() == [machine]


def test_kube_scores_literal() -> None:
    requested = np.array([[[4, 3], [8, 2], [2, 5]]])
    assert kube_scores(requested, np.array([8, 8])).tolist() == [[150.0, 100.0, 137.5]]


def test_request_based_policies_hold_when_no_machine_has_room() -> None:
    jobs = [_job([7] * 3, [1] * 3, f"x{i}") for i in range(3)] + [_job([2] * 3, [1] * 3, "head")]
    state = _state_after([0, 1, 2], jobs)
    for name in ("tetris", "kube_default", "deeprm_sjf", "ec_peak_aware", "foresight_peak_aware", "best_fit"):
        assert make_policy(name).act(CFG3, state, np.random.default_rng(0)).tolist() == [3], name


def test_foresight_peak_aware_avoids_a_future_spike_then_opens_a_machine() -> None:
    # m0 idles now but spikes to 7 cpu at step 2; m1 steady at 3; the head uses 2 cpu throughout
    jobs = [
        _job([1, 1, 7, 1], [1] * 4, "spiky"),
        _job([3] * 4, [1] * 4, "steady"),
        _job([2] * 4, [1] * 4, "head"),
    ]
    state = _state_after([0, 1], jobs)
    assert make_policy("foresight_peak_aware").act(CFG3, state, None).tolist() == [1]
    jobs = [_job([1, 1, 7, 1], [1] * 4, "spiky"), _job([2] * 4, [1] * 4, "head")]
    state = _state_after([0], jobs)
    assert make_policy("foresight_peak_aware").act(CFG3, state, None).tolist() == [
        1
    ]  # m0 would overshoot: open m1


# label 1 peaks at even ages: 1, 1/4, 1, 1/4, ... of its request, in both resources
ALTERNATING = EcProfiles(
    fraction=np.tile(np.array([1.0, 0.25] * 3)[None, :, None], (CFG3.n_labels, 1, 2)),
    counts=np.ones((CFG3.n_labels, 6, 2), dtype=np.int64),
    n_jobs=np.ones(CFG3.n_labels, dtype=np.int64),
)


@pytest.fixture()
def phased_state() -> core.State:
    """t = 1: m0 runs a label-1 job of age 0 (same phase as the head), m1 one of age 1 (opposite phase), m2 is
    empty; the head is label 1. Every job uses cpu 4, 1, 4, 1, ... and mem 1."""
    wave = [4, 1, 4, 1, 4, 1]
    jobs = [_job(wave, [1] * 6, "early"), _job(wave, [1] * 6, "late", 1), _job(wave, [1] * 6, "head", 1)]
    state = _state_after([1], jobs)  # early on m1 at t = 0; the queue empties, t moves to 1
    state, *_ = core.step(CFG3, state, np.array([0]))  # late on m0 at t = 1
    assert state.t.tolist() == [1] and state.jobs.workload_ids[0][state.next_job[0]] == "head"
    return state


def test_ec_peak_aware_interleaves_predicted_peaks(phased_state) -> None:
    # predicted cpu: m0 4 + 4 = 8 now (peaks coincide: share 1); m1 1 + 4 = 5 now, 4 + 1 = 5 next (share 5/8)
    policy = ECProfilePeakAware(ALTERNATING)
    assert policy.act(CFG3, phased_state, None).tolist() == [1]
    assert make_policy("best_fit").act(CFG3, phased_state, None).tolist() == [0]  # fewest free cpu now
    assert make_policy("foresight_peak_aware").act(CFG3, phased_state, None).tolist() == [1]


def test_ec_peak_aware_never_reads_true_future_usage(phased_state) -> None:
    # zero every job's usage from the current step on: the profiles and the observed usage are unchanged
    jobs = phased_state.jobs
    usage = jobs.usage.copy()
    usage[0, 0, 2:] = 0  # early, age 1 now
    usage[0, 1, 1:] = 0  # late, age 0 now
    usage[0, 2] = 0  # head
    blind = replace(phased_state, jobs=replace(jobs, usage=usage))
    assert ECProfilePeakAware(ALTERNATING).act(CFG3, blind, None).tolist() == [1]
    assert make_policy("foresight_peak_aware").act(CFG3, blind, None).tolist() == [
        0
    ]  # the oracle does read it


def test_ec_peak_aware_opens_a_machine_when_predicted_peaks_overshoot(phased_state) -> None:
    # profiles doubled: the head is predicted at 8 cpu now: m0 4 + 8 and m1 1 + 8 exceed 8; m2 is empty
    big = replace(ALTERNATING, fraction=ALTERNATING.fraction * 2.0)
    assert ECProfilePeakAware(big).act(CFG3, phased_state, None).tolist() == [2]
    assert accepts_profiles("ec_peak_aware") and not accepts_profiles("foresight_peak_aware")


def test_deeprm_pick_and_promote_keep_fifo_for_the_others() -> None:
    jobs = [_job([1] * 5, [1] * 5, "long"), _job([1] * 2, [1] * 2, "short"), _job([3] * 3, [1] * 3, "big")]
    state = core.reset(CFG3, JobBatch.from_jobs([jobs]), 0)
    assert DeepRMSJF().pick_job(CFG3, state, None).tolist() == [1]
    assert DeepRMPacker().pick_job(CFG3, state, None).tolist() == [
        2
    ]  # largest request aligns best when empty
    moved = promote_queued_job(state, np.array([2]))
    assert moved.jobs.workload_ids[0] == ("big", "long", "short")
    assert moved.jobs.duration[0].tolist() == [3, 5, 2]
    assert state.jobs.workload_ids[0] == ("long", "short", "big")  # the input is not mutated
    new_state, actions = decide(DeepRMSJF(), CFG3, state, np.random.default_rng(0))
    assert new_state.jobs.workload_ids[0][0] == "short" and actions.tolist() == [0]


def test_promote_moves_meta_and_observed_labels_with_the_job() -> None:
    jobs = [_job([1] * 5, [1] * 5, "long"), _job([1] * 2, [1] * 2, "short"), _job([3] * 3, [1] * 3, "big")]
    batch = JobBatch.from_jobs([jobs])
    meta = np.arange(batch.max_jobs * 4, dtype=np.float64).reshape(1, batch.max_jobs, 4)
    exact = np.zeros(batch.usage.shape, dtype=np.float32)
    exact[0, :, 0, 0] = [0.5, 1.5, 2.5]  # each job's first exact cpu step names it
    state = core.reset(CFG3, replace(batch, meta=meta, usage_exact=exact), 0)
    state = core.relabel(CFG3, state, np.array([[0, 1, 2]]))
    moved = promote_queued_job(state, np.array([2]))
    assert moved.obs_label[0].tolist() == [2, 0, 1]
    assert moved.jobs.meta[0, :, 0].tolist() == [8.0, 0.0, 4.0]
    assert moved.jobs.usage_exact[0, :, 0, 0].tolist() == [2.5, 0.5, 1.5]
    assert state.obs_label[0].tolist() == [0, 1, 2]  # the input is not mutated


def test_reordering_in_place_is_the_copy_and_touches_only_the_owned_batch() -> None:
    jobs = [_job([1] * 5, [1] * 5, "long"), _job([1] * 2, [1] * 2, "short"), _job([3] * 3, [1] * 3, "big")]
    batch = JobBatch.from_jobs([jobs, jobs[::-1]])
    assert batch.observed_prefix  # computed before the reordering: its order moves with the jobs
    state = core.reset(CFG3, batch, 0)
    copied = promote_queued_job(state, np.array([2, 1]))
    owned = own_jobs(state)
    moved = promote_queued_job(owned, np.array([2, 1]), in_place=True)
    assert moved.jobs is owned.jobs and moved.jobs.revision == 1 and copied.jobs is not state.jobs
    for name in ("arrival_step", "duration", "usage", "request", "ec_label", "workload_code"):
        np.testing.assert_array_equal(getattr(moved.jobs, name), getattr(copied.jobs, name))
    assert (
        moved.jobs.workload_ids
        == copied.jobs.workload_ids
        == (("big", "long", "short"), ("short", "big", "long"))
    )
    np.testing.assert_array_equal(moved.jobs.observed_prefix[0].order, copied.jobs.observed_prefix[0].order)
    # the input is not mutated
    assert state.jobs.workload_ids[0] == ("long", "short", "big") and batch.revision == 0
    assert batch.duration[0].tolist()[:3] == [5, 2, 3]


@pytest.mark.parametrize("name", ["tetris", "deeprm_sjf", "deeprm_packer"])
def test_job_pickers_reordering_in_place_give_the_copys_episodes(name, episode_jobs) -> None:
    cfg = SimConfig(n_machines=10, max_steps=1000)
    before = episode_jobs.usage.copy()
    fast = sequence_returns(make_policy(name), cfg, episode_jobs, 3)  # reorders its own batch in place
    rng, state = np.random.default_rng(3), core.reset(cfg, episode_jobs, 3)
    while not state.is_done.all():
        state, actions = decide(make_policy(name), cfg, state, rng)  # a copy at every reordering
        state, *_ = core.step(cfg, state, actions)
    np.testing.assert_array_equal(fast, state.penalty_totals.sum(axis=1))
    np.testing.assert_array_equal(episode_jobs.usage, before)


@pytest.fixture(scope="module")
def episode_jobs() -> JobBatch:
    dp, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=0, n_test_sequences=2, loads_pct=(80,))
    )
    drm = build_deeprm_sequences(DeepRMConfig(n_train_sequences=0, n_test_sequences=2, loads_pct=(80,)))
    # DeepPlace's first 150 of its ~400 jobs: at 80 % they fill the ten machines (holds and full machines come
    # early), and every policy's rollout costs a third as much
    return JobBatch.from_frame(pl.concat([dp.filter(pl.col("job_index") < 150), drm]))


def _assert_valid_rollout(policy, cfg: SimConfig, episode_jobs: JobBatch) -> None:
    rng = np.random.default_rng(1)
    state = core.reset(cfg, episode_jobs, 1)
    for _ in range(episode_jobs.max_jobs + cfg.max_steps + 1):
        if state.is_done.all():
            break
        state, actions = decide(policy, cfg, state, rng)
        mask = core.action_mask(cfg, state)
        assert actions.shape == (state.batch_size,)
        assert mask[np.arange(state.batch_size), actions].all()
        state, *_ = core.step(cfg, state, actions)
    assert state.is_done.all()
    if policy.name == "noop" and cfg.hold_rule == "always":
        assert (state.job_machine < 0).all() and state.is_truncated.all()
    else:
        assert (state.job_machine >= 0).sum() > 0


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(
    "cfg",
    [SimConfig(), SimConfig(noise_max_units=2, placement_check="request"), SimConfig(hold_rule="no_fit")],
)
def test_every_policy_takes_only_valid_actions(episode_jobs, name: str, cfg: SimConfig) -> None:
    policy = make_policy(name)
    assert policy.name == name
    _assert_valid_rollout(policy, cfg, episode_jobs)


@pytest.mark.parametrize("period", [None, 7])
def test_ec_peak_aware_with_learned_profiles_takes_only_valid_actions(episode_jobs, period) -> None:
    cfg = SimConfig(noise_max_units=2)
    profiles = learn_profiles(episode_jobs, cfg.n_labels, episode_jobs.max_duration, ProfileConfig(period))
    _assert_valid_rollout(make_policy("ec_peak_aware", profiles=profiles), cfg, episode_jobs)


def test_tetris_fills_a_machine_with_the_best_aligned_queued_job() -> None:
    # m0 runs (4, 1): free by requests (4, 7). Queued: a (1, 1), b (4, 4), c (4, 1). All fit m0; alignment with
    # (4, 7)/8: a 11, b 44, c 23 -> b goes to m0 (not to an empty machine, as the old worst-fit rule did)
    jobs = [_job([4] * 3, [1] * 3, "x"), _job([1] * 3, [1] * 3, "a"), _job([4] * 3, [4] * 3, "b")]
    jobs.append(_job([4] * 3, [1] * 3, "c"))
    state = _state_after([0], jobs)
    policy = make_policy("tetris")
    state, action = decide(policy, CFG3, state, np.random.default_rng(0))
    assert state.jobs.workload_ids[0][state.next_job[0]] == "b" and action.tolist() == [0]


def test_tetris_uses_few_machines_at_low_load() -> None:
    # ten small jobs, all arriving at 0, that fit two per machine in cpu: Tetris packs them on 5 machines
    cfg = SimConfig(n_machines=10, capacity_units=(8, 8))
    jobs = JobBatch.from_jobs([[_job([4] * 3, [1] * 3, f"j{i}") for i in range(10)]])
    state = core.reset(cfg, jobs, 0)
    rng = np.random.default_rng(0)
    policy = make_policy("tetris")
    while not state.is_done.all():
        state, actions = decide(policy, cfg, state, rng)
        state, *_ = core.step(cfg, state, actions)
    assert len(set(state.job_machine[0].tolist())) == 5


@pytest.mark.parametrize("name", ["deeprm_sjf", "deeprm_packer"])
def test_deeprm_heuristics_try_the_next_job_when_the_preferred_one_fits_no_machine(name) -> None:
    # m0..m2 each run (6, 1); queued: a long (4, 1) job that fits nowhere, a short (2, 1) one that fits m0
    fill = [_job([6] * 9, [1] * 9, f"f{i}") for i in range(3)]
    big, small = _job([4] * 2, [1] * 2, "big"), _job([2] * 5, [1] * 5, "small")
    state = _state_after([0, 1, 2], [*fill, big, small])  # big is both the shorter and the better aligned
    policy = make_policy(name)
    state, action = decide(policy, CFG3, state, np.random.default_rng(0))
    assert state.jobs.workload_ids[0][state.next_job[0]] == "small" and action.tolist() == [0]


def test_noop_never_places() -> None:
    state = _state_after([], [_job([1], [1], "a")])
    assert make_policy("noop").act(CFG3, state, None).tolist() == [CFG3.n_machines]


def test_unknown_policy_lists_the_registry() -> None:
    with pytest.raises(KeyError, match="best_fit"):
        make_policy("no_such_policy")


def test_a_policy_defined_outside_the_repository_is_named_by_import_path() -> None:
    policy = make_policy("sim.policies:FirstFit")
    assert policy.name == "first_fit"
    with pytest.raises(KeyError, match="cannot import"):
        make_policy("no_such_module:Thing")


def test_learned_policies_are_registered_from_models_and_sim_names_no_models_module(monkeypatch) -> None:
    import pathlib

    import sim.policies as policies

    learned = {n for n in POLICIES if policies.is_learned(n)}
    assert learned == {
        "dejavu",
        "tvw_rl",
        "deeprm_rl",
        "forecast_residual_rl",
        "forecast_residual_rl_replay",
    }  # tests/conftest.py imports models
    assert all(policies.policy_kind(n) == "learned" and not policies.is_oracle(n) for n in learned)
    monkeypatch.setattr(policies, "POLICIES", dict(POLICIES))
    policies.register_learned("toy_rl", lambda checkpoint=None, **kwargs: policies.FirstFit())
    assert policies.is_learned("toy_rl") and policies.make_policy("toy_rl").name == "first_fit"
    assert "models." not in pathlib.Path(policies.__file__).read_text()


def test_observed_summaries_equal_nan_reductions_and_follow_a_promoted_job() -> None:
    """job_view's life max / mean come from the batch's running summaries: they equal np.nanmax / np.nanmean of
    the observed ages (NaN steps of the unquantised usage skipped), also after promote_queued_job reorders the
    queue of a batch whose summaries were already computed."""
    from sim.forecast import job_view

    jobs = [
        _job([1, 3, 2, 1, 1], [1] * 5, "long"),
        _job([2, 1], [1, 2], "short"),
        _job([3, 1, 1], [1] * 3, "big"),
    ]
    batch = JobBatch.from_jobs([jobs])
    rng = np.random.default_rng(0)
    exact = rng.uniform(0, 3, batch.usage.shape).astype(np.float32)
    exact[0, 0, 1] = np.nan  # a missing unquantised step inside the observed ages
    exact[0, 2] = np.nan  # a job without unquantised usage
    batch = replace(batch, usage_exact=exact)
    env, job = np.zeros(9, dtype=np.int64), np.repeat(np.arange(3), 3)
    n_obs = np.tile([0, 1, 3], 3)
    for profiles, summary in zip((batch.usage, batch.usage_exact), batch.observed_prefix, strict=True):
        life_max, life_mean = summary.at(env, job, n_obs)
        for i in range(9):
            seen = profiles[0, job[i], : max(n_obs[i], 1)].astype(np.float64)
            seen[n_obs[i] :] = np.nan  # nothing observed: NaN summaries
            with warnings.catch_warnings(action="ignore", category=RuntimeWarning):  # all-NaN columns
                want_max, want_mean = np.nanmax(seen, axis=0), np.nanmean(seen, axis=0)
            np.testing.assert_array_equal(life_max[i], want_max)
            np.testing.assert_array_equal(life_mean[i], want_mean)
    state = core.reset(CFG3, batch, 0)
    _ = job_view(CFG3, state, np.zeros(3, dtype=np.int64), np.arange(3), n_recent=2)  # summaries computed
    _ = state.jobs.workload_code
    moved = promote_queued_job(state, np.array([2]))
    fresh = replace(moved, jobs=replace(moved.jobs))  # the same jobs, summaries computed anew
    assert "observed_prefix" in moved.jobs.__dict__ and "observed_prefix" not in fresh.jobs.__dict__
    assert "workload_code" in moved.jobs.__dict__  # carried, and equal to codes computed afresh
    np.testing.assert_array_equal(moved.jobs.workload_code, fresh.jobs.workload_code)
    for t_state in (moved, fresh):
        assert t_state.jobs.workload_ids[0] == ("big", "long", "short")
    # place every job now and observe two steps of each: the views agree job by job
    placed = [
        replace(
            s,
            job_machine=np.zeros_like(s.job_machine),
            job_start=np.zeros_like(s.job_start),
            t=np.full_like(s.t, 1),
        )
        for s in (moved, fresh)
    ]
    a, b = (job_view(CFG3, s, np.zeros(3, dtype=np.int64), np.arange(3), n_recent=2) for s in placed)
    for field in ("life_max", "life_mean", "recent", "life_max_exact", "life_mean_exact", "recent_exact"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_array_equal(a.life_max[:, 0], [3.0, 3.0, 2.0])  # big, long, short: the moved order


def test_selected_rows_share_the_parents_summaries_and_read_what_fresh_ones_give() -> None:
    """`JobBatch.select` of a batch whose running summaries exist shares them (no recomputation), mapped by row;
    a reordering in place of the selection moves only its own order; every read equals summaries computed anew."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(3):
        seq = []
        for k in range(4):
            dur = int(rng.integers(1, 6))
            seq.append(_job(rng.integers(0, 4, dur).tolist(), rng.integers(0, 4, dur).tolist(), f"w{k}"))
        rows.append(seq)
    batch = JobBatch.from_jobs(rows)
    parent = batch.observed_prefix[0]
    picked = batch.select(np.array([2, 0, 2, 1]))
    shared = picked.observed_prefix[0]
    assert shared.peak is parent.peak and shared.rows.tolist() == [2, 0, 2, 1]
    owned = own_jobs(core.reset(CFG3, picked, 0))
    moved = promote_queued_job(owned, np.array([2, 1, 3, 0]), in_place=True).jobs
    assert np.array_equal(shared.order, picked.observed_prefix[0].order)  # the selection's order untouched
    fresh = replace(moved)  # the same (reordered) jobs, summaries computed anew
    env, job = np.repeat(np.arange(4), 4), np.tile(np.arange(4), 4)
    for n_obs in (np.zeros(16, dtype=np.int64), np.full(16, 2), rng.integers(0, 6, 16)):
        for got, want in zip(moved.observed_prefix, fresh.observed_prefix, strict=True):
            if want is None:
                assert got is None
                continue
            np.testing.assert_array_equal(got.peak_at(env, job, n_obs), want.peak_at(env, job, n_obs))
            for a, b in zip(got.at(env, job, n_obs), want.at(env, job, n_obs), strict=True):
                np.testing.assert_array_equal(a, b)


def test_a_job_pick_and_a_relabelling_share_the_states_memoised_values() -> None:
    """`sim.core.share_memo`: the running jobs and their requests per machine, memoised for a state, are read by
    the states a job pick and a relabelling derive from it (no recount), and equal a recount of those states."""
    jobs = [_job([1] * 5, [1] * 5, "long"), _job([1] * 2, [1] * 2, "short"), _job([3] * 3, [1] * 3, "big")]
    state = own_jobs(core.reset(CFG3, JobBatch.from_jobs([jobs * 2, jobs[::-1] * 2]), 0))
    rng = np.random.default_rng(0)
    while not core.jobs_running(state).any():
        state, *_ = core.step(CFG3, state, make_policy("tetris").act(CFG3, state, rng))
    running, requests = core.jobs_running(state), core.placed_requests(state)
    moved = promote_queued_job(state, np.array([1, 1]), in_place=True)
    seen = core.relabel(CFG3, moved, np.zeros_like(moved.jobs.ec_label))
    for derived in (moved, seen):
        assert core.jobs_running(derived) is running and core.placed_requests(derived) is requests
        np.testing.assert_array_equal(core._placed_requests(derived), requests)
    stepped, *_ = core.step(CFG3, seen, make_policy("tetris").act(CFG3, seen, rng))
    assert core.placed_requests(stepped) is not requests  # a step is a new state: counted anew


def test_the_first_slots_fits_are_the_full_queues_first_columns() -> None:
    """`queued_fits(..., n_slots=k)` (Tetris' act asks for the head's only) gives the full queue's first k slots:
    each slot's answer is its own, empty slots included."""
    from sim.policies import queued_fits

    rng = np.random.default_rng(3)
    jobs = [
        [
            _job(rng.integers(0, 5, 4).tolist(), rng.integers(0, 5, 4).tolist(), f"w{k}", int(k // 3))
            for k in range(9)
        ]
        for _ in range(4)
    ]
    state = core.reset(CFG3, JobBatch.from_jobs(jobs), 0)
    policy, n_checked = make_policy("first_fit"), 0
    for _ in range(12):
        full = queued_fits(CFG3, state)
        for k in (1, 2, CFG3.queue_size + 3):
            part = queued_fits(CFG3, state, n_slots=k)
            k = min(k, CFG3.queue_size)
            for whole, first in zip(full, part, strict=True):
                assert np.array_equal(whole[:, :k], first)
        n_checked += int(full[2][:, 0].any())
        state, *_ = core.step(CFG3, state, policy.act(CFG3, state, rng))
    assert n_checked > 5  # heads that fit somewhere were compared, not only empty queues
