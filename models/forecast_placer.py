"""The learned scheduler, ours (issue 22, item 4): a permutation-equivariant residual on a placement rule, with
forecast quantiles of each machine's load as its inputs, trained by behaviour cloning and then by policy gradient
on the simulator's reward.

What it is:

- A BASE rule decides first: a fitted `sim.risk.RiskAwarePacking` (the hybrid or the forecast rule), Google's peak
  predictor, or a request-based heuristic of the registry. Its action a_base gets the logit bonus `b` (a learned
  scalar that starts at `PlacerConfig.base_bonus`); the network adds a residual score per action whose last layers
  start at zero. So the untrained greedy policy IS the base rule, decision for decision.
- Per machine, shared weights (the same weights run at M = 10 and M = 50): the level-p bound of the machine's summed
  usage over the next H steps without and with the queue head (`sim.risk.sum_bound` with `PlacerConfig.rho`) at each
  level of `PlacerConfig.levels` (peak share, mean share, safe or not), the observed usage now and over the last h
  closed steps (`State.past`), whether the machine is used, its request-based free capacity, its running jobs, the
  head's request and median forecast, and whether the base chose the machine. The hold action is scored from the
  mean and max over machines of the per-machine embedding plus a few global inputs.
- Forecasts come from a `sim.forecast.UsageForecaster` (the base rule's own remaining-peak table at every level,
  `PlacerTrainConfig.inputs` "rule"; the learned `models.usage_forecast` one; or the observed-peak persistence
  rule), ONCE per decision for the running jobs and the head, and every level reads that one call (a forecaster
  flat over the horizon, as the table is, is read without a horizon axis: `_flat_level_columns`).
  A forecaster reads `sim.forecast.job_view` (observed usage only); one that reads the true future
  (`is_oracle`, e.g. `ExactForecaster`) is refused. `ForecastCache` memoises forecasts by the job's content and
  its observed steps, which is all a forecaster reads, so a cached forecast is the forecast.

Training (`train_forecast_placer`), on the TRAINING sequences of one (source, load): validation sequences are carved
from them (`sim.tuning.split_validation`, the same carve as the base rule's fitting), the rest are the fit part.
Stage "base": the untrained policy (the base rule) on validation. Stage "bc": behaviour cloning on a teacher's
decisions (`PlacerConfig.bc_teacher`: "base" or a registered, unfitted policy). Stage "pg", one of
(`PlacerConfig.algorithm`):
- "reinforce" / "ppo": `n_rollouts` sampled rollouts of each drawn fit sequence; the advantage of a decision is its
  reward-to-go minus the mean reward-to-go of the same sequence's rollouts at the same decision index (a
  per-sequence baseline, no critic), normalised per iteration; an entropy bonus; one REINFORCE step, or PPO-clip
  epochs, per iteration.
- "vine" (TRPO's vine estimator with the base rule as the rollout policy): a greedy trunk rollout of each drawn
  sequence; at `vine_points` of its decisions the base's action and the policy's likeliest other valid actions are
  each followed by the base rule (common random numbers: the simulator is deterministic), so A(s, a) = return after
  a minus return after the base's action, for every action tried. These advantages are the base rule's and stay
  valid as the policy changes, so they accumulate in a replay buffer; each iteration takes Adam steps of soft
  policy improvement (target proportional to prior x exp(A / eta), `_vine_update`). It reads the same thing REINFORCE reads (the
  simulator's returns on training sequences), with far less variance per decision.
- "pgpe" (policy gradients with parameter-based exploration, Sehnke et al. 2010, symmetric sampling, fixed sigma):
  exploration in the weights, not in the actions. Each iteration draws `pgpe_pairs` directions eps over the head
  (the machine and hold scores' last layers and the base bonus, `HEAD_PARAMETERS`; the encoder keeps its seeded
  weights as a fixed feature map), and runs the GREEDY policy at head + eps and head - eps on the same drawn fit
  sequences in one batched rollout (`PopulationPolicy`: one head per env, and one simulator seed per sequence
  under every head, so a pair's difference is the effect of its direction alone). The gradient estimate sum_k eps_k (R+_k - R-_k) / 2,
  over the spread of the returns, takes an Adam step. Sampling actions costs an overshoot on every co-located
  job at each wrong draw, which swamped REINFORCE and PPO (measured, README); a perturbed greedy policy deviates
  only where its scores say so, the same way at every similar state, so a direction is judged by what a
  consistent change of the rule does. Sigma is in logit units (`pgpe_sigma`): each head coordinate's step is
  scaled by the spread of its input on the base rule's decisions (`head_scales`).
With an advisor, one validation before PG probes a second start, the advisor's rule (`PlacerConfig.advisor_probe`),
and PG begins from whichever start the keep rule below prefers.
Greedy decoding on validation after every iteration; the best iteration is kept, by validation return or, with
`PlacerConfig.choice_z` > 0 (the default), by the lower bound of its paired validation gain over the base rule
(iteration 0, the base rule, included, so without a BC stage training never returns a policy worse than its base on
validation); training stops after `patience` evaluations without a better score or when `time_budget_s` is spent. `stage_table` rows: stage, iteration,
validation return, imitation accuracy (greedy action == base action), entropy, seconds.

Trained policy (`ForecastResidualPolicy.save` / `ForecastResidualPolicy(checkpoint=path)`): the one format of every
learned policy (`models.checkpoint`), published with `publish_trained` (the policy file and its JSON sidecar: the
configuration, the git revision, the run) and loaded with `weights_only=True` through `read_placer`. The file holds
the shared keys (`policy_format`, `policy`, `config` = {"PlacerConfig": ...}, `iteration`, `n_iterations`) and the
network's state dict (`model`), plus what only the placer needs: feature names, D (`n_resources`), the base rule's
spec (registry name and knobs), the forecaster's spec (for the learned forecaster, its arrays), the best iteration
(whose weights are kept) and the rule that stopped training (`STOP_RULES`). `iteration` is the PG iterations run;
`n_iterations` the ones the configuration asked for: `PlacerConfig.n_iterations`, or the iterations run when
patience or the time budget ended training (both are part of the configuration). So only a policy that training
finished is published (an untrained network of a configuration that asks for iterations is refused, as the shared
rule refuses a half-trained one), and loading refuses, naming the file: a file that is not a published forecast
placer, a sidecar short of its iterations, another feature set, another D (`ready`). Another M is no error: the
per-machine weights are shared across machines.

Run it without Dagster:

    policy, table = train_forecast_placer(sim_cfg, train_jobs, base=fitted_rule, forecaster=fitted_forecaster)
    policy.save("placer.pt")
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path

import numba
import numpy as np
import polars as pl
import torch
from torch import nn

from models import placer_kernel
from models.checkpoint import POLICY_FORMAT, check_trained, git_revision, publish_trained, read_payload
from models.forecaster import torch_threads
from models.reinforce import config_dict
from models.training import SINGLE_MACHINE_SOURCES, init_parameters, training_sources
from sim import compiled_decision, compiled_planes, core
from sim.charge_level import ChargeAwarePeakPacking, level_rows
from sim.compiled_step import on_threads
from sim.config import SimConfig
from sim.core import State, action_mask, current_usage, jobs_running, queue_head, queue_length, relabel
from sim.forecast import (
    ForecastCache,
    RecallOverlay,
    UsageForecaster,
    flat_forecast,
    flat_level_forecast,
    flat_planes,
    forecast_at_levels,
    is_flat_forecaster,
    level_index,
    uncached,
    with_cache,
)
from sim.jobs import JobBatch, superpose
from sim.labelling import Labeller, picks_by_labels, reads_labels
from sim.metrics import overshoot_pct_per_episode
from sim.peak_forecast import PeakQuantileForecaster, PeakQuantileTable, RemainingPeakQuantiles
from sim.policies import (
    POLICIES,
    JobPicker,
    Tetris,
    free_by_requests,
    is_fitted,
    is_learned,
    is_oracle,
    make_policy,
    own_jobs,
    promote_queued_job,
    valid_machines,
)
from sim.recall_sums import recall_columns
from sim.rise_shift import (
    MIN_LEVEL,
    RiseAmount,
    RiseRate,
    ShiftAdaptedPeakForecaster,
    adapted_level,
    fit_rise_rate,
    rate_ratio,
)
from sim.risk import (
    PeakPredictorPacking,
    PersistenceForecaster,
    RequestForecaster,
    RiskAwarePacking,
    RiskConfig,
    deviate_or_pack,
    jobs_per_machine,
    peak_forecasters,
    peak_rule_at_level,
)
from sim.running_sums import RunningSums, reads_other_runs
from sim.tuning import (
    ChoiceMemo,
    FitContext,
    TuningConfig,
    sequence_outcomes,
    split_validation,
    tuning_preset,
)

STOP_RULES = ("n_iterations", "patience", "time_budget")
"""What ended a training run: all its iterations, `PlacerConfig.patience`, `PlacerConfig.time_budget_s`."""
RETRAIN = "train it with train_forecast_placer and save it again"
"""What to do about a placer file the loader refuses (in its errors)."""
ALGORITHMS = ("reinforce", "ppo", "vine", "pgpe")
ACTION_SETS = ("valid", "safe", "rule")
STAGE_TABLE = {
    "stage": pl.String,  # "base" (the untrained policy = the base rule), "bc", "probe" (`advisor_probe`), "pg"
    "iteration": pl.Int64,  # BC epoch or PG iteration (0 = before any update)
    "validation_return": pl.Float64,  # mean greedy episode return on the validation sequences
    "imitation_accuracy": pl.Float64,  # share of validation decisions where the greedy action is the base's
    "entropy": pl.Float64,  # mean policy entropy (nats) over the validation decisions
    "train_return": pl.Float64,  # mean return of the iteration's training rollouts: sampled, or vine's greedy trunk (NaN for base / bc)
    "seconds": pl.Float64,  # wall seconds of this row's work (rollouts, update, validation)
    "elapsed_s": pl.Float64,  # wall seconds since training started
}
"""One row per stage and iteration of `train_forecast_placer`."""
_NEG = -1e9  # masked logit: finite, so p * log p stays 0 for masked actions


@dataclass(frozen=True)
class PlacerConfig:
    """Features, network, and training of the forecast residual scheduler (stored in its checkpoint)."""

    levels: tuple[float, ...] = (0.5, 0.9, 0.99)
    """Quantile levels whose machine bounds are inputs; the first must be 0.5 (the median) and all must be levels
    of the forecaster."""
    rho: float = 1.0
    """Co-peaking in the machine bound (`sim.risk.sum_bound`): 1 = the sum of quantiles."""
    use_durations: bool = True
    """Known end times (as the simulator and DeepRM's SJF give them): a job's forecast is 0 after it ends and the
    machine's time left is an input; False: running jobs run through the horizon, no time-left input."""
    horizon: int | None = None
    """Forecast steps read (t + 1 .. t + H); None = the forecaster's horizon."""
    hidden: int = 64
    """Width of the per-machine encoder and of the hold head."""
    action_set: str = "rule"
    """Actions the policy may take, greedy or sampled: "valid" (every valid action) or "safe" (the base rule's
    action, or a valid machine whose bound with the head at the top level of `levels` stays within capacity over
    the horizon: the "is_safe_with" input; hold only where the base holds). "safe" keeps exploration off the
    placements the forecast already says overshoot, which cost every co-located job. Measured (bench_placer,
    DeepPlace 50 %, recall-hybrid base): sampled training returns 2.5x less costly, yet no greedy decision changed
    under REINFORCE or PPO, and vine's changed decisions lost on validation, as with "valid". "rule": the same set
    at the level the fitted `forecast_peak` chose on validation (`safe_level`, set at fit time by
    `with_rule_level`): the policy may pack as far beyond requests as the validated rule's uncertainty allows, and
    no further; it chooses among those machines, the base's action and the advisor's; unbound (no fitted
    `forecast_peak` level, or validation kept the hybrid for it), the top level. Both sets keep the advisor's
    action (since the tenth session, 2026-12-05; before, "safe" did not, and the advised variant could not follow
    its advisor). "rule" is the default since then: measured (bench_placer, the 84 Bitbrains VMs, both
    variants; benchmarks/RESULTS.md "Packing no further than the rule"), "valid" lets PGPE learn packing beyond the rule that
    pays on the training and validation VMs and overshoots on unseen ones (1.09 % and 0.58 % at seed 15), where
    "rule" keeps the overshoot clause, at the cost of the gains "valid" makes on quiet test VMs."""
    safe_level: float | None = None
    """The level of `levels` whose "is_safe_with" input defines the "safe" and "rule" action sets' machines; None:
    the top level. `with_rule_level` sets it (and adds it to `levels`) for "rule"."""
    rule_shift: bool = False
    """Action set "rule" only: each env's level follows its episode's rate of rising jobs (`sim.rise_shift`, as
    `forecast_peak_adaptive`'s does): `safe_level` at ratio 1, 1 - (1 - safe_level) / ratio rounded up to
    `levels` otherwise (no extra inputs: the levels the network already reads). A quieter episode opens machines
    safe at a lower level, a busier one closes those safe only at `safe_level`. False: `safe_level` everywhere."""
    rule_charge: bool = False
    """Action set "rule" only: each machine's level follows the jobs an overshoot there would charge
    (`sim.charge_level`, as `forecast_peak_charge_guard`'s does): the first of `levels` at or above
    1 - (1 - `safe_level`) x `charge_n_ref` / n, never below `safe_level`, for the n jobs running on the machine
    plus the arriving one. A machine more crowded than validation's admissions were is open only where it is safe
    at a higher level; none is opened beyond `safe_level`. `with_rule_level` binds `charge_n_ref` and adds the
    inputs' forecaster's levels above `safe_level` (a level the inputs lack, e.g. the guard's 0.975, rounds up to
    the next they have: a little more cautious than the guard, whose own action the set always keeps where it
    advises). False: `safe_level` on every machine."""
    charge_n_ref: float | None = None
    """`rule_charge`: the mean jobs charged per admission of the fitted `forecast_peak` on the validation
    sequences (`sim.charge_level.fit_peak_charge`'s n_ref), bound at fit time; saved with the checkpoint."""
    keep_advice: bool = True
    """Action sets "safe" and "rule": the advisor's action is allowed even where the bound at the machine's level
    calls it unsafe (the advisor's own rule decided it). False: only where that bound calls it safe, as any other
    machine (the replay guard's cautious candidate, `models.placer_guard.shifted_placer`)."""
    rise_rate: float | None = None
    """The training fit part's first rises per job-step at risk (`sim.rise_shift.fit_rise_rate`), bound at fit
    time where `rule_shift` is on (`train_forecast_placer`); saved with the checkpoint."""
    rise_prior_events: float = 10.0
    """`rule_shift`: the Gamma prior's weight in first rises (`sim.rise_shift.RiseRate.prior_events`)."""
    base_bonus: float = 2.0
    """Initial logit bonus of the base rule's action (learned). Greedy at init is the base rule for any value > 0;
    the value sets how often sampling explores other valid actions (about (M - 1) e^-b / (1 + (M - 1) e^-b)), and
    for PGPE the margin a perturbed head must overcome to deviate (2 against `pgpe_sigma` 1; the sampling
    algorithms were measured with 4: benchmarks/bench_placer.py's SETTINGS)."""
    algorithm: str = "pgpe"
    """"reinforce" (one gradient step per iteration), "ppo" (PPO-clip epochs on the same rollouts), "vine"
    (branch rollouts: the exact advantage of each candidate action over the base rule's) or "pgpe" (exploration in
    the head's weights, greedy rollouts; module docstring). Measured (benchmarks/bench_placer.py; benchmarks/RESULTS.md, "Exploring
    in the weights"): REINFORCE and PPO never changed a greedy decision of any base on any source, and vine's
    deviations all lost on validation; PGPE is the one whose policy beat its base rule on test sequences (the
    shared trace's 84 VMs at 50 %, hybrid base), hence the default, with `choice_z` guarding its choice."""
    n_sequences: int = 8
    """Fit sequences drawn (without replacement while they last) per PG iteration."""
    n_rollouts: int = 4
    """Sampled rollouts of each drawn sequence (the per-sequence baseline averages over them)."""
    n_iterations: int = 40
    """Most PG iterations."""
    learning_rate: float = 3e-4
    """Adam learning rate of the PG stage (REINFORCE, PPO, vine; PGPE has its own)."""
    entropy_coef: float = 0.003
    """Weight of the mean policy entropy in the PG loss (a bonus)."""
    discount: float = 1.0
    """Per-decision discount of the reward-to-go."""
    ppo_epochs: int = 4
    """PPO: passes over the iteration's decisions."""
    ppo_clip: float = 0.2
    """PPO: clip range of the probability ratio."""
    minibatch: int = 2048
    """Decisions per gradient step (PPO and BC); REINFORCE accumulates them into one step."""
    vine_points: int = 3
    """Vine: decisions per drawn sequence branched from (uniform over the greedy trunk's decisions)."""
    vine_candidates: int = 5
    """Vine: most actions tried per branched decision (the base's, then the policy's likeliest other valid ones)."""
    vine_window: int | None = None
    """Vine: decisions each branch runs after its first action under the base rule (None: to the episode's end);
    returns are compared there."""
    vine_epochs: int = 10
    """Vine: Adam steps per iteration on the replay buffer of branched decisions."""
    vine_buffer: int = 4000
    """Vine: branched decisions kept (the newest); their advantages are the base rule's, valid for any policy."""
    vine_temperature: float = 1.0
    """Vine: eta of the soft policy improvement, in standard deviations of the alternatives' advantages (smaller
    moves the policy further toward the best tried actions)."""
    pgpe_pairs: int = 8
    """PGPE: antithetic pairs of head perturbations per iteration (each runs on the iteration's drawn sequences)."""
    pgpe_sigma: float = 1.0
    """PGPE: the perturbation's standard deviation in logit units (the base bonus's scale)."""
    pgpe_learning_rate: float = 0.2
    """PGPE: Adam's step on the head, in the same logit units as `pgpe_sigma`."""
    bc_teacher: str = "base"
    """Teacher of the BC stage: "base" or a registered policy that needs no fitting (`sim.policies.POLICIES`)."""
    bc_epochs: int = 0
    """BC epochs (0 skips the stage: with the base as teacher the residual already imitates it exactly)."""
    bc_learning_rate: float = 3e-3
    """Adam learning rate of the BC stage."""
    choice_z: float = 1.645
    """How cautiously validation keeps an iteration: 0, the best mean validation return (the base rule's
    included); z > 0, the best lower confidence bound of the paired gain over the base rule on the validation
    sequences, mean - z x standard error of the per-sequence differences, where the base's bound is 0: an
    iteration is kept only where its gain stands out from the validation sequences' spread, which guards the
    choice among many iterations against the luckiest (1.645, the default: one-sided 95 %, as
    `sim.tuning.TuningConfig`'s). Measured (bench_placer.py, the 84 VMs at 50 %, `forecast_peak` base): with 0,
    PGPE kept an iteration 0.20e6 above the base on validation that tied it on test (-0.028 [-0.073, +0.016])."""
    patience: int = 6
    """PG evaluations without a better validation score (`choice_z`) before training stops."""
    overshoot_budget_pct: float | None = 0.25
    """Points of mean validation overshoot above Tetris's on the same sequences that a kept iteration may show (half
    the bar's 0.5, as the rules' `sim.tuning.TuningConfig.overshoot_budget_pct`; 0.5 before 2026-12-05): an iteration within it beats any
    beyond it, and among those within, the better score wins (`budget_keeps`); each iteration's overshoot comes
    from the trace its validation rollout records (`run_rollout`'s `overshoot`). None: off (the
    score alone, as every run before 2026-12-05). Measured on the 84 VMs at 80 % (benchmarks/RESULTS.md, "Within the overshoot
    budget")."""
    generalise_factor: int | None = None
    """A cluster this many times larger that the kept iteration must not lose on: an iteration is kept only where,
    on the validation sequences superposed k = `generalise_factor` at a time (`sim.jobs.superpose`: sequences of a
    k-times larger cluster at the same load), its paired gain over the base rule is not significantly below 0
    (mean + `choice_z` x standard error >= 0); 5 checks M = 50 for a policy trained at M = 10, as the bar evaluates
    it. Checked only where an iteration would be kept, and not where validation has fewer than k sequences (said).
    None or 1: off, the default: measured on the 84 VMs at 30 % (seeds 3-5, benchmarks/RESULTS.md "Validated at M = 50 too"), it
    kept the same iterations as without it, and the M = 50 test losses it was built for do not show on the
    training VMs at M = 50 (there the kept iterations gain 0.1-2.2e6 over the base): they come from the test VMs."""
    advisor_probe: bool = True
    """An advised network only: before PG, validate a second start, the advisor's action preferred over the base's
    everywhere (advice bonus = 2 x the base bonus, the residual still 0: greedily, the advisor rule wherever its
    action is valid), and start PG from whichever the same keep rule (score, overshoot budget, larger cluster)
    prefers; a row of stage "probe", iteration 0. PGPE reaches the advisor alone only once Adam's steps of
    `pgpe_learning_rate` have carried the advice bonus past the base's (7-39 iterations on DeepPlace 80 %, more
    than 3 minutes there); one validation settles it. False: the advice bonus starts at 0 only."""
    time_budget_s: float = 180.0
    """Wall seconds of training (BC and PG) before it stops after the current iteration."""
    validation_share: float = 0.3
    """Share of the training sequences held out as validation (`sim.tuning.split_validation`)."""
    cache_rows: int = 200_000
    """Most (job, observed steps) forecasts `ForecastCache` keeps (about 1.5 kB each at H = 24)."""
    seed: int = 0
    """Seeds the network, the sequence draws, sampling and the simulator."""

    def __post_init__(self) -> None:
        if not self.levels or abs(self.levels[0] - 0.5) > 1e-9 or list(self.levels) != sorted(self.levels):
            raise ValueError(f"PlacerConfig.levels must be ascending and start at 0.5, got {self.levels}")
        if self.action_set not in ACTION_SETS:
            raise ValueError(f"PlacerConfig.action_set must be one of {ACTION_SETS}, got {self.action_set!r}")
        if self.rule_shift and self.action_set != "rule":
            raise ValueError(
                f"PlacerConfig.rule_shift moves action set 'rule''s level; action_set is {self.action_set!r}"
            )
        if self.rule_charge and self.action_set != "rule":
            raise ValueError(
                f"PlacerConfig.rule_charge sets action set 'rule''s level per machine; action_set is "
                f"{self.action_set!r}"
            )
        if self.rule_charge and self.rule_shift:
            raise ValueError(
                "PlacerConfig: rule_charge and rule_shift each set action set 'rule''s level; choose one"
            )
        if self.rule_charge and self.safe_level is not None and self.charge_n_ref is None:
            raise ValueError(
                "PlacerConfig.rule_charge with a bound safe_level needs charge_n_ref (with_rule_level binds both)"
            )
        if self.charge_n_ref is not None and not (math.isfinite(self.charge_n_ref) and self.charge_n_ref > 0):
            raise ValueError(
                f"PlacerConfig.charge_n_ref must be a count > 0 or None, got {self.charge_n_ref}"
            )
        if self.rise_rate is not None and not (math.isfinite(self.rise_rate) and self.rise_rate > 0):
            raise ValueError(f"PlacerConfig.rise_rate must be a rate > 0 or None, got {self.rise_rate}")
        if self.safe_level is not None and not any(abs(self.safe_level - lv) < 1e-9 for lv in self.levels):
            raise ValueError(
                f"PlacerConfig.safe_level {self.safe_level} must be one of levels {self.levels} (with_rule_level "
                "adds it)"
            )
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"PlacerConfig.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not 0.0 <= self.rho <= 1.0 or not 0.0 < self.discount <= 1.0:
            raise ValueError("PlacerConfig: rho must be in [0, 1] and discount in (0, 1]")
        if not (math.isfinite(self.choice_z) and self.choice_z >= 0.0):
            raise ValueError(f"PlacerConfig.choice_z must be a finite number >= 0, got {self.choice_z}")
        if self.pgpe_sigma <= 0 or self.pgpe_learning_rate <= 0:
            raise ValueError(
                f"PlacerConfig: pgpe_sigma and pgpe_learning_rate must be > 0, got {self.pgpe_sigma}, "
                f"{self.pgpe_learning_rate}"
            )
        if self.overshoot_budget_pct is not None and not self.overshoot_budget_pct >= 0.0:
            raise ValueError(
                f"PlacerConfig.overshoot_budget_pct must be >= 0 or None, got {self.overshoot_budget_pct}"
            )
        if self.generalise_factor is not None and self.generalise_factor < 1:
            raise ValueError(
                f"PlacerConfig.generalise_factor must be >= 1 or None, got {self.generalise_factor}"
            )
        if self.vine_temperature <= 0:
            raise ValueError(f"PlacerConfig.vine_temperature must be > 0, got {self.vine_temperature}")
        for name in (
            "hidden",
            "n_sequences",
            "n_rollouts",
            "minibatch",
            "ppo_epochs",
            "vine_points",
            "vine_candidates",
            "vine_epochs",
            "vine_buffer",
            "pgpe_pairs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"PlacerConfig.{name} must be >= 1, got {getattr(self, name)}")


# --- forecasts, once per (job, observed steps) -------------------------------------------------------------


def _is_oracle_forecaster(forecaster) -> bool:
    return bool(getattr(forecaster, "is_oracle", False))


# --- the base rule, fast where its math allows --------------------------------------------------------------


def _is_persistence_rule(base) -> bool:
    return isinstance(base, RiskAwarePacking) and isinstance(
        base.forecaster or PersistenceForecaster(), PersistenceForecaster
    )


def persistence_rule_act(base: RiskAwarePacking, cfg: SimConfig, state: State, rng: np.random.Generator):
    """(B,) the actions of a `RiskAwarePacking` on `PersistenceForecaster` (the hybrid rule), computed without its
    (N, L, H, D) arrays: every quantile of a job is one number held until the job ends, so a machine's bound is
    largest at step t + 1 and the rule's safety and tightness are those of that step. Same actions as
    `base.act` (tests compare them on whole rollouts); integer units keep the sums exact. The compiled rule
    (`sim.compiled_decision.risk_act`) decides where it applies (the fallbacks it knows, a peak statistic)."""
    decided = compiled_decision.risk_act(cfg, state, base)
    if decided is not None:
        return decided
    fc = base.forecaster or PersistenceForecaster()
    risk = base.risk
    fallback = np.asarray(base._fallback().act(cfg, state, rng), dtype=np.int64)
    n_envs, n_m = state.batch_size, cfg.n_machines
    jobs = state.jobs
    bi, ji = np.nonzero(jobs_running(state))
    start = state.job_start[bi, ji]
    n_obs = np.clip(state.t[bi] - start + 1, 0, jobs.duration[bi, ji])
    if fc.statistic == "peak":
        # the running peak by age (`JobBatch.observed_prefix`), not a reduction of each profile per call; NaN
        # where nothing is observed yet, replaced by the request below
        value = jobs.observed_prefix[0].peak_at(bi, ji, n_obs)
    else:
        value = jobs.usage[bi, ji, np.maximum(n_obs - 1, 0)].astype(np.float64)
    request = jobs.request[bi, ji].astype(np.float64)
    value = np.where((n_obs > 0)[:, None], value, request)
    if risk.min_observed > 0:
        value = np.where((state.t[bi] - start + 1 < risk.min_observed)[:, None], request, value)
    if risk.use_durations:
        value = value * (state.t[bi] + 1 < start + jobs.duration[bi, ji])[:, None]
    total = np.zeros((n_envs * n_m, cfg.n_resources))
    np.add.at(total, bi * n_m + state.job_machine[bi, ji], value)
    head = queue_head(state)
    head_value = head.request.astype(np.float64) * head.has_job[:, None]
    if risk.use_durations:
        head_value = head_value * (head.duration > 1)[:, None]
    total = total.reshape(n_envs, n_m, -1) + head_value[:, None]
    share = (total / np.asarray(cfg.capacity_units, dtype=np.float64)).max(axis=2)
    is_safe = share <= 1.0 + 1e-9
    return deviate_or_pack(cfg, state, fallback, is_safe, share, valid_machines(cfg, state), risk.mode)


class BaseRule:
    """The base policy's decisions for the residual: job picking and the machine (fast path for the hybrid).
    With a `labeller` (`sim.labelling.Labeller`), the rule and the forecasts `cache` serves see its EC labels
    instead of the jobs' clustering labels, as `sim.labelling.ServedLabels` serves them at evaluation: trained and
    evaluated on one view. Calls that pass `served=True` have relabelled the state already."""

    def __init__(self, policy, cache: ForecastCache | None = None, labeller: Labeller | None = None) -> None:
        self.policy = policy
        self.labeller = labeller
        self.reads_labels = reads_labels(policy) or (cache is not None and reads_labels(cache))
        self._fast = _is_persistence_rule(policy)
        self._run = policy
        if isinstance(policy, RiskAwarePacking) and not self._fast and policy.forecaster is not None:
            # the same forecasts through the cache (exact); the rule's own math is unchanged
            inner = (
                cache
                if cache is not None and uncached(cache) is policy.forecaster
                else with_cache(policy.forecaster)
            )
            self._run = RiskAwarePacking(inner, policy.fallback, policy.risk, policy.name)

    @property
    def is_picker(self) -> bool:
        return isinstance(self.policy, JobPicker)

    @property
    def risk_rule(self) -> RiskAwarePacking | ChargeAwarePeakPacking | None:
        """The rule that `act` runs where `sim.compiled_decision.risk_act_args` may compile it: a `RiskAwarePacking`
        (over the cached forecasts; the hybrid itself on its fast path) or a `ChargeAwarePeakPacking` (a table
        row per machine); None where `act` runs another policy."""
        return self._run if isinstance(self._run, (RiskAwarePacking, ChargeAwarePeakPacking)) else None

    def served(self, cfg: SimConfig, state: State) -> State:
        """The state as the rule sees it: relabelled by the labeller where the rule or its forecasts read labels."""
        if self.labeller is None or not self.reads_labels:
            return state
        return relabel(cfg, state, self.labeller.labels(cfg, state))

    def pick_job(
        self, cfg: SimConfig, state: State, rng: np.random.Generator, served: bool = False
    ) -> np.ndarray:
        if self.is_picker:
            if not served and picks_by_labels(self.policy):
                state = self.served(cfg, state)
            return self.policy.pick_job(cfg, state, rng)
        return np.zeros(state.batch_size, dtype=np.int64)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator, served: bool = False) -> np.ndarray:
        state = state if served else self.served(cfg, state)
        if self._fast:
            return persistence_rule_act(self.policy, cfg, state, rng)
        return np.asarray(self._run.act(cfg, state, rng), dtype=np.int64)


# --- features -----------------------------------------------------------------------------------------------


LEVEL_FEATURES = ("peak_without", "mean_without", "peak_with", "mean_with", "is_safe_with")
GLOBAL_FEATURES = ("queue_share", "used_share", "valid_share", "has_job", "base_holds")


def feature_names(pcfg: PlacerConfig, n_resources: int) -> tuple[str, ...]:
    """Names of the per-machine inputs in order (stored in checkpoints)."""
    res = [f"r{d}" for d in range(n_resources)]
    names = [f"{f}_q{round(lv * 100)}" for lv in pcfg.levels for f in LEVEL_FEATURES]
    names += (
        [f"usage_now_{r}" for r in res] + [f"past_mean_{r}" for r in res] + [f"past_max_{r}" for r in res]
    )
    names += ["is_used"] + [f"free_by_requests_{r}" for r in res] + ["n_running", "time_left"]
    names += [f"head_request_{r}" for r in res] + [f"head_median_{r}" for r in res] + ["is_base", "is_valid"]
    return tuple(names)


def input_horizon(forecaster: UsageForecaster, pcfg: PlacerConfig) -> int:
    """The forecast steps the placer's inputs read: `PlacerConfig.horizon`, at most the forecaster's."""
    return forecaster.horizon if pcfg.horizon is None else min(pcfg.horizon, forecaster.horizon)


def placement_features(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    pcfg: PlacerConfig,
    base_actions: np.ndarray,
    mask: np.ndarray,
    memo: RunningSums | None = None,
    compiled: bool = True,
    skip_done: bool = False,
    advisor=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(x (B, M, F) float32 per machine, g (B, G) float32 global) inputs of the network (`feature_names`,
    GLOBAL_FEATURES). One forecast call for the running jobs and the heads; every level reads it. `memo`
    (`sim.running_sums.RunningSums`) keeps each machine's sums over its running jobs from one decision to the next
    of a rollout (recall included); without one, every running job is counted. `compiled`: where
    `models.placer_kernel` applies (the base rule's remaining-peak table at rho = 1, the default inputs), one numba
    kernel computes the same features (equal to the bit to a fresh count; `memo` is then not used), zeros for envs
    whose episode has ended (no decision reads them); elsewhere `skip_done` leaves those envs' horizon columns
    zeros instead of computing them (a rollout's setting). `advisor`: a rule that will bound the same state next
    (`sim.recall_sums.recall_columns`: on the recall path its bounds come from the same pass)."""
    horizon = input_horizon(forecaster, pcfg)
    if compiled:
        fast = placer_kernel.features(
            cfg,
            state,
            forecaster,
            pcfg.levels,
            pcfg.rho,
            pcfg.use_durations,
            horizon,
            base_actions,
            mask,
            skip_done=True,
        )
        if fast is not None:
            return fast
    n_envs, n_m, n_d = state.batch_size, cfg.n_machines, cfg.n_resources
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    jobs = state.jobs
    head = queue_head(state)
    heads = (np.arange(n_envs), np.minimum(state.next_job, jobs.max_jobs - 1))
    memo = RunningSums() if memo is None else memo  # a fresh one counts every running job

    def steps_alive(env: np.ndarray, job: np.ndarray) -> np.ndarray:
        """(N,) steps t + 1 .. t + H each job is alive; the queue heads (the last B rows) 0 where none waits."""
        if pcfg.use_durations:
            is_placed = state.job_machine[env, job] >= 0
            start = np.where(is_placed, state.job_start[env, job], state.t[env])
            n_alive = np.clip(start + jobs.duration[env, job] - state.t[env] - 1, 0, horizon)
        else:
            n_alive = np.full(env.size, horizon, dtype=np.int64)
        n_alive[env.size - n_envs :] *= head.has_job
        return n_alive

    # flat forecasts need no horizon axis: a point one at any rho (its deviations are 0: one level's columns serve
    # every level), one with a value per level at rho = 1 (the bound is then a sum, whose mean over the horizon is
    # linear in the steps alive)
    cols = None
    if is_flat_forecaster(forecaster) or (
        pcfg.rho == 1.0 and callable(getattr(forecaster, "flat_levels", None))
    ):
        point = is_flat_forecaster(forecaster)
        negative: list[bool] = []

        def flat_rows(env: np.ndarray, job: np.ndarray) -> np.ndarray:
            values = (
                flat_forecast(forecaster, cfg, state, env, job)[:, None, :]
                if point
                else flat_level_forecast(forecaster, pcfg.levels, cfg, state, env, job)
            )
            negative.append(bool((values < 0).any()))
            return _flat_rows(values, steps_alive(env, job))

        key = ("flat", cfg, id(forecaster), point, tuple(pcfg.levels), horizon, pcfg.use_durations)
        sums, head_rows, _ = memo.per_machine(
            state, n_m, key, flat_rows, None, reads_other_runs(forecaster), heads
        )
        if not any(negative):
            cols, head_mean = _flat_level_columns(sums, head_rows, horizon, cap)
            cols = cols * (len(pcfg.levels) if point else 1)
    if cols is None:  # the general path (a negative flat value included: every sum must be non-increasing)
        skip = state.is_done if skip_done else None
        # recall over a flat forecaster: the columns summed from each env's jobs without planes, the other inputs
        # in one kernel (the same numbers)
        fused = recall_columns(
            cfg, state, forecaster, pcfg.levels, pcfg.rho, horizon, pcfg.use_durations, skip, advisor
        ) if compiled else None  # fmt: skip
        if fused is not None:
            return compiled_decision.column_inputs(
                cfg, state, fused[0], fused[1], pcfg.use_durations, base_actions, mask
            )
        cols, head_mean = _level_columns(
            cfg, state, forecaster, pcfg, horizon, cap, memo, heads, steps_alive, compiled, skip
        )
    usage_now = current_usage(cfg, state) / cap  # (B, M, D)
    past = state.past  # (B, h, M, D)
    used = core.machines_used(state)
    free = free_by_requests(cfg, state) / cap
    n_running = jobs_per_machine(state)
    time_left = (
        np.maximum(state.busy_until - state.t[:, None], 0) / max(jobs.max_duration, 1)
        if pcfg.use_durations
        else np.zeros((n_envs, n_m))
    )
    head_req = np.broadcast_to((head.request / cap)[:, None], (n_envs, n_m, n_d))
    head_med = np.broadcast_to((head_mean / cap)[:, None], (n_envs, n_m, n_d))
    is_base = base_actions[:, None] == np.arange(n_m)[None, :]
    valid = mask[:, :n_m]
    x = np.concatenate(
        [
            np.stack(cols, axis=2),
            usage_now,
            past.mean(axis=1),
            past.max(axis=1),
            used[..., None],
            free,
            (n_running / 10.0)[..., None],
            time_left[..., None],
            head_req,
            head_med,
            is_base[..., None],
            valid[..., None],
        ],
        axis=2,
    ).astype(np.float32)
    g = np.stack(
        [
            np.minimum(queue_length(state) / cfg.queue_size, 4.0),
            used.mean(axis=1),
            valid.mean(axis=1),
            head.has_job.astype(np.float64),
            (base_actions == n_m).astype(np.float64),
        ],
        axis=1,
    ).astype(np.float32)
    return x, g


def _level_columns(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    pcfg: PlacerConfig,
    horizon: int,
    cap: np.ndarray,
    memo: RunningSums,
    heads: tuple[np.ndarray, np.ndarray],
    steps_alive: Callable[[np.ndarray, np.ndarray], np.ndarray],
    compiled: bool = True,
    skip: np.ndarray | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The LEVEL_FEATURES columns (each (B, M)) of every level, from the forecast quantiles of the running jobs
    and of the queue heads `heads` (env, job) over the horizon; and the heads' mean median forecast (B, D). The
    running jobs' per-machine sums are carried by `memo` (`sim.running_sums.RunningSums`) from the rollout's
    previous decision wherever that is exact: only the jobs placed since and the heads are forecast (one call).
    `compiled`: the planes and the columns come from kernels (`sim.compiled_planes.flat_planes` where the
    forecaster applies, `level_columns`): the same numbers; `skip` (B,) bool: envs whose compiled columns are
    zeros, not computed."""
    # (recall over a flat forecaster is summed from each env's jobs before this: `placement_features`)
    # at rho = 1 the bound is the medians plus the summed deviations (sqrt(s_d^2) = s_d): no squares to sum
    squares = pcfg.rho != 1.0

    def planes(env: np.ndarray, job: np.ndarray) -> np.ndarray:
        n_alive = steps_alive(env, job)
        return _planes(cfg, state, forecaster, pcfg, env, job, n_alive, horizon, squares, compiled)[0]

    key = ("planes", cfg, id(forecaster), tuple(pcfg.levels), pcfg.rho, horizon, pcfg.use_durations)
    acc, per_head, _ = memo.per_machine(
        state, cfg.n_machines, key, planes, None, reads_other_runs(forecaster), heads
    )
    if compiled:
        cols = compiled_planes.level_columns(acc, per_head, len(pcfg.levels), pcfg.rho, cap, skip)
        return list(cols), per_head[:, 0].mean(axis=1)
    with_head = acc + per_head[:, None]
    n_up = len(pcfg.levels) - 1
    cols = []
    for li in range(len(pcfg.levels)):
        for sums in (acc, with_head):
            if li == 0:
                bound = sums[:, :, 0]
            elif not squares:
                bound = sums[:, :, 0] + sums[:, :, li]
            else:
                s_d, s_d2 = sums[:, :, li], sums[:, :, 1 + n_up + li - 1]
                bound = sums[:, :, 0] + np.sqrt(pcfg.rho * s_d**2 + (1.0 - pcfg.rho) * s_d2)
            share = bound / cap  # (B, M, H, D)
            cols.append(share.max(axis=(2, 3)))
            cols.append(share.mean(axis=(2, 3)))
        cols.append((cols[-2] <= 1.0 + 1e-9).astype(np.float64))
    return cols, per_head[:, 0].mean(axis=1)


def _planes(
    cfg: SimConfig,
    state: State,
    forecaster: UsageForecaster,
    pcfg: PlacerConfig,
    env: np.ndarray,
    job: np.ndarray,
    n_alive: np.ndarray,
    horizon: int,
    squares: bool,
    compiled: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(per job (N, P, H, D): the median, the deviation of each upper level and, unless rho = 1, their squares,
    over the steps each job is alive; the medians (N, H, D)). `compiled`: for a forecaster with a value per
    level (recall over it included), one kernel computes them (`sim.forecast.flat_planes`, the same
    numbers)."""
    for lv in pcfg.levels:  # the placer's error for a level the forecaster lacks
        level_index(forecaster.levels, lv, "forecast placer")
    if compiled:
        fast = flat_planes(forecaster, pcfg.levels, cfg, state, env, job, n_alive, horizon, squares)
        if fast is not None:
            return fast
    quant = forecast_at_levels(forecaster, pcfg.levels, cfg, state, env, job)[:, :, :horizon]  # (N, L, H, D)
    alive = (np.arange(horizon)[None, :] < n_alive[:, None]).astype(np.float64)
    mu = quant[:, 0] * alive[..., None]  # (N, H, D)
    delta = np.maximum(quant[:, 1:] - quant[:, :1], 0.0) * alive[:, None, :, None]  # (N, L-1, H, D)
    return np.concatenate([mu[:, None], delta, *([delta**2] if squares else [])], axis=1), mu


def _flat_rows(values: np.ndarray, n_alive: np.ndarray) -> np.ndarray:
    """(N, 2, L, D) per job of a flat forecaster (`values` (N, L, D) >= 0, level 0 the median, each held while
    the job is alive, `n_alive` (N,) steps): its bound at t + 1 and its sum over the horizon, per level. A job's
    median plus its level's deviation is max(value at the level, median)."""
    bound = np.maximum(values, values[:, :1])
    return np.stack([bound * (n_alive > 0)[:, None, None], bound * n_alive[:, None, None]], axis=1)


def _flat_level_columns(
    sums: np.ndarray, heads: np.ndarray, horizon: int, cap: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """`_level_columns` at rho = 1 for a flat forecaster, from each machine's sums (B, M, 2, L, D) of `_flat_rows`
    over its running jobs and the heads' rows (B, 2, L, D): no horizon axis. A machine's sum of flat bounds never
    rises over the horizon, so its peak share is at t + 1, and its mean over the horizon is sum(value x steps
    alive) / H. Equal to `_level_columns` up to float rounding of the means. Also the heads' mean median."""
    acc_first, acc_total = sums[:, :, 0], sums[:, :, 1]  # (B, M, L, D)
    with_first, with_total = acc_first + heads[:, None, 0], acc_total + heads[:, None, 1]
    # over resources by one operation per resource: numpy reduces a short last axis slowly
    n_d, n_envs, n_m = cap.size, sums.shape[0], sums.shape[1]
    peak_without, peak_with = (
        functools.reduce(np.maximum, (s[..., d] / cap[d] for d in range(n_d)))
        for s in (acc_first, with_first)
    )  # (B, M, L)
    mean_without, mean_with = (
        sum(s[..., d] / cap[d] for d in range(n_d)) / (n_d * horizon) for s in (acc_total, with_total)
    )
    is_safe = (peak_with <= 1.0 + 1e-9).astype(np.float64)
    cols = np.stack([peak_without, mean_without, peak_with, mean_with, is_safe], axis=3)  # LEVEL_FEATURES
    return list(np.moveaxis(cols.reshape(n_envs, n_m, -1), 2, 0)), heads[:, 1, 0] / horizon


def safe_action_mask(
    cfg: SimConfig,
    pcfg: PlacerConfig,
    x: np.ndarray,
    base: np.ndarray,
    mask: np.ndarray,
    advice: np.ndarray | None = None,
    env_levels: np.ndarray | None = None,
) -> np.ndarray:
    """(B, M + 1) `PlacerConfig.action_set` "safe" or "rule": of the valid actions `mask`, the base rule's `base`
    (B,), the advisor's `advice` (B,; None: no advisor) and every machine whose "is_safe_with" input at
    `PlacerConfig.safe_level` (None: the top level) is set in `x` (B, M, F). A base or advice the mask forbids
    (a hold under the hold rule "no_fit") stands for the lowest valid action, which the simulator would take.
    `env_levels` (B,) or (B, M) indices into `PlacerConfig.levels`: each env's or each machine's own level
    (`rule_levels`) instead."""
    names = feature_names(pcfg, cfg.n_resources)
    keep = np.zeros_like(mask)
    if env_levels is None:
        level = pcfg.levels[-1] if pcfg.safe_level is None else pcfg.safe_level
        keep[:, : cfg.n_machines] = x[:, :, names.index(f"is_safe_with_q{round(level * 100)}")] > 0.5
    else:
        columns = np.array([names.index(f"is_safe_with_q{round(lv * 100)}") for lv in pcfg.levels])
        at = np.broadcast_to(np.asarray(env_levels).reshape(x.shape[0], -1), x.shape[:2])
        keep[:, : cfg.n_machines] = np.take_along_axis(x, columns[at][:, :, None], axis=2)[:, :, 0] > 0.5
    rows, first_allowed = np.arange(base.size), np.argmax(mask, axis=1)
    for chosen in (base, advice):
        if chosen is not None:  # a forbidden hold (hold rule "no_fit") places as `sim.policies.place` does
            keep[rows, np.where(mask[rows, chosen], chosen, first_allowed)] = True
    return mask & keep


def rule_levels(pcfg: PlacerConfig, state: State, n_running: np.ndarray | None = None) -> np.ndarray | None:
    """Indices into `pcfg.levels` of the action set's levels: (B, M) each machine's under
    `PlacerConfig.rule_charge` (`sim.charge_level.level_rows` for the jobs running on it plus the arriving one),
    (B,) each env's under `PlacerConfig.rule_shift` (`sim.rise_shift.adapted_level` of `safe_level` by the env's
    `rate_ratio`), or None where both are off. `n_running` (B, M): the jobs running on each machine where the
    caller has them already (`running_counts` of the inputs), else counted from `state`."""
    if pcfg.rule_charge:
        if pcfg.charge_n_ref is None or pcfg.safe_level is None:
            raise ValueError(
                "forecast placer: rule_charge needs a bound safe_level and charge_n_ref (with_rule_level binds them)"
            )
        n = (jobs_per_machine(state) if n_running is None else n_running) + 1
        return level_rows(np.asarray(pcfg.levels), pcfg.safe_level, pcfg.charge_n_ref, n, raise_only=True)
    if not pcfg.rule_shift:
        return None
    if pcfg.rise_rate is None or pcfg.safe_level is None:
        raise ValueError(
            "forecast placer: rule_shift needs a bound safe_level and rise_rate (train_forecast_placer binds them)"
        )
    rate = RiseRate(pcfg.rise_rate, 0, 0, pcfg.rise_prior_events)
    return adapted_level(pcfg.safe_level, rate_ratio(rate, state), pcfg.levels)


def running_counts(pcfg: PlacerConfig, n_resources: int, x: np.ndarray) -> np.ndarray:
    """(B, M) int64 the jobs running on each machine, read back from the inputs `x`' "n_running" column, which holds
    n / 10 in float32 (exact after rounding for any count below 2**20): what `jobs_per_machine` counts, without
    walking every job again (zeros for an env the inputs skip as done, whose only action is hold)."""
    column = feature_names(pcfg, n_resources).index("n_running")
    return np.rint(x[:, :, column].astype(np.float64) * 10.0).astype(np.int64)


def rule_level(rule) -> float | None:
    """The quantile level a fitted risk rule packs at (`RiskAwarePacking.risk.level`), or None where it packs on
    observed peaks (the hybrid, which validation may keep for `forecast_peak`) or is no risk rule."""
    if isinstance(rule, ChargeAwarePeakPacking):  # the level validation fitted, played at n = n_ref
        return float(rule.level)
    if not isinstance(rule, RiskAwarePacking):
        return None
    inner = rule.forecaster
    while isinstance(inner, (RecallOverlay, ForecastCache)):
        inner = inner.inner
    if not isinstance(inner, (PeakQuantileForecaster, RemainingPeakQuantiles)):
        return None
    return float(rule.risk.level)


def peak_rule_level(ctx, fitted: dict) -> float | None:
    """The level the fitted `forecast_peak` packs at (`rule_level`), for action set "rule": the one among `fitted`
    ({name: rule} already fitted on `ctx`, e.g. the base and the advisor) where it is there, else fitted on
    `ctx`; None where it cannot be fitted or validation kept the hybrid for it."""
    peak = fitted.get("forecast_peak")
    return rule_level(peak if peak is not None else POLICIES["forecast_peak"].fit(ctx))


def charge_n_ref(ctx, fitted: dict) -> float | None:
    """n_ref for `PlacerConfig.rule_charge`: that of the first charge-aware rule among `fitted` ({name: rule} in
    look-up order: the advisors before the base, the order `train_forecast_placer` reads them in where it binds),
    else of `forecast_peak_charge_guard` fitted on `ctx`; None where it has no charge level (validation kept the
    hybrid for `forecast_peak`, or no admission on validation)."""
    n_ref = first_n_ref(fitted.values())
    return n_ref if n_ref is not None else first_n_ref([POLICIES["forecast_peak_charge_guard"].fit(ctx)])


def first_n_ref(rules) -> float | None:
    """n_ref of the first charge-aware rule (`ChargeAwarePeakPacking`) among `rules`, or None where none is."""
    return next((float(r.n_ref) for r in rules if isinstance(r, ChargeAwarePeakPacking)), None)


def forecaster_levels(forecaster) -> tuple[float, ...] | None:
    """The quantile levels `forecaster` has (`with_rule_level`'s `available`), or None where it does not say."""
    return tuple(getattr(forecaster, "levels", ())) or None


def with_rule_level(
    pcfg: PlacerConfig,
    level: float | None,
    available: tuple[float, ...] | None = None,
    n_ref: float | None = None,
) -> PlacerConfig:
    """`pcfg` with action set "rule" bound to the level `level` the fitted `forecast_peak` packs at (`rule_level`;
    None, where validation kept the hybrid for it: the top level, the most cautious) as its `safe_level`, added to
    `levels`; other action sets, or one already bound, as they are. `available`: the levels the inputs'
    forecaster has (the remaining-peak table has every level of the rule's grid; a learned forecaster may not):
    a level it lacks binds the next higher one it has, more cautious, or the top input level.
    `PlacerConfig.rule_charge`: `n_ref` (`charge_n_ref`) is bound too, and the levels of `available` above the
    bound one are added (those of `levels` where it does not say); without an n_ref or a level, rule_charge is
    turned off (the bound level on every machine)."""
    if pcfg.action_set != "rule" or pcfg.safe_level is not None:
        return pcfg
    charged = pcfg.rule_charge and n_ref is not None and level is not None
    level = pcfg.levels[-1] if level is None else float(level)
    if available is not None and not any(abs(level - lv) < 1e-9 for lv in available):
        level = min((lv for lv in available if lv > level), default=pcfg.levels[-1])
    above = [lv for lv in (available or ()) if lv > level + 1e-9] if charged else []
    levels = tuple(sorted({*pcfg.levels, level, *above}))
    return replace(
        pcfg,
        levels=levels,
        safe_level=level,
        rule_charge=charged,
        charge_n_ref=float(n_ref) if charged else None,
    )


# --- the network --------------------------------------------------------------------------------------------


class ResidualPlacerNet(nn.Module):
    """Scores M machines with shared weights and the hold action from pooled machine embeddings; the base rule's
    action gets a learned bonus. Output: (B, M + 1) masked logits."""

    def __init__(
        self, n_features: int, n_global: int, hidden: int, base_bonus: float, seed: int, advised: bool = False
    ) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.machine_head = nn.Linear(hidden, 1)
        self.hold_head = nn.Sequential(
            nn.Linear(2 * hidden + n_global, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        init_parameters(self, torch.Generator().manual_seed(int(seed)))
        with torch.no_grad():  # the residual starts at zero: the untrained policy is the base rule
            for last in (self.machine_head, self.hold_head[-1]):
                last.weight.zero_()
                last.bias.zero_()
        self.base_bonus = nn.Parameter(torch.tensor(float(base_bonus)))
        self.advised = advised
        if advised:  # the advisor's action's bonus starts at 0: the untrained policy is still the base rule
            self.advice_bonus = nn.Parameter(torch.tensor(0.0))

    def forward(
        self,
        x: torch.Tensor,
        g: torch.Tensor,
        base: torch.Tensor,
        mask: torch.Tensor,
        advice: torch.Tensor | None = None,
    ) -> torch.Tensor:
        emb = self.encoder(x)  # (B, M, h)
        machine = self.machine_head(emb).squeeze(-1)  # (B, M)
        pooled = torch.cat(
            [emb.mean(dim=1), torch.amax(emb, dim=1), g], dim=1
        )  # amax: max's values, 25x faster
        hold = self.hold_head(pooled)  # (B, 1)
        logits = torch.cat([machine, hold], dim=1)
        onehot = torch.nn.functional.one_hot(base, logits.shape[1]).to(logits.dtype)
        logits = logits + self.base_bonus * onehot
        if self.advised:
            if advice is None:
                raise ValueError("forecast placer: an advised network needs the advisor's actions (`advice`)")
            advised = torch.nn.functional.one_hot(advice, logits.shape[1]).to(logits.dtype)
            logits = logits + self.advice_bonus * advised
        return logits.masked_fill(~mask, _NEG)


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1)


def _entropy(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    p = logp.exp()
    return -(torch.where(mask, p * logp, torch.zeros_like(p))).sum(dim=-1)


# --- specs of the base rule and the forecaster (checkpoints) ------------------------------------------------


def forecaster_spec(forecaster) -> dict | None:
    """A weights_only-loadable description of a forecaster (None for none)."""
    if forecaster is None:
        return None
    if isinstance(forecaster, ForecastCache):
        forecaster = forecaster.inner
    if isinstance(forecaster, RecallOverlay):
        return {
            "kind": "recall",
            "reliability": forecaster.reliability,
            "inner": forecaster_spec(forecaster.inner),
        }
    if _is_oracle_forecaster(forecaster):
        raise ValueError(f"{type(forecaster).__name__} reads the true future: not a forecast placer input")
    if isinstance(forecaster, PersistenceForecaster):
        return {
            "kind": "persistence",
            "horizon": forecaster.horizon,
            "levels": list(forecaster.levels),
            "statistic": forecaster.statistic,
        }
    if isinstance(forecaster, RequestForecaster):
        return {"kind": "request", "horizon": forecaster.horizon, "levels": list(forecaster.levels)}
    if isinstance(forecaster, PeakQuantileForecaster):
        return {
            "kind": "peak_quantile",
            **_table_spec(forecaster.table),
            "level": forecaster.level,
            "horizon": forecaster.horizon,
            "levels": list(forecaster.levels),
        }
    if isinstance(forecaster, RemainingPeakQuantiles):
        return {"kind": "remaining_peak", **_table_spec(forecaster.table), "horizon": forecaster.horizon}
    if isinstance(forecaster, ShiftAdaptedPeakForecaster):
        return {
            "kind": "rise_adapted",
            **_table_spec(forecaster.table),
            "level": forecaster.level,
            "horizon": forecaster.horizon,
            "rate": None if forecaster.rate is None else asdict(forecaster.rate),
            "floor": forecaster.floor,
            "amount": None if forecaster.amount is None else asdict(forecaster.amount),
            "exceed": None if forecaster.exceed is None else asdict(forecaster.exceed),
            "raise_only": forecaster.raise_only,
            "overshoot": None if forecaster.overshoot is None else asdict(forecaster.overshoot),
        }
    from models.usage_forecast import QuantileUsageForecaster

    if isinstance(forecaster, QuantileUsageForecaster):
        ec = forecaster.ec
        return {
            "kind": "quantile",
            "cfg": asdict(forecaster.cfg),
            "capacity": torch.from_numpy(np.asarray(forecaster.capacity)),
            "weights": [[torch.from_numpy(w), torch.from_numpy(b)] for w, b in forecaster.weights],
            "x_mean": torch.from_numpy(np.asarray(forecaster.x_mean)),
            "x_std": torch.from_numpy(np.asarray(forecaster.x_std)),
            "shifts": torch.from_numpy(np.asarray(forecaster.shifts)),
            "is_capped_at_request": bool(forecaster.is_capped_at_request),
            "ec": None
            if ec is None
            else {
                "fraction": torch.from_numpy(ec.profiles.fraction),
                "counts": torch.from_numpy(ec.profiles.counts),
                "n_jobs": torch.from_numpy(ec.profiles.n_jobs),
                "period_steps": ec.profiles.period_steps,
                "n_labels": ec.n_labels,
            },
        }
    raise ValueError(f"forecast placer: cannot save a {type(forecaster).__name__} forecaster")


def _table_spec(table: PeakQuantileTable) -> dict:
    return {
        "values": torch.from_numpy(np.ascontiguousarray(table.values)),
        "table_levels": list(table.levels),
        "use_labels": table.use_labels,
        "use_remaining": table.use_remaining,
        "use_at_peak": table.use_at_peak,
        "n_cases": table.n_cases,
        "share_own_cell": table.share_own_cell,
    }


def _table_from_spec(spec: dict) -> PeakQuantileTable:
    return PeakQuantileTable(
        values=spec["values"].numpy(),
        levels=tuple(spec["table_levels"]),
        use_labels=bool(spec["use_labels"]),
        n_cases=int(spec["n_cases"]),
        share_own_cell=float(spec["share_own_cell"]),
        use_remaining=bool(spec.get("use_remaining", False)),  # saved before the axis: none
        use_at_peak=bool(spec.get("use_at_peak", False)),  # saved before the key: none
    )


def _amount_from_spec(spec: dict | None) -> RiseAmount | None:
    """The `RiseAmount` a spec saved (its tuples as JSON lists), or None."""
    if spec is None:
        return None
    tuples = ("expected", "tail_factors", "scales")
    return RiseAmount(**{k: tuple(v) if k in tuples else v for k, v in spec.items()})


def forecaster_from_spec(spec: dict | None):
    """The forecaster a `forecaster_spec` describes."""
    if spec is None:
        return None
    if spec["kind"] == "persistence":
        return PersistenceForecaster(spec["horizon"], tuple(spec["levels"]), spec["statistic"])
    if spec["kind"] == "request":
        return RequestForecaster(spec["horizon"], tuple(spec["levels"]))
    if spec["kind"] == "recall":
        return RecallOverlay(forecaster_from_spec(spec["inner"]), float(spec["reliability"]))
    if spec["kind"] == "peak_quantile":
        return PeakQuantileForecaster(
            _table_from_spec(spec), float(spec["level"]), int(spec["horizon"]), tuple(spec["levels"])
        )
    if spec["kind"] == "remaining_peak":
        return RemainingPeakQuantiles(_table_from_spec(spec), int(spec["horizon"]))
    if spec["kind"] == "rise_adapted":
        return ShiftAdaptedPeakForecaster(
            _table_from_spec(spec),
            None if spec["rate"] is None else RiseRate(**spec["rate"]),
            float(spec["level"]),
            int(spec["horizon"]),
            float(spec.get("floor", MIN_LEVEL)),  # specs saved before the floor was a field: its default
            _amount_from_spec(spec.get("amount")),  # specs saved before the amount: the rate alone
            None if spec.get("exceed") is None else RiseRate(**spec["exceed"]),
            bool(spec.get("raise_only", False)),
            None if spec.get("overshoot") is None else RiseRate(**spec["overshoot"]),
        )
    from models.usage_forecast import ForecastConfig, QuantileUsageForecaster, _EcInputs
    from sim.profiles import EcProfiles

    c = dict(spec["cfg"])
    c["levels"], c["hidden"] = tuple(c["levels"]), tuple(c["hidden"])
    ec = spec["ec"]
    return QuantileUsageForecaster(
        cfg=ForecastConfig(**c),
        capacity=spec["capacity"].numpy(),
        weights=tuple((w.numpy(), b.numpy()) for w, b in spec["weights"]),
        x_mean=spec["x_mean"].numpy(),
        x_std=spec["x_std"].numpy(),
        shifts=spec["shifts"].numpy(),
        ec=None
        if ec is None
        else _EcInputs(
            EcProfiles(
                ec["fraction"].numpy(), ec["counts"].numpy(), ec["n_jobs"].numpy(), ec["period_steps"]
            ),
            int(ec["n_labels"]),
        ),
        is_capped_at_request=bool(spec["is_capped_at_request"]),
    )


def _registry_spec(policy) -> dict:
    name = getattr(policy, "name", None)
    if name not in POLICIES or is_fitted(name) or is_learned(name) or is_oracle(name):
        raise ValueError(
            f"forecast placer: base or fallback {name!r} must be a registered request-based heuristic, a "
            "RiskAwarePacking or a PeakPredictorPacking"
        )
    knobs = {}
    if is_dataclass(policy):
        for f in fields(policy):
            if f.name == "name":
                continue
            value = getattr(policy, f.name)
            if not isinstance(value, int | float | str | bool):
                raise ValueError(
                    f"forecast placer: cannot save base {name!r}: its field {f.name} is not a number"
                )
            knobs[f.name] = value
    return {"kind": "registry", "name": name, "knobs": knobs}


def _charge_rebuilt_from(policy: ChargeAwarePeakPacking) -> int | None:
    """The index of the rule a checkpoint stores for `policy` with its table once, not once per level (a table is
    megabytes): `ChargeAwarePeakPacking.shared_table_index`, where every rule's fallback also saves alike (the
    rebuilt levels get that rule's). None where some rule differs otherwise: each is then stored in full."""
    at = policy.shared_table_index
    if at is None:
        return None
    fallback = _registry_spec(policy.rules[at]._fallback())
    return at if all(_registry_spec(rule._fallback()) == fallback for rule in policy.rules) else None


def base_spec(policy) -> dict:
    """A weights_only-loadable description of the base rule (or the advisor)."""
    if isinstance(policy, RiskAwarePacking):
        return {
            "kind": "risk_aware",
            "name": policy.name,
            "risk": asdict(policy.risk),
            "fallback": _registry_spec(policy._fallback()),
            "forecaster": forecaster_spec(policy.forecaster),
        }
    if isinstance(policy, PeakPredictorPacking):
        knobs = {f.name: getattr(policy, f.name) for f in fields(policy) if f.name != "fallback"}
        return {"kind": "peak_predictor", "knobs": knobs, "fallback": _registry_spec(policy._fallback())}
    if isinstance(policy, ChargeAwarePeakPacking):  # forecast_peak_charge(_guard): one rule per level
        at = _charge_rebuilt_from(policy)
        rules = (
            {"rules": [base_spec(rule) for rule in policy.rules]}
            if at is None
            else {"rule": base_spec(policy.rules[at]), "names": [rule.name for rule in policy.rules]}
        )
        return {
            "kind": "charge_aware",
            **rules,
            "knobs": {
                "levels": list(policy.levels),
                "level": policy.level,
                "n_ref": policy.n_ref,
                "raise_only": policy.raise_only,
                "mode": policy.mode,
                "name": policy.name,
            },
            "fallback": _registry_spec(policy._fallback()),
        }
    return _registry_spec(policy)


def base_from_spec(spec: dict):
    """The base rule a `base_spec` describes."""
    if spec["kind"] == "registry":
        return make_policy(spec["name"], **spec["knobs"])
    fallback = base_from_spec(spec["fallback"])
    if spec["kind"] == "charge_aware":
        knobs = {**spec["knobs"], "levels": tuple(spec["knobs"]["levels"])}
        if "rule" in spec:  # one rule, its table shared by every level (`_charge_rebuilt_from`)
            rule = base_from_spec(spec["rule"])
            table = peak_forecasters(rule)[1].table
            rules = tuple(
                peak_rule_at_level(rule, table, lv, name)
                for lv, name in zip(knobs["levels"], spec["names"], strict=True)
            )
        else:  # each level's rule in full (a rule that is not one table at several levels)
            rules = tuple(base_from_spec(rule) for rule in spec["rules"])
        return ChargeAwarePeakPacking(rules, **knobs, fallback=fallback)
    if spec["kind"] == "risk_aware":
        return RiskAwarePacking(
            forecaster_from_spec(spec["forecaster"]), fallback, RiskConfig(**spec["risk"]), spec["name"]
        )
    return PeakPredictorPacking(**spec["knobs"], fallback=fallback)


# --- the policy ---------------------------------------------------------------------------------------------


class ForecastResidualPolicy:
    """The learned scheduler: greedy over the residual network's masked logits (module docstring).

    checkpoint: a trained policy published by `save` (`read_placer`; None: the seeded untrained network, i.e. the
    base rule). base: the base rule (None: Tetris, or the checkpoint's). forecaster: the per-job quantile
    forecaster of the inputs (None: the observed-peak `PersistenceForecaster` over 24 steps, or the checkpoint's).
    advisor: a second fitted rule (None: none, or the checkpoint's) whose action gets its own learned logit bonus,
    0 at the start, so the untrained policy is still the base rule and training can learn to follow the advisor
    where it does better (PGPE only: the bonus is a head parameter). Which job goes next is the base rule's choice
    (`pick_job`); the advisor places that job too."""

    name = "forecast_residual_rl"

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        base=None,
        forecaster: UsageForecaster | None = None,
        config: PlacerConfig | None = None,
        labeller: Labeller | None = None,
        advisor=None,
    ) -> None:
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        payload = None if self.checkpoint is None else read_placer(self.checkpoint)
        guard_rules = ()
        if payload is not None:
            config = placer_config(self.checkpoint, payload)
            base = base if base is not None else base_from_spec(payload["base"])
            forecaster = forecaster if forecaster is not None else forecaster_from_spec(payload["forecaster"])
            if advisor is None and payload.get("advisor") is not None:
                advisor = base_from_spec(payload["advisor"])
            guard_rules = tuple(base_from_spec(spec) for spec in payload.get("guard_rules") or ())
        self.config = config or PlacerConfig()
        self.base_policy = base if base is not None else Tetris()
        inner = forecaster if forecaster is not None else PersistenceForecaster(horizon=24)
        self.forecaster = with_cache(inner, self.config.cache_rows, self.config.seed)
        self.base = BaseRule(self.base_policy, self.forecaster, labeller)
        self.advisor_policy = advisor
        self.advisor = None if advisor is None else BaseRule(advisor, self.forecaster, labeller)
        self.guard_rules: tuple = guard_rules or (() if advisor is None else (advisor,))
        """The fitted rules besides the base that the replay guard may play (`models.placer_guard`): training's
        advisor, saved even where the published variant is the unadvised one (none saved: the advisor, if any)."""
        self._sums = RunningSums()  # per-machine forecast sums carried between a rollout's decisions
        self.n_resources = None if payload is None else int(payload["n_resources"])
        self.net: ResidualPlacerNet | None = None
        self.trained_iteration = 0 if payload is None else int(payload["best_iteration"])
        """The iteration whose weights the network holds (0: the base rule's, or the probed advisor's start)."""
        self.start_stage = "base"
        """Where training's PG stage began: "base", "bc" or "probe" (`PlacerConfig.advisor_probe`); not saved."""
        self.kept_within_budget = True
        """Whether the kept iteration's validation overshoot is within `PlacerConfig.overshoot_budget_pct` (True
        without a budget); what `choose_variant` ranks first; not saved."""
        self.iterations_run = 0 if payload is None else int(payload["iteration"])
        """PG iterations training ran."""
        self.stopped_by: str | None = None if payload is None else payload["stopped_by"]
        """The STOP_RULES entry that ended training (None: never trained)."""
        if payload is not None:
            self.net = self._build(self.n_resources)
            self.net.load_state_dict(payload["model"])

    def _build(self, n_resources: int) -> ResidualPlacerNet:
        c = self.config
        return ResidualPlacerNet(
            len(feature_names(c, n_resources)),
            len(GLOBAL_FEATURES),
            c.hidden,
            c.base_bonus,
            c.seed,
            advised=self.advisor is not None,
        )

    def variant(self, config: PlacerConfig, name: str) -> ForecastResidualPolicy:
        """This policy (the same trained network, forecaster, base and advisor) under `config`, named `name`, with
        its own per-rollout sums: e.g. the replay guard's bolder or more cautious copy
        (`models.placer_guard.shifted_placer`). ValueError where `config` changes the inputs the network reads."""
        if feature_names(config, 2) != feature_names(self.config, 2):
            raise ValueError(f"forecast placer variant {name!r}: its config changes the network's inputs")
        copied = copy.copy(self)
        copied.config, copied.name, copied._sums = config, name, RunningSums()
        return copied

    def ready(self, cfg: SimConfig) -> ResidualPlacerNet:
        """The network for `cfg` (built on first use; a checkpoint's D must match)."""
        if self.net is None:
            self.n_resources = cfg.n_resources
            self.net = self._build(cfg.n_resources)
        if cfg.n_resources != self.n_resources:
            raise ValueError(
                f"forecast placer {self.checkpoint or '(untrained)'}: trained for {self.n_resources} resources, "
                f"asked to schedule {cfg.n_resources}"
            )
        return self.net

    @property
    def reads_labels(self) -> bool:
        """Whether the base rule or the input forecasts read EC labels (`sim.labelling.reads_labels`)."""
        return self.base.reads_labels

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return self.base.pick_job(cfg, state, rng)

    def decision_inputs(
        self, cfg: SimConfig, state: State, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        """The base rule's actions, the mask and the features of one decision (after the job pick), on the
        labels the labeller serves when the policy has one."""
        seen = self.base.served(cfg, state)
        fused = self._decide(cfg, seen)
        advice = None
        if fused is not None:
            base, mask, x, g, advice = fused
        else:
            base = self.base.act(cfg, seen, rng, served=True)
            mask = action_mask(cfg, state)
            rule = None if self.advisor is None else self.advisor.risk_rule  # bounded in the same pass
            x, g = placement_features(
                cfg, seen, self.forecaster, self.config, base, mask, self._sums, skip_done=True, advisor=rule
            )
        if self.advisor is not None and advice is None:
            advice = self.advisor.act(cfg, seen, rng, served=True)
        if self.config.action_set != "valid":
            counts = running_counts(self.config, cfg.n_resources, x) if self.config.rule_charge else None
            levels = rule_levels(self.config, state, counts)
            kept = advice if self.config.keep_advice else None
            mask = safe_action_mask(cfg, self.config, x, base, mask, kept, levels)
        inputs = {"x": x, "g": g, "base": base, "mask": mask}
        if self.advisor is not None:
            inputs["advice"] = advice
        return inputs

    def _decide(self, cfg: SimConfig, seen: State) -> tuple[np.ndarray, ...] | None:
        """(base, mask, x, g, advice) from `models.placer_kernel.decide` (one kernel for the base rule, the mask,
        the inputs and the advisor's action, None where it has none or its rule is not the kernel's; the state
        `seen` differs from the env's in its labels only, which the mask does not read), or None where it does
        not apply. The advisor decides on `seen`, as `decision_inputs` asks it where the kernel does not."""
        rule = self.base.risk_rule
        if rule is None:
            return None
        advisor = None if self.advisor is None else self.advisor.risk_rule
        pcfg, fc = self.config, self.forecaster
        return placer_kernel.decide(
            cfg, seen, rule, fc, pcfg.levels, pcfg.rho, pcfg.use_durations, input_horizon(fc, pcfg), advisor
        )

    def logits(self, cfg: SimConfig, inputs: dict[str, np.ndarray]) -> torch.Tensor:
        net = self.ready(cfg)
        advice = inputs.get("advice")
        return net(
            torch.from_numpy(inputs["x"]),
            torch.from_numpy(inputs["g"]),
            torch.from_numpy(inputs["base"]),
            torch.from_numpy(inputs["mask"]),
            None if advice is None else torch.from_numpy(advice),
        )

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        inputs = self.decision_inputs(cfg, state, rng)
        with torch_threads(1), torch.no_grad():
            return self.logits(cfg, inputs).argmax(dim=1).numpy().astype(np.int64)

    def policy_payload(self, path: str | Path) -> dict:
        """The trained-policy payload (`models.checkpoint.publish_policy`) of this policy (module docstring);
        ValueError naming `path` when the network was never built."""
        if self.net is None:
            raise ValueError(f"forecast placer: nothing to save to {path}: the network was never built")
        early = self.stopped_by in ("patience", "time_budget")
        return {
            "policy": self.name,
            "config": config_dict(self.config),
            "iteration": int(self.iterations_run),
            "n_iterations": int(self.iterations_run if early else self.config.n_iterations),
            "model": self.net.state_dict(),
            "feature_names": list(feature_names(self.config, self.n_resources)),
            "n_resources": int(self.n_resources),
            "base": base_spec(self.base_policy),
            "advisor": None if self.advisor_policy is None else base_spec(self.advisor_policy),
            "guard_rules": [base_spec(rule) for rule in self.guard_rules],
            "forecaster": forecaster_spec(uncached(self.forecaster)),
            "best_iteration": int(self.trained_iteration),
            "stopped_by": self.stopped_by,
        }

    def save(
        self,
        path: str | Path,
        source: str | None = None,
        load_pct: int | None = None,
        revision: str | None = None,
    ) -> Path:
        """Publish the policy at `path` with its sidecar (`models.checkpoint.publish_trained`): the run (`source`,
        `load_pct` when known, the config's seed), the configuration (PlacerConfig, D, the base rule's and the
        forecaster's kinds) and the git `revision` (None: this checkout's). ValueError naming the file when the
        network was never built or training has not finished (module docstring)."""
        payload = self.policy_payload(path)
        forecaster = payload["forecaster"]
        config = payload["config"] | {
            "n_resources": payload["n_resources"],
            "base": payload["base"].get("name", payload["base"]["kind"]),
            "advisor": None
            if payload["advisor"] is None
            else payload["advisor"].get("name", payload["advisor"]["kind"]),
            "forecaster": None if forecaster is None else forecaster["kind"],
        }
        revision = git_revision() if revision is None else revision
        return publish_trained(Path(path), payload, source, load_pct, self.config.seed, config, revision)


PLACER_KEYS = (
    "config",
    "model",
    "feature_names",
    "n_resources",
    "base",
    "forecaster",
    "best_iteration",
    "stopped_by",
)
"""Keys a placer file holds beyond the shared ones (`policy_format`, `policy`, `iteration`, `n_iterations`)."""


def placer_config(path: Path, payload: dict) -> PlacerConfig:
    """The PlacerConfig a placer file was trained with; ValueError naming the file when it is not one."""
    try:
        saved = payload["config"]["PlacerConfig"]
        return PlacerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"forecast placer {path}: its config does not match PlacerConfig: {err}") from err


def read_placer(path: str | Path) -> dict:
    """A published placer's payload (weights_only=True), once `models.checkpoint.check_trained` finds its sidecar
    and its training finished. FileNotFoundError naming the file when it is missing; ValueError naming it when it
    is corrupt, not a published forecast placer, short of its iterations, its config is not a PlacerConfig, or its
    feature set is not the one this code computes."""
    path = Path(path)
    payload = read_payload(path, "forecast placer")
    fmt, name = payload.get("policy_format"), payload.get("policy")
    missing = [k for k in PLACER_KEYS if k not in payload]
    if fmt != POLICY_FORMAT or name != ForecastResidualPolicy.name or missing:
        raise ValueError(
            f"forecast placer {path}: not a published forecast placer (policy_format {fmt!r}, policy {name!r}"
            f"{f', lacks {missing}' if missing else ''}; expected {POLICY_FORMAT!r}, "
            f"{ForecastResidualPolicy.name!r}); {RETRAIN}"
        )
    check_trained(path, RETRAIN, payload)
    config = placer_config(path, payload)
    expected = list(feature_names(config, int(payload["n_resources"])))
    if list(payload["feature_names"]) != expected:
        raise ValueError(
            f"forecast placer {path} was trained with another feature set: {payload['feature_names']} "
            f"(this code computes {expected})"
        )
    return payload


# --- rollouts -----------------------------------------------------------------------------------------------


@dataclass
class RolloutRecord:
    """The decisions of one batched rollout (only envs still running at each decision)."""

    x: list
    g: list
    mask: list
    base: list
    action: list
    logp: list
    env: list
    reward: list
    returns: np.ndarray
    n_decisions: int = 0
    n_env_decisions: int = 0
    n_agree: int = 0
    entropy_sum: float = 0.0
    overshoot_pct: np.ndarray | None = None
    """(B,) each episode's overshoot % (`sim.metrics.overshoot_pct_per_episode`) where the rollout recorded a
    trace, else None."""

    @property
    def imitation_accuracy(self) -> float:
        return self.n_agree / max(self.n_env_decisions, 1)

    @property
    def mean_entropy(self) -> float:
        return self.entropy_sum / max(self.n_env_decisions, 1)


def run_rollout(
    policy: ForecastResidualPolicy,
    cfg: SimConfig,
    jobs: JobBatch,
    seed: int | np.ndarray,
    mode: str,
    rng: np.random.Generator,
    teacher=None,
    keep: bool = False,
    on_decision: Callable[[State, dict, np.ndarray], None] | None = None,
    entropy: bool = True,
    overshoot: bool = False,
    greedy_log: list | None = None,
) -> RolloutRecord:
    """One batched episode per sequence of `jobs` (`seed`: the simulator's, an int or one per env as
    `sim.core.reset` takes it). mode: "greedy" (the policy's argmax), "sample" (its masked
    softmax) or "teacher" (the teacher's actions on the states the base rule's job picks lead to). With `keep`,
    the decisions' inputs, actions, log-probabilities and rewards are recorded for training; `on_decision(state,
    inputs, active)` sees every decision's state (after the job pick) and inputs. `entropy=False` skips the
    softmax of a greedy rollout that keeps nothing (the record's `mean_entropy` is then NaN): PGPE's training
    rollouts read only returns. `overshoot`: the step records a trace and the record gets each episode's
    overshoot % (what `sim.tuning.sequence_outcomes` measures, from the same episodes). `greedy_log`: a list that
    gets, per decision of a greedy rollout, the network's inputs of the envs deciding and their argmax actions
    (what `replay_greedy` checks a changed network against). The network runs on one
    torch thread, or on as many as numba's where the batch's kernels use numba's threads
    (`rollout_torch_threads`)."""
    with torch_threads(rollout_torch_threads(jobs.batch_size)):
        return _run_rollout(
            policy, cfg, jobs, seed, mode, rng, teacher, keep, on_decision, entropy, overshoot, greedy_log
        )


def rollout_torch_threads(n_envs: int) -> int:
    """Torch threads of a rollout over `n_envs` envs: numba's thread count where the simulator's kernels use
    numba's threads (`sim.compiled_step.on_threads`: a large batch, more than one thread), else 1. The network
    then runs between the kernels on the cores they use (68k against 63k decisions/s at B x N = 400 on two
    cores, the same returns: GEMMs this small split no sum across threads, and a test checks the logits' bits);
    a small batch keeps one thread (threads on busy cores cost more than such a net saves)."""
    return numba.get_num_threads() if on_threads(n_envs) else 1


def _run_rollout(
    policy,
    cfg,
    jobs,
    seed,
    mode,
    rng,
    teacher,
    keep,
    on_decision,
    entropy=True,
    overshoot=False,
    greedy_log=None,
) -> RolloutRecord:
    rec = RolloutRecord([], [], [], [], [], [], [], [], np.zeros(jobs.batch_size))
    softmax = entropy or keep or mode != "greedy"
    if not softmax:
        rec.entropy_sum = float("nan")
    prepare = getattr(policy.base.labeller, "prepare", None)
    if prepare is not None:  # once per batch: every rollout's own copy of it carries the labeller's job rows
        prepare(cfg, jobs)
    state = core.reset(cfg, jobs, seed)
    trace = core.make_trace(cfg, jobs.batch_size) if overshoot else None
    # job picks reorder the episode's own batch in place and the step writes the state in place, unless a
    # callback may keep earlier states
    in_place = on_decision is None
    if in_place:
        state = own_jobs(state)
    limit = int(jobs.max_jobs + cfg.max_steps + 1) * 2
    for _ in range(limit):
        if state.is_done.all():
            break
        active = np.flatnonzero(~state.is_done)
        state = promote_queued_job(
            state, np.where(state.is_done, 0, policy.pick_job(cfg, state, rng)), in_place
        )
        inputs = policy.decision_inputs(cfg, state, rng)
        if on_decision is not None:
            on_decision(state, inputs, active)
        # the network runs on the envs still deciding (an env's scores read only its own row); an env that has
        # finished takes its base action, which the step ignores
        every = active.size == state.batch_size  # no env has finished: the rows as they are, no copies
        live = inputs if every else {key: value[active] for key, value in inputs.items()}
        with torch.no_grad():
            logits = policy.logits(cfg, live)
            if softmax:
                logp = _log_probs(logits)
                rec.entropy_sum += float(_entropy(logp, torch.from_numpy(live["mask"])).sum())
        greedy = logits.argmax(dim=1).numpy()
        if greedy_log is not None:  # features and mask are new arrays each decision; the others copied
            kept = {k: v if k in ("x", "g", "mask") else np.array(v, copy=True) for k, v in live.items()}
            greedy_log.append((kept, greedy))
        actions = inputs["base"].copy()
        if mode == "greedy":
            actions[active] = greedy
        elif mode == "sample":
            probs = logp.exp().numpy()
            cum = np.cumsum(probs, axis=1)
            u = rng.random((state.batch_size, 1))[active] * cum[:, -1:]  # one draw per env, as before
            picked = np.minimum((cum < u).sum(axis=1), probs.shape[1] - 1).astype(np.int64)
            actions[active] = np.where(live["mask"][np.arange(picked.size), picked], picked, live["base"])
        else:
            actions = np.asarray(teacher.act(cfg, state, rng), dtype=np.int64)
            inputs["mask"][np.arange(actions.size), actions] = True  # a teacher's valid action, safe or not
        rec.n_decisions += 1
        rec.n_env_decisions += active.size
        rec.n_agree += int((greedy == live["base"]).sum())
        state, reward, *_ = core.step(cfg, state, actions, trace, mask=inputs["mask"], in_place=in_place)
        if keep:  # features and mask are new arrays each decision: kept as they are where every env decided
            rec.x.append(inputs["x"] if every else inputs["x"][active])
            rec.g.append(inputs["g"] if every else inputs["g"][active])
            rec.mask.append(inputs["mask"] if every else inputs["mask"][active])
            rec.base.append(inputs["base"][active])  # the base rule's array: a copy
            rec.action.append(actions[active])
            rec.logp.append(logp.numpy()[np.arange(active.size), actions[active]])
            rec.env.append(active)
            rec.reward.append(reward[active])
    if not state.is_done.all():
        raise RuntimeError(f"forecast placer: episodes not finished after {limit} decisions")
    rec.returns = state.penalty_totals.sum(axis=1)
    if trace is not None:
        rec.overshoot_pct = overshoot_pct_per_episode(trace, state)
    return rec


def replay_greedy(policy: ForecastResidualPolicy, cfg: SimConfig, log: list, n_envs: int) -> float | None:
    """The softmax entropy summed over the decisions of a greedy rollout of `n_envs` envs that `log` recorded
    (`run_rollout(greedy_log=...)`), where the policy's network as it is now takes the same action at every one
    of them, else None. A greedy rollout's job picks, random draws and steps depend on the network only through
    its actions, so by induction over the decisions it would run the same episodes again: the same returns,
    imitation and overshoot, and this entropy, computed as the rollout computes it (the same inputs, batch and
    torch threads). Validation runs a network whose greedy actions did not move (PGPE's early and late
    iterations) at the cost of its forward passes instead of the episodes."""
    entropy_sum = 0.0
    with torch_threads(rollout_torch_threads(n_envs)), torch.no_grad():
        for live, greedy in log:
            logits = policy.logits(cfg, live)
            if not np.array_equal(logits.argmax(dim=1).numpy(), greedy):
                return None
            entropy_sum += float(_entropy(_log_probs(logits), torch.from_numpy(live["mask"])).sum())
    return entropy_sum


def _advantages(rec: RolloutRecord, seq_of_env: np.ndarray, discount: float) -> np.ndarray:
    """Per recorded decision: reward-to-go minus the mean reward-to-go of the same sequence's rollouts at the same
    decision index, over the whole iteration's standard deviation."""
    env = np.concatenate(rec.env)
    reward = np.concatenate(rec.reward)
    order = np.argsort(env, kind="stable")  # per env, decisions in time order
    n_envs = seq_of_env.size
    counts = np.bincount(env, minlength=n_envs)
    rtg_sorted = np.empty(reward.size)
    index_sorted = np.empty(reward.size, dtype=np.int64)
    pos = 0
    for e in range(n_envs):
        r = reward[order[pos : pos + counts[e]]]
        g = np.empty_like(r)
        acc = 0.0
        for i in range(r.size - 1, -1, -1):
            acc = r[i] + discount * acc
            g[i] = acc
        rtg_sorted[pos : pos + counts[e]] = g
        index_sorted[pos : pos + counts[e]] = np.arange(counts[e])
        pos += counts[e]
    key = seq_of_env[env[order]] * (int(counts.max(initial=0)) + 1) + index_sorted
    sums = np.bincount(key, weights=rtg_sorted)
    n = np.bincount(key)
    adv_sorted = rtg_sorted - sums[key] / n[key]
    adv = np.empty(reward.size)
    adv[order] = adv_sorted
    return adv / (adv.std() + 1e-8)


# --- vine: branch rollouts from the trunk's decisions ------------------------------------------------------


def gather_states(points: list[tuple[State, int, int]]) -> State:
    """One batched State of env `b` of `state`, `n` times over, for every (state, b, n) of `points` (states of one
    rollout: same padding of jobs and timeline)."""
    rows = [(st, b) for st, b, n in points for _ in range(n)]
    values = {}
    for f in fields(State):
        if f.name == "jobs":
            continue
        first = getattr(rows[0][0], f.name)
        if first is None and all(getattr(st, f.name) is None for st, _ in rows):
            values[f.name] = None
            continue
        if f.name == "obs_label":
            values[f.name] = np.stack([core.observed_labels(st)[b] for st, b in rows])
        else:
            values[f.name] = np.stack([getattr(st, f.name)[b] for st, b in rows])
    pick = lambda tup, b: tup[b] if b < len(tup) else ()  # noqa: E731
    jobs = JobBatch(
        arrival_step=np.stack([st.jobs.arrival_step[b] for st, b in rows]),
        duration=np.stack([st.jobs.duration[b] for st, b in rows]),
        usage=np.stack([st.jobs.usage[b] for st, b in rows]),
        request=np.stack([st.jobs.request[b] for st, b in rows]),
        ec_label=np.stack([st.jobs.ec_label[b] for st, b in rows]),
        n_jobs=np.array([st.jobs.n_jobs[b] for st, b in rows]),
        sequence_keys=tuple(pick(st.jobs.sequence_keys, b) for st, b in rows),
        workload_ids=tuple(pick(st.jobs.workload_ids, b) for st, b in rows),
        meta=None if rows[0][0].jobs.meta is None else np.stack([st.jobs.meta[b] for st, b in rows]),
        usage_exact=None
        if rows[0][0].jobs.usage_exact is None
        else np.stack([st.jobs.usage_exact[b] for st, b in rows]),
    )
    return State(jobs=jobs, **values)


def branch_returns(
    base: BaseRule,
    cfg: SimConfig,
    state: State,
    first_actions: np.ndarray,
    rng: np.random.Generator,
    window: int | None,
    counter: dict | None = None,
) -> np.ndarray:
    """(E,) return of each env of `state` after taking `first_actions` and then following the base rule, to the
    episode's end or for `window` decisions (the penalties accumulated by then). `counter["env_decisions"]`, when
    given, grows by the env-decisions simulated."""
    mask = action_mask(cfg, state)
    if not mask[np.arange(state.batch_size), first_actions].all():
        raise ValueError("vine: a branch's first action is not valid")
    state, *_ = core.step(cfg, state, first_actions, mask=mask)
    limit = int(state.jobs.max_jobs + cfg.max_steps + 1) * 2 if window is None else window
    n_decided = state.batch_size
    for _ in range(limit):
        if state.is_done.all():
            break
        n_decided += int((~state.is_done).sum())
        state = promote_queued_job(state, np.where(state.is_done, 0, base.pick_job(cfg, state, rng)))
        state, *_ = core.step(cfg, state, base.act(cfg, state, rng))
    if counter is not None:
        counter["env_decisions"] = counter.get("env_decisions", 0) + n_decided
    return state.penalty_totals.sum(axis=1)


@dataclass
class VineBatch:
    """Branched decisions: the policy's inputs, the actions tried and their advantage over the base's action."""

    x: np.ndarray
    g: np.ndarray
    mask: np.ndarray
    base: np.ndarray
    candidates: np.ndarray
    """(P, C) actions tried (the base's first), -1 = none."""
    advantage: np.ndarray
    """(P, C) return after the action minus return after the base's action (0 where none)."""
    prior: np.ndarray
    """(P, C) the policy's probabilities of the actions tried when they were branched (0 where none)."""
    trunk_return: float
    n_env_decisions: int


def vine_batch(
    policy: ForecastResidualPolicy, cfg: SimConfig, jobs: JobBatch, seed: int, rng: np.random.Generator
) -> VineBatch:
    """A greedy trunk rollout of `jobs`, `vine_points` decisions per sequence branched into the base's action and
    the policy's likeliest other valid actions, each branch continued by the base rule."""
    c = policy.config
    horizon = np.maximum((0.9 * jobs.n_jobs).astype(np.int64), 1)
    chosen = [set(rng.choice(h, size=min(c.vine_points, h), replace=False).tolist()) for h in horizon]
    counter = np.zeros(jobs.batch_size, dtype=np.int64)
    points: list[tuple[State, int, dict]] = []

    def visit(state: State, inputs: dict, active: np.ndarray) -> None:
        for b in active.tolist():
            if counter[b] in chosen[b] and inputs["mask"][b].sum() >= 2:
                points.append((state, b, {k: v[b] for k, v in inputs.items()}))
        counter[active] += 1

    trunk = run_rollout(policy, cfg, jobs, seed, "greedy", rng, on_decision=visit)
    if not points:
        raise ValueError("vine: no decision with two valid actions to branch from")
    x = np.stack([p[2]["x"] for p in points])
    g = np.stack([p[2]["g"] for p in points])
    mask = np.stack([p[2]["mask"] for p in points])
    base = np.array([p[2]["base"] for p in points])
    with torch.no_grad():
        logits = policy.ready(cfg)(
            torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(base), torch.from_numpy(mask)
        ).numpy()
    n_c = min(c.vine_candidates, mask.shape[1])
    order = np.argsort(-np.where(mask, logits, -np.inf), axis=1, kind="stable")
    candidates = np.full((len(points), n_c), -1, dtype=np.int64)
    for i in range(len(points)):
        others = [a for a in order[i] if mask[i, a] and a != base[i]][: n_c - 1]
        candidates[i, : 1 + len(others)] = [base[i], *others]
    n_try = (candidates >= 0).sum(axis=1)
    branches = gather_states([(st, b, int(n)) for (st, b, _), n in zip(points, n_try, strict=True)])
    counter: dict = {}
    returns = branch_returns(
        policy.base, cfg, branches, candidates[candidates >= 0], rng, c.vine_window, counter
    )
    advantage = np.zeros(candidates.shape)
    advantage[candidates >= 0] = returns
    advantage = np.where(candidates >= 0, advantage - advantage[:, :1], 0.0)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    prior = np.where(candidates >= 0, np.take_along_axis(probs, np.maximum(candidates, 0), axis=1), 0.0)
    return VineBatch(
        x,
        g,
        mask,
        base,
        candidates,
        advantage,
        prior,
        float(trunk.returns.mean()),
        trunk.n_env_decisions + counter["env_decisions"],
    )


def merge_vine(old: VineBatch | None, new: VineBatch, capacity: int) -> VineBatch:
    """The replay buffer of branched decisions: `new` appended to `old`, the oldest dropped past `capacity`. The
    advantages are the base rule's (every branch continues with it), so they stay valid as the policy changes."""
    if old is None:
        return new
    keep = slice(max(len(old.base) + len(new.base) - capacity, 0), None)
    cat = lambda a, b: np.concatenate([a, b])[keep]  # noqa: E731
    return VineBatch(
        cat(old.x, new.x),
        cat(old.g, new.g),
        cat(old.mask, new.mask),
        cat(old.base, new.base),
        cat(old.candidates, new.candidates),
        cat(old.advantage, new.advantage),
        cat(old.prior, new.prior),
        new.trunk_return,
        new.n_env_decisions,
    )


def _vine_update(
    net: ResidualPlacerNet, opt: torch.optim.Optimizer, vb: VineBatch, c: PlacerConfig, iteration: int
) -> None:
    """Soft policy improvement on the replay buffer (MPO / AWR style): over the actions tried at each branched
    decision, the target q(a) is proportional to prior(a) exp(A(s, a) / (eta sigma)) (sigma: the standard deviation
    of the alternatives' advantages, eta = `vine_temperature`); `vine_epochs` Adam steps of cross-entropy from q to
    the policy's distribution over those actions, minus the entropy bonus. A plain expected-advantage objective is
    linear in the policy and collapsed it onto a few noisy branches (measured); the soft target moves the policy
    only as far as the advantages outweigh its prior."""
    tried = vb.candidates >= 0
    alternatives = vb.advantage[:, 1:][tried[:, 1:]]
    scale = (float(alternatives.std()) + 1e-8 if alternatives.size > 1 else 1.0) * c.vine_temperature
    logits_q = np.where(tried, np.log(np.maximum(vb.prior, 1e-12)) + vb.advantage / scale, -np.inf)
    q = np.exp(logits_q - logits_q.max(axis=1, keepdims=True))
    dev = next(net.parameters()).device
    q = torch.from_numpy((q / q.sum(axis=1, keepdims=True)).astype(np.float32)).to(dev)
    cand = torch.from_numpy(np.maximum(vb.candidates, 0)).to(dev)
    tried_t = torch.from_numpy(tried).to(dev)
    x, g = torch.from_numpy(vb.x).to(dev), torch.from_numpy(vb.g).to(dev)
    base, mask = torch.from_numpy(vb.base).to(dev), torch.from_numpy(vb.mask).to(dev)
    for _ in range(c.vine_epochs):
        logp_all = _log_probs(net(x, g, base, mask))
        logp_c = logp_all.gather(1, cand).masked_fill(~tried_t, _NEG)
        logp_c = logp_c - torch.logsumexp(logp_c, dim=1, keepdim=True)  # the policy over the tried actions
        cross_entropy = -(q * logp_c.masked_fill(~tried_t, 0.0)).sum(dim=1).mean()
        loss = cross_entropy - c.entropy_coef * _entropy(logp_all, mask).mean()
        _check_finite(loss, "pg", iteration)
        opt.zero_grad()
        loss.backward()
        opt.step()


# --- pgpe: exploration in the head's weights ---------------------------------------------------------------

HEAD_PARAMETERS = (
    "machine_head.weight",
    "machine_head.bias",
    "hold_head.2.weight",
    "hold_head.2.bias",
    "base_bonus",
)
"""The parameters PGPE perturbs and moves: the last layers of the machine and hold scores and the base bonus (and
an advised network's advice bonus: `head_names`)."""


def head_names(net: ResidualPlacerNet) -> tuple[str, ...]:
    """The names of the head's parameters of `net`: `HEAD_PARAMETERS`, and the advice bonus where it is advised."""
    return HEAD_PARAMETERS + (("advice_bonus",) if net.advised else ())


def _hold_hidden(net: ResidualPlacerNet, emb: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The hold head's hidden layer (the input of its last layer) from the machine embeddings `emb`."""
    pooled = torch.cat([emb.mean(dim=1), torch.amax(emb, dim=1), g], dim=1)
    return net.hold_head[1](net.hold_head[0](pooled))


class PopulationPolicy:
    """The residual policy with its head's weights per env: env e scores with `heads[name][member[e]]` (each
    (P, *shape) for the names of `HEAD_PARAMETERS`) on the shared encoder, so P perturbed policies run in one
    batched rollout. With every member's head the network's own, its logits are the network's."""

    def __init__(self, policy: ForecastResidualPolicy, heads: dict[str, torch.Tensor], member: np.ndarray):
        self.inner, self.heads, self.member = policy, heads, np.asarray(member, dtype=np.int64)
        self.base = policy.base

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return self.inner.pick_job(cfg, state, rng)

    def decision_inputs(
        self, cfg: SimConfig, state: State, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        inputs = self.inner.decision_inputs(cfg, state, rng)
        inputs["member"] = self.member  # sliced with the other inputs to the envs still deciding
        return inputs

    @torch.no_grad()
    def logits(self, cfg: SimConfig, inputs: dict[str, np.ndarray]) -> torch.Tensor:
        """(B, M + 1) masked logits, each env's from its member's head. Never differentiated (PGPE needs no
        gradient), so the layers run as fused matrix products with in-place ReLUs: the network's own numbers
        (tests compare them), at about two thirds of the module calls' cost."""
        net = self.inner.ready(cfg)
        x, g = torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["g"])
        base, mask = torch.from_numpy(inputs["base"]), torch.from_numpy(inputs["mask"])
        m = torch.from_numpy(inputs["member"])
        h = self.heads
        n_envs, n_m, n_f = x.shape
        first, second, hold_in = net.encoder[0], net.encoder[2], net.hold_head[0]
        emb = torch.addmm(first.bias, x.reshape(-1, n_f), first.weight.t()).clamp_min_(0.0)
        emb = torch.addmm(second.bias, emb, second.weight.t()).clamp_min_(0.0).reshape(n_envs, n_m, -1)
        weight = h["machine_head.weight"][m, 0].unsqueeze(2)  # (B, h, 1)
        machine = torch.bmm(emb, weight).squeeze(2) + h["machine_head.bias"][m]
        pooled = torch.cat([emb.mean(dim=1), torch.amax(emb, dim=1), g], dim=1)
        hidden = torch.addmm(hold_in.bias, pooled, hold_in.weight.t()).clamp_min_(0.0)
        hold = (hidden * h["hold_head.2.weight"][m, 0]).sum(dim=1, keepdim=True) + h["hold_head.2.bias"][m]
        logits = torch.cat([machine, hold], dim=1)
        logits[torch.arange(n_envs), base] += h["base_bonus"][m]
        if "advice_bonus" in h:
            logits[torch.arange(n_envs), torch.from_numpy(inputs["advice"])] += h["advice_bonus"][m]
        return logits.masked_fill_(~mask, _NEG)


def _head_parameters(net: ResidualPlacerNet) -> list[nn.Parameter]:
    params = dict(net.named_parameters())
    return [params[name] for name in head_names(net)]


def head_vector(net: ResidualPlacerNet) -> torch.Tensor:
    """The head's parameters (`HEAD_PARAMETERS`) as one flat vector (a copy)."""
    return nn.utils.parameters_to_vector(_head_parameters(net)).detach()


def head_tensors(net: ResidualPlacerNet, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """(P, D) flat head vectors as {name: (P, *shape)} of `HEAD_PARAMETERS`."""
    out, pos = {}, 0
    for name, param in zip(head_names(net), _head_parameters(net), strict=True):
        out[name] = flat[:, pos : pos + param.numel()].reshape(flat.shape[0], *param.shape)
        pos += param.numel()
    return out


def set_head(net: ResidualPlacerNet, flat: torch.Tensor) -> None:
    """Write the flat head vector `flat` (D,) into the network (the parameters view a copy of it)."""
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat.detach().clone(), _head_parameters(net))


def head_scales(net: ResidualPlacerNet, rec: RolloutRecord) -> torch.Tensor:
    """(D,) per head coordinate, the weight change that moves its score by about one logit on the decisions of
    `rec` (a rollout kept with its inputs): 1 / the root mean square norm of the layer's input (the machine
    embeddings, the hold head's hidden layer) for weights, 1 for biases and the base and advice bonuses."""
    with torch.no_grad():
        x, g = torch.from_numpy(np.concatenate(rec.x)), torch.from_numpy(np.concatenate(rec.g))
        emb = net.encoder(x)
        rms_machine = float(emb.pow(2).sum(dim=-1).mean().sqrt())
        rms_hold = float(_hold_hidden(net, emb, g).pow(2).sum(dim=-1).mean().sqrt())
    rms_of = {"machine_head.weight": rms_machine, "hold_head.2.weight": rms_hold}
    return torch.cat(
        [
            torch.full((param.numel(),), 1.0 / max(rms_of[name], 1e-6) if name in rms_of else 1.0)
            for name, param in zip(head_names(net), _head_parameters(net), strict=True)
        ]
    )


def head_coordinates(
    policy: ForecastResidualPolicy, cfg: SimConfig, jobs: JobBatch, seed: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """PGPE's start: (the network's head vector, `head_scales` on a greedy rollout of `jobs` kept with its
    inputs, that rollout's env-decisions)."""
    net = policy.ready(cfg)
    seen = run_rollout(policy, cfg, jobs, seed, "greedy", rng, keep=True)
    return head_vector(net), head_scales(net, seen), seen.n_env_decisions


def antithetic_heads(
    net: ResidualPlacerNet,
    anchor: torch.Tensor,
    scales: torch.Tensor,
    z: torch.Tensor,
    eps: torch.Tensor,
    sigma: float,
) -> dict[str, torch.Tensor]:
    """The 2K heads of one PGPE iteration (`head_tensors`): anchor + scales * (z + sigma eps_k) and
    anchor + scales * (z - sigma eps_k) for each of the K directions `eps` (K, D), ordered +, -, +, - ..."""
    signs = torch.tensor([1.0, -1.0]).repeat(eps.shape[0])
    members = z.detach()[None] + sigma * signs[:, None] * eps.repeat_interleave(2, dim=0)  # (2K, D)
    return head_tensors(net, anchor[None] + scales[None] * members)


def pgpe_step(
    policy: ForecastResidualPolicy,
    cfg: SimConfig,
    fit: JobBatch,
    drawn: np.ndarray,
    z: torch.Tensor,
    anchor: torch.Tensor,
    scales: torch.Tensor,
    opt: torch.optim.Optimizer,
    rng: np.random.Generator,
    iteration: int,
) -> RolloutRecord:
    """One PGPE iteration (module docstring): the head is `anchor + scales * z`; `pgpe_pairs` directions eps run
    at z +- sigma eps on the sequences `drawn` of `fit`, greedy, in one batched rollout; Adam ascends the
    estimate. Returns the rollout (its returns are the iteration's training returns)."""
    c = policy.config
    eps = torch.from_numpy(rng.standard_normal((c.pgpe_pairs, z.numel())).astype(np.float32))
    heads = antithetic_heads(policy.ready(cfg), anchor, scales, z, eps, c.pgpe_sigma)
    n_members = 2 * c.pgpe_pairs
    population = PopulationPolicy(policy, heads, np.repeat(np.arange(n_members), drawn.size))
    batch = fit.select(np.tile(drawn, n_members))
    # one simulator seed per drawn sequence, the same under every head: with noise or perturbed shapes on, a
    # pair's runs of a sequence still see the same randomness
    one = int(rng.integers(2**31))
    seeds = np.tile(np.random.SeedSequence(one).generate_state(drawn.size).astype(np.int64), n_members)
    rec = run_rollout(population, cfg, batch, seeds, "greedy", rng, entropy=False)
    per_member = torch.from_numpy(rec.returns.reshape(n_members, drawn.size).mean(axis=1))
    spread = float(per_member.std()) if per_member.numel() > 1 else 0.0
    diff = (per_member[0::2] - per_member[1::2]).float()  # (K,) R+ - R-
    grad = (diff[:, None] * eps).sum(dim=0) / (2.0 * c.pgpe_pairs * max(spread, 1e-8))
    _check_finite(grad.sum(), "pg", iteration)
    opt.zero_grad()
    z.grad = -grad  # Adam descends: ascend the return
    opt.step()
    return rec


# --- training -----------------------------------------------------------------------------------------------


def _teacher(name: str, policy: ForecastResidualPolicy):
    if name == "base":
        return policy.base
    if name not in POLICIES:
        raise ValueError(
            f"forecast placer: BC teacher {name!r} is not a registered policy; use 'base' or one of {sorted(POLICIES)}"
        )
    if is_fitted(name) or is_learned(name):
        raise ValueError(
            f"forecast placer: BC teacher {name!r} needs fitting or a checkpoint; use 'base' (the fitted base rule)"
        )
    return make_policy(name)


def _stack(rec: RolloutRecord) -> dict[str, torch.Tensor]:
    return {
        "x": torch.from_numpy(np.concatenate(rec.x)),
        "g": torch.from_numpy(np.concatenate(rec.g)),
        "mask": torch.from_numpy(np.concatenate(rec.mask)),
        "base": torch.from_numpy(np.concatenate(rec.base)),
        "action": torch.from_numpy(np.concatenate(rec.action)),
        "logp": torch.from_numpy(np.concatenate(rec.logp).astype(np.float32)),
    }


def _check_finite(loss: torch.Tensor, stage: str, iteration: int) -> None:
    if not torch.isfinite(loss):
        raise FloatingPointError(f"forecast placer: non-finite {stage} loss at {stage} iteration {iteration}")


def behaviour_clone(
    policy: ForecastResidualPolicy,
    cfg: SimConfig,
    fit: JobBatch,
    teacher_name: str,
    n_epochs: int,
    rng: np.random.Generator,
    on_epoch: Callable[[int, float], None] | None = None,
) -> float:
    """Cross-entropy on the teacher's decisions along its own trajectories on `fit`; returns the last epoch's
    teacher-action accuracy on those decisions. `on_epoch(epoch, accuracy)` runs after every epoch. One torch
    thread (nets this small are far slower on more)."""
    with torch_threads(1):
        return _behaviour_clone(policy, cfg, fit, teacher_name, n_epochs, rng, on_epoch)


def _behaviour_clone(
    policy: ForecastResidualPolicy,
    cfg: SimConfig,
    fit: JobBatch,
    teacher_name: str,
    n_epochs: int,
    rng: np.random.Generator,
    on_epoch: Callable[[int, float], None] | None = None,
) -> float:
    c = policy.config
    teacher = _teacher(teacher_name, policy)
    rec = run_rollout(policy, cfg, fit, c.seed, "teacher", rng, teacher=teacher, keep=True)
    data = _stack(rec)
    net = policy.ready(cfg)
    opt = torch.optim.Adam(net.parameters(), lr=c.bc_learning_rate)
    gen = torch.Generator().manual_seed(c.seed)
    n = data["x"].shape[0]
    accuracy = float("nan")
    for epoch in range(1, n_epochs + 1):
        order = torch.randperm(n, generator=gen)
        hits = 0
        for lo in range(0, n, c.minibatch):
            b = order[lo : lo + c.minibatch]
            logits = net(data["x"][b], data["g"][b], data["base"][b], data["mask"][b])
            loss = torch.nn.functional.cross_entropy(logits, data["action"][b])
            _check_finite(loss, "bc", epoch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            hits += int((logits.argmax(dim=1) == data["action"][b]).sum())
        accuracy = hits / max(n, 1)
        if on_epoch is not None:
            on_epoch(epoch, accuracy)
    return accuracy


def _pg_update(
    net: ResidualPlacerNet,
    opt: torch.optim.Optimizer,
    data: dict[str, torch.Tensor],
    adv: torch.Tensor,
    c: PlacerConfig,
    iteration: int,
    gen: torch.Generator,
) -> None:
    n = data["x"].shape[0]
    epochs = c.ppo_epochs if c.algorithm == "ppo" else 1
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        if c.algorithm == "reinforce":
            opt.zero_grad()
        for lo in range(0, n, c.minibatch):
            b = order[lo : lo + c.minibatch]
            logits = net(data["x"][b], data["g"][b], data["base"][b], data["mask"][b])
            logp_all = _log_probs(logits)
            logp = logp_all.gather(1, data["action"][b, None]).squeeze(1)
            entropy = _entropy(logp_all, data["mask"][b]).mean()
            if c.algorithm == "ppo":
                ratio = torch.exp(logp - data["logp"][b])
                clipped = torch.clamp(ratio, 1 - c.ppo_clip, 1 + c.ppo_clip)
                loss = -torch.min(ratio * adv[b], clipped * adv[b]).mean() - c.entropy_coef * entropy
                _check_finite(loss, "pg", iteration)
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                share = b.numel() / n
                loss = (-(adv[b] * logp).mean() - c.entropy_coef * entropy) * share
                _check_finite(loss, "pg", iteration)
                loss.backward()
        if c.algorithm == "reinforce":
            opt.step()


def train_forecast_placer(
    sim_cfg: SimConfig,
    train: JobBatch,
    base=None,
    forecaster: UsageForecaster | None = None,
    config: PlacerConfig = PlacerConfig(),
    log: Callable[[str], None] | None = None,
    speed: dict | None = None,
    device: str = "cpu",
    labeller: Labeller | None = None,
    advisor=None,
) -> tuple[ForecastResidualPolicy, pl.DataFrame]:
    """Train the residual scheduler on the TRAINING sequences `train` of one (source, load) (module docstring).
    `base`: the fitted base rule (None: Tetris); `forecaster`: the fitted per-job forecaster of the inputs
    (None: observed-peak persistence); `advisor`: a second fitted rule whose action gets a learned bonus
    (`ForecastResidualPolicy`; PGPE without a BC stage only). Returns (the policy at its best validation
    iteration, the stage table).
    `speed`, when given, receives the PG rollouts' decisions and seconds. `device`: where the PG updates run
    ('cuda' where a GPU is lent): a learner copy of the network and its optimiser live there and the weights are
    copied back to the CPU actor after each update (one decision's forward pass is too small for a GPU); PGPE's
    update (one Adam step on the head's vector) stays on the CPU.
    `labeller`: the EC labels the policy is served at evaluation (`sim.labelling.ServedLabels`; None: the
    sequences' own), served in every training and validation rollout too (`BaseRule`).
    ValueError on an empty training split or an unregistered teacher; FloatingPointError naming the iteration on a
    non-finite loss."""
    if train.batch_size == 0 or int(train.n_jobs.sum()) == 0:
        raise ValueError(
            "forecast placer: the training split has no sequences with jobs: nothing to train on"
        )
    c = config
    if advisor is not None:
        check_advisor_training(getattr(advisor, "name", str(advisor)), c, "forecast placer: ")
    say = log or (lambda msg: None)
    if c.action_set == "rule" and c.safe_level is None:  # unbound: the advisor's level, else the base's
        level = rule_level(advisor)
        wanted = c.rule_charge
        c = with_rule_level(
            c,
            level if level is not None else rule_level(base),
            forecaster_levels(forecaster),
            first_n_ref((advisor, base)),
        )
        if wanted and not c.rule_charge:
            say("rule_charge off: neither the advisor nor the base is a charge-aware rule with an n_ref")
    fit, val = split_validation(train, c.validation_share)
    if c.rule_shift and c.rise_rate is None:  # the fit part's rate, as forecast_peak_adaptive's
        try:
            c = replace(c, rise_rate=fit_rise_rate(fit, c.rise_prior_events).hazard)
        except ValueError as err:  # no fit job ever rises: nothing to move the level from
            say(f"rule_shift off: {err}")
            c = replace(c, rule_shift=False)
    if c.action_set == "rule":
        shift = f", moved by the episode's rise rate over {c.rise_rate:.4g}" if c.rule_shift else ""
        if c.rule_charge:
            shift = (
                f", raised on each machine holding more jobs than n_ref {c.charge_n_ref:.3g} (rule_charge)"
            )
        say(
            f"action set 'rule': the base's and advisor's actions and the machines safe at q{c.safe_level:g}{shift}"
        )
    fit.observed_prefix  # noqa: B018  once: every iteration's selection of fit sequences shares it
    policy = ForecastResidualPolicy(
        base=base, forecaster=forecaster, config=c, labeller=labeller, advisor=advisor
    )
    if c.bc_epochs > 0:
        _teacher(c.bc_teacher, policy)  # an unregistered teacher fails before any work
    rng = np.random.default_rng([c.seed, 11])
    rows: list[dict] = []
    t_start = time.perf_counter()
    speed = speed if speed is not None else {}
    speed.update(
        {
            "pg_env_decisions": 0,
            "pg_rollout_s": 0.0,
            "pg_update_s": 0.0,
            "validation_s": 0.0,
            "validations_replayed": 0,
        }
    )

    base_returns: list[np.ndarray] = []  # the base rule's per-sequence validation returns
    # (record, greedy log) of the last validation rollout run: a replayed validation ran the same episodes, so
    # its record's overshoot (with a budget) is the network's as it is now
    last_validation: list = []

    def validate(stage: str, iteration: int, t0: float, train_return: float = float("nan")) -> float:
        """Runs the greedy policy on validation, adds its row; returns its score (`PlacerConfig.choice_z`). Where
        the network takes the last validation rollout's action at each of its decisions, that rollout stands
        for it (`replay_greedy`: the same episodes), with the entropy of the network as it is now."""
        t1 = time.perf_counter()
        entropy_sum = None
        if last_validation:
            entropy_sum = replay_greedy(policy, sim_cfg, last_validation[1], val.batch_size)
        if entropy_sum is not None:
            rec = replace(last_validation[0], entropy_sum=entropy_sum)
            speed["validations_replayed"] += 1
        else:
            greedy_log: list = []
            rec = run_rollout(
                policy,
                sim_cfg,
                val,
                c.seed,
                "greedy",
                np.random.default_rng([c.seed, 12]),
                overshoot=c.overshoot_budget_pct is not None,
                greedy_log=greedy_log,
            )
            last_validation[:] = [rec, greedy_log]
        speed["validation_s"] += time.perf_counter() - t1
        ret = float(rec.returns.mean())
        if not base_returns:
            base_returns.append(rec.returns)
        score = ret if c.choice_z == 0.0 else gain_bound(rec.returns - base_returns[0], c.choice_z)
        rows.append(
            {
                "stage": stage,
                "iteration": iteration,
                "validation_return": ret,
                "imitation_accuracy": rec.imitation_accuracy,
                "entropy": rec.mean_entropy,
                "train_return": train_return,
                "seconds": time.perf_counter() - t0,
                "elapsed_s": time.perf_counter() - t_start,
            }
        )
        say(
            f"{stage} {iteration}: validation return {ret:.4g}, imitation {rec.imitation_accuracy:.3f}, "
            f"entropy {rec.mean_entropy:.3f}, {rows[-1]['seconds']:.1f} s"
            + ("" if c.choice_z == 0.0 else f", gain bound {score:.4g}")
        )
        return score

    # the overshoot budget (`PlacerConfig.overshoot_budget_pct`): Tetris's validation overshoot plus the budget
    limit = None
    if c.overshoot_budget_pct is not None:
        limit = float(sequence_outcomes(Tetris(), sim_cfg, val, c.seed)[1].mean()) + c.overshoot_budget_pct

    def within_budget(stage: str, iteration: int) -> bool:
        """Whether the network as it is now overshoots on validation within the budget (logged): from the trace
        of its validation rollout, which `validate` ran (or replayed) just before."""
        over = float(last_validation[0].overshoot_pct.mean())
        ok = over <= limit + 1e-12
        say(
            f"{stage} {iteration}: validation overshoot {over:.3f} % ({'within' if ok else 'above'} {limit:.3f} %)"
        )
        return ok

    # the larger cluster (`PlacerConfig.generalise_factor`): the validation sequences superposed
    larger = larger_validation(sim_cfg, val, c, say)
    larger_base: list[np.ndarray] = []

    def generalises(stage: str, iteration: int) -> bool:
        """Whether the network as it is now is not significantly below the base rule at the larger M (logged)."""
        t1 = time.perf_counter()
        cfg_l, val_l = larger
        rec = run_rollout(policy, cfg_l, val_l, c.seed, "greedy", np.random.default_rng([c.seed, 13]))
        speed["validation_s"] += time.perf_counter() - t1
        if not larger_base:
            larger_base.append(rec.returns)
        diff = rec.returns - larger_base[0]
        bound = 0.0 - gain_bound(-diff, c.choice_z)  # mean + z x standard error
        ok = bound >= 0.0
        say(
            f"{stage} {iteration}: validation at M = {cfg_l.n_machines}: gain over the base {diff.mean():.4g} "
            f"(upper bound {bound:.4g}: {'kept' if ok else 'set aside'})"
        )
        return ok

    def judged(
        stage: str, iteration: int, score: float, best_score: float, best_within: bool
    ) -> tuple[bool, bool]:
        """`keeps` for the network as it is now, whose validation `score` ran just before: (keep it, within the
        overshoot budget), against the kept score and budget status."""
        return keeps(
            score > best_score,
            best_within,
            None if limit is None else functools.partial(within_budget, stage, iteration),
            None if larger is None else functools.partial(generalises, stage, iteration),
        )

    with torch_threads(1):
        net = policy.ready(sim_cfg)
        best_return = validate("base", 0, time.perf_counter())
        best_state, best_iter = copy.deepcopy(net.state_dict()), 0
        best_within = True if limit is None else within_budget("base", 0)
        if larger is not None:
            # the base rule's returns at the larger M: what every candidate is paired with
            generalises("base", 0)
        # behaviour cloning
        if c.bc_epochs > 0:
            t_bc = [time.perf_counter()]

            last_score = [best_return]

            def bc_row(epoch: int, accuracy: float) -> None:
                last_score[0] = validate("bc", epoch, t_bc[0])
                t_bc[0] = time.perf_counter()

            behaviour_clone(policy, sim_cfg, fit, c.bc_teacher, c.bc_epochs, rng, bc_row)
            best_return = last_score[0]
            best_state = copy.deepcopy(net.state_dict())
            best_within = True if limit is None else within_budget("bc", c.bc_epochs)
        start_stage = "bc" if c.bc_epochs > 0 else "base"
        if net.advised and c.advisor_probe:
            # the second start: the advisor's action preferred over the base's (`PlacerConfig.advisor_probe`)
            kept_state, kept_validation = copy.deepcopy(net.state_dict()), list(last_validation)
            with torch.no_grad():
                net.advice_bonus.fill_(2.0 * float(net.base_bonus))
            score = validate("probe", 0, time.perf_counter())
            better, within = judged("probe", 0, score, best_return, best_within)
            say(f"probe: the advisor's start {'kept' if better else 'set aside'}")
            if better:
                best_return, best_within, start_stage = score, within, "probe"
                best_state = copy.deepcopy(net.state_dict())
            else:  # back to the base, whose validation episodes the next replay may reuse
                net.load_state_dict(kept_state)
                last_validation[:] = kept_validation
        # policy gradient: the learner (on `device`) and the actor (the policy's CPU network); PGPE's update is
        # a step on the head's vector, on the CPU
        learner = net if device == "cpu" or c.algorithm == "pgpe" else copy.deepcopy(net).to(device)
        opt = torch.optim.Adam(learner.parameters(), lr=c.learning_rate)
        gen = torch.Generator().manual_seed(c.seed)
        pool: list[int] = []
        replay: VineBatch | None = None
        z = anchor = scales = None  # PGPE's head coordinates (set on its first iteration)
        since_best, iterations_run, stopped_by = 0, 0, "n_iterations"
        for iteration in range(1, c.n_iterations + 1):
            if time.perf_counter() - t_start > c.time_budget_s:
                say(f"pg: time budget of {c.time_budget_s:.0f} s spent after {iteration - 1} iterations")
                stopped_by = "time_budget"
                break
            t0 = time.perf_counter()
            # rollout
            if len(pool) < c.n_sequences:
                pool += rng.permutation(fit.batch_size).tolist()
            drawn = np.array(pool[: min(c.n_sequences, fit.batch_size)])
            pool = pool[drawn.size :]
            if c.algorithm == "pgpe":
                if z is None:  # the head's coordinates, scaled on the base rule's decisions on fit sequences
                    anchor, scales, n_seen = head_coordinates(policy, sim_cfg, fit.select(drawn), c.seed, rng)
                    speed["pg_env_decisions"] += n_seen
                    z = torch.zeros_like(anchor, requires_grad=True)
                    opt = torch.optim.Adam([z], lr=c.pgpe_learning_rate)
                rec = pgpe_step(policy, sim_cfg, fit, drawn, z, anchor, scales, opt, rng, iteration)
                t1 = time.perf_counter()
                speed["pg_env_decisions"] += rec.n_env_decisions
                speed["pg_rollout_s"] += t1 - t0
                set_head(net, anchor + scales * z.detach())
                train_return = float(rec.returns.mean())
            elif c.algorithm == "vine":
                vb = vine_batch(policy, sim_cfg, fit.select(drawn), int(rng.integers(2**31)), rng)
                t1 = time.perf_counter()
                speed["pg_env_decisions"] += vb.n_env_decisions
                speed["pg_rollout_s"] += t1 - t0
                replay = merge_vine(replay, vb, c.vine_buffer)
                _vine_update(learner, opt, replay, c, iteration)
                train_return = vb.trunk_return
            else:
                seq_of_env = np.repeat(np.arange(drawn.size), c.n_rollouts)
                batch = fit.select(drawn[seq_of_env])
                rec = run_rollout(policy, sim_cfg, batch, int(rng.integers(2**31)), "sample", rng, keep=True)
                t1 = time.perf_counter()
                speed["pg_env_decisions"] += rec.n_env_decisions
                speed["pg_rollout_s"] += t1 - t0
                # returns and baseline
                adv = torch.from_numpy(_advantages(rec, seq_of_env, c.discount).astype(np.float32))
                # update
                data = {k: v.to(device) for k, v in _stack(rec).items()}
                _pg_update(learner, opt, data, adv.to(device), c, iteration, gen)
                train_return = float(rec.returns.mean())
            if learner is not net:
                net.load_state_dict(learner.state_dict())
            speed["pg_update_s"] += time.perf_counter() - t1
            ret = validate("pg", iteration, t0, train_return)
            iterations_run = iteration
            better, within = judged("pg", iteration, ret, best_return, best_within)
            if better:
                best_within = within
                best_return, best_state, best_iter, since_best = (
                    ret,
                    copy.deepcopy(net.state_dict()),
                    iteration,
                    0,
                )
            else:
                since_best += 1
                if since_best >= c.patience:
                    say(f"pg: no validation gain in {c.patience} iterations: stopping at {iteration}")
                    stopped_by = "patience"
                    break
        net.load_state_dict(best_state)
    policy.trained_iteration, policy.iterations_run, policy.stopped_by = best_iter, iterations_run, stopped_by
    policy.start_stage, policy.kept_within_budget = start_stage, best_within
    speed["train_s"] = time.perf_counter() - t_start
    speed["kept_within_budget"] = best_within
    speed["best_iteration"] = best_iter
    speed["start_stage"] = start_stage
    return policy, pl.DataFrame(rows, schema=STAGE_TABLE)


def larger_validation(
    sim_cfg: SimConfig, val: JobBatch, config: PlacerConfig, say: Callable[[str], None]
) -> tuple[SimConfig, JobBatch] | None:
    """(the larger cluster's config, the validation sequences superposed for it) of
    `PlacerConfig.generalise_factor`, or None where it is off, or where validation has fewer sequences than one
    larger sequence needs (said)."""
    k = config.generalise_factor
    if k is None or k <= 1:
        return None
    big = k * sim_cfg.n_machines
    if val.batch_size < k:
        say(
            f"validation at M = {big}: {val.batch_size} validation sequences, {k} needed for one: not checked"
        )
        return None
    return replace(sim_cfg, n_machines=big), superpose(val, k)


def keeps(
    scores_better: bool,
    kept_within: bool,
    is_within: Callable[[], bool] | None,
    generalises: Callable[[], bool] | None,
) -> tuple[bool, bool]:
    """(keep the iteration, it is within the overshoot budget): the overshoot budget's choice (`budget_keeps`;
    `is_within` None: no budget, the score alone), then the larger cluster's check (`generalises`, asked only of
    an iteration that would be kept; None: off): one that loses there is not kept."""
    keep, within = (
        (scores_better, True) if is_within is None else budget_keeps(scores_better, kept_within, is_within)
    )
    if keep and generalises is not None:
        keep = generalises()
    return keep, within


def budget_keeps(scores_better: bool, kept_within: bool, is_within: Callable[[], bool]) -> tuple[bool, bool]:
    """(keep the iteration, it is within the overshoot budget) under `PlacerConfig.overshoot_budget_pct`, where
    `scores_better` says its validation score beats the kept one's, `kept_within` whether the kept one is within
    the budget, and `is_within()` measures this one (called only where the answer matters): within the budget
    beats beyond it, and on the same side of it the better score wins."""
    if kept_within:  # only a better score within the budget replaces a kept iteration within it
        if not scores_better:
            return False, False
        within = is_within()
        return within, within
    within = is_within()  # nothing kept within yet: one within wins, else the better score among those beyond
    return within or scores_better, within


def check_advisor_training(advisor: str, config: PlacerConfig, where: str) -> None:
    """ValueError (prefixed by `where`) unless `config` trains by PGPE without a BC stage: an advisor's bonus is a
    head parameter, and the other algorithms and BC read recorded decisions that carry no advice."""
    if config.algorithm != "pgpe" or config.bc_epochs > 0:
        raise ValueError(
            f"{where}advisor {advisor!r} is trained by PGPE without a BC stage only (its bonus is a head "
            f"parameter); got algorithm {config.algorithm!r}, bc_epochs {config.bc_epochs}"
        )


def kept_return(table: pl.DataFrame, best_iteration: int, start_stage: str) -> float:
    """The validation return of the iteration training kept: PG iteration `best_iteration`, or for 0 the last
    row of the start PG began from, `start_stage` ("base", "bc" or "probe": `speed["start_stage"]`,
    `ForecastResidualPolicy.start_stage`)."""
    if best_iteration > 0:
        row = table.filter((pl.col("stage") == "pg") & (pl.col("iteration") == best_iteration))
    else:
        row = table.filter(pl.col("stage") == start_stage).tail(1)
        if row.height == 0:
            raise ValueError(f"kept_return: the stage table has no {start_stage!r} row")
    return float(row["validation_return"][0])


def choose_variant(kept: dict[str, tuple[bool, float]]) -> str:
    """The variant to publish among trained ones, {label: (kept iteration within the overshoot budget, its kept
    validation return)}: as the keep rule of one run (`budget_keeps`), one within the budget beats any beyond it,
    and on the same side the better return wins; ties go to the first listed (the simpler one, listed first)."""
    if not kept:
        raise ValueError("choose_variant: no variants")
    best = next(iter(kept))
    for label, (within, ret) in kept.items():
        if (within, ret) > kept[best]:
            best = label
    return best


def gain_bound(diff: np.ndarray, z: float) -> float:
    """mean - z x standard error of the per-sequence differences `diff` (the error 0 with one sequence)."""
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else 0.0
    return float(diff.mean()) - z * se


def bare_step_rate(cfg: SimConfig, jobs: JobBatch, seed: int = 0, in_place: bool = False) -> float:
    """Env-decisions per second of the simulator alone (first valid action, no policy work): the yardstick.
    `in_place`: the compiled step writing the state in place (`core.step`), as the training rollout steps."""
    state = core.reset(cfg, jobs, seed)
    t0, n = time.perf_counter(), 0
    while not state.is_done.all():
        mask = action_mask(cfg, state)
        n += int((~state.is_done).sum())
        state, *_ = core.step(cfg, state, np.argmax(mask, axis=1), mask=mask, in_place=in_place)
    return n / max(time.perf_counter() - t0, 1e-9)


def paired_interval(diff: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high) of a paired difference with its 95 % Student t interval."""
    from scipy import stats

    diff = np.asarray(diff, dtype=np.float64)
    mean = float(diff.mean())
    if diff.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, diff.size - 1)) * float(diff.std(ddof=1)) / math.sqrt(diff.size)
    return mean, mean - half, mean + half


# --- the training runs of the pipeline (`rl__forecast_residual`) --------------------------------------------


def _check_fitted_rule(field: str, name: str, alternative: str = "") -> None:
    """ValueError naming `PlacerTrainConfig.<field>` unless `name` is a registered fitted rule that sees no future."""
    if name not in POLICIES or not is_fitted(name) or is_oracle(name):
        fitted = sorted(p for p in POLICIES if is_fitted(p) and not is_oracle(p))
        raise ValueError(
            f"PlacerTrainConfig.{field} must be a fitted rule that sees no future ({fitted}){alternative}; "
            f"got {name!r}"
        )


INPUTS = ("rule", "table", "table_no_recall", "learned")
"""`PlacerTrainConfig.inputs`: where the residual's per-job forecasts come from."""


@dataclass(frozen=True)
class PlacerTrainConfig:
    """The forecast residual scheduler's training runs of one (load, training seed), one per source: the
    forecaster and the base rule are fitted on the source's training sequences as `eval__baselines` fits them
    (validation carved from the training split), then `train_forecast_placer` refines the residual."""

    base: str = "forecast_peak"
    """Fitted base rule (a registered rule with `.fit`: forecast_peak, the best forecast-driven rule measured
    (benchmarks/bench_placement.py); forecast_recall_hybrid, hybrid_observed)."""
    advisor: str | None = None
    """A second fitted rule (e.g. forecast_peak under a hybrid base) whose action gets its own learned logit bonus,
    0 at the start (`ForecastResidualPolicy`): training may learn to follow it where it does better than the base.
    Fitted on the same split as the base; PGPE without a BC stage only. None: no advisor."""
    advisor_choice: bool = False
    """With an `advisor`: train the residual without it and with it, and publish the one with the better validation
    return of its kept iteration (`kept_return`; the same validation sequences). Measured (benchmarks/RESULTS.md, "Both variants, the
    better on validation"): on the 84 Bitbrains VMs with the traces' requests the advisor helped some seeds and hurt
    others, and this choice picked the variant that did better on test at 8 of 9 runs. It doubles the training time,
    unless `variant_workers` trains the two at once."""
    variant_workers: int = 1
    """Processes that train the variants of a run at once (`models.placer_variants.train_variants`; with
    `advisor_choice`, 2 trains both side by side, one per core of a 2-core machine: the run's training takes the
    longer variant's time instead of the sum). Same results for any value. At most the cores the run is granted
    (`models.placer_variants.granted_cores`: `tvw-run --jobs N` grants each run its cores // N, so `--jobs 1` on 2
    cores trains both at once, `--jobs 2` each run's variants in turn beside another run), and none in a daemonic
    process: there the variants train in turn and the log says why. Keep 1 on a Dask cluster, whose workers run
    several partitions at once on cores this cannot see."""
    inputs: str = "rule"
    """Per-job forecaster of the residual's inputs (`INPUTS`): "rule", the base rule's own remaining-peak quantiles
    (`sim.risk.peak_rule_inputs`: a base on the table, `sim.risk.PEAK_RULES`; flat forecasts, so the features
    need no horizon axis); "table", `forecast_peak`'s remaining-peak quantiles for any base (fitted on the same
    fit part: a hybrid base gets the table's inputs and their speed); "table_no_recall", the same table without
    the recall of earlier runs over it where `forecast_peak` recalls them (DeepPlace: flat forecasts, so the
    compiled decision applies); or "learned", the learned usage forecaster
    of `forecaster_preset` (any base; its features cost a forecast over the horizon per decision: benchmarks/RESULTS.md,
    "Training rollout speed")."""
    forecaster_preset: str = "sample"
    """Preset of the learned usage forecaster (`models.usage_forecast.FORECAST_PRESETS`) where `inputs` is
    "learned" (and for a base rule that reads it)."""
    tuning_preset: str = "full"
    """Grid of knobs the base rule tries on validation (`sim.tuning.TUNING_PRESETS`); set it as eval__baselines'
    is set, so the residual's base is the rule its row is compared with."""
    overshoot_budget_pct: float | None = TuningConfig.overshoot_budget_pct
    """Validation overshoot above Tetris's the base rule's chosen setting may show (`TuningConfig`); set it as
    eval__baselines' is set."""
    cross_fit: bool = False
    """Choose the base rule on both folds of the training split (`TuningConfig.cross_fit`); set it as
    eval__baselines' is set."""
    cross_fit_sequences: int | None = None
    """With `cross_fit`: at most this many fit-part sequences validate the second fold
    (`TuningConfig.cross_fit_sequences`); set it as eval__baselines' is set."""
    choice_z: float = TuningConfig.choice_z
    """How cautiously validation chooses the base rule's setting (`TuningConfig.choice_z`); set it as
    eval__baselines' is set."""
    placer: PlacerConfig = PlacerConfig()
    """Features, network and training budget (its seed is the partition's training seed)."""
    n_machines: int = 10
    """M of training (TVW-RL: 10); the evaluation must run the same M."""
    sources: tuple[str, ...] = ()
    """Sources to train on (empty: every source with sequences on a cluster of several machines)."""

    def __post_init__(self) -> None:
        _check_fitted_rule("base", self.base)
        from models.usage_forecast import FORECAST_PRESETS
        from sim.risk import PEAK_RULES
        from sim.tuning import TUNING_PRESETS

        if self.inputs not in INPUTS:
            raise ValueError(f"PlacerTrainConfig.inputs must be one of {INPUTS}, got {self.inputs!r}")
        if not (isinstance(self.variant_workers, int) and self.variant_workers >= 1):
            raise ValueError(
                f"PlacerTrainConfig.variant_workers must be an integer >= 1, got {self.variant_workers!r}"
            )
        if self.advisor_choice and self.advisor is None:
            raise ValueError(
                "PlacerTrainConfig.advisor_choice chooses between no advisor and `advisor`: set advisor"
            )
        if self.advisor is not None:
            _check_fitted_rule("advisor", self.advisor, " or null")
            if self.advisor == self.base:
                raise ValueError(f"PlacerTrainConfig.advisor {self.advisor!r} is the base rule itself")
            check_advisor_training(self.advisor, self.placer, "PlacerTrainConfig.")
        TuningConfig(choice_z=self.choice_z)  # a bad choice_z fails here, by TuningConfig's own check
        if self.inputs == "rule" and self.base not in PEAK_RULES:
            raise ValueError(
                f"PlacerTrainConfig.inputs 'rule' reads the base rule's remaining-peak table: base must be one of "
                f"{sorted(PEAK_RULES)}, got {self.base!r} (set inputs: learned for another base)"
            )

        if self.forecaster_preset not in FORECAST_PRESETS:
            raise ValueError(
                f"PlacerTrainConfig.forecaster_preset must be one of {sorted(FORECAST_PRESETS)}; "
                f"got {self.forecaster_preset!r}"
            )
        if self.tuning_preset not in TUNING_PRESETS:
            raise ValueError(
                f"PlacerTrainConfig.tuning_preset must be one of {sorted(TUNING_PRESETS)}; got {self.tuning_preset!r}"
            )

    def train_sources(self, have: list[str]) -> list[str]:
        return training_sources(have, self.sources, SINGLE_MACHINE_SOURCES)


PLACER_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,  # row of the run: 0 = the base rule, then every BC epoch and PG iteration in order
    "stage_iteration": pl.Int64,  # STAGE_TABLE's iteration (BC epoch or PG iteration)
    **{k: v for k, v in STAGE_TABLE.items() if k != "iteration"},
}
"""`rl__forecast_residual`: the stage table of every training run of a (load, seed) partition (train_return is
null where there is none: the base and BC rows)."""


def placer_sim_config(settings: PlacerTrainConfig, sequences: pl.DataFrame) -> SimConfig:
    """The simulator of training: the evaluation's (`sim.evaluate.eval_sim_config` of `models.learned.ResultsConfig`
    at this M), labels covering every job of `sequences`, oversized jobs clipped."""
    from models.learned import ResultsConfig
    from sim.evaluate import eval_sim_config

    return eval_sim_config(
        "rl__forecast_residual", ResultsConfig(policies=(), n_machines=settings.n_machines), sequences
    )


def fit_base_rule(
    sim_cfg: SimConfig,
    train: JobBatch,
    base: str,
    forecaster_preset: str,
    tuning: TuningConfig,
    where: str = "",
    labeller: Labeller | None = None,
    memo: ChoiceMemo | None = None,
    inputs: str = "learned",
    levels: tuple[float, ...] = PlacerConfig.levels,
) -> tuple[object, UsageForecaster, FitContext]:
    """The fitted rule `base` and the per-job forecaster of the residual's inputs, both fitted on the training
    sequences `train` as eval__baselines fits its rules (validation carved from them, `tuning`'s grid); and the
    FitContext (its split and what validation chose). The forecaster (`PlacerTrainConfig.inputs`): "learned", the
    learned one with recall where the rule's validation chose it and without the periodic overlay (which has no
    saved form); "rule", the base rule's own remaining-peak table at its levels and `levels`
    (`sim.risk.peak_rule_inputs`); "table", `forecast_peak`'s, for any base ("table_no_recall": without recall
    over it). With `labeller`, the rule is fitted and validated on the labels it serves
    (`FitContext.labeller`). ValueError naming `where` when the rule cannot be fitted there. `memo`: choices
    remembered on disk (`sim.tuning.ChoiceMemo`; the rule is fitted before the forecaster, so a rule that needs
    none shares eval__baselines' remembered choice)."""
    from models.usage_forecast import forecaster_factory
    from sim.forecast import fit_recall
    from sim.risk import peak_rule_inputs

    factory = forecaster_factory(forecaster_preset, periodic=False)
    ctx = FitContext(sim_cfg, train, tuning, factory, where=where, labeller=labeller, memo=memo)
    rule = POLICIES[base].fit(ctx)
    if rule is None:
        raise ValueError(f"forecast placer {where}: the base rule {base} cannot be fitted there")
    if inputs in ("rule", "table", "table_no_recall"):
        fc = peak_rule_inputs(ctx, base if inputs == "rule" else "forecast_peak", tuple(levels))
        if inputs == "table_no_recall" and isinstance(fc, RecallOverlay):
            fc = fc.inner
        return rule, fc, ctx
    forecaster = ctx.forecaster()
    if ctx.choices.get(base, {}).get("recall_used"):
        forecaster, _ = fit_recall(forecaster, ctx.split()[0])
    return rule, forecaster, ctx


def train_and_publish(
    settings: PlacerTrainConfig,
    sim_cfg: SimConfig,
    train: JobBatch,
    policy_file: Path,
    run: tuple[str, int, int],
    revision: str,
    log: Callable[[str], None] | None = None,
    labeller: Labeller | None = None,
    memo: ChoiceMemo | None = None,
) -> pl.DataFrame:
    """Fit the forecaster and the base rule on the training sequences `train` of run = (source, load %, training
    seed) (`fit_base_rule`, with the settings' presets; validation seeded by the training seed), train the
    residual scheduler on them (`train_forecast_placer`) and publish it at `policy_file` with its sidecar;
    returns the stage table. `labeller`: the EC labels the evaluation serves the policy, served to fitting,
    validation and training as well (None: the sequences' own). `memo`: `fit_base_rule`'s."""
    source, load, seed = run
    where = f"{source} {load} % seed {seed}"
    pcfg = replace(settings.placer, seed=seed)
    t0 = time.perf_counter()
    args = (settings.tuning_preset, pcfg.validation_share, seed, settings.overshoot_budget_pct)
    tuning = tuning_preset(
        *args,
        cross_fit=settings.cross_fit,
        cross_fit_sequences=settings.cross_fit_sequences,
        choice_z=settings.choice_z,
    )
    base, forecaster, ctx = fit_base_rule(
        sim_cfg,
        train,
        settings.base,
        settings.forecaster_preset,
        tuning,
        where,
        labeller,
        memo,
        inputs=settings.inputs,
        levels=pcfg.levels,
    )
    advisor = None
    if settings.advisor is not None:
        advisor = POLICIES[settings.advisor].fit(ctx)
        if advisor is None:
            raise ValueError(
                f"forecast placer {where}: the advisor {settings.advisor} cannot be fitted there"
            )
    if pcfg.action_set == "rule":  # bound to the level forecast_peak packs at, for every variant alike
        fitted = {settings.advisor: advisor, settings.base: base}  # charge_n_ref's look-up order
        level = peak_rule_level(ctx, fitted)
        wanted = pcfg.rule_charge
        n_ref = charge_n_ref(ctx, fitted) if wanted else None
        pcfg = with_rule_level(pcfg, level, forecaster_levels(forecaster), n_ref)
        if wanted and not pcfg.rule_charge and log is not None:  # with_rule_level turned it off
            log(
                f"{where}: rule_charge off: forecast_peak has no level to raise here (validation kept the hybrid)"
            )
    if log is not None:
        fitted = settings.base + ("" if advisor is None else f" and advisor {settings.advisor}")
        log(f"{where}: forecaster and base rule {fitted} fitted in {time.perf_counter() - t0:.1f} s")
    from models.placer_variants import Variant, train_variants  # it imports this module

    variants = [Variant("advised" if advisor is not None else "trained", pcfg, advisor)]
    if advisor is not None and settings.advisor_choice:  # the simpler one first: ties go to it
        variants.insert(0, Variant("unadvised", pcfg))
    runs = train_variants(
        sim_cfg, train, base, forecaster, variants, settings.variant_workers, log, labeller=labeller
    )
    policy, table, _ = runs[variants[-1].label]
    if len(runs) > 1:
        plain, plain_table, _ = runs["unadvised"]
        advised_return = kept_return(table, policy.trained_iteration, policy.start_stage)
        plain_return = kept_return(plain_table, plain.trained_iteration, plain.start_stage)
        chosen = choose_variant(  # ties: the simpler policy, listed first
            {
                "unadvised": (plain.kept_within_budget, plain_return),
                "advised": (policy.kept_within_budget, advised_return),
            }
        )
        if log is not None:
            log(
                f"{where}: kept validation return {plain_return:.4g} without the advisor, {advised_return:.4g} with "
                f"{settings.advisor} (within the overshoot budget: {plain.kept_within_budget} / "
                f"{policy.kept_within_budget}): publishing the {chosen} one"
            )
        if chosen == "unadvised":
            policy, table = plain, plain_table
    if advisor is not None:  # the replay guard's candidates, whichever variant is published
        policy.guard_rules = (advisor,)
    policy.save(policy_file, source, load, revision)
    return table.rename({"iteration": "stage_iteration"}).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("iteration"), pl.col("train_return").fill_nan(None)
    )
