"""`sim.rollout.rollout`'s hooks: spelled out, the defaults give the default rollout bit for bit; an agent with its
own action space (a queued job or void), view and reward rolls out through the same loop."""

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.core import PENALTY_NAMES
from sim.jobs import JobBatch
from sim.observation import ObservationConfig, encode
from sim.policies import _deeprm_act, promote_queued_job, queued_fits
from sim.rollout import random_valid_act, rollout

CFG = SimConfig(n_machines=3, capacity_units=(4, 4), history_steps=3, queue_size=3, n_labels=2, max_steps=60)
OBS = ObservationConfig(labels="true")
FIELDS = ("features", "masks", "actions", "rewards", "alive", "penalty_totals", "is_truncated")


def jobs(seed: int = 3, n_seqs: int = 3, n_jobs: int = 9) -> JobBatch:
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n_seqs):
        arrivals = np.sort(rng.integers(0, 12, size=n_jobs))
        seqs.append(
            [
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(1, 4, size=(int(rng.integers(1, 6)), 2)).tolist(),
                    ec_label=int(rng.integers(0, 2)),
                )
                for a in arrivals
            ]
        )
    return JobBatch.from_jobs(seqs)


def test_the_defaults_spelled_out_as_hooks_give_the_same_rollout_bit_for_bit() -> None:
    plain = rollout(CFG, OBS, jobs(), 4, random_valid_act, seed=7)

    def penalties(before, after, reward, info):
        return np.stack([info[f"penalty_{n}"] for n in PENALTY_NAMES], axis=1)

    hooked = rollout(
        CFG,
        None,
        jobs(),
        4,
        random_valid_act,
        seed=7,
        encoder=lambda state: encode(CFG, OBS, state),
        mask_fn=lambda state: core.action_mask(CFG, state),
        apply_fn=lambda state, actions: (state, actions),
        reward_fn=penalties,
    )
    for field in FIELDS:
        a, b = getattr(plain, field), getattr(hooked, field)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), field
    assert plain.rewards.min() < 0  # not trivially empty


def slot_mask(state: core.State) -> np.ndarray:
    """A job-picking action space: K visible slots (those whose job fits some machine now) + void (last)."""
    _, _, fits = queued_fits(CFG, state)
    mask = np.zeros((state.batch_size, CFG.queue_size + 1), dtype=bool)
    mask[:, :-1] = fits.any(axis=2) & ~state.is_done[:, None]
    mask[:, -1] = ~mask[:, :-1].any(axis=1) | core.jobs_running(state).any(axis=1)
    return mask


def place_slot(state: core.State, slot: np.ndarray) -> tuple[core.State, np.ndarray]:
    is_void = (slot == CFG.queue_size) | state.is_done
    state = promote_queued_job(state, np.where(is_void, 0, slot))
    return state, np.where(is_void, CFG.n_machines, _deeprm_act(CFG, state))


def test_an_agent_that_picks_queued_jobs_rolls_out_through_the_same_loop() -> None:
    seen = []

    def act(x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        seen.append(x.shape)
        return random_valid_act(x, mask, rng)

    def placed_and_waiting(before, after, reward, info):
        return np.stack(
            [info["is_placed"].astype(np.float64), -core.queue_length(after).astype(np.float64)], 1
        )

    timings: dict[str, float] = {}
    out = rollout(
        CFG,
        None,
        jobs(),
        2,
        act,
        seed=4,
        timings=timings,
        encoder=lambda state: core.queue_length(state)[:, None].astype(np.float32),
        mask_fn=slot_mask,
        apply_fn=place_slot,
        reward_fn=placed_and_waiting,
    )
    n_k, n_e = out.actions.shape
    assert out.masks.shape == (n_k, n_e, CFG.queue_size + 1) and set(seen) == {(n_e, 1)}
    assert out.features.shape == (n_k, n_e, 1)
    # every action valid in its own action space; finished envs do nothing (void) and earn 0
    taken = np.take_along_axis(out.masks, out.actions[..., None], axis=2)[..., 0]
    assert taken[out.alive].all()
    assert (out.actions[~out.alive] == CFG.queue_size).all() and (out.rewards[~out.alive] == 0).all()
    assert (out.actions[out.alive] < CFG.queue_size).any()  # jobs were picked out of the visible slots
    # the components' totals: every real job placed once, and the rewards are their sums
    assert np.array_equal(out.penalty_totals[:, 0], np.repeat(jobs().n_jobs, 2).astype(np.float64))
    np.testing.assert_allclose(out.episode_returns, out.penalty_totals.sum(axis=1))
    assert not out.is_truncated.any()
    assert set(timings) == {"label", "encode", "act", "step"}


def test_a_rollout_needs_a_view() -> None:
    with pytest.raises(ValueError, match="ObservationConfig or an encoder"):
        rollout(CFG, None, jobs(), 2, random_valid_act, seed=0)
