"""Settings shared by the learned schedulers' runs: the training seeds and the evaluation of trained policies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from models import LEARNED_POLICIES

TRAINED_AS = {"forecast_residual_rl_replay": "forecast_residual_rl"}
"""A learned policy built from another's trained file -> that policy (it has no training of its own)."""

RL_SEEDS = (0, 1, 2)
"""Training seeds of every learned policy (one training run per (load, seed))."""


def rl_partition_keys(loads: Sequence[int], seeds: Sequence[int]) -> list[str]:
    """The training partitions, one per (load, seed): 'load50-seed1', ..."""
    return [f"load{load}-seed{seed}" for load in loads for seed in seeds]


def parse_rl_partition(key: str) -> tuple[int, int]:
    """'load50-seed1' -> (50, 1)."""
    load, seed = key.split("-")
    return int(load.removeprefix("load")), int(seed.removeprefix("seed"))


@dataclass(frozen=True)
class ResultsConfig:
    """The evaluation of trained policies on the test sequences: which, with which seeds, in which simulator."""

    policies: tuple[str, ...] = tuple(sorted(LEARNED_POLICIES))
    """learned policies to evaluate (the heuristics' rows come from eval__baselines)"""
    seeds: tuple[int, ...] = RL_SEEDS
    """seeds: training seed of learned policies, simulator/policy seed of all"""
    n_machines: int = 10
    """M (TVW-RL: 10)"""
    max_steps: int = 1000
    """safety cap in logical steps (hitting it is a failure)"""
    noise_max_units: int = 0
    """background noise 0..n units (robustness study: 1-3)"""


GAP_CHECK_DOCS = {
    "has_a_best_heuristic_per_cell": "Every (source, load) evaluated has a best non-oracle heuristic and at least one "
    "forecast-driven or learned policy compared with it; an oracle is never the best heuristic.",
}
"""The check of `eval__gap` (`gap_check`): name -> what passing means."""


def gap_check(results: pl.DataFrame, gaps: pl.DataFrame) -> tuple[bool, dict, dict]:
    """(passed, check metadata, counts) of `eval__gap` on `gaps` (`sim.evaluate.gap_table` of `results`). The check
    passes when every (source, load) evaluated has a best heuristic, at least one forecast-driven or learned policy
    is compared with it, and no oracle is ever the best heuristic. Counts: cells, rows of a forecast-driven or
    learned policy significantly above the best heuristic, and the cells where one is."""
    cells = results.select("source", "load_pct").unique().height
    challengers = gaps.filter(pl.col("policy_kind").is_in(["forecast", "learned"]))
    oracles = results.filter(pl.col("is_oracle")).select(pl.col("policy").alias("best_heuristic")).unique()
    oracle_best = gaps.join(oracles, on="best_heuristic", how="semi")
    n_cells = gaps.select("source", "load_pct").unique().height
    wins = challengers.filter(pl.col("is_significantly_better"))
    passed = n_cells == cells and challengers.height > 0 and oracle_best.height == 0
    meta = {"n_cells": n_cells, "n_cells_evaluated": cells, "n_challenger_rows": challengers.height}
    counts = {
        "n_cells": n_cells,
        "n_significant_wins": wins.height,
        "n_cells_won": wins.select("source", "load_pct").unique().height,
    }
    return passed, meta, counts


def evaluate_learned(
    sequences: pl.DataFrame,
    partition: str,
    baselines: pl.DataFrame,
    settings: ResultsConfig,
    make: Callable,
    serve_labels: Callable | None = None,
    log: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """eval__results' partition `partition` ('load50'): the learned policies of `settings` on the test sequences
    of `sequences` (`sim__job_sequences`) at that load, each built by `make(name, source, load, seed)` (None
    where it was not trained there), served `serve_labels(source)`'s EC labels, beside the heuristics' rows of
    `baselines` (eval__baselines' partition). ValueError when no learned policy asked for was found at all."""
    from sim.evaluate import eval_sim_config, evaluate_by_cluster, parse_eval_partition, sequences_at_load

    where = f"eval__results[{partition}]"
    cfg = eval_sim_config("eval__results", settings, sequences)
    jobs = sequences_at_load(sequences, parse_eval_partition(partition), where)
    policies = list(settings.policies)
    learned = evaluate_by_cluster(
        jobs, policies, cfg, list(settings.seeds), make=make, log=log, serve_labels=serve_labels
    )
    if policies and learned.height == 0:
        raise ValueError(
            f"{where}: no trained file of any of {policies} (materialise the training assets first)"
        )
    key = ["source", "load_pct", "policy", "sequence_id", "seed"]
    return pl.concat([baselines, learned], how="diagonal_relaxed").sort(key)
