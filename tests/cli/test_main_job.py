"""The whole pipeline materialises on the genuine-format fixtures, two runs at a time, as runs of named jobs."""

from pathlib import Path

import polars as pl
import pytest
from dagster import AssetKey, DagsterInstance, RunsFilter
from dagster._core.instance.ref import InstanceRef

from assets.resources import Warehouse
from cli.run import run_all
from cli.workers import Target

pytestmark = (
    pytest.mark.integration
)  # the whole pipeline on the fixtures, evaluation included: `pytest -m integration`

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
PIPELINE_LAYERS = ("raw", "per_source", "ec_sweep", "ec_gain", "ec", "cluster", "eval")
"""Training (rl, results) is covered by tests/assets/test_rl_assets.py with a tiny budget: the sample profile's
training would take minutes here."""


@pytest.fixture(scope="module")
def materialised(tmp_path_factory):
    root = tmp_path_factory.mktemp("warehouse")
    home = tmp_path_factory.mktemp("dagster_home")
    lines: list[str] = []
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        outcomes = run_all(
            Target(str(FIXTURES), str(root), "sample"),
            instance,
            log=lines.append,
            max_concurrent=2,
            layers=PIPELINE_LAYERS,
        )
        runs = instance.get_runs()
        # the UI's job pages list a job's runs by this tag (repository@code location)
        attached = instance.get_runs(filters=RunsFilter(tags={".dagster/repository": "__repository__@tvw"}))
        assert len(attached) == len(runs)
        event = instance.get_latest_materialization_event(AssetKey("core__long_running"))
        profile_in_metadata = event.asset_materialization.metadata["tvw/profile"].value
    failures = [o.spec.label for o in outcomes if not o.ok]
    assert profile_in_metadata == "sample"  # the configuration in force, on the table
    return Warehouse(root=str(root)), failures, lines, runs


def test_every_run_succeeds(materialised):
    _, failures, lines, _ = materialised
    assert failures == [], "\n".join(lines)


def test_runs_are_named_jobs_of_the_code_location(materialised):
    _, _, _, runs = materialised
    names = {r.job_name for r in runs}
    assert "__ephemeral_asset_job__" not in names
    assert {
        "per_source_job",
        "ec_sweep_job",
        "ec_gain_job",
        "ec_job",
        "cluster_job",
        "eval_job",
        "eval_summary_job",
        "raw_google2011__task_usage_job",
    } <= names
    assert {r.remote_job_origin.location_name for r in runs} == {"tvw"}
    assert {r.tags.get("tvw/profile") for r in runs} == {"sample"}
    per_source = [r for r in runs if r.job_name == "per_source_job"]
    assert sorted(r.tags["dagster/partition"] for r in per_source) == sorted(
        ["google2011", "alibaba2018", "google2011_derived", "bitbrains"]
    )
    # the sample profile takes google2011 through raw and per_source only (its `sources:` section says why)
    sources = ["alibaba2018", "google2011_derived", "bitbrains"]
    sweeps = [r for r in runs if r.job_name == "ec_sweep_job"]  # the EC sweep fans out: source x method
    assert sorted(r.tags["dagster/partition"] for r in sweeps) == sorted(
        f"{m}|{s}" for s in sources for m in ("aggregate", "temporal", "dtw")
    )
    assert len([r for r in runs if r.job_name == "ec_gain_job"]) == len(sweeps)
    assert sorted(r.tags["dagster/partition"] for r in runs if r.job_name == "ec_job") == sorted(sources)
    evaluations = [r for r in runs if r.job_name == "eval_job"]  # one run per load of the sample profile
    assert sorted(r.tags["dagster/partition"] for r in evaluations) == ["load30", "load50", "load80"]


def test_raw_rows_add_up_with_quarantine(materialised):
    wh, _, _, _ = materialised
    usage = wh.query("select count(*) as n from raw_alibaba2018__container_usage")["n"][0]
    quarantined = wh.query("select count(*) as n from raw_quarantine where \"table\" = 'container_usage'")[
        "n"
    ][0]
    with_id = 0
    import tarfile

    with tarfile.open(FIXTURES / "alibaba-2018" / "container_usage.tar.gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                with_id += len(tar.extractfile(member).read().splitlines())
    assert usage + quarantined == with_id
    assert quarantined > 0  # the fixture keeps some rows with an empty container_id


def test_core_tables_have_every_source(materialised):
    wh, _, _, _ = materialised
    sources = set(wh.query("select distinct source from core__long_running_report")["source"])
    assert sources == {"google2011", "alibaba2018", "google2011_derived"}
    report = wh.query("select source, sum(n_workloads) as n from core__long_running_report group by source")
    workloads = wh.query("select source, count(*) as n from core__workloads group by source")
    assert report.sort("source").equals(workloads.sort("source").with_columns(pl.col("n").cast(pl.Int64)))


def test_long_running_come_from_derived_series(materialised):
    wh, _, _, _ = materialised
    kept = wh.query("select source, count(*) as n from core__long_running group by source")
    assert dict(kept.iter_rows()).get("google2011_derived", 0) > 0


def test_ec_tables_on_the_derived_fixture(materialised):
    wh, _, _, _ = materialised
    sil = wh.query("select method, k, is_skipped from ec__silhouette where source = 'google2011_derived'")
    assert set(sil["method"]) == {"aggregate", "temporal", "dtw"}
    assert sil["k"].min() == 3
    table = wh.query(
        "select method, k, is_chosen, choice_basis from ec__method_comparison where source = 'google2011_derived'"
    )
    swept = sil.filter(~pl.col("is_skipped")).select("method", "k")
    assert table.select("method", "k").sort("method", "k").equals(swept.sort("method", "k"))  # every k a row
    chosen = table.filter(pl.col("is_chosen"))
    assert chosen.height <= 1  # none when no row passes the Holm-corrected test
    assignments = wh.scan("ec__assignments").filter(pl.col("source") == "google2011_derived").collect()
    # one mapping per method for the EC-mapping ablation; the chosen method's is ec__assignments, row for row
    per_method = wh.scan("ec__method_assignments").filter(pl.col("source") == "google2011_derived").collect()
    assert per_method.group_by("method").agg(pl.col("k").n_unique())["k"].to_list() == [1, 1, 1]
    if chosen.height == 0:
        assert assignments.height == 0 and set(table["choice_basis"]) == {"none"}
        return
    method, k = chosen["method"][0], chosen["k"][0]
    labels = wh.query("select distinct method, k, ec_label from ec__assignments")
    assert set(labels["method"]) == {method} and set(labels["k"]) == {k}
    assert labels["ec_label"].max() < k
    assert per_method.filter(pl.col("method") == method).equals(assignments)


def test_every_policy_is_evaluated(materialised):
    from sim.policies import POLICIES, is_learned, is_oracle

    wh, _, _, _ = materialised
    evaluated = set(wh.query("select distinct policy from eval__baselines")["policy"])
    from assets.definitions import load_profile

    configured = load_profile("sample")["ops"]["eval__baselines"]["config"]["policies"]
    assert evaluated == set(configured)  # the profile's list, every one of them evaluated (none left out)
    assert all(p in POLICIES and not is_learned(p) for p in configured)  # learned ones: the rl/results assets
    # the fitted rules and oracles are among them, each row saying what its policy is
    assert {"forecast_risk", "hybrid_observed", "n_sigma_observed", "forecast_risk_truth"} <= evaluated
    oracles = set(wh.query("select distinct policy from eval__baselines where is_oracle")["policy"])
    assert oracles == {p for p in configured if is_oracle(p)}
    assert {"forecast_risk_truth", "foresight_peak_aware", "forecast_peak_truth_arriving"} <= oracles
    sources = set(wh.query("select distinct source from sim__job_sequences")["source"])
    assert {"deepplace_synthetic", "deeprm_synthetic", "google2011_derived"} <= sources
    summary = wh.query("select count(*) as n from eval__summary where metric = 'avg_util_cpu_frac'")
    assert summary["n"][0] > 0
    loads = wh.query("select distinct load_pct from eval__baselines order by load_pct")["load_pct"].to_list()
    assert loads == [30, 50, 80]  # the three load partitions, read back as one table


def test_summary_counts_every_source_and_warns_where_nothing_was_kept(materialised):
    from cli.summary import source_summary

    wh, _, _, _ = materialised
    lines = source_summary(
        Path(wh.root), ["google2011", "alibaba2018", "google2011_derived"], PIPELINE_LAYERS
    )
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:4]}
    kept = dict(wh.query("select source, count(*) as n from core__long_running group by source").iter_rows())
    for source, (_, n_kept, *_) in rows.items():
        assert int(n_kept) == kept.get(source, 0)
        assert (f"WARNING {source}: no long-running workload kept" in "\n".join(lines)) == (int(n_kept) == 0)
    assert int(rows["google2011_derived"][3]) > 0  # sequences, with or without an EC mapping
    # the EC mapping in force, named with how it was chosen; none when no row passed the Holm-corrected test
    chosen = wh.query(
        "select method from ec__method_comparison where source = 'google2011_derived' and is_chosen"
    )
    if chosen.height:
        assert int(rows["google2011_derived"][2]) >= 3
        assert rows["google2011_derived"][4] == chosen["method"][0] and "k=" in rows["google2011_derived"][5]
    else:
        assert int(rows["google2011_derived"][2]) == 0 and rows["google2011_derived"][4] == "-"


def test_every_column_of_every_table_written_has_a_description(materialised):
    from assets.column_docs import undocumented_in_warehouse

    wh, *_ = materialised
    assert undocumented_in_warehouse(wh.root) == {}
