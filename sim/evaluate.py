"""Evaluation runner: every policy on every test sequence, the metrics table, its summary and TVW-RL-style plots.

`evaluate_policies` runs the batched simulator over all sequences of one (source, load) at once per policy and
seed, and returns one row per (source, load_pct, policy, sequence_id, seed) with every metric of
`sim.metrics.episode_metrics`. Policies that take EC profiles (`sim.policies.accepts_profiles`, e.g.
ec_peak_aware) get the profiles learned once per (source, load) from that group's TRAIN sequences only
(`learn_group_profiles`); the evaluated sequences never feed them. `summarise` gives the mean and a t-based 95 % interval per (source, load, policy,
metric); `assets.plots` draws TVW-RL Fig. 4/5 from it (utilisation, fragmentation, machines used, overshoot per load).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from pipelines.job_sequences import DIVERSITY as DIVERSITY  # re-exported: measured where sequences are built
from pipelines.job_sequences import split_diversity as split_diversity
from pipelines.progress import Progress
from pipelines.synthetic import cluster_of
from sim import core
from sim.config import SimConfig
from sim.core import PENALTY_NAMES
from sim.forecast import UsageForecaster
from sim.jobs import SEQUENCE_KEY, JobBatch
from sim.labelling import Labeller, ServedLabels, labels_by_age
from sim.metrics import episode_metrics, episode_trace, machines_lower_bound
from sim.policies import (
    POLICIES,
    Policy,
    accepts_profiles,
    is_fitted,
    is_learned,
    is_oracle,
    make_policy,
    play,
    policy_kind,
)
from sim.profiles import EcProfiles, ProfileConfig, learn_profiles
from sim.tuning import ChoiceMemo, FitContext, TuningConfig, tuning_preset

RESULT_KEY = ("source", "load_pct", "policy", "sequence_id", "seed")
"""Columns identifying one result row."""

DESCRIPTOR_COLUMNS = ("n_machines", "policy_kind", "is_oracle", "is_learned")
"""Columns of a result row that describe the run, not a metric: the cluster size M, what the policy is
(`sim.policies.POLICY_KINDS`), whether it reads the future (an oracle: a yardstick, never "best") and whether it
is learned."""

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
    trace = core.make_trace(cfg, jobs.batch_size)
    limit = max_decisions or int(jobs.max_jobs + cfg.max_steps + 1)
    state = play(policy, cfg, jobs, seed, trace, limit)
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
    tuning: TuningConfig | None = None,
    forecaster_factory: Callable[[JobBatch, SimConfig], UsageForecaster] | None = None,
    choices: dict | None = None,
    serve_labels: Callable[[str], Labeller | None] | None = None,
    choice_memo: ChoiceMemo | None = None,
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
    Fitted rules (`sim.policies.is_fitted`: the hybrid, Google's peak predictors, the forecast-driven rules) are
    fitted once per (source, load) from that group's TRAIN sequences only (`sim.tuning.FitContext` with `tuning`
    and `forecaster_factory`; validation sequences are carved from the training split); what validation chose
    goes into `choices[(source, load_pct)][policy]` when a dict is given. A fitted rule that cannot be fitted
    (no training sequences, or no forecaster factory for one that needs it) is left out and logged.
    `serve_labels(source)`, when given, is the labeller whose labels every policy sees on that source's test
    sequences (`sim.labelling.ServedLabels`: TVW-RL's Algorithm 1, a classifier's guess from meta and observed
    usage), instead of the clustering labels the sequences carry, which were computed from each workload's whole
    series, its future included; None for a source keeps the sequences' labels (synthetic classes are known at
    arrival). The fitted rules are validated with the same labeller's labels, and a table keyed by EC label
    (`forecast_peak`'s) is fitted on the labels it serves at each age (`sim.tuning.FitContext.labeller`), and so
    are the EC profiles (`ec_peak_aware`, `learn_group_profiles`) and the learned forecaster's EC inputs (the
    forecaster factory is handed the labeller). `choice_memo` remembers the fitted rules' validation choices on disk
    (`sim.tuning.ChoiceMemo`: the learned placer's base rule, the same rule on the same sequences, reuses them).
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
        labeller = None if serve_labels is None else serve_labels(source)
        profiles = learn_group_profiles(jobs_frame, source, load, cfg, profile_cfg, labeller)
        bound = machines_lower_bound(jobs, cfg.capacity_units)
        fit_ctx = _fit_context(
            jobs_frame, source, load, cfg, tuning, forecaster_factory, labeller, choice_memo
        )
        fitted = {name: _fit(name, fit_ctx, log) for name in policies if is_fitted(name)}
        if fitted and fit_ctx is not None and not fit_ctx.validation_disjoint():
            (log or (lambda msg: None))(
                f"{source} {load} %: the fitted rules' validation sequences share workloads with their fit "
                "sequences (TuningConfig.validation_share differs from the sequences' validation_share, or the "
                "training split is too small): validation is in sample"
            )
        if choices is not None and fit_ctx is not None:
            choices[(source, load)] = fit_ctx.choices
        for name in policies:
            for seed in seeds:
                if name in fitted:
                    policy = fitted[name]
                elif make is not None and is_learned(name):
                    policy = make(name, source, load, seed)
                elif accepts_profiles(name):
                    policy = make_policy(name, profiles=profiles)
                else:
                    policy = make_policy(name)
                if policy is None:
                    progress.advance()
                    continue
                if labeller is not None:
                    policy = ServedLabels(policy, labeller)
                episodes = run_episodes(policy, cfg, jobs, seed)
                progress.advance()
                for seq_id, metrics, lb in zip(seq_ids, episodes, bound.tolist(), strict=True):
                    key = dict(zip(RESULT_KEY, (source, load, name, seq_id, seed), strict=True))
                    rows.append(
                        {**key, **describe_policy(name, cfg), **metrics, "machines_lower_bound": float(lb)}
                    )
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


def describe_policy(name: str, cfg: SimConfig) -> dict:
    """The DESCRIPTOR_COLUMNS of a result row of policy `name` on the cluster `cfg`."""
    return {
        "n_machines": cfg.n_machines,
        "policy_kind": policy_kind(name),
        "is_oracle": is_oracle(name),
        "is_learned": is_learned(name),
    }


def _fit_context(
    jobs_frame: pl.DataFrame,
    source: str,
    load_pct: int,
    cfg: SimConfig,
    tuning: TuningConfig | None,
    forecaster_factory,
    labeller: Labeller | None = None,
    memo: ChoiceMemo | None = None,
) -> FitContext | None:
    """The FitContext of one (source, load) from its TRAIN rows; None when it has none."""
    train = jobs_frame.filter(
        (pl.col("split") == "train") & (pl.col("source") == source) & (pl.col("load_pct") == load_pct)
    )
    if train.height == 0:
        return None
    return FitContext(
        cfg=cfg,
        train=JobBatch.from_frame(train),
        tuning=tuning or TuningConfig(),
        forecaster_factory=forecaster_factory,
        where=f"{source} {load_pct} %",
        labeller=labeller,
        memo=memo,
    )


def _fit(name: str, ctx: FitContext | None, log: Callable[[str], None] | None) -> Policy | None:
    """The fitted rule `name` for the context's group, or None (logged) when it cannot be fitted there."""
    say = log or (lambda msg: None)
    if ctx is None:
        say(f"{name}: no training sequences to fit it on: left out")
        return None
    policy = POLICIES[name].fit(ctx)
    if policy is None:
        say(f"{name} ({ctx.where}): cannot be fitted (it needs a learned forecaster): left out")
    return policy


def learn_group_profiles(
    jobs_frame: pl.DataFrame,
    source: str,
    load_pct: int,
    cfg: SimConfig,
    profile_cfg: ProfileConfig | None = None,
    labeller: Labeller | None = None,
) -> EcProfiles | None:
    """EC profiles (`sim.profiles.learn_profiles`, cfg.n_labels labels, horizon = the longest train job) from the
    rows of `jobs_frame` with split == "train" and this (source, load_pct); None when there are none. With a
    `labeller` that labels by age (`label_table`), they are fitted on the labels it serves at each age (the view
    `sim.labelling.ServedLabels` gives the policy at test time); otherwise on the clustering labels."""
    train = jobs_frame.filter(
        (pl.col("split") == "train") & (pl.col("source") == source) & (pl.col("load_pct") == load_pct)
    )
    if train.height == 0:
        return None
    jobs = JobBatch.from_frame(train)
    served = labels_by_age(labeller, cfg, jobs)
    return learn_profiles(jobs, cfg.n_labels, jobs.max_duration, profile_cfg or ProfileConfig(), served)


def summarise(results: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Mean and t-based `confidence` interval per (source, load_pct, policy, metric), over TEST SEQUENCES.

    Seeds are averaged within a sequence first (a deterministic policy gives the same row for every seed, so
    seeds are not independent samples); the interval is then over the n sequences. Columns: source, load_pct,
    policy, metric, better (METRIC_BETTER: "higher", "lower" or "" for a column that is not a score), n
    (sequences), n_seeds (max seeds per sequence), mean, std, ci_low, ci_high (interval =
    mean -/+ t * std / sqrt(n), t the Student quantile with n - 1 degrees of freedom; equal to the mean when
    n = 1). NaN values of a metric (e.g. mean wait with nothing placed) are left out.
    """
    metric_cols = [c for c in results.columns if c not in RESULT_KEY and c not in DESCRIPTOR_COLUMNS]
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
    kinds = [c for c in ("policy_kind", "is_oracle", "is_learned") if c in results.columns]
    if kinds:
        out = out.join(results.select("policy", *kinds).unique("policy"), on="policy", how="left")
    return (
        out.with_columns(ci_low=pl.col("mean") - half, ci_high=pl.col("mean") + half, better=better)
        .select(
            "source",
            "load_pct",
            "policy",
            *kinds,
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


TRUTH_OF = {
    "forecast_risk": "forecast_risk_truth",
    "forecast_risk_nodur": "forecast_risk_truth",
    "forecast_risk_recall": "forecast_risk_truth",
    "forecast_recall_hybrid": "forecast_risk_truth",
    "forecast_recall_hybrid_nodur": "forecast_risk_truth",
    "forecast_peak": "forecast_risk_truth",
    "forecast_peak_adaptive": "forecast_risk_truth",
    "forecast_peak_adaptive_amount": "forecast_risk_truth",
    "forecast_peak_adaptive_exceed": "forecast_risk_truth",
    "forecast_peak_exceed_guard": "forecast_risk_truth",
    "forecast_peak_exceed_guard_mask": "forecast_risk_truth",
    "forecast_peak_overshoot_guard": "forecast_risk_truth",
    "forecast_peak_overshoot_budget": "forecast_risk_truth",
    "forecast_peak_replay": "forecast_risk_truth",
    "forecast_peak_charge": "forecast_risk_truth",
    "forecast_peak_charge_guard": "forecast_risk_truth",
    "forecast_peak_charge_guard90": "forecast_risk_truth",
    "forecast_peak_nodur": "forecast_risk_truth",
    "forecast_peak_noec": "forecast_risk_truth",
}
"""Forecast-driven rule -> the same rule on the true future usage (its information gap's yardstick)."""

GAP_TABLE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "n_machines": pl.Int64,
    "policy": pl.String,
    "policy_kind": pl.String,
    "is_oracle": pl.Boolean,
    "is_learned": pl.Boolean,
    "n_sequences": pl.Int64,
    "mean_return": pl.Float64,
    "best_heuristic": pl.String,
    "best_heuristic_return": pl.Float64,
    "diff_vs_best_heuristic": pl.Float64,
    "diff_ci_low": pl.Float64,
    "diff_ci_high": pl.Float64,
    "n_sequences_better": pl.Int64,
    "is_significantly_better": pl.Boolean,
    "is_significantly_worse": pl.Boolean,
    "oracle": pl.String,
    "oracle_return": pl.Float64,
    "gap_closed_frac": pl.Float64,
    "truth_return": pl.Float64,
    "information_gap": pl.Float64,
    "avg_overshoot_pct": pl.Float64,
    "tetris_overshoot_pct": pl.Float64,
    "machines_used": pl.Float64,
    "tetris_machines_used": pl.Float64,
}
"""One row per (source, load, policy) of `gap_table`."""


def _per_sequence(results: pl.DataFrame) -> pl.DataFrame:
    """Seeds averaged within each (source, load, policy, sequence)."""
    return results.group_by("source", "load_pct", "policy", "sequence_id").agg(
        pl.col("episode_return").mean(), pl.col("avg_overshoot_pct").mean(), pl.col("machines_used").mean()
    )


def _paired(diff: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """(mean, low, high) of a t-interval of paired differences."""
    n = diff.size
    mean = float(diff.mean()) if n else float("nan")
    if n < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * float(diff.std(ddof=1)) / np.sqrt(n)
    return mean, mean - half, mean + half


def gap_table(results: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Per (source, load) and policy: its mean return against the best NON-ORACLE heuristic of that cell (the
    request-based ones, the hybrid and Google's predictors; chosen by test mean, so the comparison is against the
    strongest), the paired difference by test sequence with its t-interval, the best oracle's return (a
    yardstick: never "best"), the share of the heuristic-to-oracle gap the policy closes, and for a forecast-driven
    rule the same rule on the true future (`TRUTH_OF`): its information gap. Overshoot and machines used sit
    beside Tetris's. Needs the DESCRIPTOR_COLUMNS (`evaluate_policies` writes them); `noop` is left out."""
    if results.is_empty():
        return pl.DataFrame(schema=GAP_TABLE)
    kinds = results.select("policy", "policy_kind", "is_oracle", "is_learned", "n_machines").unique("policy")
    seq = _per_sequence(results.filter(pl.col("policy") != "noop")).join(
        kinds.select("policy", "policy_kind", "is_oracle"), on="policy"
    )
    rows = []
    for (source, load), cell in seq.group_by("source", "load_pct", maintain_order=True):
        means = cell.group_by("policy", "policy_kind", "is_oracle").agg(
            pl.col("episode_return").mean(),
            pl.col("avg_overshoot_pct").mean(),
            pl.col("machines_used").mean(),
        )
        heur = means.filter((pl.col("policy_kind") == "heuristic") & ~pl.col("is_oracle"))
        if heur.is_empty():
            continue
        # ties (two heuristics with the same mean: DeepRM's SJF and Packer often decide alike) go to the first name,
        # whatever order group_by gave
        by_return = dict(by=["episode_return", "policy"], descending=[True, False])
        best = heur.sort(**by_return).row(0, named=True)
        oracles = means.filter(pl.col("is_oracle")).sort(**by_return)
        oracle = oracles.row(0, named=True) if oracles.height else None
        tetris = means.filter(pl.col("policy") == "tetris")
        by_policy = {p: g.sort("sequence_id") for (p,), g in cell.group_by("policy")}
        base = by_policy[best["policy"]]
        for m in means.sort("policy").iter_rows(named=True):
            mine = by_policy[m["policy"]].join(base, on="sequence_id", suffix="_base")
            diff = (mine["episode_return"] - mine["episode_return_base"]).to_numpy()
            mean, low, high = _paired(diff, confidence)
            span = (oracle["episode_return"] - best["episode_return"]) if oracle else float("nan")
            truth = means.filter(pl.col("policy") == TRUTH_OF.get(m["policy"], ""))
            truth_return = truth["episode_return"][0] if truth.height else None
            rows.append(
                {
                    "source": source,
                    "load_pct": load,
                    "policy": m["policy"],
                    "n_sequences": int(diff.size),
                    "mean_return": m["episode_return"],
                    "best_heuristic": best["policy"],
                    "best_heuristic_return": best["episode_return"],
                    "diff_vs_best_heuristic": mean,
                    "diff_ci_low": low,
                    "diff_ci_high": high,
                    "n_sequences_better": int((diff > 0).sum()),
                    "is_significantly_better": bool(low > 0),
                    "is_significantly_worse": bool(high < 0),
                    "oracle": oracle["policy"] if oracle else None,
                    "oracle_return": oracle["episode_return"] if oracle else None,
                    "gap_closed_frac": mean / span if oracle and span > 0 else None,
                    "truth_return": truth_return,
                    "information_gap": truth_return - m["episode_return"]
                    if truth_return is not None
                    else None,
                    "avg_overshoot_pct": m["avg_overshoot_pct"],
                    "tetris_overshoot_pct": tetris["avg_overshoot_pct"][0] if tetris.height else None,
                    "machines_used": m["machines_used"],
                    "tetris_machines_used": tetris["machines_used"][0] if tetris.height else None,
                }
            )
    out = (
        pl.DataFrame(rows, schema_overrides={k: v for k, v in GAP_TABLE.items() if k in rows[0]})
        if rows
        else None
    )
    if out is None:
        return pl.DataFrame(schema=GAP_TABLE)
    out = out.join(kinds, on="policy", how="left")
    return out.select([pl.col(c).cast(t) for c, t in GAP_TABLE.items()]).sort("source", "load_pct", "policy")


# --- the evaluation assets' runs -----------------------------------------------------------------------------

EVAL_LOADS = (30, 50, 80)
"""Loads the evaluation is partitioned by (TVW-RL's 30/50/80 %), as the training runs are."""


def eval_partition_keys(loads_pct: Sequence[int]) -> list[str]:
    """The evaluation partitions ('load50') of the configured loads (`sim__job_sequences.loads_pct`), in order;
    ValueError naming the loads that have no partition (their sequences could never be evaluated)."""
    missing = [load for load in loads_pct if load not in EVAL_LOADS]
    if missing:
        raise ValueError(
            f"sim__job_sequences.loads_pct {list(loads_pct)}: load(s) {missing} have no evaluation partition "
            f"(eval__baselines is partitioned by {list(EVAL_LOADS)} %, as the training runs)"
        )
    return [f"load{load}" for load in loads_pct]


def parse_eval_partition(key: str) -> int:
    """'load50' -> 50; ValueError naming the known keys otherwise."""
    known = eval_partition_keys(EVAL_LOADS)
    if key not in known:
        raise ValueError(f"unknown evaluation partition {key!r}; known: {known}")
    return int(key.removeprefix("load"))


def sequences_at_load(sequences: pl.DataFrame, load_pct: int, where: str) -> pl.DataFrame:
    """The rows of `sequences` (`sim__job_sequences`) at `load_pct`; ValueError starting with `where` and naming
    the loads that have test sequences when it has none at that load."""
    jobs = sequences.filter(pl.col("load_pct") == load_pct)
    if jobs.filter(pl.col("split") == "test").is_empty():
        have = sorted(sequences.filter(pl.col("split") == "test")["load_pct"].unique().to_list())
        raise ValueError(
            f"{where}: sim__job_sequences has no test sequences at {load_pct} % (loads with test sequences: "
            f"{have}); evaluate only the loads of sim__job_sequences.loads_pct"
        )
    return jobs


@dataclass(frozen=True)
class EvalSettings:
    """How the registered heuristics are evaluated on the test sequences (`eval__baselines`)."""

    policies: tuple[str, ...] = tuple(sorted(p for p in POLICIES if not is_learned(p)))
    """Registered heuristics to evaluate (learned policies are evaluated by eval__results)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Simulator/policy seeds per test sequence."""
    n_machines: int = 10
    """M (TVW-RL: 10)."""
    max_steps: int = 1000
    """Safety cap in logical steps: an episode runs until every job is placed and finished; hitting the cap is a
    failure, reported per episode (is_truncated) and charged for unplaced jobs."""
    hold_rule: str = "always"
    """'always' (DeepRM's void action) or 'no_fit' (TVW-RL: hold only when nothing fits)."""
    noise_max_units: int = 0
    """Background noise 0..n units (robustness study: 1-3)."""
    forecaster_preset: str = "sample"
    """Preset of the learned usage forecaster (its FORECAST_PRESETS) the forecast-driven rules use, fitted per
    source and load on its training sequences."""
    tuning_preset: str = "full"
    """Grid of knobs the fitted rules try on validation sequences (`sim.tuning.TUNING_PRESETS`: full, quick)."""
    validation_share: float = TuningConfig.validation_share
    """Share of each (source, load)'s training sequences held out to choose the fitted rules' knobs (risk level,
    rho, mode, N, fallback heuristic); test sequences are never used."""
    overshoot_budget_pct: float | None = TuningConfig.overshoot_budget_pct
    """Validation overshoot (percentage points) a fitted rule's chosen setting may show above Tetris's on the
    same validation sequences (`sim.tuning.TuningConfig.overshoot_budget_pct`; None: choose on return alone)."""
    cross_fit: bool = False
    """Choose on both folds of the training split (`sim.tuning.TuningConfig.cross_fit`: a rule that learns from
    its fit part is refitted on the validation part and validated on the fit part too)."""
    cross_fit_sequences: int | None = None
    """With `cross_fit`: at most this many fit-part sequences validate the second fold
    (`sim.tuning.TuningConfig.cross_fit_sequences`; None: all)."""
    choice_z: float = TuningConfig.choice_z
    """How cautiously validation chooses a fitted rule's setting (`sim.tuning.TuningConfig.choice_z`: the lower
    bound mean - z x se of its paired gain over the fallback; 0: the best mean return)."""

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("EvalSettings.seeds: at least one seed")
        self.tuning()  # an unknown preset fails here, naming it

    def tuning(self) -> TuningConfig:
        """The fitted rules' TuningConfig: the preset's grid, this validation share, overshoot budget,
        cross-fitting and caution of the choice, the first seed."""
        args = (self.tuning_preset, self.validation_share, self.seeds[0], self.overshoot_budget_pct)
        return tuning_preset(
            *args,
            cross_fit=self.cross_fit,
            cross_fit_sequences=self.cross_fit_sequences,
            choice_z=self.choice_z,
        )


def eval_sim_config(asset: str, settings: Any, jobs: pl.DataFrame) -> SimConfig:
    """The simulator an evaluation asset runs: its settings' M, safety cap, hold rule (default "always") and
    noise (any object with those attributes and `policies`), labels covering every job of `jobs`, oversized
    jobs clipped and counted. ValueError naming the asset on a policy that is neither registered nor an
    importable "module:attr"."""
    unknown = [p for p in settings.policies if p not in POLICIES and ":" not in p]
    if unknown:
        raise ValueError(f"{asset}: unknown policies {unknown}; registered: {sorted(POLICIES)}")
    return SimConfig(
        n_machines=settings.n_machines,
        max_steps=settings.max_steps,
        hold_rule=getattr(settings, "hold_rule", "always"),
        n_labels=max(SimConfig().n_labels, int(jobs["ec_label"].max() or 0) + 1),
        noise_max_units=settings.noise_max_units,
        oversize="clip",
    )


def source_clusters(jobs: pl.DataFrame, n_machines: int, arrival_steps: int) -> dict[str, tuple[int, int]]:
    """Per source of `jobs`: (machines M, arrival window in steps) its load labels refer to: a synthetic
    workload's own cluster (`pipelines.synthetic.cluster_of`), the trace sources' (n_machines, arrival_steps)."""
    return {s: cluster_of(s, n_machines, arrival_steps) for s in jobs["source"].unique().to_list()}


def evaluate_by_cluster(
    jobs: pl.DataFrame,
    policies: Sequence[str],
    cfg: SimConfig,
    seeds: Sequence[int],
    make: PolicyFactory | None = None,
    log: Callable[[str], None] | None = None,
    **fit_kwargs,
) -> pl.DataFrame:
    """`evaluate_policies` on the test split, each source on the cluster its loads refer to (`source_clusters`:
    a synthetic workload on its own, the rest on cfg.n_machines). Learned policies built for another cluster
    size are left out of a source whose M differs (their state space would not match). `log` gets the progress
    lines, one series per cluster size M."""
    clusters = source_clusters(jobs, cfg.n_machines, 0)  # the arrival window plays no part here
    frames = []
    for m in sorted({m for m, _ in clusters.values()}):
        sources = [s for s, (n, _) in clusters.items() if n == m]
        part = jobs.filter(pl.col("source").is_in(sources))
        names = policies if m == cfg.n_machines else [p for p in policies if not is_learned(p)]
        if names and part.filter(pl.col("split") == "test").height:
            sim = dataclasses.replace(cfg, n_machines=m)
            frames.append(
                evaluate_policies(
                    part,
                    names,
                    sim,
                    seeds=seeds,
                    split="test",
                    make=make,
                    log=log,
                    label=f"evaluate on M={m}",
                    **fit_kwargs,
                )
            )
    if not frames:
        raise ValueError(f"no test sequences to evaluate {list(policies)} on (sources: {sorted(clusters)})")
    return pl.concat(frames, how="diagonal_relaxed").sort(list(RESULT_KEY))


def fitted_rule_choices(choices: dict) -> dict[str, dict]:
    """What validation chose for each fitted rule (`evaluate_policies`' `choices`), per "source load%", the
    settings tried left out."""
    return {
        f"{source} {load}%": {
            name: {k: v for k, v in knobs.items() if k != "tried"} for name, knobs in per_rule.items()
        }
        for (source, load), per_rule in choices.items()
    }


EVAL_CHECK_DOCS = {
    "noop_has_the_worst_return": "At every (source, load), the policy that never places has the lowest mean "
    "episode return: withholding work must never pay.",
    "utilisation_within_capacity": "No episode reports average utilisation above 1 (usage above capacity is "
    "overshoot, not utilisation).",
    "only_noop_hits_the_safety_cap": "Every policy but noop finishes every episode before the safety cap (a "
    "truncated episode is a failure).",
    "one_row_per_episode": "Exactly one row per (source, load, policy, test sequence, seed), and policies differ: "
    "not every policy gives identical numbers in a (source, load).",
}
"""The checks of `eval_check_values`: name -> what passing means."""


def eval_check_values(results: pl.DataFrame, n_expected: int) -> dict[str, tuple[bool, dict[str, Any]]]:
    """Check name -> (passed, metadata) of an evaluation table: noop has the worst mean return at every (source,
    load), no utilisation above 1, only noop hits the safety cap, one row per episode (`n_expected`) and
    policies that differ somewhere in every (source, load)."""
    mean = results.group_by("source", "load_pct", "policy").agg(pl.col("episode_return").mean())
    worst = mean.sort("episode_return").group_by("source", "load_pct").first()
    has_noop = "noop" in results["policy"].unique().to_list()
    bad_noop = worst.filter(pl.col("policy") != "noop") if has_noop else worst.head(0)
    util_cols = [c for c in results.columns if c.startswith("avg_util_")]
    over = results.filter(pl.any_horizontal(pl.col(c) > 1.0 + 1e-9 for c in util_cols))
    cut = results.filter((pl.col("policy") != "noop") & (pl.col("is_truncated") > 0))
    per_group = (
        results.drop("policy", "seed", "sequence_id")
        .group_by("source", "load_pct")
        .agg(pl.all().exclude("source", "load_pct").n_unique())
    )
    metric_cols = [c for c in per_group.columns if c not in ("source", "load_pct")]
    identical = per_group.filter(pl.all_horizontal(pl.col(c) <= 1 for c in metric_cols))
    dup = results.height - results.select(RESULT_KEY).unique().height
    return {
        "noop_has_the_worst_return": (
            has_noop and bad_noop.height == 0,
            {"groups_where_another_policy_is_worst": bad_noop.to_dicts(), "noop_evaluated": has_noop},
        ),
        "utilisation_within_capacity": (over.height == 0, {"n_rows_above_1": over.height}),
        "only_noop_hits_the_safety_cap": (
            cut.height == 0,
            {"n_truncated_episodes": cut.height, "policies": sorted(set(cut["policy"].to_list()))},
        ),
        "one_row_per_episode": (
            dup == 0 and results.height == n_expected and identical.height == 0,
            {
                "n_rows": results.height,
                "n_expected": n_expected,
                "n_duplicate_keys": dup,
                "groups_with_identical_policies": identical.select("source", "load_pct").to_dicts(),
            },
        ),
    }


SUMMARY_CHECK_DOCS = {
    "policies_differ_in_every_cell": "Rows, every mean finite, and in no (source, load) with two or more policies "
    "do all of them have the same mean episode return (a degenerate evaluation).",
}
"""The check of a summary table (`summarise`; `summary_check_values`): name -> what passing means."""


def summary_check_values(summary: pl.DataFrame) -> dict[str, tuple[bool, dict[str, Any]]]:
    """Check name (SUMMARY_CHECK_DOCS) -> (passed, metadata) of a `summarise` table."""
    returns = summary.filter(pl.col("metric") == "episode_return")
    per_cell = returns.group_by("source", "load_pct").agg(
        pl.col("policy").n_unique().alias("n_policies"), pl.col("mean").n_unique().alias("n_means")
    )
    flat = per_cell.filter((pl.col("n_policies") > 1) & (pl.col("n_means") < 2))
    n_bad = summary.filter(~pl.col("mean").is_finite()).height
    return {
        "policies_differ_in_every_cell": (
            returns.height > 0 and flat.is_empty() and n_bad == 0,
            {
                "n_cells": per_cell.height,
                "cells_with_one_mean": flat.select("source", "load_pct")
                .sort("source", "load_pct")
                .to_dicts(),
                "n_non_finite_means": n_bad,
            },
        )
    }
