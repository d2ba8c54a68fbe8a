"""The forecast residual scheduler (`models.forecast_placer`): equivariance, the untrained policy is its base rule,
valid actions only, behaviour cloning, no input reads the true future, the shared trained-policy format (sidecar,
revision, only a finished policy published), bad input, a tiny training run."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from models import checkpoint as ck
from models import forecast_placer as fp
from models import placer_kernel, placer_variants
from models.forecast_placer import (
    ForecastCache,
    ForecastResidualPolicy,
    PlacerConfig,
    ResidualPlacerNet,
    behaviour_clone,
    placement_features,
    run_rollout,
    train_forecast_placer,
)
from models.forecaster import torch_threads
from models.placer_variants import Variant, train_variants
from models.usage_forecast import ForecastConfig, fit_usage_forecaster
from sim import compiled_decision, compiled_step, core
from sim.config import SimConfig
from sim.forecast import ExactForecaster
from sim.jobs import JobBatch
from sim.peak_forecast import RemainingPeakQuantiles, fit_peak_quantiles
from sim.policies import FirstFit, Tetris, decide, make_policy
from sim.risk import PersistenceForecaster, RequestForecaster, RiskAwarePacking, RiskConfig
from sim.tuning import sequence_outcomes, sequence_returns, split_validation

CFG = SimConfig(n_machines=4, max_steps=400)
TINY_FORECAST = ForecastConfig(
    horizon=6, n_recent=8, n_short=3, period_steps=4, hidden=(8,), epochs=2, max_examples=1500
)


def _square_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Sequences of square-wave jobs (high 3-4 units a quarter of each period, low 1): peaks at random phases."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for j in range(n_jobs):
            t += int(rng.integers(0, 3))
            dur, period, phase = int(rng.integers(8, 30)), int(rng.integers(4, 9)), int(rng.integers(0, 8))
            hi = int(rng.integers(3, 5))
            usage = [[hi if (a + phase) % period < max(period // 4, 1) else 1] * 2 for a in range(dur)]
            seq.append({"arrival_step": t, "usage": usage, "ec_label": j % 3, "workload_id": f"w{j % 7}"})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


@pytest.fixture(scope="module")
def learned_forecaster():
    return fit_usage_forecaster(CFG, _square_jobs(6, 30, seed=21), TINY_FORECAST)


def _hybrid(**risk) -> RiskAwarePacking:
    return RiskAwarePacking(
        PersistenceForecaster(horizon=30), make_policy("tetris"), RiskConfig(**risk), name="hybrid_observed"
    )


def _actions(policy, jobs: JobBatch, cfg: SimConfig = CFG, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    out = []
    while not state.is_done.all():
        state, act = decide(policy, cfg, state, rng)
        out.append(act)
        state, *_ = core.step(cfg, state, act)
    return out


def _randomise_residual(net: ResidualPlacerNet, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for last in (net.machine_head, net.hold_head[-1]):
            last.weight.copy_(torch.randn(last.weight.shape, generator=gen))
            last.bias.copy_(torch.randn(last.bias.shape, generator=gen))


def test_permuting_machines_permutes_the_scores() -> None:
    rng = np.random.default_rng(0)
    n_b, n_m, n_f, n_g = 3, 6, 11, len(fp.GLOBAL_FEATURES)
    net = ResidualPlacerNet(n_f, n_g, 16, 3.0, seed=1)
    _randomise_residual(net)
    x = torch.from_numpy(rng.random((n_b, n_m, n_f)).astype(np.float32))
    g = torch.from_numpy(rng.random((n_b, n_g)).astype(np.float32))
    base = torch.tensor([0, 4, n_m])
    mask = torch.from_numpy(rng.random((n_b, n_m + 1)) < 0.8)
    mask[:, 0] = True
    mask[:, 4] = True
    mask[:, n_m] = True
    perm = rng.permutation(n_m)
    inverse = np.argsort(perm)
    base_p = torch.tensor([inverse[b] if b < n_m else n_m for b in base.tolist()])
    full = np.r_[perm, n_m]
    with torch.no_grad():
        a = net(x, g, base, mask)
        b = net(x[:, perm], g, base_p, mask[:, full])
    assert torch.allclose(b, a[:, full], atol=1e-5)
    assert not torch.allclose(a[:, :n_m], a[:, :1].expand(-1, n_m))  # the scores do differ by machine


@pytest.mark.parametrize(
    "base",
    [
        pytest.param(lambda: make_policy("tetris"), id="tetris"),
        pytest.param(lambda: make_policy("deeprm_sjf"), id="sjf"),
        pytest.param(lambda: _hybrid(min_observed=4), id="hybrid"),
        pytest.param(lambda: _hybrid(mode="pack", use_durations=False), id="hybrid_pack_nodur"),
        pytest.param(
            lambda: RiskAwarePacking(
                PersistenceForecaster(horizon=30, statistic="now"),
                make_policy("best_fit"),
                RiskConfig(),
                name="n",
            ),
            id="hybrid_now",
        ),
        pytest.param(
            lambda: RiskAwarePacking(
                RequestForecaster(horizon=6), make_policy("tetris"), RiskConfig(), name="f"
            ),
            id="forecast_rule",
        ),
    ],
)
def test_the_untrained_policy_is_its_base_rule_on_a_rollout(base) -> None:
    jobs = _square_jobs(3, 40, seed=1)
    rule = base()
    policy = ForecastResidualPolicy(base=rule)
    expected, got = _actions(rule, jobs), _actions(policy, jobs)
    assert len(expected) == len(got)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_only_valid_actions_sampled_and_greedy(learned_forecaster) -> None:
    jobs = _square_jobs(2, 40, seed=2)
    policy = ForecastResidualPolicy(
        base=_hybrid(), forecaster=learned_forecaster, config=PlacerConfig(base_bonus=0.5)
    )
    _randomise_residual(policy.ready(CFG))
    rec = run_rollout(policy, CFG, jobs, 0, "sample", np.random.default_rng(0), keep=True)
    mask, action = np.concatenate(rec.mask), np.concatenate(rec.action)
    assert mask[np.arange(action.size), action].all()
    assert (action != np.concatenate(rec.base)).any()  # it explores beyond its base rule
    _actions(policy, jobs)  # the simulator raises on a masked action


def test_the_network_gives_the_same_bits_on_one_and_two_torch_threads() -> None:
    """`rollout_torch_threads` lets a large batch's rollout run the network on numba's thread count: the logits
    (and so every sampled action) must not depend on it."""
    rng = np.random.default_rng(1)
    net = ResidualPlacerNet(37, len(fp.GLOBAL_FEATURES), 64, 1.0, seed=2)
    _randomise_residual(net)
    x = torch.from_numpy(rng.random((264, 10, 37)).astype(np.float32))
    g = torch.from_numpy(rng.random((264, len(fp.GLOBAL_FEATURES))).astype(np.float32))
    base = torch.from_numpy(rng.integers(0, 11, size=264))
    mask = torch.from_numpy(rng.random((264, 11)) < 0.8)
    out = []
    for n in (1, 2):
        with torch_threads(n), torch.no_grad():
            out.append(net(x, g, base, mask))
    assert torch.equal(out[0], out[1])
    assert fp.rollout_torch_threads(8) == 1  # a small batch keeps one thread


def test_the_safe_action_set_keeps_only_the_base_and_forecast_safe_machines(learned_forecaster) -> None:
    jobs = _square_jobs(2, 40, seed=2)
    config = PlacerConfig(base_bonus=0.5, action_set="safe")
    policy = ForecastResidualPolicy(base=_hybrid(), forecaster=learned_forecaster, config=config)
    _randomise_residual(policy.ready(CFG))
    rec = run_rollout(policy, CFG, jobs, 0, "sample", np.random.default_rng(0), keep=True)
    x, mask = np.concatenate(rec.x), np.concatenate(rec.mask)
    base, action = np.concatenate(rec.base), np.concatenate(rec.action)
    safe = x[:, :, fp.feature_names(config, 2).index("is_safe_with_q99")] > 0.5
    rows = np.arange(base.size)
    assert mask[rows, base].all() and mask[rows, action].all()
    others = mask.copy()
    others[rows, base] = False
    assert not (others[:, : CFG.n_machines] & ~safe).any()  # no unsafe machine but the base's
    assert not others[:, CFG.n_machines].any()  # hold only where the base holds
    assert (action != base).any() and mask.sum() < np.concatenate(rec.x).shape[0] * (CFG.n_machines + 1)
    with pytest.raises(ValueError, match="action_set"):
        PlacerConfig(action_set="all")


def test_the_rule_action_set_packs_no_further_than_the_rules_level(square_jobs) -> None:
    """Action set "rule": bound to the level a fitted peak rule packs at (added to the inputs' levels), its mask
    holds the base's and the advisor's actions and the machines safe at that level, no other; a rule on observed
    peaks has no level (the top one is used); an unbound level is refused, and so is one outside `levels`."""
    cfg = SimConfig(n_machines=4, max_steps=400, hold_rule="no_fit")
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    peak = RiskAwarePacking(
        table.forecaster(0.75, horizon=12), make_policy("tetris"), RiskConfig(0.75), name="p"
    )
    assert fp.rule_level(peak) == 0.75
    assert fp.rule_level(_hybrid()) is None and fp.rule_level(make_policy("tetris")) is None
    config = fp.with_rule_level(PlacerConfig(base_bonus=0.5, action_set="rule"), fp.rule_level(peak))
    assert config.safe_level == 0.75 and config.levels == (0.5, 0.75, 0.9, 0.99)
    assert fp.with_rule_level(PlacerConfig(action_set="rule"), None).safe_level == 0.99
    learned_levels = (0.5, 0.9, 0.95, 0.99)  # a forecaster without 0.75: the next more cautious level it has
    assert fp.with_rule_level(PlacerConfig(action_set="rule"), 0.75, learned_levels).safe_level == 0.9
    unbound = PlacerConfig(action_set="valid")
    assert fp.with_rule_level(unbound, 0.75) == unbound
    with pytest.raises(ValueError, match="safe_level"):
        PlacerConfig(safe_level=0.8)
    policy = ForecastResidualPolicy(
        base=_hybrid(), forecaster=RemainingPeakQuantiles(table, horizon=12), config=config, advisor=peak
    )
    _randomise_residual(policy.ready(cfg))
    names = fp.feature_names(config, 2)
    beyond_q99: list[int] = []

    def check(state, inputs, active) -> None:
        x, base, advice = inputs["x"], inputs["base"], inputs["advice"]
        keep = np.zeros_like(inputs["mask"])
        keep[:, : cfg.n_machines] = x[:, :, names.index("is_safe_with_q75")] > 0.5
        valid, rows = core.action_mask(cfg, state), np.arange(base.size)
        for chosen in (base, advice):  # a forbidden hold ("no_fit") stands for the lowest valid action
            keep[rows, np.where(valid[rows, chosen], chosen, np.argmax(valid, axis=1))] = True
        assert np.array_equal(inputs["mask"], valid & keep)
        assert inputs["mask"][~state.is_done].any(axis=1).all()
        unsafe99 = x[:, :, names.index("is_safe_with_q99")] < 0.5
        beyond_q99.append(int((inputs["mask"][:, : cfg.n_machines] & unsafe99).sum()))

    jobs = square_jobs(4, 30, seed=4)
    run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(0), on_decision=check)
    assert len(beyond_q99) > 20 and sum(beyond_q99) > 0  # it packs beyond the q99 set, as the rule does


def _run_level_masks(cfg, config: PlacerConfig, table, jobs, levels_of) -> set[float]:
    """Runs a hybrid-based policy with action set `config` on `jobs` and checks at every decision that its mask
    is the valid actions among the base's and each machine safe ("is_safe_with") at its level `levels_of(state)`
    ((B,) per env or (B, M) per machine); returns the levels seen in live envs."""
    policy = ForecastResidualPolicy(
        base=_hybrid(), forecaster=RemainingPeakQuantiles(table, 12), config=config
    )
    _randomise_residual(policy.ready(cfg))
    names = fp.feature_names(config, 2)
    seen: set[float] = set()

    def check(state, inputs, active) -> None:
        x, base = inputs["x"], inputs["base"]
        levels = np.broadcast_to(np.asarray(levels_of(state)).reshape(state.batch_size, -1), x.shape[:2])
        seen.update(levels[~state.is_done].ravel().tolist())
        keep = np.zeros_like(inputs["mask"])
        for b in range(state.batch_size):
            for m in range(cfg.n_machines):
                keep[b, m] = x[b, m, names.index(f"is_safe_with_q{round(levels[b, m] * 100)}")] > 0.5
        valid, rows = core.action_mask(cfg, state), np.arange(base.size)
        keep[rows, np.where(valid[rows, base], base, np.argmax(valid, axis=1))] = True
        assert np.array_equal(inputs["mask"], valid & keep)

    run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(0), on_decision=check)
    return seen


def _train_one_iteration(cfg, table, config: PlacerConfig, jobs, advisor=None) -> ForecastResidualPolicy:
    """One PGPE iteration of a hybrid-based policy with action set `config` on `jobs`: the trained policy."""
    settings = replace(config, algorithm="pgpe", n_iterations=1, n_sequences=2, pgpe_pairs=1)
    trained, _ = train_forecast_placer(
        cfg, jobs, _hybrid(), RemainingPeakQuantiles(table, 12), settings, advisor=advisor
    )
    return trained


def test_the_rule_action_set_follows_each_episodes_rise_rate_with_rule_shift(square_jobs) -> None:
    """`PlacerConfig.rule_shift`: each env's mask holds the machines safe at its own adapted level (the levels the
    network reads), the base's and the advisor's actions; off, or unbound, as before or refused; training binds
    the fit part's rate and the checkpoint keeps it."""
    from sim.rise_shift import RiseRate, adapted_level, rate_ratio

    cfg = SimConfig(n_machines=4, max_steps=400, hold_rule="no_fit")
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    with pytest.raises(ValueError, match="rule_shift"):
        PlacerConfig(action_set="valid", rule_shift=True)
    bound = fp.with_rule_level(PlacerConfig(base_bonus=0.5, action_set="rule", rule_shift=True), 0.75)
    with pytest.raises(ValueError, match="rise_rate"):
        fp.rule_levels(bound, core.reset(cfg, square_jobs(2, 30, seed=4), 0))
    config = replace(bound, rise_rate=0.05, rise_prior_events=2.0)  # envs drift apart quickly
    assert (
        fp.rule_levels(replace(config, rule_shift=False), core.reset(cfg, square_jobs(2, 30, 4), 0)) is None
    )

    def levels_of(state) -> np.ndarray:
        ratio = rate_ratio(RiseRate(0.05, 0, 0, 2.0), state)
        return np.asarray(config.levels)[adapted_level(0.75, ratio, config.levels)]

    seen_levels = _run_level_masks(cfg, config, table, square_jobs(4, 30, seed=4), levels_of)
    assert len(seen_levels) > 1  # the envs' levels moved
    trained = _train_one_iteration(cfg, table, bound, square_jobs(8, 30, seed=5))
    assert trained.config.rule_shift and trained.config.rise_rate > 0


def _charge_guard(table):
    """A `forecast_peak_charge_guard`-kind rule on `table`: levels 0.75 / 0.9 / 0.99 over Tetris, fitted level 0.75,
    n_ref 1.5."""
    from sim.charge_level import ChargeAwarePeakPacking

    levels = (0.75, 0.9, 0.99)
    rules = tuple(
        RiskAwarePacking(
            table.forecaster(lv, horizon=12), make_policy("tetris"), RiskConfig(lv), name=f"p{lv}"
        )
        for lv in levels
    )
    return ChargeAwarePeakPacking(
        rules, levels, level=0.75, n_ref=1.5, raise_only=True, fallback=make_policy("tetris")
    )


def test_the_rule_action_set_raises_each_machines_level_with_its_jobs_under_rule_charge(square_jobs) -> None:
    """`PlacerConfig.rule_charge`: each machine's mask entry is its "is_safe_with" input at the first level at or
    above max(q, 1 - (1 - q) x n_ref / n) for its n running jobs plus the arriving one, with the base's and the
    advisor's actions kept; misuse is refused; training binds n_ref from a charge-aware advisor and the checkpoint's
    config keeps it."""

    cfg = SimConfig(n_machines=4, max_steps=400, hold_rule="no_fit")
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    with pytest.raises(ValueError, match="rule_charge"):
        PlacerConfig(action_set="valid", rule_charge=True)
    with pytest.raises(ValueError, match="choose one"):
        PlacerConfig(rule_charge=True, rule_shift=True)
    with pytest.raises(ValueError, match="charge_n_ref"):
        PlacerConfig(charge_n_ref=float("nan"))
    wanted = PlacerConfig(base_bonus=0.5, action_set="rule", rule_charge=True)
    assert not fp.with_rule_level(wanted, 0.75).rule_charge  # no n_ref: the bound level everywhere
    with pytest.raises(ValueError, match="bound safe_level needs charge_n_ref"):
        replace(wanted, safe_level=0.99)  # a level bound without n_ref: refused at construction
    config = fp.with_rule_level(wanted, 0.75, (0.5, 0.75, 0.9, 0.99), n_ref=1.5)
    assert config.rule_charge and config.charge_n_ref == 1.5 and config.levels == (0.5, 0.75, 0.9, 0.99)

    def levels_of(state) -> np.ndarray:
        n = np.zeros((state.batch_size, cfg.n_machines), dtype=int)
        for b in range(state.batch_size):
            np.add.at(n[b], state.job_machine[b][core.jobs_running(state)[b]], 1)
        target = np.maximum(0.75, 1 - 0.25 * 1.5 / (n + 1))
        return np.array([[min(lv for lv in config.levels if lv >= t - 1e-9) for t in row] for row in target])

    seen_levels = _run_level_masks(cfg, config, table, square_jobs(4, 30, seed=4), levels_of)
    assert {0.75, 0.9, 0.99} <= seen_levels  # 1, 2-3 and 4+ jobs charged
    guard = _charge_guard(table)
    assert fp.rule_level(guard) == 0.75
    trained = _train_one_iteration(cfg, table, wanted, square_jobs(8, 30, seed=5), advisor=guard)
    assert trained.config.rule_charge and trained.config.charge_n_ref == 1.5
    assert trained.config.safe_level == 0.75
    # both charge-aware: the bound paths read the advisor's n_ref first, as the unbound one does
    base_guard = replace(guard, n_ref=2.5)
    assert fp.first_n_ref((guard, base_guard)) == 1.5
    assert fp.charge_n_ref(None, {"advisor": guard, "base": base_guard}) == 1.5


def _noisy_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Jobs whose CPU is drawn afresh each step from 1..hi (hi 2-6 per job), requests 6: remaining-peak quantiles
    that differ between levels (the square waves' peaks are certain)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 2))
            hi = int(rng.integers(2, 7))
            usage = [[int(rng.integers(1, hi + 1)), 1] for _ in range(int(rng.integers(6, 30)))]
            seq.append({"arrival_step": t, "usage": usage, "ec_label": 0, "request": [6, 2]})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def test_a_cautious_placer_is_the_same_network_packing_only_where_a_higher_level_is_safe() -> None:
    """`models.placer_guard.shifted_placer`: the policy bound one (or n) input levels above (below) its
    `safe_level`, sharing its network and rules; the cautious one's mask never allows a machine the policy's does
    not, and forbids some the policy allows; none where no such level exists; the `_cautious` and `_shift` guards
    offer them as named candidates."""
    from models.placer_guard import guard, shifted_placer

    cfg = SimConfig(n_machines=4, max_steps=400, hold_rule="no_fit")
    table = fit_peak_quantiles(_noisy_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    wanted = PlacerConfig(base_bonus=0.5, action_set="rule", rule_charge=True)
    config = fp.with_rule_level(wanted, 0.75, (0.5, 0.75, 0.9, 0.99), n_ref=4.0)  # up to 4 jobs at 0.75
    forecaster, advisor = RemainingPeakQuantiles(table, 12), _charge_guard(table)
    policy = ForecastResidualPolicy(base=_hybrid(), forecaster=forecaster, config=config, advisor=advisor)
    _randomise_residual(policy.ready(cfg))
    cautious = shifted_placer(policy)
    assert (
        cautious.config == replace(config, safe_level=0.9, keep_advice=False) and cautious.net is policy.net
    )
    assert cautious._sums is not policy._sums and policy.config.safe_level == 0.75
    assert shifted_placer(policy, 2).config.safe_level == 0.99 and shifted_placer(policy, 3) is None
    assert (
        shifted_placer(policy, -1).config == replace(config, safe_level=0.5)
        and shifted_placer(policy, -2) is None
    )
    assert shifted_placer(policy, 0) is None and cautious.name == "forecast_residual_rl@0.9"
    with pytest.raises(ValueError, match="changes the network's inputs"):
        policy.variant(replace(config, levels=(0.5, 0.75, 0.99)), "fewer inputs")
    assert shifted_placer(ForecastResidualPolicy(config=PlacerConfig(action_set="valid"))) is None

    def masks_compared(policy: ForecastResidualPolicy) -> dict[str, int]:
        """Over a rollout of `policy`, the machines its cautious copy allows, those it forbids that the policy
        allows, and the advisor's actions among them (the policy's mask always keeps the advisor's action)."""
        cautious, counts = shifted_placer(policy), {"allowed": 0, "forbidden": 0, "advice_forbidden": 0}

        def check(state, inputs, active) -> None:
            narrow = cautious.decision_inputs(cfg, state, np.random.default_rng(1))["mask"]
            assert not (narrow & ~inputs["mask"]).any()  # never a machine the policy's own mask forbids
            counts["allowed"] += int(narrow[active].sum())
            counts["forbidden"] += int((inputs["mask"] & ~narrow)[active].sum())
            rows = np.flatnonzero(active)
            advice = inputs["advice"][rows]
            counts["advice_forbidden"] += int((inputs["mask"][rows, advice] & ~narrow[rows, advice]).sum())

        jobs = _noisy_jobs(4, 30, seed=4)
        run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(0), on_decision=check)
        return counts

    counts = masks_compared(policy)
    assert counts["allowed"] > 0 and counts["forbidden"] > 0
    # an advisor that packs on what it sees now (First-Fit) advises machines the cautious bound forbids
    eager = ForecastResidualPolicy(base=_hybrid(), forecaster=forecaster, config=config, advisor=FirstFit())
    _randomise_residual(eager.ready(cfg))
    assert masks_compared(eager)["advice_forbidden"] > 0
    guarded = guard(policy, variant="forecast_residual_rl_replay_cautious")
    assert guarded.names[-3:] == ("forecast_residual_rl@0.9", "first_fit", "best_fit")
    assert guarded.candidates[-3].config.safe_level == 0.9 and guarded.recent == 64
    top = shifted_placer(policy, 2)
    assert guard(top, variant="forecast_residual_rl_replay_cautious").names[-2:] == ("first_fit", "best_fit")
    both = guard(policy, variant="forecast_residual_rl_replay_shift")
    assert both.names[-4:-2] == ("forecast_residual_rl@0.9", "forecast_residual_rl@0.5")
    bold = guard(policy, variant="forecast_residual_rl_replay_bold")
    assert bold.names[-3] == "forecast_residual_rl@0.5" and bold.candidates[-3].config.keep_advice


def test_behaviour_cloning_reaches_the_teachers_action_on_a_toy_problem() -> None:
    jobs = _square_jobs(4, 30, seed=5)
    policy = ForecastResidualPolicy(base=make_policy("first_fit"), config=PlacerConfig(bc_learning_rate=1e-2))
    teacher_actions = np.concatenate(_actions(make_policy("best_fit"), jobs))
    accuracy = behaviour_clone(policy, CFG, jobs, "best_fit", 30, np.random.default_rng(0))
    base_agrees = np.mean(
        np.concatenate(_actions(make_policy("first_fit"), jobs)) == teacher_actions[: len(teacher_actions)]
    )
    assert accuracy >= 0.95 > base_agrees


def _perturb_future(state, seed: int):
    """The same state with every job's usage at ages not yet observed replaced by noise (the head's age 0, which
    is step t and the simulator's mask rule, kept)."""
    jobs = state.jobs
    rng = np.random.default_rng(seed)
    is_placed = state.job_machine >= 0
    n_obs = np.where(is_placed, state.t[:, None] - state.job_start + 1, 1)
    future = np.arange(jobs.max_duration)[None, None, :] >= n_obs[:, :, None]
    noise = rng.integers(0, 9, size=jobs.usage.shape).astype(jobs.usage.dtype)
    return replace(state, jobs=replace(jobs, usage=np.where(future[..., None], noise, jobs.usage)))


@pytest.mark.parametrize("which", ["persistence", "learned"])
def test_no_input_reads_the_true_future(which, learned_forecaster, perturb_committed) -> None:
    jobs = _square_jobs(2, 40, seed=3)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    for _ in range(45):
        state, act = decide(make_policy("tetris"), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    other = perturb_committed(_perturb_future(state, seed=4), seed=5)
    assert not np.array_equal(other.jobs.usage, state.jobs.usage)
    inner = learned_forecaster if which == "learned" else PersistenceForecaster(horizon=12)
    pcfg = PlacerConfig()
    outs = []
    for s in (state, other):
        policy = ForecastResidualPolicy(base=_hybrid(min_observed=2), forecaster=inner, config=pcfg)
        _randomise_residual(policy.ready(CFG))
        base = policy.base.act(CFG, s, np.random.default_rng(1))
        mask = core.action_mask(CFG, s)
        x, g = placement_features(CFG, s, ForecastCache(inner), pcfg, base, mask)
        outs.append((base, x, g, policy.act(CFG, s, np.random.default_rng(1))))
    for a, b in zip(*outs, strict=True):
        assert np.array_equal(a, b)


def test_at_rho_1_the_bounds_are_the_general_formulas_limit(learned_forecaster) -> None:
    # rho = 1 sums no squared deviations (sqrt(s_d^2) = s_d); a rho a hair below takes the general path
    jobs = _square_jobs(3, 30, seed=5)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    fast, general, independent = PlacerConfig(rho=1.0), PlacerConfig(rho=1.0 - 1e-12), PlacerConfig(rho=0.0)
    n_checked = n_differ = 0
    for _ in range(60):
        if core.jobs_running(state).any():
            base = make_policy("tetris").act(CFG, state, rng)
            mask = core.action_mask(CFG, state)
            x1, g1 = placement_features(CFG, state, learned_forecaster, fast, base, mask)
            x2, g2 = placement_features(CFG, state, learned_forecaster, general, base, mask)
            assert np.allclose(x1, x2, rtol=1e-5, atol=1e-6) and np.array_equal(g1, g2)
            x0, _ = placement_features(CFG, state, learned_forecaster, independent, base, mask)
            n_differ += int(not np.allclose(x0, x1, rtol=1e-5, atol=1e-6))  # the deviations are not all 0
            n_checked += 1
        state, act = decide(make_policy("tetris"), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    assert n_checked > 10 and n_differ > 0


def test_machine_sums_carried_between_decisions_equal_a_full_recount(learned_forecaster) -> None:
    from sim.policies import own_jobs, promote_queued_job
    from sim.running_sums import RunningSums

    jobs = _square_jobs(3, 40, seed=7)
    policy = ForecastResidualPolicy(base=_hybrid(min_observed=2), forecaster=learned_forecaster)
    pcfg, memo, rng = policy.config, RunningSums(), np.random.default_rng(0)
    state = own_jobs(core.reset(CFG, jobs, 0))  # the rollout's own batch, reordered in place as in training
    n_decisions = 0
    while not state.is_done.all() and n_decisions < 300:
        state = promote_queued_job(state, np.where(state.is_done, 0, policy.pick_job(CFG, state, rng)), True)
        base = policy.base.act(CFG, state, rng)
        mask = core.action_mask(CFG, state)
        x1, g1 = placement_features(CFG, state, policy.forecaster, pcfg, base, mask, memo)
        x2, g2 = placement_features(CFG, state, policy.forecaster, pcfg, base, mask)
        assert np.allclose(x1, x2, rtol=1e-6, atol=1e-6) and np.array_equal(g1, g2)
        state, *_ = core.step(CFG, state, base, mask=mask)
        n_decisions += 1
    assert memo.n_carried > 50  # most decisions reuse the earlier sums
    # and a whole rollout of a randomised residual decides the same with and without the carried sums
    returns = []
    for carry in (True, False):
        other = ForecastResidualPolicy(base=_hybrid(min_observed=2), forecaster=learned_forecaster)
        _randomise_residual(other.ready(CFG))
        other._sums = RunningSums() if carry else None
        rec = fp.run_rollout(other, CFG, jobs, 0, "greedy", np.random.default_rng(1))
        returns.append(rec.returns)
    assert np.array_equal(*returns)


def test_the_true_future_is_refused_as_an_input() -> None:
    with pytest.raises(ValueError, match="true future"):
        ForecastResidualPolicy(forecaster=ExactForecaster(horizon=6))


def test_forecast_cache_returns_the_forecasters_own_numbers(learned_forecaster) -> None:
    jobs = _square_jobs(2, 40, seed=6)
    state = core.reset(CFG, jobs, 0)
    rng = np.random.default_rng(0)
    cache = ForecastCache(learned_forecaster)
    for _ in range(30):
        env, job = np.nonzero(core.jobs_running(state))
        if env.size == 0:  # the learned forecaster itself does not take an empty query
            assert cache.forecast(CFG, state, env, job).shape[0] == 0
        else:
            own = learned_forecaster.forecast(CFG, state, env, job)
            first = cache.forecast(CFG, state, env, job)
            # the network's own rows, computed in another batch: on some CPUs (AMD EPYC without AVX-512, seen
            # 2026-12-01) a GEMM rounds a row differently by batch size, in the last float32 bits
            np.testing.assert_allclose(first, own, rtol=1e-6, atol=1e-6)
            assert np.array_equal(
                cache.forecast(CFG, state, env[::-1], job[::-1]), first[::-1]
            )  # from the cache
        state, act = decide(make_policy("tetris"), CFG, state, rng)
        state, *_ = core.step(CFG, state, act)
    assert cache.n_hits > 0


def test_the_cache_key_is_the_whole_projection_and_follows_the_job_not_its_slot() -> None:
    jobs = _square_jobs(3, 20, seed=9)
    cache = ForecastCache(PersistenceForecaster(horizon=6))
    state = core.reset(CFG, jobs, 0)
    env, job = np.nonzero(np.ones((jobs.batch_size, jobs.max_jobs), dtype=bool))
    got = cache._fingerprint(state, env, job)
    # the fixed part rides with the batch; the sum equals the projection of every field at once
    (proj,) = cache._proj.values()
    meta = np.full((env.size, 4), -7, dtype=np.int64)
    x = np.concatenate(
        [
            jobs.usage[env, job].reshape(env.size, -1).astype(np.int64),
            jobs.request[env, job].astype(np.int64),
            jobs.ec_label[env, job, None].astype(np.int64),
            jobs.duration[env, job, None].astype(np.int64),
            meta,
        ],
        axis=1,
    )
    with np.errstate(over="ignore"):
        assert np.array_equal(got, x @ proj)
    # the same job in another batch (one row, other order) has the same key; another label gives another key
    other = core.reset(CFG, jobs.select(np.array([2, 0])), 0)
    assert np.array_equal(
        cache._fingerprint(other, np.array([0]), np.array([4])), got[(env == 2) & (job == 4)]
    )
    relabelled = core.relabel(CFG, state, (jobs.ec_label + 1) % CFG.n_labels)
    assert not np.array_equal(cache._fingerprint(relabelled, env, job), got)
    # a queue rotation moves the riding part with its jobs
    owned = jobs.owned_copy()
    moved = core.reset(CFG, owned, 0)
    before = cache._fingerprint(moved, np.array([1]), np.array([3]))
    owned.rotate_in_place(np.array([1]), np.array([2]), np.array([3]))  # job 3 of row 1 moves to slot 2
    assert np.array_equal(cache._fingerprint(moved, np.array([1]), np.array([2])), before)


def test_a_population_of_the_networks_own_head_gives_its_logits_and_actions(learned_forecaster) -> None:
    jobs = _square_jobs(3, 30, seed=13)
    policy = ForecastResidualPolicy(
        base=_hybrid(), forecaster=learned_forecaster, config=PlacerConfig(base_bonus=0.5)
    )
    net = policy.ready(CFG)
    _randomise_residual(net)
    own = fp.head_vector(net)
    other = own + torch.randn(own.shape, generator=torch.Generator().manual_seed(5))
    # envs 0-2 carry the network's head, envs 3-5 another one
    population = fp.PopulationPolicy(
        policy, fp.head_tensors(net, torch.stack([own, other])), np.repeat([0, 1], 3)
    )
    both = jobs.select(np.tile(np.arange(3), 2))
    rng = np.random.default_rng(0)
    state = core.reset(CFG, both, 0)
    state = fp.promote_queued_job(state, policy.pick_job(CFG, state, rng))
    inputs = population.decision_inputs(CFG, state, rng)
    with torch.no_grad():
        got = population.logits(CFG, inputs)
        mine = policy.logits(CFG, {k: v for k, v in inputs.items() if k != "member"})
        fp.set_head(net, other)
        theirs = policy.logits(CFG, {k: v for k, v in inputs.items() if k != "member"})
        fp.set_head(net, own)
    assert torch.allclose(got[:3], mine[:3], atol=1e-5) and torch.allclose(got[3:], theirs[3:], atol=1e-5)
    assert not torch.allclose(got[3:], mine[3:], atol=1e-3)  # the second head does score differently
    # a greedy rollout of the population is each member's own greedy rollout
    rec = run_rollout(population, CFG, both, 0, "greedy", np.random.default_rng(1))
    alone = run_rollout(policy, CFG, jobs, 0, "greedy", np.random.default_rng(1))
    assert np.array_equal(rec.returns[:3], alone.returns)
    # without the softmax (PGPE's training rollouts) the same decisions, and no entropy claimed
    quiet = run_rollout(population, CFG, both, 0, "greedy", np.random.default_rng(1), entropy=False)
    assert np.array_equal(quiet.returns, rec.returns) and quiet.n_agree == rec.n_agree
    assert np.isnan(quiet.mean_entropy) and np.isfinite(rec.mean_entropy)


def _pgpe_start(n_pairs: int):
    """(policy, network, its head's vector, z = 0, Adam on z) of a small PGPE learner on the hybrid (sigma 2)."""
    pcfg = PlacerConfig(
        algorithm="pgpe", pgpe_pairs=n_pairs, pgpe_sigma=2.0, pgpe_learning_rate=0.5, base_bonus=0.5, hidden=8
    )
    policy = ForecastResidualPolicy(base=_hybrid(), config=pcfg)
    net = policy.ready(CFG)
    anchor = fp.head_vector(net)
    z = torch.zeros_like(anchor, requires_grad=True)
    return policy, net, anchor, z, torch.optim.Adam([z], lr=pcfg.pgpe_learning_rate)


def test_pgpe_moves_the_head_toward_the_better_direction() -> None:
    """On one direction whose + side returns more, the step moves the head along it (and a head written back
    reads back the same)."""
    jobs = _square_jobs(4, 25, seed=14)
    policy, net, anchor, z, opt = _pgpe_start(n_pairs=1)
    rng = np.random.default_rng(4)
    eps = torch.from_numpy(np.random.default_rng(4).standard_normal((1, z.numel())).astype(np.float32))
    rec = fp.pgpe_step(policy, CFG, jobs, np.arange(4), z, anchor, torch.ones_like(anchor), opt, rng, 1)
    plus, minus = rec.returns[:4].mean(), rec.returns[4:].mean()
    assert plus != minus  # the direction changes decisions at this sigma
    moved = float((z.detach() * eps[0]).sum())
    assert np.sign(moved) == np.sign(plus - minus)
    fp.set_head(net, anchor + z.detach())
    assert torch.allclose(fp.head_vector(net), anchor + z.detach())


def test_each_pgpe_member_returns_what_its_head_alone_returns() -> None:
    """Two pairs over three sequences: member m's returns on each sequence are those of the network with m's head
    written in, run alone (the population's env layout and the per-sequence seeds line up)."""
    jobs = _square_jobs(3, 25, seed=16)
    policy, net, anchor, z, opt = _pgpe_start(n_pairs=2)
    rng = np.random.default_rng(6)
    drawn = np.array([2, 0, 1])
    replay = np.random.default_rng(6)  # the step's draws, in its order: directions, then the seeds
    eps = replay.standard_normal((2, anchor.numel())).astype(np.float32)
    seeds = np.random.SeedSequence(int(replay.integers(2**31))).generate_state(drawn.size).astype(np.int64)
    rec = fp.pgpe_step(policy, CFG, jobs, drawn, z, anchor, torch.ones_like(anchor), opt, rng, 1)
    per_member = rec.returns.reshape(4, drawn.size)
    for m, sign in enumerate([1.0, -1.0, 1.0, -1.0]):
        fp.set_head(net, anchor + policy.config.pgpe_sigma * sign * torch.from_numpy(eps[m // 2]))
        alone = run_rollout(policy, CFG, jobs.select(drawn), seeds, "greedy", np.random.default_rng(0))
        assert np.array_equal(per_member[m], alone.returns), m
    assert len({tuple(r) for r in per_member}) > 1  # the heads do decide differently


def test_a_cautious_choice_keeps_an_iteration_only_where_its_gain_stands_out() -> None:
    assert fp.gain_bound(np.array([1.0, 1.0, 1.0]), 1.645) == 1.0  # no spread: the mean
    assert fp.gain_bound(np.array([3.0, -1.0]), 1.0) == pytest.approx(1.0 - 2.0)  # sd 2.83 / sqrt(2)
    assert fp.gain_bound(np.array([0.5]), 9.0) == 0.5
    jobs = _square_jobs(6, 25, seed=15)
    pcfg = PlacerConfig(
        algorithm="pgpe",
        n_iterations=4,
        n_sequences=2,
        pgpe_pairs=2,
        pgpe_sigma=3.0,
        pgpe_learning_rate=1.0,
        base_bonus=0.5,
        hidden=8,
    )
    bold, table = train_forecast_placer(CFG, jobs, _hybrid(), None, replace(pcfg, choice_z=0.0))
    assert (table["imitation_accuracy"][1:] < 1.0).any()  # the iterations do deviate from the base
    returns = table["validation_return"].to_list()  # with z = 0: the first iteration of the best mean is kept
    assert bold.trained_iteration == returns.index(max(returns))
    cautious, _ = train_forecast_placer(CFG, jobs, _hybrid(), None, replace(pcfg, choice_z=1e6))
    assert cautious.trained_iteration == 0  # no gain stands out by a million standard errors
    with pytest.raises(ValueError, match="choice_z"):
        PlacerConfig(choice_z=-1.0)


def test_an_overshoot_budget_keeps_only_iterations_within_it() -> None:
    """With a budget the kept policy's validation overshoot is within Tetris's + the budget wherever an iteration
    (or the base) was, every kept candidate's overshoot is measured and logged; an unbounded budget keeps what no
    budget keeps; a negative budget is refused."""
    jobs = _square_jobs(6, 25, seed=15)
    pcfg = PlacerConfig(
        algorithm="pgpe", n_iterations=4, n_sequences=2, pgpe_pairs=2, pgpe_sigma=3.0, pgpe_learning_rate=1.0,
        base_bonus=0.5, hidden=8, choice_z=0.0,
    )  # fmt: skip
    free, free_table = train_forecast_placer(
        CFG, jobs, _hybrid(), None, replace(pcfg, overshoot_budget_pct=None)
    )
    loose, loose_table = train_forecast_placer(
        CFG, jobs, _hybrid(), None, replace(pcfg, overshoot_budget_pct=1e9)
    )
    assert loose.trained_iteration == free.trained_iteration and loose_table.drop(
        "seconds", "elapsed_s"
    ).equals(free_table.drop("seconds", "elapsed_s"))
    logs: list[str] = []
    tight, _ = train_forecast_placer(
        CFG, jobs, _hybrid(), None, replace(pcfg, overshoot_budget_pct=0.0), log=logs.append
    )
    measured = [m for m in logs if "validation overshoot" in m]
    assert measured and measured[0].startswith("base 0:")
    val = split_validation(jobs, pcfg.validation_share)[1]
    limit = float(sequence_outcomes(Tetris(), CFG, val, pcfg.seed)[1].mean())
    kept = float(sequence_outcomes(tight, CFG, val, pcfg.seed)[1].mean())
    if any("(within" in m for m in measured):
        assert kept <= limit + 1e-12
    with pytest.raises(ValueError, match="overshoot_budget_pct"):
        PlacerConfig(overshoot_budget_pct=-0.1)
    # the rule itself: within beats beyond, the score decides on the same side, overshoot measured only if needed
    calls = []

    def measured(answer: bool):
        return lambda: calls.append(answer) or answer

    assert (
        fp.budget_keeps(False, True, measured(True)) == (False, False) and calls == []
    )  # not better: unmeasured
    assert fp.budget_keeps(True, True, measured(False)) == (
        False,
        False,
    )  # better but beyond: the kept one stays
    assert fp.budget_keeps(True, True, measured(True)) == (True, True)
    assert fp.budget_keeps(False, False, measured(True)) == (True, True)  # worse, but the first within
    assert fp.budget_keeps(True, False, measured(False)) == (True, False)  # both beyond: the better score
    assert fp.budget_keeps(False, False, measured(False)) == (False, False)
    assert calls == [False, True, True, False, False]


def test_a_rollouts_recorded_overshoot_is_what_the_episodes_measure_apart() -> None:
    """The validation rollout's trace (`run_rollout(overshoot=True)`) gives each episode's overshoot % and return as
    `sim.tuning.sequence_outcomes` measures them on the same policy and sequences: the budget reads it instead of
    playing the episodes again."""
    jobs = _square_jobs(4, 25, seed=21)
    policy = ForecastResidualPolicy(base=_hybrid(), config=PlacerConfig(hidden=8, base_bonus=0.5))
    _randomise_residual(policy.ready(CFG), seed=5)  # a residual that deviates onto machines that overshoot
    rec = run_rollout(policy, CFG, jobs, 0, "greedy", np.random.default_rng(0), overshoot=True)
    returns, over, _ = sequence_outcomes(policy, CFG, jobs, 0)
    np.testing.assert_allclose(rec.returns, returns)
    np.testing.assert_allclose(rec.overshoot_pct, over)
    assert (over > 0).any()  # the case does overshoot
    plain = run_rollout(policy, CFG, jobs, 0, "greedy", np.random.default_rng(0))
    assert plain.overshoot_pct is None and np.array_equal(plain.returns, rec.returns)


def test_a_larger_cluster_check_sets_aside_iterations_that_lose_there() -> None:
    """`PlacerConfig.generalise_factor`: the base's returns on the superposed validation sequences are measured
    once, a candidate is checked only where it would be kept and not kept where it loses there; too few
    validation sequences for one larger sequence is said, not silently skipped; a factor below 1 is refused."""
    calls = []

    def answer(value: bool):
        return lambda: calls.append(value) or value

    assert fp.keeps(False, True, None, answer(True)) == (False, True) and calls == []  # not better: not asked
    assert fp.keeps(True, True, None, answer(False)) == (False, True)  # better at M, loses at k x M
    assert fp.keeps(True, True, None, answer(True)) == (True, True)
    assert fp.keeps(True, True, answer(False), answer(True)) == (False, False)  # beyond the budget: not asked
    assert fp.keeps(False, False, answer(True), answer(False)) == (
        False,
        True,
    )  # first within, loses at k x M
    assert fp.keeps(True, False, None, None) == (True, True)
    assert calls == [False, True, False, True, False]
    jobs = _square_jobs(6, 25, seed=15)  # 2 validation sequences
    pcfg = PlacerConfig(
        algorithm="pgpe", n_iterations=2, n_sequences=2, pgpe_pairs=2, hidden=8, overshoot_budget_pct=None
    )
    logs: list[str] = []
    _, table = train_forecast_placer(
        CFG, jobs, _hybrid(), None, replace(pcfg, generalise_factor=2), log=logs.append
    )
    larger = [m for m in logs if "validation at M = 8" in m]
    assert larger and larger[0].startswith("base 0:") and "gain over the base 0 " in larger[0]
    _, off_table = train_forecast_placer(CFG, jobs, _hybrid(), None, replace(pcfg, generalise_factor=None))
    assert table["validation_return"].equals(off_table["validation_return"])  # the check runs apart
    logs.clear()
    train_forecast_placer(CFG, jobs, _hybrid(), None, replace(pcfg, generalise_factor=3), log=logs.append)
    assert any("2 validation sequences, 3 needed for one: not checked" in m for m in logs)
    val = split_validation(jobs, pcfg.validation_share)[1]
    cfg_l, val_l = fp.larger_validation(CFG, val, replace(pcfg, generalise_factor=2), print)
    assert cfg_l.n_machines == 8 and val_l.batch_size == 1 and int(val_l.n_jobs[0]) == int(val.n_jobs.sum())
    assert fp.larger_validation(CFG, val, replace(pcfg, generalise_factor=1), print) is None
    with pytest.raises(ValueError, match="generalise_factor"):
        PlacerConfig(generalise_factor=0)


def test_a_branch_that_takes_the_base_action_replays_the_base_rollout() -> None:
    jobs = _square_jobs(3, 30, seed=12)
    rule = _hybrid(min_observed=2)
    policy = ForecastResidualPolicy(base=rule)
    rng = np.random.default_rng(0)
    state = core.reset(CFG, jobs, 0)
    picked = []
    for i in range(60):
        state, act = decide(policy, CFG, state, rng)
        if i in (5, 40):
            picked += [(state, 0, 1), (state, 2, 2)]
        state, *_ = core.step(CFG, state, act)
    full = sequence_returns(rule, CFG, jobs, 0)
    branches = fp.gather_states(picked)
    base_first = np.concatenate([np.repeat(policy.base.act(CFG, st, rng)[b], n) for st, b, n in picked])
    got = fp.branch_returns(policy.base, CFG, branches, base_first, rng, None)
    assert np.array_equal(got, full[[0, 2, 2, 0, 2, 2]])


@pytest.mark.parametrize("algorithm", ["ppo", "vine", "pgpe"])  # REINFORCE runs in the bad-input test
def test_tiny_training_run_saves_and_reloads(tmp_path, learned_forecaster, algorithm) -> None:
    jobs = _square_jobs(4, 20, seed=8)
    pcfg = PlacerConfig(
        n_iterations=2,
        n_sequences=2,
        n_rollouts=2,
        bc_epochs=1,
        hidden=16,
        algorithm=algorithm,
        vine_window=20,
        action_set="valid",  # every valid action: the randomised residual below leaves its base somewhere
    )
    policy, table = train_forecast_placer(CFG, jobs, _hybrid(min_observed=2), learned_forecaster, pcfg)
    assert table.columns == list(fp.STAGE_TABLE)
    assert table["stage"].to_list() == ["base", "bc", "pg", "pg"]
    assert table["imitation_accuracy"][0] == 1.0
    assert np.isfinite(table["validation_return"].to_numpy()).all()
    _randomise_residual(policy.net)  # a round trip that would show any weight, base or forecaster lost
    path = policy.save(tmp_path / "placer.pt", source="square", load_pct=50, revision="abc123")
    loaded = ForecastResidualPolicy(checkpoint=path)
    assert loaded.base_policy.risk == policy.base_policy.risk
    assert (loaded.config, loaded.trained_iteration, loaded.iterations_run, loaded.stopped_by) == (
        pcfg,
        policy.trained_iteration,
        policy.iterations_run,
        policy.stopped_by,
    )
    # the shared format: policy file and sidecar of the run, the config and the revision
    payload = torch.load(path, weights_only=True)
    assert payload["policy_format"] == ck.POLICY_FORMAT and payload["policy"] == "forecast_residual_rl"
    assert (payload["iteration"], payload["n_iterations"]) == (2, 2)
    meta = ck.check_sidecar(path, "forecast_residual_rl", "square", 50, pcfg.seed)
    assert meta["git_revision"] == "abc123"
    assert meta["config"]["PlacerConfig"] == payload["config"]["PlacerConfig"]
    assert meta["config"]["PlacerConfig"]["algorithm"] == algorithm
    assert meta["config"]["PlacerConfig"]["levels"] == list(pcfg.levels)
    assert (meta["config"]["n_resources"], meta["config"]["forecaster"]) == (2, "quantile")
    assert (meta["iteration"], meta["n_iterations"]) == (2, 2)
    test_jobs = _square_jobs(2, 25, seed=9)
    expected, got = _actions(policy, test_jobs), _actions(loaded, test_jobs)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    assert not all(
        np.array_equal(a, b) for a, b in zip(expected, _actions(policy.base_policy, test_jobs), strict=False)
    )
    # the same weights schedule a larger cluster
    _actions(loaded, _square_jobs(1, 40, seed=10), replace(CFG, n_machines=10))


def test_the_trained_policy_is_published_only_when_training_finished(tmp_path) -> None:
    jobs = _square_jobs(3, 20, seed=11)
    untrained = ForecastResidualPolicy()
    with pytest.raises(ValueError, match="never.pt: the network was never built"):
        untrained.save(tmp_path / "never.pt")
    untrained.ready(CFG)
    with pytest.raises(ValueError, match="half.pt: trained 0 of 40 iterations; not published"):
        untrained.save(tmp_path / "half.pt")
    assert not (tmp_path / "half.pt").exists() and not ck.sidecar_path(tmp_path / "half.pt").exists()
    # a run that its time budget ends is finished: n_iterations is the iterations run, the rule is recorded
    pcfg = PlacerConfig(time_budget_s=0.0, n_sequences=1, n_rollouts=2)
    policy, table = train_forecast_placer(CFG, jobs, config=pcfg)
    assert table["stage"].to_list() == ["base"] and policy.stopped_by == "time_budget"
    path = policy.save(tmp_path / "budget.pt")  # no source or load: the sidecar leaves them out
    meta = ck.check_trained(path)
    assert (meta["iteration"], meta["n_iterations"], meta["seed"]) == (0, 0, 0)
    assert "source" not in meta and "load_pct" not in meta and meta["git_revision"]
    # the same greedy actions after the round trip
    loaded = ForecastResidualPolicy(checkpoint=path)
    assert loaded.stopped_by == "time_budget"
    test_jobs = _square_jobs(2, 25, seed=9)
    expected, got = _actions(policy, test_jobs), _actions(loaded, test_jobs)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    # a sidecar short of its iterations is refused at load
    side = ck.sidecar_path(path)
    meta["n_iterations"] = 5
    side.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="budget.pt: trained 0 of its config's 5 iterations"):
        ForecastResidualPolicy(checkpoint=path)


def test_bad_input_names_the_file_teacher_or_iteration(tmp_path, monkeypatch) -> None:
    jobs = _square_jobs(3, 20, seed=11)
    with pytest.raises(ValueError, match="training split has no sequences"):
        train_forecast_placer(CFG, jobs.select(np.arange(0)), config=PlacerConfig())
    with pytest.raises(ValueError, match="'nope' is not a registered policy"):
        train_forecast_placer(CFG, jobs, config=PlacerConfig(bc_epochs=1, bc_teacher="nope"))
    policy, _ = train_forecast_placer(
        CFG, jobs, config=PlacerConfig(algorithm="reinforce", n_iterations=1, n_sequences=1, n_rollouts=2)
    )
    path = policy.save(tmp_path / "p.pt")

    def tampered(name: str, **changes) -> Path:
        """A copy of p.pt (and its sidecar) with `changes` in the policy file."""
        payload = torch.load(path, weights_only=True) | changes
        torch.save(payload, tmp_path / name)
        shutil.copy(ck.sidecar_path(path), ck.sidecar_path(tmp_path / name))
        return tmp_path / name

    saved = torch.load(path, weights_only=True)
    with pytest.raises(ValueError, match="other.pt was trained with another feature set"):
        ForecastResidualPolicy(checkpoint=tampered("other.pt", feature_names=saved["feature_names"][:-1]))
    with pytest.raises(ValueError, match="p.pt: trained for 2 resources"):
        ForecastResidualPolicy(checkpoint=path).ready(SimConfig(capacity_units=(8, 8, 8)))
    bad_config = {"PlacerConfig": saved["config"]["PlacerConfig"] | {"gone": 1}}
    with pytest.raises(ValueError, match="config.pt: its config does not match PlacerConfig"):
        ForecastResidualPolicy(checkpoint=tampered("config.pt", config=bad_config))
    with pytest.raises(ValueError, match="dejavu.pt: not a published forecast placer .*'dejavu'"):
        ForecastResidualPolicy(checkpoint=tampered("dejavu.pt", policy="dejavu"))
    torch.save({"format": "tvw-forecast-placer/1", "model": {}}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="old.pt: not a published forecast placer"):
        ForecastResidualPolicy(checkpoint=tmp_path / "old.pt")
    shutil.copy(path, tmp_path / "alone.pt")
    with pytest.raises(ValueError, match="alone.pt: no sidecar"):
        ForecastResidualPolicy(checkpoint=tmp_path / "alone.pt")
    (tmp_path / "cut.pt").write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="cut.pt is corrupt or truncated"):
        ForecastResidualPolicy(checkpoint=tmp_path / "cut.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt does not exist"):
        ForecastResidualPolicy(checkpoint=tmp_path / "missing.pt")
    monkeypatch.setattr(
        fp, "_advantages", lambda rec, seq, d: np.full(sum(len(a) for a in rec.action), np.nan)
    )
    with pytest.raises(FloatingPointError, match="pg iteration 1"):
        train_forecast_placer(
            CFG, jobs, config=PlacerConfig(algorithm="ppo", n_iterations=2, n_sequences=1, n_rollouts=2)
        )


def test_a_peak_quantile_base_is_its_rule_and_survives_the_checkpoint_format() -> None:
    """The remaining-peak rule (`forecast_peak`'s form, in guard mode, recall over it) as the residual's base: the
    untrained policy is that rule, and `base_spec` / `base_from_spec` give back the same decisions."""
    from sim.forecast import RecallOverlay
    from sim.peak_forecast import fit_peak_quantiles

    table = fit_peak_quantiles(_square_jobs(4, 30, seed=31), CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    rule = RiskAwarePacking(
        RecallOverlay(table.forecaster(0.75, horizon=30), 1.0),
        make_policy("tetris"),
        RiskConfig(level=0.75, mode="guard"),
        name="forecast_peak",
    )
    jobs = _square_jobs(2, 30, seed=32)
    expected = _actions(rule, jobs)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(expected, _actions(ForecastResidualPolicy(base=rule), jobs), strict=True)
    )
    spec = fp.base_spec(rule)
    assert spec["forecaster"]["inner"]["kind"] == "peak_quantile"
    back = fp.base_from_spec(torch.load(_saved(spec), weights_only=True))
    assert back.risk == rule.risk
    assert all(np.array_equal(a, b) for a, b in zip(expected, _actions(back, jobs), strict=True))


def test_a_rise_adapted_rule_survives_the_checkpoint_format() -> None:
    """`forecast_peak_adaptive`'s form (the remaining-peak table at a level per env, `sim.rise_shift`) as a saved
    rule: `base_spec` / `base_from_spec` give back the same decisions, its training rate included."""
    from sim.peak_forecast import fit_peak_quantiles
    from sim.rise_shift import ShiftAdaptedPeakForecaster, fit_rise_rate

    train = _square_jobs(4, 30, seed=33)
    table = fit_peak_quantiles(train, CFG, levels=(0.2, 0.5, 0.75, 0.9), min_count=5)
    adapted = ShiftAdaptedPeakForecaster(table, fit_rise_rate(train), level=0.75, horizon=30, floor=0.2)
    rule = RiskAwarePacking(adapted, make_policy("tetris"), RiskConfig(level=0.75, mode="pack"), "adaptive")
    jobs = _square_jobs(2, 30, seed=34)
    expected = _actions(rule, jobs)
    spec = fp.base_spec(rule)
    assert spec["forecaster"]["kind"] == "rise_adapted"
    back = fp.base_from_spec(torch.load(_saved(spec), weights_only=True))
    assert back.forecaster.rate == adapted.rate and back.forecaster.level == 0.75
    assert back.forecaster.floor == 0.2
    old = {k: v for k, v in spec["forecaster"].items() if k != "floor"}  # saved before the floor was a field
    assert fp.forecaster_from_spec(old).floor == 0.5
    assert all(np.array_equal(a, b) for a, b in zip(expected, _actions(back, jobs), strict=True))
    assert back.forecaster.amount is None and fp.forecaster_from_spec(old).amount is None


def test_a_rise_adapted_rule_with_its_amount_or_exceedances_survives_the_checkpoint_format() -> None:
    """`forecast_peak_adaptive_amount`'s and `_exceed`'s forms: the training amount (`sim.rise_shift.RiseAmount`)
    or exceedance rate comes back equal, and so do the decisions."""
    from sim.peak_forecast import fit_peak_quantiles
    from sim.rise_shift import RiseRate, ShiftAdaptedPeakForecaster, fit_rise_amount, fit_rise_rate

    train = _square_jobs(4, 30, seed=35)
    table = fit_peak_quantiles(train, CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    amount = fit_rise_amount(train, table, 0.75)
    adapted = ShiftAdaptedPeakForecaster(table, fit_rise_rate(train), level=0.75, horizon=30, amount=amount)
    rule = RiskAwarePacking(adapted, make_policy("tetris"), RiskConfig(level=0.75, mode="pack"), "adaptive")
    jobs = _square_jobs(2, 30, seed=36)
    expected = _actions(rule, jobs)
    back = fp.base_from_spec(torch.load(_saved(fp.base_spec(rule)), weights_only=True))
    assert back.forecaster.amount == amount and back.forecaster.exceed is None
    assert all(np.array_equal(a, b) for a, b in zip(expected, _actions(back, jobs), strict=True))
    rate = RiseRate(
        hazard=0.01, events=3, exposure=300
    )  # the square jobs never top their requests' quantiles
    exceed = replace(adapted, amount=None, exceed=rate)
    rule = RiskAwarePacking(exceed, make_policy("tetris"), RiskConfig(level=0.75, mode="pack"), "adaptive")
    expected = _actions(rule, jobs)
    back = fp.base_from_spec(torch.load(_saved(fp.base_spec(rule)), weights_only=True))
    assert back.forecaster.exceed == exceed.exceed
    guard = replace(adapted, amount=None, overshoot=rate, raise_only=True)
    back_guard = fp.forecaster_from_spec(fp.forecaster_spec(guard))
    assert back_guard.overshoot == rate and back_guard.raise_only
    assert all(np.array_equal(a, b) for a, b in zip(expected, _actions(back, jobs), strict=True))


def _saved(obj) -> io.BytesIO:
    """`obj` written by torch.save, ready to read back (what a checkpoint file holds)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_placer_with_a_labeller_is_its_base_rule_served_those_labels() -> None:
    """Trained and evaluated on one view: with a labeller, the untrained placer decides as its base rule does when
    served that labeller's labels (`ServedLabels`), not as the base rule on the jobs' own labels, and training
    serves the labels in its rollouts too."""
    from sim.labelling import ServedLabels
    from sim.peak_forecast import fit_peak_quantiles

    def spiky(n_rows: int, seed: int) -> JobBatch:
        """Jobs requesting 6 units that use 1, except label-2 jobs, which spike to 5 in their second half."""
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n_rows):
            seq, t = [], 0
            for _ in range(30):
                t += int(rng.integers(0, 3))
                dur, label = int(rng.integers(6, 24)), int(rng.integers(0, 3))
                usage = [[5 if label == 2 and a >= dur // 2 else 1] * 2 for a in range(dur)]
                seq.append({"arrival_step": t, "usage": usage, "ec_label": label, "request": [6, 6]})
            rows.append(seq)
        return JobBatch.from_jobs(rows)

    train = spiky(30, seed=5)
    table = fit_peak_quantiles(train, CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    rule = RiskAwarePacking(
        table.forecaster(0.5, horizon=30), make_policy("tetris"), RiskConfig(level=0.5, mode="pack"), name="p"
    )

    class Swapped:
        """Every label moved to the next class: what the rule reads changes, the physics does not."""

        calls = 0

        def labels(self, cfg, state):
            Swapped.calls += 1
            return (core.observed_labels(state) + 1) % 3

    jobs = spiky(4, seed=6)
    served = _actions(ServedLabels(rule, Swapped()), jobs)
    got = _actions(ForecastResidualPolicy(base=rule, labeller=Swapped()), jobs)
    assert all(np.array_equal(a, b) for a, b in zip(served, got, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(_actions(rule, jobs), got, strict=False))
    Swapped.calls = 0
    pcfg = PlacerConfig(n_iterations=1, n_sequences=2, n_rollouts=2, bc_epochs=0, hidden=8)
    train_forecast_placer(CFG, train.select(np.arange(4)), rule, None, pcfg, labeller=Swapped())
    assert Swapped.calls > 0


def test_the_base_rules_own_table_as_inputs_trains_saves_and_reloads(tmp_path) -> None:
    """`PlacerTrainConfig.inputs` "rule": the residual reads forecast_peak's remaining-peak quantiles at its levels
    (no learned forecaster is fitted), trains, and its checkpoint gives back the same forecaster and decisions; a
    base that is not on the table is refused for these inputs, and takes forecast_peak's table with "table"."""
    from sim.forecast import uncached
    from sim.peak_forecast import RemainingPeakQuantiles
    from sim.tuning import TuningConfig

    train = _square_jobs(10, 30, seed=41)
    pcfg = PlacerConfig(n_iterations=1, n_sequences=2, n_rollouts=2, hidden=8, algorithm="reinforce")
    tuning = TuningConfig(seed=0, peak_levels=(0.9,))
    base, forecaster, ctx = fp.fit_base_rule(
        CFG, train, "forecast_peak", "sample", tuning, "square", inputs="rule", levels=pcfg.levels
    )
    inner = forecaster.inner if hasattr(forecaster, "reliability") else forecaster
    assert isinstance(inner, RemainingPeakQuantiles)
    assert set(pcfg.levels) <= set(inner.levels) and 0.9 in inner.levels
    assert ctx.forecaster_factory is not None and "forecaster" not in ctx._cache  # none was fitted
    policy, table = train_forecast_placer(CFG, train, base, forecaster, pcfg)
    assert table["imitation_accuracy"][0] == 1.0
    path = policy.save(tmp_path / "placer.pt", source="square", load_pct=50, revision="abc123")
    loaded = ForecastResidualPolicy(checkpoint=path)
    assert isinstance(uncached(loaded.forecaster), type(uncached(policy.forecaster)))
    test_jobs = _square_jobs(2, 25, seed=42)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(_actions(policy, test_jobs), _actions(loaded, test_jobs), strict=True)
    )
    with pytest.raises(ValueError, match="inputs 'rule'.*hybrid_observed"):
        fp.PlacerTrainConfig(base="hybrid_observed", inputs="rule")
    assert fp.PlacerTrainConfig(base="hybrid_observed", inputs="learned").inputs == "learned"
    # "table": forecast_peak's table as the inputs of another base (the hybrid), no learned forecaster fitted
    hybrid, on_table, ctx = fp.fit_base_rule(
        CFG, train, "hybrid_observed", "sample", tuning, "square", inputs="table", levels=pcfg.levels
    )
    assert hybrid.name == "hybrid_observed" and "forecaster" not in ctx._cache
    inner = on_table.inner if hasattr(on_table, "reliability") else on_table
    assert isinstance(inner, RemainingPeakQuantiles) and set(pcfg.levels) <= set(inner.levels)
    assert fp.PlacerTrainConfig(base="hybrid_observed", inputs="table").inputs == "table"


def test_table_inputs_without_recall_are_the_same_table_on_a_recurring_workload() -> None:
    """`PlacerTrainConfig.inputs` "table_no_recall": where `forecast_peak` recalls earlier runs (exact repeats of
    three templates), "table" is the table with recall over it, "table_no_recall" the same table alone."""
    from sim.forecast import RecallOverlay, uncached
    from sim.peak_forecast import RemainingPeakQuantiles
    from sim.tuning import TuningConfig

    rng = np.random.default_rng(7)
    templates = [[[int(v), 1] for v in rng.integers(1, 5, size=int(d))] for d in (12, 18, 25)]
    train = _repeats(rng, templates, 10)
    tuning = TuningConfig(seed=0, peak_levels=(0.9,))
    got = {
        inputs: uncached(
            fp.fit_base_rule(CFG, train, "hybrid_observed", "sample", tuning, "tpl", inputs=inputs)[1]
        )
        for inputs in ("table", "table_no_recall")
    }
    assert isinstance(got["table"], RecallOverlay)
    assert isinstance(got["table_no_recall"], RemainingPeakQuantiles)
    assert (
        got["table_no_recall"].table.values.tobytes() == uncached(got["table"].inner).table.values.tobytes()
    )
    assert fp.PlacerTrainConfig(base="hybrid_observed", inputs="table_no_recall").inputs == "table_no_recall"


def _repeats(rng: np.random.Generator, templates: list, n_rows: int) -> JobBatch:
    """`n_rows` sequences of 30 exact repeats of the `templates` (usage per step), drawn from `rng`."""
    rows = []
    for _ in range(n_rows):
        t, seq = 0, []
        for _ in range(30):
            t += int(rng.integers(0, 3))
            k = int(rng.integers(0, 3))
            seq.append({"arrival_step": t, "usage": templates[k], "ec_label": k, "workload_id": f"tpl{k}"})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


def _recurring_state(n_steps: int):
    """Three sequences of exact repeats of 3 workloads, `n_steps` Tetris decisions in (earlier runs recallable)."""
    rng = np.random.default_rng(40)
    templates = [
        [[int(v), int(v)] for v in rng.integers(1, 5, size=int(rng.integers(6, 20)))] for _ in range(3)
    ]
    state = core.reset(CFG, _repeats(rng, templates, 3), 0)
    tetris, pick_rng = make_policy("tetris"), np.random.default_rng(0)
    for _ in range(n_steps):
        state, act = decide(tetris, CFG, state, pick_rng)
        state, *_ = core.step(CFG, state, act)
    return state


def _peak_forecaster(recall: bool):
    from sim.forecast import RecallOverlay
    from sim.peak_forecast import RemainingPeakQuantiles, fit_peak_quantiles

    table = fit_peak_quantiles(_square_jobs(4, 30, seed=41), CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    inner = RemainingPeakQuantiles(table, horizon=30)
    return RecallOverlay(inner, 1.0) if recall else inner


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("recall", [True, False])
@pytest.mark.parametrize("squares", [True, False])
def test_compiled_planes_equal_the_numpy_planes(recall, squares, threads, on_threads) -> None:
    """`_planes` for a forecaster with a value per level (recall over it or not) comes from one kernel; it gives
    the numpy path's planes and medians to the bit, on a state where earlier runs are recalled."""
    from sim import compiled_planes

    calls = on_threads(threads, compiled_planes, "_flat_planes_parallel")
    state, forecaster = _recurring_state(40), _peak_forecaster(recall)
    jobs = state.jobs
    env, job = np.nonzero(jobs.is_real)
    n_alive = np.clip(
        jobs.duration[env, job] - (state.t[env] - np.maximum(state.job_start[env, job], 0)), 0, 25
    )
    pcfg = PlacerConfig(levels=(0.5, 0.75, 0.9))
    got = fp._planes(CFG, state, forecaster, pcfg, env, job, n_alive, 25, squares)
    want = fp._planes(CFG, state, forecaster, pcfg, env, job, n_alive, 25, squares, compiled=False)
    if recall:
        assert forecaster.recalled(CFG, state, env, job).dest.size > 10  # recall does override some jobs
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
    assert calls["_flat_planes_parallel"] == (1 if threads == "numba" else 0)


@pytest.mark.parametrize("which", ["recall_peak", "learned_rho"])
def test_compiled_level_columns_equal_the_numpy_columns(which, learned_forecaster) -> None:
    """The general features path (`_level_columns`: horizon planes summed per machine) with its kernels gives the
    numpy path's inputs to the bit: recall over the remaining-peak table at rho = 1, and a learned quantile
    forecaster at rho = 0.5 (the bound's square-root form)."""
    state = _recurring_state(30)
    if which == "recall_peak":
        forecaster, pcfg = _peak_forecaster(True), PlacerConfig(levels=(0.5, 0.75, 0.9))
    else:
        forecaster, pcfg = learned_forecaster, PlacerConfig(rho=0.5)
    base = make_policy("tetris").act(CFG, state, np.random.default_rng(0))
    mask = core.action_mask(CFG, state)
    x1, g1 = placement_features(CFG, state, forecaster, pcfg, base, mask)
    x2, g2 = placement_features(CFG, state, forecaster, pcfg, base, mask, compiled=False)
    assert np.isfinite(x1).all() and x1[..., : 5 * len(pcfg.levels)].any()
    assert x1.tobytes() == x2.tobytes() and g1.tobytes() == g2.tobytes()


def _kernel_rollout_case(square_jobs):
    """(cfg, policy, jobs): a residual (randomised: it leaves its base) on `forecast_peak`'s kind of rule, whose
    rollout runs the compiled pick, decision and step kernels, over 6 sequences."""
    cfg = SimConfig(n_machines=4, max_steps=400, hold_rule="no_fit")
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    rule = RiskAwarePacking(
        table.forecaster(0.75, horizon=12), make_policy("deeprm_sjf"), RiskConfig(0.75, mode="pack"), name="r"
    )
    policy = ForecastResidualPolicy(base=rule, forecaster=RemainingPeakQuantiles(table, horizon=12))
    _randomise_residual(policy.ready(cfg))
    return cfg, policy, square_jobs(6, 30, seed=4)


def _same_record(got, ref) -> None:
    for key in ("x", "g", "mask", "base", "action", "logp", "reward"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(got, key), getattr(ref, key), strict=True)), (
            key
        )
    assert np.array_equal(got.returns, ref.returns)


def test_a_rollout_on_the_decision_kernel_records_what_the_pieces_give(square_jobs):
    """A sampled rollout of a residual (randomised: it leaves its base) on `forecast_peak`'s kind of rule reads its
    decisions from `placer_kernel.decide`, and records the same inputs, actions and returns as with the pieces."""
    cfg, policy, jobs = _kernel_rollout_case(square_jobs)
    fused = policy._decide
    n_fused = []  # decisions the one kernel gave (not None)

    def counted(cfg, seen):
        out = fused(cfg, seen)
        n_fused.append(out is not None)
        return out

    policy._decide = counted
    got = run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True)
    policy._decide = lambda cfg, seen: None
    ref = run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True)
    assert sum(n_fused) == got.n_decisions == ref.n_decisions > 20
    assert (np.concatenate(got.action) != np.concatenate(got.base)).any()
    _same_record(got, ref)


def test_a_charge_aware_advisor_and_rule_charge_run_in_the_decision_kernel(square_jobs, monkeypatch):
    """The README's configuration (the action set "rule" under `rule_charge`, advised by a
    `forecast_peak_charge_guard`-kind rule): the advisor's actions come from the one decision kernel, never from
    its own `act`, each machine's level reads its running jobs back from the inputs (`running_counts`, which equal
    `jobs_per_machine` of every live env) and the rollout records what the pieces give."""
    from sim.charge_level import ChargeAwarePeakPacking
    from sim.risk import jobs_per_machine

    cfg, plain, jobs = _kernel_rollout_case(square_jobs)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    guard = _charge_guard(table)
    config = fp.with_rule_level(
        PlacerConfig(action_set="rule", rule_charge=True), 0.75, (0.5, 0.75, 0.9, 0.99), n_ref=1.5
    )
    assert config.rule_charge
    policy = ForecastResidualPolicy(
        base=plain.base.policy, forecaster=plain.forecaster, config=config, advisor=guard
    )
    assert policy.advisor.risk_rule is guard
    _randomise_residual(policy.ready(cfg))
    n_counted = []

    def counts_agree(state, inputs, active) -> None:
        live = ~state.is_done
        counts = fp.running_counts(config, cfg.n_resources, inputs["x"])
        assert np.array_equal(counts[live], jobs_per_machine(state)[live])
        n_counted.append(int(live.sum()))

    own_acts = []
    real_act = ChargeAwarePeakPacking.act
    monkeypatch.setattr(
        ChargeAwarePeakPacking, "act", lambda self, *a: own_acts.append(1) or real_act(self, *a)
    )
    got = run_rollout(
        policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True, on_decision=counts_agree
    )
    assert not own_acts and sum(n_counted) > 50  # the kernel decided every advice
    policy._decide = lambda cfg, seen: None
    ref = run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True)
    assert own_acts  # the pieces ask the advisor on its own
    _same_record(got, ref)


@pytest.mark.parametrize("n_spans", [1, 2, 4, 9])
def test_the_threaded_kernels_give_the_callers_rollout_for_any_number_of_spans(
    n_spans, square_jobs, on_threads, monkeypatch
):
    """The parallel kernels run their envs in spans, one scratch per span (`sim.compiled_step.launch`): a rollout
    on them (the job pick, the decision and the step) records what the caller's thread gives, whether a span holds
    every env, several or one (9 spans for 6 envs), on however many threads numba has."""
    cfg, policy, jobs = _kernel_rollout_case(square_jobs)
    ref = run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True)
    counts = [  # each a dict the counted kernels update
        on_threads("numba", compiled_step, "_kernel_parallel"),
        on_threads("numba", compiled_decision, "_pick_kernel_parallel"),
        on_threads("numba", placer_kernel, "decide_kernel_parallel"),
    ]
    monkeypatch.setattr(compiled_step, "numba", SimpleNamespace(get_num_threads=lambda: n_spans))
    got = run_rollout(policy, cfg, jobs, 0, "sample", np.random.default_rng(1), keep=True)
    calls = {name: n for count in counts for name, n in count.items()}
    assert all(n == got.n_decisions > 20 for n in calls.values()), calls
    _same_record(got, ref)


def _peak_rule(seed: int = 31) -> RiskAwarePacking:
    """A remaining-peak rule (`forecast_peak`'s form) fitted on square-wave jobs, packing at the median."""
    table = fit_peak_quantiles(_square_jobs(4, 30, seed=seed), CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    return RiskAwarePacking(
        table.forecaster(0.5, horizon=30),
        make_policy("tetris"),
        RiskConfig(level=0.5, mode="pack"),
        name="forecast_peak",
    )


def _same_actions(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_advisor_starts_silent_and_its_bonus_makes_the_policy_follow_it() -> None:
    """With an advisor the untrained policy is still its base rule; an advice bonus above the base bonus makes
    the greedy policy the advisor's rule, decision for decision; a population of the network's own head gives
    the network's logits, advice included."""
    jobs = _square_jobs(3, 30, seed=51)
    base, advisor = _hybrid(), _peak_rule()
    assert not _same_actions(_actions(base, jobs), _actions(advisor, jobs))  # the two rules differ here
    policy = ForecastResidualPolicy(base=base, advisor=advisor, config=PlacerConfig(hidden=8))
    assert _same_actions(_actions(policy, jobs), _actions(base, jobs))
    net = policy.ready(CFG)
    assert "advice_bonus" in fp.head_names(net) and net.advice_bonus.item() == 0.0
    with torch.no_grad():
        net.advice_bonus.fill_(policy.config.base_bonus + 1.0)
    assert _same_actions(_actions(policy, jobs), _actions(advisor, jobs))
    # PGPE's population scores with the advice bonus as the network does
    _randomise_residual(net)
    own = fp.head_vector(net)
    population = fp.PopulationPolicy(policy, fp.head_tensors(net, own[None]), np.zeros(3, dtype=np.int64))
    rng = np.random.default_rng(0)
    state = core.reset(CFG, jobs, 0)
    state = fp.promote_queued_job(state, policy.pick_job(CFG, state, rng))
    inputs = population.decision_inputs(CFG, state, rng)
    assert "advice" in inputs
    with torch.no_grad():
        got = population.logits(CFG, inputs)
        mine = policy.logits(CFG, {k: v for k, v in inputs.items() if k != "member"})
    assert torch.allclose(got, mine, atol=1e-5)
    with pytest.raises(ValueError, match="advisor's actions"):
        net(*(torch.from_numpy(inputs[k]) for k in ("x", "g", "base", "mask")))


def test_an_advised_placer_trains_by_pgpe_saves_and_reloads_with_its_advisor(tmp_path) -> None:
    """A tiny PGPE run with an advisor: the checkpoint carries the advisor (its spec) and the advice bonus, and
    the reloaded policy decides as the trained one; an advisor with a gradient algorithm or a BC stage is refused
    by name."""
    train = _square_jobs(6, 25, seed=52)
    pcfg = PlacerConfig(n_iterations=2, n_sequences=2, pgpe_pairs=2, hidden=8, algorithm="pgpe")
    policy, table = train_forecast_placer(CFG, train, _hybrid(), None, pcfg, advisor=_peak_rule())
    assert table["imitation_accuracy"][0] == 1.0  # the untrained, advised policy is the base rule
    net = policy.ready(CFG)
    with torch.no_grad():  # a bonus that changes decisions, so the reload is checked on the advisor's path
        net.advice_bonus.fill_(pcfg.base_bonus + 1.0)
    path = policy.save(tmp_path / "advised.pt", source="square", load_pct=50, revision="abc123")
    loaded = ForecastResidualPolicy(checkpoint=path)
    assert loaded.advisor_policy is not None and loaded.advisor_policy.name == "forecast_peak"
    assert loaded.ready(CFG).advice_bonus.item() == pytest.approx(pcfg.base_bonus + 1.0)
    test_jobs = _square_jobs(2, 25, seed=53)
    assert _same_actions(_actions(policy, test_jobs), _actions(loaded, test_jobs))
    assert _same_actions(_actions(loaded, test_jobs), _actions(_peak_rule(), test_jobs))
    for bad in (replace(pcfg, algorithm="reinforce"), replace(pcfg, bc_epochs=1)):
        with pytest.raises(ValueError, match="advisor .*'forecast_peak'.* PGPE"):
            train_forecast_placer(CFG, train, _hybrid(), None, bad, advisor=_peak_rule())


def test_the_guarded_placer_is_the_trained_file_under_the_replay_guard(tmp_path) -> None:
    """`forecast_residual_rl_replay` (`models.placer_guard`): a learned registry entry built from
    `forecast_residual_rl`'s trained file, guarded by replays with the checkpoint's base rule, its fallback as the
    overshoot reference and the advisor as candidates; before the first checkpoint it decides as the loaded placer;
    the warehouse loads it from the placer's own file, its replays seeded as the episode; a placer without an
    advisor offers no other rule."""
    from assets.learned import load_learned, policy_maker, policy_path
    from assets.resources import Warehouse
    from models.placer_guard import GUARDED, guard, guarded_placer
    from sim.policies import is_learned, is_oracle, policy_kind

    assert is_learned(GUARDED) and not is_oracle(GUARDED) and policy_kind(GUARDED) == "learned"
    untrained = make_policy(GUARDED)
    assert untrained.name == GUARDED and untrained.names == (
        "forecast_residual_rl",
        "tetris",
        "tetris",
        "first_fit",
        "best_fit",
    )
    assert ForecastResidualPolicy(base=_hybrid(), advisor=_peak_rule()).guard_rules[0].name == "forecast_peak"
    train = _square_jobs(6, 25, seed=52)
    pcfg = PlacerConfig(n_iterations=1, n_sequences=2, pgpe_pairs=2, hidden=8, algorithm="pgpe", seed=1)
    policy, _ = train_forecast_placer(CFG, train, _hybrid(), None, pcfg, advisor=_peak_rule())
    wh = Warehouse(root=str(tmp_path))
    path = policy_path(wh, GUARDED, "square", 50, 1)
    assert path == policy_path(wh, "forecast_residual_rl", "square", 50, 1)
    policy.save(path, source="square", load_pct=50, revision="abc123")
    guard_of_file = load_learned(GUARDED, "square", 50, 1, wh, replay_seed=7)
    assert guard_of_file.names == (
        "forecast_residual_rl",
        "tetris",
        "hybrid_observed",
        "forecast_peak",
        "first_fit",
        "best_fit",
    )
    assert guard_of_file.seed == 7 and policy_maker(wh)(GUARDED, "square", 50, 1).seed == 1
    assert (guard_of_file.first, guard_of_file.budget_pct) == (128, 0.75)  # as adopted (RESULTS.md)
    assert isinstance(guarded_placer(path).candidates[0], ForecastResidualPolicy)
    early = guard(ForecastResidualPolicy(checkpoint=path), variant="forecast_residual_rl_replay_early")
    assert (early.name, early.first, early.budget_pct, early.names) == (
        "forecast_residual_rl_replay_early",
        32,
        0.5,
        guard_of_file.names,
    )
    on_return = guard(ForecastResidualPolicy(checkpoint=path), variant="forecast_residual_rl_replay_return")
    assert (on_return.first, on_return.budget_pct, on_return.margin, on_return.z) == (128, 0.75, 0.0, 2.0)
    # adopted by the twenty-seventh session's pre-registered runs: the return guard's knobs; by the twenty-ninth's,
    # a recent gain over the replay's last 64 steps that the whole replay confirms
    assert (guard_of_file.margin, guard_of_file.z) == (on_return.margin, on_return.z)
    assert (guard_of_file.recent, on_return.recent, guard_of_file.window) == (64, 0, 0)
    late = guard(ForecastResidualPolicy(checkpoint=path), variant="forecast_residual_rl_replay_late")
    assert (late.first, late.budget_pct) == (128, 0.75)
    assert np.isinf(late.margin)  # the guard on overshoot only
    with pytest.raises(ValueError, match="guard variant 'nope': not one of"):
        guard(ForecastResidualPolicy(checkpoint=path), variant="nope")
    test_jobs = _square_jobs(2, 40, seed=53)
    rng = np.random.default_rng(0)
    state = core.reset(CFG, test_jobs, 0)
    n_decisions = 0
    while not state.is_done.all() and int(state.t.max()) < guard_of_file.first:
        guarded, action = decide(guard_of_file, CFG, state, rng)
        assert np.array_equal(action, decide(policy, CFG, state, rng)[1])
        state, *_ = core.step(CFG, guarded, action)
        n_decisions += int((action < CFG.n_machines).sum())
    assert n_decisions > 10  # the comparison covered placements


def test_a_charge_aware_advisor_survives_the_checkpoint_format(tmp_path) -> None:
    """`forecast_peak_charge_guard` as the advisor (`sim.charge_level.ChargeAwarePeakPacking`): the checkpoint
    carries its rules, levels and n_ref, and the reloaded policy, following it, decides as it does."""
    from sim.charge_level import ChargeAwarePeakPacking

    table = fit_peak_quantiles(_square_jobs(4, 30, seed=31), CFG, levels=(0.5, 0.75, 0.9), min_count=5)
    levels = (0.5, 0.75, 0.9)
    rules = tuple(
        RiskAwarePacking(table.forecaster(lv, horizon=30), make_policy("tetris"), RiskConfig(lv, mode="pack"))
        for lv in levels
    )
    guard = ChargeAwarePeakPacking(
        rules, levels, level=0.5, n_ref=1.5, raise_only=True, fallback=make_policy("tetris"), mode="pack"
    )
    pcfg = PlacerConfig(n_iterations=1, n_sequences=2, pgpe_pairs=1, hidden=8, algorithm="pgpe")
    policy, _ = train_forecast_placer(CFG, _square_jobs(6, 25, seed=52), _hybrid(), None, pcfg, advisor=guard)
    with torch.no_grad():  # follow the advisor wherever its action is allowed
        policy.ready(CFG).advice_bonus.fill_(pcfg.base_bonus + 50.0)
    saved = policy.save(tmp_path / "g.pt", "square", 50, "abc123")
    loaded = ForecastResidualPolicy(checkpoint=saved)
    assert isinstance(loaded.advisor_policy, ChargeAwarePeakPacking)
    assert (loaded.advisor_policy.n_ref, loaded.advisor_policy.levels) == (1.5, levels)
    # the levels' shared table is stored once and shared again after loading (so its kernel applies)
    tables = {id(r.forecaster.table) for r in loaded.advisor_policy.rules}
    assert len(tables) == 1 and [r.name for r in loaded.advisor_policy.rules] == [r.name for r in rules]
    assert [r.risk for r in loaded.advisor_policy.rules] == [r.risk for r in rules]
    spec = fp.base_spec(guard)
    assert "rule" in spec and "rules" not in spec
    # a rule that is not the shared table at another level is stored in full, and still loads
    other = fit_peak_quantiles(_square_jobs(4, 30, seed=32), CFG, levels=levels, min_count=5)
    mixed = replace(
        guard, rules=(*rules[:2], replace(rules[2], forecaster=other.forecaster(0.9, horizon=30)))
    )
    spec = fp.base_spec(mixed)
    assert "rules" in spec and "rule" not in spec
    assert fp.base_from_spec(spec).rules[2].forecaster.table.values.tolist() == other.values.tolist()
    test_jobs = _square_jobs(2, 25, seed=53)
    assert _same_actions(_actions(policy, test_jobs), _actions(loaded, test_jobs))
    assert _same_actions(_actions(loaded, test_jobs), _actions(guard, test_jobs))


def test_the_pipelines_advisor_setting_is_checked_by_name() -> None:
    ok = fp.PlacerTrainConfig(base="hybrid_observed", inputs="table", advisor="forecast_peak")
    assert ok.advisor == "forecast_peak"
    with pytest.raises(ValueError, match="advisor must be a fitted rule.*'tetris'"):
        fp.PlacerTrainConfig(base="hybrid_observed", inputs="table", advisor="tetris")
    with pytest.raises(ValueError, match="advisor 'forecast_peak' is the base rule itself"):
        fp.PlacerTrainConfig(advisor="forecast_peak")
    with pytest.raises(ValueError, match="advisor 'forecast_peak' is trained by PGPE.*'ppo'"):
        fp.PlacerTrainConfig(
            base="hybrid_observed",
            inputs="table",
            advisor="forecast_peak",
            placer=PlacerConfig(algorithm="ppo"),
        )


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pipeline_trains_with_and_without_the_advisor_and_publishes_the_better(
    tmp_path, monkeypatch, workers
) -> None:
    """`PlacerTrainConfig.advisor_choice`: both variants are trained on the same split (in turn, or at once with
    `variant_workers` 2) and the one with the better kept validation return is published (its checkpoint carries
    the advisor exactly when the advised one won)."""
    train = _square_jobs(10, 30, seed=54)
    settings = fp.PlacerTrainConfig(
        base="hybrid_observed",
        inputs="table",
        advisor="forecast_peak",
        advisor_choice=True,
        variant_workers=workers,
        tuning_preset="quick",
        placer=PlacerConfig(n_iterations=2, n_sequences=2, pgpe_pairs=2, hidden=8),
    )
    monkeypatch.setattr(placer_variants, "granted_cores", lambda: 2)
    said: list[str] = []
    path = tmp_path / "placer.pt"
    table = fp.train_and_publish(settings, CFG, train, path, ("square", 50, 0), "abc123", log=said.append)
    assert any(m.endswith(f"on {workers} workers") for m in said) == (workers == 2)
    chosen = [m for m in said if "publishing the" in m]
    assert len(chosen) == 1 and "without the advisor" in chosen[0]
    loaded = ForecastResidualPolicy(checkpoint=path)
    assert (loaded.advisor_policy is not None) == ("publishing the advised" in chosen[0])
    # the replay guard's candidates carry the advisor whichever variant was published
    assert [rule.name for rule in loaded.guard_rules] == ["forecast_peak"]
    assert table.height >= 1 and table["imitation_accuracy"][0] == 1.0
    with pytest.raises(ValueError, match="advisor_choice .* set advisor"):
        fp.PlacerTrainConfig(base="hybrid_observed", inputs="table", advisor_choice=True)


def _variants_case():
    train = _square_jobs(6, 25, seed=55)
    pcfg = PlacerConfig(n_iterations=3, n_sequences=2, pgpe_pairs=2, hidden=8, algorithm="pgpe", patience=10)
    return train, [Variant("plain", pcfg), Variant("advised", pcfg, _peak_rule())]


def _same_run(a, b) -> bool:
    """Two (policy, table, speed) of one variant: the same stage table but for its clock, the same kept iteration
    and the same network weights."""
    clock = ("seconds", "elapsed_s")
    same_table = a[1].drop(clock).equals(b[1].drop(clock), null_equal=True)
    wa, wb = a[0].ready(CFG).state_dict(), b[0].ready(CFG).state_dict()
    same_weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    return same_table and same_weights and a[2]["best_iteration"] == b[2]["best_iteration"]


def test_variants_trained_at_once_in_workers_are_those_trained_in_turn(monkeypatch) -> None:
    """`train_variants` with 2 workers returns, per variant, what training them one after another returns (the
    stage table but its clock, the kept iteration, the weights), in the variants' order; each worker's log lines
    reach the caller with its variant's label. A process granted one core trains them in turn and says so."""
    train, variants = _variants_case()
    in_turn = train_variants(CFG, train, _hybrid(), None, variants, workers=1)
    # as on the 2-core machine, whatever runs it
    monkeypatch.setattr(placer_variants, "granted_cores", lambda: 2)
    said: list[str] = []
    at_once = train_variants(CFG, train, _hybrid(), None, variants, workers=2, log=said.append)
    assert list(at_once) == ["plain", "advised"] == list(in_turn)
    for label in in_turn:
        assert _same_run(in_turn[label], at_once[label]), label
    assert not in_turn["plain"][1]["train_return"].is_nan().all()  # PG ran: the comparison covers its draws
    assert any(m.startswith("plain: pg 1:") for m in said) and any(
        m.startswith("advised: probe") for m in said
    )
    assert said[-1].startswith("2 variants trained in")
    monkeypatch.setattr(placer_variants, "granted_cores", lambda: 1)  # e.g. one of tvw-run's two runs at once
    said.clear()
    capped = train_variants(CFG, train, _hybrid(), None, variants, workers=2, log=said.append)
    assert said[0].startswith("training the variants in turn: this process is granted 1 core")
    assert not any(m.endswith("workers") for m in said)
    assert all(_same_run(capped[label], in_turn[label]) for label in in_turn)
    monkeypatch.setattr(placer_variants, "granted_cores", lambda: 2)
    monkeypatch.setattr(placer_variants, "may_start_processes", lambda: False)  # a daemonic process
    said.clear()
    train_variants(CFG, train, _hybrid(), None, variants, workers=2, log=said.append)
    assert said[0].startswith("training the variants in turn: this is a daemonic process")


def test_a_workers_failure_is_raised_with_its_type_and_variant(monkeypatch) -> None:
    """A variant whose training fails in a worker raises its own exception type in the caller, with the variant's
    label and the worker's traceback among its notes; bad arguments are refused by name."""
    train, (plain, _) = _variants_case()
    bad = Variant("bad", replace(plain.config, algorithm="reinforce"), _peak_rule())  # an advisor needs PGPE
    monkeypatch.setattr(placer_variants, "granted_cores", lambda: 2)
    with pytest.raises(ValueError, match="advisor .*PGPE") as err:
        train_variants(CFG, train, _hybrid(), None, [plain, bad], workers=2)
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert "variant 'bad'" in notes and "Traceback" in notes
    with pytest.raises(ValueError, match="no variants"):
        train_variants(CFG, train, _hybrid(), None, [], workers=2)
    with pytest.raises(ValueError, match="its own label"):
        train_variants(CFG, train, _hybrid(), None, [plain, plain], workers=2)
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        train_variants(CFG, train, _hybrid(), None, [plain], workers=0)
    with pytest.raises(ValueError, match="variant_workers must be an integer >= 1"):
        fp.PlacerTrainConfig(base="hybrid_observed", inputs="table", variant_workers=0)


def test_the_pipeline_binds_the_rule_action_set_to_forecast_peaks_level(tmp_path) -> None:
    """`train_and_publish` with action set "rule" and no advisor: `forecast_peak` is fitted to read its level,
    which the published checkpoint's config carries as `safe_level`, among its input levels."""
    settings = fp.PlacerTrainConfig(
        base="hybrid_observed",
        inputs="table",
        tuning_preset="quick",
        placer=PlacerConfig(n_iterations=1, n_sequences=2, pgpe_pairs=2, hidden=8, action_set="rule"),
    )
    said: list[str] = []
    path = tmp_path / "placer.pt"
    fp.train_and_publish(
        settings, CFG, _square_jobs(8, 25, seed=54), path, ("square", 50, 0), "abc", log=said.append
    )
    config = ForecastResidualPolicy(checkpoint=path).config
    assert config.action_set == "rule" and config.safe_level in config.levels
    assert any(f"machines safe at q{config.safe_level:g}" in m for m in said)


def test_the_pipeline_binds_rule_charge_to_the_fitted_guards_n_ref_or_says_it_is_off(tmp_path) -> None:
    """`train_and_publish` with `rule_charge` and the guard as advisor: the published config carries the fitted
    `forecast_peak_charge_guard`'s n_ref and the inputs' levels above the bound one, or rule_charge is off and the
    log says so (validation kept the hybrid for `forecast_peak`: no level to raise)."""
    settings = fp.PlacerTrainConfig(
        base="hybrid_observed",
        inputs="table",
        advisor="forecast_peak_charge_guard",
        tuning_preset="quick",
        placer=PlacerConfig(n_iterations=1, n_sequences=2, pgpe_pairs=2, hidden=8, rule_charge=True),
    )
    said: list[str] = []
    path = tmp_path / "placer.pt"
    fp.train_and_publish(
        settings, CFG, _square_jobs(8, 25, seed=54), path, ("square", 50, 0), "abc", log=said.append
    )
    loaded = ForecastResidualPolicy(checkpoint=path)
    config, guard = loaded.config, loaded.advisor_policy
    if config.rule_charge:
        assert config.charge_n_ref == pytest.approx(guard.n_ref) and config.safe_level == guard.level
        assert any("(rule_charge)" in m for m in said)
    else:
        assert config.charge_n_ref is None and any("rule_charge off" in m for m in said)


def test_a_validation_whose_actions_did_not_move_is_the_last_ones_episodes(monkeypatch) -> None:
    """`replay_greedy` gives the recorded rollout's entropy for the same network, None once an action moves; and
    training with it keeps the stage table of training that runs every validation's episodes (seconds aside),
    having replayed some of them."""
    train = _square_jobs(6, 25, seed=52)
    policy = ForecastResidualPolicy(base=_hybrid(), config=PlacerConfig(hidden=8), advisor=_peak_rule())
    log: list = []
    rec = fp.run_rollout(policy, CFG, train, 0, "greedy", np.random.default_rng(0), greedy_log=log)
    assert len(log) == rec.n_decisions
    assert fp.replay_greedy(policy, CFG, log, train.batch_size) == rec.entropy_sum
    with torch.no_grad():  # the advisor's bonus above the base's: the advisor's actions where they differ
        policy.ready(CFG).advice_bonus.fill_(PlacerConfig().base_bonus + 1.0)
    moved = fp.run_rollout(policy, CFG, train, 0, "greedy", np.random.default_rng(0))
    assert moved.imitation_accuracy < 1.0  # the check below can fail
    assert fp.replay_greedy(policy, CFG, log, train.batch_size) is None

    pcfg = PlacerConfig(n_iterations=4, n_sequences=2, pgpe_pairs=2, hidden=8, algorithm="pgpe", patience=10)
    speed: dict = {}
    _, replayed = train_forecast_placer(CFG, train, _hybrid(), None, pcfg, advisor=_peak_rule(), speed=speed)
    monkeypatch.setattr(fp, "replay_greedy", lambda *args: None)
    _, rerun = train_forecast_placer(CFG, train, _hybrid(), None, pcfg, advisor=_peak_rule())
    timing = ["seconds", "elapsed_s"]
    assert replayed.drop(timing).equals(rerun.drop(timing))
    assert speed["validations_replayed"] > 0


@pytest.mark.parametrize(("advisor", "kept"), [(_peak_rule, True), (lambda: make_policy("first_fit"), False)])
def test_the_advisors_start_is_probed_once_and_kept_only_where_validation_prefers_it(
    advisor, kept: bool
) -> None:
    """`PlacerConfig.advisor_probe`: an advised run validates the advisor's start (a "probe" row whose greedy
    actions are the advisor's where the two rules differ) and begins PG there exactly when its validation return
    beats the base's (no budget, `choice_z` 0): here the remaining-peak rule beats the hybrid and First-Fit does
    not. With the probe off there is no such row. The kept return names the start it came from."""
    train = _square_jobs(8, 25, seed=52)
    pcfg = PlacerConfig(
        n_iterations=1, n_sequences=2, pgpe_pairs=2, hidden=8, choice_z=0.0, overshoot_budget_pct=None
    )
    speed: dict = {}
    policy, table = train_forecast_placer(CFG, train, _hybrid(), None, pcfg, advisor=advisor(), speed=speed)
    assert table["stage"].to_list()[:2] == ["base", "probe"]
    base_row, probe_row = table.row(0, named=True), table.row(1, named=True)
    assert (
        probe_row["imitation_accuracy"] < 1.0
    )  # the probe follows the advisor where it differs from the base
    probed = probe_row["validation_return"] > base_row["validation_return"]
    assert probed == kept
    assert speed["start_stage"] == policy.start_stage == ("probe" if probed else "base")
    if policy.trained_iteration == 0:
        assert (
            fp.kept_return(table, 0, policy.start_stage)
            == (probe_row if probed else base_row)["validation_return"]
        )
        bonus = policy.ready(CFG).advice_bonus.item()
        assert bonus == (pytest.approx(2.0 * pcfg.base_bonus) if probed else 0.0)
    _, plain = train_forecast_placer(
        CFG, train, _hybrid(), None, replace(pcfg, advisor_probe=False), advisor=advisor()
    )
    assert "probe" not in plain["stage"].to_list()
    with pytest.raises(ValueError, match="no 'probe' row"):
        fp.kept_return(plain, 0, "probe")


def test_a_variant_within_the_overshoot_budget_beats_any_beyond_it() -> None:
    """`choose_variant` ranks variants as one run's keep rule ranks iterations: within the overshoot budget first,
    then the better kept validation return; a tie goes to the variant listed first; none is refused."""
    assert fp.choose_variant({"unadvised": (False, -5.7), "advised": (True, -6.3)}) == "advised"
    assert fp.choose_variant({"unadvised": (True, -5.7), "advised": (True, -6.3)}) == "unadvised"
    assert fp.choose_variant({"unadvised": (False, -5.7), "advised": (False, -6.3)}) == "unadvised"
    assert fp.choose_variant({"unadvised": (True, -1.0), "advised": (True, -1.0)}) == "unadvised"
    with pytest.raises(ValueError, match="no variants"):
        fp.choose_variant({})


def test_training_reports_whether_its_kept_iteration_is_within_the_budget() -> None:
    """The kept iteration's budget status reaches the policy and `speed`: True without a budget or where the base
    rule (the hybrid) stays within Tetris's overshoot, False where First-Fit as the base overshoots some 8 % on
    these square waves and one iteration does not bring it within Tetris's + 0 points."""
    train = _square_jobs(6, 25, seed=52)
    pcfg = PlacerConfig(n_iterations=1, n_sequences=2, pgpe_pairs=2, hidden=8)
    cases = ((_hybrid, None, True), (_hybrid, 0.0, True), (lambda: make_policy("first_fit"), 0.0, False))
    for base, budget, expected in cases:
        speed: dict = {}
        policy, _ = train_forecast_placer(
            CFG, train, base(), None, replace(pcfg, overshoot_budget_pct=budget), speed=speed
        )
        assert policy.kept_within_budget is expected and speed["kept_within_budget"] is expected
