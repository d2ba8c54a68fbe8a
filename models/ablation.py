"""TVW-RL's ablations (its Tables 2-3, at 50 % load) and the trend of a learning curve.

An ablation run is TVW-RL trained with one setting changed (`ABLATIONS`: a penalty weight, training noise, shape
noise, the EC mapping, or the advantage scaling), then tested greedily on the source's test sequences at
background noise 0..3 units in the UNABLATED preset's simulator (`ablation_test_sim`), so every run's return
compares with the heuristics' and with the other runs'. `ablation_winners` ranks each run against the heuristics
on the same test sequences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from models.reinforce import ADVANTAGE_MODES
from models.tvw_rl import TvwRlConfig, TvwRlPolicy, TvwRlTrainConfig, train_tvw_rl
from pipelines.equivalence import EC_METHODS
from pipelines.synthetic import is_synthetic
from sim.config import SimConfig
from sim.evaluate import evaluate_policies
from sim.jobs import JobBatch

ABLATIONS: dict[str, tuple] = {
    "k_underutil": (0.0, 1.0, 2.0, 3.0),  # TVW-RL Table 3
    "k_overshoot": (0.0, 15000.0, 30000.0, 45000.0),
    "k_contention": (0.0, 0.1, 1.0, 10.0),
    "train_noise": (0, 1, 2, 3),  # Table 2: trained with background noise of 0..n units, tested at 0..3
    "shape_noise": (0, 1),  # trained with usage shapes perturbed by -1..1 units (1) or not (0)
    # Table 2: w/o EC (every job labelled 0), or each clustering method's own mapping
    "ec_mapping": ("none", "aggregate", "dtw", "temporal"),
    "advantage": ADVANTAGE_MODES,  # reward scale: does the advantage scaling change which policy wins?
}
"""TVW-RL's ablations (its Tables 2-3, at 50 % load): setting -> values; one training run per value."""

ABLATION_KEYS = tuple(f"{k}={v}" for k, vals in ABLATIONS.items() for v in vals)
"""One run per (setting, value): 'k_underutil=0.0', ..."""

TEST_NOISE_UNITS = (0, 1, 2, 3)
"""Background noise levels (0..n units) of an ablation run's test episodes."""

ABLATION_RESULTS = {
    "ablation": pl.String,
    "value": pl.String,
    "source": pl.String,
    "load_pct": pl.Int32,
    "eval_noise_units": pl.Int32,  # background noise 0..n units in the test episodes
    "sequence_id": pl.Int32,
    "avg_util_cpu_frac": pl.Float64,
    "avg_util_mem_frac": pl.Float64,
    "avg_frag_cpu_frac": pl.Float64,
    "avg_frag_mem_frac": pl.Float64,
    "avg_overshoot_pct": pl.Float64,
    "machines_used": pl.Float64,
    "n_unplaced": pl.Float64,
    "episode_return": pl.Float64,
}
"""Columns of `rl__ablation`: one row per (noise level, test sequence) of one run."""


@dataclass(frozen=True)
class AblationConfig:
    """An ablation run: where it trains and tests, and the TVW-RL preset it changes one setting of."""

    source: str = "google2011_derived"
    """source whose sequences train and test (a real source: the ec_mapping ablation relabels its workloads with
    each clustering method's mapping)"""
    load_pct: int = 50
    """load of the ablation (TVW-RL: 50 %)"""
    preset: str = "paper"
    """'paper', 'study' or 'short' training preset"""
    n_iterations: int = 0
    """override the preset's iterations (0 = keep)"""
    learning_rate: float = 0.0
    """override the preset's learning rate (0 = keep)"""
    seed: int = 0
    """training seed"""

    def __post_init__(self) -> None:
        self.base()  # an unknown preset fails here, naming itself

    def base(self) -> TvwRlConfig:
        """The unablated TVW-RL run (the agent sees the clustering labels: no classifier in an ablation)."""
        train = TvwRlTrainConfig(
            preset=self.preset, n_iterations=self.n_iterations, learning_rate=self.learning_rate
        )
        return train.run_config(self.seed, is_label_known=True)


def parse_ablation(key: str) -> tuple[str, str]:
    """'k_underutil=0.0' -> ('k_underutil', '0.0')."""
    setting, value = key.split("=")
    return setting, value


def ablation_config(base: TvwRlConfig, setting: str, value: str) -> TvwRlConfig:
    """`base` with one ablation setting applied (`ABLATIONS`)."""
    if setting in ("k_underutil", "k_overshoot", "k_contention"):
        return base.with_sim(**{setting: float(value)})
    if setting == "train_noise":
        return base.with_sim(noise_max_units=int(value))
    if setting == "shape_noise":
        return base.with_sim(is_shape_perturbed=bool(int(value)))
    if setting == "ec_mapping":
        return base
    if setting == "advantage":
        return dataclasses.replace(base, reinforce=dataclasses.replace(base.reinforce, advantage=value))
    raise ValueError(f"unknown ablation {setting!r}; known: {sorted(ABLATIONS)}")


def ablation_test_sim(base: TvwRlConfig, noise_units: int) -> SimConfig:
    """The simulator an ablation run is tested in: the UNABLATED preset's (penalty weights included, so every
    run's return compares with the heuristics' and with the other runs'; a run trained with K_o = 0 is not
    rewarded at test for ignoring overshoot), whole test sequences, background noise 0..`noise_units` units, no
    shape noise, the evaluation's safety cap."""
    return dataclasses.replace(
        base.sim,
        noise_max_units=noise_units,
        is_shape_perturbed=False,
        max_steps=1000,
        jobs_per_episode=None,
        oversize="clip",
    )


def relabel_jobs(
    jobs: pl.DataFrame,
    value: str,
    labels_of: Callable[[str], pl.DataFrame],
    source: str,
    log: Callable[[str], None] = print,
) -> pl.DataFrame:
    """TVW-RL Table 2's EC-mapping rows: every job of `jobs` labelled 0 ("none": no EC knowledge), or labelled
    with `value`'s mapping (aggregate, dtw or temporal; `labels_of(method)` gives its (workload_id, k, ec_label)
    rows) looked up by workload. Workloads the mapping does not cover (kept by the sequences, but skipped by the
    clustering) get label 0 and are counted in the log."""
    if value == "none":
        return jobs.with_columns(ec_label=pl.lit(0, pl.Int32))
    if value not in EC_METHODS:
        raise ValueError(f"ec_mapping={value!r}: unknown; known: none, {', '.join(sorted(EC_METHODS))}")
    labels = labels_of(value)
    if labels.height == 0:
        synthetic = " (a synthetic source: its job classes are known, it has no EC mapping)"
        raise ValueError(
            f"ec_mapping={value}: ec__method_assignments has no {value} mapping of {source}"
            f"{synthetic if is_synthetic(source) else ''}; choose a real source with an EC mapping"
        )
    out = jobs.drop("ec_label").join(
        labels.select("workload_id", pl.col("ec_label").cast(pl.Int32)), on="workload_id", how="left"
    )
    uncovered = out.filter(pl.col("ec_label").is_null())["workload_id"].n_unique()
    log(
        f"ec_mapping={value}: {source} relabelled with the {value} mapping (k = {labels['k'][0]}); "
        f"{uncovered} of {jobs['workload_id'].n_unique()} workloads uncovered -> label 0"
    )
    return out.with_columns(pl.col("ec_label").fill_null(0)).select(jobs.columns)


def run_ablation(
    group: pl.DataFrame, key: str, cfg: AblationConfig, path: Path, log: Callable[[str], None] = print
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One ablation run `key` ('setting=value') on the sequences `group` (one source and load, already
    relabelled for an ec_mapping run): trained on the train split, its checkpoint at `path`, tested greedily on
    the test split at each of TEST_NOISE_UNITS. Returns (ABLATION_RESULTS rows, the learning curve with its
    source, load_pct and seed)."""
    setting, value = parse_ablation(key)
    train, test = group.filter(pl.col("split") == "train"), group.filter(pl.col("split") == "test")
    if train.height == 0 or test.height == 0:
        raise ValueError(
            f"rl__ablation {key}: no train or test sequences for {cfg.source} at {cfg.load_pct} %"
        )
    base = cfg.base()
    curve = train_tvw_rl(
        JobBatch.from_frame(train), ablation_config(base, setting, value), None, path, log=log
    )
    policy = TvwRlPolicy(path)
    frames = []
    for noise in TEST_NOISE_UNITS:
        sim = ablation_test_sim(base, noise)
        res = evaluate_policies(test, ["tvw_rl"], sim, seeds=[cfg.seed], make=lambda *_: policy)
        frames.append(res.with_columns(eval_noise_units=pl.lit(noise, pl.Int32)))
    out = pl.concat(frames).with_columns(ablation=pl.lit(setting), value=pl.lit(value))
    curve_rows = pl.DataFrame(curve).with_columns(
        source=pl.lit(cfg.source), load_pct=pl.lit(cfg.load_pct), seed=pl.lit(cfg.seed)
    )
    return out.select([pl.col(c).cast(t) for c, t in ABLATION_RESULTS.items()]), curve_rows


def ablation_table(runs: pl.DataFrame) -> pl.DataFrame:
    """TVW-RL Tables 2-3 from the ablation runs: per (ablation, value, test noise) the mean over test sequences of
    every metric of ABLATION_RESULTS and the number of sequences."""
    keys = ("ablation", "value", "eval_noise_units", "sequence_id", "source", "load_pct")
    metrics = [c for c in ABLATION_RESULTS if c not in keys]
    return (
        runs.group_by("ablation", "value", "eval_noise_units")
        .agg([pl.col(c).mean() for c in metrics], n_sequences=pl.len())
        .sort("ablation", "value", "eval_noise_units")
    )


def ablation_winners(ablations: pl.DataFrame, baselines: pl.DataFrame) -> pl.DataFrame:
    """Per ablation run (ablation, value) at test noise 0: the TVW-RL variant's mean return and utilisation
    beside the heuristics' on the same source, load and test sequences (`eval__baselines`), the policy with the
    best mean return among them all (`winner_by_return`) and the TVW-RL variant's rank by return (1 = best).
    Reading the `advantage` rows together answers whether the advantage scaling changes which policy wins."""
    runs = ablations.filter(pl.col("eval_noise_units") == 0)
    rows = []
    for (setting, value, source, load), run in runs.group_by(
        "ablation", "value", "source", "load_pct", maintain_order=True
    ):
        ids = run["sequence_id"].unique()
        base = baselines.filter(
            (pl.col("source") == source) & (pl.col("load_pct") == load) & pl.col("sequence_id").is_in(ids)
        )
        columns = ["episode_return", "avg_util_cpu_frac", "avg_overshoot_pct"]
        means = (
            pl.concat(
                [base.select("policy", *columns), run.select(pl.lit("tvw_rl").alias("policy"), *columns)]
            )
            .group_by("policy")
            .agg(pl.all().mean())
            .sort("episode_return", descending=True)
        )
        rank = means["policy"].to_list().index("tvw_rl") + 1
        rows.append(
            {
                "ablation": setting,
                "value": value,
                "source": source,
                "load_pct": load,
                "n_policies": means.height,
                "winner_by_return": means["policy"][0],
                "tvw_rl_rank_by_return": rank,
                "tvw_rl_return": means.filter(pl.col("policy") == "tvw_rl")["episode_return"][0],
                "best_baseline_return": means.filter(pl.col("policy") != "tvw_rl")["episode_return"].max(),
            }
        )
    return pl.DataFrame(rows).sort("ablation", "value")


def curve_trend(curve: pl.DataFrame, share: float = 0.1) -> pl.DataFrame:
    """Per (source, load, seed): mean return over the first and the last `share` of iterations, and whether it
    rose (returns are negative costs: rising = learning)."""

    def part(first: bool) -> pl.Expr:
        n = (pl.len() * share).ceil().cast(pl.Int64).clip(1)
        col = pl.col("mean_return").sort_by("iteration")
        return (col.head(n) if first else col.tail(n)).mean()

    return (
        curve.group_by("source", "load_pct", "seed")
        .agg(first_return=part(True), last_return=part(False))
        .with_columns(has_improved=pl.col("last_return") > pl.col("first_return"))
        .sort("source", "load_pct", "seed")
    )


def relative_curves(curve: pl.DataFrame, share: float = 0.1) -> pl.DataFrame:
    """`curve` with `return_change_pct`: the mean return's change from the mean over the first `share` of each
    (source, load, seed)'s iterations, in % of its size (positive = the cost fell). Returns at 30 and 80 % load
    differ by a factor of 2 or more, so on one absolute axis a 2 % rise at 80 % looks flat."""
    first = curve_trend(curve, share).select("source", "load_pct", "seed", "first_return")
    return curve.join(first, on=["source", "load_pct", "seed"], how="left").with_columns(
        return_change_pct=(pl.col("mean_return") - pl.col("first_return"))
        / pl.col("first_return").abs().clip(1e-12)
        * 100.0
    )
