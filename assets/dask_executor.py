"""The Dask executor of every job when TVW_DASK_SCHEDULER is set: each step of a run is a task on an existing
Dask cluster, named `<job>.<run id>.<step>`.

dagster-dask's own executor names a step's task `<job>.<step>`. The Dask scheduler takes tasks with one key for one
task, so when two runs of one job are in flight at once (two shards of a table, two sources, two loads: exactly
what `tvw-run --jobs N` does) the second run's step is never sent: it receives the first run's events, reports
success, and its partition is never written. The run id in the key keeps the runs apart. The steps themselves
run with dagster-dask's worker function, so everything else (instance, events, resource tags) is as there.
"""

from collections.abc import Iterator

from dagster import Executor, Field, Shape, StringSource, executor, multiple_process_executor_requirements
from dagster import _check as check
from dagster._core.errors import raise_execution_interrupts
from dagster._core.events import DagsterEvent
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode
from dagster._utils import iterate_with_context


class RunScopedDaskExecutor(Executor):
    """Sends every step of a run to the Dask scheduler at `address`, each after the steps it reads from."""

    def __init__(self, address: str) -> None:
        self.address = check.str_param(address, "address")

    @property
    def retries(self) -> RetryMode:
        return RetryMode.DISABLED

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        from dagster_dask.executor import get_dask_resource_requirements, query_on_dask_worker
        from distributed import Client, as_completed

        check.invariant(
            plan_context.instance.is_persistent, "Dask execution needs a persistent Dagster instance"
        )
        run = plan_context.dagster_run
        futures = {}
        with Client(self.address) as client:
            for level in execution_plan.get_steps_to_execute_by_level():
                for step in level:
                    # the upstream futures make Dask order the steps; the worker reads inputs from the warehouse
                    upstream = [futures[k] for inp in step.step_inputs for k in inp.dependency_keys]
                    futures[step.key] = client.submit(
                        query_on_dask_worker,
                        upstream,
                        plan_context.reconstructable_job,
                        run,
                        plan_context.run_config,
                        [step.key],
                        plan_context.instance.get_ref(),
                        execution_plan.known_state,
                        key=f"{plan_context.job_name}.{run.run_id}.{step.key}",  # one Dask key per step of one run
                        resources=get_dask_resource_requirements(step.tags),
                    )
            done = as_completed(list(futures.values()), with_results=True)
            for _, events in iterate_with_context(raise_execution_interrupts, done):
                yield from events


@executor(
    name="dask",
    config_schema={"cluster": Field(Shape({"existing": Shape({"address": StringSource})}))},
    requirements=multiple_process_executor_requirements(),
)
def dask_executor(init_context) -> RunScopedDaskExecutor:
    """Every step of a run on the existing Dask cluster at `cluster.existing.address` (the configuration shape of
    dagster-dask's `dask_executor`, restricted to an existing cluster), task keys unique per run."""
    return RunScopedDaskExecutor(init_context.executor_config["cluster"]["existing"]["address"])
