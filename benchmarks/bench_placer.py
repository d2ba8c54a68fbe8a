"""The learned scheduler (`models.forecast_placer`) on one (source, load): DeepPlace's synthetic workload at 50 % by
default, or a real source's sequences cut from a warehouse a `tvw-run` filled (`--source`, `--request-mode`).

Trains on the TRAINING sequences only (validation carved from them): the learned forecaster
(`models.usage_forecast`, "sample" preset) and the base rule (the hybrid, fitted by `sim.tuning` on the same
validation sequences) first, then the residual policy by each algorithm of `--algorithms` and with each advisor
of `--advisor`, with the same budget; the variant with the best validation return is the policy (a measured
choice, never on test sequences; OUT/variants.parquet). Prints:

- decisions/s of the training rollout (base rule, forecasts, features and network) beside the bare step rate of the
  simulator on the same batch;
- seconds per stage and per PG iteration, and the stage table (stage, iteration, validation return, imitation
  accuracy, entropy, seconds);
- the test return of the policy against its base rule and Tetris, paired by sequence with a 95 % interval, at
  M = 10 and at M = 50 (the same weights; M = 50 sequences are DeepPlace's test templates, or a real source's same
  test workloads, at the same load of a 50-machine cluster), and against the best non-oracle heuristic and
  `forecast_peak` (`--compare`, fitted at M = 10), with every policy's mean overshoot and machines used and
  the bar's check of ours against Tetris (overshoot at most Tetris's + 0.5 point, no more machines); every
  policy's return, overshoot % and machines per test sequence go to OUT/test_returns_m{M}.parquet.
  `--checkpoint` evaluates an earlier run's policy instead of training one.

    python benchmarks/bench_placer.py [--n-train 40] [--n-test 30] [--load 50] [--budget 150] [--iterations 30] [--out /tmp/placer]
        [--device cuda] [--source google2011_derived --warehouse warehouse --request-mode trace]
        [--n-sequences 28 --n-rollouts 14]   (envs per PG iteration: sequences x rollouts, default 8 x 4;
        PGPE: sequences x 2 x pgpe_pairs)
        [--algorithms pgpe --base hybrid_observed --inputs table --choice-z 1.645 --compare '']
        [--advisor forecast_peak]   (a second rule whose action gets a learned bonus, 0 at the start; 'none,forecast_peak'
        trains both and keeps the better on validation; --workers 2 trains them at once, one per core)
        [--action-set rule | valid | safe --safe-level 0.5]   (which machines the policy may take: by default the
        base's and advisor's actions and those safe at the level the fitted forecast_peak packs at)
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from benchmarks.placer_replicates import OVERSHOOT_POINTS, footprint_clauses
from models.forecast_placer import (
    INPUTS,
    ForecastResidualPolicy,
    PlacerConfig,
    bare_step_rate,
    charge_n_ref,
    choose_variant,
    fit_base_rule,
    forecaster_levels,
    kept_return,
    paired_interval,
    peak_rule_level,
    with_rule_level,
)
from models.placer_guard import GUARD_KNOBS, GUARDED
from models.placer_guard import guard as guard_placer
from models.placer_variants import Variant, train_variants
from models.sim_labeller import SimLabellerConfig, fit_labeller_if_labelled
from pipelines.synthetic import DeepPlaceConfig, build_deepplace_sequences
from sim.config import SimConfig
from sim.forecast import uncached
from sim.jobs import JobBatch
from sim.labelling import ServedLabels
from sim.policies import make_policy, policy_kind
from sim.risk import PEAK_RULES
from sim.tuning import CHOICE_DETAILS, TuningConfig, sequence_outcomes

SETTINGS = {
    "reinforce": {"base_bonus": 4.0, "learning_rate": 1e-3, "patience": 10},
    "ppo": {"base_bonus": 4.0, "learning_rate": 1e-3, "patience": 10},
    "vine": {
        "base_bonus": 2.0,
        "learning_rate": 3e-3,
        "patience": 100,
        "vine_window": None,
        "vine_points": 4,
        "vine_candidates": 3,
        "vine_epochs": 30,
        "vine_temperature": 0.25,
    },
    "pgpe": {
        "base_bonus": 2.0,
        "patience": 100,
        "pgpe_pairs": 8,
        "pgpe_sigma": 1.0,
        "pgpe_learning_rate": 0.2,
    },
}
"""Per algorithm: a larger base bonus for the sampling algorithms (their exploration costs overshoots: at 3.0 the
sampled training return was twice the base rule's cost), a smaller one for vine (its trunk is greedy; the bonus is
the margin a residual must learn to deviate). Measured on DeepPlace 50 % (40 training sequences, 150 s each): neither
REINFORCE nor PPO changed a greedy decision; vine did, and every policy that deviated lost on validation (branches
cut at 80 decisions with a linear expected-advantage objective: -2.17e6 to -17.2e6 against the base's -2.07e6;
branches to the episode's end with these settings: -2.33e6 after one iteration, -4.28e6 after nine)."""


def deepplace(load: int, n_train: int, n_test: int, n_machines: int, seed: int) -> tuple[JobBatch, JobBatch]:
    """(train, test) sequences of DeepPlace's workload at `load` % of an `n_machines` cluster."""
    cfg = replace(
        DeepPlaceConfig(),
        n_train_sequences=max(n_train, 1),
        n_test_sequences=n_test,
        loads_pct=(load,),
        n_machines=n_machines,
        seed=seed,
    )
    frame, _ = build_deepplace_sequences(cfg)
    split = [JobBatch.from_frame(frame.filter(pl.col("split") == s)) for s in ("train", "test")]
    return split[0], split[1]


def real_source(
    warehouse: Path,
    source: str,
    load: int,
    n_train: int,
    n_test: int,
    seed: int,
    request_mode: str,
    n_machines: int = 10,
) -> tuple[JobBatch, JobBatch]:
    """(train, test) sequences of a real source at `load` % of an `n_machines` cluster, cut from a warehouse a
    `tvw-run` filled (its core tables and EC labels), as `bench_placement.py` cuts them. The workload split
    follows the seed, not M: the same seed's train and test workloads at M = 10 and 50 (`main` checks)."""
    from benchmarks.bench_placement import real_sequences
    from pipelines.job_sequences import SequenceConfig

    cfg = SequenceConfig(
        loads_pct=(load,),
        step_bins=6,
        n_train_sequences=n_train,
        n_test_sequences=n_test,
        seed=seed,
        request_mode=request_mode,
        n_machines=n_machines,
    )
    frame = real_sequences(warehouse, source, cfg).filter(pl.col("load_pct") == load)
    split = [JobBatch.from_frame(frame.filter(pl.col("split") == s)) for s in ("train", "test")]
    return split[0], split[1]


def no_training_workloads(train: JobBatch, test: JobBatch, what: str) -> None:
    """SystemExit naming `what` where the test sequences hold a workload the training sequences hold (test
    sequences cut again for another cluster size must keep the seed's workload split)."""
    trained_on = {w for ids in train.workload_ids for w in ids}
    leaked = trained_on & {w for ids in test.workload_ids for w in ids}
    if leaked:
        raise SystemExit(f"{what} hold {len(leaked)} training workloads, e.g. {sorted(leaked)[:3]}")


def sim_config(n_machines: int, n_labels: int) -> SimConfig:
    return SimConfig(n_machines=n_machines, max_steps=1000, oversize="clip", n_labels=max(16, n_labels))


COMPARE = (
    "best_fit",
    "first_fit",
    "tetris",
    "kube_default",
    "deeprm_sjf",
    "deeprm_packer",
    "hybrid_observed",
    "n_sigma_observed",
    "max_pct_n_sigma_observed",
    "forecast_peak",
    "forecast_peak_adaptive",
)
"""The rules `--compare` runs by default: every non-oracle heuristic of `eval__results` (request-based, the hybrid,
Google's predictors) and the forecast rule that meets the bar (its knobs fitted on the same training split)."""


def compared_rules(names: list[str], base_name: str, base, ctx, known: dict | None = None) -> dict:
    """{name: policy} of `names`: the base rule as fitted, those of `known` ({name: policy} fitted already) as
    they are, the other fitted rules fitted on `ctx` (the base's FitContext: the same fit and validation split),
    the rest as registered."""
    from sim.policies import POLICIES, is_fitted

    rules = {}
    for name in names:
        if name == base_name:
            rules[name] = base
        elif known and name in known:
            rules[name] = known[name]
        elif is_fitted(name):
            fitted = POLICIES[name].fit(ctx)
            if fitted is None:
                print(f"    {name}: cannot be fitted here; left out")
                continue
            rules[name] = fitted
        else:
            rules[name] = make_policy(name)
    return rules


def rule_binding(
    ctx, base_name: str, base, advisors: dict, action_set: str, rule_charge: bool
) -> tuple[float | None, float | None]:
    """(safe_level, n_ref) that every variant's action set "rule" is bound with (`with_rule_level`): the level the
    fitted `forecast_peak` packs at and, with `rule_charge`, the charge-aware rule's n_ref (the advisors' before the
    base's); (None, None) for another action set. `advisors`: {name: the fitted rule, or None for none}."""
    if action_set != "rule":
        return None, None
    level = peak_rule_level(ctx, {base_name: base, **advisors})
    n_ref = charge_n_ref(ctx, {**advisors, base_name: base}) if rule_charge else None  # advisors first
    return level, n_ref


def outcomes(rule, cfg, test, seed: int, labeller) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(return, overshoot %, machines used) per test sequence (`sim.tuning.sequence_outcomes`), the rule served
    the labeller's EC labels where one is given."""
    return sequence_outcomes(rule if labeller is None else ServedLabels(rule, labeller), cfg, test, seed)


def show_pairs(name: str, ours: np.ndarray, other: np.ndarray) -> None:
    mean, lo, hi = paired_interval(ours - other)
    better = int((ours > other).sum())
    print(
        f"    vs {name:<16} {mean / 1e6:+.4f} [{lo / 1e6:+.4f}, {hi / 1e6:+.4f}] x1e6, "
        f"better on {better}/{ours.size}, worse on {int((ours < other).sum())}/{ours.size}"
    )


def none_or(kind: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type: 'none' (any case) is None, anything else `kind(value)`."""
    return lambda value: None if value.lower() == "none" else kind(value)


def training_budget(budget: float | None, iterations: int | None) -> float:
    """Seconds of training per variant: `budget`, else 150 s where no iteration count is given, else none."""
    if budget is not None:
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"--budget must be a finite number of seconds > 0, got {budget}")
        return budget
    return 150.0 if iterations is None else 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--source",
        default="deepplace_synthetic",
        help="deepplace_synthetic, or a real source (bitbrains, google2011_derived) cut from --warehouse",
    )
    ap.add_argument("--warehouse", default="warehouse", help="a tvw-run warehouse (real sources only)")
    ap.add_argument(
        "--request-mode", default="peak", choices=("peak", "trace"), help="real sources' requests"
    )
    ap.add_argument("--load", type=int, default=50)
    ap.add_argument("--n-train", type=int, default=40)
    ap.add_argument("--n-test", type=int, default=30)
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="training seconds per variant (default: 150 without --iterations, none with it); with --iterations "
        "both apply: at most that many iterations, none begun after the budget (a kept iteration reached within "
        "it is kept either way: the running best is a prefix's)",
    )
    ap.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="run exactly this many PG iterations (patience aside) with no time budget: replicates then do not "
        "depend on how busy the machine is (default: 200, cut by --budget)",
    )
    ap.add_argument("--algorithms", default="reinforce,ppo,vine,pgpe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-m50", action="store_true")
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="evaluate this saved policy (an earlier run's OUT/forecast_residual_rl.pt, same source, load and "
        "seed) instead of training one: e.g. its M = 50 cell",
    )
    ap.add_argument(
        "--action-set",
        default=PlacerConfig.action_set,
        choices=("valid", "safe", "rule"),
        help="PlacerConfig.action_set: every valid action; the base's and advisor's actions and the machines safe "
        "at the top input level (safe) or at the level the fitted forecast_peak packs at (rule, the default)",
    )
    ap.add_argument(
        "--safe-level",
        type=float,
        default=None,
        help="PlacerConfig.safe_level for --action-set safe: the input level whose bound defines a safe machine "
        "(default: the top one, 0.99; 0.5, 0.9 and 0.99 are the inputs' levels)",
    )
    ap.add_argument("--base-bonus", type=float, default=None, help="override each algorithm's base bonus")
    ap.add_argument(
        "--choice-z",
        type=float,
        default=PlacerConfig.choice_z,
        help="PlacerConfig.choice_z: keep the iteration with the best lower bound of its paired validation gain "
        "over the base rule (0: the best mean validation return)",
    )
    ap.add_argument(
        "--overshoot-budget",
        type=none_or(float),
        default=PlacerConfig.overshoot_budget_pct,
        help="PlacerConfig.overshoot_budget_pct: a kept iteration's validation overshoot at most Tetris's + this "
        "many points where any is (default: half the bar's 0.5); 'none': the best validation score alone",
    )
    ap.add_argument(
        "--rule-shift",
        action=argparse.BooleanOptionalAction,
        default=PlacerConfig.rule_shift,
        help="PlacerConfig.rule_shift: action set 'rule''s level follows each episode's rate of rising jobs "
        "(sim.rise_shift), as forecast_peak_adaptive's does",
    )
    ap.add_argument(
        "--rule-charge",
        action=argparse.BooleanOptionalAction,
        default=PlacerConfig.rule_charge,
        help="PlacerConfig.rule_charge: action set 'rule''s level on each machine follows the jobs an overshoot "
        "there would charge (sim.charge_level), as forecast_peak_charge_guard's does",
    )
    ap.add_argument(
        "--advisor-probe",
        action=argparse.BooleanOptionalAction,
        default=PlacerConfig.advisor_probe,
        help="PlacerConfig.advisor_probe: an advised variant validates the advisor's start before PG and begins "
        "there where the keep rule prefers it (--no-advisor-probe: the advice bonus starts at 0 only, as every "
        "run before 2026-12-05's eighth session)",
    )
    ap.add_argument(
        "--generalise-factor",
        type=none_or(int),
        default=PlacerConfig.generalise_factor,
        help="PlacerConfig.generalise_factor: a kept iteration is not significantly below the base rule on the "
        "validation sequences superposed this many at a time (5: M = 50); 'none' (the default): M = 10 alone",
    )
    ap.add_argument(
        "--base",
        default="hybrid_observed",
        help="fitted base rule: hybrid_observed or forecast_recall_hybrid (then the features' forecaster recalls "
        "earlier runs of a recurring workload too)",
    )
    ap.add_argument(
        "--advisor",
        default="",
        help="a second fitted rule (e.g. forecast_peak) whose action gets its own learned bonus, 0 at the start "
        "(PGPE only; '' for none): training may learn to follow it where it does better than the base; a comma "
        "list ('none,forecast_peak') trains each variant, and the best validation return is the policy",
    )
    ap.add_argument(
        "--inputs",
        default=None,
        choices=INPUTS,
        help="PlacerTrainConfig.inputs: the base rule's remaining-peak table (bases on it), forecast_peak's table "
        "(any base; 'table_no_recall': without recall over it) or the learned forecaster (default: rule where "
        "the base is on the table, else learned)",
    )
    ap.add_argument(
        "--horizon",
        type=int,
        default=PlacerConfig.horizon,
        help="PlacerConfig.horizon: forecast steps the inputs read (default: the forecaster's, the longest "
        "training job)",
    )
    ap.add_argument("--device", default="cpu", help="where the PG updates run (cuda where a GPU is lent)")
    ap.add_argument(
        "--labels",
        default="served",
        choices=("served", "classifier", "clustering"),
        help="EC labels on a real source, served to fitting, training and test: the simulator-view labeller "
        "fitted on the training sequences (as the pipeline serves them), the warehouse's EC classifier's, or the "
        "clustering labels computed from each workload's whole series",
    )
    ap.add_argument(
        "--n-sequences",
        type=int,
        default=None,
        help="PlacerConfig.n_sequences: training sequences per PG iteration",
    )
    ap.add_argument(
        "--n-rollouts",
        type=int,
        default=None,
        help="PlacerConfig.n_rollouts: rollouts of each per PG iteration (REINFORCE, PPO; vine branches instead, "
        "PGPE runs pgpe_pairs perturbed pairs)",
    )
    ap.add_argument(
        "--pgpe-pairs",
        type=int,
        default=None,
        help="PlacerConfig.pgpe_pairs: antithetic pairs of perturbed heads per PGPE iteration, each run on every "
        "training sequence of the iteration",
    )
    ap.add_argument(
        "--compare",
        default=",".join(COMPARE),
        help="rules run on the M = 10 test sequences beside ours (fitted ones on the same training split; '' for "
        "none): ours is printed against the best heuristic among them (by test mean) and each forecast rule",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that train the variants at once (models.placer_variants; 2 on a 2-core machine: the wall "
        "time of the longer variant, not the sum; the same results for any value). At most the cores granted: "
        "NUMBA_NUM_THREADS, so run it with NUMBA_NUM_THREADS=2 (each worker then runs one numba thread)",
    )
    ap.add_argument(
        "--replay-guard",
        nargs="?",
        const=GUARDED,
        default="",
        help="also evaluate forecast_residual_rl_replay: the learned policy guarded by replays of each episode's "
        "observed past (sim.replay_select.replay_guard: its base's fallback as the overshoot reference, the base, "
        f"the advisors, First-Fit, Best-Fit); or the comma-separated guard variants named (of {list(GUARD_KNOBS)}), "
        "one row each",
    )
    ap.add_argument("--out", default="/tmp/tvw_placer")
    args = ap.parse_args()
    guards = [g for g in args.replay_guard.split(",") if g]
    unknown = [g for g in guards if g not in GUARD_KNOBS]
    if unknown:
        raise SystemExit(f"--replay-guard {unknown}: not guard variants (known: {list(GUARD_KNOBS)})")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stage_s: dict[str, float] = {}

    # data
    t0 = time.perf_counter()
    is_deepplace = args.source == "deepplace_synthetic"

    def cut(n_machines: int, n_train: int) -> tuple[JobBatch, JobBatch]:
        """(train, test) sequences of the cell for an `n_machines` cluster."""
        if is_deepplace:
            return deepplace(args.load, n_train, args.n_test, n_machines, args.seed)
        return real_source(
            Path(args.warehouse),
            args.source,
            args.load,
            n_train,
            args.n_test,
            args.seed,
            args.request_mode,
            n_machines,
        )

    train, test10 = cut(10, args.n_train)
    n_labels = int(max(train.ec_label.max(), test10.ec_label.max())) + 1
    cfg10 = sim_config(10, n_labels)
    requests = "" if is_deepplace else f", {args.request_mode} requests"
    print(
        f"{args.source} {args.load} %{requests}: {train.batch_size} training, {test10.batch_size} test "
        f"sequences (M = 10)"
    )
    stage_s["data"] = time.perf_counter() - t0
    labeller = None
    if not is_deepplace and args.labels == "served":
        # as the pipeline serves: fitted on the training jobs (none where they hold one label; the pipeline
        # would then serve its saved classifier's labels, `--labels classifier` here)
        labeller = fit_labeller_if_labelled(cfg10, train, SimLabellerConfig())
    elif not is_deepplace and args.labels == "classifier":
        from benchmarks.bench_placement import warehouse_labellers

        test_ids = [w for ids in test10.workload_ids for w in ids]
        tested = pl.DataFrame({"source": args.source, "split": "test", "workload_id": test_ids})
        labeller = warehouse_labellers(Path(args.warehouse), tested, "classifier")(args.source)
    print("EC labels:", type(labeller).__name__ if labeller is not None else "the sequences' own")

    # forecaster and base rule, fitted on the training split (validation carved from it)
    t0 = time.perf_counter()
    where = f"{args.source} {args.load} %"
    tuning = TuningConfig(seed=args.seed)
    inputs = args.inputs or ("rule" if args.base in PEAK_RULES else "learned")
    base, forecaster, ctx = fit_base_rule(
        cfg10, train, args.base, "sample", tuning, where, labeller, inputs=inputs
    )
    print(f"residual's inputs: {inputs} ({type(uncached(forecaster)).__name__})")
    choice = ctx.choices[args.base]
    stage_s["forecaster_and_base_rule"] = time.perf_counter() - t0
    knobs = {k: v for k, v in choice.items() if k not in CHOICE_DETAILS}
    print(f"base rule: {knobs}")
    advisors: dict[str, object] = {}  # "" = no advisor
    for name in dict.fromkeys("" if a == "none" else a for a in args.advisor.split(",")):
        if not name:
            advisors[name] = None
            continue
        advisors[name] = compared_rules([name], args.base, base, ctx).get(name)
        if advisors[name] is None:
            raise SystemExit(f"--advisor {name}: cannot be fitted on {where}")
        print(f"advisor: {name} {ctx.choices.get(name, {}).get('level', '')}")

    # --action-set rule: the level forecast_peak packs at (and the charge's n_ref), for every variant alike
    safe_level, n_ref = rule_binding(ctx, args.base, base, advisors, args.action_set, args.rule_charge)
    if args.action_set == "rule":
        print(f"action set 'rule': safe at forecast_peak's level {safe_level} (None: the top level)")
    charged = args.rule_charge and args.action_set == "rule"  # PlacerConfig refuses rule_charge otherwise
    if charged:
        print(f"rule_charge: n_ref {n_ref} (None: off, forecast_peak_charge_guard has no charge level here)")

    if args.checkpoint is None:
        # training: every (algorithm, advisor) variant with the same budget; the best validation return wins
        todo: list[Variant] = []
        variants = [(a, v) for a in args.algorithms.split(",") for v in advisors]
        for algorithm, advisor_name in variants:
            label = algorithm + (f"+{advisor_name}" if advisor_name else "")
            pcfg = PlacerConfig(
                algorithm=algorithm,
                time_budget_s=training_budget(args.budget, args.iterations),
                n_iterations=200 if args.iterations is None else args.iterations,
                seed=args.seed,
                action_set=args.action_set,
                safe_level=args.safe_level if args.action_set == "safe" else None,
                choice_z=args.choice_z,
                overshoot_budget_pct=args.overshoot_budget,
                generalise_factor=args.generalise_factor,
                advisor_probe=args.advisor_probe,
                rule_shift=args.rule_shift,
                rule_charge=args.rule_charge,
                horizon=args.horizon,
                **{
                    **SETTINGS[algorithm],
                    **({} if args.base_bonus is None else {"base_bonus": args.base_bonus}),
                    **{
                        key: value
                        for key, value in (
                            ("n_sequences", args.n_sequences),
                            ("n_rollouts", args.n_rollouts),
                            ("pgpe_pairs", args.pgpe_pairs),
                        )
                        if value is not None
                    },
                },
            )
            pcfg = with_rule_level(pcfg, safe_level, forecaster_levels(forecaster), n_ref)
            todo.append(Variant(label, pcfg, advisors[advisor_name]))
        t0 = time.perf_counter()
        runs = train_variants(
            cfg10,
            train,
            base,
            forecaster,
            todo,
            args.workers,
            log=lambda m: print("   ", m, flush=True),
            device=args.device,
            labeller=labeller,
        )
        stage_s["train"] = time.perf_counter() - t0
        print(f"training: {len(todo)} variants in {stage_s['train']:.1f} s of wall time")
        for label, (_, table, speed) in runs.items():
            stage_s[f"train_{label}"] = float(table["elapsed_s"].max())
            table.write_parquet(out / f"stages_{label}.parquet")
            pg = table.filter(pl.col("stage") == "pg")
            rate = speed["pg_env_decisions"] / max(speed["pg_rollout_s"], 1e-9)
            print(
                f"{label}: kept iteration {speed['best_iteration']} (PG began at the {speed['start_stage']} start), validation return "
                f"{kept_return(table, speed['best_iteration'], speed['start_stage']) / 1e6:.4f}e6 (base "
                f"{table['validation_return'][0] / 1e6:.4f}e6, best of any iteration "
                f"{table['validation_return'].max() / 1e6:.4f}e6); {pg.height} iterations, "
                f"{pg['seconds'].mean() or 0.0:.1f} s each (rollout {speed['pg_rollout_s'] / max(pg.height, 1):.1f}, update "
                f"{speed['pg_update_s'] / max(pg.height, 1):.2f}, validation "
                f"{speed['validation_s'] / max(table.height, 1):.1f}, {speed['validations_replayed']} of "
                f"{table.height} validations the last one's episodes); training rollout {rate:.0f} decisions/s"
            )
            with pl.Config(tbl_rows=60, tbl_width_chars=160, float_precision=4):
                print(table.with_columns(pl.col("validation_return", "train_return") / 1e6))
        kept = {
            label: kept_return(t, sp["best_iteration"], sp["start_stage"])
            for label, (_, t, sp) in runs.items()
        }
        within = {label: sp["kept_within_budget"] for label, (_, _, sp) in runs.items()}
        # as within one run: a variant within the overshoot budget beats any beyond it (`choose_variant`)
        best_alg = choose_variant({label: (within[label], kept[label]) for label in kept})
        policy, table, speed = runs[best_alg]
        print(f"chosen on validation: {best_alg} (within the overshoot budget: {within})")
        pl.DataFrame(
            {
                "variant": list(kept),
                "kept_validation_return": list(kept.values()),
                "kept_within_budget": [within[label] for label in kept],
                "chosen": [label == best_alg for label in kept],
            }
        ).write_parquet(out / "variants.parquet")
        path = policy.save(out / "forecast_residual_rl.pt")
        print(f"saved {path}")

        # speed beside the bare simulator, on the training rollout's batch shape
        fit_part = ctx.split()[0]
        batch = fit_part.select(np.repeat(np.arange(min(8, fit_part.batch_size)), 4))
        bare = bare_step_rate(cfg10, batch, args.seed)
        rate = speed["pg_env_decisions"] / max(speed["pg_rollout_s"], 1e-9)
        print(
            f"\ntraining rollout: {rate:.0f} decisions/s; bare step rate on the same batch: {bare:.0f} decisions/s"
        )
        print("seconds per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in stage_s.items()))

    else:  # an earlier run's policy: no training here
        path = Path(args.checkpoint)
        if not path.exists():
            raise SystemExit(f"--checkpoint {path}: no such file")
        print(f"evaluating {path} (no training)")

    # test: the same weights at M = 10 and M = 50
    cells = [(10, cfg10, test10)]
    if not args.skip_m50 and is_deepplace:
        _, test50 = cut(50, 0)
        cells.append((50, sim_config(50, n_labels), test50))
    elif not args.skip_m50:  # the same seed's test workloads, cut for 50 machines at the same load
        _, test50 = cut(50, args.n_train)
        no_training_workloads(train, test50, "M = 50 test sequences")
        n_labels = max(n_labels, int(test50.ec_label.max()) + 1)
        cells.append((50, sim_config(50, n_labels), test50))
    t0 = time.perf_counter()
    names = [n for n in args.compare.split(",") if n]
    fitted_advisors = {n: a for n, a in advisors.items() if a is not None}
    rules = compared_rules(names, args.base, base, ctx, fitted_advisors)
    stage_s["fit_compared_rules"] = time.perf_counter() - t0
    for n_m, cfg, test in cells:
        t0 = time.perf_counter()
        loaded = ForecastResidualPolicy(checkpoint=path, labeller=labeller)

        ran = {
            # the checkpoint serves its own labels; Tetris reads none
            "forecast_residual_rl": outcomes(loaded, cfg, test, args.seed, None),
            args.base: outcomes(base, cfg, test, args.seed, labeller),
            "tetris": outcomes(make_policy("tetris"), cfg, test, args.seed, None),
        }
        ours, base_ret, tetris = (ran[n][0] for n in ("forecast_residual_rl", args.base, "tetris"))
        print(
            f"\nM = {n_m}: {test.batch_size} test sequences, mean return x1e6: ours {ours.mean() / 1e6:.4f}, "
            f"base {base_ret.mean() / 1e6:.4f}, tetris {tetris.mean() / 1e6:.4f} ({time.perf_counter() - t0:.0f} s)"
        )
        show_pairs("base rule", ours, base_ret)
        show_pairs("tetris", ours, tetris)
        show_pairs("base vs tetris", base_ret, tetris)
        for variant in guards:
            t0 = time.perf_counter()
            guard = guard_placer(loaded, args.seed, base, tuple(fitted_advisors.values()), variant)
            ran[variant] = outcomes(guard, cfg, test, args.seed, labeller)
            chosen = ", ".join(f"{n} {k}" for n, k in guard.tally.most_common())
            why = ", ".join(f"{n} {k}" for n, k in guard.why.most_common()) or "none"
            print(
                f"    {variant}: {time.perf_counter() - t0:.0f} s, overshoot {ran[variant][1].mean():.3f} % "
                f"(ours {ran['forecast_residual_rl'][1].mean():.3f} %); chosen at checkpoints: {chosen}; "
                f"switches by reason: {why}"
            )
            show_pairs(f"{variant} vs ours", ran[variant][0], ours)
            if variant != guards[0]:
                show_pairs(f"{variant} vs {guards[0]}", ran[variant][0], ran[guards[0]][0])
        # the compared rules as fitted at M = 10, at either M (their knobs carry over as our weights do)
        for name, rule in rules.items():
            if name not in ran:
                ran[name] = outcomes(rule, cfg, test, args.seed, labeller)
        labels = {
            "forecast_residual_rl": "forecast_residual_rl",
            args.base: f"base:{args.base}",
            "tetris": "tetris",
        }
        labels |= {variant: variant for variant in guards}
        rows = [(label, ran[name]) for name, label in labels.items()]
        rows += [
            (name, ran[name]) for name in rules if name not in labels.values()
        ]  # the base by its own name
        # per test sequence, for pooling replicates by sequence (benchmarks/placer_replicates.py; each seed draws
        # its own sequences, so a replicate is paired within itself)
        pl.DataFrame(
            [
                {
                    "n_machines": n_m,
                    "seed": args.seed,
                    "policy": name,
                    "sequence": i,
                    "return": float(ret[i]),
                    "overshoot_pct": float(over[i]),
                    "machines": float(used[i]),
                }
                for name, (ret, over, used) in rows
                for i in range(ret.size)
            ]
        ).write_parquet(out / f"test_returns_m{n_m}.parquet")
        if not rules:
            continue
        returns = {name: ran[name][0] for name in rules}
        for name, ret in sorted(returns.items(), key=lambda kv: -kv[1].mean()):
            print(
                f"    {name:<26} {ret.mean() / 1e6:.4f} ({policy_kind(name)}); overshoot "
                f"{ran[name][1].mean():.3f} %, machines {ran[name][2].mean():.2f}"
            )
        heuristics = {n: r for n, r in returns.items() if policy_kind(n) == "heuristic"}
        if heuristics:
            best = max(heuristics, key=lambda n: heuristics[n].mean())
            show_pairs(f"best heuristic ({best})", ours, heuristics[best])
        for name in (n for n in returns if policy_kind(n) == "forecast"):
            show_pairs(name, ours, returns[name])
        over, used = ran["forecast_residual_rl"][1].mean(), ran["forecast_residual_rl"][2].mean()
        t_over, t_used = ran["tetris"][1].mean(), ran["tetris"][2].mean()
        within, no_more = footprint_clauses(over, used, t_over, t_used)
        print(
            f"    ours: overshoot {over:.3f} % (Tetris {t_over:.3f} %: {'within' if within else 'ABOVE'} "
            f"its + {OVERSHOOT_POINTS} point), machines {used:.2f} (Tetris {t_used:.2f}: "
            f"{'no more' if no_more else 'MORE'})"
        )


if __name__ == "__main__":
    main()
