"""Packing at a level that follows how many jobs an overshoot would charge: `forecast_peak_charge`.

Why: the overshoot penalty charges K_o to EVERY job on a machine that exceeds capacity (`sim.penalties`), so the
cost of a wrong guess grows with the number of jobs the machine holds, and `forecast_peak`'s level, one number
validated on the training VMs at M = 10, does not see it. Measured (Bitbrains 30 %, seed 5, `forecast_peak` at
its validated level 0.95): the validation VMs hold 2.87 jobs on the machine at each admission on average (the
arriving one included), the test VMs, whose requests are smaller (3.3 units against 4.6), 4.03 at M = 10 and 5.11
at M = 50; there 0.080 % overshoot costs 4.9e6 and `forecast_peak` falls 1.657 below the hybrid
(benchmarks/RESULTS.md, "Validated at M = 50 too" and the seventeenth session).

What: each candidate machine gets its own level from the number n of jobs an overshoot there would charge (the
jobs running on it plus the arriving one), so that n x (1 - level) stays at what validation accepted,
n_ref x (1 - q):

    level(n) = 1 - (1 - q) * n_ref / n,   rounded up to the table's grid

(`sim.risk.ADAPTED_LEVELS` from 0.5 to 0.99 where the rule's table was fitted on the fit part; its own levels where
it was refitted on every training sequence). q is `forecast_peak`'s validated level and n_ref the mean number of
jobs on the machine in the step of each of its admissions on the validation sequences (its own rollout there,
`admission_counts`). A machine more crowded than validation's average packs more cautiously, a sparser one more
boldly (two-sided; `raise_only` never goes below q). Every other choice is `forecast_peak`'s as validation fitted it
(fallback heuristic, mode, the table's key, recall over it); where validation kept the hybrid (no level), the rule
is that rule under this name.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property, partial

import numpy as np

from sim.config import SimConfig
from sim.core import State
from sim.labelling import reads_labels
from sim.risk import MODES, RiskAwarePacking, _FollowsFallback, bounded_action, head_share, jobs_per_machine


def level_rows(levels: np.ndarray, level: float, n_ref: float, n: np.ndarray, raise_only: bool) -> np.ndarray:
    """Index into the ascending `levels` of each cell's level for `n` jobs charged (module docstring): the first
    level at or above 1 - (1 - `level`) x `n_ref` / n (at or above `level` too where `raise_only`), the top level
    where none is; the lowest level where the target is below it."""
    target = 1.0 - (1.0 - level) * n_ref / np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    if raise_only:
        target = np.maximum(target, level)
    return np.minimum(np.searchsorted(levels, target - 1e-9, side="left"), len(levels) - 1)


def admission_counts(state: State) -> np.ndarray:
    """(placements,) jobs on the machine in the step each job started, itself included, from a rolled state: those
    running then and those placed on it in that same step, before or after it (a rule places several jobs in one
    step; the simulator keeps no order among them). What an overshoot there from the next step on would charge.
    Every job placed, in env then job order. This is the n_ref `forecast_peak_charge_guard` was judged with; `act`'s
    n counts the jobs running at the decision plus the arriving one, so n_ref is the larger of the two readings
    by the same-step placements (benchmarks/RESULTS.md, "The jobs an overshoot would charge")."""
    out = []
    jobs = state.jobs
    for env in range(state.batch_size):
        n = int(jobs.n_jobs[env])
        machine, start = state.job_machine[env, :n], state.job_start[env, :n]
        placed = (machine >= 0) & (start >= 0)
        machine, start = machine[placed], start[placed]
        end = start + jobs.duration[env, :n][placed]
        same = (machine[:, None] == machine[None, :]) & (start[None, :] <= start[:, None])
        out.append((same & (end[None, :] > start[:, None])).sum(axis=1))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class ChargeAwarePeakPacking(_FollowsFallback):
    """`forecast_peak` with each machine's level set by the jobs an overshoot there would charge (module
    docstring). `rules[k]` is the rule at `levels[k]` (ascending), all sharing the fallback and the mode."""

    rules: tuple = field(repr=False)
    levels: tuple[float, ...] = ()
    level: float = 0.9
    """The level validation fitted (`forecast_peak`'s): the one played at n = n_ref."""
    n_ref: float = 1.0
    """The mean number of jobs charged per admission on the validation sequences."""
    raise_only: bool = False
    fallback: object | None = field(default=None, repr=False, compare=False)
    mode: str = "deviate"
    name: str = "forecast_peak_charge"

    def __post_init__(self) -> None:
        if len(self.rules) != len(self.levels) or not self.rules:
            raise ValueError(
                f"{self.name}: {len(self.rules)} rules for {len(self.levels)} levels (need >= 1 each)"
            )
        if list(self.levels) != sorted(self.levels):
            raise ValueError(f"{self.name}: levels must ascend, got {self.levels}")
        if not (np.isfinite(self.n_ref) and self.n_ref > 0):
            raise ValueError(f"{self.name}: n_ref must be finite and > 0, got {self.n_ref}")
        if self.mode not in MODES:
            raise ValueError(f"{self.name}: mode must be one of {MODES}, got {self.mode!r}")
        if not any(abs(self.level - lv) < 1e-9 for lv in self.levels):
            raise ValueError(f"{self.name}: the fitted level {self.level} is not one of levels {self.levels}")
        for rule, lv in zip(self.rules, self.levels, strict=True):
            at = getattr(getattr(rule, "risk", None), "level", None)
            if at is None or abs(at - lv) > 1e-9:
                raise ValueError(f"{self.name}: the rule for level {lv} packs at {at}")

    @property
    def reads_labels(self) -> bool:
        return any(reads_labels(r) for r in self.rules) or reads_labels(self._fallback())

    @cached_property
    def shared_table_index(self) -> int | None:
        """The index of the rule at the fitted `level` where every rule is that rule at its own level of one
        remaining-peak table (`sim.risk.peak_rule_at_level`, as `fit_peak_charge` builds them: the same forecaster
        kind, recall included, over one table object and horizon, the same risk setting but the level, the same
        kind of fallback); None where some rule differs otherwise. What lets the compiled kernel read every level
        from one table (`sim.compiled_decision`) and a checkpoint store it once (`models.forecast_placer`). The
        rules are immutable: found once per rule."""
        from sim.peak_forecast import PeakQuantileForecaster
        from sim.risk import peak_forecasters

        at = min(range(len(self.levels)), key=lambda k: abs(self.levels[k] - self.level))
        first = self.rules[at]
        if not isinstance(first, RiskAwarePacking) or first.forecaster is None:
            return None
        outer, inner = peak_forecasters(first)
        if not isinstance(inner, PeakQuantileForecaster):
            return None
        # each rule's risk level is lv (__post_init__)
        for rule, lv in zip(self.rules, self.levels, strict=True):
            if not isinstance(rule, RiskAwarePacking) or rule.forecaster is None:
                return None
            o, i = peak_forecasters(rule)
            if (
                type(o) is not type(outer)
                or getattr(o, "reliability", None) != getattr(outer, "reliability", None)
                or not isinstance(i, PeakQuantileForecaster)
                or i.table is not inner.table
                or i.horizon != inner.horizon
                or abs(i.level - lv) > 1e-9
                or rule.risk != replace(first.risk, level=rule.risk.level)
                or type(rule._fallback()) is not type(first._fallback())
            ):
                return None
        return at

    def level_index(self, state: State, rows: np.ndarray) -> np.ndarray:
        """(len(rows), M) the index into `levels` of each machine's level now."""
        n = jobs_per_machine(state)[rows] + 1
        return level_rows(np.asarray(self.levels), self.level, self.n_ref, n, self.raise_only)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        from sim import compiled_decision  # loads numba: on first use
        from sim.policies import valid_machines

        decided = compiled_decision.risk_act(cfg, state, self)  # the same decisions, a table row per machine
        if decided is not None:
            return decided
        base = np.asarray(self._fallback().act(cfg, state, rng), dtype=np.int64)
        valid = valid_machines(cfg, state)
        return bounded_action(cfg, state, base, valid, self.mode, partial(self.bounds, cfg, state))

    def bounds(self, cfg: SimConfig, state: State, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(is_safe, tightness) of placing the queue head on each machine of the envs `rows` (None: every env),
        each machine bounded at its own level (`level_index`): one `head_share` per level in use."""
        rows = np.arange(state.batch_size) if rows is None else rows
        index = self.level_index(state, rows)
        is_safe, tightness = np.zeros(index.shape, dtype=bool), np.zeros(index.shape)
        for k in np.unique(index):
            rule = self.rules[k]
            safe_k, tight_k = head_share(cfg, state, rule.forecaster, rule.risk, rows)
            at_k = index == k
            is_safe[at_k], tightness[at_k] = safe_k[at_k], tight_k[at_k]
        return is_safe, tightness


def fit_peak_charge(
    ctx, name: str, raise_only: bool = False, n_ref_quantile: float | None = None
) -> RiskAwarePacking | ChargeAwarePeakPacking | None:
    """`ChargeAwarePeakPacking` on `forecast_peak` as validation fits it (module docstring): its table refitted on
    the fit part at `sim.risk.ADAPTED_LEVELS` from 0.5 up (where it was not refitted on all training sequences),
    n_ref from its own rollout on the validation sequences: the mean jobs charged per admission, or their
    `n_ref_quantile` quantile (only machines more crowded than most of validation's are then raised). Where validation kept the hybrid, that rule under this
    name; None where `forecast_peak` cannot be fitted. The choice is recorded in `ctx.choices[name]`."""
    from sim.peak_forecast import PeakQuantileForecaster
    from sim.policies import play
    from sim.rise_shift import MIN_LEVEL
    from sim.risk import _peak_rule_once, adapted_levels_table, peak_forecasters, peak_rule_at_level

    if n_ref_quantile is not None and not 0.0 <= n_ref_quantile <= 1.0:
        raise ValueError(f"{name}: n_ref_quantile must be in [0, 1], got {n_ref_quantile}")
    rule, choice = _peak_rule_once(ctx)
    if rule is None:
        warnings.warn(f"{name}: forecast_peak could not be fitted at {ctx.where}: not fitted", stacklevel=2)
        return None

    def as_fitted(why: str) -> RiskAwarePacking:  # no level to set: forecast_peak as fitted, and why
        ctx.choices[name] = {**copy.deepcopy(choice), "charge_aware": False, "charge_not_aware_why": why}
        return replace(rule, name=name)

    inner = peak_forecasters(rule)[1]
    if not isinstance(inner, PeakQuantileForecaster):  # the hybrid's observed peaks, or a value per level
        return as_fitted(f"forecast_peak kept {type(inner).__name__}, not one level of a peak table")
    table = adapted_levels_table(ctx, choice, inner.table)
    levels = tuple(lv for lv in table.levels if lv >= MIN_LEVEL - 1e-9)
    rules = tuple(peak_rule_at_level(rule, table, level, f"{name}@{level:g}") for level in levels)
    validation = ctx.split()[1]
    counts = ctx.cached(
        ("charge_counts", rule.name),
        lambda: admission_counts(play(rule, ctx.cfg, validation, ctx.tuning.seed)),
    )
    if counts.size == 0:
        warnings.warn(
            f"{name} at {ctx.where}: no admission on validation; kept at forecast_peak", stacklevel=2
        )
        return as_fitted("no admission on validation")
    n_ref = float(counts.mean() if n_ref_quantile is None else np.quantile(counts, n_ref_quantile))
    ctx.choices[name] = {
        **copy.deepcopy(choice),
        "charge_aware": True,
        "charge_n_ref": n_ref,
        "charge_levels": list(levels),
        "charge_raise_only": raise_only,
        "charge_n_ref_quantile": n_ref_quantile,
    }
    return ChargeAwarePeakPacking(
        rules,
        levels,
        level=rule.risk.level,
        n_ref=n_ref,
        raise_only=raise_only,
        fallback=rule.fallback,
        mode=rule.risk.mode,
        name=name,
    )
