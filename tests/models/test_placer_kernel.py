"""The compiled placer inputs (`models.placer_kernel`) equal the numpy path's (`placement_features(...,
compiled=False)` from a fresh count) to the bit at every decision of rollouts over tables with and without labels
and remaining life, served labels, noise and M = 10; within float rounding of the numpy path's carried sums; and
the kernel steps aside (None) where it does not apply."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from models import placer_kernel
from models.forecast_placer import PlacerConfig, feature_names, placement_features
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.peak_forecast import RemainingPeakQuantiles, fit_peak_quantiles
from sim.policies import make_policy
from sim.risk import PersistenceForecaster, RiskAwarePacking, RiskConfig
from sim.running_sums import RunningSums

CASES = {
    "labels_m4": (SimConfig(n_machines=4, max_steps=400), dict(use_labels=True), False),
    "remaining_m10_noise": (
        SimConfig(n_machines=10, capacity_units=(10, 10), max_steps=400, noise_max_units=1, history_steps=7),
        dict(use_labels=False, use_remaining=True),
        False,
    ),
    "served_labels_no_durations": (SimConfig(n_machines=4, max_steps=400), dict(use_labels=True), True),
    "at_peak_remaining_served": (
        SimConfig(n_machines=5, max_steps=400, noise_max_units=1),
        dict(use_labels=True, use_remaining=True, use_at_peak=True),
        True,
    ),
}


def decisions(cfg: SimConfig, jobs: JobBatch, serve: bool, seed: int = 0):
    """States of a random-valid-action rollout (each decision's state, served labels where asked), with a base
    action and mask per decision."""
    rng = np.random.default_rng(seed)
    state = core.reset(cfg, jobs, seed)
    while not state.is_done.all():
        mask = core.action_mask(cfg, state)
        seen = (
            core.relabel(cfg, state, rng.integers(0, 4, size=state.jobs.ec_label.shape)) if serve else state
        )
        scores = rng.random(mask.shape) * mask
        scores[:, -1] *= 0.2
        actions = scores.argmax(axis=1)
        yield seen, actions, mask
        state, *_ = core.step(cfg, state, actions, mask=mask)


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_features_equal_the_numpy_path(name, threads, square_jobs, on_threads):
    cfg, table_kw, serve = CASES[name]
    calls = on_threads(threads, placer_kernel, "placer_features_kernel_parallel")
    table = fit_peak_quantiles(
        square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.9, 0.99), min_count=3, **table_kw
    )
    forecaster = RemainingPeakQuantiles(table, horizon=12)
    pcfg = PlacerConfig(use_durations=not serve, horizon=8 if serve else None)
    jobs = square_jobs(5, 25, seed=2)
    carried = RunningSums()
    n_checked = 0
    for seen, base, mask in decisions(cfg, jobs, serve):
        x, g = placement_features(cfg, seen, forecaster, pcfg, base, mask)
        ref_x, ref_g = placement_features(cfg, seen, forecaster, pcfg, base, mask, compiled=False)
        assert x.dtype == ref_x.dtype == np.float32 and x.shape == ref_x.shape
        assert x.shape[2] == len(feature_names(pcfg, cfg.n_resources))
        live = ~seen.is_done  # a finished env's row is zeros (no decision reads it)
        assert not x[~live].any() and not g[~live].any()
        assert np.array_equal(x[live], ref_x[live]) and np.array_equal(g[live], ref_g[live])
        every = placer_kernel.features(cfg, seen, forecaster, pcfg.levels, 1.0, pcfg.use_durations, 8 if serve else 12, base, mask)  # fmt: skip
        assert np.array_equal(every[0], ref_x) and np.array_equal(every[1], ref_g)
        if (
            not serve
        ):  # labels drawn afresh at every decision break the carry's premise (a label by job and age)
            carried_x, _ = placement_features(
                cfg, seen, forecaster, pcfg, base, mask, carried, compiled=False
            )
            np.testing.assert_allclose(x[live], carried_x[live], rtol=1e-6, atol=1e-7)
        n_checked += 1
    assert n_checked > 20
    assert calls["placer_features_kernel_parallel"] > 0  # one span, or one per thread
    assert serve or carried.n_carried > 0  # the carried comparison did carry


DECIDE_CASES = {
    "sjf_deviate_labels": (SimConfig(n_machines=4, max_steps=400), "deeprm_sjf", RiskConfig(level=0.75), {}, False),
    "packer_pack_remaining_noise_no_fit_m3": (
        SimConfig(
            n_machines=3, capacity_units=(8, 8), max_steps=400, noise_max_units=1, placement_check="request",
            hold_rule="no_fit",
        ),
        "deeprm_packer",
        RiskConfig(level=0.9, mode="pack"),
        dict(use_remaining=True, use_labels=False),
        False,
    ),
    "tetris_deviate_first_step_served": (
        SimConfig(n_machines=4, max_steps=400, placement_check="first_step"),
        "tetris",
        RiskConfig(level=0.75),
        dict(use_remaining=True),
        True,
    ),
    "sjf_pack_at_peak_served": (
        SimConfig(n_machines=4, max_steps=400),
        "deeprm_sjf",
        RiskConfig(level=0.9, mode="pack"),
        dict(use_remaining=True, use_at_peak=True),
        True,
    ),
    "sjf_young_served_none": (
        SimConfig(n_machines=3, max_steps=400, placement_check="none"),
        "deeprm_sjf",
        RiskConfig(level=0.75, mode="pack", min_observed=3, use_durations=False),
        {},
        True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("name", sorted(DECIDE_CASES))
def test_one_decision_kernel_equals_its_pieces(name, threads, square_jobs, on_threads):
    """`placer_kernel.decide` gives the rule's actions, `core.action_mask` and the inputs for them at every
    decision, the same arrays the pieces give one by one (the numpy rule and mask included)."""
    cfg, fallback, risk, table_kw, serve = DECIDE_CASES[name]
    calls = on_threads(threads, placer_kernel, "decide_kernel_parallel")
    table = fit_peak_quantiles(
        square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3, **table_kw
    )
    rule = RiskAwarePacking(table.forecaster(risk.level, horizon=12), make_policy(fallback), risk, name="r")
    # an advisor decided by the same kernel: the hybrid over another fallback
    advisor = RiskAwarePacking(
        PersistenceForecaster(horizon=12), make_policy("best_fit"), RiskConfig(), name="a"
    )
    forecaster = RemainingPeakQuantiles(table, horizon=12)
    levels = (0.5, 0.9, 0.99)
    n_checked = n_invalid = 0
    holds = set()
    for seen, _, _ in decisions(cfg, square_jobs(5, 25, seed=2), serve):
        base, mask, x, g, advice = placer_kernel.decide(
            cfg, seen, rule, forecaster, levels, 1.0, risk.use_durations, 8, advisor
        )
        assert np.array_equal(advice, advisor.act(cfg, seen, np.random.default_rng(0)))
        ref_base = rule.act(cfg, seen, np.random.default_rng(0))
        ref_mask = core.action_mask(cfg, seen)
        ref_x, ref_g = placement_features(
            cfg, seen, forecaster, PlacerConfig(levels=levels, use_durations=risk.use_durations, horizon=8),
            ref_base, ref_mask, compiled=False,
        )  # fmt: skip
        live = ~seen.is_done
        assert np.array_equal(base, ref_base) and np.array_equal(mask, ref_mask)
        assert not x[~live].any() and not g[~live].any()
        assert np.array_equal(x[live], ref_x[live]) and np.array_equal(g[live], ref_g[live])
        n_invalid += int((~mask[live, :-1]).sum())
        holds.update(mask[:, -1].tolist())
        n_checked += 1
    assert n_checked > 20 and (n_invalid > 0 or cfg.placement_check == "none")  # machines the head misfits
    assert holds == ({True, False} if cfg.hold_rule == "no_fit" else {True})
    assert calls["decide_kernel_parallel"] > 0  # one span, or one per thread


@pytest.mark.parametrize("threads", ["caller", "numba"])
def test_a_charge_aware_advisor_is_decided_in_the_same_kernel(threads, monkeypatch, square_jobs, on_threads):
    """A `forecast_peak_charge_guard`-kind advisor (a level per machine, `sim.charge_level`) gets its actions from
    `decide`'s one kernel, and they are its numpy path's at every decision."""
    from sim import compiled_decision
    from sim.charge_level import ChargeAwarePeakPacking

    cfg = SimConfig(n_machines=5, max_steps=400)
    calls = on_threads(threads, placer_kernel, "decide_kernel_parallel")
    levels = (0.5, 0.75, 0.9, 0.95, 0.99)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=levels, min_count=3)
    rule = RiskAwarePacking(
        table.forecaster(0.9, horizon=12), make_policy("tetris"), RiskConfig(0.9), name="r"
    )
    rules = tuple(
        replace(rule, forecaster=table.forecaster(lv, horizon=12), risk=RiskConfig(lv)) for lv in levels
    )
    advisor = ChargeAwarePeakPacking(
        rules, levels, level=0.9, n_ref=2.0, raise_only=True, fallback=make_policy("tetris")
    )
    forecaster = RemainingPeakQuantiles(table, horizon=12)
    n_checked = 0
    for seen, _, _ in decisions(cfg, square_jobs(5, 25, seed=2), False):
        advice = placer_kernel.decide(cfg, seen, rule, forecaster, (0.5, 0.9), 1.0, True, 8, advisor)[4]
        assert advice is not None  # decided in the kernel, not asked on its own
        monkeypatch.setattr(compiled_decision, "ENABLED", False)
        assert np.array_equal(advice, advisor.act(cfg, seen, np.random.default_rng(0)))
        monkeypatch.setattr(compiled_decision, "ENABLED", True)
        n_checked += 1
    assert n_checked > 20 and calls["decide_kernel_parallel"] > 0


def test_one_decision_kernel_steps_aside(square_jobs):
    """`decide` gives None where the rule's kernel or the inputs' kernel does not apply, or a look-up is negative."""
    cfg = SimConfig(n_machines=4, max_steps=400)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.75, 0.9, 0.99), min_count=3)
    state = core.reset(cfg, square_jobs(2, 10, seed=3), 0)
    rule = RiskAwarePacking(
        table.forecaster(0.75, horizon=12), make_policy("deeprm_sjf"), RiskConfig(0.75), name="r"
    )

    inputs = RemainingPeakQuantiles(table, horizon=12)

    def decide(rule=rule, forecaster=inputs, rho=1.0):
        return placer_kernel.decide(cfg, state, rule, forecaster, (0.5, 0.9), rho, True, 12)

    assert decide() is not None and decide()[4] is None  # no advisor, no advice
    now = RiskAwarePacking(PersistenceForecaster(horizon=12, statistic="now"), None, RiskConfig(), name="a")
    with_now = placer_kernel.decide(cfg, state, rule, inputs, (0.5, 0.9), 1.0, True, 12, now)
    assert with_now is not None and with_now[4] is None  # an advisor the kernel cannot run: asked on its own
    assert decide(rho=0.5) is None
    assert decide(forecaster=PersistenceForecaster(horizon=12)) is None
    assert decide(rule=replace(rule, risk=RiskConfig(level=0.75, mode="guard"))) is None
    assert decide(rule=replace(rule, fallback=make_policy("kube_default"))) is None
    assert (
        decide(forecaster=RemainingPeakQuantiles(replace(table, values=table.values - 100.0), horizon=12))
        is None
    )


def test_the_kernel_steps_aside_where_it_does_not_apply(square_jobs):
    cfg = SimConfig(n_machines=4, max_steps=400)
    table = fit_peak_quantiles(square_jobs(12, 30, seed=1), cfg, levels=(0.5, 0.9, 0.99), min_count=3)
    jobs = square_jobs(2, 10, seed=3)
    state = core.reset(cfg, jobs, 0)
    mask = core.action_mask(cfg, state)
    base = np.zeros(jobs.batch_size, dtype=np.int64)

    def compiled(forecaster, levels=(0.5, 0.9, 0.99), rho=1.0):
        return placer_kernel.features(cfg, state, forecaster, levels, rho, True, 12, base, mask)

    assert compiled(RemainingPeakQuantiles(table, horizon=12)) is not None
    assert compiled(RemainingPeakQuantiles(table, horizon=12), rho=0.5) is None
    assert compiled(RemainingPeakQuantiles(table, horizon=12), levels=(0.5, 0.95)) is None  # not fitted
    assert compiled(PersistenceForecaster(horizon=12)) is None
    negative = RemainingPeakQuantiles(replace(table, values=table.values - 100.0), horizon=12)
    assert compiled(negative) is None  # a negative look-up: the numpy path's general branch decides
    pcfg = PlacerConfig()
    x, _ = placement_features(cfg, state, negative, pcfg, base, mask)
    ref, _ = placement_features(cfg, state, negative, pcfg, base, mask, compiled=False)
    assert np.array_equal(x, ref)


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("horizon", [3, 30, 64, 99, 250])
@pytest.mark.parametrize("rho", [1.0, 0.5])
def test_level_columns_are_numpys_max_and_mean_to_the_bit(horizon, rho, threads, on_threads) -> None:
    """`level_columns` against the numpy expressions it replaces, at horizons whose H x D shares numpy sums with
    one running sum, 8 partial sums, and halves (past 128 terms, twice past 256)."""
    from sim import compiled_planes
    from sim.compiled_planes import level_columns

    calls = on_threads(threads, compiled_planes, "_level_columns_parallel")
    rng = np.random.default_rng(horizon)
    n_levels = 3
    n_p = 1 + (n_levels - 1) * (2 if rho != 1.0 else 1)
    acc = rng.random((4, 5, n_p, horizon, 2)) * 10.0 ** rng.integers(-2, 3, size=(4, 5, 1, 1, 1))
    head = rng.random((4, n_p, horizon, 2))
    acc[0, 0, 0, 1, 1] = np.nan  # a NaN share: numpy's max and mean keep it
    cap = np.array([8.0, 6.0])
    got = level_columns(acc, head, n_levels, rho, cap)
    with_head = acc + head[:, None]
    want = []
    for li in range(n_levels):
        for sums in (acc, with_head):
            if li == 0:
                bound = sums[:, :, 0]
            elif rho == 1.0:
                bound = sums[:, :, 0] + sums[:, :, li]
            else:
                s_d, s_d2 = sums[:, :, li], sums[:, :, n_levels + li - 1]
                bound = sums[:, :, 0] + np.sqrt(rho * s_d**2 + (1.0 - rho) * s_d2)
            share = bound / cap
            want += [share.max(axis=(2, 3)), share.mean(axis=(2, 3))]
        want.append((want[-2] <= 1.0 + 1e-9).astype(np.float64))
    assert np.isnan(got[0, 0, 0])
    assert got.tobytes() == np.stack(want).tobytes()
    assert calls["_level_columns_parallel"] == (1 if threads == "numba" else 0)
    skip = np.array([False, True, False, True])  # finished envs: zeros, the others' columns unchanged
    skipped = level_columns(acc, head, n_levels, rho, cap, skip)
    assert not skipped[:, skip].any()
    assert skipped[:, ~skip].tobytes() == got[:, ~skip].tobytes()
