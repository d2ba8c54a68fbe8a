"""Synthetic job sequences in the `sim__job_sequences` schema: DeepPlace's and DeepRM's workloads.

DeepPlace (APSys 2019, section 5 "Workload"): Poisson arrivals calibrated to 30/50/80 % load, half of
the jobs long-running, two resources of capacity 1r; per job a dominant resource drawn at random
with usage U(0.3r, 0.5r), the other U(0.08r, 0.16r), no correlation between them; usage over time a
square wave with period U(0.2t, 0.5t) of the job length t and high for a quarter of the period;
50 distinct jobs for training and 18 for testing, on 10 machines.

DeepRM (HotNets 2016, section 4.1 "Workload"): Bernoulli arrivals; 80 % of jobs last U{1..3}
steps, 20 % U{10..15}; dominant resource at random with demand U(0.25r, 0.5r), the other
U(0.05r, 0.1r); demands constant over the job's life; an experiment lasts 50 steps.

Choices the papers leave open (documented in the config fields): job lengths and the trough level
of DeepPlace's square wave, how a square wave is sampled at whole steps, and how DeepRM's
one-job-per-step Bernoulli process reaches 80 % of 10 machines (several Bernoulli slots per step).
Loads use `pipelines.job_sequences.realised_load`'s definition, calibrated per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import polars as pl

from pipelines.job_sequences import (
    SequenceConfig,
    _cumulative_units,
    _load_from_cumulative,
    _new_stats,
    arrange_sequence,
    jobs_to_frame,
    mix_pattern,
    quantise_usage,
)

DEEPPLACE_SOURCE = "deepplace_synthetic"
DEEPRM_SOURCE = "deeprm_synthetic"
SPLIT_CODE = {"train": 0, "test": 1}
"""Seed component per split, so train and test draws never share a random stream."""


@dataclass(frozen=True)
class DeepPlaceConfig:
    """DeepPlace's synthetic square-wave workload. Paper values as defaults where it gives them."""

    n_train_jobs: int = 50
    """Distinct job templates for training sequences (DeepPlace: 50)."""
    n_test_jobs: int = 18
    """Distinct job templates for test sequences (DeepPlace: 18); never shared with training."""
    dominant_frac: tuple[float, float] = (0.3, 0.5)
    """Uniform range of the dominant resource's peak, fraction of a machine."""
    other_frac: tuple[float, float] = (0.08, 0.16)
    """Uniform range of the other resource's peak."""
    period_of_length: tuple[float, float] = (0.2, 0.5)
    """Square-wave period as a fraction of the job length t."""
    width_of_period: float = 0.25
    """Share of each period at the peak (DeepPlace: one fourth)."""
    trough_ratio: float = 0.25
    """Usage off the peak, as a fraction of the peak (not in the paper; 0 would idle jobs 3/4 of the time)."""
    long_fraction: float = 0.5
    """Share of long-running jobs, among templates and in each sequence (DeepPlace: half)."""
    long_duration_steps: tuple[int, int] = (31, 100)
    """Inclusive range of long job lengths in steps (not in the paper; > 30 as TVW-RL's long-running)."""
    short_duration_steps: tuple[int, int] = (8, 30)
    """Inclusive range of short job lengths (not in the paper; >= 8 keeps a period >= 2 steps)."""
    arrival_steps: int = 80
    """Steps during which requests arrive (Poisson; the rate follows from the load); jobs are drawn
    with replacement from the split's templates."""
    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target average cluster loads."""
    n_machines: int = 10
    """M: machines in the cluster (DeepPlace: 10)."""
    capacity_units: int = 8
    """C_d: units per machine per resource (1r = C_d units)."""
    n_train_sequences: int = 100
    """Training sequences per load."""
    n_test_sequences: int = 30
    """Test sequences per load."""
    quantise_mode: str = "ceil"
    """See `pipelines.job_sequences.quantise_usage`."""
    load_tolerance: float = 0.005
    """Bisection tolerance on the realised load (fraction of the cluster)."""
    seed: int = 0
    """Seed of every random draw."""


@dataclass(frozen=True)
class DeepRMConfig:
    """DeepRM's synthetic workload of short constant-demand jobs."""

    short_duration_steps: tuple[int, int] = (1, 3)
    """Inclusive range of short durations (DeepRM: 1t-3t)."""
    long_duration_steps: tuple[int, int] = (10, 15)
    """Inclusive range of long durations (DeepRM: 10t-15t); these rows get is_long_running = True."""
    short_fraction: float = 0.8
    """Share of short jobs (DeepRM: 80 %)."""
    dominant_frac: tuple[float, float] = (0.25, 0.5)
    """Uniform range of the dominant demand, fraction of a machine (DeepRM: 0.25r-0.5r)."""
    other_frac: tuple[float, float] = (0.05, 0.1)
    """Uniform range of the other demand (DeepRM: 0.05r-0.1r)."""
    arrival_steps: int = 50
    """Steps during which jobs may arrive (DeepRM: an experiment lasts 50t)."""
    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target average cluster loads."""
    n_machines: int = 10
    """M: machines of the cluster the load refers to."""
    capacity_units: int = 8
    """C_d: units per machine per resource."""
    n_train_sequences: int = 100
    """Training jobsets per load (DeepRM: 100)."""
    n_test_sequences: int = 30
    """Test jobsets per load."""
    quantise_mode: str = "ceil"
    """See `pipelines.job_sequences.quantise_usage`."""
    seed: int = 0
    """Seed of every random draw."""


# --- DeepPlace -----------------------------------------------------------------------------------


def square_wave(
    length: int, period_steps: int, width_steps: int, phase: int, high: float, low: float
) -> np.ndarray:
    """Usage per step: `high` during the first `width_steps` of every `period_steps`, else `low`.

    Sampled at whole steps, so the period is rounded to >= 2 steps and the width to >= 1 step;
    `phase` shifts the wave (step k is at position (k + phase) mod period).
    """
    k = (np.arange(length) + phase) % period_steps
    return np.where(k < width_steps, high, low)


def _deepplace_template(is_long: bool, cfg: DeepPlaceConfig, rng: np.random.Generator) -> dict:
    lo, hi = cfg.long_duration_steps if is_long else cfg.short_duration_steps
    length = int(rng.integers(lo, hi + 1))
    is_cpu = bool(rng.random() < 0.5)
    dom, other = rng.uniform(*cfg.dominant_frac), rng.uniform(*cfg.other_frac)
    period = max(2, int(round(rng.uniform(*cfg.period_of_length) * length)))
    width = max(1, int(round(cfg.width_of_period * period)))
    phase = int(rng.integers(0, period))
    units = []
    for peak in (dom, other) if is_cpu else (other, dom):
        wave = square_wave(length, period, width, phase, peak, cfg.trough_ratio * peak)
        units.append(quantise_usage(wave, cfg.capacity_units, cfg.quantise_mode))
    return {
        "ec_label": 1 + 2 * int(not is_cpu) + int(is_long),  # (dominant resource, long/short): 1..4
        "duration_steps": length,
        "cpu_units": units[0],
        "mem_units": units[1],
        "cpu_request_units": int(units[0].max()),
        "mem_request_units": int(units[1].max()),
        "is_long_running": is_long,
    }


def deepplace_templates(n: int, split: str, cfg: DeepPlaceConfig, rng: np.random.Generator) -> list[dict]:
    """`n` distinct square-wave jobs of one split; the first long_fraction of them are long-running."""
    n_long = int(round(n * cfg.long_fraction))
    return [
        {"workload_id": f"deepplace-{split}-{i:03d}", **_deepplace_template(i < n_long, cfg, rng)}
        for i in range(n)
    ]


def _draw_templates(
    templates: list[dict], n: int, long_fraction: float, rng: np.random.Generator
) -> list[dict]:
    """A stream of n jobs drawn with replacement from the templates, long and short mixed in blocks."""
    long_idx = [i for i, t in enumerate(templates) if t["is_long_running"]]
    short_idx = [i for i, t in enumerate(templates) if not t["is_long_running"]]
    is_long, _ = mix_pattern(n, long_fraction, rng)
    return [templates[int(rng.choice(long_idx if flag else short_idx))] for flag in is_long]


def build_deepplace_sequences(cfg: DeepPlaceConfig) -> tuple[pl.DataFrame, dict]:
    """DeepPlace synthetic sequences (source "deepplace_synthetic") for every load and split, and stats."""
    seq_cfg = SequenceConfig(
        n_machines=cfg.n_machines,
        capacity_units=cfg.capacity_units,
        arrival_steps=cfg.arrival_steps,
        load_tolerance=cfg.load_tolerance,
    )
    stats = _new_stats()
    rows = []
    for split, n_templates, n_seq in (
        ("train", cfg.n_train_jobs, cfg.n_train_sequences),
        ("test", cfg.n_test_jobs, cfg.n_test_sequences),
    ):
        templates = deepplace_templates(
            n_templates, split, cfg, np.random.default_rng([cfg.seed, 1, SPLIT_CODE[split]])
        )
        for load in cfg.loads_pct:
            rng = np.random.default_rng([cfg.seed, 2, load, SPLIT_CODE[split]])
            stream = partial(_draw_templates, templates, long_fraction=cfg.long_fraction, rng=rng)
            for seq in range(n_seq):
                for job in arrange_sequence(stream, load, seq_cfg, rng, stats):
                    rows.append(
                        {
                            "source": DEEPPLACE_SOURCE,
                            "load_pct": load,
                            "split": split,
                            "sequence_id": seq,
                            **job,
                        }
                    )
    stats.pop("arrival_rate_per_step", None)
    return jobs_to_frame(rows), {k: v for k, v in stats.items() if not k.startswith("n_workloads")}


# --- DeepRM --------------------------------------------------------------------------------------


def _deeprm_jobs(n: int, cfg: DeepRMConfig, rng: np.random.Generator) -> list[dict]:
    """`n` independent DeepRM jobs (constant demand over their duration)."""
    is_long = rng.random(n) >= cfg.short_fraction
    short = rng.integers(cfg.short_duration_steps[0], cfg.short_duration_steps[1] + 1, n)
    long_ = rng.integers(cfg.long_duration_steps[0], cfg.long_duration_steps[1] + 1, n)
    dur = np.where(is_long, long_, short)
    is_cpu = rng.random(n) < 0.5
    dom = quantise_usage(rng.uniform(*cfg.dominant_frac, n), cfg.capacity_units, cfg.quantise_mode)
    other = quantise_usage(rng.uniform(*cfg.other_frac, n), cfg.capacity_units, cfg.quantise_mode)
    cpu, mem = np.where(is_cpu, dom, other), np.where(is_cpu, other, dom)
    return [
        {
            "ec_label": 1 + 2 * int(not is_cpu[i]) + int(is_long[i]),  # (dominant resource, long/short): 1..4
            "duration_steps": int(dur[i]),
            "cpu_units": np.full(dur[i], cpu[i], dtype=np.int16),
            "mem_units": np.full(dur[i], mem[i], dtype=np.int16),
            "cpu_request_units": int(cpu[i]),
            "mem_request_units": int(mem[i]),
            "is_long_running": bool(is_long[i]),
        }
        for i in range(n)
    ]


def _deeprm_mean_area(cfg: DeepRMConfig) -> float:
    """Rough expected units x steps per job (mean over resources), only to size the slots per step."""
    mean_dur = cfg.short_fraction * np.mean(cfg.short_duration_steps) + (1 - cfg.short_fraction) * np.mean(
        cfg.long_duration_steps
    )
    mean_units = 0.5 * (np.mean(cfg.dominant_frac) + np.mean(cfg.other_frac)) * cfg.capacity_units + 0.5
    return float(mean_dur * mean_units)


def _bernoulli_arrivals(
    jobs: list[dict], slots: np.ndarray, u: np.ndarray, load: float, cfg: DeepRMConfig
) -> np.ndarray:
    """Arrival mask over (step, slot) whose realised load is closest to `load`, by bisection on p.

    Slot (s, k) holds a job when u[s, k] < p; with u and the jobs fixed, load grows with p.
    """
    cum = _cumulative_units([j["cpu_units"] for j in jobs], [j["mem_units"] for j in jobs])
    steps = slots[:, 0]

    def load_for(p: float) -> float:
        take = np.flatnonzero(u.ravel() < p)
        if len(take) == 0:
            return 0.0
        return _load_from_cumulative(
            steps[take], cum[take], cfg.n_machines, cfg.capacity_units, cfg.arrival_steps
        )

    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if load_for(mid) > load else (mid, hi)
    return u.ravel() < hi


def deeprm_sequence(load_pct: int, cfg: DeepRMConfig, rng: np.random.Generator) -> list[dict]:
    """One DeepRM jobset: Bernoulli arrivals over `arrival_steps`, in arrival order with job_index.

    DeepRM's process has at most one arrival per step; 80 % of 10 machines needs several jobs per
    step, so each step has `k` independent Bernoulli slots with one probability p (k = 1 when the
    expected rate is below one job per step); p is set by bisection so the realised load meets the target.
    """
    rate = load_pct / 100.0 * cfg.n_machines * cfg.capacity_units / _deeprm_mean_area(cfg)
    k = max(1, int(np.ceil(2 * rate)))
    slots = np.array([(s, j) for s in range(cfg.arrival_steps) for j in range(k)], dtype=np.int64)
    jobs = _deeprm_jobs(len(slots), cfg, rng)
    u = rng.random(len(slots))
    u[0] = 0.0  # the sequence opens with an arrival at step 0
    take = np.flatnonzero(_bernoulli_arrivals(jobs, slots, u, load_pct / 100.0, cfg))
    return [{**jobs[i], "job_index": n, "arrival_step": int(slots[i, 0])} for n, i in enumerate(take)]


def build_deeprm_sequences(cfg: DeepRMConfig) -> pl.DataFrame:
    """DeepRM synthetic sequences (source "deeprm_synthetic") for every load and split."""
    rows = []
    for split, n_seq in (("train", cfg.n_train_sequences), ("test", cfg.n_test_sequences)):
        for load in cfg.loads_pct:
            rng = np.random.default_rng([cfg.seed, 3, load, SPLIT_CODE[split]])
            for seq in range(n_seq):
                for job in deeprm_sequence(load, cfg, rng):
                    wid = f"deeprm-{split}-{load}-{seq:03d}-{job['job_index']:04d}"
                    rows.append(
                        {
                            "source": DEEPRM_SOURCE,
                            "load_pct": load,
                            "split": split,
                            "sequence_id": seq,
                            "workload_id": wid,
                            **job,
                        }
                    )
    return jobs_to_frame(rows)
