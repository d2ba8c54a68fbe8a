"""TVW-RL's REINFORCE agent: it learns a toy problem with a known answer, resumes bit-identically, fails loudly."""

import dataclasses

import numpy as np
import pytest
import torch

from models.reinforce import ReinforceConfig, load_checkpoint, train_loop
from models.tvw_rl import TvwRlConfig, TvwRlPolicy, build_net, make_act, train_tvw_rl
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.observation import ObservationConfig
from sim.rollout import rollout

TOY_SIM = SimConfig(
    n_machines=3,
    capacity_units=(4, 4),
    history_steps=2,
    queue_size=1,
    n_labels=1,
    max_steps=60,
    hold_rule="no_fit",
)


def toy_jobs(n_seq: int = 4) -> JobBatch:
    """One job of 1 unit for 4 steps arriving every step: packing them on one machine is the right answer (under
    K_u = 3 an idle-ish extra machine costs 3^3 + 3^3 per step; contention is small)."""
    return JobBatch.from_jobs(
        [[dict(arrival_step=a, usage=[[1, 1]] * 4, ec_label=0) for a in range(8)] for _ in range(n_seq)]
    )


def toy_config(n_iterations: int, seed: int = 0, **reinforce) -> TvwRlConfig:
    r = ReinforceConfig(
        n_iterations=n_iterations,
        n_sequences=4,
        n_trajectories=8,
        learning_rate=0.05,
        checkpoint_every=5,
        seed=seed,
    )
    return TvwRlConfig(
        sim=TOY_SIM, obs=ObservationConfig(labels="true"), reinforce=dataclasses.replace(r, **reinforce)
    )


def mean_return(policy_act, cfg: TvwRlConfig, greedy_seed: int = 3) -> float:
    out = rollout(cfg.sim, cfg.obs, toy_jobs(), 4, policy_act, seed=greedy_seed)
    return float(out.episode_returns.mean())


def test_reinforce_learns_to_pack_a_toy_problem_and_beats_random(tmp_path):
    cfg = toy_config(40)
    curve = train_tvw_rl(toy_jobs(), cfg, checkpoint_path=tmp_path / "toy.pt")
    first, last = (
        np.mean([r["mean_return"] for r in curve[:5]]),
        np.mean([r["mean_return"] for r in curve[-5:]]),
    )
    assert last > first  # the learning curve rises (returns are negative costs)
    policy = TvwRlPolicy(tmp_path / "toy.pt")
    state = core.reset(cfg.sim, toy_jobs(1), 0)
    while not state.is_done.all():
        state, *_ = core.step(cfg.sim, state, policy.act(cfg.sim, state, np.random.default_rng(0)))
    learned = float(state.penalty_totals.sum())
    random_net = build_net(cfg)
    assert learned > mean_return(make_act(random_net), cfg)
    assert len(set(state.job_machine[0].tolist())) == 1  # the known answer: every job on one machine


def test_resume_after_a_kill_reaches_the_same_weights(tmp_path):
    cfg = toy_config(8)
    path = tmp_path / "run.pt"
    straight = train_tvw_rl(toy_jobs(), cfg)  # no checkpoint: one uninterrupted run
    # the same run, killed after iteration 6 (checkpoint at 5), then resumed
    calls = {"n": 0}

    class Killed(Exception):
        pass

    def run_iteration_factory(net):
        def run(i, rng):
            calls["n"] += 1
            if calls["n"] == 7:
                raise Killed
            rows = draw_sequences(rng, 4, cfg.reinforce.n_sequences)
            return rollout(
                cfg.sim, cfg.obs, toy_jobs().select(rows), 8, make_act(net), int(rng.integers(2**31))
            )

        return run

    from models.reinforce import config_dict, draw_sequences

    config = config_dict(cfg.sim, cfg.obs, cfg.reinforce) | {"hidden_units": cfg.hidden_units}
    net = build_net(cfg)
    with pytest.raises(Killed):
        train_loop(net, run_iteration_factory(net), cfg.reinforce, config, path)
    assert load_checkpoint(path)["iteration"] == 5
    resumed = build_net(cfg)
    curve = train_loop(resumed, run_iteration_factory(resumed), cfg.reinforce, config, path)
    assert [r["mean_return"] for r in curve] == [r["mean_return"] for r in straight]
    final = load_checkpoint(path)["model"]
    reference = build_net(cfg)
    train_tvw_rl(toy_jobs(), cfg, checkpoint_path=tmp_path / "reference.pt")
    reference.load_state_dict(load_checkpoint(tmp_path / "reference.pt")["model"])
    for name, value in reference.state_dict().items():
        assert torch.equal(value, final[name]), name


def test_checkpoint_errors_name_the_file(tmp_path):
    cfg = toy_config(2)
    path = tmp_path / "a.pt"
    train_tvw_rl(toy_jobs(), cfg, checkpoint_path=path)
    other = toy_config(2, seed=1)
    with pytest.raises(
        ValueError,
        match=r"a\.pt was trained with another configuration.*ReinforceConfig\.seed: 0 in the checkpoint, 1 now",
    ):
        train_tvw_rl(toy_jobs(), other, checkpoint_path=path)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"broken\.pt is corrupt or truncated"):
        TvwRlPolicy(broken)
    with pytest.raises(ValueError, match="another state space: n_machines 3 != 10"):
        TvwRlPolicy(path).act(SimConfig(), core.reset(SimConfig(), toy_jobs(1), 0), np.random.default_rng(0))


def test_bad_training_input_is_a_clear_error():
    empty = JobBatch.from_jobs([[]])
    with pytest.raises(ValueError, match="hold no job"):
        train_tvw_rl(empty, toy_config(1))
    nan_jobs = toy_jobs()
    cfg = toy_config(1)
    nan_cfg = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, k_underutil=float("nan")))
    with pytest.raises(FloatingPointError, match="iteration 0"):
        train_tvw_rl(nan_jobs, nan_cfg)


def test_discount_weights_later_rewards_less_in_the_advantages():
    """advantages(): v_k = sum gamma^(k'-k) r_k', minus the mean over the sequence's trajectories (raw mode)."""
    from models.reinforce import advantages
    from sim.rollout import RolloutBatch

    rewards = np.array([[0.0, 0.0], [-10.0, 0.0], [0.0, -10.0]])  # 3 decisions, 1 sequence x 2 trajectories
    batch = RolloutBatch(
        features=np.zeros((3, 2, 1), np.float32),
        masks=np.ones((3, 2, 2), bool),
        actions=np.zeros((3, 2), np.int64),
        rewards=rewards,
        alive=np.ones((3, 2), bool),
        penalty_totals=np.zeros((2, 1)),
        is_truncated=np.zeros(2, bool),
        n_sequences=1,
        n_trajectories=2,
    )
    undiscounted = advantages(batch, ReinforceConfig(advantage="raw"))
    assert undiscounted[0].tolist() == [0.0, 0.0]  # both trajectories lose 10 in total
    half = advantages(batch, ReinforceConfig(advantage="raw", discount=0.5))
    # v_0 = -5 (penalty one decision later) vs -2.5 (two later): the later penalty weighs less
    assert half[0].tolist() == [-1.25, 1.25]
    with pytest.raises(ValueError, match="discount"):
        ReinforceConfig(discount=0.0)


def test_an_iteration_draws_distinct_sequences_and_a_small_set_whole():
    from models.reinforce import draw_sequences

    rng = np.random.default_rng(0)
    rows = draw_sequences(rng, 10, 4)
    assert len(set(rows.tolist())) == 4 and rows.max() < 10
    assert draw_sequences(rng, 5, 5).tolist() == [0, 1, 2, 3, 4]
    more = draw_sequences(rng, 3, 7)
    assert len(more) == 7 and set(more.tolist()) == {0, 1, 2}


def test_greedy_holds_only_when_holding_is_likelier_than_placing_anywhere():
    """Hold-anytime policies: argmax over M + 1 actions would hold with p(hold) = 0.29 against seven machines at
    about 0.1 each; the greedy decision places (the likeliest machine), and holds only when p(hold) > p(place)."""
    from models.tvw_rl import greedy_hold_or_place

    # seven valid machines at 0.1-0.11 (three masked, their logits irrelevant), hold at 0.29
    logits = torch.log(torch.tensor([[0.1] * 6 + [0.11, 0.5, 0.5, 0.5, 0.29]]))
    mask = np.array([[True] * 7 + [False] * 3 + [True]])
    assert sample_argmax(logits, mask) == 10  # the plain argmax holds
    assert greedy_hold_or_place(logits, mask).tolist() == [6]
    likely_hold = torch.tensor([[0.0] * 10 + [3.0]])
    assert greedy_hold_or_place(likely_hold, np.ones((1, 11), bool)).tolist() == [10]
    # "no_fit": hold is valid only where no machine is, so the decision is the plain argmax
    no_fit = np.array([[True, False] * 5 + [False], [False] * 10 + [True]])
    logits = torch.randn(2, 11, generator=torch.Generator().manual_seed(0))
    assert greedy_hold_or_place(logits, no_fit).tolist() == sample_argmax(logits, no_fit).tolist()


def sample_argmax(logits: torch.Tensor, mask: np.ndarray) -> np.ndarray:
    from models.reinforce import sample_masked

    return sample_masked(logits, mask, np.random.default_rng(0), greedy=True)


def deepplace_train_jobs(load_pct: int) -> JobBatch:
    """The embedded sample's DeepPlace training sequences at one load (10 sequences, as `sim__job_sequences`
    builds them with the sample profile)."""
    import polars as pl

    from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences

    frame, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=10, n_test_sequences=1, loads_pct=(load_pct,))
    )
    return JobBatch.from_frame(frame.filter(pl.col("split") == "train"))


@pytest.mark.parametrize("load_pct", [30, 80])
def test_short_preset_episodes_end_within_the_safety_cap(load_pct):
    """The short preset's episodes (its first jobs of each sequence) finish under a random policy at every load:
    a truncated episode would teach the unplaced charge, not placement."""
    from sim.rollout import random_valid_act

    cfg = TvwRlConfig.short()
    out = rollout(
        cfg.sim, ObservationConfig(labels="true"), deepplace_train_jobs(load_pct), 2, random_valid_act, 0
    )
    assert not out.is_truncated.any()
    placed = (out.actions < cfg.sim.n_machines) & out.alive
    assert placed.sum(axis=0).tolist() == [cfg.sim.jobs_per_episode] * out.actions.shape[1]


@pytest.mark.slow
def test_short_preset_learning_curve_rises_on_the_sample_sequences():
    """The sample's short preset learns visibly (issue 12): on the sample's DeepPlace 30 % training sequences, the
    mean return of the last 10 % of iterations exceeds that of the first 10 % by more than 3 standard errors of
    the difference (returns are negative costs: rising = the cost falls)."""
    cfg = dataclasses.replace(TvwRlConfig.short(), obs=ObservationConfig(labels="true"))  # synthetic: known
    curve = train_tvw_rl(deepplace_train_jobs(30), cfg)
    returns = np.array([row["mean_return"] for row in curve])
    n = int(np.ceil(0.1 * len(returns)))
    first, last = returns[:n], returns[-n:]
    stderr = np.sqrt(first.var(ddof=1) / n + last.var(ddof=1) / n)
    assert last.mean() - first.mean() > 3 * stderr
