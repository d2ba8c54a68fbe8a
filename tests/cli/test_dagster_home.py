"""`tvw-run` finds a DAGSTER_HOME where the environment gives none, or an empty one."""

from __future__ import annotations

import pytest

from cli import run


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_unset_or_empty_dagster_home_is_the_projects(monkeypatch, tmp_path, value) -> None:
    monkeypatch.setattr(run, "PROJECT_ROOT", tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", "set")  # recorded, so teardown restores what was there before
    if value is None:
        monkeypatch.delenv("DAGSTER_HOME")
    else:
        monkeypatch.setenv("DAGSTER_HOME", value)
    home = run.ensure_dagster_home()
    assert home == (tmp_path / ".dagster_home").resolve()
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_a_given_dagster_home_is_kept(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "mine"))
    assert run.ensure_dagster_home() == (tmp_path / "mine").resolve()
    assert (tmp_path / "mine" / "dagster.yaml").exists()
