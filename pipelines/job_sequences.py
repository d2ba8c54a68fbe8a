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
- A workload larger than one machine (trace request or a 5-minute usage bin above 1.0; e.g. a VM
  provisioned with 511.5 GiB, or a whole Google job summed over its tasks) is named and, by default,
  set aside before the scale is derived (`SequenceConfig.oversized_rule`).
- A job's dominant resource is the one with the larger mean scaled usage over the workload's run.
- Load (TVW-RL: "the interarrival-rate is calibrated to create three average cluster load
  scenarios"): the offered load of resource d is arrival rate x mean job work_d / (M * C_d), where a
  job's work_d is the sum over its steps of its usage units of d. The arrival rate of a (source,
  load, split) is computed from the split's expected job work (`expected_job_work`, exact over the
  draw below, no fitting per sequence; `rate_split="train"` uses the training split's for both);
  `load_resource` says which figure the label calibrates ("dominant", the default: the resource
  with the larger expected work, so no resource is offered more than the label; or "mean" of the
  resources). Arrivals are
  a Poisson process over [0, arrival_steps) (Poisson counts per step, several per step possible);
  the window is long against the longest job, so the cluster spends most of it in steady state
  rather than filling up. `offered_load_table` measures the realised offered load of every
  sequence from its jobs alone.
- Jobs are drawn as a stream mixed in short blocks (half long-running, cpu- and memory-dominant
  alternating), so the jobs that arrive keep the mix.
- Train and test sequences never share a workload; each split gets at least
  `min_workloads_per_split` workloads when the source has enough, and `split_workload_counts`
  says how many distinct workloads each split's sequences use.
- Requests: `cpu_request_units` / `mem_request_units` are the job's peak quantised usage (TVW-RL
  feeds the peak to DeepRM as its resource limit; Tetris gets peaks too), or the trace request when
  `request_mode="trace"`.
- Meta information (TVW-RL Algorithm 1 classifies an incoming workload from it): `cpu_request_frac`,
  `mem_request_frac`, `priority`, `scheduling_class` are copied unscaled from the workload's
  LONG_RUNNING row (the values the EC classifier is trained on); null where the trace has none, and
  for synthetic sources.
- Unquantised usage: `cpu_units_exact` / `mem_units_exact` keep each step's scaled mean before
  `quantise_usage` (float units of C_d, clipped to [0, C_d] like the units; `EXACT_USAGE_COLUMNS`), so the EC
  labeller can read usage finer than one unit. The simulator never reads them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from pipelines.progress import Progress
from pipelines.schemas import BIN_SECONDS
from pipelines.workloads import WORKLOAD_GROUP_PATTERN, workload_groups

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
    # usage per step BEFORE quantisation, float units of C_d (quantised, it gives the units); null if not kept
    "cpu_units_exact": pl.List(pl.Float32),
    "mem_units_exact": pl.List(pl.Float32),
}
"""One row per job of a sequence: the simulator's input table."""

META_COLUMNS = ("cpu_request_frac", "mem_request_frac", "priority", "scheduling_class")
"""Workload meta columns of JOB_SEQUENCES (nullable; rows without them get nulls in `jobs_to_frame`)."""

EXACT_USAGE_COLUMNS = ("cpu_units_exact", "mem_units_exact")
"""Optional columns of JOB_SEQUENCES with each job's usage per step before quantisation, in the same units as
`cpu_units` / `mem_units` (the step means of the scaled usage x C_d, clipped to [0, C_d] as the units are; float32),
so `quantise_usage(exact / C_d, C_d, quantise_mode)` gives the units back (DeepRM's `sample_units` rounds them at
random instead). Only the EC labeller reads them (`JobBatch.usage_exact`), never the simulator's step logic.
Null when a builder keeps none (a rows dict without them in `jobs_to_frame`); frames written before they existed
lack them and still load (`sim.jobs.JobBatch.from_frame`)."""


SEQUENCE_KEY = ("source", "load_pct", "split", "sequence_id")
"""Columns of JOB_SEQUENCES that identify one sequence."""

OFFERED_LOAD = {
    "source": pl.String,
    "load_pct": pl.Int32,  # the label the sequence was generated for
    "split": pl.String,
    "sequence_id": pl.Int32,
    "n_jobs": pl.Int32,
    "n_distinct_workloads": pl.Int32,
    "n_machines": pl.Int32,  # M of the cluster the load refers to
    "capacity_units": pl.Int32,  # C_d per machine and resource
    "window_steps": pl.Int32,  # arrival window the load is spread over
    "n_jobs_after_window": pl.Int32,  # jobs arriving at or after window_steps (counted in the work all the same)
    "last_arrival_step": pl.Int64,
    "work_cpu_unit_steps": pl.Int64,  # sum over jobs and steps of cpu_units
    "work_mem_unit_steps": pl.Int64,
    "offered_load_cpu": pl.Float64,  # work_cpu_unit_steps / (M * C_d * window_steps)
    "offered_load_mem": pl.Float64,
    "offered_load_mean": pl.Float64,  # mean of the two resources
    "dominant_resource": pl.String,  # the source's resource with the larger total work over its sequences here
    "offered_load_dominant": pl.Float64,  # offered load of dominant_resource
    "peak_demand_cpu": pl.Float64,  # max over steps of the cpu units of the jobs running as if started on arrival / (M * C_d)
    "peak_demand_mem": pl.Float64,
    "peak_demand_dominant": pl.Float64,  # max of the two
}
"""One row per job sequence: its realised offered load, measured from its jobs alone (`offered_load_table`)."""

QUANTISE_EPS = 1e-6
"""Slack for float noise in `ceil` quantisation: 0.25 * 8 computed as 2.0000001 stays 2 units."""
LOAD_RESOURCES = ("dominant", "mean")
"""What a load label calibrates: the offered load of the resource with the larger expected job work, or
the mean over resources."""
RATE_SPLITS = ("own", "train")
"""Whose expected job work sets a split's arrival rate (see `SequenceConfig.rate_split`)."""
OVERSIZED_RULES = ("drop", "cap", "keep")
"""What happens to a workload larger than one machine (see `SequenceConfig.oversized_rule`)."""
MAX_EMPTY_REDRAWS = 1000
"""Redraws of a sequence's Poisson arrivals when none fell in the window, before it is an error."""


@dataclass(frozen=True)
class SequenceConfig:
    """How job sequences are cut, scaled, mixed and timed. Defaults: TVW-RL's evaluation setup."""

    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target average cluster loads (TVW-RL: 30 %, 50 %, 80 %): offered load in % of the cluster, see
    `load_resource`."""
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
    arrival_steps: int = 300
    """Steps during which requests arrive (Poisson), 3x the longest job (`long_duration_steps`), so the
    cluster is in steady state for most of the window rather than filling up from empty. Episodes run
    until the last job finishes: about arrival_steps + the longest job. The number of jobs follows from
    the load."""
    load_resource: str = "dominant"
    """What a load label calibrates: "dominant" (the offered load of the resource with the larger
    expected job work of the training split equals the label; the other resource gets less) or "mean"
    (the mean over the two resources equals the label)."""
    rate_split: str = "own"
    """Whose expected job work sets a split's arrival rate: "own" (each split's own workloads: one rate
    per (source, load, split), so test sequences, the ones evaluated, offer the label too) or "train"
    (one rate per (source, load) from the training split; test sequences then offer the label times
    their workloads' work ratio, e.g. 0.67-0.76 on the sample's two Alibaba test workloads)."""
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
    """Share of workloads reserved for test sequences; train and test never share a workload, nor a workload
    group (`workload_group_pattern`)."""
    workload_group_pattern: str = WORKLOAD_GROUP_PATTERN
    """Regex whose first group names the longer workload a window comes from (the derived Google job-days
    '<job>_d<k>'): the days of one job all go to test, to the fit part or to validation, so that no test
    workload is a day of a job trained on (until 2026-11-27 the split was by job-day: 111 of the sample's 151
    Google jobs had days on both sides). An id that does not match is its own group."""
    validation_share: float = 0.3
    """Share of the training sequences (the last `n_validation_sequences` of each load) and of the training
    workloads held out as validation: those sequences are cut from the held-out workloads only, the other
    training sequences from the rest, so a rule or forecaster fitted on the fit sequences is validated on
    workloads it never saw (`sim.tuning.split_validation` takes the same last sequences). When the training
    split cannot give both parts `min_workloads_per_split` workloads, validation sequences share them (counted in
    stats["validation_workloads"] as 0); 0 = no validation sequences of their own. The held-out workloads are
    drawn per dominant resource, and validation sequences calibrate the training split's load resource, so the
    split's offered load stays at its label."""
    min_workloads_per_split: int = 5
    """Each split gets at least this many workloads when the source has twice as many (else the
    workloads are halved, the test split taking the smaller half, at least one); a split below it is
    listed in stats["splits_with_few_workloads"]. One workload would make every FIFO policy's test
    numbers equal. Same default as the `sim__job_sequences` check's `min_split_workloads`."""
    scale_quantile: float = 0.95
    """Quantile of per-workload peak usage that is mapped to `target_peak_units`."""
    target_peak_units: float = 6.0
    """Units that the `scale_quantile` peak maps to (TVW-RL: workloads span 1-6 units)."""
    usage_scale: tuple[float, float] | None = None
    """Fixed (cpu, mem) multipliers of `_frac` before quantisation; None: derive from the quantile."""
    request_mode: str = "peak"
    """"peak": request = peak quantised usage; "trace": the trace's request fraction, quantised."""
    oversized_rule: str = "drop"
    """What happens to a workload larger than one machine: its trace request (`cpu_request_frac` or
    `mem_request_frac`) or any 5-minute usage bin of its kept run above 1.0 of a machine (e.g. a Bitbrains VM
    provisioned with 511.5 GiB). Every such workload is counted (stats["n_workloads_oversized"]) and named
    (stats["oversized_workloads"]), whatever the rule. "drop": it is set aside before the usage scale is
    derived and feeds no sequence (stats["n_workloads_set_aside"]; workloads in = workloads split into train and
    test + without a complete step + set aside). "cap": its usage bins and requests are clipped to one machine
    before the steps are formed, and it is kept. "keep": taken as it is (scaled with its source, step values
    above C_d clipped and counted as `n_workloads_clipped`)."""
    seed: int = 0
    """Seed of every random draw."""


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


def exact_units(frac: Any, capacity_units: int = 8) -> np.ndarray:
    """Usage as a fraction of one machine -> float32 units of C_d before quantisation: frac x C_d clipped to
    [0, C_d] as `quantise_usage` clips (the `EXACT_USAGE_COLUMNS` values)."""
    x = np.asarray(frac, dtype=np.float64)
    return np.clip(x * capacity_units, 0.0, capacity_units).astype(np.float32)


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


def realised_load(
    arrivals: np.ndarray,
    cpu: list[np.ndarray],
    mem: list[np.ndarray],
    n_machines: int,
    capacity_units: int,
    window_steps: int | None = None,
) -> float:
    """Mean cluster demand over [0, window_steps) of jobs running from their arrival, as a fraction of
    the cluster (mean of the two resources): what the cluster holds in the window, ramp-up from empty
    included. Not the load label (that is the offered load, see `offered_load_table`); it approaches
    the offered load only when the window is long against the jobs. `window_steps` defaults to the
    last arrival + 1."""
    arrivals = np.asarray(arrivals, dtype=np.int64)
    if len(arrivals) == 0:
        return 0.0
    window = int(arrivals.max()) + 1 if window_steps is None else window_steps
    total = 0.0
    for a, c, m in zip(arrivals, cpu, mem, strict=True):
        k = int(np.clip(window - a, 0, None))
        total += float(np.sum(c[:k], dtype=np.float64) + np.sum(m[:k], dtype=np.float64))
    return total / (2.0 * n_machines * capacity_units * window)


def expected_window_work(units: Any, durations: tuple[int, int]) -> float:
    """Expected sum of `units` over a window cut as `_cut_job` cuts one: integer length d uniform in
    [lo, hi] (both clipped to the series length), start uniform in [0, len - d]."""
    x = np.asarray(units, dtype=np.float64)
    n = len(x)
    if n == 0:
        return 0.0
    lo, hi = min(durations[0], n), min(durations[1], n)
    cs = np.concatenate([[0.0], np.cumsum(x)])  # cs[k]: sum of the first k steps
    ccs = np.concatenate([[0.0], np.cumsum(cs)])  # ccs[k]: sum of cs[:k]
    d = np.arange(lo, hi + 1)
    n_starts = n - d + 1
    # sum over starts s in [0, n-d] of cs[s+d] - cs[s] = (ccs[n+1] - ccs[d]) - ccs[n-d+1]
    window_sums = (ccs[n + 1] - ccs[d]) - ccs[n_starts]
    return float(np.mean(window_sums / n_starts))


def expected_job_work(pool: _Pool, cfg: SequenceConfig) -> np.ndarray:
    """(cpu, mem) expected work in unit-steps of one job of `draw_job_stream` from `pool`: each
    (long, cpu-dominant) stratum with its share of the mix, a workload uniform in the stratum, its
    duration and offset uniform (`expected_window_work`), usage quantised as in `_cut_job`. Exact,
    not sampled."""
    b, n_long = _mix_block(cfg.long_fraction)
    out = np.zeros(2)
    series = [
        [quantise_usage(s, cfg.capacity_units, cfg.quantise_mode) for s in pool.cpu],
        [quantise_usage(s, cfg.capacity_units, cfg.quantise_mode) for s in pool.mem],
    ]
    for (is_long, _is_cpu), (members, _) in stratum_members(pool, cfg).items():
        weight = 0.5 * (n_long if is_long else b - n_long) / b  # half of each length class is cpu-dominant
        durations = cfg.long_duration_steps if is_long else cfg.short_duration_steps
        for r in range(2):
            out[r] += weight * np.mean([expected_window_work(series[r][w], durations) for w in members])
    return out


def arrival_rate_per_step(
    load_pct: float, mean_work: Any, n_machines: int, capacity_units: int, load_resource: str = "dominant"
) -> float:
    """Poisson arrival rate (jobs per step) that offers `load_pct` % of the cluster: rate x mean job
    work / (M * C_d) = load. `mean_work`: expected (cpu, mem) unit-steps per job; `load_resource`:
    "dominant" calibrates the resource with the larger work, "mean" their mean."""
    work = np.asarray(mean_work, dtype=np.float64)
    if load_resource not in LOAD_RESOURCES:
        raise ValueError(f"load_resource must be one of {LOAD_RESOURCES}, got {load_resource!r}")
    per_job = float(work.max() if load_resource == "dominant" else work.mean())
    if not per_job > 0:
        raise ValueError(f"arrival_rate_per_step: mean job work must be > 0, got {work.tolist()}")
    return load_pct / 100.0 * n_machines * capacity_units / per_job


def part_arrival_rate(load_pct: float, work: Mapping[str, Any], part: str, cfg: Any) -> float:
    """The arrival rate of one part's sequences ("train", "validation" or "test"; `work`: expected (cpu, mem)
    work per job of each part's pool). `cfg.rate_split` "own": from the part's own work, where validation
    sequences calibrate the resource the "train" part's label calibrates (so the training split, both parts
    together, offers the label in the resource its check measures); "train": the training part's rate."""
    mean_work = np.asarray(work[part if cfg.rate_split == "own" else "train"], dtype=np.float64)
    if part == "validation" and cfg.rate_split == "own" and cfg.load_resource == "dominant":
        # the train part's dominant resource: the other one is masked out of the max
        mean_work = np.where(np.arange(len(mean_work)) == int(np.argmax(work["train"])), mean_work, 0.0)
    return arrival_rate_per_step(load_pct, mean_work, cfg.n_machines, cfg.capacity_units, cfg.load_resource)


def poisson_arrivals(rate_per_step: float, window_steps: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted arrival steps of a Poisson process of `rate_per_step` over [0, window_steps): a Poisson
    count per step (several requests may arrive in one step)."""
    counts = rng.poisson(rate_per_step, window_steps)
    return np.repeat(np.arange(window_steps, dtype=np.int64), counts)


def _per_source(value: int | Mapping[str, int], source: str, name: str) -> int:
    if isinstance(value, Mapping):
        if source not in value:
            raise ValueError(f"offered_load_table: no {name} given for source {source!r}")
        return int(value[source])
    return int(value)


def offered_load_table(
    jobs: pl.DataFrame,
    n_machines: int | Mapping[str, int],
    capacity_units: int,
    window_steps: int | Mapping[str, int],
) -> pl.DataFrame:
    """Realised offered load of every sequence of `jobs` (JOB_SEQUENCES rows), from its jobs alone:
    per resource, the total work (sum of usage units over every job and step) / (M * C_d *
    window_steps), i.e. arrival rate x mean job work / capacity; the mean over the two resources; the
    dominant resource's (per source, the one with the larger total work over the source's sequences
    in `jobs`); and the peak demand of jobs running as if started on arrival, as a fraction of the
    cluster. `n_machines` and `window_steps` are one value or one per source (a source missing from the
    mapping is an error). Returns OFFERED_LOAD rows sorted by sequence."""
    missing = [
        c
        for c in (*SEQUENCE_KEY, "arrival_step", "workload_id", "cpu_units", "mem_units")
        if c not in jobs.columns
    ]
    if missing:
        raise ValueError(f"offered_load_table: job frame lacks columns {missing}")
    if jobs.height == 0:
        return pl.DataFrame(schema=OFFERED_LOAD)
    key = list(SEQUENCE_KEY)
    sources = sorted(jobs["source"].unique().to_list())
    params = pl.DataFrame(
        {
            "source": sources,
            "n_machines": [_per_source(n_machines, s, "n_machines") for s in sources],
            "window_steps": [_per_source(window_steps, s, "window_steps") for s in sources],
        },
        schema={"source": pl.String, "n_machines": pl.Int32, "window_steps": pl.Int32},
    )
    jobs = jobs.select(*key, "arrival_step", "workload_id", "cpu_units", "mem_units").join(
        params, on="source", how="left"
    )
    per_seq = jobs.group_by(key).agg(
        pl.len().alias("n_jobs"),
        pl.col("workload_id").n_unique().alias("n_distinct_workloads"),
        pl.first("n_machines", "window_steps"),
        (pl.col("arrival_step") >= pl.col("window_steps")).sum().alias("n_jobs_after_window"),
        pl.col("arrival_step").max().alias("last_arrival_step"),
        pl.col("cpu_units").list.sum().cast(pl.Int64).sum().alias("work_cpu_unit_steps"),
        pl.col("mem_units").list.sum().cast(pl.Int64).sum().alias("work_mem_unit_steps"),
    )
    dominant = per_seq.group_by("source").agg(
        pl.when(pl.col("work_cpu_unit_steps").sum() >= pl.col("work_mem_unit_steps").sum())
        .then(pl.lit("cpu"))
        .otherwise(pl.lit("mem"))
        .alias("dominant_resource")
    )
    peaks = (
        jobs.with_columns(pl.int_ranges(0, pl.col("cpu_units").list.len()).alias("offset"))
        .explode("cpu_units", "mem_units", "offset")
        .group_by(*key, pl.col("arrival_step") + pl.col("offset"))
        .agg(pl.col("cpu_units").cast(pl.Int64).sum(), pl.col("mem_units").cast(pl.Int64).sum())
        .group_by(key)
        .agg(pl.col("cpu_units").max().alias("peak_cpu"), pl.col("mem_units").max().alias("peak_mem"))
    )
    cluster = pl.col("n_machines") * capacity_units
    per_step = cluster * pl.col("window_steps")
    out = (
        per_seq.join(dominant, on="source")
        .join(peaks, on=key, how="left")
        .with_columns(
            pl.lit(capacity_units).alias("capacity_units"),
            (pl.col("work_cpu_unit_steps") / per_step).alias("offered_load_cpu"),
            (pl.col("work_mem_unit_steps") / per_step).alias("offered_load_mem"),
            (pl.col("peak_cpu").fill_null(0) / cluster).alias("peak_demand_cpu"),
            (pl.col("peak_mem").fill_null(0) / cluster).alias("peak_demand_mem"),
        )
        .with_columns(
            ((pl.col("offered_load_cpu") + pl.col("offered_load_mem")) / 2).alias("offered_load_mean"),
            pl.when(pl.col("dominant_resource") == "cpu")
            .then(pl.col("offered_load_cpu"))
            .otherwise(pl.col("offered_load_mem"))
            .alias("offered_load_dominant"),
            pl.max_horizontal("peak_demand_cpu", "peak_demand_mem").alias("peak_demand_dominant"),
        )
    )
    return out.select([pl.col(c).cast(t) for c, t in OFFERED_LOAD.items()]).sort(key)


def offered_load_check(
    table: pl.DataFrame, tolerance: float = 0.1, figure: str = "offered_load_dominant", by_split: bool = False
) -> pl.DataFrame:
    """Per (source, load_pct) (and split when `by_split`) of an OFFERED_LOAD table: the number of
    sequences, the mean of `figure` and its standard error over sequences (Poisson arrivals make each
    sequence's load vary, more so with few jobs per sequence), the mean-of-resources load, the mean
    peak demand, the ratio of the mean `figure` to the label and `is_within_tolerance` (|ratio - 1| <=
    tolerance)."""
    by = ["source", "load_pct", *(["split"] if by_split else [])]
    return (
        table.group_by(by)
        .agg(
            pl.len().alias("n_sequences"),
            pl.col(figure).mean().alias("mean_offered_load"),
            (pl.col(figure).std() / pl.len().sqrt()).alias("sem_offered_load"),
            pl.col("offered_load_mean").mean().alias("mean_offered_load_mean"),
            pl.col("peak_demand_dominant").mean().alias("mean_peak_demand_dominant"),
        )
        .with_columns((pl.col("mean_offered_load") / (pl.col("load_pct") / 100.0)).alias("ratio_to_label"))
        .with_columns(((pl.col("ratio_to_label") - 1).abs() <= tolerance).alias("is_within_tolerance"))
        .sort(by)
    )


OFFERED_LOAD_CHECK_DOCS = {
    "offered_load_near_label": "Every sequence offers a finite positive load, and per (source, load) the mean "
    "dominant-resource offered load is within a factor of 2 of the label (a mislabelled load, not the 10 % "
    "tolerance `sim__job_sequences` checks).",
}
"""The check of `sim__offered_load` (`offered_load_check_values`): name -> what passing means."""


def offered_load_check_values(table: pl.DataFrame, factor: float = 2.0) -> dict[str, tuple[bool, dict]]:
    """Check name (OFFERED_LOAD_CHECK_DOCS) -> (passed, metadata) of an OFFERED_LOAD table: no sequence without
    a finite positive load, and every (source, load)'s mean within [label / factor, label x factor]."""
    dead = table.filter(
        ~(pl.col("offered_load_dominant").is_finite() & (pl.col("offered_load_dominant") > 0))
    )
    ratio = pl.col("ratio_to_label")
    off = offered_load_check(table).filter((ratio < 1 / factor) | (ratio > factor))
    return {
        "offered_load_near_label": (
            table.height > 0 and dead.is_empty() and off.is_empty(),
            {
                "n_sequences": table.height,
                "n_sequences_without_load": dead.height,
                "off_label": off.select("source", "load_pct", "ratio_to_label").to_dicts(),
            },
        )
    }


def split_workload_counts(jobs: pl.DataFrame, min_workloads: int = 2) -> pl.DataFrame:
    """Per (source, split) of JOB_SEQUENCES rows: distinct workloads over all its sequences, and
    `is_too_few` when below `min_workloads` (every sequence of the split then replays the same few
    workloads, and FIFO policies cannot differ on it)."""
    return (
        jobs.group_by("source", "split")
        .agg(pl.col("workload_id").n_unique().cast(pl.Int32).alias("n_distinct_workloads"))
        .with_columns((pl.col("n_distinct_workloads") < min_workloads).alias("is_too_few"))
        .sort("source", "split")
    )


# --- workload pool -----------------------------------------------------------------------------


def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode())


def _step_frame(usage: pl.DataFrame, long_running: pl.DataFrame, cfg: SequenceConfig) -> pl.DataFrame:
    """Per workload, its kept run merged into logical steps: lists `cpu_frac`, `mem_frac` per workload."""
    step_s = BIN_SECONDS * cfg.step_bins
    how = "mean" if cfg.step_how == "mean" else "max"
    cpu, mem = pl.col("cpu_frac"), pl.col("mem_frac")
    if cfg.oversized_rule == "cap":  # one machine
        cpu, mem = cpu.clip(upper_bound=1.0), mem.clip(upper_bound=1.0)
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
            getattr(cpu, how)().alias("cpu_frac"),
            getattr(mem, how)().alias("mem_frac"),
            pl.len().alias("n_bins"),
            pl.first("cpu_request_frac"),
            pl.first("mem_request_frac"),
            pl.max("cpu_frac").alias("cpu_peak_frac"),
            pl.max("mem_frac").alias("mem_peak_frac"),
        )
        .filter(pl.col("n_bins") == cfg.step_bins)  # incomplete last step dropped (see time_scale)
        .sort("source", "workload_id", "step")
        .group_by("source", "workload_id", maintain_order=True)
        .agg(
            "cpu_frac",
            "mem_frac",
            pl.first("cpu_request_frac"),
            pl.first("mem_request_frac"),
            pl.max("cpu_peak_frac"),
            pl.max("mem_peak_frac"),
        )
    )


def oversized_workloads(steps: pl.DataFrame) -> list[str]:
    """Workload ids of a `_step_frame` whose trace request or any 5-minute usage bin of its kept steps exceeds one
    machine (a fraction above 1.0), in the frame's order (see `SequenceConfig.oversized_rule`)."""
    largest = pl.max_horizontal(
        "cpu_peak_frac",
        "mem_peak_frac",
        pl.col("cpu_request_frac").fill_null(0.0),
        pl.col("mem_request_frac").fill_null(0.0),
    )
    return steps.filter(largest > 1.0)["workload_id"].to_list()


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


def _mix_block(long_fraction: float) -> tuple[int, int]:
    """(block length b, long jobs per block) of `mix_pattern`: the smallest multiple of 4 up to 40
    whose long and short counts are both even, else 20."""

    def is_even_split(k: int) -> bool:
        n_long = k * long_fraction
        return abs(n_long - round(n_long)) < 1e-9 and round(n_long) % 2 == 0 and (k - round(n_long)) % 2 == 0

    b = next((k for k in range(4, 41, 4) if is_even_split(k)), 20)
    return b, int(round(b * long_fraction))


def mix_pattern(n: int, long_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(is_long, is_cpu) flags of a stream of n jobs, balanced in short blocks so any prefix is mixed.

    Blocks of b jobs (the smallest multiple of 4 up to 40 whose long and short counts,
    b * long_fraction and the rest, are both even; else 20) hold round(b * long_fraction) long jobs;
    within the long and within the short ones cpu- and memory-dominant alternate (random start), so
    a block holds as many of each; each block is shuffled.
    """
    b, n_long = _mix_block(long_fraction)
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


def stratum_members(pool: _Pool, cfg: SequenceConfig) -> dict[tuple[bool, bool], tuple[np.ndarray, str]]:
    """Per (is_long, is_cpu) stratum, the workload indices a job of it is drawn from and why they may
    not match it: "" (they do), "other_dominant" (no workload of that dominant resource is long
    enough) or "shorter_than_asked" (none is long enough)."""
    members = {}
    for is_long in (True, False):
        min_len = cfg.long_threshold_steps + 1 if is_long else cfg.short_duration_steps[0]
        eligible = pool.length >= min_len
        for is_cpu in (True, False):
            stratum, why = np.flatnonzero(eligible & (pool.is_cpu_dominant == is_cpu)), ""
            if len(stratum) == 0:
                stratum, why = np.flatnonzero(eligible), "other_dominant"
            if len(stratum) == 0:
                stratum, why = np.arange(len(pool.workload_ids)), "shorter_than_asked"
            members[(is_long, is_cpu)] = (stratum, why)
    return members


class _StratumDraw:
    """Workloads of each (long, cpu) stratum without replacement, reshuffled when a stratum is used up."""

    def __init__(self, pool: _Pool, cfg: SequenceConfig, rng: np.random.Generator) -> None:
        self.rng = rng
        self.members = stratum_members(pool, cfg)
        self.queues: dict[tuple[bool, bool], list[int]] = {k: [] for k in self.members}

    def next(self, is_long: bool, is_cpu: bool) -> tuple[int, str]:
        """A workload index of the stratum and why it may not match it ("" when it does)."""
        stratum, why = self.members[(is_long, is_cpu)]
        queue = self.queues[(is_long, is_cpu)]
        if not queue:
            queue.extend(self.rng.permutation(stratum).tolist())
        return queue.pop(), why


def _cut_job(pool: _Pool, w: int, is_long: bool, cfg: SequenceConfig, rng: np.random.Generator) -> dict:
    """One job: a window of workload `w`, quantised (and its unquantised step means, `EXACT_USAGE_COLUMNS`)."""
    lo, hi = cfg.long_duration_steps if is_long else cfg.short_duration_steps
    length = int(pool.length[w])
    dur = int(rng.integers(min(lo, length), min(hi, length) + 1))
    start = int(rng.integers(0, length - dur + 1))
    cpu_f, mem_f = pool.cpu[w][start : start + dur], pool.mem[w][start : start + dur]
    n_clipped = int((cpu_f * cfg.capacity_units > cfg.capacity_units + QUANTISE_EPS).sum())
    n_clipped += int((mem_f * cfg.capacity_units > cfg.capacity_units + QUANTISE_EPS).sum())
    cpu = quantise_usage(cpu_f, cfg.capacity_units, cfg.quantise_mode)
    mem = quantise_usage(mem_f, cfg.capacity_units, cfg.quantise_mode)
    cpu_exact, mem_exact = exact_units(cpu_f, cfg.capacity_units), exact_units(mem_f, cfg.capacity_units)
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
        "cpu_units_exact": cpu_exact,
        "mem_units_exact": mem_exact,
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
    rate_per_step: float,
    window_steps: int,
    rng: np.random.Generator,
    stats: dict,
) -> list[dict]:
    """One sequence: Poisson arrivals of `rate_per_step` over [0, window_steps) (`poisson_arrivals`),
    given the jobs of `draw_jobs(n)` in stream order; in arrival order with `job_index`.

    A draw with no arrival at all is redrawn (counted); a sequence is never empty. Counts into
    `stats`: jobs, jobs that repeat a workload already in the sequence, jobs off their stratum,
    clipped jobs, redrawn empty sequences.
    """
    arrivals = poisson_arrivals(rate_per_step, window_steps, rng)
    n_redrawn = 0
    while len(arrivals) == 0:
        n_redrawn += 1
        if n_redrawn > MAX_EMPTY_REDRAWS:
            raise ValueError(
                f"arrange_sequence: no arrival in {MAX_EMPTY_REDRAWS} draws at {rate_per_step:.3g} jobs per "
                f"step over {window_steps} steps; the rate or the window is too small"
            )
        arrivals = poisson_arrivals(rate_per_step, window_steps, rng)
    taken = draw_jobs(len(arrivals))
    wids = [j["workload_id"] for j in taken if "workload_id" in j]
    stats["n_sequences_redrawn_empty"] += n_redrawn
    stats["n_jobs"] += len(taken)
    stats["n_jobs_repeated_workload"] += len(wids) - len(set(wids))
    stats["n_jobs_clipped"] += sum(j.get("_n_clipped", 0) > 0 for j in taken)
    stats["n_step_values_clipped"] += sum(j.get("_n_clipped", 0) for j in taken)
    for why in ("other_dominant", "shorter_than_asked"):
        stats[f"n_jobs_{why}"] += sum(j.get("_mismatch") == why for j in taken)
    return [
        {**j, "job_index": i, "arrival_step": int(a)}
        for i, (j, a) in enumerate(zip(taken, arrivals, strict=True))
    ]


def _new_stats() -> dict[str, Any]:
    return {
        "n_workloads_in": 0,
        "n_workloads_without_steps": 0,
        "n_workloads_oversized": 0,
        "n_workloads_set_aside": 0,
        "n_workloads_train": 0,
        "n_workloads_test": 0,
        "n_workloads_clipped": 0,
        "n_jobs": 0,
        "n_jobs_clipped": 0,
        "n_step_values_clipped": 0,
        "n_jobs_repeated_workload": 0,
        "n_jobs_other_dominant": 0,
        "n_jobs_shorter_than_asked": 0,
        "n_sequences_redrawn_empty": 0,
        "usage_scale": {},
        "mean_job_work_unit_steps": {},
        "arrival_rate_per_step": {},
        "oversized_workloads": {},
        "validation_workloads": {},
    }


def split_sizes(n: int, cfg: SequenceConfig) -> tuple[int, int]:
    """(train, test) workload counts of a source with n workloads: test gets round(n *
    test_workload_fraction), raised to `min_workloads_per_split` while training keeps as many; with
    fewer than twice that, the smaller half (at least one)."""
    if n < 2:
        raise ValueError(f"job sequences need at least 2 long-running workloads (train and test); got {n}")
    want = max(int(round(n * cfg.test_workload_fraction)), cfg.min_workloads_per_split)
    if n < 2 * cfg.min_workloads_per_split:
        n_test = min(want, n // 2)
    else:
        n_test = min(want, n - cfg.min_workloads_per_split)
    n_test = max(1, n_test)
    return n - n_test, n_test


def n_validation_sequences(n_train: int, share: float) -> int:
    """How many of `n_train` training sequences are validation: the last ceil(share x n_train), at least 1, or 0
    when that would be all of them (one training sequence) or share is 0. The one rule for the sequence builders
    and `sim.tuning.split_validation`."""
    if n_train < 1 or share <= 0.0:
        return 0
    n_val = min(max(int(np.ceil(share * n_train)), 1), n_train)
    return 0 if n_val == n_train else n_val


def validation_part(split: str, seq: int, n_seq: int, n_val: int) -> str:
    """The part sequence `seq` of `n_seq` in `split` is drawn from: "validation" for the last `n_val` training
    sequences (`n_validation_sequences`), else its split."""
    return "validation" if split == "train" and seq >= n_seq - n_val else split


def holdout_share(n_train: int, share: float) -> float:
    """The share of training workloads (or templates) to hold out: `share`, or 0 when the training sequences get
    no validation sequence (`n_validation_sequences` is 0), so that no workload is held out for nothing."""
    return share if n_validation_sequences(n_train, share) else 0.0


def stratified_holdout(strata: Any, share: float, min_each: int = 1) -> np.ndarray:
    """Bool mask of the items held out for validation: the last round(share x n_s) items of each stratum s (in
    the given order), so both parts keep the strata's mix (e.g. CPU- and memory-dominant workloads, whose mix
    sets which resource a load label calibrates). All False (nothing held out) when share is 0 or either part
    would have fewer than `min_each` items."""
    keys = np.asarray(strata)
    mask = np.zeros(len(keys), dtype=bool)
    if share <= 0.0:
        return mask
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        n_out = int(round(share * len(idx)))
        if n_out:
            mask[idx[-n_out:]] = True
    if min(mask.sum(), (~mask).sum()) < max(min_each, 1):
        mask[:] = False
    return mask


def _split_pool(pool: _Pool, cfg: SequenceConfig, rng: np.random.Generator) -> dict[str, _Pool]:
    """Disjoint workload pools (the split happens before any sampling): "test", and the training workloads as
    "train" (what the fit sequences draw from) and "validation" (what the validation sequences draw from),
    disjoint (`stratified_holdout` by dominant resource, each part at least `min_workloads_per_split`), else the
    same pool. The units drawn are workload GROUPS (`workload_group_pattern`: the days of one Google job), so a
    group is wholly in one part; groups come in the order of their first workload, so a source whose every
    workload is its own group is split exactly as workload by workload (`split_sizes` and the holdout then
    count groups)."""
    group_of, first = workload_group_index(pool.workload_ids, cfg.workload_group_pattern)
    order = rng.permutation(first.size)
    _, n_test = split_sizes(first.size, cfg)
    train_groups = order[n_test:]
    share = holdout_share(cfg.n_train_sequences, cfg.validation_share)
    held = stratified_holdout(pool.is_cpu_dominant[first[train_groups]], share, cfg.min_workloads_per_split)

    def members(groups: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.isin(group_of, groups))

    fit = _subset(pool, members(train_groups[~held]))
    val = _subset(pool, members(train_groups[held])) if held.any() else fit
    return {"train": fit, "validation": val, "test": _subset(pool, members(order[:n_test]))}


def workload_group_index(workload_ids: list[str], pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """((n,) each workload's group (`pipelines.workloads.workload_groups`) numbered in the order of the group's
    first workload, (G,) the index of each group's first workload)."""
    groups = workload_groups(workload_ids, pattern)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    by_appearance = np.argsort(first)
    rank = np.empty(len(first), dtype=np.int64)
    rank[by_appearance] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[by_appearance].astype(np.int64)


def _sequences_for_source(
    source: str, pool: _Pool, cfg: SequenceConfig, stats: dict, log: Callable[[str], None] | None = None
) -> list[dict]:
    rows: list[dict] = []
    n_total = len(cfg.loads_pct) * (cfg.n_train_sequences + cfg.n_test_sequences)
    progress = Progress(n_total, f"{source} job sequences", log=log, unit="sequences")
    splits = _split_pool(pool, cfg, np.random.default_rng([cfg.seed, _stable_int(source)]))
    held_out = len(splits["validation"].workload_ids) if splits["validation"] is not splits["train"] else 0
    stats["n_workloads_train"] += len(splits["train"].workload_ids) + held_out
    stats["n_workloads_test"] += len(splits["test"].workload_ids)
    stats["validation_workloads"][source] = held_out
    work = {split: expected_job_work(p, cfg) for split, p in splits.items()}
    stats["mean_job_work_unit_steps"][source] = {s: tuple(float(x) for x in w) for s, w in work.items()}
    n_val = n_validation_sequences(cfg.n_train_sequences, cfg.validation_share)
    for load in cfg.loads_pct:
        # one rate per (source, load, part) from an expected job work; never fitted per sequence
        rates = {part: part_arrival_rate(load, work, part, cfg) for part in work}
        for split, n_seq in (("train", cfg.n_train_sequences), ("test", cfg.n_test_sequences)):
            rng = np.random.default_rng([cfg.seed, _stable_int(source), load, _stable_int(split)])
            for seq in range(n_seq):
                # training sequences: the fit part, then the last n_val from the validation workloads
                part = validation_part(split, seq, n_seq, n_val)
                stats["arrival_rate_per_step"].setdefault(source, {}).setdefault(load, {})[part] = rates[part]
                draw = _StratumDraw(splits[part], cfg, rng)
                stream = partial(draw_job_stream, splits[part], cfg=cfg, rng=rng, draw=draw)
                for job in arrange_sequence(stream, rates[part], cfg.arrival_steps, rng, stats):
                    rows.append(
                        {"source": source, "load_pct": load, "split": split, "sequence_id": seq, **job}
                    )
                progress.advance()
    return rows


def add_split_stats(stats: dict[str, Any], jobs: pl.DataFrame, min_workloads: int) -> None:
    """Distinct workloads per split into `stats`: "n_distinct_workloads" {source: {split: n}}, the
    flat totals "n_distinct_workloads_train"/"_test" and "splits_with_few_workloads", a string
    "source/split:n, ..." of the splits below `min_workloads` ("" when none)."""
    counts = split_workload_counts(jobs, min_workloads)
    stats["n_distinct_workloads"] = {}
    for source, split, n, _ in counts.iter_rows():
        stats["n_distinct_workloads"].setdefault(source, {})[split] = n
    for split in ("train", "test"):
        stats[f"n_distinct_workloads_{split}"] = int(
            counts.filter(pl.col("split") == split)["n_distinct_workloads"].sum()
        )
    stats["splits_with_few_workloads"] = ", ".join(
        f"{s}/{sp}:{n}" for s, sp, n, few in counts.iter_rows() if few
    )


def jobs_to_frame(rows: list[dict]) -> pl.DataFrame:
    """Rows (dicts with the JOB_SEQUENCES keys; unit series as arrays; the META_COLUMNS and EXACT_USAGE_COLUMNS
    keys optional, null when absent) -> the typed table."""
    if not rows:
        return pl.DataFrame(schema=JOB_SEQUENCES)
    optional = (*META_COLUMNS, *EXACT_USAGE_COLUMNS)
    cols = {c: [r.get(c) if c in optional else r[c] for r in rows] for c in JOB_SEQUENCES}
    cols["cpu_units"] = [np.asarray(v, dtype=np.int16).tolist() for v in cols["cpu_units"]]
    cols["mem_units"] = [np.asarray(v, dtype=np.int16).tolist() for v in cols["mem_units"]]
    for c in EXACT_USAGE_COLUMNS:
        cols[c] = [None if v is None else np.asarray(v, dtype=np.float32).tolist() for v in cols[c]]
    return pl.DataFrame(cols, schema=JOB_SEQUENCES).sort(
        "source", "load_pct", "split", "sequence_id", "job_index"
    )


def build_job_sequences(
    usage: pl.DataFrame,
    long_running: pl.DataFrame,
    assignments: pl.DataFrame | None,
    cfg: SequenceConfig,
    log: Callable[[str], None] | None = None,
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Train/test job sequences (`JOB_SEQUENCES`) from the long-running workloads' kept runs.

    `usage`: USAGE rows; `long_running`: LONG_RUNNING rows (the run window of each workload);
    `assignments`: (workload_id, ec_label), a workload absent from it gets label 0. Returns the
    table and a stats dict (workloads in / per split / clipped, jobs drawn with replacement or from
    the other dominant resource, usage scale, expected job work per split, the arrival rate per
    (source, load), distinct workloads per split and the splits with too few, see `add_split_stats`).
    Progress lines (sequences done per source, rate, time left) go to `log` (default: the `tvw` logger).
    """
    if cfg.step_how not in ("mean", "max") or cfg.request_mode not in ("peak", "trace"):
        raise ValueError(
            f"SequenceConfig: bad step_how {cfg.step_how!r} or request_mode {cfg.request_mode!r}"
        )
    if cfg.load_resource not in LOAD_RESOURCES or cfg.rate_split not in RATE_SPLITS or cfg.arrival_steps < 1:
        raise ValueError(
            f"SequenceConfig: load_resource must be one of {LOAD_RESOURCES} (got {cfg.load_resource!r}), "
            f"rate_split one of {RATE_SPLITS} (got {cfg.rate_split!r}) and arrival_steps >= 1 (got "
            f"{cfg.arrival_steps})"
        )
    if not 0.0 <= cfg.validation_share < 1.0:
        raise ValueError(f"SequenceConfig: validation_share must be in [0, 1), got {cfg.validation_share}")
    if cfg.oversized_rule not in OVERSIZED_RULES:
        raise ValueError(
            f"SequenceConfig: oversized_rule must be one of {OVERSIZED_RULES}, got {cfg.oversized_rule!r}"
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
        oversized = oversized_workloads(steps)
        stats["oversized_workloads"][source] = oversized
        stats["n_workloads_oversized"] += len(oversized)
        if cfg.oversized_rule == "drop":
            steps = steps.filter(~pl.col("workload_id").is_in(oversized))
            stats["n_workloads_set_aside"] += len(oversized)
        elif cfg.oversized_rule == "cap":  # usage bins were capped by _step_frame
            steps = steps.with_columns(pl.col("cpu_request_frac", "mem_request_frac").clip(upper_bound=1.0))
        if steps.height == 0:
            raise ValueError(f"source {source!r}: no long-running workload has a complete step of usage")
        scale = _usage_scale(steps, cfg)
        stats["usage_scale"][source] = scale
        pool = _build_pool(steps, assignments, scale)
        assigned = set(assignments["workload_id"].to_list())
        n_unassigned = sum(w not in assigned for w in pool.workload_ids)
        stats.setdefault("n_workloads_without_ec_label", {})[source] = n_unassigned
        cap = 1.0 + QUANTISE_EPS / cfg.capacity_units
        stats["n_workloads_clipped"] += sum(
            int(c.max() > cap or m.max() > cap) for c, m in zip(pool.cpu, pool.mem, strict=True)
        )
        rows.extend(_sequences_for_source(source, pool, cfg, stats, log))
    jobs = attach_meta(jobs_to_frame(rows), long_running, stats)
    add_split_stats(stats, jobs, cfg.min_workloads_per_split)
    return jobs, stats


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


# --- the sequences of every source, as `sim__job_sequences` builds them ------------------------------------


DIVERSITY = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "split": pl.String,
    "n_sequences": pl.Int64,
    "n_jobs": pl.Int64,
    "n_distinct_workloads": pl.Int64,  # distinct workload_id over the split's sequences
    "is_too_few_workloads": pl.Boolean,  # fewer than `min_workloads`: every FIFO policy may tie
}


def split_diversity(jobs_frame: pl.DataFrame, min_workloads: int = 5) -> pl.DataFrame:
    """Distinct workloads per (source, load_pct, split) of `sim__job_sequences` (DIVERSITY). A split built from
    fewer than `min_workloads` workloads cannot separate policies (the sample's Alibaba test split was one
    constant-memory workload, where every FIFO policy gave identical numbers): callers warn on it."""
    return (
        jobs_frame.group_by("source", "load_pct", "split")
        .agg(
            n_sequences=pl.col("sequence_id").n_unique().cast(pl.Int64),
            n_jobs=pl.len().cast(pl.Int64),
            n_distinct_workloads=pl.col("workload_id").n_unique().cast(pl.Int64),
        )
        .with_columns(is_too_few_workloads=pl.col("n_distinct_workloads") < min_workloads)
        .select(list(DIVERSITY))
        .cast(DIVERSITY)
        .sort("source", "load_pct", "split")
    )


USAGE_SCALE = {
    "source": pl.String,
    "cpu_frac_scale": pl.Float64,  # multiplier applied to cpu_frac before quantising to units of C_d
    "mem_frac_scale": pl.Float64,
    "step_bins": pl.Int32,  # 5-minute bins per logical step
}
"""Per real source, what mapped its usage fractions to units: what the simulator's EC labeller needs."""


SEQUENCE_TABLE_DOCS = {
    "sim__job_sequences": "Job sequences for the simulator, one row per job: per (source, load, split, sequence) "
    "the arrival step, EC label, workload meta and quantised per-step CPU and memory units (C_d = 8), with the "
    "unquantised step means beside them (for the EC labeller only), of a window "
    "cut from a long-running workload of `core__long_running` (`pipelines.job_sequences`; workloads larger than "
    "one machine named, set aside by `oversized_rule`) or a synthetic workload (`pipelines.synthetic`).",
    "sim__offered_load": "Per job sequence, its realised offered load measured from its jobs alone (total work per "
    "resource / (M x C_d x arrival window)), per resource, their mean and the dominant resource's, and the peak "
    "demand as a fraction of the cluster: what the load label claims, checked.",
    "sim__usage_scale": "Per real source, the multipliers that mapped usage fractions to units (95th percentile of "
    "workload peaks -> 6 of 8 units) and the step length: what the EC labeller needs to turn units back into "
    "fractions.",
}
"""The tables of a sequence run (the assets' descriptions): name -> what a row is."""


SEQUENCE_CHECK_DOCS = {
    "splits_have_enough_workloads": "Every (source, load, split) is cut from at least `min_workloads_per_split` "
    "distinct workloads.",
    "offered_load_matches_label": "For every (source, load), the realised offered load of the dominant resource, "
    "averaged over sequences, is within load_tolerance (10 %) of the label.",
    "train_and_test_share_no_workload": "Within a source, no workload feeds both training and test sequences, "
    "nor does any workload group (the days of one Google job: `SequenceConfig.workload_group_pattern`).",
}
"""The checks of `sequence_check_values`: name -> what passing means."""


def sequence_check_values(
    jobs: pl.DataFrame, diversity: pl.DataFrame, by_label: pl.DataFrame | None = None
) -> dict[str, tuple[bool, dict[str, Any]]]:
    """Check name -> (passed, metadata) of a `sim__job_sequences` table: every split cut from enough distinct
    workloads (`diversity`: `split_diversity`), every (source, load)'s offered load within tolerance of its label
    (`by_label`: `offered_load_check`; none measured is a failure) and no workload or workload group in both
    splits of a source."""
    by_split = jobs.group_by("source", "workload_id").agg(pl.col("split").n_unique().alias("n_splits"))
    shared = by_split.filter(pl.col("n_splits") > 1)
    pairs = jobs.select("source", "workload_id", "split").unique()
    pairs = pairs.with_columns(
        group=pl.Series(workload_groups(pairs["workload_id"].to_list()), dtype=pl.String)
    )
    shared_groups = (
        pairs.group_by("source", "group").agg(pl.col("split").n_unique().alias("n")).filter(pl.col("n") > 1)
    )
    thin = diversity.filter(pl.col("is_too_few_workloads"))
    loads_ok = by_label is not None and by_label.height > 0 and bool(by_label["is_within_tolerance"].all())
    return {
        "splits_have_enough_workloads": (
            thin.height == 0 and jobs.height > 0,
            {"thin_splits": thin.to_dicts(), "n_jobs": jobs.height},
        ),
        "offered_load_matches_label": (
            loads_ok,
            {"by_label": [] if by_label is None else by_label.to_dicts()},
        ),
        "train_and_test_share_no_workload": (
            shared_groups.height == 0,
            {"n_shared_workloads": shared.height, "n_shared_groups": shared_groups.height},
        ),
    }
