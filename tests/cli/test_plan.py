"""The runner's plan comes from the definitions: the jobs' partitions are the runs, their layer tags the order,
the asset graph's upstream keys and partition mappings the waits; the profile narrows loads, seeds, methods and
the layers of a source it declares."""

from pathlib import Path

import pytest

import cli.plan
import cli.run
from assets.definitions import build_definitions, load_profile
from assets.jobs import planned_partitions
from cli.plan import blocked_by_failure, default_layers, job_layers, offered_load, plan, ready
from cli.run import _drop_declared
from pipelines.sources import SOURCES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    defs = build_definitions(FIXTURES, tmp_path_factory.mktemp("wh"), "sample")
    return defs, plan(defs, default_layers(defs), SOURCES, planned_partitions(defs))


def test_the_runner_keeps_no_list_of_layers_or_jobs():
    for module in (cli.run, cli.plan):
        source = Path(module.__file__).read_text()
        for name in ("per_source_job", "ec_sweep", "cluster_job", "eval_job", "rl_job", "results_job"):
            assert name not in source, (module.__name__, name)


def test_layers_come_from_the_jobs_tags_with_on_demand_ones_apart(sample):
    defs, _ = sample
    layers = default_layers(defs)
    assert layers == ["raw", "per_source", "ec_sweep", "ec_gain", "ec", "cluster", "eval", "rl", "results"]
    assert job_layers(defs) == [*layers, "ablation"]  # ablation_job and ablation_summary_job


def test_each_run_waits_only_for_the_runs_that_make_what_it_reads(sample):
    _, p = sample
    by_label = {r.label: r for r in p.runs}
    waits = {r.label: {w.label for w in p.waits[r]} for r in p.runs}
    raw = [r for r in p.runs if r.layer == "raw"]
    assert raw and all(not p.waits[r] for r in raw)
    gain = "ec_gain_job[dtw|bitbrains]"
    assert waits[gain] >= {f"ec_sweep_job[{m}|bitbrains]" for m in ("aggregate", "temporal", "dtw")}
    assert not [w for w in waits[gain] if "bitbrains" not in w]  # never another source's runs
    assert waits["eval_job[load50]"] == {"cluster_job"} == waits["rl_job[load50-seed0]"]  # side by side
    assert waits["placer_job[load50-seed0]"] == {
        "cluster_job"
    }  # our scheduler trains beside the papers' agents
    # the forecast and EC labelling tables go beside the evaluations (the labelling reads each source's classifier)
    assert {w for w in waits["forecast_eval_job"] if not w.startswith("ec_job[")} == {"cluster_job"}
    # a load's results wait for that load's evaluation and training runs only; the summary for every load's
    results = waits["results_job[load80]"]
    assert {"placer_job[load80-seed2]", "rl_job[load80-seed2]", "eval_job[load80]"} <= results
    assert not [w for w in results if "load30" in w or "load50" in w]
    assert {"eval_job[load30]", "eval_job[load50]", "eval_job[load80]"} <= waits["eval_summary_job"]
    assert {f"results_job[load{load}]" for load in (30, 50, 80)} <= waits["results_summary_job"]
    # the paper baselines' own metrics need only the training runs: they go beside results_job
    assert "rl_job[load80-seed2]" in waits["baseline_metrics_job"]
    assert not [w for w in waits["baseline_metrics_job"] if w.startswith(("eval_job", "results_job"))]
    per_source = by_label["per_source_job[google2011_derived]"]  # not another source's shards: one bad shard
    assert p.waits[per_source] and {w.source for w in p.waits[per_source]} == {"google2011_derived"}
    cluster = by_label["cluster_job"]
    assert {w.layer for w in p.waits[cluster]} == {"ec", "per_source"}


def test_a_layers_runs_go_highest_load_first(sample):
    _, planned = sample
    for layer in ("eval", "rl"):
        loads = [offered_load(r.partition) for r in planned.runs if r.layer == layer]
        assert loads == sorted(loads, reverse=True) and loads[0] == 80, (layer, loads)
    assert [offered_load(k) for k in ("load80-seed0", "load5", None, "dtw|bitbrains")] == [80, 5, 0, 0]


def test_a_run_is_launched_when_its_waits_are_done_and_never_after_a_failure_upstream(sample):
    _, p = sample
    by_label = {r.label: r for r in p.runs}
    evaluation, cluster = by_label["eval_job[load50]"], by_label["cluster_job"]
    assert not ready(evaluation, p, set()) and ready(evaluation, p, {cluster})
    some_raw = next(r for r in p.runs if r.layer == "raw")
    assert blocked_by_failure(evaluation, p, {some_raw})  # raw -> per_source -> ... -> cluster -> eval


def test_the_profile_narrows_loads_seeds_and_declared_sources(tmp_path):
    defs = build_definitions(FIXTURES, tmp_path, "quick")
    profile = load_profile("quick")
    p = _drop_declared(
        plan(defs, default_layers(defs), SOURCES, planned_partitions(defs)), profile["sources"]
    )
    google = {r.layer for r in p.runs if r.source == "google2011"}
    assert google == set(profile["sources"]["google2011"]["layers"])
    assert all(w in p.runs for r in p.runs for w in p.waits[r])  # no wait on a dropped run
    seeds = {str(s) for s in _setting(defs, "eval__results", "seeds")}
    loads = {str(v) for v in _setting(defs, "sim__job_sequences", "loads_pct")}
    rl = [r.partition for r in p.runs if r.layer == "rl"]
    assert rl and all(k.split("-")[0].removeprefix("load") in loads for k in rl)
    assert {k.split("-")[1].removeprefix("seed") for k in rl} == seeds


def _setting(defs, op, name):
    from assets.settings import resolved_config
    from pipelines.settings import find_setting

    return find_setting(resolved_config(next(a for a in defs.assets if a.node_def.name == op)), name)
