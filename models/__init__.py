"""Learners: neural nets and their training loops, runnable without Dagster.

Importing the package registers its learned schedulers in `sim.policies.POLICIES` (sim names no models module:
the arrow points from models to sim). A policy's module is imported when the policy is first built, so
`import models` stays cheap.
"""

from importlib import import_module

from sim.policies import register_learned

LEARNED_POLICIES = {
    "dejavu": ("models.dejavu", "DejavuPolicy"),
    "tvw_rl": ("models.tvw_rl", "TvwRlPolicy"),
    "deeprm_rl": ("models.deeprm", "DeepRMAgentPolicy"),
    "forecast_residual_rl": ("models.forecast_placer", "ForecastResidualPolicy"),
}
"""Learned policy name -> (module, class) of its scheduler; the class takes `checkpoint` (a trained file or None)."""


def _factory(module: str, class_name: str):
    def build(checkpoint=None, **kwargs):
        return getattr(import_module(module), class_name)(checkpoint=checkpoint, **kwargs)

    build.__qualname__ = f"{module}.{class_name}"
    return build


for _name, (_module, _class) in LEARNED_POLICIES.items():
    register_learned(_name, _factory(_module, _class))
