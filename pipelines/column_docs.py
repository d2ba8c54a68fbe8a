"""What every column of every derived table means, and the lookup over those and the raw tables' docs.

`COLUMN_DOCS` describes a column by name: the house rule is that the same quantity has the same name in every
table, so one entry serves every table that has the column. `TABLE_COLUMN_DOCS` holds what a column means in one
table where the name alone is not enough (a summary's `mean`), and every raw table's columns, which each trace
source declares beside its schema (`TraceSource.column_docs`, so a new source brings its own). Scores carry their
direction: `describe` ends the description of a column listed in `better` with "Higher is better." or "Lower is
better." (`BETTER` below; the simulator's episode metrics are in `sim.evaluate.METRIC_BETTER`, which callers add:
this package names no `sim` module).

`assets.column_docs.table_schema` turns these into the Dagster column schema of every table the IO manager
writes; `undocumented` lists the columns with no entry (logged, and failed by tests/assets/test_column_docs.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from pipelines.ingest import raw_table_name
from pipelines.sources import SOURCES

_METRIC_UNITS = {
    "avg_util_cpu_frac": "average CPU utilisation: CPU used by workloads, clipped at capacity, summed over steps and "
    "machines / (T x most machines active at once x C_cpu) (0..1)",
    "avg_util_mem_frac": "average memory utilisation: memory used, clipped at capacity, summed over steps and machines "
    "/ (T x most machines active at once x C_mem) (0..1)",
    "avg_frag_cpu_frac": "average CPU fragmentation: 1 - mean over steps of (largest free CPU block on one active "
    "machine / free CPU on all active machines) (0..1)",
    "avg_frag_mem_frac": "average memory fragmentation: 1 - mean over steps of (largest free memory block on one "
    "active machine / free memory on all active machines) (0..1)",
    "avg_overshoot_pct": "average overshoot: demand above capacity (noise included), summed over resources, % of the "
    "cluster's capacity per step",
    "machines_used": "machines where at least one workload was placed during the episode",
    "contention_score_units2": "realised contention: sum over steps, machines and resources of the pairwise usage "
    "overlaps of co-located workloads (units squared)",
    "mean_wait_steps": "mean steps from arrival to placement over placed jobs (NaN when none was placed)",
    "n_unplaced": "jobs never placed when the episode ended (only after truncation)",
    "is_truncated": "1 when the episode hit the safety cap (max_steps) before every job was placed and finished: a "
    "failure",
    "episode_return": "undiscounted return: the sum of every penalty over the episode, = - sum of the cost_* "
    "columns (<= 0)",
    "cost_contention": "contention penalty of the episode as a positive cost",
    "cost_underutil": "under-utilisation penalty of the episode as a positive cost",
    "cost_overshoot": "overshoot penalty of the episode as a positive cost",
    "cost_wait": "waiting penalty of the episode as a positive cost",
    "cost_unplaced": "charge for jobs left unplaced when the safety cap cut the episode, as a positive cost",
    "n_steps": "logical steps the episode ran (T)",
    "machines_lower_bound": "fewest machines that could hold the sequence's busiest step with every job started on "
    "arrival and perfect packing (a yardstick for machines_used, not a policy)",
}

COLUMN_DOCS: dict[str, str] = {
    **_METRIC_UNITS,
    # keys shared by many tables
    "source": "trace source (google2011, alibaba2018, google2011_derived, bitbrains, or a synthetic workload)",
    "workload_id": "workload: Google '<job_id>/<task_index>', Alibaba container_id, derived and Bitbrains ids "
    "per job / VM",
    "machine_id": "machine the workload ran on (last seen); null when unknown",
    "load_pct": "average cluster load the job sequence was generated for (%)",
    "split": "train or test: which side of the workload split the row belongs to",
    "sequence_id": "job sequence, 0-based within (source, load_pct, split)",
    "seed": "seed of the simulator and the policy (evaluation) or the training seed (learning curves)",
    "policy": "scheduler: a registered policy name (sim.policies.POLICIES) or an importable 'module:attr'",
    "method": "EC distance: aggregate (Zhang et al. 2011 baseline), temporal (tsfresh features) or dtw",
    "k": "number of ECs",
    "ec_label": "equivalence class, 0..k-1 (0 = largest); an unassigned workload gets 0",
    "step": "5-minute bin (core tables, EC profiles) or 5-minute point of the day (job_days), from 0",
    "n_workloads": "workloads counted in the row",
    "n_jobs": "jobs counted in the row",
    "n_labelled": "the source's workloads with an EC label and a usage series (what the saved EC classifier was "
    "trained on; sim__ec_serving)",
    "n_test_groups": "workload groups (a Google job's days, else one workload) of the test sequences",
    "served_labeller": "which labeller serves the source's EC labels in the simulator: sim_view (trained on the "
    "simulator's view of training-sequence jobs, models.sim_labeller) or classifier (the EC classifier's serving copy)",
    "sim_view_n_train_jobs": "training-sequence jobs (every load) the simulator-view labeller was fitted on",
    "sim_view_path": "file of the simulator-view labeller (null where the classifier serves)",
    "n_left_out": "labelled workloads in those groups: never shown to the serving classifier",
    "n_trained": "labelled workloads the serving classifier was trained on (n_labelled - n_left_out)",
    "n_classes": "ECs among them: the labels it can serve (0 when none was trained)",
    "model_path": "the serving classifier's file (ec_classifier_serving__<source>.pt; null when fewer than 2 "
    "ECs were left to train on)",
    "n_seeds": "seeds the figures are over",
    "n": "how many (see the table's description)",
    "count": "what is counted",
    # core tables
    "start_time_s": "first usage record, seconds of trace time",
    "end_time_s": "end of the last usage record, seconds of trace time",
    "n_usage_records": "raw usage rows of the workload",
    "cpu_request_frac": "CPU requested, fraction of one machine of the source's reference size; null when unknown",
    "mem_request_frac": "memory requested, fraction of one machine; null when unknown",
    "priority": "trace priority (Google 0..11; null where the trace has none)",
    "scheduling_class": "trace scheduling class (Google 0..3, 3 = most latency-sensitive; null where none)",
    "final_state": "how the workload ended: finished, evicted, killed, failed, lost, running (at the trace end) "
    "or unknown",
    "is_partial": "only partly recorded: starts before or ends after what the data covers",
    "bin_start_s": "start of the 5-minute bin, seconds of trace time (a multiple of 300)",
    "cpu_frac": "CPU usage, fraction of one machine of the source's reference size",
    "mem_frac": "memory usage, fraction of one machine",
    "n_samples": "raw records averaged into the bin; 0 for a filled bin",
    "is_filled": "the gap-filling policy produced the value (no record in the bin)",
    "run_start_s": "first bin of the longest contiguous run kept, seconds of trace time",
    "n_run_bins": "length of the longest contiguous run, in 5-minute bins (gaps the source may bridge included)",
    "reason": "why the row was set aside or how the workload was judged (kept, no_usage, bad_final_state, "
    "partial, too_short)",
    "rule": "long-running rule: contiguous_bins, observed_bins or records",
    "min_bins": "the source's threshold under its rule (5-minute bins, or raw records for the records rule)",
    "n_observed_bins": "5-minute bins with at least one sample",
    "n_records": "raw usage records of the workload (its bins' n_samples, summed)",
    # quarantine
    "table": "raw table the row was read for",
    "source_file": "input file the row came from",
    "line_number": "1-based line in the (decompressed) input file; 0 for a whole file that could not be read",
    "raw_line": "the line as read (bytes that are not UTF-8 written as \\xNN escapes)",
    # job sequences
    "job_index": "0-based order of arrival within the sequence",
    "arrival_step": "logical step (one hour by default) at which the placement request arrives",
    "duration_steps": "steps the job runs once placed",
    "cpu_units": "CPU usage per step while running, units of C_d = 8 per machine; length duration_steps",
    "mem_units": "memory usage per step while running, units of C_d = 8 per machine; length duration_steps",
    "cpu_units_exact": "CPU usage per step before quantisation (the step mean scaled to units of C_d = 8, float, "
    "clipped to [0, C_d]; cpu_units is it quantised, or randomly rounded for DeepRM); read by the EC labeller only, never the simulator; null "
    "where the builder keeps none",
    "mem_units_exact": "memory usage per step before quantisation (the step mean scaled to units of C_d = 8, float, "
    "clipped to [0, C_d]; mem_units is it quantised, or randomly rounded for DeepRM); read by the EC labeller only, never the simulator; null "
    "where the builder keeps none",
    "cpu_request_units": "CPU the job asks for (its peak usage), units",
    "mem_request_units": "memory the job asks for (its peak usage), units",
    "is_long_running": "the job is cut from the long-duration stratum of the mix",
    # offered load
    "n_distinct_workloads": "distinct workloads the jobs were cut from",
    "n_machines": "M: machines of the cluster the load refers to",
    "capacity_units": "C_d: units per machine and resource",
    "window_steps": "arrival window the load is spread over, steps",
    "n_jobs_after_window": "jobs arriving at or after window_steps (their work counts all the same)",
    "last_arrival_step": "arrival step of the sequence's last job",
    "work_cpu_unit_steps": "total CPU work of the sequence: sum over jobs and steps of cpu_units",
    "work_mem_unit_steps": "total memory work of the sequence: sum over jobs and steps of mem_units",
    "offered_load_cpu": "realised CPU load: work_cpu_unit_steps / (M x C_d x window_steps)",
    "offered_load_mem": "realised memory load: work_mem_unit_steps / (M x C_d x window_steps)",
    "offered_load_mean": "mean of the CPU and memory realised loads",
    "dominant_resource": "the resource with the larger total work over the source's sequences at this load",
    "offered_load_dominant": "realised load of the dominant resource (what load_pct labels)",
    "peak_demand_cpu": "busiest step's CPU demand, jobs running as if started on arrival, / (M x C_d)",
    "peak_demand_mem": "busiest step's memory demand, jobs running as if started on arrival, / (M x C_d)",
    "peak_demand_dominant": "the larger of peak_demand_cpu and peak_demand_mem",
    # usage scale
    "cpu_frac_scale": "multiplier applied to cpu_frac before quantising to units (95th percentile peak -> 6 of 8)",
    "mem_frac_scale": "multiplier applied to mem_frac before quantising to units",
    "step_bins": "5-minute bins per logical step (12 = one hour)",
    # split diversity
    "n_sequences": "job sequences counted",
    "is_too_few_workloads": "cut from fewer distinct workloads than min_split_workloads: policies may tie",
    # labelling
    "age_steps": "usage steps the scheduler has observed of a job when its EC is predicted (0 = meta only)",
    "n_correct": "jobs whose predicted EC equals the clustering label",
    "constant_label": "the best constant EC label: the most frequent label of the training jobs (null when none "
    "was given)",
    "n_constant_correct": "jobs whose clustering label is constant_label (what always predicting it gets right)",
    "constant_accuracy": "accuracy of always predicting constant_label on the same jobs: the chance level a "
    "labeller must beat",
    # EC tables
    "silhouette": "mean silhouette over the n_init initialisations (TVW-RL's k criterion, -1..1)",
    "silhouette_sd": "standard deviation of the mean silhouette over the initialisations",
    "silhouette_kept": "mean silhouette of the kept (lowest-cost) initialisation's labels",
    "n_init": "initialisations per k",
    "n_silhouette_points": "workloads the silhouette was computed on (a seeded sample when large)",
    "is_skipped": "k could not be clustered (too few or identical workloads)",
    "skip_reason": "why, when is_skipped",
    "n_members": "workloads in the EC",
    "is_medoid": "this workload is its EC's medoid (DTW's K-Medoids; always false for the K-Means methods)",
    "k_rule": "silhouette_best (the method's k of highest mean silhouette) or sweep (another k of its sweep)",
    "eg_pct": "effective prediction gain EG (%), mean over forecaster seeds (heavy-tailed: never chosen by)",
    "eg_pct_median": "median EG (%) over forecaster seeds",
    "eg_pct_ci_low": "lower end of the 95 % t-interval of EG",
    "eg_pct_ci_high": "upper end of the 95 % t-interval of EG",
    "f_frac": "fraction of workloads in ECs whose own forecaster beats the EC-agnostic one, mean over seeds",
    "f_frac_ci_low": "lower end of the 95 % t-interval of f",
    "f_frac_ci_high": "upper end of the 95 % t-interval of f",
    "control_eg_pct": "EG of the random control (same class sizes, labels shuffled), mean over seeds",
    "control_eg_pct_ci_low": "lower end of the control's 95 % interval",
    "control_eg_pct_ci_high": "upper end of the control's 95 % interval",
    "control_f_frac": "f of the random control, mean over seeds",
    "eg_diff_pct": "paired gain over chance: mean over seeds of EG - the random control's EG (same seed, same global "
    "model), percentage points",
    "eg_diff_pct_ci_low": "lower end of the 95 % t-interval of eg_diff_pct (above 0: the mapping beats chance)",
    "eg_diff_pct_ci_high": "upper end of the 95 % t-interval of eg_diff_pct",
    "eg_diff_p_value": "one-sided paired t-test p-value of eg_diff_pct > 0 (NaN with one seed)",
    "eg_diff_pct_median": "median over the informative seeds (difference not 0) of EG - the control's EG, "
    "percentage points",
    "eg_diff_pct_median_ci_low": "lower end of the sign-test interval (>= 95 %) of that median; NaN below 6 seeds",
    "eg_diff_pct_median_ci_high": "upper end of the sign-test interval of that median",
    "n_seeds_diff_positive": "seeds in which the mapping's EG exceeds its control's",
    "n_seeds_diff_negative": "seeds in which the mapping's EG falls below its control's (ties left out)",
    "eg_diff_sign_p_value": "one-sided exact sign-test p-value of P(EG > control EG) > 1/2 (ties dropped)",
    "eg_diff_sign_p_holm": "eg_diff_sign_p_value adjusted by Holm's method over every row of the source",
    "ari_time_halves": "adjusted Rand index between the method's clusterings (same k) of the first and of the "
    "second half of every workload's window; 1 = the classes hold over time",
    "ari_time_halves_shuffled_95": "95th percentile of that ARI with the second half's labels shuffled (chance)",
    "eg_pct_by_seed": "EG (%) of each forecaster seed, in seed order",
    "control_eg_pct_by_seed": "the random control's EG (%, mean over its draws) of each forecaster seed",
    "n_control_draws": "random-control permutations per seed (their EG averaged)",
    "corr_ec": "forecast correlation of the EC's own forecaster on its workloads' held-out windows",
    "corr_global": "forecast correlation of the EC-agnostic forecaster on the same windows",
    "gain_pct": "prediction gain G(e) = 100 x (corr_ec - corr_global) / |corr_global|",
    "status": "ok, too_small (G set to 0) or undefined_corr (a correlation is NaN or corr_global = 0; G = 0)",
    "accuracy": "share of predictions equal to the reference label",
    "beats_control": "Holm-adjusted sign-test p below alpha (0.05) and a positive median paired gain: the "
    "mapping may be chosen",
    "n_ecs_too_small": "ECs below the minimum size (G set to 0)",
    "n_ecs_undefined": "ECs with an undefined correlation in some seed (G set to 0 there)",
    "ari_across_seeds": "mean adjusted Rand index between these labels and the same method's labels with other "
    "seeds; 1 = identical",
    "ari_across_seeds_min": "lowest of those ARIs",
    "is_chosen": "this mapping labels the workloads in ec__assignments",
    "choice_basis": "significant (a row passes the Holm-corrected test) or none (no row does: no mapping)",
    "choice_reason": "the choice in one sentence",
    "prefix_bins": "usage bins m fed to the classifier (0 = meta only)",
    "macro_f1": "held-out macro F1 of the EC classifier",
    "majority_accuracy": "held-out accuracy of always predicting the training split's most common EC",
    "majority_accuracy_ci_low": "lower end of the 95 % corrected resampled t-interval of majority_accuracy",
    "majority_accuracy_ci_high": "upper end of that interval",
    "best_constant_accuracy": "held-out accuracy of the best constant guess: each test split's own most common "
    "EC (what any constant predictor reaches at most), mean over the splits",
    "best_constant_accuracy_ci_low": "lower end of the 95 % corrected resampled t-interval of "
    "best_constant_accuracy",
    "best_constant_accuracy_ci_high": "upper end of that interval",
    "accuracy_ci_low": "lower end of the 95 % interval of accuracy (over splits: corrected resampled t-interval)",
    "accuracy_ci_high": "upper end of the 95 % interval of accuracy",
    "n_splits": "repeated seeded train/test splits the means and intervals are over",
    "n_train": "workloads in the training split",
    "n_test": "workloads in the held-out split",
    "n_groups_train": "workload groups (e.g. jobs of job-days) in the training split",
    "n_groups_test": "workload groups in the held-out split; no group is on both sides",
    # learning curves
    "iteration": "training iteration, from 0",
    "mean_return": "mean episode return over the iteration's training episodes (<= 0)",
    "std_return": "standard deviation of the episode return over the iteration's episodes",
    "loss": "policy-gradient loss of the iteration's update",
    "entropy": "mean entropy of the masked policy over the iteration's decisions (nats)",
    "n_truncated": "episodes that hit the safety cap",
    "wall_s": "seconds the iteration took",
    "mean_slowdown": "mean job slowdown (DeepRM: (completion - arrival) / duration; 1 = no wait)",
    "slowdown_ci95": "half-width of the 95 % t-interval of mean_slowdown over job sets",
    "trained_at_load_pct": "load the learned agent was trained at (null for heuristics)",
    "cost_slowdown": "DeepRM's slowdown penalty of the iteration's episodes as a positive cost",
    "cost_unused": "DeepRM's unused-resource penalty of the iteration's episodes as a positive cost",
    "is_pretraining": "DQfD pretraining on demonstrations only (no episode; returns null)",
    "mean_sim_return": "mean simulator return (TVW-RL's penalties) of the iteration's episodes (<= 0)",
    "epsilon": "exploration rate of the iteration",
    "loss_dq": "DQfD one-step TD loss, mean over the iteration's updates",
    "loss_n_step": "DQfD n-step TD loss, mean over the iteration's updates",
    "loss_supervised": "DQfD large-margin supervised loss, mean over the iteration's updates",
    "loss_l2": "DQfD L2 regularisation loss, mean over the iteration's updates",
    # ablations
    "ablation": "TVW-RL ablation setting (Tables 2-3): k_underutil, k_overshoot, k_contention, train_noise, "
    "shape_noise, ec_mapping or advantage",
    "n_policies": "policies compared: the ablation's TVW-RL variant and every heuristic on the same test sequences",
    "winner_by_return": "policy with the best mean episode return among them",
    "tvw_rl_rank_by_return": "rank of the TVW-RL variant by mean return (1 = best; lower is better)",
    "tvw_rl_return": "mean episode return of the TVW-RL variant, scored with the unablated penalty weights",
    "best_baseline_return": "best mean episode return of a heuristic on the same test sequences",
    "value": "the setting's value this policy was trained with",
    "eval_noise_units": "background noise 0..n units added in the test episodes",
    # summaries (long form: one row per metric)
    "metric": "metric column of the evaluation table this row summarises",
    "better": "which way the metric is better: higher, lower, or '' where it is not a score (counts, bounds)",
    # Dejavu's own metrics (eval__dejavu_metrics: means over test sequences, seeds averaged within a sequence)
    "dejavu_util_frac": "Dejavu's utilisation rate: mean over steps until the last placement and resources of the "
    "cluster's usage, clipped at capacity, / (M x C_d) (0..1)",
    "rbd1": "Dejavu's RBD1: sqrt(sum over resources of the variance across nodes of the requested share) right after "
    "a placement, mean over the episode's placements",
    "rbd2": "Dejavu's RBD2: |cpu share - memory share| of the node a job was placed on, right after the placement, "
    "mean over the episode's placements",
    "completion_time_steps": "step at which the episode's last job finished (or the safety cap)",
    "turnaround_time_steps": "mean over placed jobs of finish - arrival (steps)",
    **{
        f"{m}_ci95": f"half-width of the 95 % t-interval of {m} over test sequences (0 with one sequence)"
        for m in ("dejavu_util_frac", "rbd1", "rbd2", "completion_time_steps", "turnaround_time_steps")
    },
}
"""Column name -> what it holds, in every table that has it."""

BETTER: dict[str, str] = {
    "silhouette": "higher",
    "silhouette_kept": "higher",
    "eg_pct": "higher",
    "f_frac": "higher",
    "eg_diff_pct": "higher",
    "eg_diff_pct_median": "higher",
    "gain_pct": "higher",
    "accuracy": "higher",
    "macro_f1": "higher",
    "mean_return": "higher",
    "mean_sim_return": "higher",
    "mean_slowdown": "lower",
    "ari_across_seeds": "higher",
    "dejavu_util_frac": "higher",
    "rbd1": "lower",
    "rbd2": "lower",
    "completion_time_steps": "lower",
    "turnaround_time_steps": "lower",
}
"""Scores outside the episode metrics (which are in `sim.evaluate.METRIC_BETTER`): which way is better."""

_SUMMARY = {
    "n": "test sequences the mean is over (seeds averaged within a sequence first)",
    "n_seeds": "most seeds per sequence",
    "mean": "mean of the metric over the sequences (direction: see `better`)",
    "std": "standard deviation over the sequences",
    "ci_low": "lower end of the 95 % t-interval of the mean",
    "ci_high": "upper end of the 95 % t-interval of the mean",
}

_POLICY_DESCRIPTORS = {
    "policy_kind": "what the policy is: heuristic (request-based, or on observed usage: the hybrid and Google's "
    "peak predictors), forecast (a rule on the learned usage forecast), learned, or oracle (reads the future)",
    "is_oracle": "the policy reads the true future: a yardstick, never counted as best",
    "is_learned": "the policy is a trained one (from a checkpoint)",
}
COLUMN_DOCS.update(_POLICY_DESCRIPTORS)

_GAP = {
    "n_sequences": "test sequences paired with the best heuristic's (seeds averaged within a sequence)",
    "mean_return": "mean episode return over those sequences (<= 0)",
    "best_heuristic": "the non-oracle heuristic with the best mean test return in this (source, load)",
    "best_heuristic_return": "its mean episode return",
    "diff_vs_best_heuristic": "mean paired difference of episode return, policy minus best heuristic (> 0: the "
    "policy packs better)",
    "diff_ci_low": "lower end of the 95 % t-interval of the paired difference",
    "diff_ci_high": "upper end of the 95 % t-interval of the paired difference",
    "n_sequences_better": "test sequences where the policy's return is above the best heuristic's",
    "is_significantly_better": "the interval of the paired difference lies above 0",
    "is_significantly_worse": "the interval of the paired difference lies below 0",
    "oracle": "the oracle (reads the future) with the best mean return here: the yardstick of the gap",
    "oracle_return": "its mean episode return",
    "gap_closed_frac": "diff_vs_best_heuristic / (oracle_return - best_heuristic_return): the share of the "
    "heuristic-to-oracle gap the policy closes (null without an oracle above the heuristic)",
    "truth_return": "for a forecast-driven rule, the mean return of the same rule on the true future",
    "information_gap": "truth_return - mean_return: what a perfect forecast would add to the rule",
    "avg_overshoot_pct": "mean overshoot % of the policy (see eval__results)",
    "tetris_overshoot_pct": "Tetris's mean overshoot % in the same cell",
    "machines_used": "mean machines used by the policy",
    "tetris_machines_used": "Tetris's mean machines used in the same cell",
}

BETTER.update(
    {
        "diff_vs_best_heuristic": "higher",
        "gap_closed_frac": "higher",
        "pinball_units": "lower",
        "pinball_frac": "lower",
    }
)

_FORECAST = {
    "forecaster": "learned_with_ec / learned_without_ec (models.usage_forecast, calibrated), "
    "remaining_peak_with_ec / remaining_peak_without_ec (forecast_peak's remaining-peak table, sim.peak_forecast: "
    "a bound for the rest of the job's life, over-covering per step by design), or a baseline: request, "
    "ec_age_quantile, seasonal_naive, last_period_max",
    "origin": "arrival (nothing observed: forecast as if placed now) or running (part of the job observed)",
    "horizon_step": "h: the forecast of step t + h (1..H)",
    "level": "quantile level",
    "resource": "cpu or mem",
    "n": "alive test target steps scored",
    "pinball_units": "mean pinball loss in units of C_d",
    "pinball_frac": "mean pinball loss / C_d",
    "coverage": "share of target steps whose true usage is at or below the quantile (nominal: the level)",
}

_STAGES = {
    "stage": "training stage of the learned placer: base (the untrained policy = its base rule), bc (behaviour "
    "cloning) or pg (policy gradient)",
    "iteration": "BC epoch or policy-gradient iteration (0 = before any update); in rl__forecast_residual the "
    "row of the run (0 = the base rule, then every BC epoch and PG iteration in order)",
    "stage_iteration": "rl__forecast_residual: the stage's own iteration (BC epoch or PG iteration)",
    "validation_return": "mean greedy episode return on the validation sequences carved from the training split",
    "imitation_accuracy": "share of validation decisions where the greedy action is the base rule's",
    "entropy": "mean policy entropy over the validation decisions (nats)",
    "train_return": "mean return of the iteration's training rollouts (NaN for base and bc; null in "
    "rl__forecast_residual)",
    "seconds": "wall seconds of this row's work",
    "elapsed_s": "wall seconds since training started",
}
BETTER.update({"validation_return": "higher", "train_return": "higher"})

_LEADERBOARD = {
    "rank": "rank by mean episode return in this (source, load), 1 = best non-oracle policy; null for an oracle",
    "is_best": "the best non-oracle policy of this (source, load): rank 1",
    "is_best_heuristic": "the best policy of this (source, load) that is neither an oracle nor learned",
    "mean": "mean episode return over the test sequences (seeds averaged within a sequence first)",
    "ci_low": "lower end of the 95 % t-interval of the mean",
    "ci_high": "upper end of the 95 % t-interval of the mean",
    "n": "test sequences the mean is over",
    "gap_to_best_heuristic": "mean minus the best heuristic's mean (> 0: the policy beats it on average)",
    "beats_best_heuristic": "the policy's 95 % interval lies above the best heuristic's mean",
}
BETTER.update({"gap_to_best_heuristic": "higher"})

# their names are new to the project: one entry serves every table (the per-table ones below say it for these)
COLUMN_DOCS.update(
    {
        k: v
        for k, v in {**_GAP, **_FORECAST, **_STAGES, **_LEADERBOARD, **_SUMMARY}.items()
        if k not in COLUMN_DOCS
    }
)

TABLE_COLUMN_DOCS: dict[str, dict[str, str]] = {
    **{raw_table_name(s.name, t): docs for s in SOURCES.values() for t, docs in s.column_docs.items()},
    "eval__gap": _GAP,
    "eval__leaderboard": _LEADERBOARD,
    "eval__forecast": _FORECAST,
    "eval__summary": _SUMMARY,
    "eval__results_summary": _SUMMARY,
    "eval__ec_labelling": {
        "n_jobs": "test jobs still running at that age (duration > age_steps)",
        "accuracy": "share of those jobs whose EC the labeller predicts as the clustering label (NaN when "
        "n_jobs = 0)",
        "labeller": "which labeller: sim_view (models.sim_labeller, trained on the training sequences' jobs as "
        "the simulator shows them) or classifier (the saved EC classifier's serving copy, trained without the "
        "test workloads' groups: sim__ec_serving; fed the simulator's quantised steps)",
        "constant_accuracy": "accuracy of always predicting the most frequent EC of the source's training jobs "
        "on the same test jobs (NaN when n_jobs = 0)",
    },
    "ec__classifier_accuracy": {
        "accuracy": "held-out accuracy of the EC classifier, mean over the splits",
        "n_train": "workloads in a training split (mean over the splits)",
        "n_test": "workloads in a held-out split (mean over the splits)",
    },
    "ec__method_assignments": {
        "method": "EC distance whose mapping this is: aggregate, temporal or dtw (as in ec__method_comparison)",
        "k": "number of ECs of the method's mapping: the k the choice rule picks among this method's rows of "
        "ec__method_comparison (the largest median paired gain among its rows passing the Holm-corrected "
        "test, else the method's silhouette-best k)",
    },
    "core__usage_counts": {"count": "what is counted (rows_in, rows_dropped_<reason>, bins_out, ...)"},
    "raw_quarantine": {
        "reason": "why the line was set aside: wrong field count, invalid UTF-8 (with the offending bytes), "
        "unparsable, empty mandatory field, non-finite value, value outside the column's declared range, "
        "time going backwards, or 'whole file quarantined' (a Bitbrains VM file with a bad header or no data)"
    },
    "core__long_running_report": {"n_workloads": "workloads with this reason (kept: passed the filter)"},
    "core__long_running_judged": {
        "reason": "the verdict on this workload: kept, or the first reason it was dropped (REASONS order)"
    },
}
"""Table -> column -> what it holds in that table, where it says more than `COLUMN_DOCS`."""


def direction(column: str, better: Mapping[str, str] = BETTER) -> str | None:
    """'higher' or 'lower' where the column is a score in `better`, else None."""
    return better.get(column) or None


def describe(column: str, table: str | None = None, better: Mapping[str, str] = BETTER) -> str | None:
    """The column's description in `table` (or in any table), with its direction for a score of `better`
    (callers that know the simulator's episode metrics add `sim.evaluate.METRIC_BETTER`); None when unknown."""
    text = TABLE_COLUMN_DOCS.get(table or "", {}).get(column) or COLUMN_DOCS.get(column)
    if not text:
        return None
    way = direction(column, better)
    return f"{text}. {way.capitalize()} is better." if way else text


def undocumented(columns: Iterable[str], table: str | None = None) -> list[str]:
    """The columns with no description, in order."""
    return [c for c in columns if describe(c, table) is None]


def undocumented_in_warehouse(root: str | Path) -> dict[str, list[str]]:
    """Table -> its columns with no description, for every table stored under `root`/tables (empty when every
    column of every table is documented)."""
    out: dict[str, list[str]] = {}
    tables = Path(root) / "tables"
    for folder in sorted(p for p in tables.iterdir() if p.is_dir()) if tables.is_dir() else []:
        files = sorted(folder.glob("**/*.parquet"))
        if files:
            missing = undocumented(pl.read_parquet_schema(files[0]), folder.name)
            if missing:
                out[folder.name] = missing
    return out
