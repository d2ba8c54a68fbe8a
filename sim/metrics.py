"""Operational metrics of one episode (TVW-RL, "Metrics for Operational Excellence"), from a recorded trace.

Notation: T steps (0..T-1, the observation period until every job finished, or until truncation), M machines,
R(m,t,d) units used by workloads, A(t) the machines where a workload runs at t, U_m(t,d) = max(0, C_d - R - noise)
unused units, S(m,t,d) = max(0, R + noise - C_d) shortage. Background noise counts in U and S (it occupies the
machine), not in R (it is not a scheduled workload).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core import PENALTY_NAMES, State, Trace


@dataclass(frozen=True)
class EpisodeTrace:
    """The recorded history of one finished (or truncated) episode."""

    usage: np.ndarray
    """(T, M, D) int: R(m,t,d), workload units per machine and step."""
    background: np.ndarray
    """(T, M, D) int: background noise units (zeros without noise)."""
    is_active: np.ndarray
    """(T, M) bool: m in A(t)."""
    capacity: np.ndarray
    """(D,) int: C_d."""
    contention: np.ndarray
    """(T,) int: realised pairwise overlap sum_{m,d,i<j} u_i u_j per step; sums to sum_{m,d} Cr(m,d)."""
    penalties: np.ndarray
    """(T, 4) float: penalty components credited per step (PENALTY_NAMES order)."""
    wait_steps: np.ndarray
    """(n_placed,) int: placement step - arrival step of every placed job."""
    is_machine_placed: np.ndarray
    """(M,) bool: at least one workload was placed on the machine during the episode."""
    n_unplaced: int
    """Jobs never placed (only after truncation)."""
    is_truncated: bool = False
    """The episode hit the simulator's safety cap before every job was placed and finished: a failure."""


def episode_trace(trace: Trace, state: State, row: int) -> EpisodeTrace:
    """Cut env `row` out of a batched Trace, with placements from the episode's final State."""
    n_steps = int(min(state.t[row], trace.usage.shape[1]))
    jobs = state.jobs
    n_jobs = int(jobs.n_jobs[row])
    machine = state.job_machine[row, :n_jobs]
    is_placed = machine >= 0
    waits = state.job_start[row, :n_jobs][is_placed] - jobs.arrival_step[row, :n_jobs][is_placed]
    n_machines = trace.usage.shape[2]
    return EpisodeTrace(
        usage=trace.usage[row, :n_steps].astype(np.int64),
        background=trace.background[row, :n_steps].astype(np.int64),
        is_active=trace.is_active[row, :n_steps].copy(),
        capacity=trace.capacity.copy(),
        contention=trace.contention[row, :n_steps].copy(),
        penalties=trace.penalties[row, :n_steps].copy(),
        wait_steps=waits.astype(np.int64),
        is_machine_placed=np.bincount(machine[is_placed], minlength=n_machines) > 0,
        n_unplaced=int((~is_placed).sum()),
        is_truncated=bool(state.is_truncated[row]),
    )


def unused_units(ep: EpisodeTrace) -> np.ndarray:
    """(T, M, D) U_m(t,d) on active machines, 0 elsewhere."""
    free = np.maximum(ep.capacity - ep.usage - ep.background, 0)
    return free * ep.is_active[..., None]


def shortage_units(ep: EpisodeTrace) -> np.ndarray:
    """(T, M, D) S(m,t,d) = max(0, usage incl. noise - C_d)."""
    return np.maximum(ep.usage + ep.background - ep.capacity, 0)


def avg_util(ep: EpisodeTrace, d: int) -> float:
    """Avg Util(d) = sum_t sum_m min(R(m,t,d), C_d) / (T * max_t |A(t)| * C_d); 0 when T = 0 or no machine was
    active. Usage above capacity is not utilisation (a machine cannot deliver more than C_d): it is clipped here
    and reported separately by `avg_overshoot_pct`, so the value lies in [0, 1]."""
    n_steps = ep.usage.shape[0]
    peak_active = int(ep.is_active.sum(axis=1).max()) if n_steps else 0
    if peak_active == 0:
        return 0.0
    served = np.minimum(ep.usage[:, :, d], ep.capacity[d])
    return float(served.sum() / (n_steps * peak_active * ep.capacity[d]))


def avg_frag(ep: EpisodeTrace, d: int) -> float:
    """Avg Frag(d) = 1 - (1/T) sum_t max_{m in A(t)} U_m(t,d) / sum_{m in A(t)} U_m(t,d).

    A step whose active machines have no unused unit (or with no active machine) contributes a ratio of 1: nothing
    is fragmented then. 0 when T = 0."""
    unused = unused_units(ep)[:, :, d]
    n_steps = unused.shape[0]
    if n_steps == 0:
        return 0.0
    total = unused.sum(axis=1)
    ratio = np.where(total > 0, unused.max(axis=1) / np.maximum(total, 1), 1.0)
    return float(1.0 - ratio.sum() / n_steps)


def avg_overshoot_pct(ep: EpisodeTrace) -> float:
    """Avg Overshoot % = 100 * sum_d sum_t sum_m S(m,t,d) / (T * M * C_d), M = every machine of the cluster (the
    paper's normaliser: total capacity), summed (not averaged) over d as written in the paper. 0 when T = 0."""
    n_steps, n_machines = ep.usage.shape[:2]
    if n_steps == 0:
        return 0.0
    per_d = shortage_units(ep).sum(axis=(0, 1)) / (n_steps * n_machines * ep.capacity)
    return float(100.0 * per_d.sum())


def overshoot_pct_per_episode(trace: Trace, state: State) -> np.ndarray:
    """(B,) `avg_overshoot_pct` of every episode of a batched Trace at once (each cut at its own T, as
    `episode_trace` cuts it), without building the per-episode traces."""
    n_steps = np.minimum(state.t, trace.usage.shape[1])
    shortage = np.maximum(trace.usage.astype(np.int64) + trace.background - trace.capacity, 0)  # (B, T, M, D)
    shortage *= (np.arange(trace.usage.shape[1])[None, :] < n_steps[:, None])[..., None, None]
    per_d = shortage.sum(axis=(1, 2)) / (
        np.maximum(n_steps, 1)[:, None] * trace.usage.shape[2] * trace.capacity
    )
    return np.where(n_steps > 0, 100.0 * per_d.sum(axis=1), 0.0)


def machines_used_per_episode(state: State) -> np.ndarray:
    """(B,) `machines_used` of every episode of a batch at once, from its final State: the machines that held a
    job at some point."""
    n_envs, n_machines = state.busy_until.shape
    rows, cols = np.nonzero(state.job_machine >= 0)
    hit = np.zeros((n_envs, n_machines), dtype=bool)
    hit[rows, state.job_machine[rows, cols]] = True
    return hit.sum(axis=1)


def machines_used(ep: EpisodeTrace) -> int:
    """# of machines where at least one workload was placed at some point."""
    return int(ep.is_machine_placed.sum())


def contention_score(ep: EpisodeTrace) -> float:
    """sum_d sum_m Cr(m,d) realised during the episode (units^2)."""
    return float(ep.contention.sum())


def mean_wait(ep: EpisodeTrace) -> float:
    """Mean steps from arrival to placement over placed jobs (NaN if none was placed)."""
    return float(ep.wait_steps.mean()) if ep.wait_steps.size else float("nan")


def episode_return(ep: EpisodeTrace) -> float:
    """The undiscounted return: the sum of every penalty component over the episode (<= 0; higher is better)."""
    return float(ep.penalties.sum())


def episode_metrics(ep: EpisodeTrace) -> dict[str, float]:
    """Every metric of one episode, flat, names with units; per-resource metrics for d = cpu (0), mem (1), ...

    `episode_return` is the sum of rewards (<= 0, higher is better); `cost_<component>` are the penalty components
    as positive costs (lower is better) in PENALTY_NAMES order, so episode_return = -sum of the costs;
    `is_truncated` is 1.0 when the episode hit the safety cap (a failure)."""
    n_res = ep.capacity.shape[0]
    names = ("cpu", "mem")[:n_res] if n_res <= 2 else tuple(f"r{d}" for d in range(n_res))
    out: dict[str, float] = {"n_steps": float(ep.usage.shape[0])}
    for d, name in enumerate(names):
        out[f"avg_util_{name}_frac"] = avg_util(ep, d)
        out[f"avg_frag_{name}_frac"] = avg_frag(ep, d)
    out["avg_overshoot_pct"] = avg_overshoot_pct(ep)
    out["machines_used"] = float(machines_used(ep))
    out["contention_score_units2"] = contention_score(ep)
    out["mean_wait_steps"] = mean_wait(ep)
    out["n_unplaced"] = float(ep.n_unplaced)
    out["is_truncated"] = float(ep.is_truncated)
    out["episode_return"] = episode_return(ep)
    for i, name in enumerate(PENALTY_NAMES):
        out[f"cost_{name}"] = float(-ep.penalties[:, i].sum()) + 0.0  # + 0.0: no -0.0 in tables
    return out


def machines_lower_bound(jobs, capacity_units) -> np.ndarray:
    """(B,) an offline bound on the machines each sequence needs: max over steps t and resources d of
    ceil(total usage at t / C_d), with every job running from its arrival (no waiting), i.e. the fewest machines
    that could hold the demand of the busiest step even with perfect packing. A schedule that delays jobs can
    lower its own peak, so it is a bound for schedules that start jobs on arrival, and a yardstick otherwise."""
    cap = np.asarray(capacity_units, dtype=np.float64)
    out = np.zeros(jobs.batch_size, dtype=np.int64)
    for b in range(jobs.batch_size):
        n = int(jobs.n_jobs[b])
        if n == 0:
            continue
        arrival, duration = jobs.arrival_step[b, :n], jobs.duration[b, :n]
        demand = np.zeros((int((arrival + duration).max()) + 1, cap.shape[0]))
        for j in range(n):
            demand[arrival[j] : arrival[j] + duration[j]] += jobs.usage[b, j, : duration[j]]
        out[b] = int(np.ceil(demand / cap - 1e-9).max())
    return out
