"""`tvw-run` and `tvw-ui`: a wrong trace folder stops at once naming what was expected; --help names the
project's options; profiles resolve to the same config everywhere."""

import shutil
from pathlib import Path

import pytest

from assets.definitions import PROFILES, build_definitions, load_profile
from assets.main import TraceFolderError, check_trace_folder, main, ui
from pipelines.sources import SOURCES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


def test_missing_trace_folder_names_it_and_every_source_layout(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(TraceFolderError) as err:
        check_trace_folder(missing, list(SOURCES), subset_asked=False)
    message = str(err.value)
    assert str(missing) in message and "does not exist" in message
    for src in SOURCES.values():
        assert str(missing / src.folder) in message


@pytest.mark.parametrize("level", ["above", "below"])
def test_folder_one_level_off_fails(tmp_path, level):
    shutil.copytree(FIXTURES, tmp_path / "traces")
    pointed = tmp_path if level == "above" else tmp_path / "traces" / "google-2011"
    with pytest.raises(TraceFolderError, match="has no shard of"):
        check_trace_folder(pointed, list(SOURCES), subset_asked=False)


def test_a_missing_source_fails_unless_a_subset_was_asked(tmp_path):
    shutil.copytree(FIXTURES / "google-2011", tmp_path / "google-2011")
    with pytest.raises(TraceFolderError, match="(?s)alibaba2018.*--sources google2011"):
        check_trace_folder(tmp_path, list(SOURCES), subset_asked=False)
    assert check_trace_folder(tmp_path, ["google2011"], subset_asked=True)["google2011"] == 4


def test_tvw_run_stops_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert main(["--traces", str(tmp_path / "nowhere"), "--warehouse", str(tmp_path / "wh")]) == 2
    assert "Expected layout" in capsys.readouterr().err
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("entry", [main, ui])
def test_help_names_the_project_options(entry, capsys):
    with pytest.raises(SystemExit) as done:
        entry(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("--profile", "--traces", "--warehouse"):
        assert option in out
    if entry is main:
        assert "--jobs" in out and "--sources" in out and "--dask-scheduler" in out


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_job_carries_the_profile(tmp_path, profile):
    defs = build_definitions(FIXTURES, tmp_path, profile)
    config = load_profile(profile)["ops"]
    for name in ("per_source_job", "cluster_job", "eval_job", "eval_summary_job"):
        job = defs.resolve_job_def(name)
        assert job.tags["tvw/profile"] == profile
    sequences = defs.resolve_job_def("cluster_job").run_config["ops"]["sim__job_sequences"]
    assert sequences == config["sim__job_sequences"]
    per_load = defs.resolve_job_def("eval_job").partitioned_config.get_run_config_for_partition_key("load50")
    evaluation = per_load["ops"]["eval__baselines"]
    assert evaluation == config["eval__baselines"]


def test_unknown_profile_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="'nope'"):
        load_profile("nope")


def test_a_stray_file_in_the_trace_folder_is_reported_at_start(tmp_path, capsys):
    from assets.main import check_trace_folder

    folder = tmp_path / "google-2011-derived"
    folder.mkdir()
    (folder / "job7_5min_sum.csv").write_text("300.0,1,1" + ",0.0" * 15 + "\n")
    (folder / "notes.xlsx").write_text("x")
    found = check_trace_folder(tmp_path, ["google2011_derived"], subset_asked=True)
    assert found == {"google2011_derived": 1}
    err = capsys.readouterr().err
    assert "WARNING" in err and "notes.xlsx" in err


def test_failed_checks_are_named_in_the_summary():
    from dagster import (
        AssetCheckResult,
        AssetCheckSeverity,
        AssetCheckSpec,
        DagsterInstance,
        Output,
        asset,
        materialize,
    )

    from assets.main import RunOutcome, RunSpec, failed_check_lines

    @asset(
        check_specs=[
            AssetCheckSpec("always_fine", asset="table"),
            AssetCheckSpec("rows_are_odd", asset="table"),
        ]
    )
    def table(context):
        yield Output(1)
        yield AssetCheckResult(check_name="always_fine", passed=True)
        yield AssetCheckResult(check_name="rows_are_odd", passed=False, severity=AssetCheckSeverity.WARN)

    with DagsterInstance.ephemeral() as instance:
        run = materialize([table], instance=instance)
        spec = RunSpec(layer="results", job="results_job", partition=None, source=None)
        outcome = RunOutcome(spec=spec, ok=True, seconds=0.0, run_id=run.run_id, peak_rss_mib=0.0)
        lines = failed_check_lines(instance, [outcome])
    assert len(lines) == 1
    assert "check failed (WARN): table.rows_are_odd in results_job" in lines[0]
