"""Job sequences for the simulator (`sim__job_sequences`), cut from the long-running workloads.

TVW-RL "End-to-End Evaluation / Methodology": placement requests arrive as a Poisson process whose
rate is calibrated to an average cluster load of 30 %, 50 % or 80 % of M = 10 machines; half of the
jobs are long-running (> 30 h), about as many CPU-intensive as memory-intensive; 100 training and 30
test sequences per trace. Usage is mapped to the state space: 5-minute bins are averaged into
logical steps (`time_scale`) and machine fractions are quantised into units of C_d (`quantise_usage`).

Definitions used here (the paper leaves them open):

- A logical step is `step_bins` 5-minute bins (default 12: one hour), so "long-running (> 30 h)" is
  `duration_steps > long_threshold_steps` (default 30).
- Every workload kept by the long-running filter is far longer than 30 h, so a job is a window cut
  from one workload's kept run: long jobs last `long_duration_steps`, short ones `short_duration_steps`
  (both clipped to the workload's length), starting at a random offset.
- Usage is scaled before quantisation (TVW-RL: "quantized and scaled values ... ranged from 1-6
  units"): per source and resource, the `scale_quantile` of the per-workload peak maps to
  `target_peak_units` of C_d. Values above C_d after scaling are clipped and counted.
- A job's dominant resource is the one with the larger mean scaled usage over the workload's run.
- Cluster load of a sequence = mean over the arrival window [0, arrival_steps) of the total usage
  units of all arrived, unfinished jobs (as if each started on arrival) / (M * C_d), averaged over
  resources. Requests arrive as a Poisson process during the window; its rate is found per
  sequence by bisection so that this load equals the target, so the number of jobs per sequence
  grows with the load. Jobs are drawn as a stream mixed in short blocks (half long-running, cpu-
  and memory-dominant alternating), so the jobs that arrive keep the mix.
- Requests: `cpu_request_units` / `mem_request_units` are the job's peak quantised usage (TVW-RL
  feeds the peak to DeepRM as its resource limit; Tetris gets peaks too), or the trace request when
  `request_mode="trace"`.
- Meta information (TVW-RL Algorithm 1 classifies an incoming workload from it): `cpu_request_frac`,
  `mem_request_frac`, `priority`, `scheduling_class` are copied unscaled from the workload's
  LONG_RUNNING row (the values the EC classifier is trained on); null where the trace has none, and
  for synthetic sources.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from pipelines.schemas import BIN_SECONDS

JOB_SEQUENCES = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "split": pl.String,  # "train" | "test"
    "sequence_id": pl.Int32,  # 0-based within (source, load_pct, split)
    "job_index": pl.Int32,  # 0-based order of arrival within the sequence
    "arrival_step": pl.Int64,  # logical step at which the placement request arrives
    "workload_id": pl.String,
    "ec_label": pl.Int32,  # equivalence class 0..k-1 (0 = largest); unassigned workloads get 0 and are counted
    "duration_steps": pl.Int32,
    "cpu_units": pl.List(pl.Int16),  # usage per step, units of C_cpu; length duration_steps
    "mem_units": pl.List(pl.Int16),
    "cpu_request_units": pl.Int16,
    "mem_request_units": pl.Int16,
    "is_long_running": pl.Boolean,
    "cpu_request_frac": pl.Float64,  # workload meta, as in LONG_RUNNING (unscaled); null if unknown/synthetic
    "mem_request_frac": pl.Float64,
    "priority": pl.Int32,
    "scheduling_class": pl.Int32,
}
"""One row per job of a sequence: the simulator's input table."""

META_COLUMNS = ("cpu_request_frac", "mem_request_frac", "priority", "scheduling_class")
"""Workload meta columns of JOB_SEQUENCES (nullable; rows without them get nulls in `jobs_to_frame`)."""

INITIAL_STREAM_JOBS = 64
"""Jobs first drawn for a sequence; doubled while the target load is out of reach."""
MAX_STREAM_JOBS = 8192
"""Cap on a sequence's job stream; beyond it the sequence is counted as load-unreachable."""

QUANTISE_EPS = 1e-6
"""Slack for float noise in `ceil` quantisation: 0.25 * 8 computed as 2.0000001 stays 2 units."""


@dataclass(frozen=True)
class SequenceConfig:
    """How job sequences are cut, scaled, mixed and timed. Defaults: TVW-RL's evaluation setup."""

    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target average cluster loads (TVW-RL: 30 %, 50 %, 80 %)."""
    n_machines: int = 10
    """M: machines in the cluster (TVW-RL: 10)."""
    capacity_units: int = 8
    """C_d: units per machine per resource (TVW-RL: C_1 = C_2 = 8)."""
    step_bins: int = 12
    """5-minute bins per logical step (12: one-hour steps)."""
    step_how: str = "mean"
    """How bins are merged into a step: "mean" or "max"."""
    quantise_mode: str = "ceil"
    """"ceil": any non-zero usage takes >= 1 unit; "round": round half up."""
    arrival_steps: int = 80
    """Steps during which requests arrive; with long jobs up to 100 steps, most episodes end within
    TVW-RL's L = 200 steps. The number of jobs follows from the load."""
    long_fraction: float = 0.5
    """Share of long-running jobs (TVW-RL: 50 %)."""
    long_threshold_steps: int = 30
    """A job is long-running when it lasts more than this many steps (TVW-RL: > 30 h)."""
    long_duration_steps: tuple[int, int] = (31, 100)
    """Inclusive range of long-job durations, in steps."""
    short_duration_steps: tuple[int, int] = (2, 30)
    """Inclusive range of short-job durations, in steps."""
    n_train_sequences: int = 100
    """Training sequences per (source, load) (TVW-RL: 100)."""
    n_test_sequences: int = 30
    """Test sequences per (source, load) (TVW-RL: 30)."""
    test_workload_fraction: float = 0.3
    """Share of workloads reserved for test sequences; train and test never share a workload."""
    scale_quantile: float = 0.95
    """Quantile of per-workload peak usage that is mapped to `target_peak_units`."""
    target_peak_units: float = 6.0
    """Units that the `scale_quantile` peak maps to (TVW-RL: workloads span 1-6 units)."""
    usage_scale: tuple[float, float] | None = None
    """Fixed (cpu, mem) multipliers of `_frac` before quantisation; None: derive from the quantile."""
    request_mode: str = "peak"
    """"peak": request = peak quantised usage; "trace": the trace's request fraction, quantised."""
    seed: int = 0
    """Seed of every random draw."""
    load_tolerance: float = 0.005
    """Bisection stops when |realised load - target| is below this (fraction of the cluster)."""


@dataclass
class _Pool:
    """Time-scaled, scaled usage of the workloads of one source (fractions of C_d after scaling)."""

    workload_ids: list[str]
    cpu: list[np.ndarray]  # scaled fraction per step
    mem: list[np.ndarray]
    ec_label: np.ndarray  # int per workload
    is_cpu_dominant: np.ndarray  # bool per workload
    cpu_request_frac: np.ndarray  # scaled trace request
    mem_request_frac: np.ndarray
    length: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.length = np.array([len(c) for c in self.cpu], dtype=np.int64)


# --- pure per-series helpers -------------------------------------------------------------------


def quantise_usage(frac: Any, capacity_units: int = 8, mode: str = "ceil") -> np.ndarray:
    """Map usage as a fraction of one machine to integer units of C_d (int16, clipped to [0, C_d]).

    "ceil": units = ceil(frac * C_d - 1e-6), so any usage above float noise takes at least one unit
    and usage is never under-reported (a job at 0.13 of a machine takes 2 units of 8). "round":
    round half up, floor(frac * C_d + 0.5). Negative or NaN input is an error.
    """
    x = np.asarray(frac, dtype=np.float64)
    if np.isnan(x).any() or (x < 0).any():
        raise ValueError(f"quantise_usage: usage fractions must be >= 0 and not NaN; got min {np.nanmin(x)}")
    scaled = x * capacity_units
    if mode == "ceil":
        units = np.ceil(scaled - QUANTISE_EPS)
    elif mode == "round":
        units = np.floor(scaled + 0.5)
    else:
        raise ValueError(f"quantise_usage: unknown mode {mode!r} (expected 'ceil' or 'round')")
    return np.clip(units, 0, capacity_units).astype(np.int16)


def time_scale(values: Any, step_bins: int, how: str = "mean") -> np.ndarray:
    """Merge consecutive 5-minute bins into logical steps of `step_bins` bins (float64 per step).

    Non-overlapping groups from the first bin; "mean" averages a group, "max" keeps its peak. A last
    group with fewer than `step_bins` bins is dropped so that every step covers the same time.
    """
    if step_bins < 1:
        raise ValueError(f"time_scale: step_bins must be >= 1, got {step_bins}")
    x = np.asarray(values, dtype=np.float64)
    n_steps = len(x) // step_bins
    groups = x[: n_steps * step_bins].reshape(n_steps, step_bins)
    if how == "mean":
        return groups.mean(axis=1)
    if how == "max":
        return groups.max(axis=1)
    raise ValueError(f"time_scale: unknown how {how!r} (expected 'mean' or 'max')")


# --- load and arrivals -------------------------------------------------------------------------


def _cumulative_units(cpu: list[np.ndarray], mem: list[np.ndarray]) -> np.ndarray:
    """(n_jobs, max_len + 1) cumulative cpu + mem units per job; row j, column k = first k steps."""
    max_len = max((len(c) for c in cpu), default=0)
    out = np.zeros((len(cpu), max_len + 1), dtype=np.float64)
    for j, (c, m) in enumerate(zip(cpu, mem, strict=True)):
        cs = np.cumsum(np.asarray(c, dtype=np.float64) + np.asarray(m, dtype=np.float64))
        out[j, 1 : len(cs) + 1] = cs
        out[j, len(cs) + 1 :] = cs[-1] if len(cs) else 0.0
    return out


def _load_from_cumulative(
    arrivals: np.ndarray, cum: np.ndarray, n_machines: int, capacity_units: int, window: int
) -> float:
    """Mean load over [0, window) of the jobs of `cum` (rows) arriving at `arrivals`."""
    if len(arrivals) == 0:
        return 0.0
    k = np.clip(window - arrivals, 0, cum.shape[1] - 1)
    total = cum[np.arange(len(arrivals)), k].sum()
    return float(total / (2.0 * n_machines * capacity_units * window))


def realised_load(
    arrivals: np.ndarray,
    cpu: list[np.ndarray],
    mem: list[np.ndarray],
    n_machines: int,
    capacity_units: int,
    window_steps: int | None = None,
) -> float:
    """Mean cluster load over the arrival window [0, window_steps), jobs running from their arrival.

    `cpu`/`mem` are per-job usage series in units; load = total units / (M * C_d), averaged over the
    two resources and over the window's steps. `window_steps` defaults to the last arrival + 1.
    """
    arrivals = np.asarray(arrivals, dtype=np.int64)
    window = int(arrivals.max()) + 1 if window_steps is None else window_steps
    return _load_from_cumulative(arrivals, _cumulative_units(cpu, mem), n_machines, capacity_units, window)


def calibrate_arrivals(
    cpu: list[np.ndarray],
    mem: list[np.ndarray],
    load: float,
    window_steps: int,
    n_machines: int,
    capacity_units: int,
    rng: np.random.Generator,
    tolerance: float = 0.005,
) -> tuple[np.ndarray, float, bool]:
    """Poisson arrivals for a stream of jobs so that the mean load over [0, window_steps) is `load`.

    The jobs (in stream order) get unit-rate exponential gaps (the first arrives at step 0); at rate
    lambda job i arrives at floor(t_i / lambda), and the jobs arriving before `window_steps` form the
    sequence. The load grows with lambda, so lambda is found by bisection (on its log). Returns the
    arrival steps of the jobs taken (a prefix of the stream), lambda in jobs per step, and whether the
    stream was long enough (False when every job arrives inside the window: the caller draws a
    longer stream, since a Poisson process does not stop before the window ends).
    """
    n = len(cpu)
    cum = _cumulative_units(cpu, mem)
    t = np.cumsum(rng.exponential(1.0, n))
    t -= t[0]

    def taken(rate: float) -> np.ndarray:
        arr = np.floor(t / rate).astype(np.int64)
        return arr[arr < window_steps]

    def load_for(rate: float) -> float:
        arr = taken(rate)
        return _load_from_cumulative(arr, cum[: len(arr)], n_machines, capacity_units, window_steps)

    hi = max(t[-1], 1.0) / max(window_steps - 1, 1) * 2.0 + 1.0  # every job arrives inside the window
    if load_for(hi) < load:
        return taken(hi), hi, False
    lo, rate = 1e-9, hi
    for _ in range(100):
        rate = float(np.sqrt(lo * hi))
        got = load_for(rate)
        if abs(got - load) < tolerance or hi / lo < 1.0 + 1e-9:
            break
        lo, hi = (lo, rate) if got > load else (rate, hi)
    arrivals = taken(rate)
    # a Poisson stream goes on past the window: if every job fits inside it, the stream was too short
    return arrivals, rate, len(arrivals) < n


# --- workload pool -----------------------------------------------------------------------------


def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode())


def _step_frame(usage: pl.DataFrame, long_running: pl.DataFrame, cfg: SequenceConfig) -> pl.DataFrame:
    """Per workload, its kept run merged into logical steps: lists `cpu_frac`, `mem_frac` per workload."""
    step_s = BIN_SECONDS * cfg.step_bins
    agg = pl.mean if cfg.step_how == "mean" else pl.max
    windows = long_running.select(
        "source", "workload_id", "run_start_s", "n_run_bins", "cpu_request_frac", "mem_request_frac"
    )
    return (
        usage.join(windows, on=["source", "workload_id"], how="inner")
        .filter(
            (pl.col("bin_start_s") >= pl.col("run_start_s"))
            & (pl.col("bin_start_s") < pl.col("run_start_s") + pl.col("n_run_bins") * BIN_SECONDS)
        )
        .with_columns(step=(pl.col("bin_start_s") - pl.col("run_start_s")) // step_s)
        .group_by("source", "workload_id", "step")
        .agg(
            agg("cpu_frac").alias("cpu_frac"),
            agg("mem_frac").alias("mem_frac"),
            pl.len().alias("n_bins"),
            pl.first("cpu_request_frac"),
            pl.first("mem_request_frac"),
        )
        .filter(pl.col("n_bins") == cfg.step_bins)  # incomplete last step dropped (see time_scale)
        .sort("source", "workload_id", "step")
        .group_by("source", "workload_id", maintain_order=True)
        .agg("cpu_frac", "mem_frac", pl.first("cpu_request_frac"), pl.first("mem_request_frac"))
    )


def _usage_scale(steps: pl.DataFrame, cfg: SequenceConfig) -> tuple[float, float]:
    """(cpu, mem) multipliers so that the `scale_quantile` peak maps to `target_peak_units`."""
    if cfg.usage_scale is not None:
        return cfg.usage_scale
    out = []
    for col in ("cpu_frac", "mem_frac"):
        peaks = steps.select(pl.col(col).list.max()).to_series().to_numpy()
        q = float(np.quantile(peaks, cfg.scale_quantile)) if len(peaks) else 0.0
        out.append(cfg.target_peak_units / cfg.capacity_units / q if q > 0 else 1.0)
    return out[0], out[1]


def _build_pool(steps: pl.DataFrame, assignments: pl.DataFrame, scale: tuple[float, float]) -> _Pool:
    labels = dict(zip(assignments["workload_id"].to_list(), assignments["ec_label"].to_list(), strict=True))
    cpu = [np.asarray(v, dtype=np.float64) * scale[0] for v in steps["cpu_frac"].to_list()]
    mem = [np.asarray(v, dtype=np.float64) * scale[1] for v in steps["mem_frac"].to_list()]
    ids = steps["workload_id"].to_list()
    return _Pool(
        workload_ids=ids,
        cpu=cpu,
        mem=mem,
        ec_label=np.array([labels.get(w, 0) for w in ids], dtype=np.int32),
        is_cpu_dominant=np.array([c.mean() >= m.mean() for c, m in zip(cpu, mem, strict=True)], dtype=bool),
        cpu_request_frac=steps["cpu_request_frac"].fill_null(0.0).to_numpy() * scale[0],
        mem_request_frac=steps["mem_request_frac"].fill_null(0.0).to_numpy() * scale[1],
    )


def _subset(pool: _Pool, idx: np.ndarray) -> _Pool:
    return _Pool(
        workload_ids=[pool.workload_ids[i] for i in idx],
        cpu=[pool.cpu[i] for i in idx],
        mem=[pool.mem[i] for i in idx],
        ec_label=pool.ec_label[idx],
        is_cpu_dominant=pool.is_cpu_dominant[idx],
        cpu_request_frac=pool.cpu_request_frac[idx],
        mem_request_frac=pool.mem_request_frac[idx],
    )


# --- sampling ----------------------------------------------------------------------------------


def mix_pattern(n: int, long_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(is_long, is_cpu) flags of a stream of n jobs, balanced in short blocks so any prefix is mixed.

    Blocks of b jobs (the smallest multiple of 4 up to 40 whose long and short counts,
    b * long_fraction and the rest, are both even; else 20) hold round(b * long_fraction) long jobs;
    within the long and within the short ones cpu- and memory-dominant alternate (random start), so
    a block holds as many of each; each block is shuffled.
    """

    def is_even_split(k: int) -> bool:
        n_long = k * long_fraction
        return abs(n_long - round(n_long)) < 1e-9 and round(n_long) % 2 == 0 and (k - round(n_long)) % 2 == 0

    b = next((k for k in range(4, 41, 4) if is_even_split(k)), 20)
    n_long = int(round(b * long_fraction))
    is_long, is_cpu = [], []
    while len(is_long) < n:
        flags_long = np.array([True] * n_long + [False] * (b - n_long))
        start = rng.random(2) < 0.5
        flags_cpu = np.concatenate(
            [(np.arange(n_long) % 2 == 0) ^ start[0], (np.arange(b - n_long) % 2 == 0) ^ start[1]]
        )
        order = rng.permutation(b)
        is_long.extend(flags_long[order])
        is_cpu.extend(flags_cpu[order])
    return np.array(is_long[:n], dtype=bool), np.array(is_cpu[:n], dtype=bool)


class _StratumDraw:
    """Workloads of each (long, cpu) stratum without replacement, reshuffled when a stratum is used up."""

    def __init__(self, pool: _Pool, cfg: SequenceConfig, rng: np.random.Generator) -> None:
        self.rng = rng
        self.members: dict[tuple[bool, bool], tuple[np.ndarray, str]] = {}
        for is_long in (True, False):
            min_len = cfg.long_threshold_steps + 1 if is_long else cfg.short_duration_steps[0]
            eligible = pool.length >= min_len
            for is_cpu in (True, False):
                stratum, why = np.flatnonzero(eligible & (pool.is_cpu_dominant == is_cpu)), ""
                if len(stratum) == 0:
                    stratum, why = np.flatnonzero(eligible), "other_dominant"
                if len(stratum) == 0:
                    stratum, why = np.arange(len(pool.workload_ids)), "shorter_than_asked"
                self.members[(is_long, is_cpu)] = (stratum, why)
        self.queues: dict[tuple[bool, bool], list[int]] = {k: [] for k in self.members}

    def next(self, is_long: bool, is_cpu: bool) -> tuple[int, str]:
        """A workload index of the stratum and why it may not match it ("" when it does)."""
        stratum, why = self.members[(is_long, is_cpu)]
        queue = self.queues[(is_long, is_cpu)]
        if not queue:
            queue.extend(self.rng.permutation(stratum).tolist())
        return queue.pop(), why


def _cut_job(pool: _Pool, w: int, is_long: bool, cfg: SequenceConfig, rng: np.random.Generator) -> dict:
    """One job: a window of workload `w`, quantised."""
    lo, hi = cfg.long_duration_steps if is_long else cfg.short_duration_steps
    length = int(pool.length[w])
    dur = int(rng.integers(min(lo, length), min(hi, length) + 1))
    start = int(rng.integers(0, length - dur + 1))
    cpu_f, mem_f = pool.cpu[w][start : start + dur], pool.mem[w][start : start + dur]
    n_clipped = int((cpu_f * cfg.capacity_units > cfg.capacity_units + QUANTISE_EPS).sum())
    n_clipped += int((mem_f * cfg.capacity_units > cfg.capacity_units + QUANTISE_EPS).sum())
    cpu = quantise_usage(cpu_f, cfg.capacity_units, cfg.quantise_mode)
    mem = quantise_usage(mem_f, cfg.capacity_units, cfg.quantise_mode)
    if cfg.request_mode == "peak":
        req = int(cpu.max()), int(mem.max())
    else:
        req_c = quantise_usage(min(pool.cpu_request_frac[w], 1.0), cfg.capacity_units, cfg.quantise_mode)
        req_m = quantise_usage(min(pool.mem_request_frac[w], 1.0), cfg.capacity_units, cfg.quantise_mode)
        req = int(req_c), int(req_m)
    return {
        "workload_id": pool.workload_ids[w],
        "ec_label": int(pool.ec_label[w]),
        "duration_steps": dur,
        "cpu_units": cpu,
        "mem_units": mem,
        "cpu_request_units": req[0],
        "mem_request_units": req[1],
        "is_long_running": dur > cfg.long_threshold_steps,
        "_n_clipped": n_clipped,
    }


def draw_job_stream(
    pool: _Pool, n: int, cfg: SequenceConfig, rng: np.random.Generator, draw: _StratumDraw | None = None
) -> list[dict]:
    """A stream of n jobs cut from `pool` with `cfg`'s long/short and cpu/mem mix (see `mix_pattern`)."""
    draw = draw or _StratumDraw(pool, cfg, rng)
    jobs = []
    for is_long, is_cpu in zip(*mix_pattern(n, cfg.long_fraction, rng), strict=True):
        w, why = draw.next(bool(is_long), bool(is_cpu))
        jobs.append({**_cut_job(pool, w, bool(is_long), cfg, rng), "_mismatch": why})
    return jobs


def arrange_sequence(
    draw_jobs: Callable[[int], list[dict]],
    load_pct: int,
    cfg: SequenceConfig,
    rng: np.random.Generator,
    stats: dict,
) -> list[dict]:
    """One sequence: jobs from `draw_jobs(n)` (a stream, extended on demand) with Poisson arrivals
    calibrated to `load_pct` over `cfg.arrival_steps`; in arrival order with `job_index`.

    Counts into `stats`: sequences whose load was unreachable even with MAX_STREAM_JOBS jobs,
    jobs that repeat a workload already in the sequence, jobs off their stratum, clipped jobs.
    """
    jobs: list[dict] = []
    n_more = INITIAL_STREAM_JOBS
    while True:
        jobs.extend(draw_jobs(n_more))
        arrivals, rate, ok = calibrate_arrivals(
            [j["cpu_units"] for j in jobs],
            [j["mem_units"] for j in jobs],
            load_pct / 100.0,
            cfg.arrival_steps,
            cfg.n_machines,
            cfg.capacity_units,
            rng,
            cfg.load_tolerance,
        )
        if ok or len(jobs) >= MAX_STREAM_JOBS:
            break
        n_more = len(jobs)
    taken = jobs[: len(arrivals)]
    wids = [j["workload_id"] for j in taken]
    stats["n_sequences_load_unreachable"] += int(not ok)
    stats["n_jobs"] += len(taken)
    stats["n_jobs_repeated_workload"] += len(wids) - len(set(wids))
    stats["n_jobs_clipped"] += sum(j.get("_n_clipped", 0) > 0 for j in taken)
    stats["n_step_values_clipped"] += sum(j.get("_n_clipped", 0) for j in taken)
    for why in ("other_dominant", "shorter_than_asked"):
        stats[f"n_jobs_{why}"] += sum(j.get("_mismatch") == why for j in taken)
    stats.setdefault("arrival_rate_per_step", {}).setdefault(load_pct, []).append(rate)
    return [
        {**j, "job_index": i, "arrival_step": int(a)}
        for i, (j, a) in enumerate(zip(taken, arrivals, strict=True))
    ]


def _new_stats() -> dict[str, Any]:
    return {
        "n_workloads_in": 0,
        "n_workloads_without_steps": 0,
        "n_workloads_train": 0,
        "n_workloads_test": 0,
        "n_workloads_clipped": 0,
        "n_jobs": 0,
        "n_jobs_clipped": 0,
        "n_step_values_clipped": 0,
        "n_jobs_repeated_workload": 0,
        "n_jobs_other_dominant": 0,
        "n_jobs_shorter_than_asked": 0,
        "n_sequences_load_unreachable": 0,
        "usage_scale": {},
    }


def _split_pool(pool: _Pool, cfg: SequenceConfig, rng: np.random.Generator) -> dict[str, _Pool]:
    """Disjoint train/test workload pools (the split happens before any sampling)."""
    n = len(pool.workload_ids)
    if n < 2:
        raise ValueError(f"job sequences need at least 2 long-running workloads (train and test); got {n}")
    order = rng.permutation(n)
    n_test = min(n - 1, max(1, int(round(n * cfg.test_workload_fraction))))
    return {"train": _subset(pool, np.sort(order[n_test:])), "test": _subset(pool, np.sort(order[:n_test]))}


def _sequences_for_source(source: str, pool: _Pool, cfg: SequenceConfig, stats: dict) -> list[dict]:
    rows: list[dict] = []
    splits = _split_pool(pool, cfg, np.random.default_rng([cfg.seed, _stable_int(source)]))
    stats["n_workloads_train"] += len(splits["train"].workload_ids)
    stats["n_workloads_test"] += len(splits["test"].workload_ids)
    for load in cfg.loads_pct:
        for split, n_seq in (("train", cfg.n_train_sequences), ("test", cfg.n_test_sequences)):
            rng = np.random.default_rng([cfg.seed, _stable_int(source), load, _stable_int(split)])
            for seq in range(n_seq):
                draw = _StratumDraw(splits[split], cfg, rng)
                stream = partial(draw_job_stream, splits[split], cfg=cfg, rng=rng, draw=draw)
                for job in arrange_sequence(stream, load, cfg, rng, stats):
                    rows.append(
                        {"source": source, "load_pct": load, "split": split, "sequence_id": seq, **job}
                    )
    return rows


def jobs_to_frame(rows: list[dict]) -> pl.DataFrame:
    """Rows (dicts with the JOB_SEQUENCES keys; unit series as arrays; the META_COLUMNS keys optional,
    null when absent) -> the typed table."""
    if not rows:
        return pl.DataFrame(schema=JOB_SEQUENCES)
    cols = {c: [r.get(c) if c in META_COLUMNS else r[c] for r in rows] for c in JOB_SEQUENCES}
    cols["cpu_units"] = [np.asarray(v, dtype=np.int16).tolist() for v in cols["cpu_units"]]
    cols["mem_units"] = [np.asarray(v, dtype=np.int16).tolist() for v in cols["mem_units"]]
    return pl.DataFrame(cols, schema=JOB_SEQUENCES).sort(
        "source", "load_pct", "split", "sequence_id", "job_index"
    )


def build_job_sequences(
    usage: pl.DataFrame, long_running: pl.DataFrame, assignments: pl.DataFrame | None, cfg: SequenceConfig
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Train/test job sequences (`JOB_SEQUENCES`) from the long-running workloads' kept runs.

    `usage`: USAGE rows; `long_running`: LONG_RUNNING rows (the run window of each workload);
    `assignments`: (workload_id, ec_label), a workload absent from it gets label 0. Returns the
    table and a stats dict (workloads in / per split / clipped, jobs drawn with replacement or from
    the other dominant resource, sequences whose load was unreachable, usage scale, arrival rates).
    """
    if cfg.step_how not in ("mean", "max") or cfg.request_mode not in ("peak", "trace"):
        raise ValueError(
            f"SequenceConfig: bad step_how {cfg.step_how!r} or request_mode {cfg.request_mode!r}"
        )
    if assignments is None:
        assignments = pl.DataFrame(schema={"workload_id": pl.String, "ec_label": pl.Int32})
    stats = _new_stats()
    stats["n_workloads_in"] = long_running.height
    rows: list[dict] = []
    for source in sorted(long_running["source"].unique().to_list()):
        steps = _step_frame(
            usage.filter(pl.col("source") == source), long_running.filter(pl.col("source") == source), cfg
        )
        stats["n_workloads_without_steps"] += (
            long_running.filter(pl.col("source") == source).height - steps.height
        )
        if steps.height == 0:
            raise ValueError(f"source {source!r}: no long-running workload has a complete step of usage")
        scale = _usage_scale(steps, cfg)
        stats["usage_scale"][source] = scale
        pool = _build_pool(steps, assignments, scale)
        n_unassigned = sum(w not in set(assignments["workload_id"].to_list()) for w in pool.workload_ids)
        stats.setdefault("n_workloads_without_ec_label", {})[source] = n_unassigned
        cap = 1.0 + QUANTISE_EPS / cfg.capacity_units
        stats["n_workloads_clipped"] += sum(
            int(c.max() > cap or m.max() > cap) for c, m in zip(pool.cpu, pool.mem, strict=True)
        )
        rows.extend(_sequences_for_source(source, pool, cfg, stats))
    rates = stats.pop("arrival_rate_per_step", {})
    stats["mean_arrival_rate_per_step"] = {
        k: float(np.mean([r for r in v if np.isfinite(r)] or [np.inf])) for k, v in rates.items()
    }
    return attach_meta(jobs_to_frame(rows), long_running, stats), stats


def attach_meta(jobs: pl.DataFrame, long_running: pl.DataFrame, stats: dict[str, Any]) -> pl.DataFrame:
    """`jobs` (JOB_SEQUENCES) with META_COLUMNS taken from the workloads' LONG_RUNNING rows by (source,
    workload_id). A meta column absent from `long_running` stays null and is listed in
    stats["meta_columns_missing"]; stats["n_jobs_without_meta"] counts jobs whose meta is all null. Raises
    ValueError naming the workload when LONG_RUNNING holds two rows for it."""
    present = [c for c in META_COLUMNS if c in long_running.columns]
    stats["meta_columns_missing"] = [c for c in META_COLUMNS if c not in present]
    meta = long_running.select("source", "workload_id", *[pl.col(c).cast(JOB_SEQUENCES[c]) for c in present])
    dup = meta.filter(pl.struct("source", "workload_id").is_duplicated())
    if dup.height:
        raise ValueError(
            f"long_running holds {dup.height} rows for duplicated workloads, e.g. "
            f"{dup.row(0, named=True)['source']}/{dup.row(0, named=True)['workload_id']}"
        )
    out = (
        jobs.drop(present)
        .join(meta, on=["source", "workload_id"], how="left")
        .select(list(JOB_SEQUENCES))
        .sort("source", "load_pct", "split", "sequence_id", "job_index")
    )
    stats["n_jobs_without_meta"] = out.filter(
        pl.all_horizontal(pl.col(c).is_null() for c in META_COLUMNS)
    ).height
    return out
