"""Job sequences as padded numpy arrays, batch axis first: the simulator's input.

One batch element is one job sequence (one episode). Jobs of a sequence are sorted by arrival step
(stable on job_index): the simulator relies on it (the queue is FIFO and always a contiguous index range).
Entries beyond `n_jobs[b]` are padding (zeros, label 0, arrival at a huge step) and never arrive.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import polars as pl

PAD_ARRIVAL = np.iinfo(np.int64).max // 4  # padding jobs "arrive" after any reachable step


class CopyBuffers:
    """Buffers for the owned copies of large per-job arrays (`JobBatch.owned_copy`), handed out again once nothing
    else holds them. A rollout copies its batch once per episode; at B x N = 400 DeepPlace's profiles are 156 MB,
    and a fresh 156 MB array costs its page faults on the first write: 0.29-0.38 s per copy in the training
    rollout, against 0.02-0.03 s into a buffer already mapped. A buffer is free when only this pool refers to it
    (`sys.getrefcount`): an array or any view of it still in use (a view holds its base) keeps it taken, so a
    buffer is never written under an earlier batch that someone kept. Arrays below `min_bytes` are copied plainly;
    the pool keeps at most `max_bytes`, dropping free buffers (oldest first) to make room, and copies plainly
    where it cannot."""

    def __init__(self, min_bytes: int = 8 << 20, max_bytes: int = 1 << 30) -> None:
        self.min_bytes, self.max_bytes = min_bytes, max_bytes
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    def _free(self, i: int) -> bool:
        return sys.getrefcount(self._buffers[i]) == 2  # the list's reference and the argument's: no one else

    def copy(self, a: np.ndarray) -> np.ndarray:
        """A C-ordered copy of `a` in a buffer no one else holds."""
        if a.nbytes < self.min_bytes:
            return a.copy()
        with self._lock:
            for i in range(len(self._buffers)):
                if self._buffers[i].shape == a.shape and self._buffers[i].dtype == a.dtype and self._free(i):
                    out = self._buffers[i]
                    np.copyto(out, a)
                    return out
            held = sum(b.nbytes for b in self._buffers)
            i = 0
            while held + a.nbytes > self.max_bytes and i < len(self._buffers):
                if self._free(i):
                    held -= self._buffers.pop(i).nbytes
                else:
                    i += 1
            out = a.copy()
            if held + a.nbytes <= self.max_bytes:
                self._buffers.append(out)
            return out

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()


COPY_BUFFERS = CopyBuffers()
"""The process's pool of owned-copy buffers (`JobBatch.owned_copy`)."""

SEQUENCE_KEY = ("source", "load_pct", "split", "sequence_id")
"""Columns of `sim__job_sequences` that identify one sequence (one batch element)."""

JOB_SEQUENCE_COLUMNS = (
    *SEQUENCE_KEY,
    "job_index",
    "arrival_step",
    "workload_id",
    "ec_label",
    "duration_steps",
    "cpu_units",
    "mem_units",
    "cpu_request_units",
    "mem_request_units",
    "is_long_running",
)

JOB_META_COLUMNS = ("cpu_request_frac", "mem_request_frac", "priority", "scheduling_class")
"""Optional columns of `sim__job_sequences` with each job's workload meta information (TVW-RL Algorithm 1's
meta-information(J)), in `JobBatch.meta` order; the same order as `models.ec_classifier.META_COLUMNS`."""

JOB_EXACT_USAGE_COLUMNS = ("cpu_units_exact", "mem_units_exact")
"""Optional columns of `sim__job_sequences` with each job's usage per step before quantisation (float units of
C_d, `pipelines.job_sequences.EXACT_USAGE_COLUMNS`), in `JobBatch.usage_exact` resource order."""


def rotation_index(
    rows: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, to, from) flat indices that rotate entries lo[i] .. hi[i] of row rows[i] right by one, every row at
    once: `values[row, to] = values[row, from]` (rows distinct)."""
    rows, lo, hi = (np.asarray(a, dtype=np.int64) for a in (rows, lo, hi))
    length = hi - lo + 1
    offset = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    to = np.repeat(lo, length) + offset
    return np.repeat(rows, length), to, np.where(offset == 0, np.repeat(hi, length), to - 1)


@dataclass(frozen=True)
class ObservedPrefix:
    """Per job and age a, summaries of its usage at ages 0 .. a, NaN steps skipped (`np.nanmax` / `np.nanmean`
    of the prefix, without reducing it again): `(B, J, T, D)` each, of the batch the summaries were computed
    from; `rows` maps a row of the current batch to its row there and `order` a job to its job there (a batch
    of selected rows, `JobBatch.select`, shares the summaries and maps its rows; a batch whose queue was
    reordered, `sim.policies.promote_queued_job`, keeps them and moves only `order`)."""

    peak: np.ndarray
    """float32 largest value so far (NaN while every value so far is NaN; exact: the profiles are int16 or
    float32)."""
    total: np.ndarray
    """float64 sum of the non-NaN values so far."""
    count: np.ndarray
    """int16 (int32 for T >= 32767) non-NaN values so far."""
    order: np.ndarray
    """(B, J) int64: job j of row b of the current batch is job order[b, j] of the arrays above."""
    rows: np.ndarray | None = None
    """(B,) int64: row b of the current batch is row rows[b] of the arrays above (None: the same row)."""
    at_peak: np.ndarray | None = None
    """bool: the value at age a is the largest so far (False where it is NaN): the remaining-peak table's at-peak
    key, read by the compiled look-ups (`sim.compiled_decision.peak_cells`) instead of the profile itself."""
    derived: dict = field(default_factory=dict, compare=False, repr=False)
    """Arrays a reader derives from these summaries, kept with them (`sim.compiled_decision.peak_cells`): a batch
    that shares the summaries (a selection, a reordering) shares these too, and they go when the summaries go."""

    @staticmethod
    def of(profiles: np.ndarray) -> ObservedPrefix:
        values = profiles.astype(np.float64)
        is_value = ~np.isnan(values)
        with warnings.catch_warnings(action="ignore", category=RuntimeWarning):
            peak = np.fmax.accumulate(values, axis=2).astype(np.float32)  # fmax skips NaN, as nanmax does
        # float32 and int16 values sum exactly in float64 over a job's life, so this equals nanmean's sum
        total = np.cumsum(np.where(is_value, values, 0.0), axis=2)
        count = np.cumsum(is_value, axis=2, dtype=np.int16 if profiles.shape[2] < 32767 else np.int32)
        order = np.broadcast_to(np.arange(profiles.shape[1]), profiles.shape[:2]).copy()
        at_peak = values >= peak  # exact: peak is one of the values; NaN compares False
        return ObservedPrefix(peak=peak, total=total, count=count, order=order, at_peak=at_peak)

    def reordered(self) -> ObservedPrefix:
        """The same summaries with a copy of `order` (to reorder in place)."""
        return replace(self, order=self.order.copy())

    def selected(self, rows: np.ndarray) -> ObservedPrefix:
        """The same summaries (shared, not copied) for a batch of these rows of the current one."""
        mapped = rows if self.rows is None else self.rows[rows]
        return replace(self, order=self.order[rows], rows=mapped)

    def one_job_per_row(self, rows: np.ndarray, job_index: np.ndarray) -> ObservedPrefix:
        """The same summaries (shared) for a batch whose row i holds only job job_index[i] of row rows[i] of the
        current one (`models.sim_labeller.state_at_ages`)."""
        mapped = rows if self.rows is None else self.rows[rows]
        return replace(self, order=self.order[rows, job_index][:, None], rows=mapped)

    def _row(self, env: np.ndarray) -> np.ndarray:
        return env if self.rows is None else self.rows[env]

    def peak_at(self, env: np.ndarray, job: np.ndarray, n_observed: np.ndarray) -> np.ndarray:
        """(N, D) float64 life_max of `at` alone (one gather instead of three: what flat forecasters read)."""
        last = np.clip(n_observed - 1, 0, self.peak.shape[2] - 1)
        peak = self.peak[self._row(env), self.order[env, job], last].astype(np.float64)
        # where nothing is observed, or every observed value is NaN (then the running fmax is NaN too)
        peak[n_observed <= 0] = np.nan
        return peak

    def at(self, env: np.ndarray, job: np.ndarray, n_observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(life_max, life_mean) (N, D) over each job's first n_observed ages; NaN where none is observed."""
        env_row, row = self._row(env), self.order[env, job]
        last = np.clip(n_observed - 1, 0, self.peak.shape[2] - 1)
        count = np.where(n_observed[:, None] > 0, self.count[env_row, row, last], 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, self.total[env_row, row, last] / count, np.nan)
        peak = np.where(count > 0, self.peak[env_row, row, last].astype(np.float64), np.nan)
        return peak, mean


@dataclass(frozen=True)
class JobBatch:
    """B job sequences, padded to J jobs and T_max steps; D resources (cpu, mem)."""

    arrival_step: np.ndarray
    """(B, J) int64: logical step at which the job enters the queue (sorted within a row)."""
    duration: np.ndarray
    """(B, J) int64: steps the job runs once placed (>= 1 for real jobs, 0 for padding)."""
    usage: np.ndarray
    """(B, J, T_max, D) int16: quantised units used in each step of the job's life (0 beyond duration)."""
    request: np.ndarray
    """(B, J, D) int16: requested units (peak usage unless the table says otherwise)."""
    ec_label: np.ndarray
    """(B, J) int64: equivalence-class label in 0..G-1."""
    n_jobs: np.ndarray
    """(B,) int64: real jobs per row; entries beyond are padding."""
    sequence_keys: tuple[tuple, ...] = ()
    """Per row, the (source, load_pct, split, sequence_id) it came from (for error messages)."""
    workload_ids: tuple[tuple[str, ...], ...] = ()
    """Per row, workload_id of each real job (for error messages and traces)."""
    meta: np.ndarray | None = None
    """(B, J, 4) float64 meta information per job in JOB_META_COLUMNS order (requested cpu/mem fraction of a
    machine as in the trace, priority, scheduling class), NaN where unknown and for padding; None when the
    sequences carry no meta columns. Only EC labelling reads it (`sim.labelling`), never the step logic."""
    usage_exact: np.ndarray | None = None
    """(B, J, T_max, D) float32 usage per step BEFORE quantisation, in units of C_d (what `usage` was quantised
    from), NaN beyond a job's duration and for padding, and for a job whose table row has none; None when the
    sequences carry no such columns. Only the EC labeller reads it, through `sim.forecast.job_view` (observed
    steps only); the step logic, masks and heuristics stay on the integer `usage`."""

    @property
    def batch_size(self) -> int:
        return int(self.arrival_step.shape[0])

    @property
    def max_jobs(self) -> int:
        return int(self.arrival_step.shape[1])

    @property
    def max_duration(self) -> int:
        return int(self.usage.shape[2])

    @property
    def n_resources(self) -> int:
        return int(self.usage.shape[3])

    @property
    def is_real(self) -> np.ndarray:
        """(B, J) bool: True for each row's real jobs, False for padding (job index < n_jobs)."""
        return np.arange(self.max_jobs)[None, :] < self.n_jobs[:, None]

    @cached_property
    def content_digest(self) -> str:
        """A hex digest of everything the batch holds (every array with its shape and dtype, the sequence keys and
        workload ids): two batches with the same digest play the same episodes. Computed once per batch."""
        digest = hashlib.blake2b(digest_size=20)
        arrays = (self.arrival_step, self.duration, self.usage, self.request, self.ec_label, self.n_jobs)
        for part in (*arrays, self.meta, self.usage_exact):
            if part is None:
                digest.update(b"none")
                continue
            part = np.ascontiguousarray(part)
            digest.update(f"{part.dtype.str}{part.shape}".encode())
            digest.update(part.tobytes())
        digest.update(repr((self.sequence_keys, self.workload_ids)).encode())
        return digest.hexdigest()

    @cached_property
    def workload_code(self) -> np.ndarray:
        """(B, J) int64: each real job's workload as an integer, equal within a row exactly where the workload ids
        are equal (the same service submitted again); -1 for padding and where the ids are unknown. Computed once
        per batch from `workload_ids`."""
        codes = np.full(self.arrival_step.shape, -1, dtype=np.int64)
        for b, ids in enumerate(self.workload_ids[: self.batch_size]):
            n = min(len(ids), int(self.n_jobs[b]))
            if n:
                _, codes[b, :n] = np.unique(
                    np.asarray(ids[:n], dtype=object).astype(str), return_inverse=True
                )
        return codes

    @cached_property
    def observed_prefix(self) -> tuple[ObservedPrefix, ObservedPrefix | None]:
        """Running summaries of every job's usage by age, of `usage` and of `usage_exact` (None without it),
        computed once per batch: what `sim.forecast.job_view` reads instead of reducing each job's whole
        profile at every decision (a job's observed usage is a prefix of its profile)."""
        return ObservedPrefix.of(self.usage), (
            None if self.usage_exact is None else ObservedPrefix.of(self.usage_exact)
        )

    def rotated(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> JobBatch:
        """A copy in which jobs lo[i] .. hi[i] of row rows[i] rotate right by one (job hi[i] lands at lo[i], the
        others keep their order); running summaries already computed (`observed_prefix`) move with their jobs
        instead of being computed again, and so do the workload codes (`workload_code`)."""
        out = self.owned_copy()
        out.rotate_in_place(rows, lo, hi)
        return out

    _JOB_ARRAYS = ("arrival_step", "duration", "usage", "request", "ec_label", "meta", "usage_exact")
    """The per-job arrays a queue reordering moves."""

    def owned_copy(self) -> JobBatch:
        """A copy whose per-job arrays (and the `order` of running summaries already computed, and the workload
        codes) no other batch holds: what `rotate_in_place` may reorder. A rollout that owns its batch copies it
        once per episode instead of once per reordering (`sim.policies.promote_queued_job`); the large arrays go into
        buffers of earlier copies that nothing holds any more (`CopyBuffers`)."""
        arrays = {
            name: COPY_BUFFERS.copy(getattr(self, name))
            for name in self._JOB_ARRAYS
            if getattr(self, name) is not None
        }
        out = replace(self, **arrays)
        prefix = self.__dict__.get("observed_prefix")
        if prefix is not None:
            out.__dict__["observed_prefix"] = tuple(p if p is None else p.reordered() for p in prefix)
        if "workload_code" in self.__dict__:
            out.__dict__["workload_code"] = self.__dict__["workload_code"].copy()
        if "_riders" in self.__dict__:
            out.__dict__["_riders"] = {key: value.copy() for key, value in self.__dict__["_riders"].items()}
        return out

    def rider(self, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A per-job array (B, J, ...) derived from the jobs alone, computed once by `make` and kept with this
        batch under `key`: `rotate_in_place` moves it with its jobs and `owned_copy` copies it, so a cache of
        what depends only on each job (an EC classifier's label by age) survives queue reorderings. Read-only:
        every holder of the batch shares it. ValueError when `make` returns another leading shape."""
        riders = self.__dict__.setdefault("_riders", {})
        if key not in riders:
            value = np.asarray(make())
            if value.shape[:2] != (self.batch_size, self.max_jobs):
                raise ValueError(
                    f"JobBatch.rider {key!r}: shape {value.shape} does not start with the batch's "
                    f"({self.batch_size}, {self.max_jobs})"
                )
            riders[key] = value
        return riders[key]

    @property
    def revision(self) -> int:
        """How many times `rotate_in_place` reordered this batch: caches keyed by a batch also key by this."""
        return int(self.__dict__.get("_revision", 0))

    def rotate_in_place(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """IN PLACE, on a batch no one else holds (`owned_copy`): jobs lo[i] .. hi[i] of row rows[i] rotate right
        by one, with their running summaries' `order`, workload codes and ids; `revision` counts up."""
        if np.size(rows) == 0:
            return
        from sim.compiled_batch import rotate_rows  # loads numba: on first use

        rows, lo, hi = (np.asarray(a, dtype=np.int64) for a in (rows, lo, hi))
        moved = [getattr(self, name) for name in self._JOB_ARRAYS if getattr(self, name) is not None]
        moved += [p.order for p in self.__dict__.get("observed_prefix") or () if p is not None]
        if "workload_code" in self.__dict__:
            moved.append(self.__dict__["workload_code"])
        moved += list(self.__dict__.get("_riders", {}).values())
        index = None
        for values in moved:
            if not rotate_rows(values, rows, lo, hi):  # not contiguous: numpy moves it
                index = rotation_index(rows, lo, hi) if index is None else index
                r, to, frm = index
                values[r, to] = values[r, frm]
        if self.workload_ids:
            wids = list(self.workload_ids)
            for row, a, b in zip(rows.tolist(), lo.tolist(), hi.tolist(), strict=True):
                w = wids[row] if row < len(wids) else ()
                if b < len(w):
                    w = list(w)
                    w[a : b + 1] = [w[b], *w[a:b]]
                    wids[row] = tuple(w)
            object.__setattr__(self, "workload_ids", tuple(wids))
        self.__dict__["_revision"] = self.revision + 1

    def describe_job(self, b: int, j: int) -> str:
        """Human-readable name of job j of row b: its sequence key, index and workload id."""
        key = self.sequence_keys[b] if b < len(self.sequence_keys) else (f"row {b}",)
        wid = self.workload_ids[b][j] if b < len(self.workload_ids) and j < len(self.workload_ids[b]) else "?"
        return f"sequence {key} job {j} (workload {wid})"

    def select(self, rows: Sequence[int] | np.ndarray) -> JobBatch:
        """A JobBatch of the given rows (repeats allowed), same padding. Running summaries this batch has
        computed already (`observed_prefix`) are shared, not computed again for the selection (a training
        batch repeats each sequence over its rollouts), and its riders (`rider`) are selected with it."""
        rows = np.asarray(rows, dtype=np.int64)
        pick = lambda tup: tuple(tup[r] for r in rows) if tup else ()  # noqa: E731
        out = JobBatch(
            arrival_step=self.arrival_step[rows],
            duration=self.duration[rows],
            usage=self.usage[rows],
            request=self.request[rows],
            ec_label=self.ec_label[rows],
            n_jobs=self.n_jobs[rows],
            sequence_keys=pick(self.sequence_keys),
            workload_ids=pick(self.workload_ids),
            meta=None if self.meta is None else self.meta[rows],
            usage_exact=None if self.usage_exact is None else self.usage_exact[rows],
        )
        prefix = self.__dict__.get("observed_prefix")
        if prefix is not None:
            out.__dict__["observed_prefix"] = tuple(p if p is None else p.selected(rows) for p in prefix)
        if "_riders" in self.__dict__:  # derived from each job alone: the selected rows' are theirs
            out.__dict__["_riders"] = {key: value[rows] for key, value in self.__dict__["_riders"].items()}
        return out

    def lend_summaries(self, one: JobBatch, rows: np.ndarray, job_index: np.ndarray, max_values: int) -> None:
        """Give `one`, a batch whose row i holds only job job_index[i] of row rows[i] of this one, this batch's
        running summaries (`observed_prefix`, shared as `select` shares them, not computed for `one`): computed
        here first where they are not yet, if this batch has at most `max_values` usage values (else `one`
        computes its own when asked)."""
        prefix = self.__dict__.get("observed_prefix")
        if prefix is None and self.usage.size <= max_values:
            prefix = self.observed_prefix
        if prefix is not None:
            one.__dict__["observed_prefix"] = tuple(
                p if p is None else p.one_job_per_row(rows, job_index) for p in prefix
            )

    def first_jobs(self, n: int) -> JobBatch:
        """The batch with only the first n jobs (by arrival) of each row, padded to J = min(n, J) and to the
        longest kept job (TVW-RL: "a fixed number of jobs arrive" per episode). Rows with at most n jobs keep
        all theirs."""
        if n < 1:
            raise ValueError(f"first_jobs: n must be >= 1, got {n}")
        if n >= self.max_jobs:
            return self
        n_jobs = np.minimum(self.n_jobs, n)
        t_max = max(int(self.duration[:, :n].max(initial=1)), 1)
        return JobBatch(
            arrival_step=self.arrival_step[:, :n].copy(),
            duration=self.duration[:, :n].copy(),
            usage=self.usage[:, :n, :t_max].copy(),
            request=self.request[:, :n].copy(),
            ec_label=self.ec_label[:, :n].copy(),
            n_jobs=n_jobs,
            sequence_keys=self.sequence_keys,
            workload_ids=tuple(w[:n] for w in self.workload_ids),
            meta=None if self.meta is None else self.meta[:, :n].copy(),
            usage_exact=None if self.usage_exact is None else self.usage_exact[:, :n, :t_max].copy(),
        )

    @staticmethod
    def from_jobs(sequences: Sequence[Sequence[dict]], n_resources: int = 2) -> JobBatch:
        """Build from plain Python: one list per sequence of dicts with keys arrival_step, usage
        (list of per-step lists of D units), ec_label, and optionally request (D units; default peak),
        workload_id, meta (4 values in JOB_META_COLUMNS order, None = unknown; `meta` is None unless some
        job has it) and usage_exact (per-step lists of D floats, the unquantised usage, same length as usage;
        `usage_exact` is None unless some job has it, NaN for a job without). Handy for tests and synthetic
        workloads."""
        n_rows = len(sequences)
        n_max = max([len(s) for s in sequences] + [1])
        t_max = max([len(j["usage"]) for s in sequences for j in s] + [1])
        batch = _empty(n_rows, n_max, t_max, n_resources)
        wids: list[tuple[str, ...]] = []
        has_meta = any("meta" in j for s in sequences for j in s)
        meta = np.full((n_rows, n_max, len(JOB_META_COLUMNS)), np.nan) if has_meta else None
        has_exact = any(j.get("usage_exact") is not None for s in sequences for j in s)
        exact = np.full((n_rows, n_max, t_max, n_resources), np.nan, np.float32) if has_exact else None
        for b, seq in enumerate(sequences):
            order = sorted(range(len(seq)), key=lambda i: (seq[i]["arrival_step"], i))
            for j, i in enumerate(order):
                job = seq[i]
                prof = np.asarray(job["usage"], dtype=np.int64).reshape(-1, n_resources)
                _fill(batch, b, j, job["arrival_step"], prof, job.get("request"), job["ec_label"])
                if meta is not None and job.get("meta") is not None:
                    meta[b, j] = _meta_values(job["meta"], f"row {b} job {j}")
                if exact is not None and job.get("usage_exact") is not None:
                    exact[b, j, : len(prof)] = _exact_values(
                        job["usage_exact"], prof.shape, f"row {b} job {j}"
                    )
            batch["n_jobs"][b] = len(seq)
            wids.append(tuple(str(seq[i].get("workload_id", f"job{i}")) for i in order))
        keys = tuple(("python", 0, "", b) for b in range(n_rows))
        return JobBatch(**batch, sequence_keys=keys, workload_ids=tuple(wids), meta=meta, usage_exact=exact)

    @staticmethod
    def from_frame(df: pl.DataFrame) -> JobBatch:
        """Build from the `sim__job_sequences` table: one row per (source, load_pct, split, sequence_id),
        ordered by that key; jobs ordered by (arrival_step, job_index). `meta` is filled when the frame has
        every JOB_META_COLUMNS column (nulls become NaN), else None; `usage_exact` when it has both
        JOB_EXACT_USAGE_COLUMNS (a null list or value becomes NaN), else None (older tables). Raises ValueError naming the
        sequence and job on a null arrival/duration/label, a negative arrival, a non-positive duration, or
        usage lists whose length differs from duration_steps."""
        missing = [c for c in JOB_SEQUENCE_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"job sequence frame lacks columns {missing}")
        df = df.sort([*SEQUENCE_KEY, "arrival_step", "job_index"])
        groups = df.partition_by(list(SEQUENCE_KEY), maintain_order=True, as_dict=False)
        n_max = max([g.height for g in groups] + [1])
        t_max = max([int(df["duration_steps"].max() or 1), 1])
        batch = _empty(len(groups), n_max, t_max, 2)
        has_meta = all(c in df.columns for c in JOB_META_COLUMNS)
        meta = np.full((len(groups), n_max, len(JOB_META_COLUMNS)), np.nan) if has_meta else None
        has_exact = all(c in df.columns for c in JOB_EXACT_USAGE_COLUMNS)
        exact = np.full((len(groups), n_max, t_max, 2), np.nan, np.float32) if has_exact else None
        keys, wids = [], []
        for b, g in enumerate(groups):
            key = tuple(g.row(0, named=True)[c] for c in SEQUENCE_KEY)
            keys.append(key)
            wids.append(tuple(str(w) for w in g["workload_id"].to_list()))
            for j, row in enumerate(g.iter_rows(named=True)):
                prof = _profile_of_row(row, key, j)
                request = (row["cpu_request_units"], row["mem_request_units"])
                if request[0] is None or request[1] is None:
                    request = None
                _fill(batch, b, j, row["arrival_step"], prof, request, row["ec_label"])
                if exact is not None:
                    exact[b, j, : len(prof)] = _exact_of_row(row, len(prof), key, j)
            batch["n_jobs"][b] = g.height
            if meta is not None:
                meta[b, : g.height] = g.select(
                    [pl.col(c).cast(pl.Float64) for c in JOB_META_COLUMNS]
                ).to_numpy()  # nulls come out as NaN
        return JobBatch(
            **batch, sequence_keys=tuple(keys), workload_ids=tuple(wids), meta=meta, usage_exact=exact
        )


def stack_job_batches(batches: Sequence[JobBatch]) -> JobBatch:
    """Concatenate JobBatches along the batch axis, re-padding J and T_max to the largest."""
    n_max = max(b.max_jobs for b in batches)
    t_max = max(b.max_duration for b in batches)
    d = batches[0].n_resources
    parts = []
    for jb in batches:
        dj, dt = n_max - jb.max_jobs, t_max - jb.max_duration
        parts.append(
            dict(
                arrival_step=np.pad(jb.arrival_step, ((0, 0), (0, dj)), constant_values=PAD_ARRIVAL),
                duration=np.pad(jb.duration, ((0, 0), (0, dj))),
                usage=np.pad(jb.usage, ((0, 0), (0, dj), (0, dt), (0, 0))),
                request=np.pad(jb.request, ((0, 0), (0, dj), (0, 0))),
                ec_label=np.pad(jb.ec_label, ((0, 0), (0, dj))),
                n_jobs=jb.n_jobs,
            )
        )
    if any(p["usage"].shape[3] != d for p in parts):
        raise ValueError("cannot stack JobBatches with different numbers of resources")
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    keys = tuple(k for jb in batches for k in (jb.sequence_keys or [("?",)] * jb.batch_size))
    wids = tuple(w for jb in batches for w in (jb.workload_ids or [()] * jb.batch_size))
    meta = None
    if any(jb.meta is not None for jb in batches):
        meta = np.concatenate([_padded_meta(jb, n_max) for jb in batches])
    exact = None
    if any(jb.usage_exact is not None for jb in batches):
        exact = np.concatenate([_padded_exact(jb, n_max, t_max) for jb in batches])
    return JobBatch(**arrays, sequence_keys=keys, workload_ids=wids, meta=meta, usage_exact=exact)


def nan_padded(values: np.ndarray | None, shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """An optional per-job array (`JobBatch.meta`, `JobBatch.usage_exact`) in a NaN array of `shape`: its leading
    part where `shape` is smaller, NaN beyond it, all NaN when `values` is None."""
    out = np.full(shape, np.nan, dtype=dtype)
    if values is not None:
        part = tuple(slice(0, min(a, b)) for a, b in zip(shape, values.shape, strict=True))
        out[part] = values[part]
    return out


def _padded_meta(jobs: JobBatch, max_jobs: int) -> np.ndarray:
    """(B, max_jobs, 4) meta of `jobs`, NaN for padding and when the batch has none (max_jobs >= J)."""
    return nan_padded(jobs.meta, (jobs.batch_size, max_jobs, len(JOB_META_COLUMNS)))


def _padded_exact(jobs: JobBatch, max_jobs: int, max_duration: int) -> np.ndarray:
    """(B, max_jobs, max_duration, D) float32 `usage_exact` of `jobs`, NaN for padding and when the batch has none
    (max_jobs >= J, max_duration >= T_max)."""
    return nan_padded(
        jobs.usage_exact, (jobs.batch_size, max_jobs, max_duration, jobs.n_resources), np.float32
    )


def _exact_values(values, shape: tuple[int, ...], where: str) -> np.ndarray:
    """Unquantised usage (duration, D) as float32 (None = NaN); ValueError naming `where` on a wrong shape."""
    out = np.array(
        [[np.nan if v is None else float(v) for v in step] for step in values], dtype=np.float32
    ).reshape(-1, shape[1])
    if out.shape != shape:
        raise ValueError(f"{where}: usage_exact has shape {out.shape}, usage {shape}")
    return out


def _exact_of_row(row: dict, dur: int, key: tuple, j: int) -> np.ndarray:
    """(dur, 2) float32 unquantised units of one table row (NaN where a list or a value is null);
    ValueError naming the job when a list's length differs from duration_steps."""
    out = np.full((dur, 2), np.nan, dtype=np.float32)
    for d, c in enumerate(JOB_EXACT_USAGE_COLUMNS):
        values = row[c]
        if values is None:
            continue
        if len(values) != dur:
            raise ValueError(
                f"sequence {key} job {j} (workload {row['workload_id']}): duration_steps={dur} but "
                f"len({c})={len(values)}"
            )
        out[:, d] = np.array([np.nan if v is None else v for v in values], dtype=np.float32)
    return out


def _meta_values(values, where: str) -> np.ndarray:
    """4 meta values (None = unknown) as float64 with NaN; ValueError naming `where` on a wrong count."""
    out = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    if out.shape != (len(JOB_META_COLUMNS),):
        raise ValueError(
            f"{where}: meta must have {len(JOB_META_COLUMNS)} values {JOB_META_COLUMNS}, got {values}"
        )
    return out


def _empty(n_rows: int, n_max: int, t_max: int, n_res: int) -> dict:
    return dict(
        arrival_step=np.full((n_rows, n_max), PAD_ARRIVAL, dtype=np.int64),
        duration=np.zeros((n_rows, n_max), dtype=np.int64),
        usage=np.zeros((n_rows, n_max, t_max, n_res), dtype=np.int16),
        request=np.zeros((n_rows, n_max, n_res), dtype=np.int16),
        ec_label=np.zeros((n_rows, n_max), dtype=np.int64),
        n_jobs=np.zeros(n_rows, dtype=np.int64),
    )


def _fill(batch: dict, b: int, j: int, arrival, prof: np.ndarray, request, label) -> None:
    """Write job j of row b; prof is (duration, D) units."""
    if arrival is None or arrival < 0:
        raise ValueError(f"row {b} job {j}: arrival_step must be a non-negative integer, got {arrival}")
    if len(prof) < 1:
        raise ValueError(f"row {b} job {j}: empty usage profile (duration must be >= 1)")
    if label is None or label < 0:
        raise ValueError(f"row {b} job {j}: ec_label must be a non-negative integer, got {label}")
    if (prof < 0).any():
        raise ValueError(f"row {b} job {j}: negative usage units")
    batch["arrival_step"][b, j] = arrival
    batch["duration"][b, j] = len(prof)
    batch["usage"][b, j, : len(prof)] = prof
    batch["request"][b, j] = prof.max(axis=0) if request is None else np.asarray(request)
    batch["ec_label"][b, j] = label


def _profile_of_row(row: dict, key: tuple, j: int) -> np.ndarray:
    """(duration, 2) units from the cpu_units / mem_units lists of one table row."""
    dur = row["duration_steps"]
    cpu, mem = row["cpu_units"], row["mem_units"]
    if dur is None or cpu is None or mem is None:
        raise ValueError(f"sequence {key} job {j}: null duration_steps, cpu_units or mem_units")
    if not (len(cpu) == len(mem) == dur):
        raise ValueError(
            f"sequence {key} job {j} (workload {row['workload_id']}): duration_steps={dur} but "
            f"len(cpu_units)={len(cpu)}, len(mem_units)={len(mem)}"
        )
    if any(v is None for v in cpu) or any(v is None for v in mem):
        raise ValueError(f"sequence {key} job {j} (workload {row['workload_id']}): null usage units")
    return np.stack([np.asarray(cpu, dtype=np.int64), np.asarray(mem, dtype=np.int64)], axis=1)


def pad_job_batch(jobs: JobBatch, max_jobs: int, max_duration: int) -> JobBatch:
    """Re-pad a JobBatch to exactly (max_jobs, max_duration); ValueError if it has more jobs or longer ones."""
    if jobs.n_jobs.max(initial=0) > max_jobs or (jobs.duration.max(initial=0) > max_duration):
        raise ValueError(
            f"job batch with up to {int(jobs.n_jobs.max(initial=0))} jobs of up to "
            f"{int(jobs.duration.max(initial=0))} steps does not fit padding ({max_jobs}, {max_duration})"
        )
    jobs = _trim(jobs, max_jobs, max_duration)
    dj, dt = max_jobs - jobs.max_jobs, max_duration - jobs.max_duration
    return JobBatch(
        arrival_step=np.pad(jobs.arrival_step, ((0, 0), (0, dj)), constant_values=PAD_ARRIVAL),
        duration=np.pad(jobs.duration, ((0, 0), (0, dj))),
        usage=np.pad(jobs.usage, ((0, 0), (0, dj), (0, dt), (0, 0))),
        request=np.pad(jobs.request, ((0, 0), (0, dj), (0, 0))),
        ec_label=np.pad(jobs.ec_label, ((0, 0), (0, dj))),
        n_jobs=jobs.n_jobs,
        sequence_keys=jobs.sequence_keys,
        workload_ids=jobs.workload_ids,
        meta=None if jobs.meta is None else _padded_meta(jobs, max_jobs),
        usage_exact=None if jobs.usage_exact is None else _padded_exact(jobs, max_jobs, max_duration),
    )


def _trim(jobs: JobBatch, max_jobs: int, max_duration: int) -> JobBatch:
    """Drop padding beyond (max_jobs, max_duration) (callers checked only padding is dropped)."""
    return JobBatch(
        arrival_step=jobs.arrival_step[:, :max_jobs],
        duration=jobs.duration[:, :max_jobs],
        usage=jobs.usage[:, :max_jobs, :max_duration],
        request=jobs.request[:, :max_jobs],
        ec_label=jobs.ec_label[:, :max_jobs],
        n_jobs=jobs.n_jobs,
        sequence_keys=jobs.sequence_keys,
        workload_ids=jobs.workload_ids,
        meta=None if jobs.meta is None else jobs.meta[:, :max_jobs],
        usage_exact=None if jobs.usage_exact is None else jobs.usage_exact[:, :max_jobs, :max_duration],
    )


def superpose(jobs: JobBatch, k: int) -> JobBatch:
    """Each k consecutive sequences of `jobs` merged into one sequence: every real job of the k rows, in one
    arrival order (ties: the earlier row first, then the row's own order). Sequences are Poisson arrivals at a
    rate proportional to the cluster's size (`pipelines.job_sequences.arrival_rate_per_step`), so k of them
    superposed are sequences of a k-times larger cluster at the same offered load: what
    `models.forecast_placer.train_forecast_placer` validates the larger M on (`PlacerConfig.generalise_factor`)
    without drawing new workloads. The last B mod k sequences are left out; ValueError when B < k or k < 1."""
    if k < 1 or jobs.batch_size < k:
        raise ValueError(
            f"superpose: {jobs.batch_size} sequences cannot be merged {k} at a time (need k >= 1 and B >= k)"
        )
    n_out = jobs.batch_size // k
    groups = np.arange(n_out * k).reshape(n_out, k)
    n_jobs = jobs.n_jobs[groups].sum(axis=1)
    n_max = int(n_jobs.max(initial=0))
    t_max, d = jobs.max_duration, jobs.n_resources
    out = _empty(n_out, n_max, t_max, d)
    meta = None if jobs.meta is None else np.full((n_out, n_max, jobs.meta.shape[2]), np.nan)
    exact = None if jobs.usage_exact is None else np.full((n_out, n_max, t_max, d), np.nan, np.float32)
    keys, wids = [], []
    for g, rows in enumerate(groups):
        row = np.concatenate([np.full(int(jobs.n_jobs[r]), r) for r in rows])
        job = np.concatenate([np.arange(int(jobs.n_jobs[r])) for r in rows])
        order = np.lexsort((job, row, jobs.arrival_step[row, job]))
        row, job = row[order], job[order]
        n = row.size
        out["arrival_step"][g, :n] = jobs.arrival_step[row, job]
        out["duration"][g, :n] = jobs.duration[row, job]
        out["usage"][g, :n] = jobs.usage[row, job]
        out["request"][g, :n] = jobs.request[row, job]
        out["ec_label"][g, :n] = jobs.ec_label[row, job]
        out["n_jobs"][g] = n
        if meta is not None:
            meta[g, :n] = jobs.meta[row, job]
        if exact is not None:
            exact[g, :n] = jobs.usage_exact[row, job]
        if jobs.sequence_keys:
            first = tuple(jobs.sequence_keys[rows[0]])
            keys.append((*first[:-1], "+".join(str(jobs.sequence_keys[r][-1]) for r in rows)))
        if jobs.workload_ids:
            wids.append(tuple(jobs.workload_ids[r][j] for r, j in zip(row, job, strict=True)))
    return JobBatch(**out, sequence_keys=tuple(keys), workload_ids=tuple(wids), meta=meta, usage_exact=exact)
