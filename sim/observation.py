"""What a learned scheduler sees: one explicit configuration, and a fast flat encoding for a policy network.

TVW-RL's agent decides from the cluster's observed state and the EC labels of the workloads (Algorithm 1: labels
predicted from meta information, then from partial usage); it never sees a job's future usage. The heuristics keep
what the papers give them (peak usage as the request, `sim.policies`); this module is the agent's side.

`ObservationConfig` (the default is what a real scheduler knows at decision time):
- labels "predicted": the labels `models.ec_labeller.ClassifierLabeller` put into the state (`sim.core.relabel`):
  meta-only for waiting jobs, meta + observed usage for running ones. Encoding a state that no labeller touched
  is an error, so true labels never leak by accident. "true": the clustering labels (an ablation, and the
  synthetic workloads, whose job classes are known at arrival).
- queue_request "trace": the request the trace itself states for the job, as the fraction of a machine the
  workload asked for (`JobBatch.meta` columns cpu_request_frac / mem_request_frac), with a flag saying whether it
  is known (synthetic jobs and traces without requests: unknown, shown as 0). "peak": the job's peak quantised
  usage / C_d (what Tetris and DeepRM are given: the future, for ablations only). "none": no request at all.
- The machines' history is the OBSERVED usage of the last h steps; the future of placed jobs is never shown.

`encode(cfg, obs_cfg, state)` -> (B, F) float32 in [0, 1], the concatenation of (in this order, see
`feature_layout`):
  history   (h, M, D)  units in use (workloads + background noise) / C_d, clipped at 1, oldest step first; the
                       last row is the current step t AFTER the placements made so far at t (the state the next
                       decision sees); earlier rows are the closed steps t-h+1 .. t-1 (zeros before the start).
  by_label  (M, D, G)  units used now by running workloads of each observed EC label / C_d: the labels one-hot,
                       weighted by usage (TVW-RL's colour image, factorised: who runs where now, and how the
                       machine's usage moved over the last h steps).
  queue     (K, G + D + 1)  per visible queue slot: label one-hot, the request by `queue_request` (fractions in
                       [0, 1]), and 1 where a request is known; all zeros for an empty slot.
  backlog   (1,)       waiting jobs beyond the K slots / max jobs of the batch (clipped at 1).
This factorisation (rather than a per-unit colour image) is ours: the same information about labels and usage
history, built from two small arrays kept by the simulator (`State.past`, the committed timeline) with no
per-unit painting, so that building it costs about as much as a step. `sim.core.observe` keeps the DeepPlace
colour image for the Gymnasium adapter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.config import SimConfig
from sim.core import State, current_usage, observed_labels, queue_length

LABEL_MODES = ("predicted", "true")
REQUEST_MODES = ("trace", "peak", "none")


@dataclass(frozen=True)
class ObservationConfig:
    """What the agent sees (the module docstring says exactly what each choice shows)."""

    labels: str = "predicted"
    """"predicted": labels a Labeller put into the state (TVW-RL Algorithm 1); "true": the clustering labels."""
    queue_request: str = "trace"
    """"trace": the trace's own request where one exists; "peak": peak future usage (ablation); "none"."""

    def __post_init__(self) -> None:
        if self.labels not in LABEL_MODES:
            raise ValueError(f"ObservationConfig.labels must be one of {LABEL_MODES}, got {self.labels!r}")
        if self.queue_request not in REQUEST_MODES:
            raise ValueError(
                f"ObservationConfig.queue_request must be one of {REQUEST_MODES}, got {self.queue_request!r}"
            )


def feature_layout(cfg: SimConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each block of `encode`'s vector, in order."""
    m, d, h, g, k = cfg.n_machines, cfg.n_resources, cfg.history_steps, cfg.n_labels, cfg.queue_size
    return {"history": (h, m, d), "by_label": (m, d, g), "queue": (k, g + d + 1), "backlog": (1,)}


def n_features(cfg: SimConfig) -> int:
    """F: length of `encode`'s vector."""
    return sum(math.prod(shape) for shape in feature_layout(cfg).values())


def encode(cfg: SimConfig, obs_cfg: ObservationConfig, state: State) -> np.ndarray:
    """(B, F) float32 features in [0, 1] of every env (see the module docstring); done envs give zeros."""
    if obs_cfg.labels == "predicted" and state.obs_label is None:
        raise ValueError(
            "the observation config shows predicted EC labels, but no labeller has set them on this state: "
            "relabel it (models.ec_labeller.ClassifierLabeller, a sim.labelling.Labeller) or use ObservationConfig(labels='true')"
        )
    n_envs = state.batch_size
    out = np.empty((n_envs, n_features(cfg)), dtype=np.float32)
    # Every block is written through a 2-D (B, features) view, so numpy's inner loops are long.
    size = _encode_history(cfg, state, out)
    size += _encode_by_label(cfg, state, out[:, size:])
    size += _encode_queue(cfg, obs_cfg, state, out, size)
    backlog = np.maximum(queue_length(state) - cfg.queue_size, 0) / max(state.jobs.max_jobs, 1)
    out[:, size] = np.minimum(backlog, 1.0)
    if state.is_done.any():
        out[state.is_done] = 0.0
    return out


def _column_scale(cfg: SimConfig, repeat: int) -> np.ndarray:
    """(M * D * repeat,) float32 1 / C_d of each column of a block laid out (machine, resource, repeat)."""
    caps = [c for c in cfg.capacity_units for _ in range(repeat)] * cfg.n_machines
    return 1.0 / np.asarray(caps, dtype=np.float32)


def _encode_history(cfg: SimConfig, state: State, out: np.ndarray) -> int:
    """Write the history block (the last h-1 closed steps from `State.past`, kept scaled and clipped, oldest
    first, then the current step) into out[:, :size]; returns size."""
    n_envs, n_cells = state.batch_size, cfg.n_machines * cfg.n_resources
    size = cfg.history_steps * n_cells
    closed = size - n_cells
    out[:, :closed] = state.past.reshape(n_envs, size)[:, n_cells:]
    now = out[:, closed:size]
    np.multiply(
        current_usage(cfg, state).reshape(n_envs, n_cells).astype(np.float32),
        _column_scale(cfg, 1),
        out=now,
    )
    np.minimum(now, 1.0, out=now)
    return size


def _encode_by_label(cfg: SimConfig, state: State, out: np.ndarray) -> int:
    """Write the by_label block (usage now of the running jobs per machine, resource and label) into
    out[:, :size]; returns size."""
    n_envs, n_m, n_d, n_g = state.batch_size, cfg.n_machines, cfg.n_resources, cfg.n_labels
    jobs = state.jobs
    # placed jobs started at or before t, so running = placed and not yet ended
    is_running = (state.job_machine >= 0) & (state.job_start + jobs.duration > state.t[:, None])
    flat_job = np.flatnonzero(is_running)  # b * J + j
    bi = flat_job // jobs.max_jobs
    age = state.t[bi] - state.job_start.reshape(-1)[flat_job]
    machine = state.job_machine.reshape(-1)[flat_job]
    label = observed_labels(state).reshape(-1)[flat_job]
    if jobs.usage.flags.c_contiguous:  # a gather of D-unit rows is much faster than a (job, step) fancy index
        units = np.take(jobs.usage.reshape(-1, n_d), flat_job * jobs.max_duration + age, axis=0)  # (N, D)
    else:
        units = jobs.usage[bi, flat_job % jobs.max_jobs, age]
    # column (machine, resource, label) of env b: resource first so that every operation runs over N elements
    cell = (bi * n_m + machine) * (n_d * n_g) + label
    cell = cell[None, :] + (np.arange(n_d) * n_g)[:, None]  # (D, N)
    size = n_m * n_d * n_g
    by_label = np.bincount(cell.ravel(), weights=units.T.ravel(), minlength=n_envs * size)
    scale = _column_scale(cfg, n_g)
    # sums of integer units are exact in float32; scaling there equals scaling the float64 sum and rounding once
    by_label = by_label.reshape(n_envs, size).astype(np.float32)
    by_label *= scale
    np.minimum(by_label, 1.0, out=out[:, :size])
    return size


def _encode_queue(
    cfg: SimConfig, obs_cfg: ObservationConfig, state: State, out: np.ndarray, offset: int
) -> int:
    """Write the queue block (per visible slot: label one-hot, request, request known) into
    out[:, offset : offset + size] (out: the whole (B, F) array); returns size."""
    n_envs, n_g, n_d, n_k = state.batch_size, cfg.n_labels, cfg.n_resources, cfg.queue_size
    n_cols = n_g + n_d + 1
    size = n_k * n_cols
    queue = out[:, offset : offset + size].reshape(n_envs, n_k, n_cols)
    queue[:] = 0.0
    slot_jobs = state.next_job[:, None] + np.arange(n_k)[None, :]
    is_waiting = (slot_jobs < state.n_arrived[:, None]) & ~state.is_done[:, None]
    slot_jobs = np.minimum(slot_jobs, state.jobs.max_jobs - 1)
    waiting = np.flatnonzero(is_waiting)  # b * K + k
    env, slot = np.divmod(waiting, n_k)
    label = observed_labels(state).reshape(-1)[env * state.jobs.max_jobs + slot_jobs.reshape(-1)[waiting]]
    out.reshape(-1)[env * out.shape[1] + offset + slot * n_cols + label] = 1.0
    requests = _queue_requests(cfg, obs_cfg, state, slot_jobs)
    if requests is not None:
        request, known = requests
        queue[..., n_g : n_g + n_d] = request * is_waiting[..., None]
        queue[..., n_g + n_d] = known * is_waiting
    return size


def _queue_requests(
    cfg: SimConfig, obs_cfg: ObservationConfig, state: State, slot_jobs: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """((B, K, D) request in [0, 1], (B, K) 1.0 where known) of the jobs in the visible slots; None where no
    request is shown or known (all zeros)."""
    rows = np.arange(state.batch_size)[:, None]
    if obs_cfg.queue_request == "none":
        return None
    if obs_cfg.queue_request == "peak":
        cap = np.asarray(cfg.capacity_units, dtype=np.float32)
        request = state.jobs.request[rows, slot_jobs].astype(np.float32) / cap
        return np.minimum(request, 1.0), np.ones(slot_jobs.shape, dtype=np.float32)
    if state.jobs.meta is None or cfg.n_resources != 2:
        return None
    request = state.jobs.meta[rows, slot_jobs, :2]  # cpu_request_frac, mem_request_frac (JOB_META_COLUMNS)
    known = np.isfinite(request).all(axis=2)
    request = np.clip(np.nan_to_num(request, nan=0.0), 0.0, 1.0).astype(np.float32)
    return request * known[..., None], known.astype(np.float32)
