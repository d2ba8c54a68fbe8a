"""Batched cluster simulator for time-varying workloads (TVW-RL, DeepPlace, DeepRM), batch axis first.

Model (every choice made here, in one place):

- Time is logical steps t = 0, 1, ... Each env of a batch has its own t. Jobs of a sequence are sorted by arrival
  (`sim.jobs`); a job enters the FIFO queue at its arrival_step.
- Actions per decision: a in 0..M-1 places the HEAD of the queue on machine a at the current step (time does not
  advance, so several placements can happen within one step, as in DeepRM); a = M holds: the current step is
  closed (penalties credited), t advances by one and the jobs arriving at t+1 join the queue. Whenever an env's
  queue is empty (after a placement, a hold or at reset) time advances automatically until a job arrives or the
  episode ends, so the agent is only asked when it has a job to place. Because only the head is ever placed and
  jobs are sorted by arrival, placed jobs are a prefix of the job index range and the queue is the contiguous range
  [next_job, n_arrived).
- A placed job starts at once (there is no "scheduled but not started" phase) and uses usage[t - start] units each
  step of its duration. Committed usage of placed jobs lives in a ring timeline (B, W, M, D), W = T_max, indexed by
  absolute time mod W: placing adds the job's profile, closing a step clears its slot.
- Validity (action mask): with hold_rule="always" (default, DeepRM's void action) hold is always valid; with
  "no_fit" (TVW-RL / DeepPlace) it is valid only when no machine can take the head. Placing needs a non-empty
  queue and, by `placement_check`: "first_step" (default): current free units of the machine (C_d - job usage -
  background noise at t) cover the head's first-step usage in every d; "request": they cover the head's request;
  "none": any machine. Later steps may overshoot: usage varies over time (TVW-RL lets the agent learn to avoid it
  through P_O). A masked action raises ValueError naming the env and action (or is treated as hold with
  invalid_action="hold"). Actions of envs whose episode has ended are ignored (reward 0).
- Background noise (robustness study): uniform integer 0..n units per machine, resource and step, drawn at reset
  from the env's seed for steps 0..max_steps. It counts in current usage, the mask, unused units, shortage and the
  image (its own colour), not in contention or utilisation (it is not a workload). Shape perturbation: uniform
  integer -1..1 added to each step of each job's profile at reset, clipped to 0..C_d; requests stay as given.
- Oversized jobs (a step's usage or the request above C_d): ValueError naming the sequence, job and workload, or with
  oversize="clip" clipped to C_d and counted in `state.n_clipped`.
- Penalties (TVW-RL, "Rewards Design"), all credited when a step t is closed, for that step:
  P_W = -K_w |Q_t| (every waiting job, backlog included); P_U = -sum_d sum_{m used at t} U_m(t,d)^K_u with U in raw
  units (C_d - usage incl. noise, floored at 0), a machine being used when a workload runs on it at t;
  P_C = -K_c sum_{m,d} sum_{i<j on m} u_i(t,d) u_j(t,d): the realised overlap at t of every co-located pair, so
  summed over an episode it is exactly -K_c sum Cr(m,d) with Cr the time-aligned inner product over the pair's lives
  (pairs that are truncated away are credited only for the part realised); implemented by adding, at placement,
  new profile x committed timeline into a per-env ring of future overlap. P_O = -K_o per (workload, resource) the
  first time the workload's machine is short (usage incl. noise > C_d) in that resource while it runs.
  The reward of a step() call is the sum of penalties of the steps it closed (0 for a pure placement); `info` holds
  each component per env.
- Episode end (length counted in time steps): terminated when every job has been placed and has finished (t >=
  last end); an env with no jobs is terminated at reset. `max_steps` is a safety cap: reaching it first truncates
  the episode, a failure that the metrics report (`is_truncated`), and every job not placed by then is charged
  `penalties.unplaced_charge` (component "unplaced"), more than placing it could cost: withholding work never pays.
  `jobs_per_episode` keeps only the first n jobs of each sequence (TVW-RL: a fixed number of jobs per episode).
- Labels: a job's EC label only colours the observation (image and queue). What the scheduler sees is
  `State.obs_label` when set by `relabel` (predicted labels, TVW-RL Algorithm 1), else the jobs' own labels.
- Idle time is closed in windows: the steps an env closes before its next arrival, its end or the cap (at most
  `_MAX_WINDOW`) are closed together, vectorised over the window, with penalties added in step order, so rewards,
  traces and states are exactly those of closing one step at a time (tests/sim/test_rollout_equivalence.py).
- Purity: step() never mutates its input state (arrays it changes are copied first); the JobBatch is shared.
  The optional `Trace` buffer is the one mutable thing: step() writes the closed steps' rows into it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from sim import penalties
from sim.config import SimConfig
from sim.jobs import JOB_META_COLUMNS, JobBatch, nan_padded

PENALTY_NAMES = ("contention", "underutil", "overshoot", "wait", "unplaced")
"""Order of the penalty components in `State.penalty_totals` and `Trace.penalties`; "unplaced" is the charge for
jobs left unplaced when the safety cap truncates an episode (`sim.penalties.unplaced_charge`)."""


@dataclass(frozen=True)
class State:
    """Batched simulator state (B envs, M machines, D resources, J jobs, W = T_max ring slots)."""

    jobs: JobBatch
    """The (validated, possibly perturbed) job sequences; shared between states, never mutated."""
    t: np.ndarray
    """(B,) int64: current logical step."""
    next_job: np.ndarray
    """(B,) int64: index of the queue head = number of jobs placed so far."""
    n_arrived: np.ndarray
    """(B,) int64: jobs with arrival_step <= t (the queue is [next_job, n_arrived))."""
    timeline: np.ndarray
    """(B, W, M, D) int32: committed usage of placed jobs, slot (time mod W) first so that one step of every
    machine is one contiguous block."""
    overlap: np.ndarray
    """(B, W) int64: pairwise overlap sum_{m,d,i<j} u_i u_j still to be realised, slot (time mod W)."""
    past: np.ndarray
    """(B, h, M, D) float32: units in use (workloads plus noise) / C_d, clipped at 1, at the last h closed steps,
    oldest first: row i is step t - h + i (zeros before the episode start). The observed history exactly as the
    network encoding shows it (`sim.observation`), scaled once when the step is closed."""
    busy_until: np.ndarray
    """(B, M) int64: end step (exclusive) of the last-ending job placed on the machine (0 if none)."""
    job_machine: np.ndarray
    """(B, J) int64: machine of each placed job, -1 if not placed."""
    job_start: np.ndarray
    """(B, J) int64: start step of each placed job, -1 if not placed."""
    has_overshot: np.ndarray
    """(B, J, D) bool: the job has already been charged its first overshoot in resource d."""
    noise: np.ndarray | None
    """(B, max_steps + 1, M, D) int16 background units per step, or None when noise is off."""
    is_terminated: np.ndarray
    """(B,) bool: all jobs placed and finished."""
    is_truncated: np.ndarray
    """(B,) bool: max_steps reached first."""
    penalty_totals: np.ndarray
    """(B, 4) float64: cumulative penalties per component, in PENALTY_NAMES order (negative numbers)."""
    n_clipped: np.ndarray
    """(B,) int64: job-steps or requests clipped to capacity at reset (oversize="clip")."""
    obs_label: np.ndarray | None = None
    """(B, J) int64 EC label of each job as the scheduler sees it (observation image and queue), or None: the
    jobs' own `ec_label` (the clustering labels; the state after reset). Set by `relabel` (TVW-RL Algorithm 1,
    ClassifyToEC / UpdateECLabels, see `sim.labelling`); step() carries it along unchanged and no penalty,
    mask or transition reads it."""

    @property
    def batch_size(self) -> int:
        return int(self.t.shape[0])

    @property
    def is_done(self) -> np.ndarray:
        """(B,) bool: terminated or truncated."""
        return self.is_terminated | self.is_truncated


class QueueHead(NamedTuple):
    """The job at the head of each env's queue (zeros where the queue is empty)."""

    request: np.ndarray
    """(B, D) int16 requested units."""
    usage: np.ndarray
    """(B, T_max, D) int16 full usage profile."""
    ec_label: np.ndarray
    """(B,) int64 EC label."""
    has_job: np.ndarray
    """(B,) bool: the queue is non-empty."""
    duration: np.ndarray
    """(B,) int64 duration in steps."""


@dataclass
class Trace:
    """Preallocated per-step recording of a batch of episodes (mutable: step() fills row t when closing step t)."""

    usage: np.ndarray
    """(B, max_steps, M, D) int16: R(m,t,d), units used by workloads (noise excluded)."""
    background: np.ndarray
    """(B, max_steps, M, D) int16: background noise units at t (zeros when noise is off)."""
    is_active: np.ndarray
    """(B, max_steps, M) bool: A(t), a workload runs on the machine at t."""
    queue_length: np.ndarray
    """(B, max_steps) int64: |Q_t| when step t was closed."""
    contention: np.ndarray
    """(B, max_steps) int64: realised pairwise overlap sum_{m,d} sum_{i<j} u_i(t,d) u_j(t,d) (units^2)."""
    penalties: np.ndarray
    """(B, max_steps, 4) float64: penalty components credited for step t (PENALTY_NAMES order)."""
    capacity: np.ndarray
    """(D,) int64: C_d."""


# validation and reset


def validate_jobs(cfg: SimConfig, jobs: JobBatch) -> tuple[JobBatch, np.ndarray]:
    """Check every job fits a machine; returns (jobs, n_clipped per row). Raises ValueError naming the sequence,
    job and workload whose usage in some step or request exceeds C_d (or clips, with cfg.oversize="clip"), or
    whose label is >= G, or whose D differs from the config's."""
    if jobs.n_resources != cfg.n_resources:
        raise ValueError(f"jobs have {jobs.n_resources} resources, config has {cfg.n_resources}")
    cap = np.asarray(cfg.capacity_units, dtype=np.int64)
    if _compiled_batch().jobs_fit(jobs.usage, jobs.request, jobs.ec_label, jobs.n_jobs, cap, cfg.n_labels):
        return jobs, np.zeros(jobs.batch_size, dtype=np.int64)  # one pass finds nothing to name or clip
    is_real = jobs.is_real
    bad_label = is_real & ((jobs.ec_label < 0) | (jobs.ec_label >= cfg.n_labels))
    if bad_label.any():
        b, j = np.argwhere(bad_label)[0]
        raise ValueError(
            f"{jobs.describe_job(b, j)}: ec_label {jobs.ec_label[b, j]} outside 0..{cfg.n_labels - 1} (n_labels)"
        )
    over_use = (jobs.usage > cap).any(axis=(2, 3))
    over_req = (jobs.request > cap).any(axis=2)
    is_over = is_real & (over_use | over_req)
    if not is_over.any():
        return jobs, np.zeros(jobs.batch_size, dtype=np.int64)
    if cfg.oversize == "raise":
        b, j = np.argwhere(is_over)[0]
        what = "usage" if over_use[b, j] else "request"
        peak = jobs.usage[b, j].max(axis=0) if over_use[b, j] else jobs.request[b, j]
        raise ValueError(
            f"{jobs.describe_job(b, j)}: {what} {peak.tolist()} units exceeds machine capacity "
            f"{list(cfg.capacity_units)} ({int(is_over.sum())} oversized jobs in the batch; "
            "use oversize='clip' to clip and count them)"
        )
    n_clipped = (jobs.usage > cap).sum(axis=(1, 2, 3)) + (jobs.request > cap).sum(axis=(1, 2))
    clipped = replace(
        jobs,
        usage=np.minimum(jobs.usage, cap.astype(np.int16)),
        request=np.minimum(jobs.request, cap.astype(np.int16)),
    )
    return clipped, n_clipped.astype(np.int64)


def _env_rngs(cfg: SimConfig, n_envs: int, seed) -> list[np.random.Generator]:
    if seed is None:
        seed = cfg.seed
    if np.ndim(seed) == 0:
        return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(n_envs)]
    seeds = list(np.asarray(seed).reshape(-1))
    if len(seeds) != n_envs:
        raise ValueError(f"got {len(seeds)} seeds for {n_envs} envs")
    return [np.random.default_rng(int(s)) for s in seeds]


def _perturb(cfg: SimConfig, jobs: JobBatch, rngs: list[np.random.Generator]) -> JobBatch:
    """TVW-RL shape perturbation: uniform integer -1..1 per job step and resource, clipped to 0..C_d."""
    cap = np.asarray(cfg.capacity_units, dtype=np.int64)
    alive = np.arange(jobs.max_duration)[None, None, :] < jobs.duration[:, :, None]
    delta = np.stack([rng.integers(-1, 2, size=jobs.usage.shape[1:]) for rng in rngs])
    usage = np.clip(jobs.usage + delta * alive[..., None], 0, cap).astype(np.int16)
    return replace(jobs, usage=usage)


def reset(cfg: SimConfig, jobs: JobBatch, seed: int | np.ndarray | list[int] | None = None) -> State:
    """Initial state of B = jobs.batch_size envs at t = 0 (advanced to the first arrival).

    seed: an int (per-env generators spawned from it with numpy SeedSequence), or one int per env (env b uses
    default_rng(seed[b]): B single envs reset with seed=[s_b] reproduce a batched reset with seed=s), or None
    (cfg.seed). Randomness is used only for noise and shape perturbation."""
    if cfg.jobs_per_episode is not None:
        jobs = jobs.first_jobs(cfg.jobs_per_episode)
    jobs, n_clipped = validate_jobs(cfg, jobs)
    n_envs, n_m, n_d = jobs.batch_size, cfg.n_machines, cfg.n_resources
    rngs = _env_rngs(cfg, n_envs, seed)
    if cfg.is_shape_perturbed:
        jobs = _perturb(cfg, jobs, rngs)
    noise = None
    if cfg.noise_max_units > 0:
        shape = (cfg.max_steps + 1, n_m, n_d)
        noise = np.stack([rng.integers(0, cfg.noise_max_units + 1, size=shape) for rng in rngs]).astype(
            np.int16
        )
    width = max(jobs.max_duration, 1)
    t = np.zeros(n_envs, dtype=np.int64)
    state = State(
        jobs=jobs,
        t=t,
        next_job=np.zeros(n_envs, dtype=np.int64),
        n_arrived=(jobs.arrival_step <= 0).sum(axis=1).astype(np.int64),
        timeline=np.zeros((n_envs, width, n_m, n_d), dtype=np.int32),
        overlap=np.zeros((n_envs, width), dtype=np.int64),
        past=np.zeros((n_envs, cfg.history_steps, n_m, n_d), dtype=np.float32),
        busy_until=np.zeros((n_envs, n_m), dtype=np.int64),
        job_machine=np.full((n_envs, jobs.max_jobs), -1, dtype=np.int64),
        job_start=np.full((n_envs, jobs.max_jobs), -1, dtype=np.int64),
        has_overshot=np.zeros((n_envs, jobs.max_jobs, n_d), dtype=bool),
        noise=noise,
        is_terminated=jobs.n_jobs == 0,
        is_truncated=np.zeros(n_envs, dtype=bool),
        penalty_totals=np.zeros((n_envs, len(PENALTY_NAMES)), dtype=np.float64),
        n_clipped=n_clipped,
    )
    # an empty cluster with an empty queue earns no penalty: skipping to the first arrival loses no reward
    fields = _mutable(state)
    _advance_idle(cfg, fields, np.zeros((n_envs, len(PENALTY_NAMES))), None, np.zeros(n_envs, dtype=bool))
    return State(**fields)


# step


_MUTABLE_FIELDS = (
    "t",
    "next_job",
    "n_arrived",
    "timeline",
    "overlap",
    "busy_until",
    "job_machine",
    "job_start",
    "is_terminated",
    "is_truncated",
    "penalty_totals",
)
"""Fields step() may write, copied up front; `past` is rebuilt when steps are closed (`_push_past`) and
`has_overshot` copied only when a first overshoot is marked."""

_MAX_WINDOW = 64
"""At most this many idle steps of an env are closed at once (bounds the (steps, M, D) arrays of a window)."""


def _mutable(state: State) -> dict:
    """Field dict of the state with every array step() may write copied (copy-on-write)."""
    fields = {f: getattr(state, f) for f in State.__dataclass_fields__}
    for f in _MUTABLE_FIELDS:
        fields[f] = fields[f].copy()
    return fields


def step(
    cfg: SimConfig,
    state: State,
    actions: np.ndarray,
    trace: Trace | None = None,
    mask: np.ndarray | None = None,
    in_place: bool = False,
) -> tuple[State, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Apply one action per env: returns (new_state, reward (B,) float64, terminated (B,), truncated (B,), info).

    info: "penalty_<name>" (B,) float64 per component of this call's reward, "n_steps_closed" (B,) int64,
    "is_placed" (B,) bool (the action placed a job). `mask`: `action_mask(cfg, state)` when the caller has it
    already (it is then not computed again; it must be the mask of this very state). The input state is not
    mutated, unless `in_place`: then, where `sim.compiled_step.supports` the configuration, the compiled step
    writes the transition into the input state's own arrays (the returned state shares them; the input state is
    spent) with the same numbers to the bit. Only a caller that keeps no earlier state may ask for that."""
    n_envs, n_m = state.batch_size, cfg.n_machines
    actions = np.asarray(actions).reshape(-1)
    if actions.shape[0] != n_envs:
        raise ValueError(f"expected {n_envs} actions, got {actions.shape[0]}")
    actions = actions.astype(np.int64)
    out_of_range = (actions < 0) | (actions > n_m)
    if out_of_range.any():
        b = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"env {b}: action {actions[b]} outside 0..{n_m}")
    is_done = state.is_done
    if mask is None:
        mask = action_mask(cfg, state)
    elif mask.shape != (n_envs, n_m + 1):
        raise ValueError(f"mask has shape {mask.shape}, expected {(n_envs, n_m + 1)}")
    is_bad = ~mask[np.arange(n_envs), actions] & ~is_done
    if is_bad.any():
        if cfg.invalid_action == "raise":
            b = int(np.flatnonzero(is_bad)[0])
            why = (
                "queue is empty" if queue_length(state)[b] == 0 else "head job does not fit (placement_check)"
            )
            raise ValueError(
                f"env {b}: action {actions[b]} is invalid ({why}); valid: {np.flatnonzero(mask[b])}"
            )
        actions = np.where(is_bad, n_m, actions)
    pen = np.zeros((n_envs, len(PENALTY_NAMES)), dtype=np.float64)
    is_placed = (actions < n_m) & ~is_done
    is_hold = (actions == n_m) & ~is_done
    if in_place and _compiled().supports(cfg, trace):
        compiled_step = _compiled()
        fields = {f: getattr(state, f) for f in State.__dataclass_fields__}
        n_closed, is_cut = compiled_step.step_in_place(
            cfg, fields, actions, is_placed, is_hold, pen, _MAX_WINDOW, trace
        )
        if is_cut.any():  # where the numpy step puts it: the env's zero "unplaced" entry, its last step's row
            rows, col = np.flatnonzero(is_cut), PENALTY_NAMES.index("unplaced")
            charge = -_unplaced_charges(cfg, fields, rows)
            pen[rows, col] += charge
            if trace is not None:
                last = fields["t"][rows] - 1
                is_recorded = last < trace.penalties.shape[1]
                trace.penalties[rows[is_recorded], last[is_recorded], col] = charge[is_recorded]
    else:
        fields = _mutable(state)
        if is_placed.any():
            _place(fields, np.flatnonzero(is_placed), actions[is_placed])
        n_closed = _advance_idle(cfg, fields, pen, trace, is_hold)
    fields["penalty_totals"] += pen
    new = State(**fields)
    info = {f"penalty_{name}": pen[:, i] for i, name in enumerate(PENALTY_NAMES)}
    info["n_steps_closed"] = n_closed
    info["is_placed"] = is_placed
    return new, pen.sum(axis=1), new.is_terminated.copy(), new.is_truncated.copy(), info


def _compiled():
    """`sim.compiled_step`, imported on first use (it loads numba)."""
    from sim import compiled_step

    return compiled_step


def _compiled_batch():
    """`sim.compiled_batch`, imported on first use (it loads numba)."""
    from sim import compiled_batch

    return compiled_batch


def _place(f: dict, rows: np.ndarray, machines: np.ndarray) -> None:
    """Start the head job of each env in rows (distinct envs) on the given machine at the env's current step."""
    jobs: JobBatch = f["jobs"]
    _, width, n_m, n_d = f["timeline"].shape
    j = f["next_job"][rows]
    t = f["t"][rows]
    prof = jobs.usage[rows, j].transpose(2, 0, 1)  # (D, n, W): step k of the job's life
    slots = (t[:, None] + np.arange(width)[None, :]) % width  # (n, W): ring slot of t, t+1, ...
    # flat positions in the (contiguous, freshly copied) timeline and overlap ring, distinct since rows are;
    # resource first so that every array operation runs over n x W elements
    cells = (rows[:, None] * width + slots) * n_m + machines[:, None]
    index = (cells * n_d)[None] + np.arange(n_d)[:, None, None]  # (D, n, W)
    timeline = f["timeline"].reshape(-1)
    committed = timeline[index]
    # contention (TVW-RL Cr): the new job's overlap with every co-located job, realised step by step later
    pair = sum(prof[d] * committed[d] for d in range(n_d))
    f["overlap"].reshape(-1)[rows[:, None] * width + slots] += pair
    timeline[index] = committed + prof
    job = rows * jobs.max_jobs + j  # flat positions in the freshly copied (B, J) and (B, M) arrays
    f["job_machine"].reshape(-1)[job] = machines
    f["job_start"].reshape(-1)[job] = t
    ends = t + jobs.duration[rows, j]
    busy_until, cell = f["busy_until"].reshape(-1), rows * n_m + machines
    busy_until[cell] = np.maximum(busy_until[cell], ends)
    f["next_job"][rows] = j + 1


def _advance_idle(
    cfg: SimConfig, f: dict, pen: np.ndarray, trace: Trace | None, is_hold: np.ndarray
) -> np.ndarray:
    """Close step t of the envs in is_hold, and close steps of envs whose queue is empty until a job arrives or
    the episode ends; returns the steps closed per env. The steps of one env are closed together as a window
    (`_close_window`): nothing but time changes inside it (no job is placed, none arrives before its end)."""
    n_closed = np.zeros(f["t"].shape[0], dtype=np.int64)
    is_forced = is_hold
    while True:
        is_idle = (f["n_arrived"] == f["next_job"]) & ~(f["is_terminated"] | f["is_truncated"])
        is_closing = is_idle | is_forced
        if not is_closing.any():
            return n_closed
        rows = np.flatnonzero(is_closing)
        n_steps = np.where(is_idle[rows], _idle_steps(cfg, f, rows), 1)
        _close_window(cfg, f, rows, n_steps, pen, trace)
        n_closed[rows] += n_steps
        is_forced = np.zeros_like(is_hold)


def _idle_steps(cfg: SimConfig, f: dict, rows: np.ndarray) -> np.ndarray:
    """Steps an idle env (empty queue) closes before its next arrival, its last job's end or the safety cap,
    at most _MAX_WINDOW and the ring width (so a window never reads a ring slot it has cleared)."""
    jobs: JobBatch = f["jobs"]
    t, head = f["t"][rows], f["next_job"][rows]
    has_next = head < jobs.n_jobs[rows]
    arrival = jobs.arrival_step[rows, np.minimum(head, jobs.max_jobs - 1)]
    done_at = np.maximum(f["busy_until"][rows].max(axis=1), t + 1)
    end = np.minimum(np.where(has_next, arrival, done_at), cfg.max_steps)
    return np.maximum(np.minimum(end - t, min(f["timeline"].shape[1], _MAX_WINDOW)), 1)


def _close_window(
    cfg: SimConfig, f: dict, rows: np.ndarray, n_steps: np.ndarray, pen: np.ndarray, trace: Trace | None
) -> None:
    """Close steps t .. t + n_steps - 1 of each env in rows: credit their penalties (in step order, so the sums
    are the same floats as closing one step at a time), record them, and move the envs on. An env that reaches
    the safety cap unfinished is truncated and charged for every job it left unplaced."""
    jobs: JobBatch = f["jobs"]
    _, width, n_m, n_d = f["timeline"].shape
    t = f["t"][rows]
    # one entry per closed step: env pb, step ps
    first = np.cumsum(n_steps) - n_steps
    which = np.repeat(np.arange(rows.shape[0]), n_steps)
    pb = rows[which]
    ps = t[which] + np.arange(which.shape[0]) - first[which]
    slot = pb * width + ps % width
    usage = np.take(f["timeline"].reshape(-1, n_m, n_d), slot, axis=0)  # (P, M, D)
    total = usage
    if f["noise"] is not None:
        noise = f["noise"]
        total = usage + np.take(noise.reshape(-1, n_m, n_d), pb * noise.shape[1] + ps, axis=0)
    is_used = f["busy_until"][pb] > ps[:, None]
    qlen = (f["n_arrived"] - f["next_job"])[pb]
    overlap = f["overlap"].reshape(-1)[slot]
    step_pen = np.zeros((pb.shape[0], len(PENALTY_NAMES)))
    step_pen[:, 0] = penalties.contention_penalty(overlap, cfg.k_contention)
    # (P, M * D) views: a (D,) operand broadcast over (P, M, D) would run numpy's inner loop D elements long
    cap_cells = np.asarray(cfg.capacity_units * n_m, dtype=np.int64)  # C_d of each (machine, resource)
    total_cells = total.reshape(-1, n_m * n_d)
    unused = np.maximum(cap_cells - total_cells, 0).reshape(total.shape)
    is_short = (total_cells > cap_cells).reshape(total.shape)
    step_pen[:, 1] = penalties.underutil_penalty(unused, is_used, cfg.k_underutil)
    step_pen[:, 2] = penalties.overshoot_penalty(_first_overshoots(f, pb, ps, is_short), cfg.k_overshoot)
    step_pen[:, 3] = penalties.wait_penalty(qlen, cfg.k_wait)
    # advance
    f["timeline"].reshape(-1, n_m, n_d)[slot] = 0
    f["overlap"].reshape(-1)[slot] = 0
    t_end = t + n_steps
    f["t"][rows] = t_end
    _push_past(cfg, f, rows, n_steps, pb, ps, total)
    f["n_arrived"][rows] = (jobs.arrival_step[rows] <= t_end[:, None]).sum(axis=1)
    is_finished = (f["next_job"][rows] == jobs.n_jobs[rows]) & (f["busy_until"][rows].max(axis=1) <= t_end)
    is_cut = ~is_finished & (t_end >= cfg.max_steps)
    f["is_terminated"][rows] = is_finished
    f["is_truncated"][rows] = is_cut
    if is_cut.any():
        last = first + n_steps - 1
        step_pen[last[is_cut], PENALTY_NAMES.index("unplaced")] = -_unplaced_charges(cfg, f, rows[is_cut])
    np.add.at(pen, pb, step_pen)  # unbuffered, in entry (= step) order per env
    if trace is not None:
        is_recorded = ps < trace.usage.shape[1]
        r, tr = pb[is_recorded], ps[is_recorded]
        trace.usage[r, tr] = usage[is_recorded]
        trace.background[r, tr] = (total - usage)[is_recorded]
        trace.is_active[r, tr] = is_used[is_recorded]
        trace.queue_length[r, tr] = qlen[is_recorded]
        trace.contention[r, tr] = overlap[is_recorded]
        trace.penalties[r, tr] = step_pen[is_recorded]


def _push_past(
    cfg: SimConfig,
    f: dict,
    rows: np.ndarray,
    n_steps: np.ndarray,
    pb: np.ndarray,
    ps: np.ndarray,
    total: np.ndarray,
) -> None:
    """Shift the closed steps' units in use (total (P, M, D) at step ps of env pb; env rows[i] closed n_steps[i]
    steps) into the history as fractions of C_d clipped at 1, dropping the oldest steps. Builds a new array with
    one gather of every env's rows (the copy-on-write copy itself) and one write of the closed steps."""
    past = f["past"]
    n_envs, hist = past.shape[:2]
    n_cells = past.shape[2] * past.shape[3]
    shift = np.zeros(n_envs, dtype=np.int64)
    shift[rows] = n_steps
    # new row i of env b is old row i + shift[b]; rows past the end are overwritten by the closed steps below
    source = (
        np.minimum(np.arange(hist)[None, :] + shift[:, None], hist - 1) + (np.arange(n_envs) * hist)[:, None]
    )
    new = np.take(past.reshape(n_envs * hist, n_cells), source.reshape(-1), axis=0)
    t_end = np.zeros(n_envs, dtype=np.int64)
    t_end[rows] = f["t"][rows]  # already advanced to the end of the window
    pos = hist - (t_end[pb] - ps)  # row of the closed step in the new history (< 0: shifted out again)
    is_kept = pos >= 0
    inv_cap = 1.0 / np.asarray(cfg.capacity_units, dtype=np.float32)
    closed = np.minimum(total[is_kept].astype(np.float32) * inv_cap, 1.0)
    new[pb[is_kept] * hist + pos[is_kept]] = closed.reshape(-1, n_cells)
    f["past"] = new.reshape(past.shape)


def _unplaced_charges(cfg: SimConfig, f: dict, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) total `penalties.unplaced_charge` of the jobs not placed (arrived or not) in those envs."""
    jobs: JobBatch = f["jobs"]
    index = np.arange(jobs.max_jobs)[None, :]
    is_left = (index >= f["next_job"][rows, None]) & (index < jobs.n_jobs[rows, None])
    charge = penalties.unplaced_charge(
        jobs.duration[rows],
        cfg.capacity_units,
        cfg.k_contention,
        cfg.k_underutil,
        cfg.k_overshoot,
        cfg.k_wait,
    )
    return (charge * is_left).sum(axis=1)


def _first_overshoots(f: dict, pb: np.ndarray, ps: np.ndarray, is_short: np.ndarray) -> np.ndarray:
    """Per closed step (env pb, step ps, in step order per env; is_short (P, M, D) machine above C_d): count the
    (workload, resource) pairs running on a short machine for the first time, and mark them."""
    out = np.zeros(pb.shape[0], dtype=np.int64)
    has_short = is_short.any(axis=(1, 2))
    if not has_short.any():
        return out
    sub = np.flatnonzero(has_short)
    b, s = pb[sub], ps[sub]
    jobs: JobBatch = f["jobs"]
    n_j, (n_m, n_d) = jobs.max_jobs, is_short.shape[1:]
    machine = f["job_machine"][b]
    start = f["job_start"][b]
    is_running = (machine >= 0) & (start <= s[:, None]) & (start + jobs.duration[b] > s[:, None])
    # one entry per (closed step, running job), in step order: its machine's shortage and the job's flag, per d
    entry = np.flatnonzero(is_running)
    step_of = entry // n_j
    env_job = b[step_of] * n_j + entry % n_j
    cell = (step_of * n_m + machine.reshape(-1)[entry]) * n_d
    is_short_flat = is_short[sub].reshape(-1)
    has_overshot = f["has_overshot"].reshape(-1)
    keys, steps = [], []
    for d in range(n_d):
        key = env_job * n_d + d
        is_new = is_short_flat[cell + d] & ~has_overshot[key]
        keys.append(key[is_new])
        steps.append(step_of[is_new])
    key, step_of = np.concatenate(keys), np.concatenate(steps)
    if key.size == 0:
        return out
    if (b[1:] == b[:-1]).any():
        # several short steps of one env's window: a pair is charged at its first one only (a key's entries are
        # in step order, and unique's stable sort returns the first)
        _, first = np.unique(key, return_index=True)
        key, step_of = key[first], step_of[first]
    f["has_overshot"] = f["has_overshot"].copy()  # copy-on-write: the input state's array stays as it was
    f["has_overshot"].reshape(-1)[key] = True
    out[sub] = np.bincount(step_of, minlength=sub.shape[0])
    return out


# masks and observations


def _head_index(state: State) -> np.ndarray:
    return np.minimum(state.next_job, state.jobs.max_jobs - 1)


def action_mask(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, M + 1) bool: valid actions. Column M (hold): always True with hold_rule="always"; with "no_fit", True
    only where no machine can take the head (or the queue is empty). Done envs: only hold."""
    n_envs = state.batch_size
    has_job = (state.n_arrived > state.next_job) & ~state.is_done
    if cfg.placement_check == "none":
        fits = np.ones((n_envs, cfg.n_machines), dtype=bool)
    else:
        head = _head_index(state)
        rows = np.arange(n_envs)
        if cfg.placement_check == "first_step":
            need = state.jobs.usage[rows, head, 0]
        else:
            need = state.jobs.request[rows, head]
        usage = current_usage(cfg, state)
        fits = np.ones((n_envs, cfg.n_machines), dtype=bool)
        for d, cap in enumerate(cfg.capacity_units):  # one (B, M) comparison per resource: D is tiny
            fits &= usage[:, :, d] + need[:, d, None] <= cap
    mask = np.ones((n_envs, cfg.n_machines + 1), dtype=bool)
    mask[:, : cfg.n_machines] = fits & has_job[:, None]
    if cfg.hold_rule == "no_fit":
        mask[:, cfg.n_machines] = ~mask[:, : cfg.n_machines].any(axis=1)
    return mask


def observed_labels(state: State) -> np.ndarray:
    """(B, J) int64 EC labels the observation shows: `state.obs_label`, or the jobs' `ec_label` when unset."""
    return state.jobs.ec_label if state.obs_label is None else state.obs_label


def relabel(cfg: SimConfig, state: State, labels: np.ndarray) -> State:
    """A copy of `state` whose observed EC labels are `labels` (B, J) (TVW-RL Algorithm 1, UpdateECLabels).

    Only `observe` reads them: transitions, masks and penalties stay the same. Raises ValueError on a wrong
    shape or, naming the sequence, job and workload, on a real job's label outside 0..G-1 (G = cfg.n_labels:
    the image has one colour range per label). Padding entries are set to 0."""
    labels = np.asarray(labels)
    shape = state.jobs.ec_label.shape
    if labels.shape != shape or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"relabel: labels must be an integer array of shape {shape}, got {labels.dtype} {labels.shape}"
        )
    clean = _compiled_batch().clean_labels(labels, state.jobs.n_jobs, cfg.n_labels)
    if clean is not None:  # one pass: every real job's label in range
        out = replace(state, obs_label=clean)
        share_memo(state, out)
        return out
    is_real = np.arange(shape[1])[None, :] < state.jobs.n_jobs[:, None]
    is_bad = is_real & ((labels < 0) | (labels >= cfg.n_labels))
    if is_bad.any():
        b, j = np.argwhere(is_bad)[0]
        raise ValueError(
            f"relabel: {state.jobs.describe_job(b, j)}: label {labels[b, j]} outside 0..{cfg.n_labels - 1} "
            f"(n_labels); {int(is_bad.sum())} such labels"
        )
    out = replace(state, obs_label=np.where(is_real, labels, 0).astype(np.int64))
    share_memo(state, out)
    return out


def observe(cfg: SimConfig, state: State) -> dict[str, np.ndarray]:
    """Observation dict (numpy, batch first):

    machines (B, M, D, h, C_d) int8: row h-1 is step t, row h-1-k is step t-k; along a row, units are filled
      left to right by the workloads running on the machine in start order, each unit carrying its colour
      1 + label * max_instances + shade (shade = rank among co-located instances of that label, capped at
      max_instances - 1: DeepPlace instance colouring), then background noise units (cfg.noise_pixel); 0 = free.
      Usage above C_d is cut off (overshoot is invisible here but penalised). The last axis is max C_d wide;
      narrower resources leave their extra pixels 0.
    scheduled (B, M) int8: jobs placed on the machine during the current step (DeepPlace's scheduled-not-started
      column: jobs start immediately here, so this is what "just scheduled" means).
    queue (B, queue_size, 1 + D) int16: per visible slot (label + 1, request units...), 0 = empty slot.
    backlog (B,) int64: waiting jobs beyond the visible slots (DeepRM).
    action_mask (B, M + 1) int8.
    Labels in the image and the queue are `observed_labels(state)`.
    Slower than step(): it gathers the last h steps of every recently running job."""
    machines = _machine_image(cfg, state)
    n_envs, n_m = state.batch_size, cfg.n_machines
    rows = np.arange(n_envs)
    is_now = (state.job_machine >= 0) & (state.job_start == state.t[:, None])
    flat = (rows[:, None] * n_m + np.maximum(state.job_machine, 0))[is_now]
    scheduled = np.bincount(flat, minlength=n_envs * n_m).reshape(n_envs, n_m)
    slots = state.next_job[:, None] + np.arange(cfg.queue_size)[None, :]
    is_waiting = slots < state.n_arrived[:, None]
    slots = np.minimum(slots, state.jobs.max_jobs - 1)
    queue = np.zeros((n_envs, cfg.queue_size, 1 + cfg.n_resources), dtype=np.int16)
    queue[..., 0] = (observed_labels(state)[rows[:, None], slots] + 1) * is_waiting
    queue[..., 1:] = state.jobs.request[rows[:, None], slots] * is_waiting[..., None]
    return {
        "machines": machines,
        "scheduled": np.minimum(scheduled, 127).astype(np.int8),
        "queue": queue,
        "backlog": np.maximum(queue_length(state) - cfg.queue_size, 0).astype(np.int64),
        "action_mask": action_mask(cfg, state).astype(np.int8),
    }


def _machine_image(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, M, D, h, max C_d) int8 colour image of the last h steps (see observe)."""
    jobs = state.jobs
    n_envs, n_m, n_d, hist = state.batch_size, cfg.n_machines, cfg.n_resources, cfg.history_steps
    width = max(cfg.capacity_units)
    cap = np.asarray(cfg.capacity_units, dtype=np.int64)
    image = np.zeros(n_envs * n_m * n_d * hist * width, dtype=np.int8)
    first_row = state.t - hist + 1  # step shown in row 0
    end = state.job_start + jobs.duration
    bi, ji = np.nonzero((state.job_machine >= 0) & (end > first_row[:, None]))
    m, label = state.job_machine[bi, ji], observed_labels(state)[bi, ji]
    colour = (
        1 + label * cfg.max_instances + np.minimum(_instance_rank(bi, m, label, ji), cfg.max_instances - 1)
    )
    # usage of each job in each shown row: (N, h, D)
    k = first_row[bi, None] + np.arange(hist)[None, :] - state.job_start[bi, ji, None]
    is_alive = (k >= 0) & (k < jobs.duration[bi, ji, None])
    amount = jobs.usage[bi[:, None], ji[:, None], np.clip(k, 0, jobs.max_duration - 1)] * is_alive[..., None]
    # one group per (env, machine, resource, row); fill its pixels in job (= start) order
    amount = amount.transpose(0, 2, 1).reshape(-1)  # entries ordered like group: (N, D, h)
    group = np.broadcast_to(
        ((bi[:, None, None] * n_m + m[:, None, None]) * n_d + np.arange(n_d)[None, :, None]) * hist
        + np.arange(hist)[None, None, :],
        (bi.shape[0], n_d, hist),
    ).reshape(-1)
    entry_colour = np.repeat(colour, n_d * hist)
    entry_cap = np.tile(np.repeat(cap, hist), bi.shape[0])
    has_units = np.flatnonzero(amount > 0)
    # stable sort keeps job (= start) order inside a group
    order = has_units[np.argsort(group[has_units], kind="stable")]
    group, amount, entry_colour, entry_cap = (
        group[order],
        amount[order],
        entry_colour[order],
        entry_cap[order],
    )
    ends = np.cumsum(amount)
    is_first = np.r_[True, group[1:] != group[:-1]] if group.size else np.zeros(0, dtype=bool)
    base = np.maximum.accumulate(np.where(is_first, ends - amount, 0)) if group.size else ends
    offset = ends - amount - base  # units already used in the row by earlier jobs
    rep = np.repeat(np.arange(group.size), amount)
    within = np.arange(rep.size) - np.repeat(ends - amount, amount)
    pos = offset[rep] + within
    keep = pos < entry_cap[rep]
    image[group[rep][keep] * width + pos[keep]] = entry_colour[rep][keep]
    image = image.reshape(n_envs, n_m, n_d, hist, width)
    if state.noise is not None:
        _paint_noise(cfg, state, image, first_row)
    return image


def _instance_rank(bi: np.ndarray, m: np.ndarray, label: np.ndarray, ji: np.ndarray) -> np.ndarray:
    """Rank of each job among the shown jobs with the same (env, machine, label), by start (= index) order."""
    if bi.size == 0:
        return bi
    order = np.lexsort((ji, label, m, bi))
    key = np.stack([bi, m, label], axis=1)[order]
    is_first = np.r_[True, (key[1:] != key[:-1]).any(axis=1)]
    pos = np.arange(order.size)
    rank_sorted = pos - np.maximum.accumulate(np.where(is_first, pos, 0))
    rank = np.empty_like(rank_sorted)
    rank[order] = rank_sorted
    return rank


def _paint_noise(cfg: SimConfig, state: State, image: np.ndarray, first_row: np.ndarray) -> None:
    """Append background-noise units after the workloads' units in every row (in place)."""
    steps = first_row[:, None] + np.arange(cfg.history_steps)[None, :]  # (B, h)
    noise = state.noise[np.arange(state.batch_size)[:, None], np.clip(steps, 0, None)]  # (B, h, M, D)
    noise = (noise * (steps >= 0)[..., None, None]).transpose(0, 2, 3, 1)  # (B, M, D, h)
    used = (image > 0).sum(axis=-1)
    pix = np.arange(image.shape[-1])
    cap = np.asarray(cfg.capacity_units)[None, None, :, None, None]
    is_noise = (pix >= used[..., None]) & (pix < (used + noise)[..., None]) & (pix < cap)
    image[is_noise] = cfg.noise_pixel


def make_trace(cfg: SimConfig, batch_size: int) -> Trace:
    """Zeroed Trace for batch_size envs and cfg.max_steps steps."""
    shape = (batch_size, cfg.max_steps, cfg.n_machines, cfg.n_resources)
    return Trace(
        usage=np.zeros(shape, dtype=np.int16),
        background=np.zeros(shape, dtype=np.int16),
        is_active=np.zeros(shape[:3], dtype=bool),
        queue_length=np.zeros(shape[:2], dtype=np.int64),
        contention=np.zeros(shape[:2], dtype=np.int64),
        penalties=np.zeros((*shape[:2], len(PENALTY_NAMES)), dtype=np.float64),
        capacity=np.asarray(cfg.capacity_units, dtype=np.int64),
    )


# views for heuristics


def current_usage(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, M, D) int64: units in use now on each machine, workloads plus background noise."""
    n_envs, width = state.timeline.shape[:2]
    rows = np.arange(n_envs)
    slot = rows * width + state.t % width  # one (M, D) block per env
    usage = np.take(state.timeline.reshape(n_envs * width, *state.timeline.shape[2:]), slot, axis=0).astype(
        np.int64
    )
    if state.noise is not None:
        usage += state.noise[rows, np.minimum(state.t, state.noise.shape[1] - 1)]
    return usage


def committed_future_usage(state: State, horizon: int) -> np.ndarray:
    """(B, M, D, horizon) int64: units that already placed jobs will use at t, t+1, ..., t+horizon-1 (noise
    excluded; zero beyond the longest job)."""
    width = state.timeline.shape[1]
    ahead = np.arange(horizon)
    slots = (state.t[:, None] + np.minimum(ahead, width - 1)[None, :]) % width  # (B, H)
    out = np.take_along_axis(state.timeline, slots[:, :, None, None], axis=1).astype(np.int64)  # (B, H, M, D)
    out[:, ahead >= width] = 0
    return np.ascontiguousarray(out.transpose(0, 2, 3, 1))


_MEMO = threading.local()


def _memoised(state: State, key: str, compute) -> np.ndarray:
    """`compute()` once per state and key, read-only, for the last state asked about in this thread (a decision
    asks several rules and features about the same state) and the states derived from it by `share_memo`.
    `step` and every job pick return a new State; a job pick (`sim.policies.promote_queued_job`, in place or
    not) reorders only queued jobs and `relabel` changes only labels, which no memoised value reads, so they
    share the memo. Held weakly, as `sim.forecast.RecallMemo` holds its state."""

    def frozen() -> np.ndarray:
        value = compute()
        value.flags.writeable = False
        return value

    return memo_value(state, key, frozen)


def memo_value(state: State, key: Hashable, compute):
    """`compute()` once per state and key, as `_memoised` keeps it, for values that are not one array (a tuple of
    arrays that kernels take, left writeable: numba compiles read-only arrays as other types). The caller must
    not mutate what it gets, and keys it by everything it reads beyond what `share_memo`'s states share."""
    held = getattr(_MEMO, "held", None)
    if held is None or not any(ref() is state for ref in held[0]):
        held = _MEMO.held = ([weakref.ref(state)], {})
    if key not in held[1]:
        held[1][key] = compute()
    return held[1][key]


def memo_peek(state: State, key: Hashable):
    """What `memo_value` holds for `state` and `key`, or None (nothing is computed or stored)."""
    held = getattr(_MEMO, "held", None)
    if held is None or not any(ref() is state for ref in held[0]):
        return None
    return held[1].get(key)


def share_memo(state: State, derived: State) -> None:
    """`derived` reads the memoised values of `state` (`_memoised`): for a state that differs only in the order
    of waiting jobs or in labels."""
    held = getattr(_MEMO, "held", None)
    if held is not None and derived is not state and any(ref() is state for ref in held[0]):
        if len(held[0]) >= 8:  # states no longer held anywhere
            held[0][:] = [ref for ref in held[0] if ref() is not None]
        held[0].append(weakref.ref(derived))


def placed_requests(state: State) -> np.ndarray:
    """(B, M, D) int64 (read-only): sum of requests of the jobs running on each machine now."""
    return _memoised(state, "placed_requests", lambda: _per_machine(state)[0])


def jobs_per_machine(state: State) -> np.ndarray:
    """(B, M) int64 (read-only): jobs running on each machine now (the same pass as `placed_requests`)."""
    return _memoised(state, "jobs_per_machine", lambda: _per_machine(state)[1])


def _per_machine(state: State) -> tuple[np.ndarray, np.ndarray]:
    """`_placed_requests` and the running jobs per machine, each memoised for the state (one pass gives both)."""
    requests, counts = _running_per_machine(state)
    return _memoised(state, "placed_requests", lambda: requests), _memoised(
        state, "jobs_per_machine", lambda: counts
    )


def _placed_requests(state: State) -> np.ndarray:
    return _running_per_machine(state)[0]


def _running_per_machine(state: State) -> tuple[np.ndarray, np.ndarray]:
    from sim.compiled_planes import running_requests  # loads numba: on first use

    jobs = state.jobs
    m = state.busy_until.shape[1]
    return running_requests(state.t, state.job_machine, state.job_start, jobs.duration, jobs.request, m)


def _placed_requests_numpy(state: State) -> np.ndarray:
    """`_placed_requests` by numpy's masks and bincount (a test compares the two)."""
    n_envs, n_m = state.batch_size, state.busy_until.shape[1]
    is_run = jobs_running(state)
    flat = (np.arange(n_envs)[:, None] * n_m + np.maximum(state.job_machine, 0))[is_run]
    req = state.jobs.request[is_run].reshape(-1, state.jobs.n_resources)
    # float64 sums of integer requests (far below 2^53) are exact
    return sum_by_cell(req, flat, n_envs * n_m).astype(np.int64).reshape(n_envs, n_m, -1)


_SUMMED_DTYPES = tuple(np.dtype(t) for t in (np.float64, np.float32, np.int64, np.int32, np.int16))
"""The row dtypes `sum_by_cell` sums compiled (numba's arithmetic on them is numpy's)."""


def sum_by_cell(values: np.ndarray, cell: np.ndarray, n_cells: int) -> np.ndarray:
    """(n_cells, ...) float64 sums of the rows of `values` (N, ...) per `cell` (N,), each cell's rows added in
    their order, as np.add.at adds them, but several times faster: narrow (N, D) rows by one bincount per
    column, wider ones by one compiled pass (`sim.compiled_planes.sum_rows`; a sort and sorted segments where it
    does not apply)."""
    if values.ndim == 2 and values.shape[1] <= 4:
        columns = [np.bincount(cell, weights=values[:, d], minlength=n_cells) for d in range(values.shape[1])]
        return np.stack(columns, axis=1) if columns else np.zeros((n_cells, 0))
    if values.dtype in _SUMMED_DTYPES:
        from sim.compiled_planes import sum_rows  # loads numba: on first use

        summed = sum_rows(values, cell, n_cells)  # the same sums, without sorting the rows
        if summed is not None:
            return summed
    out = np.zeros((n_cells, *values.shape[1:]))
    if cell.size == 0:
        return out
    order = np.argsort(cell, kind="stable")
    sorted_cell = cell[order]
    starts = np.flatnonzero(np.r_[True, sorted_cell[1:] != sorted_cell[:-1]])
    out[sorted_cell[starts]] = np.add.reduceat(values[order], starts, axis=0)
    return out


def queue_head(state: State) -> QueueHead:
    """The head job of every env's queue."""
    rows, head = np.arange(state.batch_size), _head_index(state)
    has_job = (state.n_arrived > state.next_job) & ~state.is_done
    jobs = state.jobs
    return QueueHead(
        request=jobs.request[rows, head] * has_job[:, None],
        usage=jobs.usage[rows, head] * has_job[:, None, None],
        ec_label=jobs.ec_label[rows, head] * has_job,
        has_job=has_job,
        duration=jobs.duration[rows, head] * has_job,
    )


def queue_length(state: State) -> np.ndarray:
    """(B,) int64: |Q_t|, waiting jobs (visible slots plus backlog)."""
    return state.n_arrived - state.next_job


def machines_used(state: State) -> np.ndarray:
    """(B, M) bool: a workload runs on the machine now."""
    return state.busy_until > state.t[:, None]


def jobs_running(state: State) -> np.ndarray:
    """(B, J) bool (read-only): the job is placed and running at t."""

    def compute() -> np.ndarray:
        t = state.t[:, None]
        return (state.job_machine >= 0) & (state.job_start <= t) & (state.job_start + state.jobs.duration > t)

    return _memoised(state, "jobs_running", compute)


def splice_states(state: State, rows: np.ndarray, fresh: State) -> State:
    """A copy of `state` whose envs `rows` are replaced by the envs of `fresh` (len(rows) envs, same padding of
    jobs J and T_max); used to reset some envs of a batch (vector-env autoreset)."""
    rows = np.asarray(rows, dtype=np.int64)
    fields = {}
    for name in State.__dataclass_fields__:
        old, new = getattr(state, name), getattr(fresh, name)
        if name == "jobs":
            fields[name] = _splice_jobs(old, rows, new)
        elif name == "obs_label":
            fields[name] = _splice_labels(state, rows, fresh)
        elif old is None:
            fields[name] = None
        else:
            if old.shape[1:] != new.shape[1:]:
                raise ValueError(
                    f"cannot splice states: field {name} has shape {new.shape[1:]} != {old.shape[1:]}"
                )
            arr = old.copy()
            arr[rows] = new
            fields[name] = arr
    return State(**fields)


def _splice_labels(state: State, rows: np.ndarray, fresh: State) -> np.ndarray | None:
    """obs_label after splicing: None while neither side was relabelled, else each side's observed labels."""
    if state.obs_label is None and fresh.obs_label is None:
        return None
    out = observed_labels(state).copy()
    out[rows] = observed_labels(fresh)
    return out


def _splice_optional(
    old: np.ndarray | None,
    new: np.ndarray | None,
    old_shape: tuple,
    new_shape: tuple,
    rows: np.ndarray,
    dtype,
) -> np.ndarray | None:
    """An optional per-job array (meta, unquantised usage) with rows `rows` replaced by the fresh batch's; NaN
    where a side has none, None when neither has."""
    if old is None and new is None:
        return None
    out = nan_padded(old, old_shape, dtype)
    out[rows] = nan_padded(new, new_shape, dtype)
    return out


def _splice_jobs(jobs: JobBatch, rows: np.ndarray, fresh: JobBatch) -> JobBatch:
    arrays = {}
    for name in ("arrival_step", "duration", "usage", "request", "ec_label", "n_jobs"):
        arr = getattr(jobs, name).copy()
        arr[rows] = getattr(fresh, name)
        arrays[name] = arr

    def splice_tuple(old: tuple, new: tuple) -> tuple:
        if not old or not new:
            return ()
        out = list(old)
        for i, r in enumerate(rows):
            out[r] = new[i]
        return tuple(out)

    return JobBatch(
        **arrays,
        sequence_keys=splice_tuple(jobs.sequence_keys, fresh.sequence_keys),
        workload_ids=splice_tuple(jobs.workload_ids, fresh.workload_ids),
        meta=_splice_optional(
            jobs.meta,
            fresh.meta,
            (*jobs.ec_label.shape, len(JOB_META_COLUMNS)),
            (*fresh.ec_label.shape, len(JOB_META_COLUMNS)),
            rows,
            np.float64,
        ),
        usage_exact=_splice_optional(
            jobs.usage_exact, fresh.usage_exact, jobs.usage.shape, fresh.usage.shape, rows, np.float32
        ),
    )
