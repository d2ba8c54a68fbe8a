"""EC labels as the scheduler sees them: TVW-RL Algorithm 1's ClassifyToEC and UpdateECLabels in the simulator.

TVW-RL ("Run-time Logic", Algorithm 1 lines 5-8): an incoming workload's EC is predicted from its meta information
alone (`ClassifyToEC(Z, resource_usage = null)`), and before each placement the labels of the already running
workloads are re-predicted from their partial resource usage (`UpdateECLabels`). The clustering labels carried by the
jobs (`JobBatch.ec_label`, from `ec__assignments`) are what the classifier was trained to predict; at run time a real
scheduler would not know them.

A `Labeller` maps a simulator state to the (B, J) labels the observation shows; `sim.core.relabel` puts them into
the state and `sim.gym_env` calls the labeller before building every observation (= before every decision).

- `TrueLabeller`: the clustering labels (the simulator's behaviour without a labeller).
- `models.ec_labeller.ClassifierLabeller`: Algorithm 1 with a trained EC classifier (`models.ec_classifier`). Jobs waiting in the queue
  and jobs placed at the current step (the simulator starts a job when it places it, so "placed but not started" is
  a job with no usage observed yet) are labelled from meta only. A placed job that started at s < t is labelled from
  meta + its OBSERVED usage, the steps s..t-1 of its quantised profile (never step t or later: the future is not
  observed). Jobs that finished but still show in the image's h-step history keep being labelled from their whole
  observed life. All those jobs go through one `predict` call per step.

Observed usage -> the classifier's input (it was trained on the first m 5-minute bins of each workload's
(cpu_frac, mem_frac), `models.ec_classifier.usage_prefixes`):
- units -> fraction of a machine: units / C_d, divided by the multiplier `pipelines.job_sequences` applied before
  quantising (`usage_scale`, that builder's stats["usage_scale"][source]; 1 = none). Quantisation ("ceil" by default)
  is not undone: a step's fraction is the top of its unit, at most 1 / C_d above the true mean.
- steps -> bins: one logical step averages `prefix_bins_per_step` bins (`SequenceConfig.step_bins`, 12: one hour),
  so its value is repeated that many times; bins beyond the observed steps are NaN (the classifier reads a missing
  bin as its training mean). Only the first m bins are used, i.e. the first ceil(m / prefix_bins_per_step) steps.
A job is a window cut at a random offset of its workload's run, so its "prefix" starts later in the workload's life
than the prefixes the classifier was trained on; the piecewise-constant bins also lack the within-hour variation.
This train/serve skew is measured (issue 22 item 2, the sample's test sequences, 30-minute steps): after the first
step the saved classifier gets 0.12 on Bitbrains and 0.47 on Google-derived from the simulator's view, against 0.45
and 0.58 from the same windows' unquantised step means; quantisation is most of the loss. `models.sim_labeller`
trains a labeller on the simulator's own view instead (the training sequences' jobs, at sampled ages); since
2026-11-27 it is what the pipeline serves every policy (`assets.ec.labellers`), the classifier where it cannot be
fitted or is chosen (`SequenceRunSettings.served_labeller`). Both label a job from the steps before the current one,
each (job, age) predicted once and kept (`AgeTableLabeller`).

A job's prediction depends only on its meta and its age (steps observed), so `label_accuracy_by_age` measures a
labeller (any `AgeLabeller`) job by job and age by age without running a policy, beside the best constant label
(`most_frequent_label` of the training jobs), which is what a labeller that reads nothing reaches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl

from sim.config import SimConfig
from sim.core import State, observed_labels, relabel
from sim.jobs import JobBatch

LABEL_ACCURACY = {
    "age_steps": pl.Int64,  # usage steps observed when the label is predicted (0 = meta only)
    "n_jobs": pl.Int64,  # real jobs still running at that age (duration > age_steps)
    "n_correct": pl.Int64,  # of them, predicted label == clustering label
    "accuracy": pl.Float64,  # n_correct / n_jobs (NaN when n_jobs = 0)
    "constant_label": pl.Int64,  # the best constant label (most frequent training label); null when not given
    "n_constant_correct": pl.Int64,  # of the n_jobs, those whose clustering label is constant_label
    "constant_accuracy": pl.Float64,  # n_constant_correct / n_jobs: the accuracy of always predicting it
}
"""One row per age of `label_accuracy_by_age`."""


@runtime_checkable
class Labeller(Protocol):
    """Labels the scheduler sees: (B, J) int labels in 0..G-1 (entries of jobs it does not show are ignored)."""

    def labels(self, cfg: SimConfig, state: State) -> np.ndarray: ...


class EcPredictor(Protocol):
    """What ClassifierLabeller needs of `models.ec_classifier.TrainedClassifier` (sim does not import models)."""

    cfg: Any  # has prefix_bins: m, the usage bins the model reads (0 = meta only)

    def predict(self, meta: np.ndarray, prefixes: np.ndarray | None = None) -> np.ndarray: ...


class AgeLabeller(Protocol):
    """A labeller whose prediction for a job depends only on the job and its age (steps observed): what
    `label_accuracy_by_age` scores (`ClassifierLabeller`, `models.sim_labeller.SimViewLabeller`)."""

    def predict_jobs(
        self, cfg: SimConfig, jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class TrueLabeller:
    """The clustering labels carried by the jobs (`JobBatch.ec_label`): the default observation."""

    def labels(self, cfg: SimConfig, state: State) -> np.ndarray:
        return state.jobs.ec_label.copy()


def reads_labels(obj) -> bool:
    """Whether a policy or forecaster may read the observed EC labels (`sim.core.observed_labels`): its
    `reads_labels` attribute, True when it has none (an unknown one is served, never assumed blind). The
    heuristics, the observed-usage rules and the label-free forecasters say False, so `ServedLabels` skips
    relabelling for them; `tests/sim/test_evaluate.py` checks each such registered policy decides the same
    whatever labels it is shown."""
    return bool(getattr(obj, "reads_labels", True))


def picks_by_labels(policy) -> bool:
    """Whether a policy's job pick may read the observed EC labels: its `picks_by_labels` attribute (a rule whose
    fallback heuristic picks the jobs says its fallback's), else `reads_labels`. A pick that reads none is made
    on the state as it is, without relabelling it first."""
    return bool(getattr(policy, "picks_by_labels", reads_labels(policy)))


class ServedLabels:
    """A policy served with a labeller's labels instead of the jobs' clustering labels: before each job pick
    and placement the state is relabelled (`sim.core.relabel`, TVW-RL Algorithm 1's UpdateECLabels), so a rule
    that reads `observed_labels` (`forecast_peak`, `ec_peak_aware`) sees what a deployed scheduler would: a
    classifier's guess from the job's meta and observed usage, not the label its whole series was clustered to."""

    def __init__(self, policy, labeller: Labeller) -> None:
        self.policy = policy
        self.labeller = labeller
        self.name = getattr(policy, "name", type(policy).__name__)

    def _relabelled(self, cfg: SimConfig, state: State) -> State:
        if not reads_labels(self.policy):  # decides the same on any labels: skip the work
            return state
        return relabel(cfg, state, self.labeller.labels(cfg, state))

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        if not hasattr(self.policy, "pick_job"):
            return np.zeros(state.batch_size, dtype=np.int64)
        if not picks_by_labels(self.policy):  # picks the same on any labels: skip the work
            return self.policy.pick_job(cfg, state, rng)
        return self.policy.pick_job(cfg, self._relabelled(cfg, state), rng)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return self.policy.act(cfg, self._relabelled(cfg, state), rng)


class AgeTableLabeller:
    """Base of the labellers whose label for a job depends only on the job and its `observed_steps` (steps
    start .. t - 1; 0 in the queue and at the step it is placed). A label is predicted once per (job content,
    age) and kept: each batch gets, as a `JobBatch.rider` (so queue reorderings move it), the row of every job in
    the labeller's store, and a call predicts only the (job, age) pairs never seen, in one `predict_jobs` call.
    A rollout's per-episode copies of a batch, validation's many rollouts over the same sequences and a training
    loop's fresh windows of the same jobs all reuse what was predicted. Subclasses give `predict_jobs` and
    `n_ages(jobs)`, the ages after which the prediction no longer changes (ages past it read the last)."""

    max_jobs_kept: int = 100_000
    """Distinct jobs whose labels are kept; once more are, the store starts over at the next batch (bounds its
    memory at about this many jobs plus one batch's, times the longest job, in int16)."""

    def __init__(self) -> None:
        self._start_store()

    def _start_store(self) -> None:
        self._token = object()  # names this store's job rows among a batch's riders
        self._ids: dict[bytes, int] = {}  # job content (and capacity) -> row of the store
        self._store = np.full((0, 1), -1, dtype=np.int16)  # (jobs, ages) label, -1 = not predicted yet

    def n_ages(self, jobs: JobBatch) -> int:
        raise NotImplementedError

    def predict_jobs(
        self, cfg: SimConfig, jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray
    ) -> np.ndarray:
        raise NotImplementedError

    def prepare(self, cfg: SimConfig, jobs: JobBatch) -> None:
        """Assign the store rows of `jobs`' jobs now, kept with the batch (`JobBatch.rider`): the copies an episode
        makes of it (`JobBatch.owned_copy`) carry them instead of digesting every job again."""
        self._job_ids(cfg, jobs)

    def labels(self, cfg: SimConfig, state: State) -> np.ndarray:
        """(B, J) int64: predicted labels of `labelled_jobs`, the state's current observed labels elsewhere. Where
        every one of them is stored already, gathered by `sim.compiled_labels` (the same labels)."""
        from sim.compiled_labels import served_labels  # loads numba: on first use

        ids = self._job_ids(cfg, state.jobs)
        jobs = state.jobs
        gathered = served_labels(
            observed_labels(state), state.t, state.next_job, state.n_arrived, state.job_machine, state.job_start,
            jobs.duration, jobs.n_jobs, cfg.history_steps, ids, self._store, self.n_ages(jobs),
        )  # fmt: skip
        if gathered is not None:
            return gathered
        out = observed_labels(state).astype(np.int64, copy=True)
        bi, ji = np.nonzero(labelled_jobs(cfg, state))
        if bi.size:
            ages = np.minimum(observed_steps(state)[bi, ji], self.n_ages(state.jobs) - 1)
            out[bi, ji] = self._labels_at(cfg, state.jobs, bi, ji, ages)
        return out

    def label_table(self, cfg: SimConfig, jobs: JobBatch) -> np.ndarray:
        """(B, J, A) int64 label of every real job of `jobs` after a = 0 .. A - 1 observed steps (A =
        `n_ages(jobs)`; 0 for padding and ages past a job's end)."""
        n_ages = self.n_ages(jobs)
        table = np.zeros((jobs.batch_size, jobs.max_jobs, n_ages), dtype=np.int64)
        real = jobs.is_real
        rows, job_index, age = np.nonzero(real[..., None] & (np.arange(n_ages) <= jobs.duration[..., None]))
        table[rows, job_index, age] = self._labels_at(cfg, jobs, rows, job_index, age)
        return table

    def _labels_at(self, cfg: SimConfig, jobs: JobBatch, rows, job_index, ages) -> np.ndarray:
        ids = self._job_ids(cfg, jobs)[rows, job_index]
        values = self._store[ids, ages]
        need = values < 0
        if need.any():
            width = self._store.shape[1]
            pairs, first = np.unique(ids[need] * width + ages[need], return_index=True)
            where = np.flatnonzero(need)[first]  # one call per (job, age) never predicted
            for lo in range(0, pairs.size, 200_000):  # chunks bound the inputs' memory
                chunk = slice(lo, lo + 200_000)
                at = where[chunk]
                predicted = self.predict_jobs(cfg, jobs, rows[at], job_index[at], ages[at])
                self._store[pairs[chunk] // width, pairs[chunk] % width] = predicted
            values = self._store[ids, ages]
        return values.astype(np.int64)

    def _job_ids(self, cfg: SimConfig, jobs: JobBatch) -> np.ndarray:
        """(B, J) int64 store row of every job of `jobs` (0 for padding), kept with the batch."""
        if len(self._ids) > self.max_jobs_kept:  # checked on the count kept, so it cannot fire on every call
            self._start_store()
        capacity = np.asarray(cfg.capacity_units, dtype=np.int64).tobytes()
        key = ("ec_label_ids", self._token, capacity, cfg.n_resources)
        return jobs.rider(key, lambda: self._assign_ids(jobs, capacity))

    def _assign_ids(self, jobs: JobBatch, capacity: bytes) -> np.ndarray:
        out = np.zeros((jobs.batch_size, jobs.max_jobs), dtype=np.int64)
        seen: dict[bytes, int] = {}  # a rollout repeats each sequence over its trajectories
        for b, row in enumerate(row_digests(jobs)):
            if row in seen:
                out[b] = out[seen[row]]
                continue
            seen[row] = b
            for j in range(int(jobs.n_jobs[b])):
                key = job_digest(jobs, b, j, capacity)
                if key not in self._ids:
                    self._ids[key] = len(self._ids)
                out[b, j] = self._ids[key]
        n_rows, width = len(self._ids), max(self._store.shape[1], self.n_ages(jobs))
        if n_rows > self._store.shape[0] or width > self._store.shape[1]:
            grown = np.full((max(n_rows, 2 * self._store.shape[0]), width), -1, dtype=np.int16)
            grown[: self._store.shape[0], : self._store.shape[1]] = self._store
            self._store = grown
        return out


def job_digest(jobs: JobBatch, b: int, j: int, salt: bytes = b"") -> bytes:
    """A digest of what a label reads of job (b, j) (`_label_inputs`, plus `salt`, e.g. the simulator's
    capacity): jobs with the same digest get the same labels."""
    return array_digest(_label_inputs(jobs, b, slice(j, j + 1)), salt)


def row_digests(jobs: JobBatch) -> list[bytes]:
    """Per row of `jobs`, a digest of what a label reads of every one of its jobs (`_label_inputs`)."""
    return [
        array_digest([jobs.n_jobs[b : b + 1], *_label_inputs(jobs, b, slice(0, int(jobs.n_jobs[b])))])
        for b in range(jobs.batch_size)
    ]


def _label_inputs(jobs: JobBatch, b: int, which: slice) -> list[np.ndarray]:
    """What a label reads of jobs `which` of row b: durations, usage and unquantised usage over their longest
    duration (the batch's padding beyond is not content), requests and meta."""
    steps = int(jobs.duration[b, which].max(initial=0))
    parts = [jobs.duration[b, which], jobs.usage[b, which, :steps], jobs.request[b, which]]
    parts += [] if jobs.meta is None else [jobs.meta[b, which]]
    parts += [] if jobs.usage_exact is None else [jobs.usage_exact[b, which, :steps]]
    return parts


def array_digest(parts: list[np.ndarray], salt: bytes = b"") -> bytes:
    """A 16-byte digest of `salt` and the bytes of every array of `parts`, in order."""
    digest = hashlib.blake2b(salt, digest_size=16)
    for part in parts:
        digest.update(np.ascontiguousarray(part).tobytes())
    return digest.digest()


def labels_by_age(labeller, cfg: SimConfig, jobs: JobBatch) -> np.ndarray | None:
    """(B, J, A) label `labeller` serves each job of `jobs` after a = 0 .. A - 1 observed steps (its
    `label_table`); None without a labeller, or for one that does not label by age (then the clustering labels
    are the view)."""
    table = getattr(labeller, "label_table", None)
    return None if table is None else table(cfg, jobs)


def observed_steps(state: State) -> np.ndarray:
    """(B, J) int64: usage steps of each job observed by step t, min(t - start, duration) for placed jobs (steps
    start..t-1; a job placed at t has 0), 0 for jobs not placed."""
    age = state.t[:, None] - state.job_start
    return np.where(state.job_machine >= 0, np.clip(age, 0, state.jobs.duration), 0)


def labelled_jobs(cfg: SimConfig, state: State) -> np.ndarray:
    """(B, J) bool: the jobs whose label the observation shows now, which Algorithm 1 (re)labels: jobs waiting
    in the queue (backlog included) and placed jobs that are running or still in the image's h-step history."""
    index = np.arange(state.jobs.max_jobs)[None, :]
    is_waiting = (index >= state.next_job[:, None]) & (index < state.n_arrived[:, None])
    first_row = state.t - cfg.history_steps + 1  # oldest step the image shows
    is_shown = (state.job_machine >= 0) & (state.job_start + state.jobs.duration > first_row[:, None])
    return (is_waiting | is_shown) & (index < state.jobs.n_jobs[:, None])


def most_frequent_label(labels: np.ndarray) -> int:
    """The most frequent of non-negative int labels (the smallest on a tie): the best constant label when
    `labels` are the training jobs' labels. ValueError on an empty array."""
    labels = np.asarray(labels, dtype=np.int64).ravel()
    if labels.size == 0:
        raise ValueError("most_frequent_label: no labels")
    return int(np.bincount(labels).argmax())


def label_accuracy_by_age(
    labeller: AgeLabeller,
    cfg: SimConfig,
    jobs: JobBatch,
    ages: Sequence[int],
    constant_label: int | None = None,
) -> pl.DataFrame:
    """Fraction of jobs whose predicted label equals the clustering label (`ec_label`), per age (LABEL_ACCURACY),
    beside the accuracy of always predicting `constant_label` on the same jobs (null columns when None; pass the
    training jobs' `most_frequent_label`, never the test jobs', which would be an oracle constant).

    At age a a job has a usage steps observed (a = 0: on arrival, meta only); it counts at age a while it still
    runs (duration > a). One predict call per age; the result is what a rollout would see, whatever the policy,
    since a prediction depends only on the job and its age."""
    rows, job_index = np.nonzero(jobs.is_real)
    out = []
    for age in ages:
        if age < 0:
            raise ValueError(f"ages must be >= 0, got {age}")
        is_alive = jobs.duration[rows, job_index] > age
        r, j = rows[is_alive], job_index[is_alive]
        truth = jobs.ec_label[r, j]
        n_correct = 0
        if r.size:
            pred = labeller.predict_jobs(cfg, jobs, r, j, np.full(r.size, age))
            n_correct = int((pred == truth).sum())
        n_const = None if constant_label is None else int((truth == constant_label).sum())
        out.append(
            (
                int(age),
                int(r.size),
                n_correct,
                n_correct / r.size if r.size else float("nan"),
                constant_label,
                n_const,
                None if n_const is None else (n_const / r.size if r.size else float("nan")),
            )
        )
    return pl.DataFrame(out, schema=LABEL_ACCURACY, orient="row")
