"""`TuningConfig.machines_budget`: an operator's machines SLO over Tetris's validation machines, beside the
overshoot budget; and the batched count of machines used that validation reads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.metrics import episode_trace, machines_used, machines_used_per_episode
from sim.policies import make_policy, play
from sim.tuning import FitContext, TuningConfig

CFG = SimConfig(n_machines=10, max_steps=600)
NAMES = ("kube_default", "tetris", "first_fit", "best_fit", "deeprm_sjf")
TUNING = TuningConfig(fallbacks=NAMES)


@pytest.fixture(scope="module")
def train() -> JobBatch:
    """Requests that understate usage (1 CPU unit requested, 3-5 used, as the traces' own requests can): packing
    on requests overshoots, spreading (kube_default) avoids it with more machines."""
    rng = np.random.default_rng(0)
    sequences = []
    for s in range(8):
        jobs = []
        for i in range(12):
            cpu = rng.integers(3, 6, size=(int(rng.integers(8, 20)), 1))
            usage = np.concatenate([cpu, np.ones_like(cpu)], axis=1)
            jobs.append(
                {
                    "arrival_step": int(rng.integers(0, 30)),
                    "usage": usage.tolist(),
                    "ec_label": 0,
                    "request": [1, 1],
                    "workload_id": f"w{s}-{i}",
                }
            )
        sequences.append(jobs)
    return JobBatch.from_jobs(sequences)


def _choice(train: JobBatch, names, **knobs) -> tuple[dict, FitContext]:
    ctx = FitContext(cfg=CFG, train=train, tuning=replace(TUNING, **knobs))
    ctx.choose("rule", [({"heuristic": name}, make_policy(name)) for name in names])
    return ctx.choices["rule"], ctx


def test_machines_per_episode_equal_each_episodes_own_count(train) -> None:
    for name in ("kube_default", "tetris"):
        trace = core.make_trace(CFG, train.batch_size)
        state = play(make_policy(name), CFG, train, 0, trace)
        batched = machines_used_per_episode(state)
        one_by_one = [machines_used(episode_trace(trace, state, b)) for b in range(train.batch_size)]
        assert batched.tolist() == one_by_one and (batched > 0).all()


def test_a_machines_budget_keeps_the_best_return_within_tetris_machines(train) -> None:
    unbounded, free = _choice(train, NAMES)
    bounded, capped = _choice(train, NAMES, machines_budget=0.0)
    assert unbounded["machines_limit"] is None and unbounded["machines_budget_met"] is None
    limit = bounded["machines_limit"]
    tetris = next(t for t in bounded["tried"] if t["heuristic"] == "tetris")
    assert limit == pytest.approx(tetris["validation_machines"])
    # the budget binds: spreading has the best return, and more machines than Tetris
    assert unbounded["heuristic"] == "kube_default" and unbounded["validation_machines"] > limit
    within = [
        t
        for t in bounded["tried"]
        if t["validation_machines"] <= limit
        and t["validation_overshoot_pct"] <= bounded["overshoot_limit_pct"]
    ]
    assert bounded["machines_budget_met"] and bounded["validation_machines"] <= limit
    assert bounded["heuristic"] != "kube_default"
    assert bounded["validation_return"] == max(t["validation_return"] for t in within)
    # the fallback heuristic is chosen within the budget too
    assert free.fallback_choice()["fallback"] == "kube_default"
    assert capped.fallback_choice()["fallback"] in {t["heuristic"] for t in within}
    # without an overshoot budget the machines budget alone decides
    alone, _ = _choice(train, NAMES, machines_budget=0.0, overshoot_budget_pct=None)
    assert alone["overshoot_budget_met"] is None and alone["machines_budget_met"]
    assert alone["heuristic"] == bounded["heuristic"]  # the best return within Tetris's machines, as above
    # a budget as wide as the cluster lets the spreading rule back in
    loose, _ = _choice(train, NAMES, machines_budget=10.0)
    assert loose["heuristic"] == "kube_default" and loose["machines_budget_met"]


def test_where_no_candidate_meets_both_budgets_the_overshoot_budget_decides_and_says_so(train) -> None:
    # best_fit is within Tetris's machines but overshoots more than Tetris; kube_default the other way round
    chosen, _ = _choice(train, ("kube_default", "best_fit"), machines_budget=0.0, overshoot_budget_pct=0.0)
    assert chosen["heuristic"] == "kube_default"
    assert chosen["machines_budget_met"] is False and chosen["overshoot_budget_met"] is True
    with pytest.raises(ValueError, match="machines_budget"):
        TuningConfig(machines_budget=-1.0)
