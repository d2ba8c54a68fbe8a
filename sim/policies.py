"""Schedulers: heuristic baselines behind one registry (`POLICIES`), shared later with learned policies.

A policy maps a batched simulator state to one action per env (`sim.core`): 0..M-1 places the queue head on
that machine, M holds. Every policy here returns only actions allowed by `sim.core.action_mask`, and holds when
nothing fits by its own rule. Requests are peak-based (the table's `*_request_units`, the job's peak usage by
default), as TVW-RL gives Tetris and DeepRM.

Which job goes next: the simulator places only the queue head. A policy that chooses among queued jobs (DeepRM's
SJF and Packer) also has `pick_job(cfg, state, rng) -> (B,) visible slot`; `decide` moves that job to the head
with `promote_queued_job` (the others keep their FIFO order) before calling `act`. Since every queued job has
already arrived, the reorder keeps the simulator's invariants (arrived jobs precede the rest, placed jobs are a
prefix). The same hook serves a learned DeepRM agent.

Baselines (TVW-RL "Baselines", DeepRM section 4.1, kube-scheduler's default scoring):
- best_fit: FIFO; among machines the head fits on now (the action mask), the one with the fewest available units
  of the head's dominant resource on CURRENT usage (TVW-RL's vanilla Best-Fit, blind to future usage).
- first_fit: the lowest-index machine the head fits on.
- random_valid: a uniformly random machine the head fits on.
- tetris: Tetris (Grandl et al. 2014) with the fairness knob off: machine by machine (lowest index first), the
  queued job that fits the machine (by requests) with the best alignment dot(request / C, free / C).
- kube_default: kube-scheduler's NodeResourcesFit filter on requests, then LeastAllocated + BalancedAllocation
  (equal weights; scores 0..100) on requests including the pod's; ties broken at random like kube-scheduler.
- deeprm_sjf / deeprm_packer: DeepRM's heuristics on its monolithic view (capacity M x C_d, peak requests): the
  shortest visible job (SJF) or the one best aligned with the cluster's free capacity (Packer); when the preferred
  job fits no single machine (fragmentation) the next one in preference order is tried before holding; Best-Fit by
  requests then picks the machine (TVW-RL feeds DeepRM's job through Best-Fit).
- noop: never places (a sanity baseline; it must have the worst return).
- ec_peak_aware (ours, deployable): predicts usage from EC profiles learned on training sequences
  (`sim.profiles`): a job's usage at age a = its label's profile at a x its request. The head's predicted life and
  each machine's predicted future (observed usage now, then its running jobs' profiles at their ages) must stay
  within C_d over the horizon on an already used machine (lowest predicted peak, then least predicted overlap),
  else it opens an empty machine, else holds. It reads observed labels, requests, start steps, which jobs run
  now and the current usage; never a job's duration or future usage.
- foresight_peak_aware (not deployable, and NOT a bound: greedy with foresight still loses to other policies on
  some metrics): the same rule on the TRUE future usage of the head and of the placed jobs; it shows what perfect
  knowledge of usage buys this greedy rule.

Policies that take learned EC profiles have a `profiles` constructor keyword (`accepts_profiles(name)`);
`make_policy(name)` builds every policy without arguments.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.core import (
    State,
    Trace,
    action_mask,
    committed_future_usage,
    current_usage,
    jobs_running,
    machines_used,
    observed_labels,
    placed_requests,
    queue_head,
    queue_length,
)
from sim.jobs import JobBatch, rotation_index
from sim.profiles import EcProfiles
from sim.risk import (
    OVERSHOOT_GUARD_BUDGET_PCT,
    PEAK_RULES,
    PeakPredictorPacking,
    RequestForecaster,
    RiskAwarePacking,
    RiskConfig,
    fit_forecast_risk,
    fit_forecast_truth,
    fit_hybrid,
    fit_peak_adaptive,
    fit_peak_predictor,
    fit_peak_rule,
    fit_peak_truth,
    fit_recall_rule,
)


@runtime_checkable
class Policy(Protocol):
    """A scheduler: one action per env, only valid ones (hold = M when nothing fits)."""

    name: str

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        """(B,) int64 actions in 0..M."""
        ...


@runtime_checkable
class JobPicker(Protocol):
    """A policy that also chooses which visible queued job goes next (DeepRM)."""

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        """(B,) int64 slot in 0..queue_size-1 of the job to place next (0 = the head)."""
        ...


# --- shared helpers -------------------------------------------------------------------------------


def _capacity(cfg: SimConfig) -> np.ndarray:
    return np.asarray(cfg.capacity_units, dtype=np.int64)


def free_by_requests(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, M, D) int64: C_d minus the requests of the jobs running on each machine (may be negative)."""
    return _capacity(cfg)[None, None, :] - placed_requests(state)


def dominant_resource(request: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """(B,) index of the resource with the largest request share of C_d (first on ties)."""
    return np.argmax(request / capacity[None, :], axis=1)


def choose(score: np.ndarray, allowed: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """(B,) argmax of `score` (B, M) over allowed machines; M (hold) where none is allowed.

    Ties go to the lowest index, or to a uniformly random one of the best when `rng` is given.
    """
    n_envs, n_m = score.shape
    masked = np.where(allowed, score.astype(np.float64), -np.inf)
    if rng is not None:
        best = masked == masked.max(axis=1, keepdims=True)
        masked = np.where(best & allowed, rng.random((n_envs, n_m)), -np.inf)
    actions = np.argmax(masked, axis=1).astype(np.int64)
    return np.where(allowed.any(axis=1), actions, n_m)


def valid_machines(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, M) bool: machines the simulator lets the head go to now."""
    return action_mask(cfg, state)[:, : cfg.n_machines]


def fits_by_requests(cfg: SimConfig, state: State, request: np.ndarray) -> np.ndarray:
    """(B, M) bool: placing a job with `request` (B, D) keeps every machine's requests within C_d."""
    free = free_by_requests(cfg, state)
    fits = free[:, :, 0] >= request[:, None, 0]
    for d in range(1, free.shape[2]):  # one (B, M) comparison per resource: D is tiny
        fits &= free[:, :, d] >= request[:, None, d]
    return fits


def _best_fit_scores(free: np.ndarray, request: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """(B, M) score = minus the available units of the job's dominant resource (fewest left wins)."""
    dom = dominant_resource(request, capacity)
    return -np.take_along_axis(free, dom[:, None, None], axis=2)[..., 0]


# --- queue reordering (DeepRM) --------------------------------------------------------------------


def visible_queue(cfg: SimConfig, state: State, n_slots: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Job indices (B, K) of the K = queue_size visible slots (the first `n_slots` of them, where given) and
    whether each slot holds a waiting job."""
    n_slots = cfg.queue_size if n_slots is None else min(n_slots, cfg.queue_size)
    slots = state.next_job[:, None] + np.arange(n_slots)[None, :]
    is_waiting = (slots < state.n_arrived[:, None]) & ~state.is_done[:, None]
    return np.minimum(slots, state.jobs.max_jobs - 1), is_waiting


def queued_fits(
    cfg: SimConfig, state: State, n_slots: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the K visible queued jobs (the first `n_slots`, where given: each slot's answer is its own): (job index
    (B, K), request (B, K, D) int64, fits (B, K, M) bool), where fits[b, k, m] says that job k could go to machine
    m now: the simulator's placement rule for it (as `action_mask` applies it to the head) and its request within
    the machine's free capacity by requests."""
    jobs_idx, is_waiting = visible_queue(cfg, state, n_slots)
    rows = np.arange(state.batch_size)[:, None]
    request = state.jobs.request[rows, jobs_idx].astype(np.int64)  # (B, K, D)
    cap = _capacity(cfg)
    fits = np.broadcast_to(is_waiting[..., None], (*jobs_idx.shape, cfg.n_machines)).copy()
    free = free_by_requests(cfg, state)
    # one (B, K, M) comparison per resource: numpy reduces a short last axis slowly
    if cfg.placement_check != "none":
        need = state.jobs.usage[rows, jobs_idx, 0] if cfg.placement_check == "first_step" else request
        used = current_usage(cfg, state)
        for d in range(cap.size):
            fits &= used[:, None, :, d] + need[:, :, None, d] <= cap[d]
    for d in range(cap.size):
        fits &= free[:, None, :, d] >= request[:, :, None, d]
    return jobs_idx, request, fits


def promote_queued_job(state: State, slot: np.ndarray, in_place: bool = False) -> State:
    """A state whose queue has the job at visible `slot` (B,) moved to the head; the jobs it passes keep their
    order. Only waiting jobs move, so every simulator invariant holds. The JobBatch and the observed labels are
    copied, not mutated, unless `in_place`: then they are reordered in place (`JobBatch.rotate_in_place`), for a
    rollout that owns its batch (`own_jobs`) and keeps no earlier state."""
    slot = np.asarray(slot, dtype=np.int64)
    rows = np.flatnonzero(slot > 0)
    if rows.size == 0:
        return state
    jobs = state.jobs
    head = state.next_job[rows]
    if (head + slot[rows] >= state.n_arrived[rows]).any():
        b = int(rows[np.argmax(head + slot[rows] >= state.n_arrived[rows])])
        raise ValueError(
            f"env {b}: slot {slot[b]} is not a waiting job (queue length {queue_length(state)[b]})"
        )
    # rotate the range [head, head + slot] of each affected row right by one: the picked job lands on the head
    last = head + slot[rows]
    from sim.compiled_batch import rotate_rows  # loads numba: on first use

    obs_label = state.obs_label
    if obs_label is not None:
        if not in_place:
            obs_label = obs_label.copy()
        if not rotate_rows(obs_label, rows, head, last):
            r, to, frm = rotation_index(rows, head, last)
            obs_label[r, to] = obs_label[r, frm]
    if in_place:
        jobs.rotate_in_place(rows, head, last)
    else:
        jobs = jobs.rotated(rows, head, last)
    out = replace(state, jobs=jobs, obs_label=obs_label)
    core.share_memo(state, out)  # running jobs and their requests are unchanged
    return out


def own_jobs(state: State) -> State:
    """The state with a JobBatch of its own (`JobBatch.owned_copy`), so that `decide(..., in_place=True)` may
    reorder it: once per episode instead of a whole copy at every reordering."""
    return replace(state, jobs=state.jobs.owned_copy())


def play(
    policy: Policy,
    cfg: SimConfig,
    jobs: JobBatch,
    seed: int,
    trace: Trace | None = None,
    max_decisions: int | None = None,
) -> State:
    """The state after rolling `policy` over the B sequences of `jobs` until every episode ends or `max_decisions`
    decisions were made (default: a bound no valid rollout reaches, every job placed once and every step held
    once); the caller checks `is_done`. The simulator is reset with `seed` and the policy draws from
    default_rng(seed); the episodes own a copy of their batch, which job picks reorder in place (`own_jobs`),
    and their state, which the step writes in place (`core.step`'s `in_place`).
    `trace`, when given, records every step (`core.make_trace`)."""
    rng = np.random.default_rng(seed)
    state = own_jobs(core.reset(cfg, jobs, seed))
    for _ in range(max_decisions or int(jobs.max_jobs + cfg.max_steps + 1)):
        if state.is_done.all():
            break
        state, actions = decide(policy, cfg, state, rng, in_place=True)
        state, *_ = core.step(cfg, state, actions, trace, in_place=True)
    return state


def decide(
    policy: Policy, cfg: SimConfig, state: State, rng: np.random.Generator, in_place: bool = False
) -> tuple[State, np.ndarray]:
    """(state to step from, actions): applies a JobPicker's choice of queued job, then asks for the machine.
    `in_place`: the pick reorders the state's own batch (`own_jobs`) instead of a copy."""
    state = pick(policy, cfg, state, rng, in_place)
    return state, place(policy, cfg, state, rng)


def pick(
    policy: Policy, cfg: SimConfig, state: State, rng: np.random.Generator, in_place: bool = False
) -> State:
    """`decide`'s first half: the state with a JobPicker's choice of queued job at the head (as it was for a FIFO
    policy); what a caller that reads the head the policy will place needs before `place`."""
    if isinstance(policy, JobPicker):
        return promote_queued_job(state, policy.pick_job(cfg, state, rng), in_place)
    return state


def place(policy: Policy, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
    """`decide`'s second half: (B,) the policy's machine for the head `pick` left, under the hold rule."""
    actions = np.asarray(policy.act(cfg, state, rng), dtype=np.int64)
    if cfg.hold_rule == "no_fit":
        # TVW-RL's rule forbids holding while some machine can take the head: a heuristic whose own rule (its
        # requests, its prediction) would hold must place, on the lowest-index machine the simulator allows
        mask = action_mask(cfg, state)
        is_forbidden = ~mask[np.arange(state.batch_size), actions]
        first_allowed = np.argmax(mask, axis=1)
        actions = np.where(is_forbidden, first_allowed, actions)
    return actions


# --- the heuristics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestFit:
    """FIFO; the fitting machine with the fewest available units of the head's dominant resource now."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "best_fit"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        head = queue_head(state)
        free = _capacity(cfg)[None, None, :] - current_usage(cfg, state)
        return choose(_best_fit_scores(free, head.request, _capacity(cfg)), valid_machines(cfg, state))


@dataclass(frozen=True)
class FirstFit:
    """FIFO; the lowest-index machine the head fits on."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "first_fit"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return choose(np.zeros((state.batch_size, cfg.n_machines)), valid_machines(cfg, state))


@dataclass(frozen=True)
class RandomValid:
    """FIFO; a uniformly random machine among those the head fits on."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "random_valid"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return choose(np.zeros((state.batch_size, cfg.n_machines)), valid_machines(cfg, state), rng)


@dataclass(frozen=True)
class Tetris:
    """Tetris (Grandl et al. 2014) as DeepRM and TVW-RL use it, fairness knob off: machine by machine (lowest index
    first), among the visible queued jobs that fit the machine (by requests and the simulator's rule), place the
    one with the best alignment score dot(request / C, free_by_requests / C), plus `short_job_weight` / duration
    (Tetris' shortest-remaining-time term; 0 = off). Holds when no queued job fits any machine."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    short_job_weight: float = 0.0
    """Weight of the 1 / duration term added to the alignment score (0: alignment only)."""
    name: str = "tetris"

    def _scores(self, cfg: SimConfig, state: State) -> tuple[np.ndarray, np.ndarray]:
        """(score (B, K, M), fits (B, K, M))."""
        cap = _capacity(cfg)
        jobs_idx, request, fits = queued_fits(cfg, state)
        free = free_by_requests(cfg, state)
        score = ((request[:, :, None, :] / cap) * (free[:, None] / cap)).sum(axis=3)
        if self.short_job_weight:
            score = score + self.short_job_term(cfg, state)[..., None]
        return score, fits

    def short_job_term(self, cfg: SimConfig, state: State) -> np.ndarray:
        """(B, K) `short_job_weight` / duration of each visible queued job (added to its alignment score)."""
        jobs_idx, _ = visible_queue(cfg, state)
        duration = state.jobs.duration[np.arange(state.batch_size)[:, None], jobs_idx]
        return self.short_job_weight / np.maximum(duration, 1)

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim import compiled_decision  # loads numba: on first use

        extra = (
            self.short_job_term(cfg, state)
            if self.short_job_weight
            else np.zeros((state.batch_size, cfg.queue_size))
        )
        picked = compiled_decision.tetris_pick(cfg, state, extra)  # the same slots
        if picked is not None:
            return picked
        score, fits = self._scores(cfg, state)
        machine = np.argmax(fits.any(axis=1), axis=1)  # first machine some queued job fits
        rows = np.arange(state.batch_size)
        on_machine = np.where(fits[rows, :, machine], score[rows, :, machine], -np.inf)
        return np.where(fits.any(axis=(1, 2)), np.argmax(on_machine, axis=1), 0)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        # the machine pick_job chose for the (promoted) head: the first one it fits
        head_fits = queued_fits(cfg, state, n_slots=1)[2][:, 0]
        return choose(np.zeros((state.batch_size, cfg.n_machines)), head_fits)


@dataclass(frozen=True)
class Noop:
    """Sanity baseline: never places a job (always holds). Its episodes hit the safety cap with every job charged,
    so it must have the worst return of all policies at every load."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "noop"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return np.full(state.batch_size, cfg.n_machines, dtype=np.int64)


def kube_scores(requested: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """kube-scheduler default score (0..200) of nodes with `requested` (B, M, D) units after adding the pod.

    LeastAllocated: mean over resources of (C - requested) / C * 100 (equal weights).
    BalancedAllocation: (1 - std over resources of min(requested / C, 1)) * 100, population std.
    """
    frac = requested / capacity
    least = ((1.0 - frac) * 100.0).mean(axis=2)
    balanced = (1.0 - np.minimum(frac, 1.0).std(axis=2)) * 100.0
    return least + balanced


@dataclass(frozen=True)
class KubeDefault:
    """FIFO; NodeResourcesFit filter on requests, LeastAllocated + BalancedAllocation score, random ties."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "kube_default"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        request = queue_head(state).request.astype(np.int64)
        requested = placed_requests(state) + request[:, None, :]
        allowed = valid_machines(cfg, state) & fits_by_requests(cfg, state, request)
        return choose(kube_scores(requested, _capacity(cfg)), allowed, rng)


def _deeprm_pick(cfg: SimConfig, state: State, preference: np.ndarray) -> np.ndarray:
    """(B,) slot of the most preferred visible job (highest `preference` (B, K)) that fits some single machine
    now (DeepRM picks on its monolithic view; a job that fits no machine is skipped for the next one, so
    fragmentation does not block the queue); 0 (the head, which then holds) when none fits. Decided by
    `sim.compiled_decision.deeprm_pick` (the same slots) unless it is switched off."""
    from sim import compiled_decision  # loads numba: on first use

    picked = compiled_decision.deeprm_pick(cfg, state, preference)
    if picked is not None:
        return picked
    _, _, fits = queued_fits(cfg, state)
    is_pickable = fits.any(axis=2)
    slot = np.argmax(np.where(is_pickable, preference, -np.inf), axis=1)
    return np.where(is_pickable.any(axis=1), slot, 0)


def _deeprm_act(cfg: SimConfig, state: State) -> np.ndarray:
    """Best-Fit by requests for the head (the job DeepRM picked): fewest free units of its dominant resource."""
    request = queue_head(state).request.astype(np.int64)
    allowed = valid_machines(cfg, state) & fits_by_requests(cfg, state, request)
    return choose(_best_fit_scores(free_by_requests(cfg, state), request, _capacity(cfg)), allowed)


@dataclass(frozen=True)
class DeepRMSJF:
    """DeepRM's Shortest-Job-First: the shortest visible job that fits some machine (next shortest when it does
    not), placed by Best-Fit on requests."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "deeprm_sjf"

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim import compiled_decision  # loads numba: on first use

        picked = compiled_decision.sjf_pick(cfg, state)  # the same slots, the preference computed there
        if picked is not None:
            return picked
        jobs_idx, _ = visible_queue(cfg, state)
        duration = state.jobs.duration[np.arange(state.batch_size)[:, None], jobs_idx]
        # ties to the earliest slot: -duration, then a tiny slot penalty
        return _deeprm_pick(cfg, state, -duration - 1e-3 * np.arange(cfg.queue_size)[None, :])

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return _deeprm_act(cfg, state)


@dataclass(frozen=True)
class DeepRMPacker:
    """DeepRM's Packer: the visible job best aligned with the monolithic free capacity (dot(request, free) over
    the cluster as one pool) among those that fit some machine, placed by Best-Fit on requests."""

    reads_labels = False  # requests and current usage only (sim.labelling.reads_labels)

    name: str = "deeprm_packer"

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim import compiled_decision  # loads numba: on first use

        picked = compiled_decision.packer_pick(cfg, state)  # the same slots, the preference computed there
        if picked is not None:
            return picked
        jobs_idx, _ = visible_queue(cfg, state)
        request = state.jobs.request[np.arange(state.batch_size)[:, None], jobs_idx].astype(np.int64)
        total = cfg.n_machines * _capacity(cfg)
        total_free = total[None, :] - placed_requests(state).sum(axis=1)
        align = ((request / total) * (total_free / total)[:, None, :]).sum(axis=2)
        return _deeprm_pick(cfg, state, align)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return _deeprm_act(cfg, state)


def choose_lowest_peak(
    peak: np.ndarray, overlap: np.ndarray, allowed: np.ndarray, used: np.ndarray, n_machines: int
) -> np.ndarray:
    """(B,) the allowed used machine with the lowest `peak` (B, M), ties (1e-9) to the least `overlap` then the
    lowest index; else the lowest-index allowed unused machine; else M (hold)."""
    pack_ok = allowed & used
    best = np.where(pack_ok, peak, np.inf).min(axis=1, keepdims=True)
    pack = choose(-overlap, pack_ok & (peak <= best + 1e-9))
    spread = choose(np.zeros_like(peak), allowed & ~used)
    return np.where(pack < n_machines, pack, spread)


@dataclass(frozen=True)
class ForesightPeakAware:
    """The peak-aware rule with perfect foresight, NOT a deployable scheduler and not a bound on other policies: reads the head's true usage profile and the
    placed jobs' true committed usage, packs onto used machines where head + committed stays within C_d (lowest
    peak, then least overlap), else opens an empty machine, else holds rather than overshoot."""

    name: str = "foresight_peak_aware"
    is_oracle = True  # reads the true future: a yardstick, never a winner

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        cap = _capacity(cfg)
        head = queue_head(state)
        horizon = state.jobs.max_duration
        profile = head.usage.astype(np.int64).transpose(0, 2, 1)[:, None]  # (B, 1, D, T)
        committed = committed_future_usage(state, horizon)  # (B, M, D, T)
        combined = committed + profile
        peak = (combined / cap[None, None, :, None]).max(axis=(2, 3))  # (B, M) share of capacity
        is_safe = (combined <= cap[None, None, :, None]).all(axis=(2, 3))
        overlap = (committed * profile).sum(axis=(2, 3)).astype(np.float64)
        used = machines_used(state) | (committed > 0).any(axis=(2, 3))
        return choose_lowest_peak(peak, overlap, valid_machines(cfg, state) & is_safe, used, cfg.n_machines)


def predicted_machine_usage(cfg: SimConfig, state: State, profiles: EcProfiles, horizon: int) -> np.ndarray:
    """(B, M, horizon, D) float64 predicted units per machine at t, t+1, ...: the observed usage (noise included)
    at t; from t+1 on, the sum over the jobs running now of profile(label, age) x request (their durations and
    true usage are not read, so a job is predicted to run as long as its label's profile lasts)."""
    n_envs, n_m = state.batch_size, cfg.n_machines
    out = np.zeros((n_envs, n_m, horizon, cfg.n_resources))
    out[:, :, 0] = current_usage(cfg, state)
    bi, ji = np.nonzero(jobs_running(state))
    ages = (state.t[bi] - state.job_start[bi, ji])[:, None] + np.arange(1, horizon)[None, :]  # (N, H-1)
    labels = observed_labels(state)[bi, ji]
    units = profiles.predict(labels[:, None], ages) * state.jobs.request[bi, ji][:, None, :]  # (N, H-1, D)
    np.add.at(out[:, :, 1:], (bi, state.job_machine[bi, ji]), units)
    return out


@dataclass(frozen=True)
class ECProfilePeakAware:
    """Ours: avoids co-locating predicted peaks using EC profiles (`sim.profiles`), learned on training sequences.

    Predicted head usage at age a = profile(head's observed label, a) x its request; predicted machine future
    = `predicted_machine_usage`. Packs the head onto a used machine where predicted head + machine stays within
    C_d at every step of the horizon (the profile's length + 1, the current step included), lowest predicted
    peak share first, then least predicted overlap; else opens an empty machine; else holds. Only actions the
    mask allows. Without profiles (None) every label's profile is flat 1 for ever: request-based peak packing
    (the head's request on top of the observed usage now and of the running jobs' requests later)."""

    profiles: EcProfiles | None = field(default=None, repr=False, compare=False)
    """EC profiles of the training sequences, or None (flat: request-based)."""
    name: str = "ec_peak_aware"

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        profiles = self.profiles or EcProfiles.flat(cfg.n_labels, cfg.n_resources)
        cap = _capacity(cfg).astype(np.float64)
        horizon = profiles.horizon + 1
        rows = np.arange(state.batch_size)
        head_label = observed_labels(state)[rows, np.minimum(state.next_job, state.jobs.max_jobs - 1)]
        head = queue_head(state)
        head_units = (
            profiles.predict(head_label[:, None], np.arange(horizon)[None, :]) * head.request[:, None, :]
        )
        machine = predicted_machine_usage(cfg, state, profiles, horizon)  # (B, M, H, D)
        combined = machine + head_units[:, None]
        peak = (combined / cap).max(axis=(2, 3))
        is_safe = (combined <= cap + 1e-9).all(axis=(2, 3))
        overlap = (machine * head_units[:, None]).sum(axis=(2, 3))
        allowed = valid_machines(cfg, state) & is_safe
        return choose_lowest_peak(peak, overlap, allowed, machines_used(state), cfg.n_machines)


def learned_policy(factory: Callable[..., Policy]) -> Callable[..., Policy]:
    """A registry constructor for a learned policy: `factory(checkpoint=None, **kwargs)` builds it from a saved
    policy (None: its seeded untrained network, built on the first `act` from the SimConfig it is given)."""

    def make(checkpoint=None, **kwargs) -> Policy:
        return factory(checkpoint=checkpoint, **kwargs)

    make.is_learned = True  # type: ignore[attr-defined]
    make.__qualname__ = f"learned_policy({getattr(factory, '__qualname__', factory)})"
    return make


def register_learned(name: str, factory: Callable[..., Policy]) -> None:
    """Add the learned policy `name` to `POLICIES` (`learned_policy(factory)`). Learned policies live above sim
    (sim names none of them): the package that defines them registers them when it is imported."""
    POLICIES[name] = learned_policy(factory)


def register_fitted(name: str, default: Callable[..., Policy], builder: Callable, kind: str) -> None:
    """Add the fitted rule `name` to `POLICIES` (`fitted_policy(default, builder, kind)`) from a package above sim
    whose learner fits it (the machine-peak forecast's rules): registered when that package is imported."""
    POLICIES[name] = fitted_policy(default, builder, kind)


POLICY_KINDS = ("heuristic", "forecast", "learned", "oracle")
"""What a registered policy is: a heuristic (request-based, or on observed usage: the hybrid and Google's peak
predictors), a rule on a learned usage forecast, a learned policy, or an oracle (sees the future: a yardstick)."""


def fitted_policy(
    default: Callable[..., Policy], builder: Callable, kind: str = "heuristic"
) -> Callable[..., Policy]:
    """A registry constructor for a rule fitted per (source, load) from its training sequences: calling it builds
    the rule with default knobs (no data); `.fit(ctx)` (`sim.tuning.FitContext`) builds it with the knobs chosen
    on validation sequences carved from the training split (None when it cannot be fitted there, e.g. a rule
    that needs a learned forecaster and none was given)."""
    if kind not in POLICY_KINDS:
        raise ValueError(f"fitted_policy: kind must be one of {POLICY_KINDS}, got {kind!r}")

    def make(**kwargs) -> Policy:
        return default(**kwargs)

    make.fit = builder  # type: ignore[attr-defined]
    make.kind = kind  # type: ignore[attr-defined]
    make.is_oracle = kind == "oracle"  # type: ignore[attr-defined]
    make.__qualname__ = f"fitted_policy({getattr(builder, '__name__', 'fit')})"
    return make


def _registered(name: str):
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {sorted(POLICIES)}")
    return POLICIES[name]


def is_fitted(name: str) -> bool:
    """Whether the registered policy `name` is fitted per (source, load) on training sequences (`fitted_policy`)."""
    if name not in POLICIES and ":" in name:
        return False
    return callable(getattr(_registered(name), "fit", None))


def is_oracle(name: str) -> bool:
    """Whether the registered policy `name` reads the true future (a yardstick: never "best", never a winner)."""
    if name not in POLICIES and ":" in name:
        return False
    return bool(getattr(_registered(name), "is_oracle", False))


def policy_kind(name: str) -> str:
    """One of POLICY_KINDS for a registered policy (an importable "module:attr" one counts as a heuristic)."""
    if name not in POLICIES and ":" in name:
        return "heuristic"
    factory = _registered(name)
    if is_oracle(name):
        return "oracle"
    if getattr(factory, "is_learned", False):
        return "learned"
    return getattr(factory, "kind", "heuristic")


def is_learned(name: str) -> bool:
    """Whether the registered policy `name` is a learned one (built from a checkpoint)."""
    if name not in POLICIES and ":" in name:
        return False
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {sorted(POLICIES)}")
    return bool(getattr(POLICIES[name], "is_learned", False))


ADAPTIVE_PEAK_RULES: dict[str, dict] = {
    "forecast_peak_adaptive": {},
    "forecast_peak_adaptive_amount": {"amount": True},
    "forecast_peak_adaptive_exceed": {"exceed": True},
    "forecast_peak_exceed_guard": {"exceed": True, "raise_only": True},
    "forecast_peak_exceed_guard_mask": {"floor": 0.0, "exceed": True, "raise_only": True},
    "forecast_peak_overshoot_guard": {"overshoot": True, "raise_only": True},
    "forecast_peak_overshoot_budget": {
        "overshoot": True,
        "raise_only": True,
        "overshoot_budget_pct": OVERSHOOT_GUARD_BUDGET_PCT,
    },
}
"""`forecast_peak` with its level following an online signal of the episode (`sim.rise_shift`): each name's
`fit_peak_adaptive` knobs (the rise rate alone; its amount; the exceedances of the arrival forecast, two-sided or
as a guard that never goes below the fitted level, with or without the admission mask; the overshoot itself)."""


def _fit_peak_charge(ctx, name: str, **knobs):
    from sim.charge_level import fit_peak_charge  # it imports this module's valid_machines at run time

    return fit_peak_charge(ctx, name, **knobs)


CHARGE_PEAK_RULES: dict[str, dict] = {
    "forecast_peak_charge": {},
    "forecast_peak_charge_guard": {"raise_only": True},
    "forecast_peak_charge_guard90": {"raise_only": True, "n_ref_quantile": 0.9},
}
"""`forecast_peak` with each machine's level set by the jobs an overshoot there would charge (`sim.charge_level`):
each name's `fit_peak_charge` knobs (two-sided at validation's mean jobs charged; never below the validated level;
raised only above validation's 90th percentile of jobs charged)."""


def _charge_policy(name: str, **knobs):
    return fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name=name, **kw),
        lambda ctx: _fit_peak_charge(ctx, name, **knobs),
        kind="forecast",
    )


def _fit_replay_select(ctx, name: str, **knobs):
    from sim.replay_select import fit_replay_select  # it imports this module's heuristics

    return fit_replay_select(ctx, name, **knobs)


def _adaptive_policy(name: str, **knobs):
    return fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name=name, **kw),
        lambda ctx: fit_peak_adaptive(ctx, name, **knobs),
        kind="forecast",
    )


POLICIES: dict[str, Callable[..., Policy]] = {
    "best_fit": BestFit,
    "first_fit": FirstFit,
    "random_valid": RandomValid,
    "tetris": Tetris,
    "kube_default": KubeDefault,
    "deeprm_sjf": DeepRMSJF,
    "deeprm_packer": DeepRMPacker,
    "ec_peak_aware": ECProfilePeakAware,
    "foresight_peak_aware": ForesightPeakAware,
    "noop": Noop,
    "hybrid_observed": fitted_policy(
        lambda **kw: RiskAwarePacking(name="hybrid_observed", **kw),
        lambda ctx: fit_hybrid(ctx, True, "hybrid_observed"),
    ),
    "hybrid_observed_nodur": fitted_policy(
        lambda **kw: RiskAwarePacking(
            risk=RiskConfig(use_durations=False), name="hybrid_observed_nodur", **kw
        ),
        lambda ctx: fit_hybrid(ctx, False, "hybrid_observed_nodur"),
    ),
    "n_sigma_observed": fitted_policy(
        lambda **kw: PeakPredictorPacking(predictor="n_sigma", name="n_sigma_observed", **kw),
        lambda ctx: fit_peak_predictor(ctx, "n_sigma", "n_sigma_observed"),
    ),
    "max_pct_n_sigma_observed": fitted_policy(
        lambda **kw: PeakPredictorPacking(predictor="max_pct_n_sigma", name="max_pct_n_sigma_observed", **kw),
        lambda ctx: fit_peak_predictor(ctx, "max_pct_n_sigma", "max_pct_n_sigma_observed"),
    ),
    "forecast_risk": fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name="forecast_risk", **kw),
        lambda ctx: fit_forecast_risk(ctx, True, "forecast_risk"),
        kind="forecast",
    ),
    "forecast_risk_nodur": fitted_policy(
        lambda **kw: RiskAwarePacking(
            forecaster=RequestForecaster(),
            risk=RiskConfig(use_durations=False),
            name="forecast_risk_nodur",
            **kw,
        ),
        lambda ctx: fit_forecast_risk(ctx, False, "forecast_risk_nodur"),
        kind="forecast",
    ),
    "forecast_recall_hybrid": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_recall_hybrid", **kw),
        lambda ctx: fit_recall_rule(ctx, "hybrid", "forecast_recall_hybrid"),
        kind="forecast",
    ),
    "forecast_recall_hybrid_nodur": fitted_policy(
        lambda **kw: RiskAwarePacking(
            risk=RiskConfig(use_durations=False), name="forecast_recall_hybrid_nodur", **kw
        ),
        lambda ctx: fit_recall_rule(ctx, "hybrid", "forecast_recall_hybrid_nodur", use_durations=False),
        kind="forecast",
    ),
    "forecast_risk_recall": fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name="forecast_risk_recall", **kw),
        lambda ctx: fit_recall_rule(ctx, "forecast", "forecast_risk_recall"),
        kind="forecast",
    ),
    "forecast_peak": fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name="forecast_peak", **kw),
        lambda ctx: fit_peak_rule(ctx, "forecast_peak", **PEAK_RULES["forecast_peak"]),
        kind="forecast",
    ),
    **{name: _adaptive_policy(name, **knobs) for name, knobs in ADAPTIVE_PEAK_RULES.items()},
    **{name: _charge_policy(name, **knobs) for name, knobs in CHARGE_PEAK_RULES.items()},
    "forecast_peak_replay": fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name="forecast_peak_replay", **kw),
        lambda ctx: _fit_replay_select(ctx, "forecast_peak_replay"),
        kind="forecast",
    ),
    "forecast_peak_nodur": fitted_policy(
        lambda **kw: RiskAwarePacking(
            forecaster=RequestForecaster(),
            risk=RiskConfig(use_durations=False),
            name="forecast_peak_nodur",
            **kw,
        ),
        lambda ctx: fit_peak_rule(ctx, "forecast_peak_nodur", **PEAK_RULES["forecast_peak_nodur"]),
        kind="forecast",
    ),
    "forecast_peak_noec": fitted_policy(
        lambda **kw: RiskAwarePacking(forecaster=RequestForecaster(), name="forecast_peak_noec", **kw),
        lambda ctx: fit_peak_rule(ctx, "forecast_peak_noec", **PEAK_RULES["forecast_peak_noec"]),
        kind="forecast",
    ),
    "forecast_risk_truth": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_risk_truth", **kw),
        lambda ctx: fit_forecast_truth(ctx, "forecast_risk_truth"),
        kind="oracle",
    ),
    "forecast_risk_truth_running": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_risk_truth_running", **kw),
        lambda ctx: fit_forecast_truth(ctx, "forecast_risk_truth_running", known="running"),
        kind="oracle",
    ),
    "forecast_risk_truth_arriving": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_risk_truth_arriving", **kw),
        lambda ctx: fit_forecast_truth(ctx, "forecast_risk_truth_arriving", known="arriving"),
        kind="oracle",
    ),
    "forecast_peak_truth_running": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_peak_truth_running", **kw),
        lambda ctx: fit_peak_truth(ctx, "forecast_peak_truth_running", "running"),
        kind="oracle",
    ),
    "forecast_peak_truth_arriving": fitted_policy(
        lambda **kw: RiskAwarePacking(name="forecast_peak_truth_arriving", **kw),
        lambda ctx: fit_peak_truth(ctx, "forecast_peak_truth_arriving", "arriving"),
        kind="oracle",
    ),
}
"""Every scheduler by name; evaluation and tests loop over it, so a new entry is evaluated and tested. The learned
policies are added by the package that trains them when it is imported (`register_learned`)."""


def make_policy(name: str, **kwargs) -> Policy:
    """An instance of the registered policy `name`, or of an importable one named "package.module:attribute" (a
    Policy class or factory defined outside this repository, e.g. in an evaluation config's `policies` list); a
    clear error lists the known ones."""
    if name not in POLICIES and ":" in name:
        module, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as err:
            raise KeyError(f"policy {name!r}: cannot import {attribute!r} from {module!r}: {err}") from err
        policy = factory(**kwargs)
        if not isinstance(policy, Policy):
            raise TypeError(f"policy {name!r} is not a Policy (needs a name and act(cfg, state, rng))")
        return policy
    if name not in POLICIES:
        raise KeyError(
            f"unknown policy {name!r}; registered: {sorted(POLICIES)} (or name one as 'module:attr')"
        )
    return POLICIES[name](**kwargs)


def accepts_profiles(name: str) -> bool:
    """Whether the registered policy `name` takes learned EC profiles (a `profiles` constructor keyword)."""
    if name not in POLICIES and ":" in name:
        return False
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {sorted(POLICIES)}")
    return "profiles" in inspect.signature(POLICIES[name]).parameters
