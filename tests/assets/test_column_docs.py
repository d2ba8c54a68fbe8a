"""Every column of every table has a description in the UI, and a score says which way is better."""

import importlib
import pkgutil

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.cluster import eval__baselines, eval__ec_labelling, eval__summary, sim__job_sequences
from assets.column_docs import SCORES, describe, table_schema, undocumented, undocumented_in_warehouse
from assets.io_manager import TableIOManager
from assets.resources import Warehouse
from sim.evaluate import METRIC_BETTER


def _declared_schemas() -> dict[str, dict]:
    """'module.NAME' -> every public module-level dict of column name -> polars type in the project's packages
    (the raw tables' schemas of `pipelines.sources` are checked per table by the next test)."""
    out = {}
    for package in ("pipelines", "sim", "models", "assets"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            if info.name.startswith("pipelines.sources"):
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (
                    name.isupper()
                    and not name.startswith("_")
                    and isinstance(value, dict)
                    and value
                    and all(isinstance(k, str) for k in value)
                    and all(
                        isinstance(v, pl.DataType) or (isinstance(v, type) and issubclass(v, pl.DataType))
                        for v in value.values()
                    )
                ):
                    out[f"{info.name}.{name}"] = value
    return out


def test_every_declared_table_schema_is_documented():
    schemas = _declared_schemas()
    assert "pipelines.job_sequences.JOB_SEQUENCES" in schemas and "pipelines.schemas.USAGE" in schemas
    missing = {name: undocumented(schema) for name, schema in schemas.items()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_scores_state_their_direction_and_unknown_columns_are_named():
    assert describe("episode_return", better=SCORES).endswith("Higher is better.")
    assert describe("avg_overshoot_pct", "eval__baselines", SCORES).endswith("Lower is better.")
    assert describe("silhouette").endswith("Higher is better.")
    assert all(
        describe(m, better=SCORES).endswith(f"{b.capitalize()} is better.") for m, b in METRIC_BETTER.items()
    )
    assert not describe("machines_lower_bound", better=SCORES).endswith("is better.")
    schema = table_schema({"episode_return": pl.Float64}, "eval__baselines")
    assert schema.columns[0].description.endswith("Higher is better.")
    # a table's own meaning wins over the shared one
    assert describe("status", "raw_alibaba2018__container_meta") != describe(
        "status", "raw_alibaba2018__batch_task"
    )
    assert undocumented(["source", "zz_new_column", "load_pct"], "eval__summary") == ["zz_new_column"]
    cols = {
        c.name: c.description for c in table_schema({"source": pl.String, "zz_new_column": pl.Int64}).columns
    }
    assert cols["zz_new_column"] == "" and cols["source"]


@pytest.fixture(scope="module")
def materialised(tmp_path_factory):
    """The cluster tables on the synthetic workloads (no trace needed), as the IO manager writes them."""
    root = tmp_path_factory.mktemp("wh")
    wh = Warehouse(root=str(root))
    resources = {"warehouse": wh, "table_io": TableIOManager(warehouse=wh)}
    seq = {"n_train_sequences": 2, "n_test_sequences": 2, "loads_pct": [50], "include_synthetic": True}
    base = {"policies": ["best_fit", "noop", "ec_peak_aware"], "seeds": [0]}
    sequences = sim__job_sequences.to_source_assets()
    # as the jobs run them: the job sequences, the evaluation of one load (a partition), the summary
    runs = [
        ([sim__job_sequences, eval__ec_labelling], [], {"sim__job_sequences": {"config": seq}}, None),
        ([eval__baselines], sequences, {"eval__baselines": {"config": base}}, "load50"),
        ([eval__summary], eval__baselines.to_source_assets(), {}, None),
    ]
    events = []
    with DagsterInstance.ephemeral() as instance:
        for selection, upstream, ops, partition in runs:
            result = materialize(
                selection + upstream,
                instance=instance,
                resources=resources,
                run_config={"ops": ops},
                partition_key=partition,
                selection=selection,
            )
            assert result.success
            events += result.get_asset_materialization_events()
    return root, events


def test_every_column_of_the_cluster_tables_is_described_in_the_ui(materialised):
    root, events = materialised
    tables = {}
    for event in events:
        mat = event.event_specific_data.materialization
        schema = mat.metadata["dagster/column_schema"].value
        tables[mat.asset_key.to_user_string()] = {c.name: c.description for c in schema.columns}
    assert {
        "sim__job_sequences",
        "sim__offered_load",
        "sim__usage_scale",
        "eval__baselines",
        "eval__summary",
    } <= set(tables)
    assert "episode_return" in tables["eval__baselines"] and "better" in tables["eval__summary"]
    blank = {t: [c for c, d in cols.items() if not d] for t, cols in tables.items()}
    assert {t: cs for t, cs in blank.items() if cs} == {}
    assert tables["eval__baselines"]["machines_used"].endswith("Lower is better.")
    assert undocumented_in_warehouse(root) == {}
