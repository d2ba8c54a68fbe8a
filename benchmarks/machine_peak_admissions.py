"""What `forecast_machine_peak` admits beyond requests, and how often it was right: the predicted chance of
exceeding capacity against the realised rate, per setting, on the validation sequences of one (source, load).

The model is fitted as `fit_machine_peak_rule` fits it (the fit part of the training split, calibrated on the
validation part unless `--calibrate-on fit`, the fallback chosen on validation; without EC labels, so
`forecast_machine_peak_noec`'s model); each setting's rule is then rolled on the validation part (so, calibrated
there, its chance is scored in-sample: `--calibrate-on fit` shows how the fit part's calibration carries to the
validation workloads), and at every decision where it places the head on a machine in use whose requests do NOT fit
(a placement beyond requests) the script records the model's chance of exceeding for that machine, the expected
charge and the saving `sim.risk.packing_gain` estimates, and the truth: whether the machine's summed usage with
the head exceeded capacity within the horizon while the head or a running job lived (`machine_targets`, read only
here, for scoring: the classifier's own target event, background noise aside). The sequences are those of
`bench_placement.py` (the same step, sizes and seed). Prints, per setting: placements beyond requests (a total
over the validation sequences), mean predicted chance, realised exceed rate, mean charge and estimated saving,
and the mean validation return and overshoot penalty per sequence.

    python benchmarks/machine_peak_admissions.py --warehouse warehouse [--source bitbrains] [--load 50]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.bench_placement import real_sequences
from models.machine_forecast import (
    CALIBRATE_ON,
    FIT_CASES,
    MachinePeakConfig,
    fit_machine_peak,
    machine_features,
    machine_targets,
)
from pipelines.job_sequences import SequenceConfig
from sim import core
from sim.config import SimConfig
from sim.core import machines_used
from sim.evaluate import _fit_context
from sim.policies import decide, free_by_requests
from sim.risk import MachinePeakPacking, jobs_per_machine, packing_gain
from sim.tuning import TUNING_PRESETS

SETTINGS = (
    ("quantile 0.95", {"level": 0.95}),
    ("quantile 0.9", {"level": 0.9}),
    ("quantile 0.8", {"level": 0.8}),
    ("epsilon 0.01", {"level": 0.5, "epsilon": 0.01}),
    ("epsilon 0.03", {"level": 0.5, "epsilon": 0.03}),
    ("epsilon 0.1", {"level": 0.5, "epsilon": 0.1}),
    ("cost_scale 0.25", {"level": 0.5, "cost_scale": 0.25}),
    ("cost_scale 0.5", {"level": 0.5, "cost_scale": 0.5}),
    ("cost_scale 1", {"level": 0.5, "cost_scale": 1.0}),
)


def admissions(cfg: SimConfig, jobs, rule: MachinePeakPacking, model, horizon: int, seed: int) -> dict:
    """Roll `rule` on `jobs` and score its placements beyond requests (module docstring)."""
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    n_m = cfg.n_machines
    predicted, realised, charge, gain = [], [], [], []
    while not state.is_done.all():
        state, act = decide(rule, cfg, state, rng)
        rows = np.flatnonzero((act < n_m) & ~state.is_done)
        if rows.size:
            m = act[rows]
            head = core.queue_head(state).request[rows]
            fits = (head <= free_by_requests(cfg, state)[rows, m]).all(axis=1)
            beyond = rows[machines_used(state)[rows, m] & ~fits]
            if beyond.size:
                mb = act[beyond]
                x = machine_features(cfg, state, beyond, horizon, model.config, model.use_labels)
                pick = np.arange(beyond.size)
                p = model.exceed(x)[pick, mb]
                predicted.append(p)
                realised.append(
                    (machine_targets(cfg, state, beyond, horizon)[pick, mb] > 1.0 + 1e-9).any(axis=1)
                )
                charge.append(p * cfg.k_overshoot * (jobs_per_machine(state)[beyond, mb] + 1))
                gain.append(packing_gain(cfg, state, beyond)[pick, mb])
        state, *_ = core.step(cfg, state, act)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0)  # noqa: E731
    predicted, realised, charge, gain = cat(predicted), cat(realised), cat(charge), cat(gain)
    totals = state.penalty_totals.sum(axis=1)
    return {
        "beyond_requests": int(predicted.size),
        "mean_predicted": float(predicted.mean()) if predicted.size else float("nan"),
        "realised_rate": float(realised.mean()) if realised.size else float("nan"),
        "mean_charge": float(charge.mean()) if charge.size else float("nan"),
        "mean_gain": float(gain.mean()) if gain.size else float("nan"),
        "validation_return": float(totals.mean()),
        "overshoot_penalty": float(state.penalty_totals[:, 2].mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--source", default="bitbrains")
    ap.add_argument("--load", type=int, default=50)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument(
        "--step-bins", type=int, default=6, help="5-minute bins per step (bench_placement.py's 6)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tuning", default="quick")
    ap.add_argument(
        "--fit-cases",
        default="beyond_requests",
        choices=FIT_CASES,
        help="the cases the model is fitted and calibrated on (MachinePeakConfig.fit_cases)",
    )
    ap.add_argument(
        "--calibrate-on",
        default="validation",
        choices=CALIBRATE_ON,
        help="MachinePeakConfig.calibrate_on (validation: the figures below are then in-sample for calibration)",
    )
    ap.add_argument("--round-level", type=float, default=0.95, help="MachinePeakConfig.round_level")
    ap.add_argument("--modes", default="deviate,pack", help="comma-separated modes to roll")
    args = ap.parse_args()
    seq_cfg = SequenceConfig(
        loads_pct=(args.load,),
        step_bins=args.step_bins,
        n_train_sequences=args.n_train,
        seed=args.seed,
    )
    frame = real_sequences(Path(args.warehouse), args.source, seq_cfg)
    cell = frame.filter(pl.col("load_pct") == args.load)
    if cell.filter(pl.col("split") == "train").height == 0:
        raise SystemExit(f"{args.source} {args.load} %: no training rows in {args.warehouse}")
    cfg = SimConfig(
        n_machines=10, max_steps=1000, oversize="clip", n_labels=max(16, int(cell["ec_label"].max() or 0) + 1)
    )
    tuning = replace(TUNING_PRESETS[args.tuning], seed=args.seed)
    ctx = _fit_context(cell, args.source, args.load, cfg, tuning, None)
    fit, validation = ctx.split()
    t0 = time.perf_counter()
    fallback = ctx.best_fallback()
    mcfg = MachinePeakConfig(
        seed=args.seed, fit_cases=args.fit_cases, round_level=args.round_level, calibrate_on=args.calibrate_on
    )
    model = fit_machine_peak(
        cfg,
        fit,
        fallback,
        ctx.horizon(),
        mcfg,
        False,
        None,
        args.seed,
        calibration_jobs=validation,
    )
    print(
        f"{args.source} {args.load} %: fallback {ctx.fallback_choice()['fallback']}, model fitted on "
        f"{args.fit_cases} cases ({model.report['n_cases']}; exceed {model.report['exceed']}) in "
        f"{time.perf_counter() - t0:.0f} s on {fit.batch_size} sequences; {validation.batch_size} validate",
        flush=True,
    )
    rows = []
    for name, knobs in SETTINGS:
        for mode in args.modes.split(","):
            rule = MachinePeakPacking(model, fallback, mode=mode, name="forecast_machine_peak_noec", **knobs)
            rows.append(
                {
                    "setting": name,
                    "mode": mode,
                    **admissions(cfg, validation, rule, model, ctx.horizon(), args.seed),
                }
            )
            print(f"  {rows[-1]}", flush=True)
    with pl.Config(tbl_rows=40, tbl_cols=10, tbl_width_chars=200, float_precision=4):
        print(pl.DataFrame(rows))


if __name__ == "__main__":
    main()
