"""Evaluation runner: every policy on every test sequence, the metrics table, its summary and TVW-RL-style plots.

`evaluate_policies` runs the batched simulator over all sequences of one (source, load) at once per policy and
seed, and returns one row per (source, load_pct, policy, sequence_id, seed) with every metric of
`sim.metrics.episode_metrics`. Policies that take EC profiles (`sim.policies.accepts_profiles`, e.g.
ec_peak_aware) get the profiles learned once per (source, load) from that group's TRAIN sequences only
(`learn_group_profiles`); the evaluated sequences never feed them. `summarise` gives the mean and a t-based 95 % interval per (source, load, policy,
metric); `assets.plots` draws TVW-RL Fig. 4/5 from it (utilisation, fragmentation, machines used, overshoot per load).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl
from scipy import stats

from pipelines.progress import Progress
from sim import core
from sim.config import SimConfig
from sim.core import PENALTY_NAMES
from sim.jobs import SEQUENCE_KEY, JobBatch
from sim.metrics import episode_metrics, episode_trace, machines_lower_bound
from sim.policies import Policy, accepts_profiles, decide, is_learned, make_policy
from sim.profiles import EcProfiles, ProfileConfig, learn_profiles

RESULT_KEY = ("source", "load_pct", "policy", "sequence_id", "seed")
"""Columns identifying one result row."""

METRIC_BETTER: dict[str, str] = {
    **{f"avg_util_{r}_frac": "higher" for r in ("cpu", "mem")},
    **{f"avg_frag_{r}_frac": "lower" for r in ("cpu", "mem")},
    "avg_overshoot_pct": "lower",
    "machines_used": "lower",
    "contention_score_units2": "lower",
    "mean_wait_steps": "lower",
    "n_unplaced": "lower",
    "is_truncated": "lower",
    "episode_return": "higher",
    **{f"cost_{name}": "lower" for name in PENALTY_NAMES},
}
"""Which way each metric of `sim.metrics.episode_metrics` is better; the others (n_steps, machines_lower_bound)
are not scores. `summarise` states it per row (`better`), the tables' column descriptions per column."""

PLOT_METRICS = (
    ("avg_util_cpu_frac", "CPU utilisation"),
    ("avg_util_mem_frac", "Memory utilisation"),
    ("avg_frag_cpu_frac", "CPU fragmentation"),
    ("avg_frag_mem_frac", "Memory fragmentation"),
    ("machines_used", "# machines used"),
    ("avg_overshoot_pct", "% overshoot"),
    ("n_unplaced", "jobs never placed"),
)
"""TVW-RL Fig. 4/5 panels (a)-(f): metric column and title, plus the jobs a policy left unplaced when the
episode cap hit (its utilisation is then over fewer workloads, so read the panels together)."""


def run_episodes(
    policy: Policy, cfg: SimConfig, jobs: JobBatch, seed: int, max_decisions: int | None = None
) -> list[dict[str, float]]:
    """Roll `policy` over the B sequences of `jobs` until every episode ends; metrics per sequence.

    The simulator is reset with `seed` (noise, shape perturbation) and the policy draws from
    default_rng(seed). Raises RuntimeError naming the policy if the episodes do not end within
    `max_decisions` calls (default: a bound no valid rollout reaches: every job placed once, every step held once).
    """
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    trace = core.make_trace(cfg, jobs.batch_size)
    limit = max_decisions or int(jobs.max_jobs + cfg.max_steps + 1)
    for _ in range(limit):
        if state.is_done.all():
            break
        state, actions = decide(policy, cfg, state, rng)
        state, *_ = core.step(cfg, state, actions, trace)
    if not state.is_done.all():
        raise RuntimeError(f"policy {policy.name!r}: episodes not finished after {limit} decisions")
    return [episode_metrics(episode_trace(trace, state, b)) for b in range(jobs.batch_size)]


PolicyFactory = Callable[[str, str, int, int], Policy | None]
"""(policy name, source, load_pct, seed) -> the policy to run on that group with that seed, or None to leave the
combination out (e.g. a learned policy without a trained checkpoint for the group)."""


def evaluate_policies(
    jobs_frame: pl.DataFrame,
    policies: Sequence[str],
    cfg: SimConfig,
    seeds: Sequence[int] = (0,),
    split: str | None = "test",
    profile_cfg: ProfileConfig | None = None,
    make: PolicyFactory | None = None,
    log: Callable[[str], None] | None = None,
    label: str = "evaluate",
) -> pl.DataFrame:
    """One row per (source, load_pct, policy, sequence_id, seed) with every metric of `sim.metrics`.

    `jobs_frame`: `sim__job_sequences` rows; only `split` is evaluated (None: every row). All sequences of a
    (source, load_pct) run as one batch. Policies taking EC profiles get `learn_group_profiles` of the group
    (None when it has no train rows; `profile_cfg` None = `ProfileConfig()`). `make`, when given, builds each
    learned policy (`is_learned`) per (name, source, load, seed) instead (the checkpoint of that seed); heuristics
    are always built here, so profile-taking ones get their group's profiles. Metrics columns: see
    `sim.metrics.episode_metrics`, plus `machines_lower_bound` of the sequence (`sim.metrics.machines_lower_bound`).
    Progress (batches of one policy x seed x group done, rate, time left) goes to `log` (default: the `tvw`
    logger), its lines starting with `label`.
    """
    frame = jobs_frame if split is None else jobs_frame.filter(pl.col("split") == split)
    if frame.height == 0:
        raise ValueError(f"evaluate_policies: no job sequences for split {split!r}")
    rows: list[dict] = []
    groups = frame.group_by("source", "load_pct", maintain_order=True)
    n_groups = frame.select("source", "load_pct").unique().height
    progress = Progress(n_groups * len(policies) * len(seeds), label, log=log, unit="batches")
    for (source, load), group in groups:
        jobs = JobBatch.from_frame(group)
        seq_ids = [key[SEQUENCE_KEY.index("sequence_id")] for key in jobs.sequence_keys]
        profiles = learn_group_profiles(jobs_frame, source, load, cfg, profile_cfg)
        bound = machines_lower_bound(jobs, cfg.capacity_units)
        for name in policies:
            for seed in seeds:
                if make is not None and is_learned(name):
                    policy = make(name, source, load, seed)
                elif accepts_profiles(name):
                    policy = make_policy(name, profiles=profiles)
                else:
                    policy = make_policy(name)
                if policy is None:
                    progress.advance()
                    continue
                episodes = run_episodes(policy, cfg, jobs, seed)
                progress.advance()
                for seq_id, metrics, lb in zip(seq_ids, episodes, bound.tolist(), strict=True):
                    key = dict(zip(RESULT_KEY, (source, load, name, seq_id, seed), strict=True))
                    rows.append({**key, **metrics, "machines_lower_bound": float(lb)})
    if not rows:  # every policy was left out by `make`
        key_schema = {"source": pl.String, "load_pct": pl.Int32, "policy": pl.String}
        return pl.DataFrame(schema={**key_schema, "sequence_id": pl.Int32, "seed": pl.Int64})
    return (
        pl.DataFrame(rows)
        .with_columns(
            pl.col("load_pct").cast(pl.Int32),
            pl.col("sequence_id").cast(pl.Int32),
            pl.col("seed").cast(pl.Int64),
        )
        .sort("source", "load_pct", "policy", "sequence_id", "seed")
    )


def learn_group_profiles(
    jobs_frame: pl.DataFrame,
    source: str,
    load_pct: int,
    cfg: SimConfig,
    profile_cfg: ProfileConfig | None = None,
) -> EcProfiles | None:
    """EC profiles (`sim.profiles.learn_profiles`, cfg.n_labels labels, horizon = the longest train job) from the
    rows of `jobs_frame` with split == "train" and this (source, load_pct); None when there are none."""
    train = jobs_frame.filter(
        (pl.col("split") == "train") & (pl.col("source") == source) & (pl.col("load_pct") == load_pct)
    )
    if train.height == 0:
        return None
    jobs = JobBatch.from_frame(train)
    return learn_profiles(jobs, cfg.n_labels, jobs.max_duration, profile_cfg or ProfileConfig())


def summarise(results: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Mean and t-based `confidence` interval per (source, load_pct, policy, metric), over TEST SEQUENCES.

    Seeds are averaged within a sequence first (a deterministic policy gives the same row for every seed, so
    seeds are not independent samples); the interval is then over the n sequences. Columns: source, load_pct,
    policy, metric, better (METRIC_BETTER: "higher", "lower" or "" for a column that is not a score), n
    (sequences), n_seeds (max seeds per sequence), mean, std, ci_low, ci_high (interval =
    mean -/+ t * std / sqrt(n), t the Student quantile with n - 1 degrees of freedom; equal to the mean when
    n = 1). NaN values of a metric (e.g. mean wait with nothing placed) are left out.
    """
    metric_cols = [c for c in results.columns if c not in RESULT_KEY]
    long = results.unpivot(
        index=["source", "load_pct", "policy", "sequence_id", "seed"],
        on=metric_cols,
        variable_name="metric",
        value_name="value",
    ).filter(pl.col("value").is_not_nan())
    per_sequence = long.group_by(
        "source", "load_pct", "policy", "metric", "sequence_id", maintain_order=True
    ).agg(value=pl.col("value").mean(), n_seeds=pl.len())
    out = per_sequence.group_by("source", "load_pct", "policy", "metric", maintain_order=True).agg(
        n=pl.len(),
        n_seeds=pl.col("n_seeds").max(),
        mean=pl.col("value").mean(),
        std=pl.col("value").std().fill_null(0.0),
    )
    t = np.array([stats.t.ppf(0.5 + confidence / 2, n - 1) if n > 1 else 0.0 for n in out["n"].to_list()])
    half = pl.Series(t) * out["std"] / out["n"].cast(pl.Float64).sqrt()
    better = pl.col("metric").replace_strict(METRIC_BETTER, default="", return_dtype=pl.String)
    return (
        out.with_columns(ci_low=pl.col("mean") - half, ci_high=pl.col("mean") + half, better=better)
        .select(
            "source",
            "load_pct",
            "policy",
            "metric",
            "better",
            "n",
            "n_seeds",
            "mean",
            "std",
            "ci_low",
            "ci_high",
        )
        .sort("source", "load_pct", "policy", "metric")
    )


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
