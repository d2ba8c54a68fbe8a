"""Choosing among fitted rules online by replaying the episode's own observed past (a what-if simulation).

Every rule fitted on training sequences is tuned for the training workloads; a test set whose jobs rise less
often (First-Fit then packs tighter without overshooting) or by more (the fitted level then overshoots) needs
another rule, and no signal computed from the jobs alone has told which (benchmarks/RESULTS.md, "The amount of
the rises"). What does tell is the simulator itself: at a checkpoint T the usage of every job up to T is known
(observed), so each candidate rule can be rolled over the episode's steps 0 .. T-1 and its return and overshoot
there measured exactly, as Google's Autopilot picks among its recommenders by simulating each over the past
usage (Rzadca et al., EuroSys 2020, section 4.2). `ReplaySelect` plays the candidate that did best on the
episode so far until the next checkpoint.

What a replay reads (never the future; tests/sim/test_replay_select.py perturbs unobserved usage):
- the jobs that arrived before T, with their arrival steps, requests, labels and durations (the rules it
  chooses among are the durations-known ones, which read a job's end from its start and duration);
- each placed job's usage at the ages observed by T (a job started at s < T: ages 0 .. T-1-s); where a
  candidate starts a job earlier than the episode did, the ages not yet observed repeat the last observed step,
  and a job not started by T uses its request at every age (`prefix_batch`).

The choice for checkpoint k depends only on the state's record up to T_k (`checkpoint_times`), so it is a
function of the state; it is computed at the env's first decision at or after T_k and remembered for that
batch of episodes. Before the first checkpoint every env plays the first candidate (the rule as fitted).
Candidates whose replayed overshoot % exceeds the request-based fallback's by more than `budget_pct` points are
not eligible (the bar's overshoot clause is Tetris's + 0.5). The rule as fitted is kept while it is eligible
unless another eligible one beats its replayed return clearly: by more than `margin` x |its return| and by `z`
standard errors of the gain over blocks of steps (`block_gain_z`: one overshoot-free stretch is luck, a steady
saving is not); where it is not eligible, the eligible candidate with the best replayed return is played.

Limits: a replayed return leaves out what is still queued at the cut (every candidate here places greedily; one
that held more would be favoured); the replays see the jobs' own EC labels, not a labeller's served ones (a
`sim.labelling.ServedLabels` wrapper relabels the real state only); each checkpoint replays from step 0, so the
cost grows with the episode (17-91 s for 30 sequences of the 84 Bitbrains VMs against the fitted rule's 1 s).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.core import State
from sim.jobs import JobBatch, pad_job_batch, stack_job_batches
from sim.labelling import picks_by_labels, reads_labels
from sim.metrics import overshoot_pct_per_episode
from sim.peak_forecast import PeakQuantileForecaster
from sim.policies import BestFit, FirstFit, play
from sim.risk import (
    RiskAwarePacking,
    _peak_rule_once,
    fit_hybrid,
    fitted_once,
    peak_forecasters,
    peak_rule_at_level,
)

FIRST_CHECKPOINT = 32
"""The first checkpoint's step; each next one doubles the gap until `MAX_GAP`."""
MAX_GAP = 128
"""The largest gap between two checkpoints (steps)."""


def checkpoint_times(last_step: int, first: int = FIRST_CHECKPOINT, max_gap: int = MAX_GAP) -> np.ndarray:
    """(K,) int64 checkpoint steps up to `last_step`: first, 2 first, 4 first, ... while the gap is below
    `max_gap`, then every `max_gap` steps. ValueError for a first checkpoint or gap below 1."""
    if first < 1 or max_gap < 1:
        raise ValueError(f"checkpoint_times: first ({first}) and max_gap ({max_gap}) must be >= 1")
    times, t, gap = [], first, first
    while t <= last_step:
        times.append(t)
        t += gap
        gap = min(2 * gap, max_gap)
    return np.asarray(times, dtype=np.int64)


def prefix_batch(state: State, env: int, until: int) -> JobBatch:
    """The jobs of env `env` that arrived before step `until`, as a one-row JobBatch sorted by arrival, with
    their usage as it was observed by `until` (module docstring); what a replay of steps 0 .. until-1 plays."""
    jobs = state.jobs
    n_real = int(jobs.n_jobs[env])
    arrival = jobs.arrival_step[env, :n_real]
    keep = np.flatnonzero(arrival < until)
    keep = keep[np.argsort(arrival[keep], kind="stable")]
    start = state.job_start[env, keep]
    duration = jobs.duration[env, keep]
    started = (start >= 0) & (start < until)
    n_obs = np.where(started, np.minimum(until - start, duration), 0)
    usage = jobs.usage[env, keep]  # (N, T_max, D): a copy (fancy indexing)
    request = jobs.request[env, keep]
    ages = np.arange(jobs.max_duration)
    last = usage[np.arange(keep.size), np.maximum(n_obs - 1, 0)]  # (N, D)
    fill = np.where((n_obs > 0)[:, None], last, request)
    usage = np.where((ages[None, :] < n_obs[:, None])[..., None], usage, fill[:, None, :])
    usage = (usage * (ages[None, :] < duration[:, None])[..., None]).astype(np.int16)
    wids = jobs.workload_ids[env] if env < len(jobs.workload_ids) else ()
    return JobBatch(
        arrival_step=arrival[keep][None].astype(np.int64),
        duration=duration[None].astype(np.int64),
        usage=usage[None],
        request=request[None].astype(np.int16),
        ec_label=jobs.ec_label[env, keep][None].astype(np.int64),
        n_jobs=np.asarray([keep.size], dtype=np.int64),
        sequence_keys=(jobs.sequence_keys[env],) if env < len(jobs.sequence_keys) else (),
        workload_ids=(tuple(wids[j] for j in keep if j < len(wids)),) if wids else (),
        meta=None if jobs.meta is None else jobs.meta[env, keep][None],
    )


def prefix_batches(state: State, envs: np.ndarray, until: int) -> JobBatch:
    """`prefix_batch` of each of `envs` as one batch (`sim.jobs.stack_job_batches`), at least one job slot wide."""
    stacked = stack_job_batches([prefix_batch(state, int(e), until) for e in envs])
    return stacked if stacked.max_jobs else pad_job_batch(stacked, 1, stacked.max_duration)


PAST_PENALTIES = [i for i, n in enumerate(core.PENALTY_NAMES) if n != "unplaced"]
"""The penalty components a replayed step counts: not the charge for jobs left unplaced where the replay is cut
(that is the cut's, not the past's)."""


def replay(cfg: SimConfig, policy, prefix: JobBatch, until: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """((B, until) return per step, (B,) overshoot %) of `policy` rolled over steps 0 .. until-1 of the prefix
    batches: the penalties each closed step was credited (the episode is cut there; no charge for what is left), and
    `sim.metrics.avg_overshoot_pct` over those steps."""
    cut = replace(cfg, max_steps=int(until))
    trace = core.make_trace(cut, prefix.batch_size)
    state = play(policy, cut, prefix, seed, trace)
    returns = trace.penalties[:, :until, PAST_PENALTIES].sum(axis=2)
    return returns, overshoot_pct_per_episode(trace, state)


def block_gain_z(steps: np.ndarray, block: int) -> np.ndarray:
    """(B, C) how clearly each candidate's replayed return beats the first candidate's, from (B, C, T) per-step
    returns: the paired difference summed over blocks of `block` steps (the last partial block dropped unless it
    is the only one), its mean over the blocks in standard errors (+inf where every block gains the same
    positive amount, 0 for the first candidate). Overshoot charges come in rare large steps, a tighter packing's
    saving in many small ones: the statistic tells a persistent gain from one lucky overshoot-free prefix."""
    n_blocks = max(1, steps.shape[2] // block)
    diff = steps - steps[:, :1]
    sums = diff[:, :, : n_blocks * block].reshape(*diff.shape[:2], n_blocks, -1).sum(axis=3)
    mean = sums.mean(axis=2)
    se = sums.std(axis=2, ddof=1) / np.sqrt(n_blocks) if n_blocks > 1 else np.zeros_like(mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, mean / se, np.where(mean > 0, np.inf, 0.0))
    z[:, 0] = 0.0
    return z


def select(
    returns: np.ndarray,
    overshoot: np.ndarray,
    reference: int,
    budget_pct: float,
    margin: float,
    gain_z: np.ndarray | None = None,
    z: float = 0.0,
    also: np.ndarray | None = None,
    why: Counter | None = None,
) -> np.ndarray:
    """(B,) index of the candidate to play per env from (B, C) replayed returns and overshoot %. Eligible: overshoot
    at most the `reference` candidate's + `budget_pct` (the reference always is). Where the first candidate (the
    rule as fitted) is eligible it is kept unless an eligible one beats its return by more than `margin` x |its
    return| and, where `gain_z` (`block_gain_z`) is given, by more than `z` standard errors; then the best such by
    return is played (with an infinite `margin` none is). `also` (B, C): further switches allowed where a candidate
    is eligible (`ReplaySelect.recent`'s). Where the first is not eligible, the eligible one with the best return
    is played. `why`: counts each env that leaves the first candidate by its cause (`ReplaySelect.why`)."""
    eligible = overshoot <= overshoot[:, [reference]] + budget_pct
    eligible[:, reference] = True
    if np.isinf(margin):  # no return beats the first candidate's: it is left only where it is not eligible
        beats = np.zeros_like(eligible)
    else:
        beats = eligible & (returns > returns[:, :1] + margin * np.abs(returns[:, :1]))
    if gain_z is not None:
        beats &= gain_z > z
    beats[:, 0] = True
    on_return = np.argmax(np.where(beats, returns, -np.inf), axis=1)  # the switch without `also`
    if also is not None:
        beats |= eligible & also
    best_switch = np.argmax(np.where(beats, returns, -np.inf), axis=1)
    best_eligible = np.argmax(np.where(eligible, returns, -np.inf), axis=1)
    chosen = np.where(eligible[:, 0], best_switch, best_eligible)
    if why is not None:
        cause = np.where(~eligible[:, 0], "overshoot", np.where(on_return == chosen, "return", "recent"))
        why.update(cause[chosen != 0].tolist())
    return chosen


@dataclass(frozen=True)
class ReplaySelect:
    """Plays, per env, the candidate rule that did best on a replay of the episode's observed past (module
    docstring). `candidates[0]` is the rule as fitted (played before the first checkpoint and kept on ties);
    `candidates[reference]` is the request-based fallback whose replayed overshoot sets the budget."""

    candidates: tuple = field(repr=False)
    names: tuple[str, ...] = ()
    reference: int = 1
    budget_pct: float = 0.5
    """A candidate whose replayed overshoot % tops the reference's by more is not eligible: the bar's clause
    (Tetris's + 0.5 point), per episode (chosen on seen seeds 54, 59, 66, 82 against 0.25: RESULTS.md)."""
    margin: float = 0.0
    """A switch away from the fitted rule needs a replayed return better than its own by this share of it; inf:
    never (a guard, `replay_guard`: only a fitted rule beyond the overshoot budget is left, and the other
    candidates are replayed only for the envs where it is)."""
    z: float = 2.0
    """> 0: a switch away from the fitted rule also needs its replayed gain to stand `z` standard errors above 0
    over blocks of `block` steps (`block_gain_z`)."""
    block: int = 8
    window: int = 0
    """> 0: the returns are compared, and the gain's blocks taken, over the replay's last `window` steps only
    (eligibility by overshoot still over the whole replay): a rule whose few early overshoots cost it while the
    machines fill hides a steady later gain from a comparison since step 0 (First-Fit on a quiet test set,
    benchmarks/RESULTS.md's twenty-seventh session). 0: the whole replay."""
    recent: int = 0
    """> 0 (with `window` 0): a switch is also allowed where a candidate beats the fitted rule over the replay's last
    `recent` steps, by `z` standard errors of the gain over blocks there, and its return over the whole replay is
    above the fitted rule's too: the recent gain of a quiet test set, confirmed by a lead since step 0, which
    spares the switches a quiet stretch alone invites (`window` 64's at M = 50). The choice among the allowed
    switches is by the whole replay's return. 0: none beyond the whole replay's."""
    prior: tuple[float, ...] = ()
    """Per candidate, its validation return's gain over the fitted rule's per step of an episode (<= 0 for a
    candidate validation found worse; `fit_replay_select` with `prior_steps`), or () for a flat prior."""
    prior_steps: float = 0.0
    """> 0: the `prior` is worth this many steps of replayed past: a candidate's replayed return is credited
    `prior_steps` x its prior before it is compared (a candidate worse on validation needs a larger replayed
    gain to be played). 0: every candidate starts equal."""
    first: int = FIRST_CHECKPOINT
    max_gap: int = MAX_GAP
    seed: int = 0
    name: str = "forecast_peak_replay"
    _memo: dict = field(default_factory=dict, repr=False, compare=False)
    tally: Counter = field(default_factory=Counter, repr=False, compare=False)
    """How often each candidate was chosen at a checkpoint (by name), over every episode this instance played."""
    why: Counter = field(default_factory=Counter, repr=False, compare=False)
    """Why an env left the first candidate at a checkpoint, over every episode this instance played: "overshoot"
    (its replayed overshoot % was beyond the budget), "return" (an eligible candidate beat its return over the
    whole replay) or "recent" (only `recent`'s confirmed recent gain allowed the switch)."""

    def __post_init__(self) -> None:
        if len(self.candidates) < 2:
            raise ValueError(f"{self.name}: needs at least 2 candidates, got {len(self.candidates)}")
        if not 0 <= self.reference < len(self.candidates):
            raise ValueError(f"{self.name}: reference {self.reference} is not a candidate index")
        if self.names and len(self.names) != len(self.candidates):
            raise ValueError(f"{self.name}: {len(self.names)} names for {len(self.candidates)} candidates")
        if not (
            self.budget_pct >= 0
            and self.margin >= 0
            and self.z >= 0
            and self.block >= 1
            and self.window >= 0
            and self.recent >= 0
        ):
            raise ValueError(
                f"{self.name}: budget_pct, margin, z, window and recent must be >= 0 and block >= 1"
            )
        if self.window > 0 and self.recent > 0:
            raise ValueError(
                f"{self.name}: window ({self.window}) and recent ({self.recent}) exclude each other"
            )
        if not self.prior_steps >= 0:
            raise ValueError(f"{self.name}: prior_steps must be >= 0, got {self.prior_steps}")
        if self.prior_steps > 0 and len(self.prior) != len(self.candidates):
            raise ValueError(
                f"{self.name}: prior_steps {self.prior_steps} needs a prior per candidate, got {len(self.prior)} "
                f"for {len(self.candidates)} candidates"
            )
        checkpoint_times(0, self.first, self.max_gap)  # the same error for a bad schedule, at construction

    @property
    def reads_labels(self) -> bool:
        return any(reads_labels(c) for c in self.candidates)

    @property
    def picks_by_labels(self) -> bool:
        return any(picks_by_labels(c) for c in self.candidates)

    def choices(self, cfg: SimConfig, state: State) -> np.ndarray:
        """(B,) the candidate each env plays now, replaying the envs that reached a new checkpoint."""
        memo = self._memo
        if memo.get("jobs") is None or memo["jobs"]() is not state.jobs or memo["k"].size != state.batch_size:
            memo["jobs"] = weakref.ref(state.jobs)
            memo["k"] = np.full(state.batch_size, -1, dtype=np.int64)
            memo["choice"] = np.zeros(state.batch_size, dtype=np.int64)
            memo["times"] = checkpoint_times(int(cfg.max_steps), self.first, self.max_gap)
        times = memo["times"]
        restarted = (memo["k"] >= 0) & (
            state.t < times[np.maximum(memo["k"], 0)]
        )  # a new episode, same batch
        memo["k"][restarted], memo["choice"][restarted] = -1, 0
        k_now = np.searchsorted(times, state.t, side="right") - 1  # the last checkpoint at or before t
        stale = np.flatnonzero((k_now > memo["k"]) & ~state.is_done)
        for k in np.unique(k_now[stale]):
            envs = stale[k_now[stale] == k]
            until = int(times[k])
            prefix = prefix_batches(state, envs, until)
            chosen = np.zeros(envs.size, dtype=np.int64)
            if np.isinf(self.margin):  # a guard: the others are replayed only where the first is not eligible
                own, ref = (
                    replay(cfg, self.candidates[i], prefix, until, self.seed)[1] for i in (0, self.reference)
                )
                out = np.flatnonzero(own > ref + self.budget_pct)
                if out.size:
                    chosen[out] = self._replayed_choice(cfg, prefix_batches(state, envs[out], until), until)
            else:
                chosen = self._replayed_choice(cfg, prefix, until)
            memo["choice"][envs] = chosen
            self.tally.update(self.names[c] if self.names else str(c) for c in chosen.tolist())
            memo["k"][envs] = k
        return memo["choice"]

    def _replayed_choice(self, cfg: SimConfig, prefix: JobBatch, until: int) -> np.ndarray:
        """(B,) the candidate `select` chooses for each env of the prefix batches from every candidate's replay."""
        results = [replay(cfg, c, prefix, until, self.seed) for c in self.candidates]
        steps = np.stack([r[0] for r in results], axis=1)  # (B, C, until)
        overshoot = np.stack([r[1] for r in results], axis=1)
        if 0 < self.window < steps.shape[2]:
            steps = steps[:, :, steps.shape[2] - self.window :]
        gain_z = block_gain_z(steps, self.block) if self.z > 0 else None
        returns = steps.sum(axis=2)
        if self.prior_steps > 0:
            returns = returns + self.prior_steps * np.asarray(self.prior, dtype=np.float64)[None, :]
        also = None
        if 0 < self.recent < steps.shape[2]:  # a recent gain, confirmed by a lead over the whole replay
            tail = steps[:, :, steps.shape[2] - self.recent :]
            tail_returns = tail.sum(axis=2)
            also = (tail_returns > tail_returns[:, :1]) & (returns > returns[:, :1])
            if self.z > 0:
                also &= block_gain_z(tail, self.block) > self.z
        return select(
            returns, overshoot, self.reference, self.budget_pct, self.margin, gain_z, self.z, also, self.why
        )

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        choice = self.choices(cfg, state)
        slot = np.zeros(state.batch_size, dtype=np.int64)
        for c in np.unique(choice):
            candidate = self.candidates[c]
            if hasattr(candidate, "pick_job"):
                rows = choice == c
                slot[rows] = np.asarray(candidate.pick_job(cfg, state, rng), dtype=np.int64)[rows]
        return slot

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        choice = self.choices(cfg, state)
        actions = np.full(state.batch_size, cfg.n_machines, dtype=np.int64)
        for c in np.unique(choice):
            rows = choice == c
            actions[rows] = np.asarray(self.candidates[c].act(cfg, state, rng), dtype=np.int64)[rows]
        return actions


CAUTIOUS_LEVELS = (0.9, 0.99)
"""Levels of the fitted rule's own quantile table offered as more cautious candidates (those above its level)."""
BOLDER_FROM = 0.5
"""The fitted rule's table levels from this one up to below its own are offered as bolder candidates (adopted
by a rule written down before its fresh runs, seeds 102-109: benchmarks/RESULTS.md, sixteenth session)."""


def validation_prior(ctx, candidates) -> tuple[float, ...]:
    """Per candidate, min(0, its mean validation return - the first candidate's) over the validation sequences'
    mean length in steps (their last job's arrival plus duration, a length no policy shortens): what validation
    says each costs per step against the fitted rule. A candidate validation found better gets no credit (it was
    not chosen for a reason: its overshoot, or the fitted rule's tie-break)."""
    validation = ctx.split()[1]
    ends = np.where(validation.is_real, validation.arrival_step + validation.duration, 0).max(
        axis=1, initial=0
    )
    length = max(float(ends.mean()), 1.0)
    means = [float(ctx.validation_outcomes(c)[0].mean()) for c in candidates]
    return tuple(min(0.0, (m - means[0]) / length) for m in means)


def _hybrid_once(ctx) -> RiskAwarePacking:
    """`hybrid_observed` as validation fits it (`sim.risk.fit_hybrid`, memoised under its own name so the
    registry's entry and this one validate once), with `ctx.choices["hybrid_observed"]` left as it was."""
    fit = partial(fit_hybrid, ctx, True, "hybrid_observed")
    return fitted_once(ctx, ("hybrid_observed", "rule"), "hybrid_observed", fit)[0]


def fit_replay_select(
    ctx,
    name: str,
    hybrid: bool = False,
    bolder: float | None = BOLDER_FROM,
    prior_on_levels: bool = True,
    **knobs,
) -> ReplaySelect | None:
    """`ReplaySelect` over `forecast_peak` as validation fits it (the first candidate), its request-based fallback
    (the overshoot reference), the same rule at each of `CAUTIOUS_LEVELS` above its level (where it keeps a
    quantile table), with `hybrid` the hybrid rule (`hybrid_observed` as validation fits it: off by default, as
    it cost more on quiet sets than it gained where the hybrid wins; benchmarks/RESULTS.md, sixteenth session),
    the same rule at each level of its table from `bolder` up to below its own (a tighter packing for a test set
    whose jobs rise less than the training ones; None: none), First-Fit and Best-Fit; None where
    `forecast_peak` cannot be fitted. `knobs`: ReplaySelect's budget_pct, margin, z, block, first, max_gap and
    prior_steps (> 0: the prior is `validation_prior`'s; with `prior_on_levels` False it spares the fitted rule's
    own table levels, and only the other rules carry their validation deficit). The choice is recorded in
    `ctx.choices[name]`."""

    rule, choice = _peak_rule_once(ctx)
    if rule is None:
        warnings.warn(f"{name}: forecast_peak could not be fitted at {ctx.where}: not fitted", stacklevel=2)
        return None
    fallback = rule._fallback()
    candidates, names = [rule, fallback], ["forecast_peak", getattr(fallback, "name", "fallback")]
    inner = peak_forecasters(rule)[1]
    if isinstance(inner, PeakQuantileForecaster):
        offered = [q for q in CAUTIOUS_LEVELS if q > rule.risk.level + 1e-9]
        if bolder is not None:
            offered += [lv for lv in inner.table.levels if bolder - 1e-9 <= lv < rule.risk.level - 1e-9]
        for level in (q for q in offered if any(abs(q - lv) < 1e-9 for lv in inner.table.levels)):
            candidates.append(peak_rule_at_level(rule, inner.table, level, f"forecast_peak@{level:g}"))
            names.append(f"forecast_peak@{level:g}")
    if hybrid:
        candidates.append(_hybrid_once(ctx))
        names.append("hybrid_observed")
    candidates += [FirstFit(), BestFit()]
    names += ["first_fit", "best_fit"]
    if knobs.get("prior_steps", 0) > 0:
        prior = validation_prior(ctx, candidates)
        if not prior_on_levels:  # the fitted rule's own table at other levels shares its forecaster: no prior
            prior = tuple(
                0.0 if n.startswith("forecast_peak@") else p for n, p in zip(names, prior, strict=True)
            )
        knobs = {**knobs, "prior": prior}
    policy = ReplaySelect(
        tuple(candidates), tuple(names), reference=1, seed=ctx.tuning.seed, name=name, **knobs
    )
    ctx.choices[name] = {
        **copy.deepcopy(choice),
        "replay_candidates": list(names),
        "replay_budget_pct": policy.budget_pct,
        "replay_margin": policy.margin,
        "replay_z": policy.z,
        "replay_block": policy.block,
        "replay_checkpoints": [policy.first, policy.max_gap],
        "replay_bolder_from": bolder,
        "replay_prior_steps": policy.prior_steps,
        "replay_prior": list(policy.prior),
        "replay_prior_on_levels": prior_on_levels,
        "replay_hybrid": hybrid,
    }
    return policy


def replay_guard(
    policy,
    base,
    others: tuple = (),
    names: tuple[str, ...] = (),
    on_return: bool = False,
    **knobs,
) -> ReplaySelect:
    """`ReplaySelect` with `policy` as the rule as fitted (e.g. a learned scheduler: any policy with `act`, and
    `pick_job` where it picks), the request-based fallback of its `base` rule (the overshoot reference; `base`
    itself where it has none), `base`, the fitted rules `others`, First-Fit and Best-Fit, as `fit_replay_select`
    builds them around `forecast_peak`. `names`: of `policy`, then of each of `others`. A guard of the bar's
    overshoot clause: at each checkpoint an env leaves `policy` only where its replayed overshoot tops the
    reference's by more than `budget_pct`, for the eligible candidate with the best replayed return; with
    `on_return` also where another candidate beats its replayed return by `z` standard errors, as
    `forecast_peak_replay` does (`select`). `knobs`: ReplaySelect's (not `margin` or `z` without `on_return`,
    which would be ignored)."""
    if not on_return:
        if "margin" in knobs or "z" in knobs:
            raise ValueError("replay_guard: a margin and z apply only with on_return")
        knobs = {**knobs, "margin": np.inf, "z": 0.0}  # no return beats the policy's by an infinite margin
    fallback = base._fallback() if hasattr(base, "_fallback") else base
    own = names[0] if names else getattr(policy, "name", "policy")
    extra = (
        list(names[1:]) if len(names) > 1 else [getattr(o, "name", f"other{i}") for i, o in enumerate(others)]
    )
    if len(extra) != len(others):
        raise ValueError(f"replay_guard: {len(names)} names for the policy and {len(others)} other rules")
    candidates = (policy, fallback, base, *others, FirstFit(), BestFit())
    labels = (
        own,
        getattr(fallback, "name", "fallback"),
        getattr(base, "name", "base"),
        *extra,
        "first_fit",
        "best_fit",
    )
    return ReplaySelect(candidates, labels, reference=1, **{"name": f"{own}_replay", **knobs})
