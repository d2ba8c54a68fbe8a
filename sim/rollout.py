"""Lock-step rollouts for policy-gradient training (REINFORCE with a time-dependent baseline, TVW-RL / DeepRM).

`rollout` repeats each of B job sequences N times (trajectory n of sequence b is env b * N + n), resets the
B x N envs with one seed per env (drawn from the caller's seed, so trajectories of a sequence differ only by the
policy's draws and their own noise), and steps them together, one decision per env per call, without autoreset,
until every env is done. Envs that finished wait (their actions are ignored, their reward is 0, `alive` is False).
Decision k of every env is recorded: its features (`sim.observation.encode`), action mask, action and reward (the
penalties of the steps that decision closed, <= 0). `returns_to_go` and `time_baseline` give REINFORCE's
advantages. The decision index is the "time step" of the baseline: DeepRM and TVW-RL take the mean return at
step k over the N trajectories of the same sequence; here over those still alive at k.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.labelling import Labeller
from sim.observation import ObservationConfig, encode

ActFn = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]
"""(features (E, F) float32, mask (E, A) bool, rng) -> (E,) int64 valid actions."""


@dataclass(frozen=True)
class RolloutBatch:
    """K decisions of E = B x N envs (env b * N + n is trajectory n of sequence b)."""

    features: np.ndarray
    """(K, E, F) float32 encoded observation before each decision."""
    masks: np.ndarray
    """(K, E, M + 1) bool valid actions."""
    actions: np.ndarray
    """(K, E) int64 actions taken."""
    rewards: np.ndarray
    """(K, E) float64 reward of each decision (sum of the penalties it closed; 0 where not alive)."""
    alive: np.ndarray
    """(K, E) bool: the env had not finished before decision k."""
    penalty_totals: np.ndarray
    """(E, n_penalties) float64 return components per env (`sim.core.PENALTY_NAMES`)."""
    is_truncated: np.ndarray
    """(E,) bool: the env hit the safety cap (a failure)."""
    n_sequences: int
    n_trajectories: int

    @property
    def episode_returns(self) -> np.ndarray:
        """(E,) undiscounted return per env."""
        return self.rewards.sum(axis=0)


def rollout(
    cfg: SimConfig,
    obs_cfg: ObservationConfig,
    jobs: JobBatch,
    n_trajectories: int,
    act: ActFn,
    seed: int,
    labeller: Labeller | None = None,
    max_decisions: int | None = None,
    timings: dict[str, float] | None = None,
) -> RolloutBatch:
    """Roll `act` over B = jobs.batch_size sequences x n_trajectories in lock-step (see the module docstring).

    `labeller` sets the labels the features show before every decision (required when obs_cfg.labels is
    "predicted"). `timings`, when given, accumulates seconds spent labelling, encoding, acting (the policy) and
    stepping (mask + simulator) under those keys. Raises RuntimeError if the envs are not all done after `max_decisions` calls (default: a bound
    no rollout reaches: every job placed once and every step closed once)."""
    if n_trajectories < 1:
        raise ValueError(f"n_trajectories must be >= 1, got {n_trajectories}")
    if obs_cfg.labels == "predicted" and labeller is None:
        raise ValueError(
            "rollout: ObservationConfig(labels='predicted') needs a labeller (ClassifierLabeller)"
        )
    rng = np.random.default_rng(seed)
    if cfg.jobs_per_episode is not None:
        jobs = jobs.first_jobs(cfg.jobs_per_episode)  # before repeating: N copies of a short batch
    env_jobs = jobs.select(np.repeat(np.arange(jobs.batch_size), n_trajectories))
    env_seeds = rng.integers(0, 2**31 - 1, size=env_jobs.batch_size).tolist()
    state = core.reset(cfg, env_jobs, env_seeds)
    limit = max_decisions or int(env_jobs.max_jobs + cfg.max_steps + 1)
    feats, masks, acts, rewards, alive = [], [], [], [], []
    for _ in range(limit):
        is_alive = ~state.is_done
        if not is_alive.any():
            break
        t0 = time.perf_counter()
        if labeller is not None:
            state = core.relabel(cfg, state, labeller.labels(cfg, state))
        t1 = time.perf_counter()
        x = encode(cfg, obs_cfg, state)
        t2 = time.perf_counter()
        mask = core.action_mask(cfg, state)
        t3 = time.perf_counter()
        a = np.asarray(act(x, mask, rng), dtype=np.int64)
        a = np.where(is_alive, a, cfg.n_machines)
        t4 = time.perf_counter()
        state, reward, *_ = core.step(cfg, state, a, mask=mask)
        if timings is not None:
            for key, dt in (("label", t1 - t0), ("encode", t2 - t1), ("act", t4 - t3), ("step", t3 - t2)):
                timings[key] = timings.get(key, 0.0) + dt
            timings["step"] += time.perf_counter() - t4
        feats.append(x)
        masks.append(mask)
        acts.append(a)
        rewards.append(np.where(is_alive, reward, 0.0))
        alive.append(is_alive)
    if not state.is_done.all():
        raise RuntimeError(f"rollout: envs not finished after {limit} decisions")
    return RolloutBatch(
        features=np.stack(feats),
        masks=np.stack(masks),
        actions=np.stack(acts),
        rewards=np.stack(rewards),
        alive=np.stack(alive),
        penalty_totals=state.penalty_totals.copy(),
        is_truncated=state.is_truncated.copy(),
        n_sequences=jobs.batch_size,
        n_trajectories=n_trajectories,
    )


def returns_to_go(rewards: np.ndarray, discount: float = 1.0) -> np.ndarray:
    """(K, E) v_k = sum_{k' >= k} discount^(k' - k) r_k' of each env."""
    out = np.zeros_like(rewards, dtype=np.float64)
    running = np.zeros(rewards.shape[1])
    for k in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[k] + discount * running
        out[k] = running
    return out


def time_baseline(returns: np.ndarray, alive: np.ndarray, n_trajectories: int) -> np.ndarray:
    """(K, E) b_k: the mean of v_k over the trajectories of the same sequence still alive at decision k
    (DeepRM's time-dependent baseline); 0 where none is alive."""
    n_k, n_e = returns.shape
    grouped = returns.reshape(n_k, n_e // n_trajectories, n_trajectories)
    is_alive = alive.reshape(grouped.shape)
    total = (grouped * is_alive).sum(axis=2)
    count = is_alive.sum(axis=2)
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    return np.repeat(mean, n_trajectories, axis=1)


def random_valid_act(features: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random valid action per env (placements and hold alike)."""
    scores = rng.random(mask.shape) * mask
    return scores.argmax(axis=1)
