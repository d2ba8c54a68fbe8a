"""Our learned scheduler as the README evaluates it: `forecast_residual_rl` guarded by replays of the episode's
observed past (`sim.replay_select.replay_guard`), adopted by rules written down before fresh runs
(benchmarks/RESULTS.md, "The learned policy guarded by replays of the episode's past" and "A later, wider guard").

At each checkpoint of an episode (steps 128, 256, then every 128) every env's observed past is replayed under the
learned policy and under its base rule's request-based fallback (Tetris for the hybrid), the base rule, the fitted
rules training offered as advisors (`ForecastResidualPolicy.guard_rules`), First-Fit and Best-Fit. An env leaves
the learned policy where its replayed overshoot tops the fallback's by more than 0.75 point (the bar's clause is
0.5 point on the mean over a cell's episodes), or where an eligible candidate (within that budget on the replay)
beats its replayed return by more than 2 standard errors of the gain over 8-step blocks; it then plays whichever
eligible candidate did best on that replay. It reads what the learned policy reads and nothing of the future. It
is built from `forecast_residual_rl`'s trained file: no training of its own.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from models.forecast_placer import ForecastResidualPolicy
from sim.replay_select import ReplaySelect, replay_guard

GUARDED = "forecast_residual_rl_replay"
"""The registry name of the guarded policy: the README's evaluated learned policy (GUARD_KNOBS' first entry)."""
_ON_RETURN = {"first": 128, "budget_pct": 0.75, "on_return": True}
"""The return guard's knobs: GUARDED's in the twenty-seventh and twenty-eighth sessions, and `_return`'s under its
own name."""
_CONFIRM64 = {**_ON_RETURN, "recent": 64}
"""The return guard's knobs and a recent gain the whole replay confirms: GUARDED's since the twenty-ninth session,
and `_confirm64`'s under its own name."""
GUARD_KNOBS: dict[str, dict] = {
    GUARDED: _CONFIRM64,
    "forecast_residual_rl_replay_early": {"first": 32, "budget_pct": 0.5},
    "forecast_residual_rl_replay_late": {"first": 128, "budget_pct": 0.75},
    "forecast_residual_rl_replay_return": _ON_RETURN,
    "forecast_residual_rl_replay_recent": {**_ON_RETURN, "window": 128},
    "forecast_residual_rl_replay_recent64": {**_ON_RETURN, "first": 64, "window": 64},
    "forecast_residual_rl_replay_confirm64": _CONFIRM64,
    "forecast_residual_rl_replay_confirm128": {**_ON_RETURN, "recent": 128},
    "forecast_residual_rl_replay_cautious": {**_CONFIRM64, "cautious": 1},
    "forecast_residual_rl_replay_shift": {**_CONFIRM64, "cautious": 1, "bolder": 1},
    "forecast_residual_rl_replay_bold": {**_CONFIRM64, "bolder": 1},
}
"""Guard variants: row name -> `ReplaySelect` knobs. GUARDED, the evaluated one: `_confirm64`'s knobs since the
twenty-ninth session, whose pre-registered fresh runs adopted them (benchmarks/RESULTS.md, "A recent gain
confirmed since step 0"); `_return`'s in the twenty-seventh and twenty-eighth, adopted by theirs ("The return
guard adopted"). `_return`: its first checkpoint at step 128 and 0.75 point per episode, and also leaving the
learned policy where an eligible candidate's replayed return beats its own by 2 standard errors of the gain over
8-step blocks, as `forecast_peak_replay` chooses (kept under its name so the earlier sessions' commands rerun).
`_late`: the guard on overshoot only, from step 128 with 0.75 point per episode, written down before its fresh
runs in the twenty-second session and GUARDED from then to the twenty-sixth (the rows of those sessions rerun
with it). `_early`: the twenty-first session's guard (from step 32, 0.5 point per episode), which cost return on
rising test sets by tripping on short prefixes (benchmarks/RESULTS.md, "A later, wider guard").
`_recent`: GUARDED with the returns compared over the replay's last 128 steps only (`ReplaySelect.window`), a
candidate the twenty-seventh session is developing for the quiet test sets, where First-Fit's gain since step 0
shows only late; `_recent64` the same from step 64 over the last 64 steps, rejected by its pre-registered test
(fresh 80 % seed 130: it switched on quiet windows of a loaded test set and overshot 0.759 %). `_confirm64` /
`_confirm128`: GUARDED, and also leaving the learned policy where a candidate's gain over the replay's last 64 /
128 steps stands 2 standard errors above 0 and its whole replayed return is above the policy's too
(`ReplaySelect.recent`); `_confirm64` passed its pre-registered test against `_return` (4 fresh runs: level at
M = 50, +0.038 [+0.005, +0.072] at M = 10) and is GUARDED's knobs since. `_cautious` (thirtieth session):
GUARDED with the learned policy itself one level more cautious (`shifted_placer`) among the candidates, so an
env whose replay overshoots beyond the budget can keep the learned policy's packing at a safer level instead of
a request-based rule's (on the loaded seen runs every switch at M = 50 cost return); `_shift`: also one level
bolder, for the quiet test sets where First-Fit's tighter packing wins; `_bold`: GUARDED with the bolder one only
(the cautious one, chosen on its replay at step 128, cost more at M = 50 on the seen 80 % seed 132 than the
request-based rules it displaced: benchmarks/RESULTS.md, thirtieth session). `bench_placer.py
--replay-guard` evaluates any of them."""


def shifted_placer(policy: ForecastResidualPolicy, steps: int = 1) -> ForecastResidualPolicy | None:
    """`policy` (the same network, forecaster, base and advisor) with its action set "rule" bound `steps` of its
    input levels above its own `safe_level` (0.75 -> 0.9 for one step on the levels 0.5, 0.75, 0.9, 0.95, 0.99),
    or below it for `steps` < 0 (0.75 -> 0.5): it packs beyond requests as far as that more cautious (bolder)
    bound allows (under `rule_charge` each machine's level still rises with the jobs an overshoot there would
    charge, from the new floor). A cautious one allows the advisor's action only where that bound does
    (`PlacerConfig.keep_advice` False); a bolder one keeps it. None where there is no such level (action set not
    "rule", no bound level, or too few levels that way) or `steps` is 0. Named "<policy>@<level>"
    (`ForecastResidualPolicy.variant`: its own per-rollout sums)."""
    pcfg = policy.config
    if pcfg.action_set != "rule" or pcfg.safe_level is None or steps == 0:
        return None
    if steps > 0:
        way = [lv for lv in pcfg.levels if lv > pcfg.safe_level + 1e-9]
    else:
        way = [lv for lv in reversed(pcfg.levels) if lv < pcfg.safe_level - 1e-9]
    if len(way) < abs(steps):
        return None
    level = way[abs(steps) - 1]
    # a cautious one bounds the advisor's action too: the learned policy plays the advisor's rule exactly while
    # the advisor's bonus dominates, and that rule's overshoot is what sends an env out of the budget
    config = replace(pcfg, safe_level=level, keep_advice=steps < 0)
    return policy.variant(config, f"{policy.name}@{level:g}")


def guard(
    policy: ForecastResidualPolicy,
    seed: int = 0,
    base=None,
    rules: tuple | None = None,
    variant: str = GUARDED,
) -> ReplaySelect:
    """`policy` guarded by replays: its base rule (`base` overrides it, e.g. the same rule as fitted by a
    benchmark) and `rules` (None: the policy's `guard_rules`) as the other candidates; `seed`: the replays';
    `variant`: a GUARD_KNOBS name (ValueError naming the known ones otherwise). A variant's `cautious` / `bolder`
    knob (n): the policy n levels more cautious / bolder (`shifted_placer`) is a candidate after `rules`, named
    "forecast_residual_rl@<level>" (none where the policy has no such level)."""
    if variant not in GUARD_KNOBS:
        raise ValueError(f"guard variant {variant!r}: not one of {sorted(GUARD_KNOBS)}")
    knobs = dict(GUARD_KNOBS[variant])
    rules = policy.guard_rules if rules is None else tuple(rules)
    shifted = (shifted_placer(policy, steps) for steps in (knobs.pop("cautious", 0), -knobs.pop("bolder", 0)))
    rules = (*rules, *(s for s in shifted if s is not None))
    base = policy.base_policy if base is None else base  # replay_guard names the rules by their own names
    return replay_guard(policy, base, rules, (policy.name,), seed=seed, name=variant, **knobs)


def guarded_placer(
    checkpoint: str | Path | None = None, replay_seed: int | None = None, **kwargs
) -> ReplaySelect:
    """The registry's factory of `forecast_residual_rl_replay`: the trained placer at `checkpoint` (None: the
    untrained one, i.e. its base rule), `kwargs` to `ForecastResidualPolicy`, guarded (`guard`), its replays
    seeded by `replay_seed` (None: the placer's own seed, its training seed, which the evaluation's episodes of
    that training run are seeded with)."""
    policy = ForecastResidualPolicy(checkpoint=checkpoint, **kwargs)
    return guard(policy, policy.config.seed if replay_seed is None else replay_seed)
