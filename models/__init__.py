"""Learners: neural nets and their training loops, runnable without Dagster.

Importing the package registers its learned schedulers in `sim.policies.POLICIES` (sim names no models module:
the arrow points from models to sim). A policy's module is imported when the policy is first built, so
`import models` stays cheap.
"""

from importlib import import_module

from sim.policies import register_fitted, register_learned
from sim.risk import MachinePeakPacking

LEARNED_POLICIES = {
    "dejavu": ("models.dejavu", "DejavuPolicy"),
    "tvw_rl": ("models.tvw_rl", "TvwRlPolicy"),
    "deeprm_rl": ("models.deeprm", "DeepRMAgentPolicy"),
    "forecast_residual_rl": ("models.forecast_placer", "ForecastResidualPolicy"),
    "forecast_residual_rl_replay": ("models.placer_guard", "guarded_placer"),
}
"""Learned policy name -> (module, class or factory) of its scheduler; it takes `checkpoint` (a trained file or
None). `forecast_residual_rl_replay` is `forecast_residual_rl`'s trained file guarded by replays
(`models.learned.TRAINED_AS`)."""


def _factory(module: str, class_name: str):
    def build(checkpoint=None, **kwargs):
        return getattr(import_module(module), class_name)(checkpoint=checkpoint, **kwargs)

    build.__qualname__ = f"{module}.{class_name}"
    return build


for _name, (_module, _class) in LEARNED_POLICIES.items():
    register_learned(_name, _factory(_module, _class))


FITTED_RULES = {
    "forecast_machine_peak": {"use_labels": True},
    "forecast_machine_peak_noec": {"use_labels": False},
}
"""Rules on a forecaster of this package, fitted per (source, load) (`sim.policies.fitted_policy`, kind "forecast"):
name -> keywords of `models.machine_forecast.fit_machine_peak_rule` (`_noec`: without EC labels, the measured
value of ECs to the machine's forecast)."""


def _fitted_rule(name: str, keywords: dict):
    def fit(ctx):
        return import_module("models.machine_forecast").fit_machine_peak_rule(ctx, name, **keywords)

    fit.__name__ = f"fit_{name}"
    return fit


for _name, _keywords in FITTED_RULES.items():
    register_fitted(
        _name,
        lambda _n=_name, **kw: MachinePeakPacking(name=_n, **kw),
        _fitted_rule(_name, _keywords),
        "forecast",
    )
