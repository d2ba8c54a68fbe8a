"""Lock-step rollouts for policy-gradient training (REINFORCE with a time-dependent baseline, TVW-RL / DeepRM).

`rollout` repeats each of B job sequences N times (trajectory n of sequence b is env b * N + n), resets the
B x N envs with one seed per env (drawn from the caller's seed, so trajectories of a sequence differ only by the
policy's draws and their own noise), and steps them together, one decision per env per call, without autoreset,
until every env is done. Envs that finished wait (their actions are ignored, their reward is 0, `alive` is False).
Decision k of every env is recorded: its features (`sim.observation.encode`), action mask, action and reward (the
penalties of the steps that decision closed, <= 0). `returns_to_go` and `time_baseline` give REINFORCE's
advantages. The decision index is the "time step" of the baseline: DeepRM and TVW-RL take the mean return at
step k over the N trajectories of the same sequence; here over those still alive at k.

By default the agent is the simulator's own: it sees `sim.observation.encode`, chooses among the M + 1 actions of
`sim.core.action_mask` (a machine or hold) and is rewarded with the simulator's penalties. An agent with its own
view, action space or reward plugs in through four hooks, each replacing one default (`rollout`'s keyword
arguments; DeepRM's agent, which picks a queued job rather than a machine, uses all four):
- `encoder(state)`: its features, (E, F) float32;
- `mask_fn(state)`: its valid actions, (E, A) bool, the last of which (A - 1) does nothing (hold, void) and is
  the action recorded for envs that have finished;
- `apply_fn(state, actions)`: what its actions do, as (the state to step, the simulator's actions in 0..M), e.g.
  a chosen queued job moved to the head and the machine that takes it (the state it returns is stepped in place:
  it may share arrays with the state it was given, which is not read again);
- `reward_fn(before, after, reward, info)`: its reward components, (E, C), of the simulator call that stepped
  `before` into `after` (`reward` and `info` as `sim.core.step` returns them); their sum is the decision's
  reward and their totals per env are `penalty_totals`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.core import State
from sim.jobs import JobBatch
from sim.labelling import Labeller
from sim.observation import ObservationConfig, encode

ActFn = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]
"""(features (E, F) float32, mask (E, A) bool, rng) -> (E,) int64 valid actions."""
EncodeFn = Callable[[State], np.ndarray]
"""state -> (E, F) float32 features of every env."""
MaskFn = Callable[[State], np.ndarray]
"""state -> (E, A) bool valid actions of every env; action A - 1 does nothing (hold, void)."""
ApplyFn = Callable[[State, np.ndarray], tuple[State, np.ndarray]]
"""(state, (E,) actions) -> (the state to step, (E,) simulator actions in 0..M)."""
RewardFn = Callable[[State, State, np.ndarray, dict[str, np.ndarray]], np.ndarray]
"""(state stepped, state after, simulator reward (E,), simulator info) -> (E, C) float64 reward components."""


@dataclass(frozen=True)
class RolloutBatch:
    """K decisions of E = B x N envs (env b * N + n is trajectory n of sequence b)."""

    features: np.ndarray
    """(K, E, F) float32 encoded observation before each decision."""
    masks: np.ndarray
    """(K, E, A) bool valid actions (A = M + 1 unless the agent has its own action space)."""
    actions: np.ndarray
    """(K, E) int64 actions taken."""
    rewards: np.ndarray
    """(K, E) float64 reward of each decision (sum of the penalties it closed, or of its reward components;
    0 where not alive)."""
    alive: np.ndarray
    """(K, E) bool: the env had not finished before decision k."""
    penalty_totals: np.ndarray
    """(E, n_penalties) float64 return components per env (`sim.core.PENALTY_NAMES`; with a reward_fn, the
    totals of its components)."""
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
    obs_cfg: ObservationConfig | None,
    jobs: JobBatch,
    n_trajectories: int,
    act: ActFn,
    seed: int,
    labeller: Labeller | None = None,
    max_decisions: int | None = None,
    timings: dict[str, float] | None = None,
    *,
    encoder: EncodeFn | None = None,
    mask_fn: MaskFn | None = None,
    apply_fn: ApplyFn | None = None,
    reward_fn: RewardFn | None = None,
) -> RolloutBatch:
    """Roll `act` over B = jobs.batch_size sequences x n_trajectories in lock-step (see the module docstring).

    `labeller` sets the labels the features show before every decision (required when obs_cfg.labels is
    "predicted"). `encoder`, `mask_fn`, `apply_fn` and `reward_fn` replace the default view, action space and
    reward (module docstring); obs_cfg may be None when `encoder` is given. `timings`, when given, accumulates
    seconds spent labelling, encoding, acting (the policy) and stepping (mask, apply_fn, simulator, reward_fn)
    under those keys. Raises RuntimeError if the envs are not all done after `max_decisions` calls (default: a
    bound no rollout reaches: every job placed once and every step closed once)."""
    if n_trajectories < 1:
        raise ValueError(f"n_trajectories must be >= 1, got {n_trajectories}")
    if encoder is None:
        if obs_cfg is None:
            raise ValueError("rollout: give an ObservationConfig or an encoder")
        if obs_cfg.labels == "predicted" and labeller is None:
            raise ValueError(
                "rollout: ObservationConfig(labels='predicted') needs a labeller (ClassifierLabeller)"
            )

        def encoder(state: State) -> np.ndarray:
            return encode(cfg, obs_cfg, state)

    rng = np.random.default_rng(seed)
    if cfg.jobs_per_episode is not None:
        jobs = jobs.first_jobs(cfg.jobs_per_episode)  # before repeating: N copies of a short batch
    prepare = getattr(labeller, "prepare", None)
    if prepare is not None:  # the labeller's per-job rows once per sequence, not per trajectory
        prepare(cfg, jobs)
    env_jobs = jobs.select(np.repeat(np.arange(jobs.batch_size), n_trajectories))
    env_seeds = rng.integers(0, 2**31 - 1, size=env_jobs.batch_size).tolist()
    state = core.reset(cfg, env_jobs, env_seeds)
    # the envs' states are this loop's own: the step writes them in place (`core.step`), unless a reward hook
    # reads the state before a step after it
    in_place = reward_fn is None
    limit = max_decisions or int(env_jobs.max_jobs + cfg.max_steps + 1)
    feats, masks, acts, rewards, alive = [], [], [], [], []
    totals = None
    for _ in range(limit):
        is_alive = ~state.is_done
        if not is_alive.any():
            break
        t0 = time.perf_counter()
        if labeller is not None:
            state = core.relabel(cfg, state, labeller.labels(cfg, state))
        t1 = time.perf_counter()
        x = encoder(state)
        t2 = time.perf_counter()
        mask = core.action_mask(cfg, state) if mask_fn is None else mask_fn(state)
        t3 = time.perf_counter()
        a = np.asarray(act(x, mask, rng), dtype=np.int64)
        a = np.where(is_alive, a, mask.shape[1] - 1)
        t4 = time.perf_counter()
        if apply_fn is None:
            before, sim_actions = state, a
        else:
            before, sim_actions = apply_fn(state, a)
        # the simulator's own mask is passed on; another action space's is not the simulator's
        state, reward, _, _, info = core.step(
            cfg,
            before,
            sim_actions,
            mask=mask if mask_fn is None and apply_fn is None else None,
            in_place=in_place,
        )
        if reward_fn is None:
            reward = np.where(is_alive, reward, 0.0)
        else:
            parts = np.where(is_alive[:, None], reward_fn(before, state, reward, info), 0.0)
            totals = np.zeros_like(parts) if totals is None else totals
            totals += parts
            reward = parts.sum(axis=1)
        if timings is not None:
            for key, dt in (("label", t1 - t0), ("encode", t2 - t1), ("act", t4 - t3), ("step", t3 - t2)):
                timings[key] = timings.get(key, 0.0) + dt
            timings["step"] += time.perf_counter() - t4
        feats.append(x)
        masks.append(mask)
        acts.append(a)
        rewards.append(reward)
        alive.append(is_alive)
    if not state.is_done.all():
        raise RuntimeError(f"rollout: envs not finished after {limit} decisions")
    return RolloutBatch(
        features=np.stack(feats),
        masks=np.stack(masks),
        actions=np.stack(acts),
        rewards=np.stack(rewards),
        alive=np.stack(alive),
        penalty_totals=state.penalty_totals.copy() if totals is None else totals,
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
