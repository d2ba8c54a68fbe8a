"""Issue 22, item 8: decisions/s of the rollout the learned placer trains with (`models.forecast_placer.run_rollout`:
its base rule, the job pick, served EC labels, the per-machine forecast features and the network) at M = 10 with B x N = 400 envs (the fit part's sequences repeated over
rollouts), printed beside the bare simulator's step rate on the same batch (`bare_step_rate`: a valid-action
policy, no observations), with the numpy step and with the compiled in-place step the rollout now uses
(`sim.compiled_step`). The rollout and the bare loop alternate in one process over `--repeats` (the machine is
shared: compare within a run); every repeat must give the same returns.

    PYTHONPATH=. python benchmarks/bench_placer_rollout.py --warehouse warehouse [--source bitbrains] [--load 50]
        [--base forecast_peak] [--inputs rule] [--envs 400] [--repeats 3] [--profile 25] [--threads 1,2] [--pieces]

`--learner pgpe` (the default, as `PlacerConfig.algorithm`): the rollout a PGPE iteration runs, greedy and not
recorded, each env scored by one of 2 x `pgpe_pairs` perturbed heads (`PopulationPolicy`); `--learner sampled`:
the sampled, recorded rollout of REINFORCE and PPO.

`--pieces` alternates each rollout with one whose decisions run as separate pieces (the base rule, the mask and
the inputs one by one, as before `models.placer_kernel.decide`) and prints the paired ratio: on a shared machine
whose speed moves by a third from run to run, a ratio within one process is the figure to trust. Without
`--warehouse` it runs on DeepPlace's synthetic workload. `--profile N` adds cProfile's N costliest
functions of one more rollout (by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import time
from dataclasses import replace
from pathlib import Path

import numba
import numpy as np
import torch

from benchmarks.bench_placer import compared_rules, deepplace, real_source, rule_binding, sim_config
from models.forecast_placer import (
    INPUTS,
    ForecastResidualPolicy,
    PlacerConfig,
    PopulationPolicy,
    antithetic_heads,
    bare_step_rate,
    fit_base_rule,
    forecaster_levels,
    head_coordinates,
    run_rollout,
    with_rule_level,
)
from models.forecaster import torch_threads
from models.sim_labeller import SimLabellerConfig, fit_labeller_if_labelled
from sim.risk import PEAK_RULES
from sim.tuning import TUNING_PRESETS


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warehouse", default=None, help="a warehouse a tvw-run filled (else DeepPlace)")
    parser.add_argument("--source", default="bitbrains")
    parser.add_argument("--load", type=int, default=50)
    parser.add_argument("--request-mode", default="peak", choices=("peak", "trace"))
    parser.add_argument("--n-train", type=int, default=40)
    parser.add_argument("--base", default="forecast_peak")
    parser.add_argument("--inputs", default=None, choices=INPUTS, help="default: rule on a peak rule")
    parser.add_argument(
        "--advisor",
        default="",
        help="a second fitted rule whose action gets a learned bonus, as bench_placer's --advisor (one name; '' "
        "none): the README's configuration trains a variant advised by forecast_peak_charge_guard",
    )
    parser.add_argument(
        "--rule-charge",
        action=argparse.BooleanOptionalAction,
        default=PlacerConfig.rule_charge,
        help="PlacerConfig.rule_charge: action set 'rule''s level on each machine follows the jobs an overshoot "
        "there would charge, bound as bench_placer binds it",
    )
    parser.add_argument("--envs", type=int, default=400, help="B x N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--learner",
        default="pgpe" if PlacerConfig.algorithm == "pgpe" else "sampled",
        choices=("pgpe", "sampled"),
        help="the rollout of a PGPE iteration (greedy, perturbed heads) or of REINFORCE / PPO (sampled, recorded)",
    )
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument(
        "--threads",
        default=None,
        help="numba thread counts to alternate within each repeat, e.g. 1,2 (default: numba's own count); "
        "the kernels use threads for batches of sim.compiled_step.PARALLEL_MIN_ENVS envs or more",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pieces", action="store_true", help="alternate with the decision as separate pieces; paired ratio"
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    if args.warehouse:
        train, _ = real_source(
            Path(args.warehouse), args.source, args.load, args.n_train, 5, args.seed, args.request_mode
        )
        where = f"{args.source} {args.load} %"
    else:
        train, _ = deepplace(args.load, args.n_train, 5, 10, args.seed)
        where = f"deepplace {args.load} %"
    n_labels = int(train.ec_label.max()) + 1
    cfg = sim_config(10, n_labels)
    labeller = fit_labeller_if_labelled(cfg, train, SimLabellerConfig()) if args.warehouse else None
    inputs = args.inputs or ("rule" if args.base in PEAK_RULES else "learned")
    tuning = replace(TUNING_PRESETS["smoke"], seed=args.seed)
    base, forecaster, ctx = fit_base_rule(
        cfg, train, args.base, "sample", tuning, where, labeller, inputs=inputs
    )
    advisor = None
    if args.advisor:
        advisor = compared_rules([args.advisor], args.base, base, ctx).get(args.advisor)
        if advisor is None:
            raise SystemExit(f"--advisor {args.advisor}: cannot be fitted on {where}")
    pcfg = PlacerConfig(rule_charge=args.rule_charge)
    advisors = {args.advisor: advisor} if advisor is not None else {}
    level, n_ref = rule_binding(ctx, args.base, base, advisors, pcfg.action_set, args.rule_charge)
    pcfg = with_rule_level(pcfg, level, forecaster_levels(forecaster), n_ref)  # as bench_placer binds it
    if args.rule_charge and not pcfg.rule_charge:
        print("rule_charge off: no charge-aware rule with an n_ref among the base and the advisor")
    policy = ForecastResidualPolicy(
        base=base, forecaster=forecaster, config=pcfg, labeller=labeller, advisor=advisor
    )
    fit = ctx.split()[0]
    fit.observed_prefix  # noqa: B018  as training: computed once, shared by every selection of the fit part
    batch = fit.select(np.resize(np.arange(fit.batch_size), args.envs))
    trained, mode, keep, entropy = policy, "sample", True, True  # REINFORCE / PPO: sampled and recorded
    if args.learner == "pgpe":  # PGPE: greedy, unrecorded, each env on one of an iteration's perturbed heads
        pcfg = policy.config
        with torch_threads(1):
            start = fit.select(np.arange(min(pcfg.n_sequences, fit.batch_size)))
            anchor, scales, _ = head_coordinates(policy, cfg, start, args.seed, np.random.default_rng(0))
        eps = np.random.default_rng(args.seed).standard_normal((pcfg.pgpe_pairs, anchor.numel()))
        heads = antithetic_heads(
            policy.ready(cfg),
            anchor,
            scales,
            torch.zeros_like(anchor),
            torch.from_numpy(eps.astype(np.float32)),
            pcfg.pgpe_sigma,
        )
        trained = PopulationPolicy(policy, heads, np.arange(batch.batch_size) % (2 * pcfg.pgpe_pairs))
        mode, keep, entropy = "greedy", False, False  # as `pgpe_step`: no softmax, returns only
    print(
        f"{where}, base {args.base}, inputs {inputs}, advisor {args.advisor or 'none'}, rule_charge "
        f"{policy.config.rule_charge}: B x N = {batch.batch_size} envs ({fit.batch_size} fit "
        f"sequences repeated), M = 10, the {args.learner} learner's rollout; set-up {time.perf_counter() - t0:.0f} s"
    )

    bares, compiled = [], []
    with torch_threads(1):
        t = time.perf_counter()  # numba compiles each kernel on its first call (cached on disk afterwards)
        run_rollout(
            trained, cfg, batch, args.seed, mode, np.random.default_rng(0), keep=keep, entropy=entropy
        )
        bare_step_rate(cfg, batch, args.seed, in_place=True)
        print(
            f"  warm-up rollout (not counted; numba compiles on a first run): {time.perf_counter() - t:.1f} s; "
            f"numba threads {numba.get_num_threads()}, torch threads 1"
        )
        counts = [int(n) for n in args.threads.split(",")] if args.threads else [numba.get_num_threads()]
        by_count: dict[int, list[float]] = {n: [] for n in counts}
        rates = by_count[counts[-1]]  # the last count's: the threads the bare loops run with
        first_returns = {}
        pieces: list[tuple[float, float]] = []  # (one kernel, pieces) decisions/s, with --pieces
        for r in range(args.repeats):
            for n in counts:  # alternated within the repeat: the machine is shared
                numba.set_num_threads(n)
                t = time.perf_counter()
                rec = run_rollout(
                    trained, cfg, batch, args.seed, mode, np.random.default_rng(r), keep=keep, entropy=entropy
                )
                dt = time.perf_counter() - t
                by_count[n].append(rec.n_env_decisions / dt)
                first_returns.setdefault(n, rec.returns)
                if args.pieces:
                    fused, policy._decide = policy._decide, lambda cfg, seen: None
                    t = time.perf_counter()
                    rec_p = run_rollout(
                        trained,
                        cfg,
                        batch,
                        args.seed,
                        mode,
                        np.random.default_rng(r),
                        keep=keep,
                        entropy=entropy,
                    )
                    pieces.append(
                        (rec.n_env_decisions / dt, rec_p.n_env_decisions / (time.perf_counter() - t))
                    )
                    policy._decide = fused
                    if not np.array_equal(rec_p.returns, rec.returns):
                        raise SystemExit("the decision as pieces gave other returns than the one kernel")
                if len(counts) > 1:
                    print(
                        f"  repeat {r}, {n} numba thread(s): training rollout {by_count[n][-1]:,.0f} decisions/s"
                    )
            numba.set_num_threads(counts[-1])
            bares.append(bare_step_rate(cfg, batch, args.seed))
            compiled.append(bare_step_rate(cfg, batch, args.seed, in_place=True))
            print(
                f"  repeat {r}: training rollout {rates[-1]:,.0f} decisions/s ({rec.n_env_decisions:,} env "
                f"decisions in {dt:.1f} s); bare simulator {bares[-1]:,.0f} decisions/s (numpy step), "
                f"{compiled[-1]:,.0f} (compiled in-place step)"
            )
        again = run_rollout(trained, cfg, batch, args.seed, mode, np.random.default_rng(0), keep=False)
        if any(not np.array_equal(again.returns, ret) for ret in first_returns.values()):
            raise SystemExit(
                "the same seed gave other returns (again, or on another thread count): the rollout is not "
                "reproducible"
            )
        digest = hashlib.sha1(np.ascontiguousarray(again.returns).tobytes()).hexdigest()[:12]
        print(
            f"returns: mean {again.returns.mean():.6e}, digest {digest} (the same digest: the same decisions)"
        )
        sums = policy._sums
        if sums.n_carried + sums.n_computed:
            share = sums.n_carried / (sums.n_carried + sums.n_computed)
            print(f"the placer's per-machine sums: {share:.0%} of running jobs carried between decisions")
        else:
            print(
                "the placer's inputs: the compiled kernel (models.placer_kernel), every running job each decision"
            )
        if len(counts) > 1:
            medians = ", ".join(f"{np.median(v):,.0f} on {n}" for n, v in by_count.items())
            print(f"median training rollout by numba threads: {medians} decisions/s")
        print(
            f"median: training rollout {np.median(rates):,.0f} decisions/s, bare {np.median(bares):,.0f} "
            f"decisions/s with the numpy step, {np.median(compiled):,.0f} with the compiled one "
            f"({np.median(rates) / np.median(compiled):.2f} of the compiled bare rate; item 8 asks 100,000)"
        )
        if pieces:
            one, apart = np.asarray(pieces).T
            ratio = one / apart
            print(
                f"one decision kernel against the pieces, alternated ({len(pieces)} pairs): {np.median(one):,.0f} "
                f"against {np.median(apart):,.0f} decisions/s, paired ratio median {np.median(ratio):.3f} "
                f"({ratio.min():.3f}-{ratio.max():.3f})"
            )
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_rollout(
                trained, cfg, batch, args.seed, mode, np.random.default_rng(0), keep=keep, entropy=entropy
            )
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
            if os.environ.get("TVW_CALLEES"):  # where the named functions spend their time
                pstats.Stats(prof).sort_stats("cumulative").print_callees(os.environ["TVW_CALLEES"])


if __name__ == "__main__":
    main()
