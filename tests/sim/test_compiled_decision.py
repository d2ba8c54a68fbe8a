"""The compiled job pick and rule decision (`sim.compiled_decision`) decide exactly as the numpy path at every
decision of episodes over DeepRM's SJF, Packer and Tetris as fallbacks, "deviate" and "pack", tables with labels,
remaining life and the at-peak key, young jobs at their request, durations unknown, noise and every placement check; and step aside
where they do not apply."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import compiled_decision, core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.peak_forecast import fit_peak_quantiles
from sim.policies import Tetris, decide, make_policy
from sim.risk import PersistenceForecaster, RiskAwarePacking, RiskConfig

CASES = {
    "sjf_deviate_labels": (SimConfig(n_machines=4, max_steps=400), "deeprm_sjf", RiskConfig(level=0.75), {}),
    "packer_pack_remaining_noise": (
        SimConfig(n_machines=6, max_steps=400, noise_max_units=1, placement_check="request"),
        "deeprm_packer",
        RiskConfig(level=0.9, mode="pack"),
        dict(use_remaining=True, use_labels=False),
    ),
    "tetris_deviate_remaining": (
        SimConfig(n_machines=4, max_steps=400),
        "tetris",
        RiskConfig(level=0.75),
        dict(use_remaining=True),
    ),
    "sjf_pack_at_peak_remaining_noise": (
        SimConfig(n_machines=4, max_steps=400, noise_max_units=1),
        "deeprm_sjf",
        RiskConfig(level=0.9, mode="pack"),
        dict(use_remaining=True, use_at_peak=True),
    ),
    "tetris_pack_first_step_noise": (
        SimConfig(n_machines=5, max_steps=400, noise_max_units=1, placement_check="first_step"),
        "tetris",
        RiskConfig(level=0.9, mode="pack"),
        {},
    ),
    "sjf_young_no_durations_none": (
        SimConfig(n_machines=3, max_steps=400, placement_check="none", hold_rule="no_fit"),
        "deeprm_sjf",
        RiskConfig(level=0.75, mode="pack", min_observed=3, use_durations=False),
        {},
    ),
}


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_decision_decides_as_the_numpy_path(name, threads, monkeypatch, square_jobs, on_threads):
    cfg, fallback, risk, table_kw = CASES[name]
    calls = on_threads(threads, compiled_decision, "_pick_kernel_parallel", "_act_kernel_parallel")
    table = fit_peak_quantiles(
        square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9), min_count=3, **table_kw
    )
    rule = RiskAwarePacking(table.forecaster(risk.level, horizon=12), make_policy(fallback), risk, name="r")
    jobs = square_jobs(6, 30, seed=2)
    rng = np.random.default_rng(0)
    state = core.reset(cfg, jobs, 0)
    n_deviated = n_picked = 0
    while not state.is_done.all():
        picked = compiled_decision.deeprm_pick(cfg, state, rng.random((state.batch_size, cfg.queue_size)))
        assert picked is not None
        got = rule.act(cfg, state, rng)
        assert compiled_decision.risk_act(cfg, state, rule) is not None  # the kernel decided
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(got, rule.act(cfg, state, rng))
        fallback_actions = rule.fallback.act(cfg, state, rng)
        preference = rng.random((state.batch_size, cfg.queue_size))
        numpy_pick = rule.fallback.pick_job(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        assert np.array_equal(rule.fallback.pick_job(cfg, state, rng), numpy_pick)
        # any preference: the kernel's slot is the numpy pick's for it
        from sim.policies import _deeprm_pick

        kernel_slot = _deeprm_pick(cfg, state, preference)
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(kernel_slot, _deeprm_pick(cfg, state, preference))
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        n_deviated += int((got != fallback_actions).sum())
        n_picked += int((numpy_pick > 0).sum())
        state, act = decide(rule, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert all(n > 0 for n in calls.values())  # one span on the caller's side, one per thread on numba's
    assert n_deviated > 0 and n_picked > 0  # the rule left its fallback, the pick passed over the head


@pytest.mark.parametrize(
    ("mode", "floor", "amount"),
    [("deviate", 0.5, False), ("pack", 0.5, False), ("pack", 0.25, False), ("pack", 0.5, True)],
)
def test_the_rise_adapted_rule_decides_as_the_numpy_path(
    mode, floor, amount, monkeypatch, square_jobs
) -> None:
    """`forecast_peak_adaptive`'s form (`sim.rise_shift.ShiftAdaptedPeakForecaster`): each env's table row is
    its own adapted level (a floor below the median included, and the amount's factor,
    `forecast_peak_adaptive_amount`); the kernel decides as the numpy path while the envs' levels differ."""
    from sim.rise_shift import RiseRate, ShiftAdaptedPeakForecaster, fit_rise_amount

    cfg = SimConfig(n_machines=4, max_steps=400)
    levels = (0.25, 0.5, 0.6, 0.75, 0.9)
    train = square_jobs(12, 30, seed=1)
    table = fit_peak_quantiles(train, cfg, levels=levels, min_count=3)
    rate = RiseRate(hazard=0.05, events=1, exposure=20, prior_events=2.0)  # envs drift apart quickly
    forecaster = ShiftAdaptedPeakForecaster(
        table,
        rate,
        level=0.75,
        horizon=12,
        floor=floor,
        amount=fit_rise_amount(train, table, 0.75, prior_jobs=2.0) if amount else None,
    )
    rule = RiskAwarePacking(
        forecaster, make_policy("deeprm_sjf"), RiskConfig(level=0.75, mode=mode), name="r"
    )
    state = core.reset(cfg, square_jobs(6, 30, seed=2), 0)
    rng = np.random.default_rng(0)
    n_mixed = 0
    while not state.is_done.all():
        got = compiled_decision.risk_act(cfg, state, rule)
        assert got is not None
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(got, rule.act(cfg, state, rng))
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        now = forecaster.env_levels(state)
        assert (now >= floor).all()
        n_mixed += np.unique(now).size > 1
        state, act = decide(rule, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert n_mixed > 0


CHARGE_CASES = {
    "sjf_deviate_two_sided": ("deeprm_sjf", "deviate", False, dict(use_remaining=True)),
    "tetris_pack_raise_only": ("tetris", "pack", True, {}),
    "packer_pack_two_sided_labels": ("deeprm_packer", "pack", False, dict(use_labels=True)),
}


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(CHARGE_CASES))
def test_the_charge_aware_rule_decides_as_the_numpy_path(name, threads, monkeypatch, square_jobs, on_threads):
    """`forecast_peak_charge`'s form (`sim.charge_level.ChargeAwarePeakPacking`): each machine's jobs and the
    head at the machine's own level from the jobs running on it; the kernel decides as the numpy path while the
    machines of one env sit at different levels, and it is the kernel that decides."""
    from sim.charge_level import ChargeAwarePeakPacking

    fallback, mode, raise_only, table_kw = CHARGE_CASES[name]
    cfg = SimConfig(n_machines=5, max_steps=400)
    calls = on_threads(threads, compiled_decision, "_act_kernel_parallel")
    levels = (0.5, 0.75, 0.9, 0.95, 0.99)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=levels, min_count=3, **table_kw)
    rules = tuple(
        RiskAwarePacking(
            table.forecaster(lv, horizon=12),
            make_policy(fallback),
            RiskConfig(level=lv, mode=mode),
            name=f"r@{lv}",
        )
        for lv in levels
    )
    rule = ChargeAwarePeakPacking(
        rules, levels, level=0.9, n_ref=2.0, raise_only=raise_only, fallback=make_policy(fallback), mode=mode
    )
    state = core.reset(cfg, square_jobs(6, 30, seed=2), 0)
    rng = np.random.default_rng(0)
    n_mixed = n_deviated = 0
    while not state.is_done.all():
        got = compiled_decision.risk_act(cfg, state, rule)
        assert got is not None  # the kernel decided
        assert np.array_equal(got, rule.act(cfg, state, rng))
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(got, rule.act(cfg, state, rng))
        n_deviated += int((got != rule.fallback.act(cfg, state, rng)).sum())
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        index = rule.level_index(state, np.arange(state.batch_size))
        n_mixed += int((index.min(axis=1) != index.max(axis=1)).sum())
        state, act = decide(rule, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert all(n > 0 for n in calls.values())  # one span on the caller's side, one per thread on numba's
    assert n_mixed > 0 and n_deviated > 0


def test_a_charge_aware_rule_whose_levels_do_not_share_a_table_is_left_to_numpy(square_jobs) -> None:
    from sim.charge_level import ChargeAwarePeakPacking

    cfg = SimConfig(n_machines=4, max_steps=400)
    one = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9), min_count=3)
    other = fit_peak_quantiles(square_jobs(12, 30, seed=3), cfg, levels=(0.5, 0.75, 0.9), min_count=3)
    state = core.reset(cfg, square_jobs(2, 10, seed=3), 0)

    def charge(second_table, second_risk=None):
        second_risk = second_risk or RiskConfig(level=0.9)
        rules = (
            RiskAwarePacking(one.forecaster(0.75, horizon=12), make_policy("tetris"), RiskConfig(level=0.75)),
            RiskAwarePacking(second_table.forecaster(0.9, horizon=12), make_policy("tetris"), second_risk),
        )
        return ChargeAwarePeakPacking(
            rules, (0.75, 0.9), level=0.75, n_ref=2.0, fallback=make_policy("tetris")
        )

    assert compiled_decision.risk_act(cfg, state, charge(one)) is not None
    assert compiled_decision.risk_act(cfg, state, charge(other)) is None  # another table
    assert compiled_decision.risk_act(cfg, state, charge(one, RiskConfig(level=0.9, min_observed=2))) is None


HYBRID_CASES = {
    "packer_deviate_noise": (
        SimConfig(n_machines=4, max_steps=400, noise_max_units=1),
        "deeprm_packer",
        RiskConfig(min_observed=1),
    ),
    "best_fit_pack_young": (
        SimConfig(n_machines=4, max_steps=400),
        "best_fit",
        RiskConfig(mode="pack", min_observed=2),
    ),
    "first_fit_pack_no_durations": (
        SimConfig(n_machines=4, max_steps=400, noise_max_units=1),
        "first_fit",
        RiskConfig(mode="pack", use_durations=False),
    ),
    "tetris_pack_young_first_step": (
        SimConfig(n_machines=5, max_steps=400, placement_check="first_step"),
        "tetris",
        RiskConfig(mode="pack", min_observed=3),
    ),
    "sjf_deviate_request_check": (
        SimConfig(n_machines=3, max_steps=400, placement_check="request", hold_rule="no_fit"),
        "deeprm_sjf",
        RiskConfig(min_observed=2),
    ),
    "table_best_fit_pack": (
        SimConfig(n_machines=4, max_steps=400),
        "best_fit",
        RiskConfig(0.75, mode="pack"),
    ),
    "table_first_fit_pack": (
        SimConfig(n_machines=4, max_steps=400),
        "first_fit",
        RiskConfig(0.9, mode="pack"),
    ),
}


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(HYBRID_CASES))
def test_the_compiled_hybrid_and_usage_fallbacks_decide_as_numpy(
    name, threads, monkeypatch, square_jobs, on_threads
):
    """The rule kernel on the hybrid's forecaster (each running job's peak so far; its request while young or
    before anything is observed) and on the `BestFit` and `FirstFit` fallbacks gives `RiskAwarePacking.act`'s
    numpy actions, and the placer's fast hybrid path (`persistence_rule_act`) gives them too, at every decision."""
    from models.forecast_placer import persistence_rule_act

    cfg, fallback, risk = HYBRID_CASES[name]
    calls = on_threads(threads, compiled_decision, "_act_kernel_parallel")
    if name.startswith("table"):
        table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9), min_count=3)
        forecaster = table.forecaster(risk.level, horizon=12)
    else:
        forecaster = PersistenceForecaster(horizon=12)
    rule = RiskAwarePacking(forecaster, make_policy(fallback), risk, name="r")
    state = core.reset(cfg, square_jobs(6, 30, seed=2), 0)
    rng = np.random.default_rng(0)
    n_deviated = 0
    while not state.is_done.all():
        got = rule.act(cfg, state, rng)
        assert compiled_decision.risk_act(cfg, state, rule) is not None  # the kernel decided
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(got, rule.act(cfg, state, rng))
        if not name.startswith("table"):
            assert np.array_equal(got, persistence_rule_act(rule, cfg, state, rng))
        fallback_actions = rule.fallback.act(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        n_deviated += int((got != fallback_actions).sum())
        state, act = decide(rule, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert all(n > 0 for n in calls.values())  # one span on the caller's side, one per thread on numba's
    assert n_deviated > 0  # the rule left its fallback


def test_the_kernels_step_aside_where_they_do_not_apply(monkeypatch, square_jobs):
    cfg = SimConfig(n_machines=4, max_steps=400)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9), min_count=3)
    state = core.reset(cfg, square_jobs(2, 10, seed=3), 0)
    forecaster = table.forecaster(0.75, horizon=12)

    def rule(**kw):
        base = dict(forecaster=forecaster, fallback=make_policy("deeprm_sjf"), risk=RiskConfig(level=0.75))
        return RiskAwarePacking(**{**base, **kw}, name="r")

    assert compiled_decision.risk_act(cfg, state, rule()) is not None
    tetris = compiled_decision.risk_act(cfg, state, rule(fallback=make_policy("tetris")))
    by_default = compiled_decision.risk_act(cfg, state, rule(fallback=None))  # no fallback means Tetris
    assert tetris is not None and by_default is not None and np.array_equal(by_default, tetris)
    assert compiled_decision.risk_act(cfg, state, rule(fallback=make_policy("kube_default"))) is None
    hybrid = rule(forecaster=None, risk=RiskConfig())  # the hybrid's view
    assert compiled_decision.risk_act(cfg, state, hybrid) is not None
    now = PersistenceForecaster(horizon=12, statistic="now")
    assert compiled_decision.risk_act(cfg, state, rule(forecaster=now, risk=RiskConfig())) is None
    assert compiled_decision.risk_act(cfg, state, rule(risk=RiskConfig(level=0.75, mode="guard"))) is None
    assert compiled_decision.risk_act(cfg, state, rule(risk=RiskConfig(level=0.75, horizon=30))) is None
    negative = table.forecaster(0.75, horizon=12)
    negative = replace(negative, table=replace(table, values=table.values - 100.0))
    pack = RiskConfig(level=0.75, mode="pack")  # bounds every env ("deviate" has none to bound at reset)
    assert compiled_decision.risk_act(cfg, state, rule(forecaster=negative, risk=pack)) is None
    monkeypatch.setattr(compiled_decision, "ENABLED", False)
    assert compiled_decision.risk_act(cfg, state, rule()) is None
    assert compiled_decision.deeprm_pick(cfg, state, np.zeros((2, cfg.queue_size))) is None
    assert (
        compiled_decision.packer_pick(cfg, state) is None and compiled_decision.sjf_pick(cfg, state) is None
    )


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_the_compiled_tetris_pick_is_numpys(weight, monkeypatch, square_jobs):
    """`tetris_pick` gives `Tetris.pick_job`'s numpy slot at every decision of episodes (noise, the first-step
    placement check, and with the 1 / duration term, which then changes some picks)."""
    cfg = SimConfig(n_machines=3, max_steps=400, noise_max_units=1, placement_check="first_step")
    policy = Tetris(short_job_weight=weight)
    state = core.reset(cfg, square_jobs(6, 30, seed=4), 0)
    rng = np.random.default_rng(0)
    n_checked = n_passed_over = n_weighted = 0
    while not state.is_done.all():
        got = policy.pick_job(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        want = policy.pick_job(cfg, state, rng)
        unweighted = Tetris().pick_job(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        assert np.array_equal(got, want)
        n_checked += 1
        n_passed_over += int((want > 0).sum())
        n_weighted += int((want != unweighted).sum())
        state, act = decide(policy, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert n_checked > 20 and n_passed_over > 0
    assert (n_weighted > 0) == (weight > 0)


@pytest.mark.parametrize("n_resources", [1, 3, 8])
@pytest.mark.parametrize("name", ["deeprm_packer", "deeprm_sjf", "tetris"])
def test_the_compiled_picks_are_numpys_for_any_number_of_resources(name, n_resources, monkeypatch) -> None:
    """Packer's, SJF's and Tetris' compiled picks give the numpy path's slots at every decision with 1 and 3
    resources; from 8 on (numpy then sums the resources in its pairwise order) Packer and Tetris step aside to it."""
    cfg = SimConfig(n_machines=3, capacity_units=(8,) * n_resources, max_steps=200)
    rng = np.random.default_rng(n_resources)
    sequences = [
        [
            dict(
                arrival_step=int(rng.integers(0, 6)),
                usage=rng.integers(1, 4, size=(int(rng.integers(2, 9)), n_resources)).tolist(),
                request=rng.integers(3, 6, size=n_resources).tolist(),
                ec_label=0,
            )
            for _ in range(24)
        ]
        for _ in range(4)
    ]
    policy = make_policy(name)
    state = core.reset(cfg, JobBatch.from_jobs(sequences, n_resources), 0)
    compiled = {"deeprm_packer": compiled_decision.packer_pick, "deeprm_sjf": compiled_decision.sjf_pick}
    n_checked = n_passed_over = 0
    while not state.is_done.all():
        got = policy.pick_job(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        want = policy.pick_job(cfg, state, rng)
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        assert np.array_equal(got, want)
        kernel = (
            compiled[name](cfg, state)
            if name in compiled
            else compiled_decision.tetris_pick(cfg, state, np.zeros((state.batch_size, cfg.queue_size)))
        )
        assert (kernel is None) == (n_resources == 8 and name != "deeprm_sjf")
        n_checked += 1
        n_passed_over += int((want > 0).sum())
        state, act = decide(policy, cfg, state, rng)
        state, *_ = core.step(cfg, state, act)
    assert n_checked > 20 and n_passed_over > 0  # some picks passed over the head


def test_a_given_preference_must_cover_every_env_and_slot(square_jobs) -> None:
    cfg = SimConfig(n_machines=3, max_steps=100)
    state = core.reset(cfg, square_jobs(2, 5, seed=0), 0)
    with pytest.raises(ValueError, match="preference of shape"):
        compiled_decision.deeprm_pick(cfg, state, np.zeros((1, cfg.queue_size)))


def test_peak_cells_are_the_tables_own_peak_index_and_kept_with_the_summaries(square_jobs):
    """`peak_cells` (what the kernels read in place of the peak so far and the profile) is the index the numpy
    look-up finds for every job, age and resource, both at-peak halves used; a keyed table on summaries without the
    at-peak flag is refused by name; a selection of the batch reads the same cells."""
    from sim.jobs import ObservedPrefix

    cfg = SimConfig(n_machines=4, max_steps=400)
    train = square_jobs(12, 30, seed=1)
    keyed = fit_peak_quantiles(train, cfg, levels=(0.5, 0.9), min_count=3, use_at_peak=True)
    plain = fit_peak_quantiles(train, cfg, levels=(0.5, 0.9), min_count=3)
    jobs = square_jobs(6, 30, seed=2)
    prefix = jobs.observed_prefix[0]
    peak = prefix.peak.astype(np.float64)
    n_p = keyed.n_peak
    p_idx = np.where(np.isfinite(peak) & (peak >= 0), np.clip(np.nan_to_num(peak), 0, n_p - 2) + 1, 0)
    p_idx = p_idx.astype(np.int64)
    with np.errstate(invalid="ignore"):
        at_peak = jobs.usage.astype(np.float64) >= peak  # the numpy path's `observed_at_peak`, at every age
    zero = np.zeros_like(p_idx)
    for table, flags in ((keyed, at_peak), (plain, None)):
        _, want, *_ = table._cell(zero, p_idx, zero, zero, zero + 1, flags)
        got = compiled_decision.peak_cells(prefix, compiled_decision.levels_last(table.values))
        assert got.dtype == np.int16 and np.array_equal(got, want)
    got = compiled_decision.peak_cells(prefix, compiled_decision.levels_last(keyed.values))
    assert (got >= n_p).any() and ((got > 0) & (got < n_p)).any()  # jobs at their peak and jobs below it
    assert np.array_equal(prefix.at_peak, at_peak)

    bare = replace(ObservedPrefix.of(jobs.usage), at_peak=None)
    with pytest.raises(ValueError, match="at_peak"):
        compiled_decision.peak_cells(bare, compiled_decision.levels_last(keyed.values))
    chosen = jobs.select(np.array([2, 0]))  # shares the summaries, so the cells built for them
    assert (
        compiled_decision.peak_cells(chosen.observed_prefix[0], compiled_decision.levels_last(keyed.values))
        is got
    )
    assert len(prefix.derived) == 2  # one per table shape
