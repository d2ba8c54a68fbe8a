"""`tvw-run` and `tvw-ui`: a wrong trace folder stops at once naming what was expected; --help names the
project's options; profiles resolve to the same config everywhere."""

import os
import shutil
from pathlib import Path

import pytest

from assets.definitions import PROFILES, build_definitions, load_profile
from assets.jobs import SHARED_CONFIG
from assets.settings import resolved_config
from cli.run import main
from cli.summary import TraceFolderError, check_trace_folder
from cli.ui import main as ui
from pipelines.profiles import ProfileError, with_shared_entries
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


def _is_within(expected, actual) -> bool:
    """Every value of `expected` (nested mappings compared key by key) equals `actual`'s."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _is_within(v, actual[k]) for k, v in expected.items()
        )
    return expected == actual or (isinstance(expected, list | tuple) and list(expected) == list(actual))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_profile_is_every_assets_default_and_every_jobs_tag(tmp_path, profile):
    """The asset page's Materialize button, `dagster asset materialize` and tvw-run all run the assets with
    their defaults: those must be the profile's values, for every op the profile configures."""
    defs = build_definitions(FIXTURES, tmp_path, profile)
    ops = with_shared_entries(load_profile(profile)["ops"], SHARED_CONFIG)
    by_op = {a.node_def.name: a for a in defs.assets}
    assert ops, "a profile configures some asset"
    for op, entry in ops.items():
        assert _is_within(entry.get("config") or {}, resolved_config(by_op[op])), op
    for name in ("per_source_job", "cluster_job", "eval_job", "eval_summary_job"):
        assert defs.resolve_job_def(name).tags["tvw/profile"] == profile


def test_unknown_profile_is_named(tmp_path):
    with pytest.raises(ProfileError, match="'nope'"):
        load_profile("nope")


@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        (
            "ops:\n  core__usage:\n    config:\n      no_such_setting: 1\n",
            "ops.core__usage.config.no_such_setting",
        ),
        ("ops:\n  no_such_asset:\n    config: {}\n", "ops.no_such_asset"),
        ("ops:\n  sim__job_sequences:\n    config:\n      n_train_sequences: many\n", "n_train_sequences"),
        ("extends: sample\nopz: {}\n", "opz"),
        ("ops: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, yaml_text, named):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    args = ["--traces", str(FIXTURES), "--sources", "google2011", "--warehouse", str(tmp_path / "wh")]
    assert main([*args, "--profile", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "Traceback" not in err[0]


def test_a_profile_typo_and_no_jobs_are_refused_without_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    args = ["--traces", str(FIXTURES), "--sources", "google2011", "--warehouse", str(tmp_path / "wh")]
    assert main([*args, "--profile", "sampel"]) == 2
    err = capsys.readouterr().err
    assert "sampel" in err and "quick" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as done:
        main(["--jobs", "0"])
    assert done.value.code == 2
    assert "--jobs: must be at least 1" in capsys.readouterr().err


def test_naming_the_sample_traces_keeps_the_default_profile(tmp_path, monkeypatch):
    from cli.run import parser, settings

    monkeypatch.delenv("TVW_PROFILE", raising=False)
    args = parser().parse_args(["--traces", str(FIXTURES)])
    assert settings(args)[2] == "quick"


def test_a_stray_file_in_the_trace_folder_is_reported_at_start(tmp_path, capsys):
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

    from cli.plan import RunSpec
    from cli.summary import failed_check_lines
    from cli.workers import RunOutcome

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


def test_a_second_tvw_run_on_the_same_warehouse_is_refused_naming_the_first(tmp_path, capsys, monkeypatch):
    from cli.run import exclusive

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    wh = tmp_path / "wh"
    with exclusive(wh, "warehouse"):
        rc = main(
            ["--traces", str(FIXTURES), "--warehouse", str(wh), "--layers", "raw", "--sources", "google2011"]
        )
    assert rc == 2
    err = capsys.readouterr().err
    assert f"another tvw-run (pid {os.getpid()}" in err and str(wh) in err


def test_a_warehouse_that_cannot_be_written_is_found_before_any_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    wh = blocker / "wh"  # cannot be created (as root, a read-only mode would not stop the write)
    rc = main(
        ["--traces", str(FIXTURES), "--warehouse", str(wh), "--layers", "raw", "--sources", "google2011"]
    )
    assert rc == 2
    assert "cannot be written" in capsys.readouterr().err
    assert not (tmp_path / "home" / "history").exists()  # no Dagster storage touched
