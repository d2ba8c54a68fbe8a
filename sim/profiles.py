"""Per-EC usage profiles: how a job of each equivalence class uses its request over its life, learned from
training sequences. They let a scheduler predict a job's future usage from what it can know (label, request,
age) instead of reading the job's true future (`sim.policies.ECProfilePeakAware`).

A profile is the mean, over the training jobs of one EC label, of usage[age] / request per resource:
- Only ages a job lives through count (a job of duration L contributes to ages 0..L-1), so the profile at age a
  is the mean usage of the jobs of that label still running at a; where no training job of the label lived to
  age a, the profile is 0 (the label's predicted life ends with its longest training job).
- A resource with request 0 has no fraction; that (job, resource) is left out of the mean (and of the counts).
- Labels without any training job fall back to the all-jobs profile (their `n_jobs` stays 0, saying so).
- Ages at or beyond `horizon` are not learned.
- Daily patterns (optional, `ProfileConfig.period_steps = P`): ages a, a + P, a + 2P, ... share one slot (the
  profile has P slots and is read at age mod P), i.e. the usage pattern is assumed to repeat every P steps of a
  job's life. The folded profile never ends, so a job is predicted to keep running. Folding is by AGE, not by
  wall-clock time: a daily cycle lines up only when jobs start at comparable times of day.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.jobs import JobBatch


@dataclass(frozen=True)
class ProfileConfig:
    """How `learn_profiles` bins ages."""

    period_steps: int | None = None
    """Fold ages modulo this many steps (a daily pattern: steps per day); None keeps one slot per age."""

    def __post_init__(self) -> None:
        if self.period_steps is not None and self.period_steps < 1:
            raise ValueError(f"period_steps must be >= 1 or None, got {self.period_steps}")


@dataclass(frozen=True)
class EcProfiles:
    """Usage per EC label and age as a fraction of the job's request: G labels, T age slots, D resources."""

    fraction: np.ndarray
    """(G, T, D) float64: mean usage / request of the label's jobs alive at that age (slot); 0 where none."""
    counts: np.ndarray
    """(G, T, D) int64: (job, age) pairs averaged into each entry (0 where the entry is a fallback or empty)."""
    n_jobs: np.ndarray
    """(G,) int64: training jobs per label; 0 = the label uses the all-jobs profile."""
    period_steps: int | None = None
    """When set, T == period_steps and age a is read from slot a mod T (see the module docstring)."""

    @property
    def horizon(self) -> int:
        """T: age slots."""
        return int(self.fraction.shape[1])

    @property
    def n_labels(self) -> int:
        return int(self.fraction.shape[0])

    def predict(self, labels: np.ndarray, ages: np.ndarray) -> np.ndarray:
        """(..., D) fraction of request used at `ages` by jobs with `labels` (broadcast together; ints).

        Unfolded: 0 at ages < 0 or >= T. Folded: slot age mod T for ages >= 0, 0 at negative ages."""
        labels, ages = np.broadcast_arrays(
            np.asarray(labels, dtype=np.int64), np.asarray(ages, dtype=np.int64)
        )
        if self.period_steps is None:
            is_known = (ages >= 0) & (ages < self.horizon)
            slot = np.clip(ages, 0, self.horizon - 1)
        else:
            is_known = ages >= 0
            slot = np.maximum(ages, 0) % self.horizon
        return self.fraction[labels, slot] * is_known[..., None]

    @staticmethod
    def flat(n_labels: int, n_resources: int) -> EcProfiles:
        """Every label uses its full request at every age, forever (request-based prediction; no learning)."""
        return EcProfiles(
            fraction=np.ones((n_labels, 1, n_resources)),
            counts=np.zeros((n_labels, 1, n_resources), dtype=np.int64),
            n_jobs=np.zeros(n_labels, dtype=np.int64),
            period_steps=1,
        )


def learn_profiles(
    jobs: JobBatch,
    n_labels: int,
    horizon: int,
    cfg: ProfileConfig = ProfileConfig(),
    labels_by_age: np.ndarray | None = None,
) -> EcProfiles:
    """EC profiles from the real (non-padding) jobs of `jobs`, the TRAINING sequences; see the module docstring.

    `labels_by_age` (B, J, A), when given, is the label a labeller serves each job after a = 0 .. A - 1 observed
    steps (`sim.labelling`; ages past A - 1 keep the last): the profiles are then fitted on the view they are
    served. A scheduler that sees label l for a job observed for a0 steps reads the profile of l at the ages
    a >= a0 it predicts, so every (job, a0) is a case: profile(l, a) is the mean of usage[a] / request over the
    cases with a0 <= a whose served label is l (a job weighs at age a once per observation age that showed it
    l), and `n_jobs` counts the jobs that were served l at some age of their life. None: every case takes the
    job's clustering label (`jobs.ec_label`).

    Shape (n_labels, horizon, D), or (n_labels, period_steps, D) when folded. ValueError on a label outside
    0..n_labels-1 (naming the job), on horizon < 1, or on a batch without any real job."""
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    is_real = jobs.is_real
    if not is_real.any():
        raise ValueError("learn_profiles: the job batch has no jobs to learn from")
    bad = is_real & ((jobs.ec_label < 0) | (jobs.ec_label >= n_labels))
    if bad.any():
        b, j = np.argwhere(bad)[0]
        raise ValueError(
            f"{jobs.describe_job(b, j)}: ec_label {jobs.ec_label[b, j]} outside 0..{n_labels - 1}"
        )
    n_ages = min(horizon, jobs.max_duration)
    n_slots = horizon if cfg.period_steps is None else cfg.period_steps
    ages = np.arange(n_ages)
    request = jobs.request.astype(np.float64)[:, :, None, :]  # (B, J, 1, D)
    is_alive = is_real[..., None] & (ages[None, None, :] < jobs.duration[..., None])  # (B, J, A)
    is_used = is_alive[..., None] & (request > 0)  # (B, J, A, D)
    frac = np.divide(
        jobs.usage[:, :, :n_ages].astype(np.float64), request, where=is_used, out=np.zeros(is_used.shape)
    )
    slot = ages if cfg.period_steps is None else ages % cfg.period_steps
    if labels_by_age is None:
        sums, counts, n_jobs = _clustered_sums(jobs, n_labels, n_slots, slot, is_real, is_used, frac)
    else:
        served = np.asarray(labels_by_age)
        sums, counts, n_jobs = _served_sums(jobs, n_labels, n_slots, slot, served, is_alive, is_used, frac)
    fraction = np.divide(sums, counts, where=counts > 0, out=np.zeros(sums.shape))
    all_counts = counts.sum(axis=0)
    all_jobs = np.divide(sums.sum(axis=0), all_counts, where=all_counts > 0, out=np.zeros(all_counts.shape))
    fraction[n_jobs == 0] = all_jobs
    return EcProfiles(
        fraction=fraction, counts=counts.astype(np.int64), n_jobs=n_jobs, period_steps=cfg.period_steps
    )


def _clustered_sums(jobs: JobBatch, n_labels: int, n_slots: int, slot, is_real, is_used, frac):
    """(sums, counts (G, T, D), n_jobs (G,)) of usage / request per (clustering label, slot, resource)."""
    n_d = jobs.n_resources
    # flat bin of (label, slot, resource) for every (job, age, resource)
    flat = (jobs.ec_label[:, :, None, None] * n_slots + slot[None, None, :, None]) * n_d + np.arange(n_d)
    size = n_labels * n_slots * n_d
    sums = np.bincount(flat[is_used], weights=frac[is_used], minlength=size).reshape(n_labels, n_slots, n_d)
    counts = np.bincount(flat[is_used], minlength=size).reshape(n_labels, n_slots, n_d)
    n_jobs = np.bincount(jobs.ec_label[is_real], minlength=n_labels).astype(np.int64)
    return sums, counts, n_jobs


def _served_sums(jobs: JobBatch, n_labels: int, n_slots: int, slot, served, is_alive, is_used, frac):
    """`_clustered_sums` on the labels a labeller serves (`learn_profiles`' docstring): every (job, observation
    age a0) a case of the label served after a0 steps, for the ages a >= a0; one pass per label."""
    if served.ndim != 3 or served.shape[:2] != jobs.ec_label.shape or served.shape[2] < 1:
        raise ValueError(
            f"learn_profiles: labels_by_age has shape {served.shape}; expected (B, J, A) with (B, J) = "
            f"{jobs.ec_label.shape}, the batch's jobs"
        )
    label = served[
        :, :, np.minimum(np.arange(slot.size), served.shape[2] - 1)
    ]  # (B, J, A): after a0 = a steps
    bad = is_alive & ((label < 0) | (label >= n_labels))
    if bad.any():
        b, j, a = np.argwhere(bad)[0]
        raise ValueError(
            f"{jobs.describe_job(b, j)}: served label {label[b, j, a]} outside 0..{n_labels - 1}"
        )
    n_d = jobs.n_resources
    sums = np.zeros((n_labels, n_slots, n_d))
    counts = np.zeros((n_labels, n_slots, n_d), dtype=np.int64)
    n_jobs = np.zeros(n_labels, dtype=np.int64)
    for g in np.unique(label[is_alive]):
        shown = is_alive & (label == g)
        cases = np.cumsum(shown, axis=2)  # (B, J, A): observation ages a0 <= a that showed g
        weight = cases[..., None] * is_used  # (B, J, A, D)
        for d in range(n_d):
            sums[g, :, d] = np.bincount(
                slot, weights=(weight[..., d] * frac[..., d]).sum(axis=(0, 1)), minlength=n_slots
            )
            counts[g, :, d] = np.bincount(slot, weights=weight[..., d].sum(axis=(0, 1)), minlength=n_slots)
        n_jobs[g] = int(shown.any(axis=2).sum())
    return sums, counts, n_jobs
