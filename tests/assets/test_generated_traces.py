"""The whole Dagster pipeline on generated genuine-format traces long enough to hold long-running workloads.

`tests/fixtures/generate_traces.py` writes 3 days of Google 2011 (4 time-range shards) and Alibaba 2018 with a
planted cast (long-running tasks of four usage shapes, evicted / killed / failed / lost, finished, partial, gapped,
never-scheduled, malformed rows) and returns what it planted; every check below compares the warehouse with it.
"""

import importlib.util
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.resources import Warehouse
from cli.run import run_all
from cli.workers import Target
from pipelines.ingest import QUARANTINE_TABLE, raw_table_name

pytestmark = (
    pytest.mark.integration
)  # the pipeline up to the cluster layer on generated traces: `pytest -m integration`

GENERATOR = Path(__file__).parents[1] / "fixtures" / "generate_traces.py"
SOURCES = ("google2011", "alibaba2018")


def load_generator():
    """tests/ is not a package: load the generator module from its file."""
    spec = importlib.util.spec_from_file_location("tvw_generate_traces", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


GENERATE = load_generator()


def run_config(planted: dict) -> dict:
    """Thresholds for a 3-day trace; small learning budgets (the checks here are about the data path)."""
    return {
        "ops": {
            **GENERATE.data_path_config(planted),
            "ec__mapping": {
                "config": {
                    # the planted shapes differ in their temporal pattern, which the aggregate baseline's
                    # statistics need not see; with a 1-epoch forecaster the choice between mappings is noise,
                    # so only the two pattern-aware distances compete here. k 3..5 of two methods: 6 rows, so 8
                    # seeds can reach a Holm-adjusted p of 6/256; one control draw (the data path, not power)
                    "ec": {
                        "methods": ["temporal", "dtw"],
                        "k_max": 5,
                        "n_init": 4,
                        "dtw": {"window_frac": 0.1, "downsample": 6},
                    },
                    "gain": {
                        "n_seeds": 8,
                        "n_control_draws": 1,
                        "forecaster": {"epochs": 1, "max_train_windows": 200},
                    },
                }
            },
            "ec__classifier_accuracy": {"config": {"classifier": {"epochs": 30}}},
            "sim__job_sequences": {
                "config": {"n_train_sequences": 2, "n_test_sequences": 2, "loads_pct": [50], "step_bins": 6}
            },
            "eval__baselines": {"config": {"seeds": [0]}},
        }
    }


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    gen = GENERATE
    traces = tmp_path_factory.mktemp("traces")
    planted = {
        "google2011": gen.write_google2011(traces, seed=7),
        "alibaba2018": gen.write_alibaba2018(traces, seed=7),
    }
    root = tmp_path_factory.mktemp("warehouse")
    profile = tmp_path_factory.mktemp("profile") / "generated.yaml"  # these ops only: the others' defaults
    profile.write_text(yaml.safe_dump(run_config(planted)))
    lines: list[str] = []
    home = tmp_path_factory.mktemp("dagster_home")  # the runner's workers share a persistent instance
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        outcomes = run_all(
            Target(str(traces), str(root), profile=str(profile)),
            instance,
            log=lines.append,
            layers=(
                "raw",
                "per_source",
                "ec_sweep",
                "ec_gain",
                "ec",
                "cluster",
            ),  # training: test_rl_assets.py
        )
    failures = [o.spec.label for o in outcomes if not o.ok]
    return Warehouse(root=str(root)), planted, failures, lines


def frame(wh: Warehouse, table: str, source: str) -> pl.DataFrame:
    return wh.scan(table).filter(pl.col("source") == source).collect()


def test_every_run_succeeds(pipeline):
    _, _, failures, lines = pipeline
    assert failures == [], "\n".join(lines)


@pytest.mark.parametrize("source", SOURCES)
def test_rows_in_equal_written_plus_quarantined(pipeline, source):
    wh, planted, _, _ = pipeline
    quarantine = frame(wh, QUARANTINE_TABLE, source)
    for (table, name), n_lines in planted[source].lines.items():
        written = (
            pl.scan_parquet(wh.partition_path(raw_table_name(source, table), name))
            .select(pl.len())
            .collect()
            .item()
        )
        set_aside = quarantine.filter((pl.col("table") == table) & (pl.col("source_file") == name)).height
        assert written + set_aside == n_lines, (table, name)


@pytest.mark.parametrize("source", SOURCES)
def test_planted_malformed_rows_are_quarantined(pipeline, source):
    wh, planted, _, _ = pipeline
    got = frame(wh, QUARANTINE_TABLE, source).select("table", "source_file", "line_number", "reason")
    expected = {(m.table, m.source_file, m.line_number, m.reason) for m in planted[source].malformed}
    assert set(got.iter_rows()) == expected
    assert got.height == len(expected)


@pytest.mark.parametrize("source", SOURCES)
def test_long_running_report_counts_every_planted_reason(pipeline, source):
    wh, planted, _, _ = pipeline
    report = dict(frame(wh, "core__long_running_report", source).select("reason", "n_workloads").iter_rows())
    assert report == planted[source].report


@pytest.mark.parametrize("source", SOURCES)
def test_judged_table_gives_every_workload_its_planted_reason_and_rule(pipeline, source):
    wh, planted, _, _ = pipeline
    p = planted[source]
    judged = frame(wh, "core__long_running_judged", source)
    assert dict(judged.select("workload_id", "reason").iter_rows()) == p.reasons
    assert judged.height == len(p.reasons)
    assert set(judged["rule"]) == {p.rule} and set(judged["min_bins"]) == {p.min_contiguous_bins}
    with_usage = judged.filter(pl.col("n_run_bins").is_not_null())
    assert dict(with_usage.select("workload_id", "n_observed_bins").iter_rows()) == p.n_observed_bins
    assert dict(with_usage.select("workload_id", "n_run_bins").iter_rows()) == p.n_run_bins


@pytest.mark.parametrize("source", SOURCES)
def test_workloads_have_planted_states_and_requests(pipeline, source):
    wh, planted, _, _ = pipeline
    p = planted[source]
    workloads = frame(wh, "core__workloads", source)
    assert dict(workloads.select("workload_id", "final_state").iter_rows()) == p.final_states
    partial = set(workloads.filter(pl.col("is_partial"))["workload_id"])
    assert partial == {w for w, r in p.reasons.items() if r == "partial"}
    got = {
        w: (c, m)
        for w, c, m in workloads.select("workload_id", "cpu_request_frac", "mem_request_frac").iter_rows()
    }
    for w, (cpu, mem) in p.requests.items():
        assert got[w] == pytest.approx((cpu, mem), rel=1e-12), w


@pytest.mark.parametrize("source", SOURCES)
def test_exactly_the_planted_long_running_are_kept(pipeline, source):
    wh, planted, _, _ = pipeline
    p = planted[source]
    kept = frame(wh, "core__long_running", source)
    assert set(kept["workload_id"]) == p.kept
    assert kept.height == len(p.kept)
    assert dict(kept.select("workload_id", "n_run_bins").iter_rows()) == {w: p.n_run_bins[w] for w in p.kept}


@pytest.mark.parametrize("source", SOURCES)
def test_usage_bins_hold_planted_values(pipeline, source):
    wh, planted, _, _ = pipeline
    p = planted[source]
    usage = frame(wh, "core__usage", source)
    for (w, b), exp in p.expected_bins.items():
        row = usage.filter((pl.col("workload_id") == w) & (pl.col("bin_start_s") == b))
        assert row.height == 1, (w, b)
        r = row.row(0, named=True)
        assert (r["cpu_frac"], r["mem_frac"]) == pytest.approx((exp.cpu_frac, exp.mem_frac), rel=1e-9), (w, b)
        assert (r["n_samples"], r["is_filled"]) == (exp.n_samples, exp.is_filled), (w, b)
    filled = usage.filter(pl.col("is_filled")).group_by("workload_id").len()
    got = {w: n for w, n in filled.iter_rows() if w in p.kept}
    assert got == {w: n for w, n in p.n_filled_bins.items() if n}


def test_google_equivalence_classes(pipeline):
    wh, planted, _, _ = pipeline
    chosen = wh.query("select method, k from ec__method_comparison where source = 'google2011' and is_chosen")
    assert chosen.height <= 1  # none when no row passes the Holm-corrected test
    sil = frame(wh, "ec__silhouette", "google2011")
    assert sil["k"].min() == 3 and sil["k"].max() == 5
    labels = frame(wh, "ec__assignments", "google2011")
    if chosen.height:
        method, k = chosen.row(0)
        assert set(labels["workload_id"]) == planted["google2011"].kept
        assert set(labels["method"]) == {method} and set(labels["k"]) == {k}
        assert labels["ec_label"].n_unique() == k
    else:
        method = None
        assert labels.height == 0
    # the four planted shapes are told apart at k = 4: every EC of a pattern-aware method holds one shape
    swept = frame(wh, "ec__sweep_labels", "google2011").filter(pl.col("k") == 4)
    shapes = swept.with_columns(
        pl.col("workload_id").replace_strict(planted["google2011"].shapes).alias("shape")
    )
    assert set(shapes["workload_id"]) == planted["google2011"].kept
    per_label = shapes.group_by("method", "ec_label").agg(pl.col("shape").n_unique().alias("n_shapes"))
    pure = per_label.group_by("method").agg(pl.col("n_shapes").max())
    assert pure["n_shapes"].min() == 1 and shapes["shape"].n_unique() == 4
    # only the configured methods were swept (a run per method); each has its own mapping, the chosen one's
    # rows are ec__assignments
    assert set(frame(wh, "ec__sweep_silhouette", "google2011")["method"]) == {"temporal", "dtw"}
    per_method = frame(wh, "ec__method_assignments", "google2011")
    assert sorted(per_method["method"].unique()) == ["dtw", "temporal"]
    assert per_method.filter(pl.col("method") == method).equals(labels) if method else labels.height == 0


def test_job_sequences_use_the_kept_workloads(pipeline):
    wh, planted, _, _ = pipeline
    jobs = wh.scan("sim__job_sequences").collect()
    assert {"google2011", "alibaba2018"} <= set(jobs["source"])
    for source in SOURCES:
        used = set(jobs.filter(pl.col("source") == source)["workload_id"])
        assert used and used <= planted[source].kept, source


def test_generator_is_deterministic(tmp_path):
    gen = GENERATE
    for d in ("a", "b"):
        gen.write_google2011(tmp_path / d, seed=3, days=1.5, n_long=4, n_shards=2)
        gen.write_alibaba2018(tmp_path / d, seed=3, days=1.5, n_long=2)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.gz"))
    assert len(files) == 3 * 2 + 1 + 3  # 3 sharded Google tables, machine_events, 3 Alibaba tables
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
