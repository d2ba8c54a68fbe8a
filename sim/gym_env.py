"""Gymnasium adapters over the batched core: `TvwEnv` (one env, B = 1) and `TvwVectorEnv` (B envs, one core call
per step, next-step autoreset).

Job sequences come from a JobBatch (each episode draws a row uniformly, or `options={"rows": [...]}` picks them)
or from a sampler `sampler(rng, n) -> JobBatch` with n rows. Observations are `sim.core.observe`'s dict without the
batch axis (backlog as shape (1,)); `action_mask` is part of it. Gymnasium's env checker samples actions without
the mask: build the env with `SimConfig(invalid_action="hold")` for it (masked actions then act as hold).

An optional `labeller` (`sim.labelling`) sets the EC labels the observation shows before every observation, i.e.
before every decision (TVW-RL Algorithm 1, UpdateECLabels); without one the jobs' own labels are shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch, pad_job_batch
from sim.labelling import Labeller

JobSource = JobBatch | Callable[[np.random.Generator, int], JobBatch]
MAX_BACKLOG = np.iinfo(np.int32).max


def observation_space(cfg: SimConfig) -> spaces.Dict:
    """Space of one env's observation (see sim.core.observe)."""
    n_m, n_d = cfg.n_machines, cfg.n_resources
    width = max(cfg.capacity_units)
    high_queue = max(cfg.n_labels, max(cfg.capacity_units))
    return spaces.Dict(
        {
            "machines": spaces.Box(0, cfg.noise_pixel, (n_m, n_d, cfg.history_steps, width), np.int8),
            "scheduled": spaces.Box(0, 127, (n_m,), np.int8),
            "queue": spaces.Box(0, high_queue, (cfg.queue_size, 1 + n_d), np.int16),
            "backlog": spaces.Box(0, MAX_BACKLOG, (1,), np.int64),
            "action_mask": spaces.MultiBinary(cfg.n_actions),
        }
    )


def _draw_jobs(source: JobSource, rng: np.random.Generator, n: int, options: dict | None) -> JobBatch:
    if isinstance(source, JobBatch):
        rows = (options or {}).get("rows")
        if rows is None:
            rows = rng.integers(0, source.batch_size, size=n)
        if len(rows) != n:
            raise ValueError(f"options['rows'] has {len(rows)} rows, expected {n}")
        return source.select(rows)
    batch = source(rng, n)
    if batch.batch_size != n:
        raise ValueError(f"job sampler returned {batch.batch_size} sequences, expected {n}")
    return batch


def _observe(cfg: SimConfig, state: core.State, labeller: Labeller | None) -> tuple[core.State, dict]:
    """(state with the labeller's labels, its observation); the state as is without a labeller."""
    if labeller is not None:
        state = core.relabel(cfg, state, labeller.labels(cfg, state))
    return state, core.observe(cfg, state)


def _row(obs: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    out = {k: v[b] for k, v in obs.items()}
    out["backlog"] = obs["backlog"][b : b + 1].astype(np.int64)
    return out


def _info(info: dict[str, np.ndarray], b: int) -> dict[str, Any]:
    return {k: v[b].item() for k, v in info.items()}


class TvwEnv(gym.Env):
    """One simulated cluster (TVW-RL state and penalties) as a Gymnasium env; Discrete(M + 1) actions."""

    metadata = {"render_modes": []}

    def __init__(
        self, jobs: JobSource, cfg: SimConfig | None = None, labeller: Labeller | None = None
    ) -> None:
        self.cfg = cfg or SimConfig()
        self.jobs = jobs
        self.labeller = labeller
        self.observation_space = observation_space(self.cfg)
        self.action_space = spaces.Discrete(self.cfg.n_actions)
        self.state: core.State | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        batch = _draw_jobs(self.jobs, self.np_random, 1, options)
        core_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.state, obs = _observe(self.cfg, core.reset(self.cfg, batch, [core_seed]), self.labeller)
        return _row(obs, 0), {"sequence_key": batch.sequence_keys[:1]}

    def step(self, action):
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        state, reward, term, trunc, info = core.step(self.cfg, self.state, np.asarray([action]))
        self.state, obs = _observe(self.cfg, state, self.labeller)
        return _row(obs, 0), float(reward[0]), bool(term[0]), bool(trunc[0]), _info(info, 0)

    def action_masks(self) -> np.ndarray:
        """(M + 1,) bool valid actions (the name MaskablePPO-style libraries look for)."""
        return core.action_mask(self.cfg, self.state)[0]


class TvwVectorEnv(VectorEnv):
    """B simulated clusters stepped by one batched core call; next-step autoreset (Gymnasium's default): the step
    after an env ends ignores its action, resets it and returns its first observation with reward 0."""

    def __init__(
        self,
        jobs: JobSource,
        num_envs: int,
        cfg: SimConfig | None = None,
        max_jobs: int | None = None,
        max_duration: int | None = None,
        labeller: Labeller | None = None,
    ) -> None:
        self.cfg = cfg or SimConfig()
        self.jobs = jobs
        self.labeller = labeller
        self.num_envs = num_envs
        self.metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self.single_observation_space = observation_space(self.cfg)
        self.single_action_space = spaces.Discrete(self.cfg.n_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = spaces.MultiDiscrete(np.full(num_envs, self.cfg.n_actions))
        if isinstance(jobs, JobBatch):
            max_jobs, max_duration = jobs.max_jobs, jobs.max_duration
        self._padding = (max_jobs, max_duration)
        self._np_random = np.random.default_rng(self.cfg.seed)
        self.state: core.State | None = None
        self._needs_reset = np.zeros(num_envs, dtype=bool)

    def _fresh(self, n: int, options: dict | None) -> core.State:
        batch = _draw_jobs(self.jobs, self._np_random, n, options)
        if self._padding[0] is None:
            self._padding = (batch.max_jobs, batch.max_duration)
        batch = pad_job_batch(batch, *self._padding)
        seeds = self._np_random.integers(0, 2**31 - 1, size=n)
        return core.reset(self.cfg, batch, seeds)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._np_random = np.random.default_rng(seed)
        self.state = self._fresh(self.num_envs, options)
        self._needs_reset[:] = False
        return self._obs(), {}

    def step(self, actions):
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        self.state, reward, term, trunc, info = core.step(self.cfg, self.state, np.asarray(actions))
        rows = np.flatnonzero(self._needs_reset)
        if rows.size:
            self.state = core.splice_states(self.state, rows, self._fresh(rows.size, None))
            reward[rows], term[rows], trunc[rows] = 0.0, False, False
        self._needs_reset = term | trunc
        return self._obs(), reward, term, trunc, info

    def _obs(self) -> dict[str, np.ndarray]:
        self.state, obs = _observe(self.cfg, self.state, self.labeller)
        obs["backlog"] = obs["backlog"][:, None]
        return obs


ENV_ID = "tvw/Placement-v0"
"""Gymnasium id of `TvwEnv` (`gymnasium.make(ENV_ID, jobs=..., cfg=...)`); its vector version is
`gymnasium.make_vec(ENV_ID, num_envs=B, vectorization_mode="vector_entry_point", jobs=..., cfg=...)`, one
batched core call per step (`TvwVectorEnv`)."""


def _make_vector(num_envs: int = 1, **kwargs) -> TvwVectorEnv:
    kwargs.pop("render_mode", None)
    return TvwVectorEnv(num_envs=num_envs, **kwargs)


def register_envs() -> None:
    """Register ENV_ID with Gymnasium (idempotent; `import sim.gym_env` does it)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=TvwEnv, vector_entry_point=_make_vector, disable_env_checker=True)


register_envs()
