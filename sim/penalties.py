"""TVW-RL penalty components (AAAI 2021, "Rewards Design for RL"), as small array functions.

The simulator credits them per closed time step (`sim.core`); `contention_score` is the paper's Cr(m, d) for a
whole machine history, used as the reference the per-step crediting must sum to.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def contention_score(profiles: Sequence[np.ndarray], starts: Sequence[int]) -> float:
    """Cr(m, d) = sum_{i<j} <R(W_i, d), R(W_j, d)>: time-aligned inner products of every pair of workloads that ran
    on one machine (1-D usage profiles in units, start steps), zero-padded so only the overlap counts."""
    if not profiles:
        return 0.0
    end = max(s + len(p) for s, p in zip(starts, profiles, strict=True))
    aligned = np.zeros((len(profiles), end), dtype=np.float64)
    for i, (s, p) in enumerate(zip(starts, profiles, strict=True)):
        aligned[i, s : s + len(p)] = p
    total = aligned.sum(axis=0)
    # sum_{i<j} a_i a_j = ((sum a)^2 - sum a^2) / 2 at every step
    return float(((total**2 - (aligned**2).sum(axis=0)) / 2).sum())


def contention_penalty(overlap_units2: np.ndarray, k_contention: float) -> np.ndarray:
    """P_C = -K_c * (realised pairwise overlap sum_{m,d} sum_{i<j} u_i u_j at this step), per env."""
    return -k_contention * np.asarray(overlap_units2, dtype=np.float64)


def underutil_penalty(unused_units: np.ndarray, is_used: np.ndarray, k_underutil: float) -> np.ndarray:
    """P_U = -sum_d sum_{m used} U_m(t, d)^K_u per env; unused_units (B, M, D) raw units >= 0,
    is_used (B, M) bool (a workload runs on the machine). K_u = 0 switches the penalty off: read literally,
    0^0 = 1 would charge every used machine and resource a constant, i.e. favour fewer machines, whereas TVW-RL's
    Table 3 row K_u = 0 is the one that uses the MOST machines (no packing pressure)."""
    if k_underutil == 0:
        return np.zeros(unused_units.shape[0])
    base = unused_units.astype(np.float64)
    exponent = float(k_underutil)
    if (
        unused_units.dtype.kind in "iu"
        and exponent.is_integer()
        and 1 <= exponent <= 8
        and int(unused_units.max(initial=0)) ** int(exponent) < 2**53
    ):
        # integer units to a small integer power: repeated products are exact here, hence equal to np.power
        # (which calls libm pow and is several times slower)
        powered = base
        for _ in range(int(exponent) - 1):
            powered = powered * base
    else:
        powered = np.power(base, k_underutil)
    # weights per (machine, resource) cell, summed over the M * D cells of a row as one contiguous run
    weights = np.repeat(is_used, unused_units.shape[-1], axis=-1).reshape(powered.shape)
    return -(powered * weights).sum(axis=(1, 2))


def overshoot_penalty(n_first_overshoots: np.ndarray, k_overshoot: float) -> np.ndarray:
    """P_O = -K_o per (workload, resource) overshooting for the first time at this step, per env."""
    return -k_overshoot * np.asarray(n_first_overshoots, dtype=np.float64)


def wait_penalty(queue_length: np.ndarray, k_wait: float) -> np.ndarray:
    """P_W = -K_w * |Q_t| per env (every waiting job, backlog included)."""
    return -k_wait * np.asarray(queue_length, dtype=np.float64)


def unplaced_charge(
    duration: np.ndarray,
    capacity_units: Sequence[int],
    k_contention: float,
    k_underutil: float,
    k_overshoot: float,
    k_wait: float,
) -> np.ndarray:
    """Charge per job left unplaced when an episode is truncated (array of job durations in steps -> charges >= 0).

    It is an upper bound on what placing the job could have cost itself, so that leaving work undone is always
    worse than any placement: the overshoot penalty in every resource (K_o * D), and for every step of its life a
    whole machine left unused (sum_d C_d^K_u, 0 when K_u = 0 switches P_U off), full contention with a full
    machine (K_c * sum_d C_d^2) and waiting (K_w)."""
    cap = np.asarray(capacity_units, dtype=np.float64)
    per_step = k_contention * (cap**2).sum() + k_wait
    if k_underutil != 0:
        per_step += np.power(cap, k_underutil).sum()
    return k_overshoot * cap.shape[0] + np.asarray(duration, dtype=np.float64) * per_step
