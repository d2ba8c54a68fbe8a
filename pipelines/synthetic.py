"""Synthetic job sequences in the `sim__job_sequences` schema: DeepPlace's and DeepRM's workloads.

DeepPlace (APSys 2019, section 5 "Workload"): Poisson arrivals calibrated to 30/50/80 % load, half of
the jobs long-running, two resources of capacity 1r per machine; per job a dominant resource drawn at
random with usage U(0.3r, 0.5r), the other U(0.08r, 0.16r), no correlation between them; usage over
time a square wave with period U(0.2t, 0.5t) of the job length t and width one fourth of the period;
50 distinct jobs for training and 18 for testing, on 10 machines.

DeepRM (HotNets 2016, section 4.1 "Workload", model of section 3.1): the cluster is one pool of
capacity {1r, 1r}; Bernoulli arrivals (at most one job per step); 80 % of jobs last U{1..3} steps,
20 % U{10..15}; dominant resource at random with demand U(0.25r, 0.5r) of the cluster, the other
U(0.05r, 0.1r); demands constant over the job's life; an experiment lasts 50 steps.

Both use `pipelines.job_sequences`' load definition: offered load = arrival rate x mean job work /
cluster capacity (work: usage units summed over the job's steps), one rate per (source, load) from the
training split's expected work; `offered_load_table` measures it per sequence.

Choices the papers leave open (config fields say which): job lengths and the low level of DeepPlace's
square wave, how a square wave becomes whole steps (each step holds the wave's mean over the step, as
real traces are averaged into steps), and the cluster a DeepRM job's demand is a fraction of. DeepRM's
demands are fractions of the whole cluster and a job must fit one machine of the simulator, so the
DeepRM cluster is `DeepRMConfig.n_machines` = 1 machine (DeepRM's single pool); its expected job work
is 4.1 steps x 0.225 of the cluster per resource, so one arrival per step offers at most 92 % and
30/50/80 % take arrival probabilities 0.33/0.54/0.87. On M = 10 machines with the same jobs
the labels would be a tenth, and the reachable maximum 9.2 %; a load that needs more than one
arrival per step is an error, never silently capped (`deeprm_arrival_plan`).

Both fill the unquantised usage columns (`pipelines.job_sequences.EXACT_USAGE_COLUMNS`) with the real values
before they became whole units: DeepPlace's square wave's step means x C_d (clipped to C_d), DeepRM's demand
before `sample_units` rounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from pipelines.job_sequences import (
    LOAD_RESOURCES,
    RATE_SPLITS,
    _new_stats,
    add_split_stats,
    arrange_sequence,
    exact_units,
    holdout_share,
    jobs_to_frame,
    mix_pattern,
    n_validation_sequences,
    part_arrival_rate,
    quantise_usage,
    stratified_holdout,
    validation_part,
)

DEEPPLACE_SOURCE = "deepplace_synthetic"
DEEPRM_SOURCE = "deeprm_synthetic"
SYNTHETIC_SOURCES = (DEEPPLACE_SOURCE, DEEPRM_SOURCE)
"""The papers' synthetic workloads: their job classes are known (no EC mapping, labels are the true classes)."""


def is_synthetic(source: str) -> bool:
    """Whether `source` is one of the papers' synthetic workloads rather than a trace source."""
    return source in SYNTHETIC_SOURCES


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
    """Uniform range of the dominant resource's high level, fraction of a machine (DeepPlace: 0.3r-0.5r)."""
    other_frac: tuple[float, float] = (0.08, 0.16)
    """Uniform range of the other resource's high level (DeepPlace: 0.08r-0.16r)."""
    period_of_length: tuple[float, float] = (0.2, 0.5)
    """Square-wave period as a fraction of the job length t (DeepPlace: U(0.2t, 0.5t))."""
    width_of_period: float = 0.25
    """Share of each period at the high level (DeepPlace: one fourth)."""
    trough_ratio: float = 0.25
    """The low level, as a fraction of the job's high level. Not in the paper (it gives the usage
    range only); 0 would leave jobs idle three quarters of their life, 0.25 keeps a background usage."""
    long_fraction: float = 0.5
    """Share of long-running jobs, among templates and in each sequence (DeepPlace: half)."""
    long_duration_steps: tuple[int, int] = (31, 100)
    """Inclusive range of long job lengths in steps (not in the paper; > 30 as TVW-RL's long-running)."""
    short_duration_steps: tuple[int, int] = (8, 30)
    """Inclusive range of short job lengths (not in the paper; >= 8 keeps a period >= 1.6 steps)."""
    arrival_steps: int = 300
    """Steps during which requests arrive (Poisson; the rate follows from the load), 3x the longest job;
    jobs are drawn with replacement from the split's templates."""
    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target offered loads, % of the cluster (see `load_resource`)."""
    load_resource: str = "dominant"
    """What a load label calibrates: "dominant" (the resource with the larger expected job work) or
    "mean" of the two; see `pipelines.job_sequences.SequenceConfig.load_resource`."""
    rate_split: str = "own"
    """Whose expected job work sets a split's arrival rate: "own" templates or "train" templates for
    both; see `pipelines.job_sequences.SequenceConfig.rate_split`."""
    n_machines: int = 10
    """M: machines in the cluster (DeepPlace: 10)."""
    capacity_units: int = 8
    """C_d: units per machine per resource (1r = C_d units)."""
    n_train_sequences: int = 100
    """Training sequences per load."""
    n_test_sequences: int = 30
    """Test sequences per load."""
    validation_share: float = 0.3
    """Share of the training sequences (the last `n_validation_sequences` per load) and of the training
    templates (long and short alike) held out as validation: validation sequences draw only the held-out
    templates, the other training sequences the rest (see `SequenceConfig.validation_share`)."""
    quantise_mode: str = "round"
    """How a step's mean usage becomes units: "round" to nearest (no systematic upward bias) or
    "ceil"; see `pipelines.job_sequences.quantise_usage`."""
    seed: int = 0
    """Seed of every random draw."""


@dataclass(frozen=True)
class DeepRMConfig:
    """DeepRM's synthetic workload of short constant-demand jobs on DeepRM's single-pool cluster."""

    short_duration_steps: tuple[int, int] = (1, 3)
    """Inclusive range of short durations (DeepRM: 1t-3t)."""
    long_duration_steps: tuple[int, int] = (10, 15)
    """Inclusive range of long durations (DeepRM: 10t-15t); these rows get is_long_running = True."""
    short_fraction: float = 0.8
    """Share of short jobs (DeepRM: 80 %)."""
    dominant_frac: tuple[float, float] = (0.25, 0.5)
    """Uniform range of the dominant demand, fraction of the whole cluster (DeepRM: 0.25r-0.5r)."""
    other_frac: tuple[float, float] = (0.05, 0.1)
    """Uniform range of the other demand, fraction of the whole cluster (DeepRM: 0.05r-0.1r)."""
    arrival_steps: int = 50
    """Steps during which a job may arrive, at most one per step (DeepRM: an experiment lasts 50t)."""
    loads_pct: tuple[int, ...] = (30, 50, 80)
    """Target offered loads, % of the cluster; at most `deeprm_arrival_plan`'s reachable maximum."""
    n_machines: int = 1
    """Machines of the cluster the demands are fractions of. DeepRM's cluster is one pool of capacity
    1r per resource; the simulator places a job on one machine, so the pool is one machine (with 2,
    jobs up to half the pool still fit one machine; beyond, some would fit none: an error)."""
    capacity_units: int = 8
    """C_d: units per machine per resource; a demand of f of the cluster is f * n_machines * C_d units."""
    n_train_sequences: int = 100
    """Training jobsets per load (DeepRM: 100)."""
    n_test_sequences: int = 30
    """Test jobsets per load."""
    seed: int = 0
    """Seed of every random draw."""


def sample_units(units: Any, rng: np.random.Generator) -> np.ndarray:
    """Non-negative real unit counts -> integers without bias: floor(x) plus one with probability
    x - floor(x), so the expected integer equals x (int16)."""
    x = np.asarray(units, dtype=np.float64)
    if np.isnan(x).any() or (x < 0).any():
        raise ValueError("sample_units: unit counts must be >= 0 and not NaN")
    low = np.floor(x)
    return (low + (rng.random(x.shape) < x - low)).astype(np.int16)


# --- DeepPlace -----------------------------------------------------------------------------------


def square_wave(
    length: int, period_steps: float, width_steps: float, phase: float, high: float, low: float
) -> np.ndarray:
    """Usage per step of a square wave over continuous time: `high` during the first `width_steps` of
    every `period_steps` (both real, in steps), `low` otherwise, time t at position (t + phase) mod
    period. Step k holds the wave's mean over [k, k + 1), so the share of time at `high` is
    width / period at any period, as real usage is averaged into steps."""
    if period_steps <= 0 or not 0 <= width_steps <= period_steps:
        raise ValueError(f"square_wave: need 0 < width <= period; got {width_steps}, {period_steps}")

    def high_time(t: np.ndarray) -> np.ndarray:  # time spent high in [0, t) of the shifted wave
        u = t + phase
        n_full, rest = np.floor(u / period_steps), np.mod(u, period_steps)
        return n_full * width_steps + np.minimum(rest, width_steps)

    edges = np.arange(length + 1, dtype=np.float64)
    share_high = np.diff(high_time(edges))
    return low + (high - low) * share_high


def _deepplace_template(is_long: bool, cfg: DeepPlaceConfig, rng: np.random.Generator) -> dict:
    lo, hi = cfg.long_duration_steps if is_long else cfg.short_duration_steps
    length = int(rng.integers(lo, hi + 1))
    is_cpu = bool(rng.random() < 0.5)
    dom, other = rng.uniform(*cfg.dominant_frac), rng.uniform(*cfg.other_frac)
    period = rng.uniform(*cfg.period_of_length) * length
    phase = rng.uniform(0.0, period)
    units, exact = [], []
    for peak in (dom, other) if is_cpu else (other, dom):
        wave = square_wave(length, period, cfg.width_of_period * period, phase, peak, cfg.trough_ratio * peak)
        units.append(quantise_usage(wave, cfg.capacity_units, cfg.quantise_mode))
        exact.append(exact_units(wave, cfg.capacity_units))
    return {
        "ec_label": 1 + 2 * int(not is_cpu) + int(is_long),  # (dominant resource, long/short): 1..4
        "duration_steps": length,
        "cpu_units": units[0],
        "mem_units": units[1],
        "cpu_units_exact": exact[0],
        "mem_units_exact": exact[1],
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


def templates_mean_work(templates: list[dict], long_fraction: float) -> np.ndarray:
    """(cpu, mem) expected work in unit-steps of one job of `_draw_templates`: long_fraction x the mean
    over long templates + the rest x the mean over short ones."""
    out = np.zeros(2)
    for is_long, share in ((True, long_fraction), (False, 1.0 - long_fraction)):
        group = [t for t in templates if t["is_long_running"] == is_long]
        if share > 0 and not group:
            raise ValueError(
                f"templates_mean_work: no {'long' if is_long else 'short'} template to draw from"
            )
        if group:
            work = [(int(np.sum(t["cpu_units"])), int(np.sum(t["mem_units"]))) for t in group]
            out += share * np.mean(work, axis=0)
    return out


def _draw_templates(
    templates: list[dict], n: int, long_fraction: float, rng: np.random.Generator
) -> list[dict]:
    """A stream of n jobs drawn with replacement from the templates, long and short mixed in blocks."""
    long_idx = [i for i, t in enumerate(templates) if t["is_long_running"]]
    short_idx = [i for i, t in enumerate(templates) if not t["is_long_running"]]
    is_long, _ = mix_pattern(n, long_fraction, rng)
    return [templates[int(rng.choice(long_idx if flag else short_idx))] for flag in is_long]


def validation_templates(templates: list[dict], share: float) -> tuple[list[dict], list[dict]]:
    """(fit, validation) templates of the training split: the last round(share x n) templates of each class
    (dominant resource x long or short, `ec_label`) are validation, so both parts keep the mix; both are the whole
    list when either part would lack long or short templates (or share is 0)."""
    held = stratified_holdout([t["ec_label"] for t in templates], share)
    long = np.array([t["is_long_running"] for t in templates])
    if not all((long[m]).any() and (~long[m]).any() for m in (held, ~held)):
        return templates, templates
    return [t for t, h in zip(templates, held, strict=True) if not h], [
        t for t, h in zip(templates, held, strict=True) if h
    ]


def build_deepplace_sequences(cfg: DeepPlaceConfig) -> tuple[pl.DataFrame, dict]:
    """DeepPlace synthetic sequences (source "deepplace_synthetic") for every load and split, and stats
    (jobs, expected job work per split, the arrival rate per load, distinct templates per split).

    One Poisson rate per (load, split), from the split's templates' expected job work (`rate_split`)."""
    if cfg.load_resource not in LOAD_RESOURCES or cfg.rate_split not in RATE_SPLITS:
        raise ValueError(
            f"DeepPlaceConfig: load_resource must be one of {LOAD_RESOURCES}, rate_split one of {RATE_SPLITS}"
        )
    if not 0.0 <= cfg.validation_share < 1.0:
        raise ValueError(f"DeepPlaceConfig: validation_share must be in [0, 1), got {cfg.validation_share}")
    stats = _new_stats()
    templates = {
        split: deepplace_templates(n, split, cfg, np.random.default_rng([cfg.seed, 1, SPLIT_CODE[split]]))
        for split, n in (("train", cfg.n_train_jobs), ("test", cfg.n_test_jobs))
    }
    n_val = n_validation_sequences(cfg.n_train_sequences, cfg.validation_share)
    share = holdout_share(cfg.n_train_sequences, cfg.validation_share)
    templates["train"], templates["validation"] = validation_templates(templates["train"], share)
    stats["validation_workloads"][DEEPPLACE_SOURCE] = (
        len(templates["validation"]) if templates["validation"] is not templates["train"] else 0
    )
    work = {split: templates_mean_work(t, cfg.long_fraction) for split, t in templates.items()}
    stats["mean_job_work_unit_steps"][DEEPPLACE_SOURCE] = {s: tuple(map(float, w)) for s, w in work.items()}
    rows = []
    for load in cfg.loads_pct:
        rates = {part: part_arrival_rate(load, work, part, cfg) for part in work}
        for split, n_seq in (("train", cfg.n_train_sequences), ("test", cfg.n_test_sequences)):
            rng = np.random.default_rng([cfg.seed, 2, load, SPLIT_CODE[split]])
            for seq in range(n_seq):
                part = validation_part(split, seq, n_seq, n_val)
                stats["arrival_rate_per_step"].setdefault(DEEPPLACE_SOURCE, {}).setdefault(load, {})[part] = (
                    rates[part]
                )
                stream = partial(_draw_templates, templates[part], long_fraction=cfg.long_fraction, rng=rng)
                for job in arrange_sequence(stream, rates[part], cfg.arrival_steps, rng, stats):
                    rows.append(
                        {
                            "source": DEEPPLACE_SOURCE,
                            "load_pct": load,
                            "split": split,
                            "sequence_id": seq,
                            **job,
                        }
                    )
    jobs = jobs_to_frame(rows)
    add_split_stats(stats, jobs, 2)
    return jobs, {k: v for k, v in stats.items() if not k.startswith("n_workloads")}


# --- DeepRM --------------------------------------------------------------------------------------


def _deeprm_cluster_units(cfg: DeepRMConfig) -> int:
    """Units per resource of the whole DeepRM cluster; raises when its largest job fits no machine."""
    cluster = cfg.n_machines * cfg.capacity_units
    largest = max(cfg.dominant_frac[1], cfg.other_frac[1]) * cluster
    if largest > cfg.capacity_units:
        raise ValueError(
            f"DeepRMConfig: demands up to {max(cfg.dominant_frac[1], cfg.other_frac[1])} of a "
            f"{cfg.n_machines}-machine cluster ({largest:g} units) exceed one machine ({cfg.capacity_units} "
            "units); DeepRM's demands are fractions of its whole (single-pool) cluster"
        )
    return cluster


def deeprm_mean_work(cfg: DeepRMConfig) -> float:
    """Expected work of one DeepRM job per resource, in unit-steps: E[duration] x E[demand units];
    a resource is dominant for half of the jobs and `sample_units` keeps the demand's mean."""
    mean_short = np.mean(np.arange(cfg.short_duration_steps[0], cfg.short_duration_steps[1] + 1))
    mean_long = np.mean(np.arange(cfg.long_duration_steps[0], cfg.long_duration_steps[1] + 1))
    mean_duration = cfg.short_fraction * mean_short + (1 - cfg.short_fraction) * mean_long
    mean_demand = 0.5 * (np.mean(cfg.dominant_frac) + np.mean(cfg.other_frac)) * _deeprm_cluster_units(cfg)
    return float(mean_duration * mean_demand)


def deeprm_arrival_plan(cfg: DeepRMConfig) -> dict[str, Any]:
    """Per load label, the Bernoulli arrival probability per step that offers it (p x mean work /
    cluster capacity = load) and whether it is reachable (p <= 1, DeepRM's one arrival per step); and
    the largest reachable offered load in % (at p = 1)."""
    capacity = _deeprm_cluster_units(cfg)
    max_load_pct = 100.0 * deeprm_mean_work(cfg) / capacity
    return {
        "cluster_units_per_resource": capacity,
        "max_offered_load_pct": max_load_pct,
        "arrival_probability": {load: load / max_load_pct for load in cfg.loads_pct},
        "is_reachable": {load: load <= max_load_pct for load in cfg.loads_pct},
    }


def _deeprm_jobs(n: int, cfg: DeepRMConfig, rng: np.random.Generator) -> list[dict]:
    """`n` independent DeepRM jobs (constant demand over their duration, in units of the cluster)."""
    cluster = _deeprm_cluster_units(cfg)
    is_long = rng.random(n) >= cfg.short_fraction
    short = rng.integers(cfg.short_duration_steps[0], cfg.short_duration_steps[1] + 1, n)
    long_ = rng.integers(cfg.long_duration_steps[0], cfg.long_duration_steps[1] + 1, n)
    dur = np.where(is_long, long_, short)
    is_cpu = rng.random(n) < 0.5
    dom_exact = rng.uniform(*cfg.dominant_frac, n) * cluster  # real-valued demand, units; then rounded
    dom = sample_units(dom_exact, rng)
    other_exact = rng.uniform(*cfg.other_frac, n) * cluster
    other = sample_units(other_exact, rng)
    cpu, mem = np.where(is_cpu, dom, other), np.where(is_cpu, other, dom)
    cpu_exact = np.where(is_cpu, dom_exact, other_exact).astype(np.float32)
    mem_exact = np.where(is_cpu, other_exact, dom_exact).astype(np.float32)
    return [
        {
            "ec_label": 1 + 2 * int(not is_cpu[i]) + int(is_long[i]),  # (dominant resource, long/short): 1..4
            "duration_steps": int(dur[i]),
            "cpu_units": np.full(dur[i], cpu[i], dtype=np.int16),
            "mem_units": np.full(dur[i], mem[i], dtype=np.int16),
            "cpu_units_exact": np.full(dur[i], cpu_exact[i], dtype=np.float32),
            "mem_units_exact": np.full(dur[i], mem_exact[i], dtype=np.float32),
            "cpu_request_units": int(cpu[i]),
            "mem_request_units": int(mem[i]),
            "is_long_running": bool(is_long[i]),
        }
        for i in range(n)
    ]


def deeprm_sequence(load_pct: int, cfg: DeepRMConfig, rng: np.random.Generator) -> list[dict]:
    """One DeepRM jobset: a Bernoulli process over `arrival_steps` (each step one job with the plan's
    probability, else none), in arrival order with job_index. An unreachable load is a ValueError; a
    draw with no arrival is redrawn (a jobset is never empty)."""
    plan = deeprm_arrival_plan(cfg)
    if load_pct <= 0:
        raise ValueError(f"DeepRM load must be > 0 %, got {load_pct}")
    if not plan["is_reachable"].get(load_pct, load_pct <= plan["max_offered_load_pct"]):
        raise ValueError(
            f"DeepRM load {load_pct} % needs more than one arrival per step on {cfg.n_machines} machine(s); "
            f"at most {plan['max_offered_load_pct']:.1f} % is reachable"
        )
    p = load_pct / plan["max_offered_load_pct"]
    steps = np.flatnonzero(rng.random(cfg.arrival_steps) < p)
    while len(steps) == 0:
        steps = np.flatnonzero(rng.random(cfg.arrival_steps) < p)
    jobs = _deeprm_jobs(len(steps), cfg, rng)
    return [
        {**job, "job_index": n, "arrival_step": int(s)}
        for n, (job, s) in enumerate(zip(jobs, steps, strict=True))
    ]


def build_deeprm_sequences(cfg: DeepRMConfig) -> pl.DataFrame:
    """DeepRM synthetic sequences (source "deeprm_synthetic") for every load and split, on the
    `cfg.n_machines`-machine cluster its demands refer to (see `deeprm_arrival_plan`)."""
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


# --- registry ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticWorkload:
    """A synthetic workload of `sim__job_sequences`: its paper's settings (which fix the cluster its load labels
    refer to) and its builder."""

    config: DeepPlaceConfig | DeepRMConfig
    """The workload's settings; `n_machines` and `arrival_steps` are its own cluster and arrival window."""
    builder: Callable[[DeepPlaceConfig | DeepRMConfig], pl.DataFrame]
    """Settings -> the JOB_SEQUENCES rows of every load and split."""
    has_usage_shape: bool = True
    """False for flat constant-demand jobs: nothing to forecast, so usage-forecast evaluations leave it out."""

    @property
    def n_machines(self) -> int:
        return self.config.n_machines

    @property
    def arrival_steps(self) -> int:
        return self.config.arrival_steps

    def build(
        self,
        n_train_sequences: int,
        n_test_sequences: int,
        loads_pct: tuple[int, ...],
        seed: int,
        validation_share: float | None = None,
    ) -> pl.DataFrame:
        """Its sequences with the run's counts, loads, seed and validation share where its settings have one (the
        rest from its paper's settings)."""
        extra = {}
        if validation_share is not None and hasattr(self.config, "validation_share"):
            extra["validation_share"] = validation_share
        cfg = replace(
            self.config,
            n_train_sequences=n_train_sequences,
            n_test_sequences=n_test_sequences,
            loads_pct=tuple(loads_pct),
            seed=seed,
            **extra,
        )
        return self.builder(cfg)


SYNTHETIC_WORKLOADS: dict[str, SyntheticWorkload] = {
    DEEPPLACE_SOURCE: SyntheticWorkload(DeepPlaceConfig(), lambda cfg: build_deepplace_sequences(cfg)[0]),
    DEEPRM_SOURCE: SyntheticWorkload(DeepRMConfig(), build_deeprm_sequences, has_usage_shape=False),
}
"""Source name -> synthetic workload (the SYNTHETIC_SOURCES), in the order `sim__job_sequences` appends them."""


def cluster_of(source: str, n_machines: int, arrival_steps: int) -> tuple[int, int]:
    """(machines M, arrival window in steps) the load labels of `source` refer to: a synthetic workload's own
    cluster (DeepRM's single pool), else the given trace cluster."""
    own = SYNTHETIC_WORKLOADS.get(source)
    return (own.n_machines, own.arrival_steps) if own else (n_machines, arrival_steps)
