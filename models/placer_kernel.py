"""The learned placer's inputs (`models.forecast_placer.placement_features`) as one numba kernel over the envs, for
the inputs training uses by default: a remaining-peak quantile table (`sim.peak_forecast.RemainingPeakQuantiles`,
`PlacerTrainConfig.inputs = "rule"`) at rho = 1 (issue 22, item 8: the second compiled piece of the training
loop, after `sim.compiled_step`).

Per env the kernel walks the jobs in index order: a running job's levels are looked up in the table from its
request, its peak so far (the batch's `ObservedPrefix`), its age bucket, the label the state shows and, where the
table is keyed by them, its remaining life and whether its usage at its last observed step is its peak so far,
exactly as `RemainingPeakQuantiles.flat_levels` looks them up (the peak so far and the at-peak flag folded into
one index per job, age and resource beforehand: `sim.compiled_decision.peak_cells`); each level's
bound (the level's value, at least the median) is added to its machine's sums at t + 1 and over the steps it is
alive, in job order (the order `np.bincount` adds them in); then the queue head's row, the other per-machine inputs
(usage now, the history's mean and max, requests, time left, the head's request and median) and the global ones,
in `feature_names` order. Every number is the one the numpy path computes from a fresh count (the same float
operations in the same order; the float32 history mean is a float32 sum in row order over h, as numpy reduces a
non-innermost axis), so the features are equal to the bit; from a count carried between decisions
(`sim.running_sums`) the numpy sums may differ from these in the last bit.

Each span of envs' inputs is one body (`_placer_envs`), run on numba's threads for a large batch
(`sim.compiled_step.on_threads`): the same numbers either way.

`features` returns None where the kernel does not apply (another forecaster, rho != 1, a level the table lacks,
more than `SEQUENTIAL_SUM_MAX` resources) or where a looked-up value is negative (the numpy path then takes its
general branch, as it does itself); the caller then runs the numpy path. The kernel itself is
`sim.compiled_decision.placer_features_kernel_parallel`, in the file of the table look-up it inlines (numba's
cache notices changes to its own file only). Tests: tests/models/test_placer_kernel.py.
"""

from __future__ import annotations

import numpy as np

from sim.compiled_decision import (
    AGE_EDGE_ARRAY,
    REMAINING_EDGE_ARRAY,
    SEQUENTIAL_SUM_MAX,
    decide_kernel_parallel,
    levels_last,
    noise_args,
    placer_features_kernel_parallel,
    prefix_args,
    risk_act_args,
)
from sim.compiled_step import launch, on_threads
from sim.config import SimConfig
from sim.core import State, observed_labels
from sim.forecast import find_level
from sim.peak_forecast import RemainingPeakQuantiles


def level_rows(forecaster, levels) -> np.ndarray | None:
    """The table's level index of each of `levels`, or None where the kernel does not apply (module docstring)."""
    if type(forecaster) is not RemainingPeakQuantiles:
        return None
    rows = [find_level(forecaster.table.levels, lv) for lv in levels]
    if any(row is None for row in rows):
        return None  # the numpy path raises its own error
    return np.asarray(rows, dtype=np.int64)


def features(
    cfg: SimConfig,
    state: State,
    forecaster,
    levels: tuple[float, ...],
    rho: float,
    use_durations: bool,
    horizon: int,
    base_actions: np.ndarray,
    mask: np.ndarray,
    skip_done: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(x (B, M, F) float32, g (B, G) float32) as `placement_features` gives them, or None (module docstring);
    `skip_done`: the rows of envs whose episode has ended are zeros (a rollout reads only the others)."""
    made = feature_args(
        cfg, state, forecaster, levels, rho, use_durations, horizon, base_actions, mask, skip_done
    )
    if made is None:
        return None
    args, x, g = made
    _, _, n_m, n_d = state.timeline.shape
    threaded = on_threads(state.batch_size)
    ok = launch(placer_features_kernel_parallel, threaded, args, state.batch_size, n_m, len(levels), n_d)
    return (x, g) if ok else None


def feature_args(
    cfg: SimConfig,
    state: State,
    forecaster,
    levels: tuple[float, ...],
    rho: float,
    use_durations: bool,
    horizon: int,
    base_actions: np.ndarray,
    mask: np.ndarray,
    skip_done: bool,
) -> tuple[tuple, np.ndarray, np.ndarray] | None:
    """(the arguments of `_placer_envs` after its span, scratch and job list, x, g: the new arrays they write), or
    None where the kernel does not apply (`features`)."""
    rows = level_rows(forecaster, levels) if rho == 1.0 else None
    if rows is None or cfg.n_resources > SEQUENTIAL_SUM_MAX:  # the inputs' means sum over the resources
        return None
    table = forecaster.table
    values = levels_last(table.values)
    jobs = state.jobs
    n_envs = state.batch_size
    n_m, n_d, n_levels = cfg.n_machines, cfg.n_resources, len(levels)
    n_x = n_levels * 5 + 6 * n_d + 5  # feature_names: 5 per level, six D-wide inputs and five single ones
    x = np.empty((n_envs, n_m, n_x), dtype=np.float32)
    g = np.empty((n_envs, 5), dtype=np.float32)
    args = (
        state.t,
        state.next_job,
        state.n_arrived,
        state.is_done,
        state.job_machine,
        state.job_start,
        state.busy_until,
        state.timeline,
        *noise_args(state),
        state.past,
        jobs.duration,
        jobs.request,
        observed_labels(state),
        *prefix_args(jobs, values),
        values,
        rows,
        table.use_labels,
        table.use_remaining,
        AGE_EDGE_ARRAY,
        REMAINING_EDGE_ARRAY,
        np.asarray(cfg.capacity_units, dtype=np.float64),
        int(cfg.queue_size),
        int(horizon),
        bool(use_durations),
        int(max(jobs.max_duration, 1)),
        np.asarray(base_actions, dtype=np.int64),
        mask,
        skip_done,
        x,
        g,
    )
    return args, x, g


def decide(
    cfg: SimConfig,
    state: State,
    rule,
    forecaster,
    levels: tuple[float, ...],
    rho: float,
    use_durations: bool,
    horizon: int,
    advisor=None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(base (B,) int64, mask (B, M + 1) bool, x, g, advice) of one rollout decision in one kernel over the envs:
    the base rule's actions (`rule`, a `sim.risk.RiskAwarePacking` as `sim.compiled_decision.risk_act` runs it),
    the valid actions (`sim.core.action_mask`), the inputs `features(skip_done=True)` gives for them and, with an
    `advisor` (another `RiskAwarePacking`), its actions (B,) int64, or None where it has none or the rule kernel
    does not apply to it (the caller then asks the advisor itself). None where either kernel does not apply to the
    base, or where a looked-up value is negative: the caller then runs the pieces one by one, which give the same
    arrays. Tests: tests/models/test_placer_kernel.py."""
    n_envs = state.batch_size
    base = np.zeros(n_envs, dtype=np.int64)
    act_args = risk_act_args(cfg, state, rule, base)
    if act_args is None:
        return None
    mask = np.empty((n_envs, cfg.n_machines + 1), dtype=bool)
    made = feature_args(cfg, state, forecaster, levels, rho, use_durations, horizon, base, mask, True)
    if made is None:
        return None
    placer_args, x, g = made
    advice = None if advisor is None else np.zeros(n_envs, dtype=np.int64)
    advice_args = None if advisor is None else risk_act_args(cfg, state, advisor, advice)
    if advice_args is None:
        advice = None
    hold_always = cfg.hold_rule == "always"
    advice_in = act_args if advice_args is None else advice_args
    ok = launch(
        decide_kernel_parallel, on_threads(n_envs), act_args, placer_args, advice_in, advice is not None,
        cfg.n_resources, len(levels), hold_always, mask,
    )  # fmt: skip
    return (base, mask, x, g, advice) if ok else None
