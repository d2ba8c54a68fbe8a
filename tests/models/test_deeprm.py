"""DeepRM's agent: its image state, slot mask, which job it places, its reward, resume, and (slow) that it learns."""

import dataclasses

import numpy as np
import polars as pl
import pytest
import torch

import models.deeprm as drm
from models.deeprm import (
    DeepRMAgentConfig,
    DeepRMAgentPolicy,
    RandomSlot,
    apply_choice,
    build_net,
    decision_rewards,
    encode,
    feature_layout,
    job_slowdowns,
    n_features,
    slot_mask,
    slowdown_vs_load,
    train_deeprm,
)
from models.reinforce import ReinforceConfig, load_checkpoint
from pipelines.synthetic import (
    DeepPlaceConfig,
    DeepRMConfig,
    build_deepplace_sequences,
    build_deeprm_sequences,
)
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import decide, make_policy

SIM = SimConfig(n_machines=2, capacity_units=(8, 8), queue_size=3, max_steps=80, k_underutil=1.0)
CFG = DeepRMAgentConfig(
    sim=SIM,
    image_steps=6,
    backlog_size=4,
    reinforce=ReinforceConfig(n_iterations=4, n_sequences=2, n_trajectories=3, checkpoint_every=2),
)


def _job(cpu: int, mem: int, duration: int, wid: str, arrival: int = 0) -> dict:
    return {"arrival_step": arrival, "usage": [[cpu, mem]] * duration, "ec_label": 1, "workload_id": wid}


def _state(jobs: list[dict], placements: list[int]) -> core.State:
    state = core.reset(SIM, JobBatch.from_jobs([jobs]), 0)
    for machine in placements:
        state, *_ = core.step(SIM, state, np.array([machine]))
    return state


def _blocks(x: np.ndarray) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for name, shape in feature_layout(CFG).items():
        size = int(np.prod(shape))
        out[name] = x[offset : offset + size].reshape(shape)
        offset += size
    return out


def test_encoding_shows_the_monolithic_cluster_the_slots_and_the_backlog() -> None:
    # a (3 cpu, 1 mem) x 4 steps job runs on machine 0, a (6, 2) x 2 job on machine 1; five wait
    jobs = [_job(3, 1, 4, "a"), _job(6, 2, 2, "b"), _job(2, 5, 9, "w0")] + [
        _job(1, 1, 1, f"w{i}") for i in range(1, 5)
    ]
    state = _state(jobs, [0, 1])
    x = encode(CFG, state)
    assert x.shape == (1, n_features(CFG)) and x.dtype == np.float32
    assert set(np.unique(x)) <= {0.0, 1.0}
    b = _blocks(x[0])
    # cluster: one pool of 2 x 8 units; cpu 3 + 6 for 2 steps, then 3 until step 4
    assert b["cluster"].shape == (2, 6, 16)
    assert b["cluster"][0].sum(axis=1).tolist() == [9, 9, 3, 3, 0, 0]
    assert b["cluster"][1].sum(axis=1).tolist() == [3, 3, 1, 1, 0, 0]
    assert b["cluster"][0, 0, :9].all() and not b["cluster"][0, 0, 9:].any()
    # slot 0: (2, 5) for 9 steps, clipped to T = 6 rows
    assert b["slots"][0, 0].sum(axis=1).tolist() == [2] * 6
    assert b["slots"][0, 1].sum(axis=1).tolist() == [5] * 6
    assert b["slots"][1, 0].sum(axis=1).tolist() == [1, 0, 0, 0, 0, 0]
    # 5 waiting, 3 slots: backlog 2 of 4 cells
    assert b["backlog"].tolist() == [1, 1, 0, 0]


def test_mask_holds_void_and_only_the_slots_whose_job_fits_some_machine() -> None:
    # both machines hold 7 cpu; the head needs 2 cpu (fits nowhere), slot 1 needs 1 cpu, slot 2 needs 4
    jobs = [
        _job(7, 1, 5, "a"),
        _job(7, 1, 5, "b"),
        _job(2, 1, 3, "h"),
        _job(1, 1, 3, "s1"),
        _job(4, 1, 3, "s2"),
    ]
    state = _state(jobs, [0, 1])
    assert slot_mask(CFG, SIM, state).tolist() == [[False, True, False, True]]
    no_fit = dataclasses.replace(SIM, hold_rule="no_fit")
    assert slot_mask(CFG, no_fit, state).tolist() == [[False, True, False, False]]
    empty = _state([_job(7, 1, 5, "a"), _job(7, 1, 5, "b"), _job(2, 1, 3, "h")], [0, 1])
    assert slot_mask(CFG, SIM, empty).tolist() == [[False, False, False, True]]
    # an idle cluster with a job that fits: no void (the image would not change until the next arrival)
    idle = _state([_job(2, 1, 3, "h"), _job(8, 1, 3, "s1")], [])
    assert slot_mask(CFG, SIM, idle).tolist() == [[True, True, False, False]]


def test_void_is_withheld_once_a_job_that_fits_has_waited_max_hold_steps() -> None:
    bounded = dataclasses.replace(CFG, max_hold_steps=3)
    unbounded = dataclasses.replace(CFG, max_hold_steps=None)
    # a runs on machine 0 for 10 steps; h (arrived at 0) fits beside it; the queue keeps h while time moves
    state = _state([_job(2, 1, 10, "a"), _job(1, 1, 3, "h")], [0])
    seen = []
    for _ in range(4):
        seen.append((int(state.t[0]), bool(slot_mask(bounded, SIM, state)[0, -1])))
        assert slot_mask(unbounded, SIM, state)[0, -1]
        assert slot_mask(bounded, SIM, state)[0, 0]
        state, *_ = core.step(SIM, state, np.array([SIM.n_machines]))
    assert seen == [(0, True), (1, True), (2, True), (3, False)]
    # a job that does not fit does not count: with nothing placeable, void stays
    full = _state([_job(7, 1, 10, "a"), _job(7, 1, 10, "b"), _job(4, 1, 3, "h")], [0, 1])
    for _ in range(5):
        full, *_ = core.step(SIM, full, np.array([SIM.n_machines]))
    assert slot_mask(bounded, SIM, full)[0].tolist() == [False, False, False, True]


def test_truncation_charges_each_unplaced_job_more_than_running_it_could_cost() -> None:
    # cap 4 steps: a (3 steps) runs, b (5 steps, 2 cpu) is voided until the cap cuts the episode
    cfg = dataclasses.replace(
        CFG, sim=dataclasses.replace(SIM, max_steps=4), max_hold_steps=None, k_unused=2.0
    )
    state = core.reset(cfg.sim, JobBatch.from_jobs([[_job(1, 1, 3, "a"), _job(2, 1, 5, "b")]]), 0)
    before, actions = apply_choice(cfg, state, np.array([0]))
    state, *_ = core.step(cfg.sim, before, actions)
    charged = 0.0
    while not state.is_done.all():
        before, actions = apply_choice(cfg, state, np.array([cfg.sim.queue_size]))
        state, _, _, _, info = core.step(cfg.sim, before, actions)
        charged += decision_rewards(cfg, before, state, info)[0, 2]
    assert state.is_truncated.all()
    # 1 (slowdown bound) + k_unused x 5 steps x a whole machine (8 + 8 units) / 8 units
    assert charged == pytest.approx(-(1.0 + 2.0 * 5 * 16 / 8))


def _forced(slot: int) -> DeepRMAgentPolicy:
    """An untrained policy whose network always prefers `slot` (K = void)."""
    policy = DeepRMAgentPolicy()
    own, net = policy._ready(SIM)
    with torch.no_grad():
        net.body[-1].weight.zero_()
        net.body[-1].bias.copy_(torch.arange(own.n_actions) == slot)
    return policy


def test_the_chosen_slot_is_the_job_placed_by_best_fit_and_void_holds() -> None:
    # machine 0 has 5 cpu free, machine 1 has 2: Best-Fit puts the 2-cpu slot-2 job on machine 1
    jobs = [
        _job(3, 1, 5, "a"),
        _job(6, 1, 5, "b"),
        _job(1, 1, 3, "h"),
        _job(1, 1, 3, "s1"),
        _job(2, 1, 3, "s2"),
    ]
    state = _state(jobs, [0, 1])
    policy = _forced(2)
    moved, actions = decide(policy, SIM, state, np.random.default_rng(0))
    assert moved.jobs.workload_ids[0][2] == "s2" and actions.tolist() == [1]
    after, *_ = core.step(SIM, moved, actions)
    placed = {moved.jobs.workload_ids[0][j]: int(m) for j, m in enumerate(after.job_machine[0]) if m >= 0}
    assert placed == {"a": 0, "b": 1, "s2": 1}
    moved, actions = decide(_forced(SIM.queue_size), SIM, state, np.random.default_rng(0))
    assert moved.jobs.workload_ids == state.jobs.workload_ids and actions.tolist() == [SIM.n_machines]


def test_rewards_sum_to_minus_the_job_slowdowns_plus_the_unused_penalty() -> None:
    jobs = JobBatch.from_jobs(
        [[_job(3, 1, 3, "a"), _job(6, 2, 2, "b", 1), _job(2, 5, 4, "c", 1), _job(5, 5, 2, "d", 3)]] * 2
    )
    net = build_net(CFG)
    rng = np.random.default_rng(0)
    state = core.reset(SIM, jobs, 0)
    totals = np.zeros((2, 3))
    underutil = np.zeros(2)
    while not state.is_done.all():
        _, _, action = drm.choose_slots(net, CFG, state, rng, greedy=False)
        before, sim_actions = apply_choice(CFG, state, np.where(state.is_done, SIM.queue_size, action))
        state, _, _, _, info = core.step(SIM, before, sim_actions)
        totals += decision_rewards(CFG, before, state, info) * ~before.is_done[:, None]
        underutil += info["penalty_underutil"]
    j = state.jobs
    slowdown = ((state.job_start + j.duration - j.arrival_step) / j.duration)[:, :4].sum(axis=1)
    np.testing.assert_allclose(totals[:, 0], -slowdown)
    np.testing.assert_allclose(totals[:, 1], underutil / 8.0)
    assert (totals[:, 1] < 0).all() and (totals[:, 2] == 0).all()


def test_deeprms_own_setup_rewards_the_slowdown_alone() -> None:
    # DeepRM's Figure 4 agent trains on DeepRM's reward (slowdown only); TVW-RL's baseline adds the unused penalty
    from models.deeprm import DeepRMTrainConfig
    from pipelines.synthetic import DEEPRM_SOURCE

    for preset in ("paper", "short", "sample"):
        assert DeepRMTrainConfig(preset=preset).agent_config(DEEPRM_SOURCE, 0).k_unused == 0.0
        assert DeepRMTrainConfig(preset=preset).agent_config("bitbrains", 0).k_unused == 1.0
    cfg = dataclasses.replace(CFG, k_unused=0.0)
    jobs = JobBatch.from_jobs([[_job(3, 1, 3, "a"), _job(6, 2, 2, "b", 1)]])
    state = core.reset(SIM, jobs, 0)
    before, actions = apply_choice(cfg, state, np.array([0]))
    after, _, _, _, info = core.step(SIM, before, actions)
    assert info["penalty_underutil"][0] < 0  # the cluster is partly unused, yet only the slowdown is charged
    assert decision_rewards(cfg, before, after, info)[0, 1] == 0.0


def _train_jobs() -> JobBatch:
    frame = build_deeprm_sequences(DeepRMConfig(n_train_sequences=3, n_test_sequences=0, loads_pct=(50,)))
    return JobBatch.from_frame(frame)


def _reference_rollout(
    net, cfg: DeepRMAgentConfig, jobs: JobBatch, n_trajectories: int, seed: int, greedy: bool
):
    """DeepRM's own lock-step loop as it was before it went through `sim.rollout.rollout` (issue 18)."""
    rng = np.random.default_rng(seed)
    env_jobs = jobs.select(np.repeat(np.arange(jobs.batch_size), n_trajectories))
    state = core.reset(cfg.sim, env_jobs, rng.integers(0, 2**31 - 1, size=env_jobs.batch_size).tolist())
    totals = np.zeros((env_jobs.batch_size, 3))
    feats, masks, acts, rewards, alive = [], [], [], [], []
    while not state.is_done.all():
        is_alive = ~state.is_done
        x, mask, a = drm.choose_slots(net, cfg, state, rng, greedy)
        a = np.where(is_alive, a, cfg.sim.queue_size)
        before, sim_actions = apply_choice(cfg, state, a)
        state, _, _, _, info = core.step(cfg.sim, before, sim_actions)
        parts = decision_rewards(cfg, before, state, info) * is_alive[:, None]
        totals += parts
        feats.append(x)
        masks.append(mask)
        acts.append(a)
        rewards.append(parts.sum(axis=1))
        alive.append(is_alive)
    out = [np.stack(v) for v in (feats, masks, acts, rewards, alive)]
    return dict(zip(("features", "masks", "actions", "rewards", "alive"), out, strict=True)) | {
        "penalty_totals": totals,
        "is_truncated": state.is_truncated.copy(),
    }


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"k_unused": 0.0, "greedy": True},
        {"sim": {"jobs_per_episode": 5, "max_steps": 12}, "max_hold_steps": None, "k_unused": 2.0},
    ],
)
def test_the_shared_rollout_loop_gives_deeprms_own_loop_bit_for_bit(changes) -> None:
    changes = dict(changes)
    greedy = changes.pop("greedy", False)
    cfg = dataclasses.replace(CFG, **changes | {"sim": dataclasses.replace(SIM, **changes.get("sim", {}))})
    jobs, net = _train_jobs(), build_net(cfg)
    got = drm.rollout_deeprm(net, cfg, jobs, 3, seed=5, greedy=greedy)
    want = _reference_rollout(net, cfg, jobs, 3, 5, greedy)
    for name, value in want.items():
        field = getattr(got, name)
        assert field.dtype == value.dtype and field.shape == value.shape, name
        assert field.tobytes() == value.tobytes(), name
    assert (got.n_sequences, got.n_trajectories) == (jobs.batch_size, 3)
    assert got.is_truncated.any() == ("jobs_per_episode" in changes.get("sim", {}))


def test_resume_after_a_kill_reaches_the_same_weights(tmp_path, monkeypatch) -> None:
    cfg = dataclasses.replace(CFG, sim=dataclasses.replace(SIM, n_machines=1))
    jobs = _train_jobs()
    straight = train_deeprm(jobs, cfg, checkpoint_path=tmp_path / "straight.pt")
    real = drm.rollout_deeprm
    calls = {"n": 0}

    class Killed(Exception):
        pass

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(drm, "rollout_deeprm", dying)
    path = tmp_path / "resumed.pt"
    with pytest.raises(Killed):
        train_deeprm(jobs, cfg, checkpoint_path=path)
    assert load_checkpoint(path)["iteration"] == 2
    monkeypatch.setattr(drm, "rollout_deeprm", real)
    resumed = train_deeprm(jobs, cfg, checkpoint_path=path)
    assert [r["mean_return"] for r in resumed] == [r["mean_return"] for r in straight]
    final, reference = load_checkpoint(path)["model"], load_checkpoint(tmp_path / "straight.pt")["model"]
    for name, value in reference.items():
        assert torch.equal(value, final[name]), name
    # the trained checkpoint is a registry policy; another configuration or state space is a clear error
    policy = make_policy("deeprm_rl", checkpoint=path)
    assert policy.cfg == cfg
    with pytest.raises(ValueError, match="trained with another configuration"):
        train_deeprm(jobs, dataclasses.replace(cfg, k_unused=2.0), checkpoint_path=path)
    with pytest.raises(ValueError, match="another state space: n_machines 1 != 2"):
        policy.pick_job(SIM, core.reset(SIM, jobs, 0), np.random.default_rng(0))
    # its own K = 3 slots under an evaluation with 5 visible slots: valid actions, every job placed
    wide = dataclasses.replace(SIM, n_machines=1, queue_size=5)
    state, rng = core.reset(wide, jobs, 0), np.random.default_rng(0)
    while not state.is_done.all():
        slots = policy.pick_job(wide, state, rng)
        assert (slots < 3).all()
        state, actions = decide(policy, wide, state, rng)
        assert core.action_mask(wide, state)[np.arange(jobs.batch_size), actions].all()
        state, *_ = core.step(wide, state, actions)
    assert state.is_terminated.all()


def test_bad_training_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="hold no job"):
        train_deeprm(JobBatch.from_jobs([[]]), CFG)
    nan_sim = dataclasses.replace(SIM, n_machines=1, k_underutil=float("nan"))
    with pytest.raises(FloatingPointError, match="iteration 0"):
        train_deeprm(_train_jobs(), dataclasses.replace(CFG, sim=nan_sim))


def test_figure4_table_and_plot(tmp_path) -> None:
    cfg = dataclasses.replace(
        CFG,
        sim=dataclasses.replace(SIM, n_machines=1),
        reinforce=dataclasses.replace(CFG.reinforce, n_iterations=1),
    )
    path = tmp_path / "drm.pt"
    train_deeprm(_train_jobs(), cfg, checkpoint_path=path)
    frame = build_deeprm_sequences(DeepRMConfig(n_train_sequences=0, n_test_sequences=2, loads_pct=(30, 80)))
    table, png = slowdown_vs_load(frame, path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert table.height == 2 * 6
    assert set(table["policy"]) == {
        "deeprm_rl",
        "deeprm_sjf",
        "deeprm_packer",
        "tetris",
        "tetris_star",
        "random_slot",
    }
    assert (table["mean_slowdown"] >= 1.0).all() and (table["n_unplaced"] == 0).all()
    per_load = table.group_by("load_pct").agg(pl.col("n_jobs").n_unique())
    assert (per_load["n_jobs"] == 1).all()  # every policy ran every job of the load


@pytest.mark.slow
def test_trained_agent_beats_random_slot_choice_on_deeprms_workload(tmp_path) -> None:
    frame = build_deeprm_sequences(DeepRMConfig(n_train_sequences=40, n_test_sequences=20, loads_pct=(70,)))
    cfg = DeepRMAgentConfig.short()
    cfg = dataclasses.replace(cfg, reinforce=dataclasses.replace(cfg.reinforce, n_iterations=80))
    curve = train_deeprm(
        JobBatch.from_frame(frame.filter(pl.col("split") == "train")), cfg, tmp_path / "a.pt"
    )
    first = np.mean([r["mean_slowdown"] for r in curve[:5]])
    last = np.mean([r["mean_slowdown"] for r in curve[-5:]])
    assert last < first
    test = JobBatch.from_frame(frame.filter(pl.col("split") == "test"))
    agent, _ = job_slowdowns(DeepRMAgentPolicy(tmp_path / "a.pt"), cfg.sim, test, 0)
    random = [job_slowdowns(RandomSlot(), cfg.sim, test, s)[0].mean() for s in range(3)]
    assert agent.mean() < np.mean(random)


def test_an_agent_that_prefers_void_still_finishes_every_long_running_sequence() -> None:
    # DeepPlace's long-running square-wave jobs (31-100 steps) on TVW-RL's cluster, in the evaluation's
    # simulator: the worst an undertrained greedy agent can do is prefer void everywhere
    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=0, n_test_sequences=2, loads_pct=(30, 80))
    )
    sim = SimConfig(max_steps=1000, oversize="clip")
    jobs = JobBatch.from_frame(frame.filter(pl.col("split") == "test"))

    def run(policy) -> core.State:
        state, rng = core.reset(sim, jobs, 0), np.random.default_rng(0)
        while not state.is_done.all():
            state, actions = decide(policy, sim, state, rng)
            state, *_ = core.step(sim, state, actions)
        return state

    void_lover = DeepRMAgentPolicy()
    own, net = void_lover._ready(sim)
    with torch.no_grad():
        net.body[-1].weight.zero_()
        net.body[-1].bias.copy_(torch.arange(own.n_actions) == own.sim.queue_size)
    for policy in (void_lover, DeepRMAgentPolicy()):
        state = run(policy)
        assert state.is_terminated.all() and not state.is_truncated.any()
        assert ((state.job_start >= 0) | (np.arange(jobs.max_jobs) >= jobs.n_jobs[:, None])).all()
    # without the wait bound (DeepRM as published) the same agent runs the jobs one at a time, past the cap
    void_lover.cfg = dataclasses.replace(own, max_hold_steps=None)
    assert run(void_lover).is_truncated.any()
