"""The EC mapping of one source from its fanned-out steps (TVW-RL "Workload Equivalence-Class (EC) Mapping").

The EC layer runs in three steps (assets/ec.py): a k sweep per distance method (`pipelines.equivalence`), the
Table 1 rows of each method's mappings (`method_gain_rows`: the prediction-gain proxy of `models.prediction_gain`
over forecaster seeds against random controls, the ARI across clustering seeds and the stability over time), and
the choice over every row of the source (`comparison_and_choice`: Holm-corrected paired sign tests, the row with
the largest median paired gain among those that pass; none passing chooses NOTHING).

Table order: every (method, k) with labels, methods in configured order and k ascending (`k_rules`). A mapping's
position in it is the index its random controls are drawn with, whichever step scores it, so the rows of a
method scored alone equal those of one table over every method.

Everything here is pure: frames and arrays in, frames and plain values out. `EcRunSettings` is the one
declaration of the EC assets' settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import numpy as np
import polars as pl

from models.forecaster import FORECASTER_PRESETS, ForecasterConfig, forecaster_preset
from models.prediction_gain import (
    MAPPING_ROWS,
    P_HOLM,
    Choice,
    GainConfig,
    choose_mapping,
    mapping_gain_table,
    min_holm_p,
    with_holm,
)
from pipelines.equivalence import (
    EC_ASSIGNMENTS,
    EC_PROFILES,
    EC_SILHOUETTE,
    EcConfig,
    ari_of_labels,
    best_k,
    method_inputs,
    profiles_of,
    time_stability,
)
from pipelines.features import SeriesSet


@dataclass(frozen=True)
class EcRunSettings:
    """Settings of the EC sweep, its Table 1 rows and the choice (ec__method_sweep, ec__method_gain and
    ec__mapping take the same settings, so the three steps agree on methods, k range and seeds)."""

    ec: EcConfig = field(default_factory=EcConfig)
    """The k sweep: k range (TVW-RL: 3..15), initialisations per k (TVW-RL: 50), distance methods, clustering
    seed, training part (train_frac: the leading fraction of each series the clustering sees and the forecasters
    train on; the rest is the held-out window the proxy scores, never clustered) and DTW."""
    gain: GainConfig = field(default_factory=GainConfig)
    """The prediction-gain proxy of every mapping: forecaster seeds, random-control draws, alpha, smallest EC,
    held-out bins scored, and the forecaster (its settings that differ from ForecasterConfig's defaults override
    forecaster_preset's). gain.train_frac must equal ec.train_frac."""
    forecaster_preset: str = "small"
    """'small' (a fast LSTNet for the proxy sweep) or 'paper' (Lai et al. 2018's settings,
    models.forecaster.paper_scale): the forecaster of every fit, before gain.forecaster's overrides."""
    series_max_bins: int | None = None
    """None = each workload's whole kept window (series of different lengths); N = its first N bins (a
    documented window)."""
    ari_seeds: int = 3
    """Other clustering seeds the ARI across seeds is over."""
    stability_shuffles: int = 200
    """Label shuffles behind the reference (95th percentile) of the time-stability ARI."""

    def __post_init__(self) -> None:
        if self.forecaster_preset not in FORECASTER_PRESETS:
            raise ValueError(
                f"forecaster_preset must be one of {sorted(FORECASTER_PRESETS)}; got {self.forecaster_preset!r}"
            )
        if self.ec.train_frac != self.gain.train_frac:
            raise ValueError(
                f"ec.train_frac ({self.ec.train_frac}) and gain.train_frac ({self.gain.train_frac}) must be "
                "equal: the forecasters train on the part the clustering saw"
            )

    def forecaster(self) -> ForecasterConfig:
        """The preset with gain.forecaster's settings that differ from ForecasterConfig's defaults (so a
        setting is overridden only with a value other than its default)."""
        base, default, given = (
            forecaster_preset(self.forecaster_preset),
            ForecasterConfig(),
            self.gain.forecaster,
        )
        overrides = {
            f.name: getattr(given, f.name)
            for f in fields(ForecasterConfig)
            if getattr(given, f.name) != getattr(default, f.name)
        }
        return replace(base, **overrides)

    def gain_config(self) -> GainConfig:
        """gain with the resolved forecaster."""
        return replace(self.gain, forecaster=self.forecaster())


# --- tables ---------------------------------------------------------------------------------------------------

ARI_ROWS = {
    "method": pl.String,
    "k": pl.Int64,
    "ari_across_seeds": pl.Float64,
    "ari_across_seeds_min": pl.Float64,
}
METHOD_GAIN = {
    "source": pl.String,
    **MAPPING_ROWS,
    "silhouette": pl.Float64,
    "silhouette_sd": pl.Float64,
    "ari_across_seeds": pl.Float64,
    "ari_across_seeds_min": pl.Float64,
    "ari_time_halves": pl.Float64,
    "ari_time_halves_shuffled_95": pl.Float64,
}
"""`ec__method_gain`: Table 1 rows of one method's mappings (ec__method_comparison without the choice)."""
METHOD_COMPARISON = {
    **METHOD_GAIN,
    P_HOLM: pl.Float64,
    "beats_control": pl.Boolean,
    "is_chosen": pl.Boolean,
    "choice_basis": pl.String,
    "choice_reason": pl.String,
}
"""`ec__method_comparison`: every row of the source with its Holm-adjusted p and the choice."""
EC_MAPPING_SCHEMAS = {
    "ec__silhouette": EC_SILHOUETTE,
    "ec__method_comparison": METHOD_COMPARISON,
    "ec__assignments": EC_ASSIGNMENTS,
    "ec__profiles": EC_PROFILES,
    "ec__method_assignments": EC_ASSIGNMENTS,
}
"""The tables of the choice step (ec__mapping), each selectable alone."""
EC_DESCRIPTIONS = {
    "ec__sweep_silhouette": "One method's k sweep on one source (a partition per source and method): mean "
    "silhouette over the initialisations, with its sd, for every k, on the training part of each series. "
    "ec__silhouette gathers every method's rows.",
    "ec__sweep_labels": "One method's k sweep on one source: the kept (lowest-cost) labels of every k that was not "
    "skipped, one row per (k, workload), in the series order; DTW marks each EC's medoid.",
    "ec__method_gain": "TVW-RL Table 1 rows of one method's mappings on one source (a partition per source and "
    "method): the method at every k of its sweep, each over forecaster seeds against random controls (several "
    "draws per seed), with the silhouette, the ARI across clustering seeds and the stability over time (ARI "
    "between the clusterings of the two halves of each workload's window, and its shuffled 95 % reference). "
    "The random controls of a mapping are drawn with its position among every method's mappings (this step "
    "reads every method's sweep of its source), so the rows equal those of one table over all methods. "
    "ec__method_comparison gathers them, adds the Holm-adjusted p-values and marks the choice.",
    "ec__classifier_accuracy": "Held-out accuracy and macro-F1 of the EC classifier (TVW-RL Algorithm 1, "
    "ClassifyToEC: two dense ReLU layers and a softmax) per usage-prefix length m (the workload's age in bins), "
    "as means over repeated seeded splits by workload group (all days of a job on one side; `split` states it) "
    "with 95 % corrected resampled t-intervals, beside two constant baselines on the same splits with their "
    "intervals: the training split's majority EC and the best constant guess of each test split. The model "
    "trained on all labelled workloads is saved beside the warehouse for the simulator; its card (in the file "
    "and in this asset's metadata) carries these numbers.",
    "ec__silhouette": "Mean silhouette (averaged over the initialisations, with its sd) for every (method, k), "
    "k = 3..15, on the training part of each series; the k with the highest mean is each method's "
    "silhouette-best k. Skipped k (too few workloads, identical points) carry the reason.",
    "ec__method_comparison": "TVW-RL Table 1 with seeds, one row per distance method and k of its sweep: the "
    "effective prediction gain EG (%) and the fraction f of workloads in ECs whose own forecaster beats the "
    "EC-agnostic one, as means with 95 % intervals over forecaster seeds, beside random controls (same class "
    "sizes, labels shuffled; several draws per seed, averaged) and the PAIRED difference EG - control EG per seed "
    "(same seed, same EC-agnostic model): its mean with a t-interval and its median with a distribution-free "
    "sign-test interval, the sign-test p-value and its Holm adjustment over every row of the source. The chosen "
    "row (`is_chosen`) has the largest median paired gain among the rows whose adjusted p is below 0.05 (ties: "
    "the higher time stability `ari_time_halves`, then the smaller k); the mean EG is reported but never chosen "
    "by (one seed with a poor EC-agnostic model can multiply it). When no row passes, none is chosen and "
    "`choice_reason` says why.",
    "ec__assignments": "The chosen EC mapping: the EC label of every usable long-running workload (empty when "
    "no mapping is chosen).",
    "ec__profiles": "Each EC's representative usage series (medoid for DTW, members' mean otherwise).",
    "ec__method_assignments": "One EC mapping per distance method (for the EC-mapping ablation, TVW-RL Table 2): "
    "the mapping the choice rule picks among that method's rows of ec__method_comparison (Holm-adjusted over "
    "every row of the source): the largest median paired gain among its rows that pass; if none does, the method "
    "at its silhouette-best k. The chosen method's rows equal ec__assignments (same labels, same order); the "
    "metadata says how each mapping was picked.",
}
"""Descriptions of the EC tables (the Dagster UI shows them)."""
EC_MAPPING_CHECKS = {
    "silhouette_row_per_method_and_k": (
        "ec__silhouette",
        "a row for every configured method and every k in k_min..k_max",
    ),
    "labels_cover_every_kept_workload": (
        "ec__assignments",
        "every kept long-running workload has exactly one label, except those skipped for unusable series",
    ),
    "at_most_one_chosen_mapping": (
        "ec__method_comparison",
        "at most one chosen row (none when no row passes the Holm-corrected test); a chosen row passes it",
    ),
    "chosen_mapping_equals_ec_assignments": (
        "ec__method_assignments",
        "at most one mapping per method, and the chosen method's rows equal ec__assignments",
    ),
    "profiles_have_every_chosen_ec": (
        "ec__profiles",
        "a chosen mapping has finite profiles of 1 to k of its ECs (none when nothing is chosen)",
    ),
}
"""Check name -> (table it checks, description)."""


# --- table order and stored rows ------------------------------------------------------------------------------


def of_source(table: pl.DataFrame, source: str, methods: tuple[str, ...]) -> pl.DataFrame:
    """The rows of `source`, of the configured methods only, in their configured order (a stored partition of
    a method not configured now is left out)."""
    rows = table.filter(pl.col("source") == source)
    return pl.concat([rows.filter(pl.col("method") == m) for m in methods], how="vertical_relaxed")


def labelled_ks(silhouette: pl.DataFrame, methods: tuple[str, ...]) -> dict[str, set[int]]:
    """Method -> the k it has labels for (the k not skipped), every configured method present."""
    kept = silhouette.filter(~pl.col("is_skipped"))
    return {m: set(kept.filter(pl.col("method") == m)["k"].to_list()) for m in methods}


def k_rules(best: dict[str, int | None], labelled: dict[str, set[int]]) -> dict[tuple[str, int], str]:
    """The mappings Table 1 scores, in table order: every (method, k) with labels, methods in configured order
    and k ascending -> "silhouette_best" (the method's k of highest mean silhouette) or "sweep". A mapping's
    position in this order is the index its random controls are drawn with (`mapping_gain_table`'s
    control_index), whichever step scores it."""
    return {
        (method, k): "silhouette_best" if k == best.get(method) else "sweep"
        for method, ks in labelled.items()
        for k in sorted(ks)
    }


def rules_of(silhouette: pl.DataFrame, methods: tuple[str, ...]) -> dict[tuple[str, int], str]:
    """`k_rules` of a source's gathered silhouette rows."""
    best = {m: best_k(silhouette.filter(pl.col("method") == m)).get(m) for m in methods}
    return k_rules(best, labelled_ks(silhouette, methods))


def labels_of(labels: pl.DataFrame, method: str, k: int, workload_ids: np.ndarray) -> pl.DataFrame:
    """The stored labels of (method, k), in the order of `workload_ids` (the series order); raises naming the
    mapping when the stored sweep does not cover exactly these workloads (a sweep older than the series)."""
    rows = labels.filter((pl.col("method") == method) & (pl.col("k") == k))
    stored = rows["workload_id"].to_list()
    if stored != workload_ids.tolist():
        raise ValueError(
            f"ec__sweep_labels ({method}, k={k}) of {rows['source'][0] if rows.height else '?'} holds "
            f"{len(stored)} workloads, not the {len(workload_ids)} usable long-running ones in the same order: "
            "re-run ec_sweep_job for this source"
        )
    return rows


def medoids_of(rows: pl.DataFrame) -> np.ndarray | None:
    """Workload indices of the medoids in label order (DTW), None for K-Means methods (no medoid stored)."""
    idx = np.flatnonzero(rows["is_medoid"].to_numpy())
    if not len(idx):
        return None
    return idx[np.argsort(rows["ec_label"].to_numpy()[idx], kind="stable")]


def gathered_rows(gain: pl.DataFrame, source: str, rules: dict[tuple[str, int], str]) -> pl.DataFrame:
    """The stored Table 1 rows of `source` in table order (the order of `rules`); raises naming the mappings
    the stored ec__method_gain partitions lack or hold beyond them (a gain step older than the sweeps)."""
    rows = gain.filter(pl.col("source") == source)
    order = {key: i for i, key in enumerate(rules)}
    have = [tuple(r) for r in rows.select("method", "k").iter_rows()]
    missing, extra = sorted(set(order) - set(have)), sorted(set(have) - set(order))
    if missing or extra or len(have) != len(set(have)):
        raise ValueError(
            f"ec__method_gain of {source}: mappings {missing} missing, {extra} not in Table 1 now "
            f"({len(have)} rows for {len(order)} mappings): re-run ec_gain_job for {source} after ec_sweep_job"
        )
    position = pl.Series([order[key] for key in have], dtype=pl.Int64)
    return rows.with_columns(_position=position).sort("_position").drop("_position")


# --- one method's Table 1 rows --------------------------------------------------------------------------------


def method_gain_rows(
    series: SeriesSet,
    source: str,
    method: str,
    silhouette: pl.DataFrame,
    labels: pl.DataFrame,
    settings: EcRunSettings,
    log: Callable[[str], None] | None = None,
) -> tuple[pl.DataFrame, dict[str, float], dict[str, int]]:
    """METHOD_GAIN rows of `method`'s mappings on `source` (every k of its sweep): the proxy over forecaster
    seeds against random controls drawn with each mapping's position among every method's mappings (from the
    gathered `silhouette` of all methods), the silhouette, the ARI across clustering seeds and the stability
    over time. Also the seconds of each part and each mapping's control index ("<method> k=<k>")."""
    cfg, gain_cfg = settings.ec, settings.gain_config()
    rules = rules_of(silhouette, cfg.methods)
    keys = list(rules)
    own = [key for key in keys if key[0] == method]
    mappings = {key: labels_of(labels, *key, series.workload_ids)["ec_label"].to_numpy() for key in own}
    t0 = time.perf_counter()
    table = mapping_gain_table(
        series.series_list(),
        mappings,
        gain_cfg,
        rules,
        log=log,
        label=f"{source} {method} Table 1 ({gain_cfg.n_seeds} forecaster seeds)",
        control_index={key: keys.index(key) for key in own},
    )
    seconds = {"seconds_forecaster": time.perf_counter() - t0}
    t0 = time.perf_counter()
    inputs = method_inputs(series, method, cfg) if settings.ari_seeds else None
    aris = []
    for key in own:
        a = (
            ari_of_labels(mappings[key], inputs, method, key[1], cfg, settings.ari_seeds)
            if inputs is not None
            else []
        )
        aris.append((*key, float(np.mean(a)) if a else None, float(np.min(a)) if a else None))
    ari = pl.DataFrame(aris, schema=ARI_ROWS, orient="row")
    seconds["seconds_ari"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    stability = time_stability(series, method, [k for _, k in own], cfg, settings.stability_shuffles)
    seconds["seconds_time_stability"] = time.perf_counter() - t0
    rows = (
        table.with_columns(source=pl.lit(source))
        .join(silhouette.select("method", "k", "silhouette", "silhouette_sd"), on=["method", "k"], how="left")
        .join(ari, on=["method", "k"], how="left")
        .join(stability, on=["method", "k"], how="left")
        .select(list(METHOD_GAIN))
    )
    return rows, seconds, {f"{m} k={k}": keys.index((m, k)) for m, k in own}


# --- the choice -----------------------------------------------------------------------------------------------


def comparison_and_choice(
    gain: pl.DataFrame, source: str, rules: dict[tuple[str, int], str], alpha: float
) -> tuple[pl.DataFrame, Choice]:
    """`ec__method_comparison` of `source` (its stored Table 1 rows in table order, Holm-adjusted over all of
    them, the chosen row marked) and the choice; no row is chosen when none passes."""
    comparison = with_holm(gathered_rows(gain, source, rules), alpha)
    choice = choose_mapping(comparison, alpha)
    comparison = comparison.with_columns(
        is_chosen=pl.lit(False)
        if choice.method is None  # no mapping chosen: no row is
        else (pl.col("method") == choice.method) & (pl.col("k") == choice.k),
        choice_basis=pl.lit(choice.basis),
        choice_reason=pl.lit(choice.reason),
    ).select(list(METHOD_COMPARISON))
    return comparison, choice


def assignments_and_profiles(
    labels: pl.DataFrame, choice: Choice, series: SeriesSet, source: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`ec__assignments` (the chosen mapping's stored labels in series order) and `ec__profiles` (each EC's
    representative series); both empty when nothing is chosen."""
    if choice.method is None:
        return pl.DataFrame(schema=EC_ASSIGNMENTS), pl.DataFrame(schema=EC_PROFILES)
    chosen = labels_of(labels, choice.method, choice.k, series.workload_ids)
    labels_arr, medoids = chosen["ec_label"].to_numpy(), medoids_of(chosen)
    profiles = profiles_of(source, series, choice.method, choice.k, labels_arr, medoids)
    return chosen.select(list(EC_ASSIGNMENTS)), profiles


def method_assignments(
    comparison: pl.DataFrame,
    labels: pl.DataFrame,
    methods: tuple[str, ...],
    workload_ids: np.ndarray,
    alpha: float = 0.05,
) -> tuple[pl.DataFrame, dict[str, str]]:
    """`ec__method_assignments`: per method, the mapping `choose_mapping` picks from that method's rows of the
    comparison (their Holm-adjusted p-values are over every row of the source), or the method's silhouette-best
    k where none of its rows passes: every method with a scored mapping has one, for the EC-mapping ablation.
    The labels in the series order; `picks` says how each was picked."""
    frames, picks = [], {}
    for method in methods:
        rows = comparison.filter(pl.col("method") == method)
        if rows.height == 0:
            picks[method] = "no mapping scored"
            continue
        pick = choose_mapping(rows, alpha)
        k = pick.k if pick.method else silhouette_best(rows)
        picks[method] = f"k={k} ({pick.basis if pick.method else 'silhouette_best: no row passes'})"
        frames.append(labels_of(labels, method, k, workload_ids).select(list(EC_ASSIGNMENTS)))
    return (pl.concat(frames) if frames else pl.DataFrame(schema=EC_ASSIGNMENTS)), picks


def silhouette_best(rows: pl.DataFrame) -> int:
    """The k of the row marked silhouette_best."""
    return int(rows.filter(pl.col("k_rule") == "silhouette_best")["k"][0])


def unreachable_choice(n_rows: int, gain: GainConfig) -> str | None:
    """Why no mapping can be chosen with this many rows and seeds (the smallest reachable Holm-adjusted p is
    not below alpha), or None."""
    p = min_holm_p(gain.n_seeds, n_rows)
    if p < gain.alpha:
        return None
    return (
        f"{n_rows} rows with forecaster_seeds={gain.n_seeds}: the smallest Holm-adjusted sign-test p is {p:.3g} "
        f">= alpha {gain.alpha}, so no mapping can be chosen; use more seeds or fewer k"
    )


def choice_message(choice: Choice) -> str:
    """The run log's line on the choice (loud when nothing is chosen)."""
    if choice.method is None:
        return (
            f"NO EC MAPPING CHOSEN: {choice.reason}. ec__assignments and ec__profiles are empty; the job "
            "sequences give every workload EC label 0 and no EC classifier is trained"
        )
    return f"EC mapping choice ({choice.basis}): {choice.reason}"


def choice_summary(comparison: pl.DataFrame, choice: Choice, n_seeds: int) -> dict:
    """The choice in plain values (the first metadata of ec__method_comparison)."""
    return {
        "chosen": f"{choice.method}, k={choice.k}" if choice.method else "none",
        "choice_basis": choice.basis,
        "choice_reason": choice.reason,
        "n_rows": comparison.height,
        "n_rows_passing_holm": int(comparison["beats_control"].sum()),
        "smallest_reachable_holm_p": min_holm_p(n_seeds, comparison.height),
    }


def forecaster_summary(settings: EcRunSettings) -> dict:
    """The forecaster and proxy settings in force (the `forecaster` metadata of ec__method_comparison)."""
    gain = settings.gain_config()
    return {
        **vars(gain.forecaster),
        "preset": settings.forecaster_preset,
        "n_seeds": gain.n_seeds,
        "n_control_draws": gain.n_control_draws,
        "train_frac": gain.train_frac,
        "max_eval_bins": gain.max_eval_bins,
    }


# --- checks (the computation; the asset wraps the result) -----------------------------------------------------


def silhouette_check(sil: pl.DataFrame, cfg: EcConfig) -> tuple[bool, dict]:
    """A row for every configured method and every k in k_min..k_max, none twice."""
    want = {(m, k) for m in cfg.methods for k in range(cfg.k_min, cfg.k_max + 1)}
    have = [tuple(r) for r in sil.select("method", "k").iter_rows()]
    missing = sorted(want - set(have))
    extra = len(have) - len(set(have))
    return not missing and not extra, {
        "n_rows": len(have),
        "missing": str(missing[:10]),
        "n_duplicates": extra,
    }


def chosen_check(comparison: pl.DataFrame, choice: Choice) -> tuple[bool, dict]:
    """At most one chosen row, and a chosen row beats its control."""
    chosen = comparison.filter(pl.col("is_chosen"))
    expected = 0 if choice.method is None else 1
    beats = bool(chosen["beats_control"].all()) if chosen.height else None
    ok = chosen.height == expected and (choice.method is None or bool(beats))
    return ok, {"n_chosen": chosen.height, "choice_basis": choice.basis, "chosen_beats_control": str(beats)}


def coverage_check(
    labels_df: pl.DataFrame, series: SeriesSet, long_running: pl.DataFrame, choice: Choice
) -> tuple[bool, dict]:
    """Every kept workload labelled once, except those skipped for unusable series (nothing when nothing is
    chosen)."""
    kept = set(long_running["workload_id"].to_list())
    skipped = set(series.skipped["workload_id"].to_list())
    labelled = labels_df["workload_id"].to_list()
    meta = {
        "n_kept": len(kept),
        "n_labelled": len(labelled),
        "n_skipped_series": len(skipped),
        "choice_basis": choice.basis,
    }
    if choice.method is None:
        return True, {
            **meta,
            "note": "no mapping chosen (no row passes the Holm-corrected test): nothing labelled",
        }
    ok = (
        len(labelled) == len(set(labelled))
        and set(labelled) | skipped == kept
        and not set(labelled) & skipped
    )
    return ok, meta


def profiles_check(profiles: pl.DataFrame, choice: Choice) -> tuple[bool, dict]:
    """A chosen mapping of k ECs has a profile for at least one and at most k of them, every CPU and memory value
    finite; no mapping chosen, no profile."""
    n_ecs = profiles["ec_label"].n_unique() if profiles.height else 0
    finite = profiles.filter(~(pl.col("cpu_frac").is_finite() & pl.col("mem_frac").is_finite())).height == 0
    k = (choice.k or 0) if choice.method is not None else 0
    ok = finite and (1 <= n_ecs <= k if k else n_ecs == 0)
    return ok, {"n_ecs": n_ecs, "k_chosen": k, "is_finite": finite, "n_rows": profiles.height}


def method_assignments_check(
    per_method: pl.DataFrame, chosen: pl.DataFrame, choice: Choice
) -> tuple[bool, dict]:
    """At most one mapping per method, and the chosen method's rows equal ec__assignments."""
    mappings = per_method.select("method", "k").unique()
    one_each = mappings.height == mappings["method"].n_unique()
    of_chosen = per_method.filter(pl.col("method") == choice.method) if choice.method else per_method.clear()
    equal = of_chosen.equals(chosen)
    return one_each and equal, {
        "n_mappings": mappings.height,
        "is_one_mapping_per_method": one_each,
        "is_chosen_equal_to_ec_assignments": equal,
    }


def table_markdown(df: pl.DataFrame) -> str:
    """ec__method_comparison as a Markdown table (the asset's metadata)."""
    lines = [
        "| method | k | rule | EG % (95 % CI) | f (95 % CI) | control EG % (95 % CI) | paired EG - control: mean "
        "(95 % CI), p | median (95 % sign-test CI), seeds + / - | sign p, Holm p | beats control | ARI seeds "
        "| ARI halves (shuffled 95 %) | chosen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in df.iter_rows(named=True):
        ari = "" if r["ari_across_seeds"] is None else f"{r['ari_across_seeds']:.2f}"
        halves = (
            ""
            if r["ari_time_halves"] is None
            else f"{r['ari_time_halves']:.2f} ({r['ari_time_halves_shuffled_95']:.2f})"
        )
        lines.append(
            f"| {r['method']} | {r['k']} | {r['k_rule']} | {r['eg_pct']:.2f} ({r['eg_pct_ci_low']:.2f}, "
            f"{r['eg_pct_ci_high']:.2f}) | {r['f_frac']:.2f} ({r['f_frac_ci_low']:.2f}, {r['f_frac_ci_high']:.2f}) "
            f"| {r['control_eg_pct']:.2f} ({r['control_eg_pct_ci_low']:.2f}, {r['control_eg_pct_ci_high']:.2f}) "
            f"| {r['eg_diff_pct']:.2f} ({r['eg_diff_pct_ci_low']:.2f}, {r['eg_diff_pct_ci_high']:.2f}), "
            f"{r['eg_diff_p_value']:.3f} | {r['eg_diff_pct_median']:.2f} ({r['eg_diff_pct_median_ci_low']:.2f}, "
            f"{r['eg_diff_pct_median_ci_high']:.2f}), +{r['n_seeds_diff_positive']} "
            f"-{r['n_seeds_diff_negative']} of {r['n_seeds']} "
            f"| {r['eg_diff_sign_p_value']:.3g}, {r[P_HOLM]:.3g} "
            f"| {r['beats_control']} | {ari} | {halves} | {r['is_chosen']} |"
        )
    return "\n".join(lines)
